#!/bin/sh
# cuda/check_gpu.sh — correctness of every rung on a GPU machine, on small shapes (about a minute).
#
#   sh cuda/check_gpu.sh [LOGFILE]            (RUNGS="04 04b" sh cuda/check_gpu.sh: only those rungs;
#                                              RUNGS=05ws adds the TMA rung — its racecheck was never run)
#
# 1. builds libflashattn and the ladder, runs the self-test;
# 2. validates every rung (01 02 03 03b 04 04b 04bd 05, or $RUNGS) in bf16 and fp16 on shapes chosen to hit the edges —
#    tails (lengths not multiples of 64), bottom-right causal with seqlen_q != seqlen_k, rows with
#    no visible key, sliding windows with softcap, GQA and MQA, d = 64 and 128 — with
#    libflashattn's fa_check / check-grad rule over all rows (--no-time);
# 3. runs compute-sanitizer memcheck (d = 64 and 128) and racecheck (d = 128) on every rung.
# Prints one line per run and a final count; exit status 1 if anything failed.
set -u
LOG=${1:-build/cuda/check_gpu.log}
RUNGS=${RUNGS:-01 02 03 03b 04 04b 04bd 05}
BIN=build/cuda/flashattn-cuda
mkdir -p "$(dirname "$LOG")"
: > "$LOG"
fails=0
runs=0

make -j"$(nproc)" build/libflashattn.a >> "$LOG" 2>&1 && make -j"$(nproc)" cuda >> "$LOG" 2>&1 ||
    { echo "check_gpu: build failed (see $LOG)"; exit 2; }
"$BIN" --self-test >> "$LOG" 2>&1 || { echo "check_gpu: self-test failed"; exit 1; }
echo "check_gpu: self-test PASS"

one() { # label, then the command
    label=$1
    shift
    echo "-- $label: $*" >> "$LOG"
    "$@" >> "$LOG" 2>&1
    rc=$?
    runs=$((runs + 1))
    if [ $rc -eq 0 ]; then echo "ok    $label"; else echo "FAIL  $label (exit $rc)"; fails=$((fails + 1)); fi
}

SHAPES="--batch=2 --heads=4 --seqlen=256 --d=64
--heads=4 --heads-k=2 --seqlen-q=200 --seqlen-k=333 --d=128 --causal
--heads=2 --seqlen-q=300 --seqlen-k=100 --d=64 --causal
--heads=2 --seqlen=300 --d=128 --window=40,7 --softcap=20
--heads=8 --heads-k=1 --seqlen-q=128 --seqlen-k=190 --d=128
--batch=3 --heads=2 --seqlen-q=65 --seqlen-k=1 --d=64"

for dt in bf16 fp16; do
    for k in $RUNGS; do
        echo "$SHAPES" | while read -r line; do
            # --opt=value -> --opt value
            args=$(echo "$line" | sed 's/=/ /g')
            # shellcheck disable=SC2086
            "$BIN" --kernel $k --dtype $dt $args --no-time --seed 7 >> "$LOG" 2>&1
            rc=$?
            if [ $rc -eq 0 ]; then echo "ok    validate $k $dt $line"; else echo "FAIL  validate $k $dt $line (exit $rc)"; fi
        done
    done
done | tee -a "$LOG.summary"
fails=$((fails + $(grep -c '^FAIL' "$LOG.summary")))
runs=$((runs + $(grep -c '' "$LOG.summary")))
rm -f "$LOG.summary"

SAN="compute-sanitizer --error-exitcode 9"
for k in $RUNGS; do
    for d in 64 128; do
        one "memcheck  $k d=$d" $SAN --tool memcheck "$BIN" --kernel $k --d $d --heads 2 --heads-k 1 \
            --seqlen-q 100 --seqlen-k 150 --causal --no-time
    done
    one "racecheck $k d=128" $SAN --tool racecheck "$BIN" --kernel $k --d 128 --heads 2 --heads-k 1 \
        --seqlen-q 100 --seqlen-k 150 --causal --no-time
    # full (unmasked) tiles, a window and softcap: the paths the causal shape above does not take
    one "memcheck  $k d=64 window+softcap" $SAN --tool memcheck "$BIN" --kernel $k --d 64 --heads 2 \
        --seqlen 192 --window 40,7 --softcap 20 --no-time
    one "racecheck $k d=64 full tiles" $SAN --tool racecheck "$BIN" --kernel $k --d 64 --heads 2 \
        --seqlen 192 --no-time
done

echo "check_gpu: $((runs - fails)) of $runs runs passed"
[ $fails -eq 0 ]
