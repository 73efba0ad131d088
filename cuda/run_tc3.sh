#!/bin/sh
# shellcheck disable=SC2086,SC2046,SC2015  # option strings are split into words on purpose
# cuda/run_tc3.sh — issue 15, rung 05 (wgmma) on the H200 beside 03/04/04b and PyTorch SDPA, in one call:
#
#   sh cuda/run_tc3.sh OUTDIR [BUDGET_SECONDS]     (default 540; the binary is built beforehand
#                                                   with `make cuda` and carried: nothing compiles here)
# In priority order, each step inside the budget (what no longer fits is logged as skipped):
#   1. the harness self-test;
#   2. rungs 05 and 05ws validated over all rows by libflashattn, from the simplest shape up (one
#      128 x 128 tile at d = 64, then d = 128, then many tiles), then check_gpu.sh's six edge shapes,
#      bf16 and fp16 (05ws: if its first small run fails or hangs, every later 05ws step is skipped);
#   3. PyTorch SDPA (flash, cuDNN, memory-efficient; forward and backward) on every shape timed below;
#   4. the target shape (bf16, d 128, N 16384, H 16, causal and not): 05, 05ws, 04, 04b, 03 - the same-run
#      table of cuda/README.md - each validated by libflashattn before it is timed;
#   5. ncu of 05's kernel at the target shape (tensor pipe, bank conflicts, stalls);
#   6. compute-sanitizer memcheck and racecheck of 05 (memcheck of 05ws) on small shapes;
#   7. 05 and 05ws at d = 64 (N 16384), GQA 32:8 (d 128, N 4096, B 2) and fp16 (target shape).
# Output in OUTDIR: h200_tc3.csv, run.log, device.txt, clocks.csv, ncu_05.txt.
set -u
OUTDIR=${1:?usage: sh cuda/run_tc3.sh OUTDIR [BUDGET_SECONDS]}
BUDGET=${2:-540}
CSV=$OUTDIR/h200_tc3.csv
. cuda/run_lib.sh
"$BIN" --self-test >> "$LOG" 2>&1 && say "self-test: PASS" || { say "self-test FAILED"; fails=$((fails + 1)); }

say "== 2. rung 05, all rows ($(left) s left)"
h "validate 05 bf16 one tile d=64" 20 --kernel 05 --heads 1 --seqlen 128 --d 64 --no-time --seed 7
h "validate 05 bf16 one tile d=128" 20 --kernel 05 --heads 1 --seqlen 128 --d 128 --no-time --seed 7
h "validate 05 bf16 8x8 tiles d=128 H=2" 20 --kernel 05 --heads 2 --seqlen 1024 --d 128 --no-time --seed 7
h "validate 05 bf16 8x8 tiles d=64 causal" 20 --kernel 05 --heads 2 --seqlen 1024 --d 64 --causal --no-time --seed 7
edges h 05 bf16
edges h 05 fp16
ws=1
hw() { # as h, for rung 05ws: nothing once it has failed
    if [ $ws = 0 ]; then say "skipped (05ws failed before): $1"; return; fi
    f0=$fails
    h "$@"
    [ $fails -gt "$f0" ] && ws=0
    return 0
}
hw "validate 05ws bf16 one tile d=64" 15 --kernel 05ws --heads 1 --seqlen 128 --d 64 --no-time --seed 7
ws1=$ws
ws=1
hw "validate 05ws bf16 one tile d=128" 15 --kernel 05ws --heads 1 --seqlen 128 --d 128 --no-time --seed 7
[ $ws1 = 0 ] && ws=0
hw "validate 05ws bf16 8x8 tiles d=128 H=2" 20 --kernel 05ws --heads 2 --seqlen 1024 --d 128 --no-time --seed 7
hw "validate 05ws bf16 8x8 tiles d=64 causal" 20 --kernel 05ws --heads 2 --seqlen 1024 --d 64 --causal --no-time --seed 7
edges hw 05ws bf16
edges hw 05ws fp16

say "== 3. SDPA ($(left) s left)"
SHAPES="128:16384:0:16:16:1,128:16384:1:16:16:1,64:16384:0:16:16:1,64:16384:1:16:16:1,128:4096:0:32:8:2,128:4096:1:32:8:2"
PYTHONUNBUFFERED=1 timeout 150 python3 cuda/sdpa_bench.py --csv "$CSV" --bwd --repeats 10 --max-seconds 0.3 \
    --deadline $(($(date +%s) + 120)) --shapes "$SHAPES" >> "$LOG" 2>&1 || say "sdpa_bench.py failed (see run.log)"

say "== 4. target shape ($(left) s left)"
T="--d 128 --seqlen 16384 --heads 16 --batch 1 --dtype bf16 --repeats 10 --max-seconds 0.5 --csv $CSV"
h "time 05   bf16 d=128 N=16384 causal=0" 25 --kernel 05 $T
h "time 05   bf16 d=128 N=16384 causal=1" 25 --kernel 05 $T --causal
hw "time 05ws bf16 d=128 N=16384 causal=0" 25 --kernel 05ws $T
hw "time 05ws bf16 d=128 N=16384 causal=1" 25 --kernel 05ws $T --causal
h "time 04   bf16 d=128 N=16384 causal=0" 25 --kernel 04 $T
h "time 04   bf16 d=128 N=16384 causal=1" 25 --kernel 04 $T --causal
h "time 04b  bf16 d=128 N=16384 causal=0" 50 --kernel 04b $T
h "time 04b  bf16 d=128 N=16384 causal=1" 50 --kernel 04b $T --causal
h "time 03   bf16 d=128 N=16384 causal=0" 25 --kernel 03 $T
h "time 03   bf16 d=128 N=16384 causal=1" 25 --kernel 03 $T --causal

