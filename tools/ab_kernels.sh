#!/bin/sh
# tools/ab_kernels.sh BASE [ISA...] — the micro-kernels of git revision BASE
# against the working tree's, side by side: builds BASE's library in a
# temporary directory, links tools/bench_kernels.c against both, and runs the
# two alternately ROUNDS times (default 2), printing their qk/pv/chain lines.
# Indicative on a shared machine (bench_kernels times thread CPU time, which
# helps, but neighbours still pollute the caches).
#
#   example (issue 14's AVX2 pv loop order; meant for a 32 KiB L1 / 512 KiB L2 Zen 3):
#     sh tools/ab_kernels.sh 2b17a18 avx2
set -eu
base=$1; shift
root=$(git rev-parse --show-toplevel)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/src"
git -C "$root" archive "$base" | tar -x -C "$tmp/src"
make -C "$tmp/src" -j2 build/tools/bench_kernels >"$tmp/build.log" 2>&1 || { echo "build of $base failed"; cat "$tmp/build.log"; exit 1; }
make -C "$root" -j2 build/tools/bench_kernels >/dev/null
r=0
while [ "$r" -lt "${ROUNDS:-2}" ]; do
    echo "== base $base"; "$tmp/src/build/tools/bench_kernels" "$@" | grep -E ' (qk|pv|chain) '
    echo "== working tree"; "$root/build/tools/bench_kernels" "$@" | grep -E ' (qk|pv|chain) '
    r=$((r + 1))
done
