#!/bin/sh
# shellcheck disable=SC2086,SC2046,SC2015  # option strings are split into words on purpose
# cuda/run_tc2.sh — issue 15, second programme for rungs 04/04b on the H200, in one call:
#
#   sh cuda/run_tc2.sh OUTDIR [BUDGET_SECONDS]     (default 540; the binary is built beforehand
#                                                   with `make cuda` and carried: nothing compiles here)
# In priority order, each step inside the budget (what no longer fits is logged as skipped):
#   1. the harness self-test;
#   2. 04b (single pass, dQ by float atomics) and 04bd (deterministic split) validated over all
#      rows against libflashattn's float64 backward, bf16 and fp16, on check_gpu.sh's six edge
#      shapes (tails, bottom-right causal with seqlen_q != seqlen_k, rows with no visible key,
#      window + softcap, GQA 4:2 and MQA 8:1, seqlen_k = 1);
#   3. PyTorch SDPA (flash, cuDNN, memory-efficient; forward and backward) on every shape timed below;
#   4. the target shape (bf16, d 128, N 16384, H 16, causal and not): 04, 04b, 04bd, each validated
#      by libflashattn before it is timed (the backward against the float32 flash backward);
#   5. one ncu profile of 04's forward kernel at the target shape (and of 04b's dK/dV/dQ kernel at
#      N 4096): tensor-pipe utilization, shared-memory bank conflicts, warp stall reasons;
#   6. compute-sanitizer racecheck of 04, 04b, 04bd (and memcheck of 04b) on small shapes;
#   7. d = 64 (N 16384), GQA 32:8 (d 128, N 4096, B 2) and fp16 (target shape) timings of 04 and 04b.
# Output in OUTDIR: h200_tc2.csv, run.log, device.txt, clocks.csv, ncu_04.txt, ncu_04b.txt.
set -u
OUTDIR=${1:?usage: sh cuda/run_tc2.sh OUTDIR [BUDGET_SECONDS]}
BUDGET=${2:-540}
CSV=$OUTDIR/h200_tc2.csv
. cuda/run_lib.sh
"$BIN" --self-test >> "$LOG" 2>&1 && say "self-test: PASS" || { say "self-test FAILED"; fails=$((fails + 1)); }

say "== 2. edge shapes, all rows, vs the float64 backward ($(left) s left)"
for dt in bf16 fp16; do
    for k in 04b 04bd; do edges h $k $dt; done
done

say "== 3. SDPA ($(left) s left)"
SHAPES="128:16384:0:16:16:1,128:16384:1:16:16:1,64:16384:0:16:16:1,64:16384:1:16:16:1,128:4096:0:32:8:2,128:4096:1:32:8:2"
PYTHONUNBUFFERED=1 timeout 150 python3 cuda/sdpa_bench.py --csv "$CSV" --bwd --repeats 10 --max-seconds 0.3 \
    --deadline $(($(date +%s) + 120)) --shapes "$SHAPES" >> "$LOG" 2>&1 || say "sdpa_bench.py failed (see run.log)"

say "== 4. target shape ($(left) s left)"
T="--d 128 --seqlen 16384 --heads 16 --batch 1 --dtype bf16 --repeats 10 --max-seconds 0.5 --csv $CSV"
h "time 04   bf16 d=128 N=16384 causal=0" 25 --kernel 04 $T
h "time 04   bf16 d=128 N=16384 causal=1" 25 --kernel 04 $T --causal
h "time 04b  bf16 d=128 N=16384 causal=0" 50 --kernel 04b $T
h "time 04b  bf16 d=128 N=16384 causal=1" 50 --kernel 04b $T --causal
h "time 04bd bf16 d=128 N=16384 causal=0" 50 --kernel 04bd $T
h "time 04bd bf16 d=128 N=16384 causal=1" 50 --kernel 04bd $T --causal

say "== 5. ncu ($(left) s left)"
NCU="ncu --clock-control none --launch-count 1 --section SpeedOfLight --section ComputeWorkloadAnalysis \
--section MemoryWorkloadAnalysis_Tables --section WarpStateStats --section Occupancy --section LaunchStats"
NCU_M="l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,\
l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,\
sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_tensor_op_hmma.sum"
if [ "$(left)" -gt 90 ]; then
    timeout 80 $NCU -k regex:mma_forward "$BIN" --kernel 04 --d 128 --seqlen 16384 --heads 16 --no-time \
        > "$OUTDIR/ncu_04.txt" 2>&1 && say "ok    ncu 04 sections" || say "FAIL  ncu 04 sections (see ncu_04.txt)"
    timeout 60 ncu --clock-control none --launch-count 1 --metrics "$NCU_M" -k regex:mma_forward "$BIN" --kernel 04 \
        --d 128 --seqlen 16384 --heads 16 --no-time >> "$OUTDIR/ncu_04.txt" 2>&1 && say "ok    ncu 04 metrics" ||
        say "FAIL  ncu 04 metrics (see ncu_04.txt)"
