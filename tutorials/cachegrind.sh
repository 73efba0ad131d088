#!/bin/sh
# cachegrind.sh BIN [STEP ARGS...] — the third source of cache-miss counts.
#
# Runs one tutorial step twice on the same problem (the first --n value):
#   1. under valgrind's cachegrind, with the step's own cache geometry
#      (--D1/--LL from `BIN --valgrind-geometry`), running only the plain
#      kernel once (--kernel-only), and keeps the D1 misses of the kernel
#      function alone: start-up, data initialization and the cache flush are
#      other functions, so they are not counted;
#   2. on the tutorials' simulator (--sim-kernel), cold caches.
# Prints both counts and their ratio. With FA_CG_MACHINE=1 it prints one line
# "vg_d1 sim_d1 ratio" for tests/test_tutorials.sh.
set -eu
bin=$1; shift
command -v valgrind >/dev/null 2>&1 || { echo "valgrind is not installed (apt-get install valgrind)" >&2; exit 3; }
info=$("$bin" --valgrind-geometry "$@")
d1=$(echo "$info" | cut -d' ' -f1)
ll=$(echo "$info" | cut -d' ' -f2)
kernel=$(echo "$info" | cut -d' ' -f3)
if [ "$kernel" = "-" ]; then
    echo "$(basename "$bin") has no single kernel of its own to measure (it calls the library)" >&2
    exit 2
fi
# Pin the geometry for both runs: under valgrind the CPU reports other caches,
# and the step would derive its default block sizes from those.
geo=$(echo "$d1:$ll" | sed 's/--D1=//; s/--LL=//')
set -- "$@" --geometry "$geo"
out=$(mktemp "${TMPDIR:-/tmp}/cg.XXXXXX")
trap 'rm -f "$out"' EXIT
# I1 is fixed (instruction misses are not the lesson); --cache-sim=yes is the default
# before valgrind 3.21 and must be asked for after.
valgrind --tool=cachegrind --cache-sim=yes "$d1" "$ll" --I1=32768,8,64 \
    --cachegrind-out-file="$out" "$bin" --kernel-only "$@" >/dev/null 2>&1
# cachegrind.out: "fn=NAME" starts a function; each following line is
# "LINE Ir I1mr ILmr Dr D1mr DLmr Dw D1mw DLmw". Sum the kernel's lines.
vg=$(awk -v k="$kernel" '
    /^fn=/ { cur = substr($0, 4); next }
    /^[0-9]/ && cur == k { dr += $5; d1r += $6; dlr += $7; dw += $8; d1w += $9; dlw += $10 }
    END { printf "%d %d %d %d %d %d\n", dr, d1r, dw, d1w, dlr + dlw, d1r + d1w }' "$out")
sim=$("$bin" --sim-kernel "$@")
vg_d1=$(echo "$vg" | cut -d' ' -f6)
sim_d1=$(echo "$sim" | sed 's/.* misses \([0-9]*\) .*/\1/')
ratio=$(awk -v a="$sim_d1" -v b="$vg_d1" 'BEGIN { if (b > 0) printf "%.4f", a / b; else print "nan" }')
if [ "${FA_CG_MACHINE:-0}" = 1 ]; then
    echo "$vg_d1 $sim_d1 $ratio"
    exit 0
fi
set -- $vg
echo "kernel $kernel, cache geometry $d1 $ll"
echo "  [vg]  valgrind cachegrind: D1 reads $1, read misses $2; writes $3, write misses $4;"
echo "        D1 misses $6, LL misses $5"
echo "  [sim] $sim"
echo "  simulator / valgrind D1 misses = $ratio"
