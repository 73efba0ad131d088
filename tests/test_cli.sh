#!/bin/sh
# test_cli.sh — the flashattn command line, end to end.
#
# Usage: sh tests/test_cli.sh BUILD_DIR   (tests/run_tests.sh passes it)
#
# Generates small .npy inputs with python3 + numpy, then checks that
#   - `run` succeeds and writes O (and LSE) with the right shape and dtype, and
#     that flash, reference and standard agree;
#   - every bad input (malformed .npy, inconsistent shapes, heads not divisible,
#     NaN/Inf, unknown flag, missing file, unwritable output) exits 2 with ONE
#     line on stderr that names the file at fault, and leaves no output file;
#   - --help works for every subcommand; info and a tiny demo run.
# Runs in a few seconds.
set -u
. "$(dirname "$0")/cli_test_lib.sh"
cli_test_setup test_cli "${1:-build}"

# ---- inputs -----------------------------------------------------------------
python3 - <<'EOF' || { echo "test_cli.sh: generating inputs failed"; exit 1; }
import numpy as np
rng = np.random.default_rng(1234)
def rand(*shape, dtype="<f4"):
    return rng.uniform(-1, 1, size=shape).astype(dtype)
B, Sq, Sk, H, Hk, d, dv = 2, 16, 12, 4, 2, 8, 6
np.save("q.npy", rand(B, Sq, H, d))
np.save("k.npy", rand(B, Sk, Hk, d))
np.save("v.npy", rand(B, Sk, Hk, dv))
np.save("alibi.npy", (2.0 ** -np.arange(1, H + 1)).astype("<f4"))
np.save("alibi_bh.npy", rand(B, H) * 0.1 + 0.2)
# inconsistent or invalid inputs
np.save("k_d4.npy", rand(B, Sk, Hk, 4))             # head dim differs from q
np.save("k_h3.npy", rand(B, Sk, 3, d))              # 4 heads not a multiple of 3
np.save("v_h3.npy", rand(B, Sk, 3, dv))
np.save("v_s10.npy", rand(B, 10, Hk, dv))           # seqlen differs from k
np.save("k_b1.npy", rand(1, Sk, Hk, d))             # batch differs from q
np.save("q_rank3.npy", rand(Sq, H, d))
q = rand(B, Sq, H, d); q[1, 5, 2, 3] = np.nan; np.save("q_nan.npy", q)
v = rand(B, Sk, Hk, dv); v[0, 0, 1, 0] = np.inf; np.save("v_inf.npy", v)
np.save("q_i4.npy", np.zeros((B, Sq, H, d), dtype="<i4"))
np.save("q_be.npy", rand(B, Sq, H, d, dtype=">f4"))
np.save("alibi_bad.npy", rand(H + 1))
np.save("q_f16.npy", rand(B, Sq, H, d, dtype="<f2"))
raw = open("q.npy", "rb").read()
open("q_trunc.npy", "wb").write(raw[:-7])
open("q_magic.npy", "wb").write(b"XNUMPY" + raw[6:])
open("q_trailing.npy", "wb").write(raw + b"\0\0\0\0")
open("q_empty.npy", "wb").write(b"")
EOF

# ---- helpers ------------------------------------------------------------------
# expect_ok DESC CMD...: exit 0
expect_ok() {
    desc=$1; shift
    if "$@" >out.txt 2>err.txt; then ok; else bad "$desc: exit $? ($(cat err.txt))"; fi
}

# expect_fail DESC NEEDLE CMD...: exit 2, exactly one stderr line that contains
# NEEDLE and starts with "flashattn", and no o.npy / lse.npy left behind.
expect_fail() {
    desc=$1; needle=$2; shift 2
    rm -f o.npy lse.npy
    "$@" >out.txt 2>err.txt
    rc=$?
    lines=$(wc -l <err.txt)
    if [ "$rc" != 2 ]; then
        bad "$desc: exit $rc, expected 2 ($(cat err.txt))"
    elif [ "$lines" != 1 ]; then
        bad "$desc: $lines lines on stderr, expected 1: $(cat err.txt)"
    elif ! grep -q "^flashattn" err.txt || ! grep -qF -- "$needle" err.txt; then
        bad "$desc: stderr does not contain '$needle': $(cat err.txt)"
    elif ls o.npy lse.npy >/dev/null 2>&1 || ls -a | grep -q '^\.fa-'; then
        bad "$desc: an output file was left behind"
    else
        ok
    fi
}

