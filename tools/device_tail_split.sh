#!/bin/sh
# tools/device_tail_split.sh OUTDIR — for the 16-core device host, in ONE call: does cutting a
# pass's last tasks (one a thread) into smaller pieces (src/flash.c, tail_split; FA_TAIL_SPLIT)
# shorten the wait at the end of the pass? The tenth session's phase times put that wait at
# ~7% of a 16-thread N = 4096 call, where every task is a whole 256-row block. Each row runs
# tools/ab_chunk.c --tail: the settings alternate call by call in one process (threads
# pinned), the only comparison that holds on this host; the first setting is the control.
#   usage (from the repository root): sh tools/device_tail_split.sh OUTDIR   (about 6 minutes)
#   environment: THREADS (16), SETTINGS ("1 4 2 1": whole, 4 and 2 pieces, whole again as the
#   control), ROWS (lines "N D ROUNDS|options")
set -u
out=${1:-/tmp/tail_split}
threads=${THREADS:-16}
settings=${SETTINGS:-"1 4 2 1"}
mkdir -p "$out"
make -j16 build/libflashattn.a >/dev/null 2>&1 || { echo "the library did not build"; exit 1; }
ab=$out/ab_chunk
cc -std=c11 -O2 -D_POSIX_C_SOURCE=200809L -Iinclude -Isrc -Itools tools/ab_chunk.c build/libflashattn.a \
    -fopenmp -lm -o "$ab" || exit 1
export OMP_PROC_BIND=close OMP_PLACES=cores
lscpu | sed -n '/Model name/p;/^L1d/p;/^L2/p;/^L3/p' | tee "$out/tail_split.log"
rows=${ROWS:-'4096 128 16|
4096 64 30|
4096 128 16|--causal
4096 64 30|--causal
2048 128 60|
2048 64 100|
1024 128 250|
1024 64 300|
1024 128 300|--causal
1024 64 400|--causal'}
echo "$rows" | while IFS='|' read -r nd extra; do
    set -- $nd
    "$ab" "$1" "$2" 8 "$threads" "$3" $extra --tail -- $settings
done 2>&1 | tee -a "$out/tail_split.log"
rm -f "$ab"
