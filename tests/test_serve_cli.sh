#!/bin/sh
# test_serve_cli.sh — attention sinks (--sinks, grad's --dsinks-out,
# check-grad's --dsinks), dropout (--dropout-p, --dropout-mask) and rotary
# (--rotary-cos, --rotary-sin, --rotary-interleaved) through the CLI.
#
# Usage: sh tests/test_serve_cli.sh BUILD_DIR   (tests/run_tests.sh passes it)
#
# Checks that
#   - `run --sinks` writes O and LSE matching tests/ref_numpy.py's independent
#     float64 model within 2e-6 (rows with no visible key: O = 0, LSE = sink);
#   - `check --sinks` passes run's output and fails the output of a run
#     without sinks (exit 1);
#   - `grad --sinks --dsinks-out` writes dq, dk, dv, dsinks matching the
#     model's attention_backward_sinks within 1e-5 of max|G|, and
#     `check-grad --dsinks` passes them and fails a perturbed dsinks (exit 1);
#   - `run`, `grad` with --dropout-p/--dropout-mask match the model
#     (attention_forward / attention_backward_ext with the mask), `check` passes
#     run's output and fails one made with a mask that differs in one byte,
#     check-grad passes grad's output;
#   - `run` with a KV cache and rotary matches the model (kvcache_forward with
#     the tables; the appended keys are the rotated ones), `check` passes it and
#     fails the same output judged with the other pairing; tables too short, rotary
#     without a cache, cos without sin exit 2;
#   - bad sinks (wrong shape, NaN, int32), --dsinks-out without --sinks, a mask
#     byte other than 0/1 (named by index), a mask of the wrong shape or dtype,
#     p outside [0, 1), and one dropout option without the other exit 2 with ONE
#     line naming the file, and leave no output file.
set -u
tests_dir=$(cd "$(dirname "$0")" && pwd)
. "$tests_dir/cli_test_lib.sh"
cli_test_setup test_serve_cli "${1:-build}"

python3 - <<'EOF' || { echo "test_serve_cli.sh: generating inputs failed"; exit 1; }
import numpy as np
rng = np.random.default_rng(2468)
B, Sq, Sk, H, Hk, d, dv = 2, 7, 5, 4, 2, 16, 8
np.save("q.npy", rng.uniform(-1.5, 1.5, (B, Sq, H, d)).astype("<f4"))
np.save("k.npy", rng.uniform(-1.5, 1.5, (B, Sk, Hk, d)).astype("<f4"))
np.save("v.npy", rng.uniform(-1, 1, (B, Sk, Hk, dv)).astype("<f4"))
np.save("do.npy", rng.uniform(-1, 1, (B, Sq, H, dv)).astype("<f4"))
s = rng.uniform(-1, 2.5, (H,)).astype("<f4")
np.save("s.npy", s)
np.save("s3.npy", s[:3])
bad = s.copy(); bad[2] = np.nan; np.save("s_nan.npy", bad)
np.save("s_i4.npy", np.arange(H, dtype="<i4"))
m = (rng.uniform(0, 1, (B, H, Sq, Sk)) >= 0.3).astype("|u1")
np.save("m.npy", m)
m2 = m.copy(); m2[1, 2, 5, 3] ^= 1; np.save("m2.npy", m2)
m3 = m.copy(); m3[0, 1, 2, 3] = 5; np.save("m_bad.npy", m3)
np.save("m_short.npy", m[..., :4])
np.save("m_f4.npy", m.astype("<f4"))
EOF

expect_fail() {
    desc=$1; needle=$2; shift 2
    rm -f o_bad.npy ds_bad.npy
    "$@" >out.txt 2>err.txt
    rc=$?
    lines=$(wc -l <err.txt)
    if [ "$rc" != 2 ]; then
        bad "$desc: exit $rc, expected 2 ($(cat err.txt))"
    elif [ "$lines" != 1 ]; then
        bad "$desc: $lines lines on stderr, expected 1: $(cat err.txt)"
    elif ! grep -q "^flashattn" err.txt || ! grep -qF -- "$needle" err.txt; then
        bad "$desc: stderr does not contain '$needle': $(cat err.txt)"
    elif [ -e o_bad.npy ] || [ -e ds_bad.npy ] || ls -a | grep -q '^\.fa-'; then
        bad "$desc: an output file was left behind"
    else
        ok
    fi
}

