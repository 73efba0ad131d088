#!/bin/sh
# shellcheck disable=SC2086,SC2046,SC2015  # option strings are split into words on purpose
# cuda/run_tc4.sh — issue 15, rung 05pp (05ws + FlashAttention-3's ping-pong) on the H200 beside 05ws and
# PyTorch SDPA (flash, cuDNN), in one call:
#
#   sh cuda/run_tc4.sh OUTDIR [BUDGET_SECONDS]     (default 200; the binary is built beforehand
#                                                   with `make cuda` and carried: nothing compiles here)
# In priority order, each step inside the budget (what no longer fits is logged as skipped):
#   1. the harness self-test;
#   2. 05pp validated over all rows by libflashattn: one 128 x 128 tile (d 64, d 128), 8 x 8 tiles,
#      then run_tc3.sh's six edge shapes, bf16 and fp16 (if its first small run fails or hangs,
#      every later 05pp step is skipped);
#   3. PyTorch SDPA forward (flash, cuDNN, memory-efficient) on every shape timed below;
#   4. the target shape (bf16, d 128, N 16384, H 16, causal and not): 05ws and 05pp, each validated
#      (sampled rows) by libflashattn before it is timed;
#   5. compute-sanitizer racecheck and memcheck of 05pp on small shapes;
#   6. 05ws and 05pp at d = 64 (N 16384), GQA 32:8 (d 128, N 4096, B 2); 05pp fp16 at the target shape.
# Output in OUTDIR: h200_tc4.csv, run.log, device.txt, clocks.csv.
set -u
OUTDIR=${1:?usage: sh cuda/run_tc4.sh OUTDIR [BUDGET_SECONDS]}
BUDGET=${2:-200}
CSV=$OUTDIR/h200_tc4.csv
. cuda/run_lib.sh
SAN_SECONDS=40
pp=1
hp() { # as h, for rung 05pp: nothing once it has failed (nor its sanitizer runs)
    if [ $pp = 0 ]; then say "skipped (05pp failed before): $1"; return; fi
    f0=$fails
    h "$@"
    [ $fails -gt "$f0" ] && { pp=0; GATE="05pp failed before"; }
    return 0
}
"$BIN" --self-test >> "$LOG" 2>&1 && say "self-test: PASS" || { say "self-test FAILED"; fails=$((fails + 1)); }

say "== 2. rung 05pp, all rows ($(left) s left)"
hp "validate 05pp bf16 one tile d=64" 15 --kernel 05pp --heads 1 --seqlen 128 --d 64 --no-time --seed 7
hp "validate 05pp bf16 one tile d=128" 15 --kernel 05pp --heads 1 --seqlen 128 --d 128 --no-time --seed 7
hp "validate 05pp bf16 8x8 tiles d=128 H=2" 20 --kernel 05pp --heads 2 --seqlen 1024 --d 128 --no-time --seed 7
hp "validate 05pp bf16 8x8 tiles d=64 causal" 20 --kernel 05pp --heads 2 --seqlen 1024 --d 64 --causal --no-time --seed 7
edges hp 05pp bf16
edges hp 05pp fp16

say "== 3. SDPA forward ($(left) s left)"
SHAPES="128:16384:0:16:16:1,128:16384:1:16:16:1,64:16384:0:16:16:1,64:16384:1:16:16:1,128:4096:0:32:8:2,128:4096:1:32:8:2"
PYTHONUNBUFFERED=1 timeout 60 python3 cuda/sdpa_bench.py --csv "$CSV" --repeats 10 --max-seconds 0.3 \
    --deadline $(($(date +%s) + 45)) --shapes "$SHAPES" >> "$LOG" 2>&1 || say "sdpa_bench.py failed (see run.log)"

say "== 4. target shape ($(left) s left)"
T="--d 128 --seqlen 16384 --heads 16 --batch 1 --dtype bf16 --repeats 10 --max-seconds 0.5 --csv $CSV"
for c in 0 1; do
    cc=""
    [ $c = 1 ] && cc="--causal"
    h "time 05ws bf16 d=128 N=16384 causal=$c" 25 --kernel 05ws $T $cc
    hp "time 05pp bf16 d=128 N=16384 causal=$c" 25 --kernel 05pp $T $cc
done

say "== 5. compute-sanitizer ($(left) s left)"
san "racecheck 05pp d=128 causal GQA tails" racecheck --kernel 05pp --d 128 --heads 2 --heads-k 1 --seqlen-q 100 --seqlen-k 150 --causal
san "racecheck 05pp d=64 window+softcap" racecheck --kernel 05pp --d 64 --heads 2 --seqlen 520 --window 300,7 --softcap 20
san "memcheck  05pp d=128 causal GQA tails" memcheck --kernel 05pp --d 128 --heads 2 --heads-k 1 --seqlen-q 100 --seqlen-k 150 --causal

say "== 6. d = 64, GQA, fp16 ($(left) s left)"
for c in 0 1; do
    cc=""
    [ $c = 1 ] && cc="--causal"
    S64="--d 64 --seqlen 16384 --heads 16 --batch 1 --dtype bf16 --repeats 10 --max-seconds 0.5 --csv $CSV $cc"
    SG="--d 128 --seqlen 4096 --heads 32 --heads-k 8 --batch 2 --dtype bf16 --repeats 10 --max-seconds 0.5 --csv $CSV $cc"
    h "time 05ws bf16 d=64 N=16384 causal=$c" 20 --kernel 05ws $S64
    hp "time 05pp bf16 d=64 N=16384 causal=$c" 20 --kernel 05pp $S64
    h "time 05ws bf16 d=128 N=4096 GQA 32:8 B=2 causal=$c" 20 --kernel 05ws $SG
    hp "time 05pp bf16 d=128 N=4096 GQA 32:8 B=2 causal=$c" 20 --kernel 05pp $SG
done
hp "time 05pp fp16 d=128 N=16384 causal=0" 20 --kernel 05pp --d 128 --seqlen 16384 --heads 16 --batch 1 --dtype fp16 \
    --repeats 10 --max-seconds 0.5 --csv "$CSV"

{
    date -u '+end: %Y-%m-%d %H:%M:%S UTC'
    nvidia-smi --query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv
} >> "$OUTDIR/device.txt" 2>&1
say "== done in $(($(date +%s) - START)) s; $fails failed; $(grep -c '^ok ' "$LOG") ok; $(grep -c '^skipped' "$LOG") skipped"
[ -f "$CSV" ] && python3 cuda/results_table.py "$CSV" | tee -a "$LOG"
grep -B2 -A12 "verdict: FAIL" "$LOG" | head -40
grep -A8 "RACECHECK SUMMARY\|ERROR SUMMARY\|Race reported\|Hazard" "$LOG" | head -30
[ $fails -eq 0 ]
