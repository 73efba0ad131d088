#!/bin/sh
# tools/device_overlap_ab.sh — for the 16-core device host, in ONE call: the packing overlapped
# with the tasks (flash.c, pack_overlap) against the packing phase it replaces (this tree with
# tools/pack_overlap.patch reversed), side by side with tools/ab_trees.sh (rounds alternating,
# threads pinned), then tools/vs_torch.sh on this tree.
#   usage (from the repository root): sh tools/device_overlap_ab.sh OUTDIR   (about 6-8 minutes)
#   environment: ROUNDS (default 5), REPS (default 5), GRID (tools/ab_trees.sh's rows; default below)
set -u
out=${1:-/tmp/overlap_ab}
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/old"
tar -cf - Makefile src include tools mk | tar -x -C "$tmp/old"
(cd "$tmp/old" && git apply -R tools/pack_overlap.patch) || { echo "the patch does not reverse"; exit 1; }
default_grid='fwd d64 N1024|all|16|1024 64 8 --context
fwd d128 N1024|all|16|1024 128 8 --context
fwd d64 N4096|all|16|4096 64 8 --context
fwd d128 N4096|all|16|4096 128 8 --context
fwd d128 N1024 c|all|16|1024 128 8 --context --causal
fwd d128 N1024 w|all|16|1024 128 8 --context --window 256,0
fwd d64 N1024 t2|all|2|1024 64 8 --context
fwd d128 N1024 t2|all|2|1024 128 8 --context
fwd d128 N4096 t2|all|2|4096 128 8 --context'
GRID=${GRID:-$default_grid} ROUNDS=${ROUNDS:-5} REPS=${REPS:-5} JOBS=16 \
    timeout 420 sh tools/ab_trees.sh old="$tmp/old" new=. 2>&1 | tee "$out/ab.txt" | tail -40
make -j16 build/flashattn >/dev/null 2>&1 || { echo "build/flashattn did not build"; exit 1; }
timeout 150 sh tools/vs_torch.sh 16 2 "$out/vs" 2>&1 | tail -12