QKV="-q q.npy -k k.npy -v v.npy"

# ---- run and check ------------------------------------------------------------------
if $fa run $QKV --sinks s.npy --causal -o o.npy --lse l.npy >out.txt 2>err.txt &&
   $fa run $QKV --causal -o o0.npy --lse l0.npy >out.txt 2>err.txt; then ok
else bad "run --sinks: $(cat err.txt)"; fi
if TESTS="$tests_dir" python3 - <<'EOF'; then ok; else bad "run --sinks: wrong O or LSE"; fi
import os, sys
import numpy as np
sys.path.insert(0, os.environ["TESTS"])
import ref_numpy
q, k, v, s = (np.load(f) for f in ("q.npy", "k.npy", "v.npy", "s.npy"))
want, want_lse = ref_numpy.attention_forward(q, k, v, causal=True, sinks=s)
o, lse = np.load("o.npy"), np.load("l.npy")
assert np.abs(o - want).max() <= 2e-6 and np.abs(lse - want_lse).max() <= 2e-6 * np.abs(want_lse).max()
assert np.all(o[:, :2] == 0) and np.all(lse[:, :, :2] == s[None, :, None])
EOF
if $fa check $QKV --sinks s.npy --causal --out o.npy --lse l.npy >out.txt 2>err.txt && grep -q PASS out.txt; then ok
else bad "check --sinks of run's output: $(cat out.txt err.txt)"; fi
$fa check $QKV --sinks s.npy --causal --out o0.npy --lse l0.npy >out.txt 2>err.txt
rc=$?
if [ "$rc" = 1 ] && grep -q FAIL out.txt; then ok; else bad "check --sinks of an output without sinks: exit $rc"; fi

# ---- grad and check-grad ------------------------------------------------------------
if $fa grad $QKV --dout do.npy --sinks s.npy --causal --dq dq.npy --dk dk.npy --dv dv.npy \
    --dsinks-out ds.npy >out.txt 2>err.txt; then ok
else bad "grad --dsinks-out: $(cat err.txt)"; fi
if TESTS="$tests_dir" python3 - <<'EOF'; then ok; else bad "grad --sinks: wrong gradients"; fi
import os, sys
import numpy as np
sys.path.insert(0, os.environ["TESTS"])
import ref_numpy
q, k, v, do, s = (np.load(f) for f in ("q.npy", "k.npy", "v.npy", "do.npy", "s.npy"))
want = ref_numpy.attention_backward_sinks(q, k, v, do, s, causal=True)
for f, w in zip(("dq.npy", "dk.npy", "dv.npy", "ds.npy"), want):
    g = np.load(f)
    assert g.shape == w.shape and np.abs(g - w).max() <= 1e-5 * max(1.0, np.abs(w).max()), f
assert np.abs(want[3]).max() > 1e-3
d = np.load("ds.npy"); d[1] += 0.01; np.save("ds_wrong.npy", d)
EOF
CG="$fa check-grad $QKV --dout do.npy --sinks s.npy --causal --dq dq.npy --dk dk.npy --dv dv.npy"
if $CG --dsinks ds.npy >out.txt 2>err.txt && grep -q "^dsinks ok" out.txt; then ok
else bad "check-grad --dsinks: $(cat out.txt err.txt)"; fi
$CG --dsinks ds_wrong.npy >out.txt 2>err.txt
rc=$?
if [ "$rc" = 1 ] && grep -q "^dsinks FAIL.*worst at (1)" out.txt; then ok
else bad "check-grad of a wrong dsinks: exit $rc $(cat out.txt)"; fi

# ---- dropout ------------------------------------------------------------------------
DROP="--dropout-p 0.3 --dropout-mask m.npy"
if $fa run $QKV $DROP --causal -o od.npy --lse ld.npy >out.txt 2>err.txt &&
   $fa run $QKV --dropout-p 0.3 --dropout-mask m2.npy --causal -o od2.npy >out.txt 2>err.txt &&
   $fa grad $QKV --dout do.npy $DROP --causal --dq dqd.npy --dk dkd.npy --dv dvd.npy >out.txt 2>err.txt; then ok