RUN="$fa run -q q.npy -k k.npy -v v.npy -o o.npy --lse lse.npy"

# ---- run: success -------------------------------------------------------------
expect_ok "run flash" $RUN --causal --window 5,-1 --softcap 3 --alibi alibi.npy
expect_ok "run reference" $fa run -q q.npy -k k.npy -v v.npy -o o_ref.npy --lse lse_ref.npy \
    --causal --window 5,-1 --softcap 3 --alibi alibi.npy --impl reference --threads 1
expect_ok "run standard" $fa run -q q.npy -k k.npy -v v.npy -o o_std.npy --lse lse_std.npy \
    --causal --window=5,-1 --softcap=3 --alibi=alibi.npy --impl standard
expect_ok "run bf16 out, per-batch alibi" $fa run -q q.npy -k k.npy -v v.npy -o o_bf16.npy \
    --dtype-out bf16 --alibi alibi_bh.npy --scale 0.5
expect_ok "run f16 input, f16 out" $fa run -q q_f16.npy -k k.npy -v v.npy -o o_f16.npy --dtype-out f16
expect_ok "run with explicit blocks" $fa run -q q.npy -k k.npy -v v.npy -o o_blk.npy \
    --block-q 4 --block-k 16 --threads 2
if python3 - <<'EOF'; then ok; else bad "outputs have the wrong shape, dtype or values"; fi
import numpy as np, sys
o, lse = np.load("o.npy"), np.load("lse.npy")
o_ref, lse_ref = np.load("o_ref.npy"), np.load("lse_ref.npy")
o_std = np.load("o_std.npy")
errs = []
if o.shape != (2, 16, 4, 6) or o.dtype != np.dtype("<f4"): errs.append(f"o {o.shape} {o.dtype}")
if lse.shape != (2, 4, 16) or lse.dtype != np.dtype("<f4"): errs.append(f"lse {lse.shape} {lse.dtype}")
if np.abs(o - o_ref).max() > 5e-5: errs.append("flash vs reference O")
if np.abs(o_std - o_ref).max() > 5e-5: errs.append("standard vs reference O")
fin = np.isfinite(lse_ref)
if not np.array_equal(fin, np.isfinite(lse)) or np.abs(lse[fin] - lse_ref[fin]).max() > 5e-5:
    errs.append("flash vs reference LSE")
if np.load("o_bf16.npy").dtype != np.dtype("<u2"): errs.append("bf16 output is not <u2")
if np.load("o_f16.npy").dtype != np.dtype("<f2"): errs.append("f16 output is not <f2")
if np.abs(np.load("o_blk.npy") - np.load("o_bf16.npy").astype(np.float32)).max() < 0: errs.append("?")
if errs: print("; ".join(errs)); sys.exit(1)
EOF

# ---- run: bad input -------------------------------------------------------------
expect_fail "truncated q" "q_trunc.npy: truncated: expected" $fa run -q q_trunc.npy -k k.npy -v v.npy -o o.npy
expect_fail "bad magic" "q_magic.npy: not a .npy file" $fa run -q q_magic.npy -k k.npy -v v.npy -o o.npy
expect_fail "trailing bytes" "q_trailing.npy: trailing data" $fa run -q q_trailing.npy -k k.npy -v v.npy -o o.npy
expect_fail "empty file" "q_empty.npy: empty file" $fa run -q q_empty.npy -k k.npy -v v.npy -o o.npy
expect_fail "int dtype" "q_i4.npy: unsupported dtype '<i4'" $fa run -q q_i4.npy -k k.npy -v v.npy -o o.npy
expect_fail "big-endian" "q_be.npy: big-endian" $fa run -q q_be.npy -k k.npy -v v.npy -o o.npy
expect_fail "missing file" "nope.npy: cannot open" $fa run -q q.npy -k nope.npy -v v.npy -o o.npy
expect_fail "rank 3 q" "q_rank3.npy: expected rank 4" $fa run -q q_rank3.npy -k k.npy -v v.npy -o o.npy
expect_fail "d mismatch" "k_d4.npy: head dim 4 does not match q.npy head dim 8" \
    $fa run -q q.npy -k k_d4.npy -v v.npy -o o.npy --lse lse.npy
