#!/bin/sh
# tools/perf_table.sh BUILD OUTDIR — the measurements behind docs/performance.md.
#
# Runs `flashattn bench` for the figures of issue 3 and docs/performance.md (all in one
# session, so ratios are side by side) and prints markdown tables built from
# the CSV rows. Takes a few minutes: standard attention at N = 8192 is slow by
# design. Run it on an otherwise idle machine; it reports medians anyway.
set -eu
build=${1:-build}
out=${2:-$build/perf}
fa=$build/flashattn
mkdir -p "$out"
reps=${REPEATS:-5}

echo "# machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) CPUs, $(date -u +%Y-%m-%d)"
"$fa" info | sed -n '1,4p' | sed 's/^/# /'

"$fa" bench --threads 2 --n 1024,2048,4096,8192 --d 64,128 --repeats "$reps" --csv "$out/fwd_2t.csv" >"$out/fwd_2t.txt"
"$fa" bench --threads 2 --n 1024,2048,4096,8192 --d 64,128 --impl flash --causal --repeats "$reps" --csv "$out/causal_2t.csv" >"$out/causal_2t.txt"
"$fa" bench --threads 1 --n 1024,2048,4096,8192 --d 64,128 --impl flash --repeats "$reps" --csv "$out/fwd_1t.csv" >"$out/fwd_1t.txt"
FA_ISA=avx2 "$fa" bench --threads 2 --n 1024,2048,4096,8192 --d 128 --impl flash --repeats "$reps" --csv "$out/avx2_2t.csv" >"$out/avx2_2t.txt" 2>&1 || true

peak2=$(sed -n 's/.*measured FMA peak \([0-9.]*\).*/\1/p' "$out/fwd_2t.txt")
peak1=$(sed -n 's/.*measured FMA peak \([0-9.]*\).*/\1/p' "$out/fwd_1t.txt")
echo
echo "Measured FMA peak: $peak2 GFLOP/s on 2 threads, $peak1 on 1 thread (AVX-512 loop, best of 5)."
echo
echo "### Forward, non-causal, float32, B=1, H=8, 2 threads (median GFLOP/s; ratios in the same run)"
echo
echo "| d | N | flash GFLOP/s | of peak | standard | blas (OpenBLAS) | flash / standard | flash / blas | flash 1 thread | 2t / 1t |"
echo "|---|---|---|---|---|---|---|---|---|---|"
awk -F, '
  FNR == 1 { next }
  FILENAME ~ /fwd_2t/ { g[$1 "," $10 "," $8] = $15; f[$1 "," $10 "," $8] = $16; keys[$10 "," $8] = 1 }
  FILENAME ~ /fwd_1t/ { one[$10 "," $8] = $15 }
  END {
    n = split("64,1024 64,2048 64,4096 64,8192 128,1024 128,2048 128,4096 128,8192", order, " ")
    for (i = 1; i <= n; i++) {
      k = order[i]; split(k, a, ",")
      fl = g["flash," k]; st = g["standard," k]; bl = g["blas," k]
      printf "| %s | %s | %.1f | %.0f%% | %s | %s | %s | %s | %s | %s |\n", a[1], a[2], fl, 100 * f["flash," k],
        st == "" ? "-" : sprintf("%.1f", st), bl == "" ? "-" : sprintf("%.1f", bl),
        st == "" ? "-" : sprintf("%.1fx", fl / st), bl == "" ? "-" : sprintf("%.2fx", fl / bl),
        one[k] == "" ? "-" : sprintf("%.1f", one[k]), one[k] == "" ? "-" : sprintf("%.2fx", fl / one[k])
    }
  }' "$out/fwd_2t.csv" "$out/fwd_1t.csv"
echo
echo "### Causal forward (GFLOP/s on the halved FLOP count), and AVX2 forced, 2 threads"
echo
echo "| d | N | causal flash | causal / non-causal | avx2 flash (d=128) |"
echo "|---|---|---|---|---|"
awk -F, '
  FNR == 1 { next }
  FILENAME ~ /causal_2t/ { c[$10 "," $8] = $15 }
  FILENAME ~ /fwd_2t/ && $1 == "flash" { nc[$10 "," $8] = $15 }
  FILENAME ~ /avx2_2t/ { av[$10 "," $8] = $15 }
  END {
    n = split("64,1024 64,2048 64,4096 64,8192 128,1024 128,2048 128,4096 128,8192", order, " ")
    for (i = 1; i <= n; i++) {
      k = order[i]; split(k, a, ",")
      printf "| %s | %s | %.1f | %.2f | %s |\n", a[1], a[2], c[k], c[k] / nc[k], av[k] == "" ? "-" : sprintf("%.1f", av[k])
    }
  }' "$out/causal_2t.csv" "$out/fwd_2t.csv" "$out/avx2_2t.csv"
