#!/bin/sh
# test_tutorials.sh BUILD — the tutorials' lessons hold, end to end.
#
#   1. every step runs with small sizes and exits 0; each step compares its
#      output (and LSE) with the library's float64 reference and exits 1 beyond
#      its stated tolerance (1e-4 for attention, 1e-5 of max p for softmax);
#   2. the naive step's L1 misses grow as N^2 (x4 per doubling of N, within 15%);
#   3. the flash steps' misses grow as N^2 (same test) and, in step 12, the
#      slow-tier traffic tracks N^2 d^2 / M: measured/bound stays within a
#      factor 1.5 over N and M (inside the theorem's range M <= 4 N d bytes),
#      and doubling M cuts the traffic by 1.5x..2.5x;
#   4. the simulator's L1 misses agree with valgrind's D1 misses (reads +
#      writes, kernel function only) within 5% on the naive step (02) and the
#      flash steps (06, 07), for N = 128, 256, 384, and on the flash backward (13)
#      for N = 128, 256 (skipped, loudly, without valgrind).
# All counts use the fixed "teaching" geometry, so they are the same on every machine.
set -u
build=${1:-build}
bin=$build/tutorials
out=$(mktemp -d "${TMPDIR:-/tmp}/tut.XXXXXX")
trap 'rm -rf "$out"' EXIT
fail=0
ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; fail=1; }
G="--geometry teaching"

[ -x "$bin/02_naive_attention" ] || { echo "tutorial binaries missing in $bin (make tutorial-bins)"; exit 1; }

# ---- 1. every step runs and matches the reference ----------------------------
# The steps are the sources in tutorials/ (a stale binary left in $bin by an
# older numbering is not a step).
for src in "$(dirname "$0")"/../tutorials/[0-9][0-9]_*.c; do
    name=$(basename "$src" .c)
    t="$bin/$name"
    [ -x "$t" ] || { echo "FAIL $name: not built"; fail=$((fail + 1)); continue; }
    case $name in
        01_*) args="--n 4096,65536" ;;
        09_*|11_*) args="--n 128 --reps 1" ;;
        10_*) args="--br 20 --bc 37 --d 24 --reps 1" ;;
        12_*) args="--n 64,128 --M 8K,16K --d 16" ;;
        13_*) args="--n 64,100 --reps 1" ;;
        14_*) args="--n 128" ;;
        15_*) args="--n 4096 --reps 1" ;;
        *) args="--n 64,128 --reps 1" ;;
    esac
    if "$t" $args $G --out "$out" >"$out/$name.log" 2>&1; then ok "$name runs and matches the reference"
    else bad "$name: exit $? ($(tail -1 "$out/$name.log"))"; fi
done
# malformed flags: exit 2 with a message, never a silent rounding or wrap (N 0.5 ran N = 0,
# 3e9 wrapped negative, --d 4294967360 became 64 and 12abc 12), and step 14 below two key blocks
for bad_args in "--n 0.5" "--n 3e9" "--n 12,abc" "--d 4294967360" "--d 12abc" "--reps 0" "--threads -1"; do
    "$bin/02_naive_attention" $bad_args --no-sim $G --out "$out" >"$out/bad.log" 2>&1
    rc=$?
    if [ "$rc" = 2 ] && [ -s "$out/bad.log" ]; then ok "02 $bad_args refused"
    else bad "02 $bad_args: exit $rc, expected 2 with a message"; fi
done
"$bin/12_io_complexity" --M 1.25M --n 64 --no-sim $G --out "$out" >"$out/bad.log" 2>&1
[ $? = 2 ] && grep -q "power-of-two number of sets" "$out/bad.log" && ok "12 --M 1.25M refused (the simulator's sets)" \
    || bad "12 --M 1.25M: $(tail -1 "$out/bad.log")"
"$bin/14_validate_gpu" --n 64 $G --out "$out" >"$out/bad.log" 2>&1
[ $? = 2 ] && grep -q "two key blocks" "$out/bad.log" && ok "14 --n 64 refused (one key block)" \
    || bad "14 --n 64: $(tail -1 "$out/bad.log")"
"$bin/07_flash2" --n 100,130 --causal --reps 1 $G --out "$out" >/dev/null 2>&1 \
    && ok "07 causal, N not a multiple of the block" || bad "07 --causal --n 100,130"
# the extra run of steps 05-07 (by default at the N whose K and V fill twice the L2), small here
for s in 05_online_row 06_flash1 07_flash2; do
    if "$bin/$s" --n 64 --big 300 --causal --reps 1 --no-sim $G --out "$out" >"$out/$s.big.log" 2>&1 \
        && grep -q "16 rows checked" "$out/$s.big.log" && [ -s "$out/${s%%_*}_l2.dat" ]; then
        ok "$s --big 300: extra run, sampled rows match the reference"
    else bad "$s --big 300: $(tail -1 "$out/$s.big.log")"; fi
