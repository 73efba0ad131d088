#!/bin/sh
# shellcheck disable=SC2086  # option strings are split into words on purpose
# cuda/run_tc4_ablation.sh — what 05pp's gain over 05ws owes to the ping-pong and what to its extra
# K/V stage, in one call:
#
#   make cuda    (build/cuda/flashattn-cuda: 05ws with 2 stages at d = 128, 3 at d = 64)
#   nvcc ... -DFA_05WS_EXTRA_STAGE=1 cuda/05_hopper.cu, linked as build/cuda-ws3/flashattn-cuda
#                (05ws with 05pp's stage count: 3 at d = 128, 4 at d = 64)
#   sh cuda/run_tc4_ablation.sh OUTDIR
# The extra-stage 05ws is first validated over all rows on three shapes, then every variant is
# validated (sampled rows) and timed at the target shape, causal and not, and at d = 64.
set -u
OUTDIR=${1:?usage: sh cuda/run_tc4_ablation.sh OUTDIR}
mkdir -p "$OUTDIR"
CSV=$OUTDIR/h200_tc4_ablation.csv
LOG=$OUTDIR/run.log
: > "$LOG"
fails=0
run() { # label, binary, arguments
    label=$1
    bin=$2
    shift 2
    echo "-- $label: $*" >> "$LOG"
    if timeout 25 "$bin" "$@" < /dev/null >> "$LOG" 2>&1; then echo "ok    $label" | tee -a "$LOG"
    else echo "FAIL  $label" | tee -a "$LOG"; fails=$((fails + 1)); fi
}
A=build/cuda/flashattn-cuda
B=build/cuda-ws3/flashattn-cuda
run "validate 05ws+stage one tile d=128" $B --kernel 05ws --heads 1 --seqlen 128 --d 128 --no-time --seed 7
run "validate 05ws+stage 8x8 tiles d=128" $B --kernel 05ws --heads 2 --seqlen 1024 --d 128 --no-time --seed 7
run "validate 05ws+stage GQA causal tails" $B --kernel 05ws --heads 4 --heads-k 2 --seqlen-q 200 --seqlen-k 333 --d 128 --causal --no-time --seed 7
run "validate 05ws+stage d=64 causal" $B --kernel 05ws --heads 2 --seqlen 1024 --d 64 --causal --no-time --seed 7
for shape in "--d 128" "--d 128 --causal" "--d 64"; do
    T="$shape --seqlen 16384 --heads 16 --batch 1 --dtype bf16 --repeats 10 --max-seconds 0.5"
    run "time 05ws       $shape" $A --kernel 05ws $T --csv "$CSV"
    run "time 05ws+stage $shape" $B --kernel 05ws $T --csv "$CSV.ws3"
    run "time 05pp       $shape" $A --kernel 05pp $T --csv "$CSV"
done
sed 's/^05ws_hopper_tma,/05ws_extra_stage,/' "$CSV.ws3" | grep -v '^kernel,' >> "$CSV" && rm -f "$CSV.ws3"
cut -d, -f1,8,9,14,17,20 "$CSV" | tee -a "$LOG"
echo "$fails failed"
[ $fails -eq 0 ]
