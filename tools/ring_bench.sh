#!/bin/sh
# tools/ring_bench.sh — scaling of ring attention over Open MPI (build/flashattn-mpi bench).
#
#   sh tools/ring_bench.sh [--ranks "1 2 4 8"] [--tokens-per-rank C] [--n N] [--d D] [--heads H]
#                          [--threads T] [--reps R] [--pass fwd|bwd|both] [--out DIR] [--build DIR]
#
# Three sweeps, each a CSV in DIR (default build/ring_bench) and a table on stdout:
#   weak.csv    fixed tokens per rank C (N = P C), full mask. Attention work per rank grows
#               as P (P steps of C^2), so the efficiency is the per-rank throughput against
#               one rank: E_weak(P) = (GFLOP/s at P / P) / (GFLOP/s at 1).
#   strong.csv  fixed N, full mask: E_strong(P) = T(1) / (P T(P)).
#   causal.csv  fixed N, causal, contiguous and zigzag at each P: speedup = T_contig / T_zigzag,
#               and each layout's strong efficiency.
# Every row carries the peak resident set per rank (largest and smallest over the ranks,
# MiB): memory per rank should fall as 1/P at fixed N and stay flat at fixed C.
# Each rank runs T OpenMP threads (default 1); P x T should not exceed the cores: on a
# 2-core machine only P <= 2 is meaningful, and timings on a shared machine are noise
# (the script says so when it oversubscribes).
set -eu
ranks="1 2 4 8"; cpr=4096; n=16384; d=64; heads=4; threads=1; reps=3; pass=fwd
build=build; out=""
while [ $# -gt 0 ]; do
    case $1 in
        --ranks) ranks=$2; shift 2 ;;
        --tokens-per-rank) cpr=$2; shift 2 ;;
        --n) n=$2; shift 2 ;;
        --d) d=$2; shift 2 ;;
        --heads) heads=$2; shift 2 ;;
        --threads) threads=$2; shift 2 ;;
        --reps) reps=$2; shift 2 ;;
        --pass) pass=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        --build) build=$2; shift 2 ;;
        -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
        *) echo "ring_bench.sh: unknown option '$1'" >&2; exit 2 ;;
    esac
done
out=${out:-$build/ring_bench}
fm=$build/flashattn-mpi
[ -x "$fm" ] || { echo "ring_bench.sh: $fm not built (make mpi; needs Open MPI)" >&2; exit 2; }
command -v mpirun >/dev/null || { echo "ring_bench.sh: mpirun not found (apt-get install openmpi-bin)" >&2; exit 2; }
mkdir -p "$out"
cores=$(nproc 2>/dev/null || echo 1)
root=""; [ "$(id -u)" = 0 ] && root="--allow-run-as-root"
export OMPI_MCA_btl_vader_single_copy_mechanism=${OMPI_MCA_btl_vader_single_copy_mechanism:-none}
export OMP_NUM_THREADS=$threads
echo "ring_bench: ranks {$ranks} x $threads threads on $cores cores; d=$d heads=$heads; pass $pass; median of $reps"
run() { # run P ARGS... -> one CSV row per pass on stdout
    p=$1; shift
    over=""; [ $((p * threads)) -gt "$cores" ] && over="--oversubscribe"
    timeout 3600 mpirun $root $over --bind-to none -np "$p" "$fm" bench --d "$d" --heads "$heads" --threads "$threads" \
        --reps "$reps" --pass "$pass" --no-header "$@"
}
header="ranks,threads,batch,n,heads,heads_k,d,causal,layout,pass,seconds,gflops,compute_s,wait_s,bytes_per_step,rss_max_mib,rss_min_mib"
for p in $ranks; do
    [ $((p * threads)) -gt "$cores" ] && echo "  note: $p ranks x $threads threads > $cores cores: oversubscribed, times not meaningful"
done

echo "$header" >"$out/weak.csv"
for p in $ranks; do run "$p" --tokens-per-rank "$cpr" --layout contiguous >>"$out/weak.csv"; done
echo; echo "weak scaling: $cpr tokens per rank, full mask (E = per-rank GFLOP/s against 1 rank)"
awk -F, 'NR == 1 { next } { key = $10; if (!(key in g1) && $1 == 1) g1[key] = $12
    printf "  P=%-3s %-4s N=%-8s %9.4f s %8.2f GFLOP/s  E=%5.1f%%  wait %7.4f s  rss/rank %6.1f..%6.1f MiB\n",
        $1, $10, $4, $11, $12, (key in g1) ? 100 * $12 / $1 / g1[key] : 0, $14, $17, $16 }' "$out/weak.csv"

echo "$header" >"$out/strong.csv"
for p in $ranks; do run "$p" --n "$n" --layout contiguous >>"$out/strong.csv"; done
echo; echo "strong scaling: N = $n, full mask (E = T1 / (P TP))"
awk -F, 'NR == 1 { next } { key = $10; if (!(key in t1) && $1 == 1) t1[key] = $11
    printf "  P=%-3s %-4s %9.4f s %8.2f GFLOP/s  E=%5.1f%%  wait %7.4f s  rss/rank %6.1f..%6.1f MiB\n",
        $1, $10, $11, $12, (key in t1) ? 100 * t1[key] / ($1 * $11) : 0, $14, $17, $16 }' "$out/strong.csv"

echo "$header" >"$out/causal.csv"
for p in $ranks; do
    for layout in contiguous zigzag; do run "$p" --n "$n" --causal --layout "$layout" >>"$out/causal.csv"; done
done
echo; echo "causal, N = $n: contiguous against zigzag (speedup = T_contiguous / T_zigzag)"
awk -F, 'NR == 1 { next } { key = $9 "," $10; if (!(key in t1) && $1 == 1) t1[key] = $11
    t[$1 "," $10 "," $9] = $11
    printf "  P=%-3s %-4s %-10s %9.4f s  E=%5.1f%%  wait %7.4f s  rss/rank %6.1f..%6.1f MiB\n",
        $1, $10, $9, $11, (key in t1) ? 100 * t1[key] / ($1 * $11) : 0, $14, $17, $16
    if ($9 == "zigzag" && (($1 "," $10 ",contiguous") in t))
        printf "  P=%-3s %-4s zigzag speedup over contiguous: %.2fx\n", $1, $10, t[$1 "," $10 ",contiguous"] / $11 }' \
    "$out/causal.csv"
echo; echo "wrote $out/weak.csv $out/strong.csv $out/causal.csv"
