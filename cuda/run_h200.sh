#!/bin/sh
# cuda/run_h200.sh — the ladder's measurement run on a GPU machine (written for the H200).
#
#   sh cuda/run_h200.sh OUTDIR [BUDGET_SECONDS]
#
# Builds libflashattn and the ladder, runs the harness self-test, then every rung on a fixed
# grid — d 64 and 128; N 1024, 4096, 16384 with batch = 16384 / N (16k tokens per run); 16 heads;
# causal and not; GQA 32:8 at d 128, N 4096 — and PyTorch's SDPA backends (flash, cuDNN,
# memory-efficient, forward and backward) on the same shapes, in the same run, into one CSV:
# OUTDIR/h200.csv. Every ladder row is validated by libflashattn before it is timed (the
# `check` column says how) — except backward rows too large for the CPU reference, which are
# timed only (harness exit 3, `check` = skipped, logged as NOT validated); a validation
# failure is logged and the run goes on.
#
# The card is power-capped under sustained load, so only numbers from one run compare; the
# FP32 FMA ceiling is re-measured by every harness call (probe_tflops) and nvidia-smi logs the
# SM clock and power every 500 ms into OUTDIR/clocks.csv. The whole run keeps to
# BUDGET_SECONDS (default 540): rows are written as they are measured, most important shapes
# first (d 128, N 16384), and whatever no longer fits is listed as skipped in run.log.
#
# Output (4 files): h200.csv, run.log (everything printed), device.txt (nvidia-smi, versions),
# clocks.csv.
set -u
OUTDIR=${1:?usage: sh cuda/run_h200.sh OUTDIR [BUDGET_SECONDS]}
BUDGET=${2:-540}
START=$(date +%s)
mkdir -p "$OUTDIR"
CSV=$OUTDIR/h200.csv
LOG=$OUTDIR/run.log
BIN=build/cuda/flashattn-cuda
: > "$LOG"

left() { echo $((BUDGET - ($(date +%s) - START))); }
say() { echo "$*" | tee -a "$LOG"; }

{
    date -u '+date: %Y-%m-%d %H:%M:%S UTC'
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,clocks.mem,power.draw,power.limit,temperature.gpu --format=csv
    nvcc --version | tail -2
    python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version())'
    nproc | sed 's/^/cpu cores: /'
} > "$OUTDIR/device.txt" 2>&1

nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu --format=csv -lms 500 \
    > "$OUTDIR/clocks.csv" 2>&1 &
SMI_PID=$!
trap 'kill $SMI_PID 2>/dev/null' EXIT

say "== build ($(left) s left)"
make -j"$(nproc)" build/libflashattn.a >> "$LOG" 2>&1 && make -j"$(nproc)" cuda >> "$LOG" 2>&1 || { say "build failed"; exit 2; }
"$BIN" --self-test >> "$LOG" 2>&1 || { say "self-test failed"; exit 1; }
say "self-test: PASS"

# d:N:causal:heads:heads_k:batch, most important first
SHAPES="128:16384:0:16:16:1 128:16384:1:16:16:1 128:4096:0:16:16:4 128:4096:1:16:16:4 \
128:1024:0:16:16:16 128:1024:1:16:16:16 128:4096:0:32:8:2 128:4096:1:32:8:2 \
64:16384:0:16:16:1 64:16384:1:16:16:1 64:4096:0:16:16:4 64:4096:1:16:16:4 64:1024:0:16:16:16 64:1024:1:16:16:16"

say "== PyTorch SDPA ($(left) s left)"
PYTHONUNBUFFERED=1 python3 cuda/sdpa_bench.py --csv "$CSV" --bwd --repeats 20 --max-seconds 0.4 \
    --deadline $((START + BUDGET * 35 / 100)) --shapes "$(echo $SHAPES | tr ' ' ',')" >> "$LOG" 2>&1 ||
    say "sdpa_bench.py failed (see run.log)"

say "== ladder ($(left) s left)"
for s in $SHAPES; do
    IFS=: read d n c h hk b <<EOF
$s
EOF
    causal=""
    [ "$c" = 1 ] && causal="--causal"
    for k in 04 03 02 01 04b 03b; do
        if [ "$(left)" -lt 25 ]; then
            say "skipped (budget): kernel $k d=$d N=$n causal=$c H=$h:$hk B=$b"
            continue
        fi
        echo "-- kernel $k d=$d N=$n causal=$c H=$h:$hk B=$b" >> "$LOG"
        "$BIN" --kernel $k --d "$d" --seqlen "$n" --heads "$h" --heads-k "$hk" --batch "$b" $causal \
            --dtype bf16 --repeats 20 --max-seconds 1 --csv "$CSV" >> "$LOG" 2>&1
        rc=$?
        if [ $rc -eq 3 ]; then say "timed, NOT validated (beyond the CPU reference's budget): kernel $k d=$d N=$n causal=$c H=$h:$hk B=$b"
        elif [ $rc -ne 0 ]; then say "FAILED (exit $rc): kernel $k d=$d N=$n causal=$c H=$h:$hk B=$b"; fi
    done
done

{
    date -u '+end: %Y-%m-%d %H:%M:%S UTC'
    nvidia-smi --query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv
} >> "$OUTDIR/device.txt" 2>&1
say "== done in $(( $(date +%s) - START )) s; rows: $(($(wc -l < "$CSV") - 1))"
grep -E '^(0[0-9]|sdpa)' "$CSV" | awk -F, '{ printf "%-20s d=%-3s N=%-5s c=%s H=%s:%s %8s ms %8s TFLOP/s frac %s %s\n", $1, $8, $6, $9, $4, $5, $14, $17, $19, $20 }' | tee -a "$LOG"
