#!/bin/sh
# tools/device_t16_blocks.sh OUTDIR — for the 16-core device host, in ONE call: where do the
# 16-thread N = 1024 rows lose against 2 threads (issue 14 item 8)? Times the flash forward
# (tools/ab_time.c, threads pinned) at d = 128 / 64, N = 1024, H = 8, 16 threads under block,
# packing and strip settings (all of which keep the bits per (ISA, blocks): only the blocks
# move them), the settings alternating inside each of ROUNDS rounds, then PyTorch's CPU SDPA
# once on the same rows; and, where perf exists, a profile of the default at d = 128.
#   usage (from the repository root): sh tools/device_t16_blocks.sh OUTDIR   (about 5 minutes)
#   environment: ROUNDS (default 5)
set -u
out=${1:-/tmp/t16_blocks}
rounds=${ROUNDS:-5}
mkdir -p "$out"
make -j16 build/libflashattn.a >/dev/null 2>&1 || { echo "the library did not build"; exit 1; }
ab=$out/ab_time
cc -std=c11 -O2 -D_POSIX_C_SOURCE=200809L -Iinclude -Itools tools/ab_time.c build/libflashattn.a -fopenmp -lm -o "$ab" || exit 1
export OMP_PROC_BIND=close OMP_PLACES=cores
lscpu | sed -n '/Model name/p;/^L1d/p;/^L2/p;/^L3/p'
variants='default
FA_BLOCK_Q=128
FA_BLOCK_Q=64
FA_BLOCK_K=128
FA_BLOCK_Q=128 FA_BLOCK_K=128
FA_FLASH_SHARED_MAX=0
FA_STRIP_ROWS=0'
r=1
while [ "$r" -le "$rounds" ]; do
    for d in 128 64; do
        echo "$variants" | while read -r v; do
            if [ "$v" = default ]; then set --; else set -- $v; fi
            printf 'round %d d %d %-30s ' "$r" "$d" "$v"
            env "$@" "$ab" 1024 "$d" 8 16 40 --context
        done
    done
    r=$((r + 1))
done 2>&1 | tee "$out/t16_blocks.log"
echo "== medians (GFLOP/s) over rounds"
awk '/gflops/ {k="d " $4; for (i = 5; i <= NF - 4; i++) k = k " " $i; print k "|" $(NF - 2)}' "$out/t16_blocks.log" |
    sort -t'|' -k1,1 -k2,2n |
    awk -F'|' '{if ($1 != key && n) {printf "%-40s median %.1f (%d rounds)\n", key, v[int((n + 1) / 2)], n; n = 0}
                key = $1; v[++n] = $2}
               END {if (n) printf "%-40s median %.1f (%d rounds)\n", key, v[int((n + 1) / 2)], n}'
python3 tools/torch_cpu_sdpa.py --n 1024 --d 64,128 --threads 16 --causal 0 --repeats 7 2>&1 | tail -4
if command -v perf >/dev/null 2>&1; then
    perf record -o "$out/perf.data" "$ab" 1024 128 8 16 200 --context >/dev/null 2>&1 &&
        perf report -i "$out/perf.data" --stdio 2>/dev/null | grep -v '^#' | grep -v '^$' | head -30 > "$out/perf_t16.txt"
    rm -f "$out/perf.data"
    cat "$out/perf_t16.txt"
else
    echo "(no perf on this host)"
fi
rm -f "$ab"
