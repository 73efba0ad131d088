#!/bin/sh
# tools/device_pack_t16.sh — for the 16-core device host, in ONE call: does the shared packing
# of a 16-thread N = 1024 forward speed up with threads (issue 14 item 8), and is the per-tile
# path (FA_FLASH_SHARED_MAX=0: each task packs the tiles it visits, no packing phase, no
# barrier) faster there? Prints the topology, tools/phase_times.c's per-thread phases at
# 2, 4, 8 and 16 threads (a patched copy of this tree), then ab_time rounds alternating the
# shared and the per-tile path at 16 threads pinned.
#   usage (from the repository root): sh tools/device_pack_t16.sh    (about 3-4 minutes)
#   environment: ROUNDS (default 5)
set -u
rounds=${ROUNDS:-5}
lscpu | grep -E 'Model name|Thread|Core|Socket|NUMA|L2|L3'
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
tar -cf - Makefile src include tools mk | tar -x -C "$tmp"
(cd "$tmp" && git init -q . 2>/dev/null; git apply tools/phase_times.patch && make -j16 build/libflashattn.a >/dev/null 2>&1 &&
    cc -std=c11 -O2 -D_POSIX_C_SOURCE=200809L -Iinclude tools/phase_times.c build/libflashattn.a -fopenmp -lm -o phase_times) ||
    { echo "phase_times did not build"; exit 1; }
make -j16 build/libflashattn.a >/dev/null 2>&1 || { echo "libflashattn did not build"; exit 1; }
cc -std=c11 -O2 -D_POSIX_C_SOURCE=200809L -Iinclude -Itools tools/ab_time.c build/libflashattn.a -fopenmp -lm -o "$tmp/ab_time" ||
    { echo "ab_time did not build"; exit 1; }
export OMP_PROC_BIND=close OMP_PLACES=cores
for d in 128 64; do
    for t in 2 4 8 16; do timeout 60 "$tmp/phase_times" 1024 $d 0 $t; done
done
echo "== ab_time, 16 threads pinned: shared packing (shared) vs per-tile (tile), GFLOP/s per round"
r=1
while [ "$r" -le "$rounds" ]; do
    for row in "1024 64" "1024 128" "1024 64 --causal" "1024 128 --causal" "4096 128"; do
        set -- $row
        n=$1 d=$2; shift 2
        reps=40; [ "$n" = 4096 ] && reps=5
        a=$(timeout 60 "$tmp/ab_time" $n $d 8 16 $reps --context "$@" | awk '{print $2}')
        b=$(FA_FLASH_SHARED_MAX=0 timeout 60 "$tmp/ab_time" $n $d 8 16 $reps --context "$@" | awk '{print $2}')
        echo "round $r | N $n d $d $* | shared $a | tile $b"
    done
    r=$((r + 1))
done
