#!/bin/sh
# tools/device_t16_ab.sh — for the 16-core device host, in ONE call: does cutting Q blocks
# into pieces (fa_piece_rows, FA_TASKS_PER_THREAD pieces a thread; src/internal.h) cost the
# 16-thread N = 1024 rows their margin over PyTorch's CPU SDPA (issue 14 item 8: 1.13-1.27x
# where 1.3x is asked)? Builds this tree and two copies of it with FA_TASKS_PER_THREAD 4 and 2
# (at H = 8, N = 1024 the 32 Q blocks are then cut into 64 pieces, or not at all), times them
# side by side with tools/ab_trees.sh (rounds alternating, threads pinned), then runs bench
# and PyTorch on the same grid with threads unpinned and pinned (bench does not pin; PyTorch's
# own OpenMP does what the environment says), so both questions come from one machine state.
#   usage (from the repository root): sh tools/device_t16_ab.sh      (about 6-8 minutes)
#   environment: ROUNDS (default 5), REPS (default 5)
set -u
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for v in tpt4 tpt2; do
    mkdir -p "$tmp/$v"
    tar -cf - Makefile src include tools mk | tar -x -C "$tmp/$v"
done
sed -i 's/#define FA_TASKS_PER_THREAD 8/#define FA_TASKS_PER_THREAD 4/' "$tmp/tpt4/src/internal.h"
sed -i 's/#define FA_TASKS_PER_THREAD 8/#define FA_TASKS_PER_THREAD 2/' "$tmp/tpt2/src/internal.h"
grep -H "define FA_TASKS_PER_THREAD" src/internal.h "$tmp"/*/src/internal.h
GRID='fwd d64 N1024|all|16|1024 64 8
fwd d128 N1024|all|16|1024 128 8
fwd d64 N1024 c|all|16|1024 64 8 --causal
fwd d128 N1024 c|all|16|1024 128 8 --causal
fwd d128 N4096|all|16|4096 128 8
fwd d128 N4096 c|all|16|4096 128 8 --causal
fwd d128 N8192 H4|all|16|8192 128 4' ROUNDS=${ROUNDS:-5} REPS=${REPS:-5} JOBS=16 \
    timeout 330 sh tools/ab_trees.sh main=. tpt4="$tmp/tpt4" tpt2="$tmp/tpt2"
make -j16 build/flashattn >/dev/null 2>&1 || { echo "build/flashattn did not build"; exit 1; }
for bind in none close; do
    if [ $bind = none ]; then unset OMP_PROC_BIND OMP_PLACES; else export OMP_PROC_BIND=close OMP_PLACES=cores; fi
    echo "== bench, 16 threads, OMP_PROC_BIND=$bind"
    timeout 90 build/flashattn bench --impl flash --n 1024,4096 --d 64,128 --heads 8 --threads 16 --repeats 7 2>&1 | tail -6
    echo "== PyTorch SDPA, 16 threads, OMP_PROC_BIND=$bind"
    timeout 90 python3 tools/torch_cpu_sdpa.py --n 1024,4096 --d 64,128 --threads 16 --causal 0 --repeats 7 2>&1 | tail -5
done
