#!/bin/sh
# tools/ring_bench.sh — scaling of ring attention over Open MPI (build/flashattn-mpi bench).
#
#   sh tools/ring_bench.sh [--ranks "1 2 4 8" or 1,2,4,8] [--tokens-per-rank C] [--n N] [--d D] [--heads H]
#                          [--threads T] [--bind none|core] [--reps R] [--pass fwd|bwd|both]
#                          [--sweeps "weak strong causal"] [--rounds K] [--tag NAME] [--out DIR]
#                          [--build DIR]
#
# Up to three sweeps, each a CSV in DIR (default build/ring_bench; NAME-weak.csv etc. with --tag)
# and a table on stdout. T(P) is the median over R repeats of the slowest rank's time.
# --rounds K (default 1) runs each sweep's rank counts K times over, interleaved (P = 1, 2, 4, 8,
# 1, 2, 4, 8, ...), so a slow spell of a shared host falls on every P alike, and the tables use the
# median over rounds of each P's time and compute rate (the CSV keeps every round's row). On the
# 16-core device host the one-rank time moved 1.6x between calls: a single P = 1 row taken minutes
# before the P = 8 row made the weak efficiency anything from 47% to 95%.
#   weak    fixed tokens per rank C, N = P C, full mask. The attention work grows as N^2, so a
#           rank's work grows as P (P ring steps of C x C each), while its setup (buffers, the
#           fill, packing Q, storing O: other_s at P = 1, o1) is paid once whatever P is. The
#           ideal is T(P) = o1 + P (T(1) - o1), and
#               E_weak(P) = (o1 + P (T(1) - o1)) / T(P)
#           (P T(1) / T(P), the per-rank FLOP rate against one rank's, would count the setup P
#           times and flatter the ring by o1 / T(1): 6-12% on the 16-core host). Beside the
#           efficiency of the medians, "rounds" gives the min..max of each round's own pair
#           (its P = 1 row against its P row). (T(P) / T(1) alone is not the weak efficiency
#           here: the work per rank is not fixed.)
#   strong  fixed N, full mask: E_strong(P) = T(1) / (P T(P)).
#   causal  fixed N, causal, contiguous and zigzag at each P: speedup = T_contiguous / T_zigzag,
#           and each layout's strong efficiency against the one-rank time.
#   alone   the machine's own ceiling for weak scaling: P independent one-rank runs at once (no
#           ring, no messages; C tokens each, 2P repeats so they overlap), each on its own T cores
#           (taskset) — E_alone = the slowest one's compute GFLOP/s against one run alone. When
#           the cores slow down as they fill (shared caches, memory, turbo, a hypervisor's
#           neighbours), no ring can beat E_alone; E_weak / E_alone is what the ring itself costs.
# Beside E every table splits the time: E_compute = the slowest rank's compute rate (its own
# visible pairs x 4 d over its seconds inside the library calls; rank_gflops) against one
# rank's, i.e. how much the cores themselves slowed down as ranks were added; wait = the
# largest (and the mean) time a rank sat in MPI_Waitall for its neighbour's data; other = the
# largest time outside both (setup, packing, the MPI_Test bursts). Every row carries the peak
# resident set per rank (largest and smallest over the ranks, MiB): memory per rank should
# fall as 1/P at fixed N and stay flat at fixed C.
# Each rank runs T OpenMP threads (default 1). --bind core gives each rank T cores of its own
# (mpirun --map-by slot:PE=T --bind-to core); --bind none (default) lets the OS place them.
# P x T should not exceed the cores: on a 2-core machine only P <= 2 is meaningful, and timings
# on a shared machine are noise (the script says so when it oversubscribes).
set -eu
ranks="1 2 4 8"; cpr=4096; n=16384; d=64; heads=4; threads=1; reps=3; pass=fwd; bind=none; rounds=1
sweeps="weak strong causal"; tag=""
build=build; out=""
while [ $# -gt 0 ]; do
    case $1 in
        --ranks) ranks=$(echo "$2" | tr , " "); shift 2 ;;
        --tokens-per-rank) cpr=$2; shift 2 ;;
        --n) n=$2; shift 2 ;;
        --d) d=$2; shift 2 ;;
        --heads) heads=$2; shift 2 ;;
        --threads) threads=$2; shift 2 ;;
        --bind) bind=$2; shift 2 ;;
        --reps) reps=$2; shift 2 ;;
        --rounds) rounds=$2; shift 2 ;;
        --pass) pass=$2; shift 2 ;;
        --sweeps) sweeps=$2; shift 2 ;;
        --tag) tag=$2-; shift 2 ;;
        --out) out=$2; shift 2 ;;
        --build) build=$2; shift 2 ;;
        -h|--help) sed -n '2,41p' "$0"; exit 0 ;;
        *) echo "ring_bench.sh: unknown option '$1'" >&2; exit 2 ;;
    esac
