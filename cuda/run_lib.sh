# shellcheck shell=sh disable=SC2034,SC2086,SC2046
# cuda/run_lib.sh — the frame shared by cuda/run_tc2.sh, run_tc3.sh and run_tc4.sh (sourced, not run).
# The caller sets OUTDIR, BUDGET (seconds) and CSV, then sources this file, which
#   - starts the budget clock and empties OUTDIR/run.log;
#   - writes OUTDIR/device.txt (date, revision, GPU, clocks, torch/CUDA/cuDNN versions) and samples
#     nvidia-smi into OUTDIR/clocks.csv every 500 ms until the script exits;
#   - defines left (seconds of budget left), say (print and log), h (one harness run), san (one
#     compute-sanitizer run), edges (a command over check_gpu.sh's six edge shapes) and EDGES.
# `fails` counts failed steps; a caller that sets GATE to a reason makes san skip its runs (a rung that
# already failed is not sanitized).
START=$(date +%s)
mkdir -p "$OUTDIR"
LOG=$OUTDIR/run.log
BIN=build/cuda/flashattn-cuda
: > "$LOG"
fails=0
GATE=

left() { echo $((BUDGET - ($(date +%s) - START))); }
say() { echo "$*" | tee -a "$LOG"; }

{
    date -u '+date: %Y-%m-%d %H:%M:%S UTC'
    if [ -f VERSION ]; then cat VERSION; else git log -1 --format='commit: %h %s' 2>/dev/null; fi
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,clocks.mem,power.draw,power.limit,temperature.gpu --format=csv
    python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version())'
    nproc | sed 's/^/cpu cores: /'
} > "$OUTDIR/device.txt" 2>&1
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu --format=csv -lms 500 \
    > "$OUTDIR/clocks.csv" 2>&1 &
SMI_PID=$!
trap 'kill $SMI_PID 2>/dev/null' EXIT

# one harness run: label, need (seconds it must have left; also its time limit), harness arguments
h() {
    label=$1
    need=$2
    shift 2
    if [ "$(left)" -lt "$need" ]; then say "skipped (budget): $label"; return; fi
    echo "-- $label: $*" >> "$LOG"
    timeout "$need" "$BIN" "$@" < /dev/null >> "$LOG" 2>&1
    rc=$?
    if [ $rc -eq 0 ]; then say "ok    $label"
    else say "FAIL  $label (exit $rc)"; fails=$((fails + 1)); fi
}

# one sanitizer run: label, tool, harness arguments (SAN_SECONDS each, default 45)
san() {
    label=$1
    tool=$2
    shift 2
    if [ -n "$GATE" ]; then say "skipped ($GATE): $label"; return; fi
    if [ "$(left)" -lt "${SAN_SECONDS:-45}" ]; then say "skipped (budget): $label"; return; fi
    echo "-- $label" >> "$LOG"
    timeout "${SAN_SECONDS:-45}" compute-sanitizer --error-exitcode 9 --tool "$tool" "$BIN" "$@" --no-time \
        < /dev/null >> "$LOG" 2>&1
    rc=$?
    if [ $rc -eq 0 ]; then say "ok    $label"; else say "FAIL  $label (exit $rc)"; fails=$((fails + 1)); fi
}

# check_gpu.sh's six edge shapes: tails, bottom-right causal with seqlen_q != seqlen_k both ways, rows
# with no visible key, window + softcap, GQA 4:2 and MQA 8:1, seqlen_k = 1
EDGES="--batch=2 --heads=4 --seqlen=256 --d=64
--heads=4 --heads-k=2 --seqlen-q=200 --seqlen-k=333 --d=128 --causal
--heads=2 --seqlen-q=300 --seqlen-k=100 --d=64 --causal
--heads=2 --seqlen=300 --d=128 --window=40,7 --softcap=20
--heads=8 --heads-k=1 --seqlen-q=128 --seqlen-k=190 --d=128
--batch=3 --heads=2 --seqlen-q=65 --seqlen-k=1 --d=64"

# edges RUN KERNEL DTYPE: `RUN "validate KERNEL DTYPE <shape>" 20 --kernel KERNEL --dtype DTYPE <shape> --no-time
# --seed 7` for each edge shape (RUN is h or a caller's gated wrapper of it)
edges() {
    run=$1
    kern=$2
    dt=$3
    while read -r line; do
        $run "validate $kern $dt $line" 20 --kernel $kern --dtype $dt $(echo "$line" | sed 's/=/ /g') --no-time --seed 7
    done <<EOT
$EDGES
EOT
}