else bad "run/grad with dropout: $(cat err.txt)"; fi
if TESTS="$tests_dir" python3 - <<'EOF'; then ok; else bad "dropout: wrong O, LSE or gradients"; fi
import os, sys
import numpy as np
sys.path.insert(0, os.environ["TESTS"])
import ref_numpy
q, k, v, do, m = (np.load(f) for f in ("q.npy", "k.npy", "v.npy", "do.npy", "m.npy"))
want, want_lse = ref_numpy.attention_forward(q, k, v, causal=True, dropout_p=0.3, dropout_mask=m)
o, lse = np.load("od.npy"), np.load("ld.npy")
fin = np.isfinite(want_lse)
assert np.abs(o - want).max() <= 2e-6 and np.array_equal(np.isneginf(lse), ~fin)
assert np.abs(lse[fin] - want_lse[fin]).max() <= 2e-6 * np.abs(want_lse[fin]).max()
g = ref_numpy.attention_backward_ext(q, k, v, do, causal=True, dropout_p=0.3, dropout_mask=m)
for f, w in zip(("dqd.npy", "dkd.npy", "dvd.npy"), g):
    assert np.abs(np.load(f) - w).max() <= 1e-5 * max(1.0, np.abs(w).max()), f
EOF
if $fa check $QKV $DROP --causal --out od.npy --lse ld.npy >out.txt 2>err.txt && grep -q PASS out.txt; then ok
else bad "check with dropout of run's output: $(cat out.txt err.txt)"; fi
$fa check $QKV $DROP --causal --out od2.npy >out.txt 2>err.txt
rc=$?
if [ "$rc" = 1 ] && grep -q FAIL out.txt; then ok; else bad "check of an output with another mask: exit $rc"; fi
if $fa check-grad $QKV --dout do.npy $DROP --causal --dq dqd.npy --dk dkd.npy --dv dvd.npy >out.txt 2>err.txt &&
   grep -q PASS out.txt; then ok
else bad "check-grad with dropout: $(cat out.txt err.txt)"; fi
expect_fail "mask byte 5" "m_bad.npy: element [0,1,2,3] is 5" $fa run $QKV --dropout-p 0.3 --dropout-mask m_bad.npy -o o_bad.npy
expect_fail "mask of the wrong shape" "m_short.npy: shape [2,4,7,4] should be [batch=2, heads=4, seqlen_q=7, seqlen_k=5]" \
    $fa run $QKV --dropout-p 0.3 --dropout-mask m_short.npy -o o_bad.npy
expect_fail "float mask" "m_f4.npy" $fa run $QKV --dropout-p 0.3 --dropout-mask m_f4.npy -o o_bad.npy
expect_fail "p = 1" "--dropout-p: must be in [0, 1)" $fa run $QKV --dropout-p 1 --dropout-mask m.npy -o o_bad.npy
expect_fail "p without a mask" "--dropout-p needs --dropout-mask" $fa run $QKV --dropout-p 0.1 -o o_bad.npy