else say "skipped (budget): ncu 04"; fi
if [ "$(left)" -gt 150 ]; then
    timeout 80 $NCU -k regex:bwd_dk_dv "$BIN" --kernel 04b --d 128 --seqlen 4096 --heads 16 --batch 4 --no-time \
        > "$OUTDIR/ncu_04b.txt" 2>&1 && say "ok    ncu 04b sections" || say "FAIL  ncu 04b sections (see ncu_04b.txt)"
    timeout 60 ncu --clock-control none --launch-count 1 --metrics "$NCU_M" -k regex:bwd_dk_dv "$BIN" --kernel 04b \
        --d 128 --seqlen 4096 --heads 16 --batch 4 --no-time >> "$OUTDIR/ncu_04b.txt" 2>&1 && say "ok    ncu 04b metrics" ||
        say "FAIL  ncu 04b metrics (see ncu_04b.txt)"
else say "skipped (budget): ncu 04b"; fi

say "== 6. compute-sanitizer ($(left) s left)"
san "racecheck 04   d=128 causal GQA tails" racecheck --kernel 04 --d 128 --heads 2 --heads-k 1 --seqlen-q 100 --seqlen-k 150 --causal
san "racecheck 04b  d=128 causal GQA tails" racecheck --kernel 04b --d 128 --heads 2 --heads-k 1 --seqlen-q 100 --seqlen-k 150 --causal
san "racecheck 04b  d=64 full tiles" racecheck --kernel 04b --d 64 --heads 2 --seqlen 256
san "memcheck  04b  d=128 causal GQA tails" memcheck --kernel 04b --d 128 --heads 2 --heads-k 1 --seqlen-q 100 --seqlen-k 150 --causal
san "memcheck  04b  d=64 window+softcap" memcheck --kernel 04b --d 64 --heads 2 --seqlen 192 --window 40,7 --softcap 20
san "racecheck 04   d=64 full tiles" racecheck --kernel 04 --d 64 --heads 2 --seqlen 192
san "racecheck 04bd d=128 causal GQA tails" racecheck --kernel 04bd --d 128 --heads 2 --heads-k 1 --seqlen-q 100 --seqlen-k 150 --causal

say "== 7. d = 64, GQA, fp16 ($(left) s left)"
for c in 0 1; do
    cc=""
    [ $c = 1 ] && cc="--causal"
    S64="--d 64 --seqlen 16384 --heads 16 --batch 1 --dtype bf16 --repeats 10 --max-seconds 0.5 --csv $CSV $cc"
    SG="--d 128 --seqlen 4096 --heads 32 --heads-k 8 --batch 2 --dtype bf16 --repeats 10 --max-seconds 0.5 --csv $CSV $cc"
    h "time 04   bf16 d=64 N=16384 causal=$c" 25 --kernel 04 $S64
    h "time 04b  bf16 d=64 N=16384 causal=$c" 45 --kernel 04b $S64
    h "time 04   bf16 d=128 N=4096 GQA 32:8 B=2 causal=$c" 25 --kernel 04 $SG
    h "time 04b  bf16 d=128 N=4096 GQA 32:8 B=2 causal=$c" 30 --kernel 04b $SG
done
TF="--d 128 --seqlen 16384 --heads 16 --batch 1 --dtype fp16 --repeats 10 --max-seconds 0.5 --csv $CSV"
h "time 04   fp16 d=128 N=16384 causal=0" 25 --kernel 04 $TF
h "time 04b  fp16 d=128 N=16384 causal=0" 45 --kernel 04b $TF

{
    date -u '+end: %Y-%m-%d %H:%M:%S UTC'
    nvidia-smi --query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv
} >> "$OUTDIR/device.txt" 2>&1
say "== done in $(($(date +%s) - START)) s; $fails failed; $(grep -c '^ok ' "$LOG") ok; $(grep -c '^skipped' "$LOG") skipped (budget)"
[ -f "$CSV" ] && python3 cuda/results_table.py "$CSV" | tee -a "$LOG"
# the ncu headline numbers, for the reply's tail
for f in "$OUTDIR"/ncu_04.txt "$OUTDIR"/ncu_04b.txt; do
    [ -f "$f" ] && { echo "== $f"; grep -E "Compute \(SM\) Throughput|Memory Throughput|Duration|Registers Per|Achieved Occupancy|Issue Slots Busy|Executed Ipc A|bank_conflicts|wavefronts_mem_shared|tensor_op_hmma|One or More Eligible|Warp Cycles Per Issued|Stall" "$f" | head -30; }
done
[ $fails -eq 0 ]