done

# ---- 2, 3. misses grow as N^2 ---------------------------------------------------
# column 8 of the NN.dat files is l1_miss_sim; rows are N = 256 then 512.
growth() {   # step -> misses(512) / misses(256)
    # the step's program: the executable without a dot (`make tutorials` leaves NN_l2.dat and
    # such beside it in the same directory, which a pattern alone would also match)
    exe=""
    for f in "$bin"/$1_*; do case $f in *.*) ;; *) [ -x "$f" ] && exe=$f ;; esac; done
    [ -n "$exe" ] || { echo 0; return; }
    "$exe" --n 256,512 --reps 1 $G --out "$out" >/dev/null 2>&1 || { echo 0; return; }
    awk '!/^#/ { m[NR] = $8 } END { printf "%.3f", m[3] / m[2] }' "$out/$1.dat"
}
for s in 02 06 07; do
    r=$(growth $s)
    if awk -v r="$r" 'BEGIN { exit !(r >= 3.4 && r <= 4.6) }'; then ok "step $s: L1 misses x$r when N doubles (N^2: x4)"
    else bad "step $s: L1 misses x$r when N doubles, expected ~4 (N^2)"; fi
done

"$bin/12_io_complexity" --n 128,256,512 --M 16K,32K,64K --d 32 --out "$out" >/dev/null 2>&1 || bad "step 12 sweep"
# 12.dat: n d M_bytes b std_bytes std_bound std_ratio flash_bytes flash_bound flash_ratio
spread=$(awk '!/^#/ && $3 <= 4 * $1 * $2 { r = $10; if (lo == "" || r < lo) lo = r; if (r > hi) hi = r }
              END { printf "%.3f", hi / lo }' "$out/12.dat")
if awk -v s="$spread" 'BEGIN { exit !(s > 0 && s <= 1.5) }'; then
    ok "step 12: flash traffic / (N^2 d^2 / M) varies by x$spread over N and M (<= 1.5)"
else bad "step 12: flash traffic / (N^2 d^2 / M) varies by x$spread over N and M (want <= 1.5)"; fi
halving=$(awk '!/^#/ && $1 == 512 { t[$3] = $8 } END { printf "%.3f %.3f", t[16384] / t[32768], t[32768] / t[65536] }' "$out/12.dat")
if echo "$halving" | awk '{ exit !($1 >= 1.5 && $1 <= 2.5 && $2 >= 1.5 && $2 <= 2.5) }'; then
    ok "step 12: doubling M divides flash traffic by $halving (1/M)"
else bad "step 12: doubling M divides flash traffic by $halving, want 1.5..2.5"; fi
std_m=$(awk '!/^#/ && $1 == 512 { t[$3] = $5 } END { printf "%.3f", t[16384] / t[65536] }' "$out/12.dat")
if awk -v r="$std_m" 'BEGIN { exit !(r < 2.5) }'; then ok "step 12: standard traffic falls only x$std_m for 4x M (its S and P term ignores M)"
else bad "step 12: standard traffic fell x$std_m for 4x M"; fi

# ---- 4. simulator vs valgrind -----------------------------------------------------
if [ -n "${FA_SANITIZED:-}" ]; then
    # make sanitize: the binaries carry ASan, which cannot run under valgrind
    echo "SKIP simulator-vs-valgrind agreement: sanitizer build (FA_SANITIZED)"
elif command -v valgrind >/dev/null 2>&1; then
    for s in 02_naive_attention 06_flash1 07_flash2; do
        for n in 128 256 384; do
            res=$(FA_CG_MACHINE=1 sh tutorials/cachegrind.sh "$bin/$s" --n $n $G 2>&1)
            set -- $res
            if [ $# -eq 3 ] && awk -v r="$3" 'BEGIN { exit !(r >= 0.95 && r <= 1.05) }'; then
                ok "$s N=$n: simulator $2 vs valgrind $1 D1 misses (ratio $3)"
            else bad "$s N=$n: simulator vs valgrind: $res"; fi
        done
    done
    for n in 128 256; do
        res=$(FA_CG_MACHINE=1 sh tutorials/cachegrind.sh "$bin/13_backward" --n $n $G 2>&1)
        set -- $res
        if [ $# -eq 3 ] && awk -v r="$3" 'BEGIN { exit !(r >= 0.95 && r <= 1.05) }'; then
            ok "13_backward N=$n: simulator $2 vs valgrind $1 D1 misses (ratio $3)"
        else bad "13_backward N=$n: simulator vs valgrind: $res"; fi
    done
else
    echo "SKIP simulator-vs-valgrind agreement: valgrind is not installed (apt-get install valgrind)"
fi

[ $fail = 0 ] && echo "test_tutorials: all lessons hold"
exit $fail
