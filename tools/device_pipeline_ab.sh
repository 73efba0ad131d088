#!/bin/sh
# tools/device_pipeline_ab.sh — for the 16-core device host, in ONE call: the overlapped packing's
# passes without barriers (flash.c, pack_sync: one task counter for the call, two sets of slots)
# against the barrier after every pass it replaces (this tree with tools/pass_pipeline.patch
# reversed), side by side with tools/ab_trees.sh (rounds alternating, threads pinned), then
# tools/vs_torch.sh on this tree.
#   usage (from the repository root): sh tools/device_pipeline_ab.sh OUTDIR   (about 7-9 minutes)
#   environment: ROUNDS (default 5), REPS (default 5), GRID (tools/ab_trees.sh's rows; default below)
set -u
out=${1:-/tmp/pipeline_ab}
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/old"
tar -cf - Makefile src include tools mk | tar -x -C "$tmp/old"
(cd "$tmp/old" && git apply -R tools/pass_pipeline.patch) || { echo "the patch does not reverse"; exit 1; }
# rows with one pass (N 1024, H 8 at 16 threads: every pair fits the L2s) are controls
default_grid='fwd d64 N1024|all|16|1024 64 8 --context
fwd d128 N1024|all|16|1024 128 8 --context
fwd d128 N1024 H32|all|16|1024 128 32 --context
fwd d64 N2048 H32|all|16|2048 64 32 --context
fwd d64 N4096|all|16|4096 64 8 --context
fwd d128 N4096|all|16|4096 128 8 --context
fwd d128 N4096 t8|all|8|4096 128 8 --context
fwd d128 N1024 c|all|16|1024 128 8 --context --causal
fwd d64 N1024 t2|all|2|1024 64 8 --context
fwd d128 N1024 t2|all|2|1024 128 8 --context
fwd d128 N4096 t2|all|2|4096 128 8 --context'
GRID=${GRID:-$default_grid} ROUNDS=${ROUNDS:-5} REPS=${REPS:-5} JOBS=16 \
    timeout 460 sh tools/ab_trees.sh old="$tmp/old" new=. 2>&1 | tee "$out/ab.txt" | tail -40
make -j16 build/flashattn >/dev/null 2>&1 || { echo "build/flashattn did not build"; exit 1; }
timeout 120 sh tools/vs_torch.sh 16 2 "$out/vs" 2>&1 | tail -12
