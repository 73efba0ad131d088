#!/bin/sh
# tools/gpu_row_rule.sh OUTDIR — on a GPU machine: `check`'s row rule (docs/validation.md, "The
# row rule") against real kernels' outputs, in one call:
#   1. the cuda/ ladder's forward rungs in bf16 and fp16 on cuda/check_gpu.sh's shapes (each run's
#      report has a "row rule:" line: the worst row's fraction of its bound);
#   2. tools/row_rule_sdpa.py: PyTorch SDPA's backends on a grid, and a real kernel run with a
#      window where causal was meant.
# Logs: OUTDIR/rungs.log (whole reports), OUTDIR/rungs.txt (one line a run), OUTDIR/sdpa.log.
set -u
OUT=${1:-build/row_rule}
mkdir -p "$OUT"
make -j"$(nproc)" build/libflashattn.a build/libflashattn.so build/flashattn >"$OUT/build.log" 2>&1 &&
    make -j"$(nproc)" cuda >>"$OUT/build.log" 2>&1 || { echo "gpu_row_rule: build failed"; tail -20 "$OUT/build.log"; exit 2; }
BIN=build/cuda/flashattn-cuda
SHAPES=$(sed -n '/^SHAPES="/,/"$/p' cuda/check_gpu.sh | sed 's/^SHAPES="//; s/"$//')
: >"$OUT/rungs.log"
for dt in bf16 fp16; do
    for k in 01 02 03 04 05; do
        echo "$SHAPES" | while read -r line; do
            args=$(echo "$line" | sed 's/=/ /g')
            # shellcheck disable=SC2086
            "$BIN" --kernel $k --dtype $dt $args --no-time --seed 7 >"$OUT/one.log" 2>&1
            rc=$?
            cat "$OUT/one.log" >>"$OUT/rungs.log"
            row=$(sed -n 's/.*worst (batch, row, head) = ([0-9, ]*) at \([0-9.e+-]*\) of its bound.*/\1/p' "$OUT/one.log")
            ratio=$(sed -n 's/^tested \/ emulated max error: \([0-9.e+-]*\).*/\1/p' "$OUT/one.log")
            echo "$k $dt rc=$rc ratio=$ratio row=$row $line"
        done
    done
done | tee "$OUT/rungs.txt"
rm -f "$OUT/one.log"
echo "rungs: largest row fraction $(sed -n 's/.* row=\([0-9.e+-]*\) .*/\1/p' "$OUT/rungs.txt" | sort -g | tail -1), runs not exiting 0: $(grep -vc ' rc=0 ' "$OUT/rungs.txt")"
FA_BUILD=build PYTHONUNBUFFERED=1 python3 tools/row_rule_sdpa.py 2>&1 | tee "$OUT/sdpa.log"