done
case $bind in none|core) ;; *) echo "ring_bench.sh: --bind must be none or core (got '$bind')" >&2; exit 2 ;; esac
for s in $sweeps; do
    case $s in weak|strong|causal|alone) ;; *) echo "ring_bench.sh: unknown sweep '$s' (weak, strong, causal, alone)" >&2; exit 2 ;; esac
done
out=${out:-$build/ring_bench}
fm=$build/flashattn-mpi
[ -x "$fm" ] || { echo "ring_bench.sh: $fm not built (make mpi; needs Open MPI)" >&2; exit 2; }
command -v mpirun >/dev/null || { echo "ring_bench.sh: mpirun not found (apt-get install openmpi-bin)" >&2; exit 2; }
cores=$(nproc 2>/dev/null || echo 1)
root=""; [ "$(id -u)" = 0 ] && root="--allow-run-as-root"
export OMPI_MCA_btl_vader_single_copy_mechanism=${OMPI_MCA_btl_vader_single_copy_mechanism:-none}
export OMP_NUM_THREADS=$threads
posint() { # posint NAME VALUE MAX: a positive integer no larger than MAX, or exit 2
    case $2 in ''|*[!0-9]*|0*) echo "ring_bench.sh: $1 must be a positive integer (got '$2')" >&2; exit 2 ;; esac
    [ ${#2} -le 6 ] && [ "$2" -le "$3" ] || { echo "ring_bench.sh: $1 must be at most $3 (got '$2')" >&2; exit 2; }
}
posint --rounds "$rounds" 1000
posint --threads "$threads" 4096
posint --reps "$reps" 1000
[ -n "$(echo $ranks)" ] || { echo "ring_bench.sh: --ranks is empty" >&2; exit 2; }
for p in $ranks; do posint "--ranks (each)" "$p" 4096; done
mkdir -p "$out"
echo "ring_bench: ranks {$ranks} x $threads threads on $cores cores, bind $bind; d=$d heads=$heads; pass $pass;" \
    "median of $reps; $rounds round(s), interleaved; btl_vader_single_copy_mechanism=$OMPI_MCA_btl_vader_single_copy_mechanism"
seq_rounds=$(i=1; while [ $i -le "$rounds" ]; do printf '%s ' $i; i=$((i + 1)); done)
# med.awk: the rows of a sweep's CSV reduced to one per (ranks, layout, pass) in first-seen order:
# the median over rounds of seconds ($11), gflops ($12), wait ($14), rank_gflops ($18),
# wait_mean ($19), other ($20); the other columns from the first round. Then the sweep's own awk.
med_awk='function med(k, c,   n, i, j, a, t) { n = cnt[k]; for (i = 1; i <= n; i++) a[i] = v[k, i, c] + 0
        for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
        return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
    NR == 1 { print; next }
    { k = $1 "," $9 "," $10; if (!(k in cnt)) { order[++nk] = k; first[k] = $0 }
      cnt[k]++; for (c = 1; c <= NF; c++) v[k, cnt[k], c] = $c }
    END { for (x = 1; x <= nk; x++) { k = order[x]; nf = split(first[k], f, ",")
          f[11] = med(k, 11); f[12] = med(k, 12); f[14] = med(k, 14)
          if (nf >= 20) { f[18] = med(k, 18); f[19] = med(k, 19); f[20] = med(k, 20) }
          line = f[1]; for (c = 2; c <= nf; c++) line = line "," f[c]; print line } }'
run() { # run P ARGS... -> one CSV row per pass on stdout
    p=$1; shift
    place="--bind-to none"
    if [ $((p * threads)) -gt "$cores" ]; then place="--oversubscribe --bind-to none"
    elif [ "$bind" = core ]; then place="--map-by slot:PE=$threads --bind-to core"; fi
    timeout 3600 mpirun $root $place -np "$p" "$fm" bench --d "$d" --heads "$heads" --threads "$threads" \
        --reps "$reps" --pass "$pass" --no-header "$@"
}
header="ranks,threads,batch,n,heads,heads_k,d,causal,layout,pass,seconds,gflops,compute_s,wait_s,bytes_per_step,rss_max_mib,rss_min_mib,rank_gflops,wait_mean_s,other_s"
for p in $ranks; do
    [ $((p * threads)) -gt "$cores" ] && echo "  note: $p ranks x $threads threads > $cores cores: oversubscribed, unbound, times not meaningful"
done
# columns: 1 ranks 4 n 9 layout 10 pass 11 seconds 12 gflops 14 wait_s 16 rss_max 17 rss_min
#          18 rank_gflops 19 wait_mean_s 20 other_s
for s in $sweeps; do
    f=$out/$tag$s.csv
    echo "$header" >"$f"
    case $s in
        weak)
            for r in $seq_rounds; do
                for p in $ranks; do run "$p" --tokens-per-rank "$cpr" --layout contiguous >>"$f"; done
            done
            echo; echo "weak scaling: $cpr tokens per rank, full mask, $threads threads per rank, bind $bind" \
                "(E = (o1 + P (T1 - o1)) / TP, setup o1 once; E_comp = slowest rank's compute GFLOP/s against 1" \
                "rank's; medians of $rounds round(s); rounds = min..max of each round's own E)"
            # each round's own pair: its P = 1 row (T1, o1) against its later rows
            rng=$(awk -F, 'NR == 1 { next } { key = $10
                if ($1 == 1) { t1[key] = $11; o1[key] = $20; next }
                if (!(key in t1)) next
                e = 100 * (o1[key] + $1 * (t1[key] - o1[key])) / $11; k = $1 "," key
                if (!(k in lo) || e < lo[k]) lo[k] = e; if (!(k in hi) || e > hi[k]) hi[k] = e }
                END { for (k in lo) printf "%s,%.1f,%.1f;", k, lo[k], hi[k] }' "$f")
            awk -F, "$med_awk" "$f" | awk -F, -v rng="$rng" 'BEGIN { n = split(rng, a, ";")
                    for (i = 1; i <= n; i++) if (split(a[i], b, ",") == 4) r[b[1] "," b[2]] = b[3] ".." b[4] "%" }
                NR == 1 { next } { key = $10; if (!(key in t1) && $1 == 1) { t1[key] = $11; o1[key] = $20; r1[key] = $18 }
                ec = 0; if ((key in r1) && r1[key] > 0) ec = 100 * $18 / r1[key]
                e = 0; if (key in t1) e = 100 * (o1[key] + $1 * (t1[key] - o1[key])) / $11
                k = $1 "," key; rr = (k in r) ? r[k] : "-"
                printf "  P=%-3s %-4s N=%-7s %8.4f s %7.1f GFLOP/s  E=%5.1f%% (rounds %s)  E_comp=%5.1f%%  wait %.4f (mean %.4f) s  other %.4f s  rss/rank %6.1f..%6.1f MiB\n",
                    $1, $10, $4, $11, $12, e, rr, ec, $14, $19, $20, $17, $16 }' ;;
        strong)
            for r in $seq_rounds; do
                for p in $ranks; do run "$p" --n "$n" --layout contiguous >>"$f"; done
            done
            echo; echo "strong scaling: N = $n, full mask, $threads threads per rank, bind $bind (E = T1 / (P TP);" \
                "medians of $rounds round(s))"
            awk -F, "$med_awk" "$f" | awk -F, 'NR == 1 { next } { key = $10; if (!(key in t1) && $1 == 1) { t1[key] = $11; r1[key] = $18 }
                ec = 0; if ((key in r1) && r1[key] > 0) ec = 100 * $18 / r1[key]
                printf "  P=%-3s %-4s %8.4f s %7.1f GFLOP/s  E=%5.1f%%  E_comp=%5.1f%%  wait %.4f (mean %.4f) s  other %.4f s  rss/rank %6.1f..%6.1f MiB\n",
                    $1, $10, $11, $12, (key in t1) ? 100 * t1[key] / ($1 * $11) : 0,
                    ec, $14, $19, $20, $17, $16 }' ;;
        alone)
            command -v taskset >/dev/null || { echo "ring_bench.sh: the alone sweep needs taskset (util-linux)" >&2; exit 2; }
            for r in $seq_rounds; do
                for p in $ranks; do
                    [ $((p * threads)) -gt "$cores" ] && { echo "  alone: P=$p x $threads threads > $cores cores: skipped"; continue; }
                    i=0; pids=""
                    while [ $i -lt "$p" ]; do
                        lo=$((i * threads)); hi=$((lo + threads - 1))
                        taskset -c "$lo-$hi" timeout 3600 mpirun $root --bind-to none -np 1 "$fm" bench --d "$d" \
                            --heads "$heads" --threads "$threads" --reps $((2 * p)) --pass "$pass" --no-header \
                            --tokens-per-rank "$cpr" --layout contiguous | sed "s/^1,/$p,/" >"$f.$i" &
                        pids="$pids $!"; i=$((i + 1))
                    done
                    wait $pids
                    i=0; while [ $i -lt "$p" ]; do cat "$f.$i" >>"$f.all"; rm -f "$f.$i"; i=$((i + 1)); done
                done
            done
            # one row per (P, round): the slowest of the P processes (rank_gflops, column 18)
            awk -F, '{ k = $1; n[k]++; if (!(k in lo) || $18 < lo[k]) { lo[k] = $18; row[k] = $0 }
                      if (n[k] == $1 + 0) { print row[k]; delete lo[k]; n[k] = 0 } }' "$f.all" >>"$f"
            rm -f "$f.all"
            echo; echo "alone: P independent one-rank runs at once, $cpr tokens each, $threads threads each on its own" \
                "cores (E_alone = the slowest one's compute GFLOP/s against P=1; medians of $rounds round(s))"
            awk -F, "$med_awk" "$f" | awk -F, 'NR == 1 { next } { key = $10; if (!(key in r1) && $1 == 1) r1[key] = $18
                e = 0; if ((key in r1) && r1[key] > 0) e = 100 * $18 / r1[key]
                printf "  P=%-3s %-4s slowest of P: %7.1f GFLOP/s  E_alone=%5.1f%%\n", $1, $10, $18, e }' ;;
        causal)
            for r in $seq_rounds; do
                for p in $ranks; do
                    for layout in contiguous zigzag; do
                        [ "$p" = 1 ] && [ $layout = zigzag ] && continue # one rank: one layout
                        run "$p" --n "$n" --causal --layout "$layout" >>"$f"
                    done
                done
            done
            echo; echo "causal, N = $n, $threads threads per rank, bind $bind: contiguous against zigzag" \
                "(speedup = T_contiguous / T_zigzag; E = T1 / (P TP), T1 one rank; medians of $rounds round(s))"
            awk -F, "$med_awk" "$f" | awk -F, 'NR == 1 { next } { key = $10; if (!(key in t1) && $1 == 1) t1[key] = $11
                t[$1 "," $10 "," $9] = $11
                printf "  P=%-3s %-4s %-10s %8.4f s  E=%5.1f%%  wait %.4f (mean %.4f) s  other %.4f s  rss/rank %6.1f..%6.1f MiB\n",
                    $1, $10, $9, $11, (key in t1) ? 100 * t1[key] / ($1 * $11) : 0, $14, $19, $20, $17, $16
                if ($9 == "zigzag" && (($1 "," $10 ",contiguous") in t))
                    printf "  P=%-3s %-4s zigzag speedup over contiguous: %.2fx\n", $1, $10, t[$1 "," $10 ",contiguous"] / $11 }' \
                ;;
    esac
    echo "wrote $f"
done