say "== 5. ncu ($(left) s left)"
if [ "$(left)" -gt 120 ]; then
    timeout 80 ncu --clock-control none --launch-count 1 --section SpeedOfLight --section ComputeWorkloadAnalysis \
        --section MemoryWorkloadAnalysis_Tables --section WarpStateStats --section Occupancy --section LaunchStats \
        -k regex:hopper_forward "$BIN" --kernel 05 --d 128 --seqlen 16384 --heads 16 --no-time \
        > "$OUTDIR/ncu_05.txt" 2>&1 && say "ok    ncu 05 sections" || say "FAIL  ncu 05 sections (see ncu_05.txt)"
    for m in l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum \
             sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active \
             sm__inst_executed_pipe_tensor_op_gmma.sum,smsp__inst_executed.sum; do
        timeout 40 ncu --clock-control none --launch-count 1 --metrics "$m" -k regex:hopper_forward "$BIN" --kernel 05 \
            --d 128 --seqlen 16384 --heads 16 --no-time >> "$OUTDIR/ncu_05.txt" 2>&1 && say "ok    ncu 05 $m" ||
            say "FAIL  ncu 05 $m (see ncu_05.txt)"
    done
else say "skipped (budget): ncu 05"; fi

say "== 6. compute-sanitizer ($(left) s left)"
san "memcheck  05 d=128 causal GQA tails" memcheck --kernel 05 --d 128 --heads 2 --heads-k 1 --seqlen-q 100 --seqlen-k 150 --causal
san "memcheck  05 d=64 window+softcap" memcheck --kernel 05 --d 64 --heads 2 --seqlen 192 --window 40,7 --softcap 20
san "racecheck 05 d=128 causal GQA tails" racecheck --kernel 05 --d 128 --heads 2 --heads-k 1 --seqlen-q 100 --seqlen-k 150 --causal
san "racecheck 05 d=64 full tiles" racecheck --kernel 05 --d 64 --heads 2 --seqlen 384
if [ $ws = 1 ]; then
    san "memcheck  05ws d=128 causal GQA tails" memcheck --kernel 05ws --d 128 --heads 2 --heads-k 1 --seqlen-q 100 --seqlen-k 150 --causal
    san "memcheck  05ws d=64 window+softcap" memcheck --kernel 05ws --d 64 --heads 2 --seqlen 192 --window 40,7 --softcap 20
fi

say "== 7. d = 64, GQA, fp16 ($(left) s left)"
for c in 0 1; do
    cc=""
    [ $c = 1 ] && cc="--causal"
    S64="--d 64 --seqlen 16384 --heads 16 --batch 1 --dtype bf16 --repeats 10 --max-seconds 0.5 --csv $CSV $cc"
    SG="--d 128 --seqlen 4096 --heads 32 --heads-k 8 --batch 2 --dtype bf16 --repeats 10 --max-seconds 0.5 --csv $CSV $cc"
    h "time 05   bf16 d=64 N=16384 causal=$c" 25 --kernel 05 $S64
    h "time 05   bf16 d=128 N=4096 GQA 32:8 B=2 causal=$c" 25 --kernel 05 $SG
    hw "time 05ws bf16 d=64 N=16384 causal=$c" 25 --kernel 05ws $S64
    hw "time 05ws bf16 d=128 N=4096 GQA 32:8 B=2 causal=$c" 25 --kernel 05ws $SG
done
h "time 05   fp16 d=128 N=16384 causal=0" 25 --kernel 05 --d 128 --seqlen 16384 --heads 16 --batch 1 --dtype fp16 \
    --repeats 10 --max-seconds 0.5 --csv "$CSV"
hw "time 05ws fp16 d=128 N=16384 causal=0" 25 --kernel 05ws --d 128 --seqlen 16384 --heads 16 --batch 1 --dtype fp16 \
    --repeats 10 --max-seconds 0.5 --csv "$CSV"

{
    date -u '+end: %Y-%m-%d %H:%M:%S UTC'
    nvidia-smi --query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv
} >> "$OUTDIR/device.txt" 2>&1
say "== done in $(($(date +%s) - START)) s; $fails failed; $(grep -c '^ok ' "$LOG") ok; $(grep -c '^skipped' "$LOG") skipped (budget)"
[ -f "$CSV" ] && python3 cuda/results_table.py "$CSV" | tee -a "$LOG"
if [ -f "$OUTDIR/ncu_05.txt" ]; then
    echo "== ncu_05.txt"
    grep -E "Compute \(SM\) Throughput|Memory Throughput|Duration|Registers Per|Achieved Occupancy|Issue Slots Busy|Executed Ipc A|bank_conflicts|wavefronts_mem_shared|gmma|inst_executed.sum|Warp Cycles Per Issued|stalled" "$OUTDIR/ncu_05.txt" | head -30
fi
# a failing validation's report, for the reply's tail
grep -B2 -A12 "verdict: FAIL" "$LOG" | head -60
[ $fails -eq 0 ]