expect_fail "heads not divisible" "q.npy: heads (4) is not a multiple of k_h3.npy heads (3)" \
    $fa run -q q.npy -k k_h3.npy -v v_h3.npy -o o.npy
expect_fail "k/v heads mismatch" "v.npy: heads 2 does not match k_h3.npy heads 3" \
    $fa run -q q.npy -k k_h3.npy -v v.npy -o o.npy
expect_fail "seqlen mismatch" "v_s10.npy: seqlen 10 does not match k.npy seqlen 12" \
    $fa run -q q.npy -k k.npy -v v_s10.npy -o o.npy
expect_fail "batch mismatch" "k_b1.npy: batch 1 does not match q.npy batch 2" \
    $fa run -q q.npy -k k_b1.npy -v v.npy -o o.npy
expect_fail "NaN input" "q_nan.npy: NaN at index (1, 5, 2, 3)" $fa run -q q_nan.npy -k k.npy -v v.npy -o o.npy
expect_fail "Inf input" "v_inf.npy: +Inf at index (0, 0, 1, 0)" $fa run -q q.npy -k k.npy -v v_inf.npy -o o.npy
expect_fail "alibi shape" "alibi_bad.npy: ALiBi slopes of shape [5]" $RUN --alibi alibi_bad.npy
expect_fail "unknown flag" "unknown option '--bogus'" $RUN --bogus
expect_fail "stray argument" "unexpected argument 'extra'" $RUN extra
expect_fail "missing -o" "missing -o O.npy" $fa run -q q.npy -k k.npy -v v.npy
expect_fail "missing value" "--window needs a value" $RUN --window
expect_fail "bad window" "--window" $RUN --window 3
expect_fail "bad softcap" "--softcap" $RUN --softcap -1
expect_fail "bad scale" "--scale" $RUN --scale nan
expect_fail "bad threads" "--threads" $RUN --threads 0
# numbers: a digit (or '-') first, decimal; options given once; a value is not an option
expect_fail "threads with a leading blank" "--threads: expected an integer" $RUN --threads ' 2'
expect_fail "threads with a plus sign" "--threads: expected an integer" $RUN --threads +2
expect_fail "scale with a leading blank" "--scale: expected a decimal number" $RUN --scale ' 0.5'
expect_fail "scale with a plus sign" "--scale: expected a decimal number" $RUN --scale +1
expect_fail "scale without a leading digit" "--scale: expected a decimal number" $RUN --scale .5
expect_fail "negative scale without a leading digit" "--scale: expected a decimal number" $RUN --scale -.5
expect_fail "scale in hex" "--scale: expected a decimal number" $RUN --scale 0x1p-2
expect_fail "softcap with a plus sign" "--softcap: expected a decimal number" $RUN --softcap +1
expect_fail "atol in hex" "--atol: expected a decimal number" \
    $fa check -q q.npy -k k.npy -v v.npy --out o_ref.npy --atol 0x1p-10
expect_ok "scale -0.25 and 1e-3 forms" $RUN --scale -0.25 --softcap 1e-3
expect_fail "--causal given twice" "--causal given twice" $RUN --causal --causal
expect_fail "--diagnose given twice" "--diagnose given twice" \
    $fa check -q q.npy -k k.npy -v v.npy --out o_ref.npy --diagnose --diagnose
expect_fail "bench --no-check given twice" "--no-check given twice" $fa bench --n 16 --d 8 --no-check --no-check
expect_fail "demo --causal given twice" "--causal given twice" $fa demo --causal --causal
expect_fail "demo --causal and --no-causal" "--causal and --no-causal: give one of them" $fa demo --causal --no-causal
expect_fail "bench --impl unknown lists blas" "expected flash, reference, standard or blas" $fa bench --impl foo
expect_fail "seed in hex" "--seed: expected a non-negative decimal integer" \
    $fa check -q q.npy -k k.npy -v v.npy --out o_ref.npy --sample-rows 2 --seed 0x10
expect_fail "seed negative after a blank" "--seed: expected a non-negative decimal integer" \
    $fa check -q q.npy -k k.npy -v v.npy --out o_ref.npy --sample-rows 2 --seed ' -1'
