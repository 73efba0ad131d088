#!/bin/sh
# cuda/run_tc_min.sh — the smallest useful H200 call for rungs 04/04b, for a session with
# ~4 minutes of device time left (the binary is built beforehand on the CPU machine with
# `make cuda` and carried; nothing is compiled on the GPU machine):
#   sh cuda/run_tc_min.sh OUTDIR
# 1. self-test; 2. 04 and 04b validated over all rows (bf16) on three edge shapes
# (causal GQA tails with seqlen_q != seqlen_k, window + softcap, seqlen_k = 1);
# 3. the issue-15 target shape (bf16, d 128, N 16384, H 16): SDPA flash/cuDNN, then rungs
# 04, 03 (same run) and 04b, each validated by libflashattn before it is timed.
# The full programme is cuda/run_tc.sh.
set -u
OUT=${1:?usage: sh cuda/run_tc_min.sh OUTDIR}
mkdir -p "$OUT"
B=build/cuda/flashattn-cuda
L=$OUT/run.log
CSV=$OUT/h200_tc.csv
fails=0
say() { echo "$*" | tee -a "$L"; }
h() { # label, seconds allowed, harness arguments
    label=$1; lim=$2; shift 2
    echo "-- $label: $*" >> "$L"
    timeout "$lim" "$B" "$@" < /dev/null >> "$L" 2>&1
    rc=$?
    if [ $rc -eq 0 ]; then say "ok    $label"; else say "FAIL  $label (exit $rc)"; fails=$((fails + 1)); fi
}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu --format=csv > "$OUT/device.txt" 2>&1
"$B" --self-test >> "$L" 2>&1 && say "self-test: PASS" || { say "self-test FAILED"; fails=1; }
E1="--heads 4 --heads-k 2 --seqlen-q 200 --seqlen-k 333 --d 128 --causal"
E2="--heads 2 --seqlen 300 --d 128 --window 40,7 --softcap 20"
E3="--batch 3 --heads 2 --seqlen-q 65 --seqlen-k 1 --d 64"
for k in 04 04b; do
    for e in "$E1" "$E2" "$E3"; do
        # shellcheck disable=SC2086
        h "validate $k bf16 $e" 20 --kernel $k --dtype bf16 $e --no-time --seed 7
    done
done
PYTHONUNBUFFERED=1 timeout 45 python3 cuda/sdpa_bench.py --csv "$CSV" --bwd --repeats 10 --max-seconds 0.3 \
    --deadline $(($(date +%s) + 40)) --shapes "128:16384:0:16:16:1" >> "$L" 2>&1 || say "sdpa_bench.py did not finish"
T="--d 128 --seqlen 16384 --heads 16 --batch 1 --dtype bf16 --repeats 10 --max-seconds 0.5 --csv $CSV"
# shellcheck disable=SC2086
h "time 04  bf16 d=128 N=16384" 40 --kernel 04 $T
# shellcheck disable=SC2086
h "time 03  bf16 d=128 N=16384" 40 --kernel 03 $T
# shellcheck disable=SC2086
h "time 04b bf16 d=128 N=16384" 70 --kernel 04b $T
say "== $fails failed"
[ -f "$CSV" ] && python3 cuda/results_table.py "$CSV" | tee -a "$L"
[ $fails -eq 0 ]