# ---- rotary (KV cache) ----------------------------------------------------------------
python3 - <<'EOF' || { echo "test_serve_cli.sh: generating rotary inputs failed"; exit 1; }
import numpy as np
rng = np.random.default_rng(97531)
B, Sq, H, Hk, d, dv, Sc, Sn, rd, ro = 2, 3, 4, 2, 16, 8, 20, 2, 8, 30
np.save("rq.npy", rng.uniform(-2, 2, (B, Sq, H, d)).astype("<f4"))
np.save("rkc.npy", rng.uniform(-2, 2, (B, Sc, Hk, d)).astype("<f4"))
np.save("rvc.npy", rng.uniform(-1, 1, (B, Sc, Hk, dv)).astype("<f4"))
np.save("rkn.npy", rng.uniform(-2, 2, (B, Sn, Hk, d)).astype("<f4"))
np.save("rvn.npy", rng.uniform(-1, 1, (B, Sn, Hk, dv)).astype("<f4"))
np.save("rsl.npy", np.array([4, 9], "<i4"))
ang = np.arange(ro)[:, None] * 100.0 ** (-2.0 * np.arange(rd // 2)[None, :] / rd)
np.save("cos.npy", np.cos(ang)); np.save("sin.npy", np.sin(ang))
np.save("cos_short.npy", np.cos(ang)[:10]); np.save("sin_short.npy", np.sin(ang)[:10])
EOF
RC="-q rq.npy -k rkc.npy -v rvc.npy --cache-seqlens rsl.npy --k-new rkn.npy --v-new rvn.npy --causal"
if $fa run $RC --rotary-cos cos.npy --rotary-sin sin.npy --rotary-interleaved -o ro.npy --lse rl.npy \
    --k-cache-out rkc2.npy >out.txt 2>err.txt &&
   $fa run $RC -o ro0.npy >out.txt 2>err.txt; then ok
else bad "run with rotary: $(cat err.txt)"; fi
if TESTS="$tests_dir" python3 - <<'EOF'; then ok; else bad "run with rotary: wrong O or appended keys"; fi
import os, sys
import numpy as np
sys.path.insert(0, os.environ["TESTS"])
import ref_numpy
q, kc, vc, kn, vn, sl, c, s = (np.load(f) for f in ("rq.npy", "rkc.npy", "rvc.npy", "rkn.npy", "rvn.npy", "rsl.npy",
                                                      "cos.npy", "sin.npy"))
want, want_lse = ref_numpy.kvcache_forward(q, kc, vc, sl, kn, vn, rotary_cos=c, rotary_sin=s,
                                           rotary_interleaved=True, causal=True)
o, lse = np.load("ro.npy"), np.load("rl.npy")
assert np.abs(o - want).max() <= 1e-5 * np.abs(want).max() and np.abs(lse - want_lse).max() <= 1e-5 * np.abs(want_lse).max()
kc2 = np.load("rkc2.npy")
for b in range(2):
    rot = ref_numpy.apply_rotary(kn[b], c, s, sl[b] + np.arange(2), True)
    assert np.abs(kc2[b, sl[b]:sl[b] + 2] - rot).max() <= 1e-6 * np.abs(rot).max()
    assert np.array_equal(kc2[b, sl[b]:sl[b] + 2, :, 8:], kn[b][:, :, 8:])
EOF
if $fa check $RC --rotary-cos cos.npy --rotary-sin sin.npy --rotary-interleaved --out ro.npy --lse rl.npy \
    >out.txt 2>err.txt && grep -q PASS out.txt; then ok
else bad "check with rotary of run's output: $(cat out.txt err.txt)"; fi
$fa check $RC --rotary-cos cos.npy --rotary-sin sin.npy --out ro.npy >out.txt 2>err.txt
rc=$?
if [ "$rc" = 1 ] && grep -q FAIL out.txt; then ok; else bad "check with the other pairing: exit $rc"; fi
expect_fail "tables too short" "cos_short.npy: cos/sin have 10 positions, but sequence 1 needs position 11" \
    $fa run $RC --rotary-cos cos_short.npy --rotary-sin sin_short.npy -o o_bad.npy
expect_fail "rotary without a cache" "--rotary-cos needs a KV cache with new keys" \
    $fa run -q rq.npy -k rkn.npy -v rvn.npy --rotary-cos cos.npy --rotary-sin sin.npy -o o_bad.npy
expect_fail "cos without sin" "--rotary-cos needs --rotary-sin" $fa run $RC --rotary-cos cos.npy -o o_bad.npy

# ---- bad input ----------------------------------------------------------------------
expect_fail "sinks of the wrong shape" "s3.npy: sinks of shape [3] should be [heads] = [4]" \
    $fa run $QKV --sinks s3.npy -o o_bad.npy
expect_fail "NaN sink" "s_nan.npy: NaN at index (2)" $fa run $QKV --sinks s_nan.npy -o o_bad.npy
expect_fail "int32 sinks" "s_i4.npy" $fa run $QKV --sinks s_i4.npy -o o_bad.npy
expect_fail "--dsinks-out without --sinks" "--dsinks-out needs --sinks" \
    $fa grad $QKV --dout do.npy --dq o_bad.npy --dk dk2.npy --dv dv2.npy --dsinks-out ds_bad.npy

echo "test_serve_cli.sh: $pass passed, $fail failed"
[ "$fail" = 0 ]
