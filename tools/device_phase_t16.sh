#!/bin/sh
# tools/device_phase_t16.sh — for the 16-core device host, in ONE call: where a 16-thread flash
# forward's time goes (tools/phase_times.c: per thread, the shared packing, the tasks, the wait
# at the pass barrier, the Q gather), at N = 1024 and 4096, d = 128, plain and causal, beside
# 2 threads. Builds a copy of this tree with tools/phase_times.patch applied (never this tree).
#   usage (from the repository root): sh tools/device_phase_t16.sh      (about 2 minutes)
set -u
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
tar -cf - Makefile src include tools mk | tar -x -C "$tmp"
(cd "$tmp" && patch -p1 -s < tools/phase_times.patch && make -j16 build/libflashattn.a >/dev/null 2>&1) ||
    { echo "device_phase_t16: the patched library did not build"; exit 1; }
cc -std=c11 -O2 -D_POSIX_C_SOURCE=200809L -I"$tmp/include" tools/phase_times.c "$tmp/build/libflashattn.a" \
    -fopenmp -lm -o "$tmp/phase_times" || exit 1
export OMP_PROC_BIND=close OMP_PLACES=cores
for t in 16 2; do
    for nc in "1024 128 0" "1024 128 1" "4096 128 0"; do
        timeout 60 "$tmp/phase_times" $nc $t
    done
done
