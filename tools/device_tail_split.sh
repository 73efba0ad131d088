#!/bin/sh
# tools/device_tail_split.sh OUTDIR — for the 16-core device host, in ONE call: does cutting a
# pass's last tasks (as many as threads) into smaller pieces (src/flash.c, tail_split;
# FA_TAIL_SPLIT, default 4) shorten the wait at the end of the pass? The tenth session's phase
# times put that wait at ~7% of a 16-thread N = 4096 call, where every task is a whole 256-row
# block. tools/device_task_chunk.sh with ab_chunk --tail: the settings alternate call by call in
# one process (threads pinned), the first again last as the control; no PyTorch.
#   usage (from the repository root): sh tools/device_tail_split.sh OUTDIR   (about 1 minute)
#   environment: THREADS (16), SETTINGS ("1 4 2 1": whole, 4 and 2 pieces, whole again),
#   ROWS (lines "N D ROUNDS|options")
export SETTINGS="${SETTINGS:-1 4 2 1}" FLAGS=--tail TORCH=0 LOG=tail_split.log
export ROWS="${ROWS:-4096 128 16|
4096 64 30|
4096 128 16|--causal
4096 64 30|--causal
2048 128 60|
2048 64 100|
1024 128 250|
1024 64 300|
1024 128 300|--causal
1024 64 400|--causal}"
exec sh "$(dirname "$0")/device_task_chunk.sh" "${1:-/tmp/tail_split}"
