#!/bin/sh
# tools/device_strips_ab.sh — for the 16-core device host (an Intel Xeon, AVX-512), in ONE
# call: the whole tiles' strips (src/flash.c, strip_rows) against the same tree with strips
# off (every tile in one piece), side by side with tools/ab_trees.sh at 2 and 16 threads
# (rounds alternating, threads pinned), then tools/vs_torch.sh 16 3 on this tree (flash
# beside PyTorch's CPU SDPA, issue 14 item 8).
#   usage (from the repository root): sh tools/device_strips_ab.sh OUTDIR   (about 9 minutes)
#   environment: ROUNDS (default 5), REPS (default 3)
set -u
out=${1:-/tmp/strips_ab}
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/nostrip"
tar -cf - Makefile src include tools mk | tar -x -C "$tmp/nostrip"
sed -i 's/^    if (p->strip_rows == 0) return g->br;$/    return g->br; \/* strips off *\//' "$tmp/nostrip/src/flash.c"
grep -c "strips off" "$tmp/nostrip/src/flash.c" | grep -qx 1 || { echo "device_strips_ab: the strips-off edit did not apply"; exit 1; }
lscpu | sed -n '/Model name/p;/^L1d/p;/^L2/p'
GRID='fwd d64 N4096|all|2|4096 64 8 --context
fwd d128 N4096|all|2|4096 128 8 --context
fwd d64 N1024 c|all|2|1024 64 8 --causal --context
fwd d64 N4096 sc|all|2|4096 64 8 --softcap 30 --context
fwd d64 N1024|all|16|1024 64 8 --context
fwd d128 N1024|all|16|1024 128 8 --context
fwd d64 N4096|all|16|4096 64 8 --context
fwd d128 N4096|all|16|4096 128 8 --context
fwd d128 N1024 c|all|16|1024 128 8 --causal --context' ROUNDS=${ROUNDS:-5} REPS=${REPS:-3} JOBS=16 \
    timeout 300 sh tools/ab_trees.sh strips=. nostrip="$tmp/nostrip" 2>&1 | tee "$out/strips_ab.log"
make -j16 build/flashattn >/dev/null 2>&1 || { echo "build/flashattn did not build"; exit 1; }
timeout 220 sh tools/vs_torch.sh 16 3 "$out/vs_torch" 2>&1 | tee "$out/vs_torch.log" | tail -14
