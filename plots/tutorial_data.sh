#!/bin/sh
# tutorial_data.sh BUILD DIR — run the tutorial steps with the sweeps the plots
# need, writing their .dat files to DIR, plus DIR/gflops.dat (one row per step:
# "label gflops", all at N = 512, one thread unless the step says otherwise) and
# DIR/peak.txt (one core's FMA peak in GFLOP/s, 0 if it could not be measured).
set -eu
build=$1; dir=$2
bin=$build/tutorials
mkdir -p "$dir" "$dir/g"
# step NN -> the step's executable (build/tutorials also holds NN_*.dat files)
step() { for f in "$bin"/$1_*; do [ -x "$f" ] && [ "${f%.dat}" = "$f" ] && echo "$f"; done; }
for s in 02 03 04 05 06 07 08; do
    "$(step $s)" --n 128,256,384,512,768 --reps 1 --out "$dir" >/dev/null
done
"$(step 12)" --out "$dir" >/dev/null
# GFLOP/s at one size, no simulator (fast), medians of 3
for s in 02 03 04 05 06 07 08; do
    "$(step $s)" --n 512 --no-sim --reps 3 --out "$dir/g" >/dev/null
done
"$(step 09)" --n 512 --reps 3 --out "$dir/g" >/dev/null
"$(step 11)" --n 512 --reps 3 --out "$dir/g" >/dev/null
{
    echo "# label gflops"
    for s in 02 03 04 05 06 07; do
        awk -v s="$s" '!/^#/ { g = $6 } END { print s, g }' "$dir/g/$s.dat"
    done
    awk '!/^#/ && $1 == 1 { g = $8 } END { print "08-causal", g }' "$dir/g/08.dat"
    awk '!/^#/ && $1 == "tutorial_flash2_simd" { print "09-simd", $7 }' "$dir/g/09.dat"
    awk '!/^#/ && $1 == "tutorial_flash2" { g = $5 } END { print "11-threads", g }' "$dir/g/11.dat"
    awk '!/^#/ && $1 == "library_flash" { print "lib-flash-1T", $7 }' "$dir/g/09.dat"
    awk '!/^#/ && $1 == "library_flash" { g = $5 } END { print "lib-flash-" "all", g }' "$dir/g/11.dat"
} > "$dir/gflops.dat"
# One core's FMA peak, from the CLI's own benchmark (GFLOP/s over its peak fraction); 0 if unavailable.
peak=0
if [ -x "$build/flashattn" ] && "$build/flashattn" bench --impl flash --n 256 --d 64 --heads 1 --threads 1 \
        --csv "$dir/peak.csv" >/dev/null 2>&1; then
    # columns by name (plots/csvcols.awk), not by position
    peak=$(awk -F, -v cols=gflops,peak_fraction -v where=impl=flash -f "$(dirname "$0")/csvcols.awk" "$dir/peak.csv" |
           awk 'NR == 1 && $2 > 0 { printf "%.1f", $1 / $2 }')
fi
echo "${peak:-0}" > "$dir/peak.txt"
