#!/bin/sh
# tools/ab_revisions.sh BASE [NEW] -- ab_time ARGS...
#   Before/after of one change, side by side: builds git revision BASE (and NEW,
#   default: the working tree's build/) into a temporary directory, builds
#   tools/ab_time.c (public API only) against each library, then alternates
#   the two ROUNDS times (default 5) with the same ab_time arguments and prints
#   each median GFLOP/s and NEW / BASE. On a shared machine the ratio is
#   indicative only; alternation spreads a neighbour's load over both sides.
#
#   example (softcap before/after, 1 thread):
#     sh tools/ab_revisions.sh 7618db0 -- 2048 64 8 1 3 --softcap 30
#   ab_time ARGS: N D H THREADS REPS [--pass fwd|bwd] [--dtype f32|f16|bf16]
#                 [--causal] [--window L,R] [--softcap C] [--hash]
#   With --hash it also says whether both revisions' outputs are the same bits.
set -eu
base=$1; shift
new=""
if [ "${1:-}" != "--" ]; then new=$1; shift; fi
[ "${1:-}" = "--" ] && shift
root=$(git rev-parse --show-toplevel)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
rounds=${ROUNDS:-5}

# build_rev REV DIR: the library of REV, and ab_time against it
build_rev() {
    mkdir -p "$2/src"
    git -C "$root" archive "$1" | tar -x -C "$2/src"
    make -C "$2/src" -j2 build/libflashattn.a >"$2/build.log" 2>&1 || { echo "build of $1 failed: $2/build.log"; exit 1; }
}
build_rev "$base" "$tmp/base"
if [ -n "$new" ]; then build_rev "$new" "$tmp/new"; newlib=$tmp/new/src/build/libflashattn.a
else make -C "$root" -j2 build/libflashattn.a >/dev/null; newlib=$root/build/libflashattn.a; fi
for side in base new; do
    lib=$tmp/base/src/build/libflashattn.a; [ "$side" = new ] && lib=$newlib
    ${CC:-gcc} -std=c11 -O2 -D_POSIX_C_SOURCE=200809L -I"$root/include" "$root/tools/ab_time.c" "$lib" \
        -fopenmp -lm -o "$tmp/ab_$side"
done
r=0
while [ "$r" -lt "$rounds" ]; do
    "$tmp/ab_base" "$@" >"$tmp/line"; awk '{print $2}' "$tmp/line" >>"$tmp/base.txt"; hb=$(awk '{print $6}' "$tmp/line")
    "$tmp/ab_new" "$@" >"$tmp/line"; awk '{print $2}' "$tmp/line" >>"$tmp/new.txt"; hn=$(awk '{print $6}' "$tmp/line")
    r=$((r + 1))
done
# with --hash among the arguments: do both revisions compute the same bits?
case " $* " in *" --hash "*)
    if [ "$hb" = "$hn" ]; then echo "outputs: identical bits (hash $hb)"; else echo "outputs: DIFFER (base $hb, new $hn)"; fi ;;
esac
med() { sort -g "$1" | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
b=$(med "$tmp/base.txt"); n=$(med "$tmp/new.txt")
echo "ab_time $*: base ($base) $b GFLOP/s, new (${new:-working tree}) $n GFLOP/s, new / base $(awk -v a="$n" -v b="$b" 'BEGIN {printf "%.2f", a / b}') (median of $rounds alternating rounds)"