expect_fail "-q given twice" "-q given twice (arguments 1 and 3)" $fa run -q q.npy -q k.npy -k k.npy -v v.npy -o o.npy
expect_fail "-o given twice" "-o given twice" $fa run -q q.npy -k k.npy -v v.npy -o o.npy -o=lse.npy
# a value that reads like an option (a file named -k) is a value, not an earlier -k
cp q.npy ./-k
expect_ok "a file named -k as -q's value" $fa run -q -k -k k.npy -v v.npy -o o.npy
expect_fail "-k given twice after a value -k" "-k given twice (arguments 3 and 9)" \
    $fa run -q -k -k k.npy -v v.npy -o o.npy -k k.npy
rm -f ./-k o.npy
expect_fail "check's --out and -o both given" "-o given twice (as --out and -o)" \
    $fa check -q q.npy -k k.npy -v v.npy --out o_ref.npy -o o_ref.npy
expect_fail "an option as a file name" "-o needs a value, got the option '--causal'" \
    $fa run -q q.npy -k k.npy -v v.npy -o --causal
[ -e ./--causal ] && bad "-o --causal wrote a file named --causal"
expect_fail "bad impl" "--impl: unknown implementation 'fast'" $RUN --impl fast
expect_fail "bad dtype-out" "--dtype-out" $RUN --dtype-out f8
expect_fail "output dir missing" "nodir/o.npy: cannot write there" $fa run -q q.npy -k k.npy -v v.npy -o nodir/o.npy
expect_fail "lse dir missing" "nodir/lse.npy: cannot write there" \
    $fa run -q q.npy -k k.npy -v v.npy -o o.npy --lse nodir/lse.npy
mkdir lse_dir.npy   # refused before any work: neither O nor LSE is written
expect_fail "lse names a directory" "lse_dir.npy: is a directory" \
    $fa run -q q.npy -k k.npy -v v.npy -o o.npy --lse lse_dir.npy
expect_fail "same output twice" "same file" $fa run -q q.npy -k k.npy -v v.npy -o o.npy --lse o.npy
expect_fail "unknown command" "unknown command 'frobnicate'" $fa frobnicate
expect_fail "--version with an argument" "--version takes no arguments, got 'x'" $fa --version x
if $fa --version >out.txt 2>err.txt && grep -q "^flashattn [0-9]" out.txt; then ok; else bad "--version: $(cat err.txt)"; fi
expect_fail "unknown top-level flag" "unknown option '--frob'" $fa --frob
expect_fail "info extra arg" "unknown option '--x'" $fa info --x
expect_fail "demo bad flag" "unknown option '--m'" $fa demo --m 3

# ---- help, info, demo ------------------------------------------------------------
for cmd in run info demo; do
    if $fa $cmd --help >out.txt 2>err.txt && grep -q "usage: flashattn $cmd" out.txt; then ok
    else bad "$cmd --help"; fi
done
if $fa --help >out.txt && grep -q "commands:" out.txt && $fa help run | grep -q "MASK OPTIONS"; then ok
else bad "top-level help"; fi
if $fa info >out.txt 2>err.txt && grep -q "^ISA" out.txt && grep -q "Bc = M/(4d)" out.txt; then ok
else bad "info: $(cat out.txt err.txt)"; fi
# info says the strips in force: pinned (24 rows is a multiple of every table's row block), off,
# and none when L1d would hold more rows than a tile has
if FA_STRIP_ROWS=24 $fa info >out.txt 2>err.txt && [ "$(grep -c 'strips: .*24-row strips' out.txt)" = 2 ] &&
   FA_STRIP_ROWS=0 $fa info | grep -q 'strips: none (whole tiles); FA_STRIP_ROWS set' &&
   FA_L1D_BYTES=1G $fa info | grep -q 'strips: none (whole tiles)$'; then ok
else bad "info strips: $(cat out.txt err.txt)"; fi
if $fa demo --n 64 --heads 2 --d 16 --threads 1 >out.txt 2>err.txt && grep -q "^  flash " out.txt &&
   grep -q "^  standard " out.txt; then ok
else bad "tiny demo: $(cat out.txt err.txt)"; fi

echo "test_cli.sh: $pass passed, $fail failed"
[ "$fail" = 0 ]
