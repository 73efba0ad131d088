#!/bin/sh
# test_grad_cli.sh — `flashattn grad` and `flashattn check-grad`, end to end.
#
# Usage: sh tests/test_grad_cli.sh BUILD_DIR   (tests/run_tests.sh passes it)
#
# Generates small .npy inputs with python3 + numpy, then checks that
#   - `grad` writes dQ, dK, dV with the right shapes and dtypes, and that they
#     match an independent float64 numpy backward (GQA, causal with
#     seqlen_q != seqlen_k so some rows see no key, softcap) within 1e-5 of
#     max|G| (float32 arithmetic over <= 12 keys), flash and reference alike;
#   - `check-grad` passes grad's output (exit 0), fails a perturbed or NaN
#     gradient (exit 1) and points at the worst element; where dQ and dK vanish
#     by cancellation it passes correct float32 gradients (ours and numpy's) and
#     fails ones whose D term is dropped or rounded to bf16;
#   - every bad input (wrong dO shape, NaN in dO, malformed file, unknown flag,
#     missing option, --impl standard, one path for two outputs, unwritable
#     output) exits 2 with ONE line on stderr naming the problem, and leaves
#     no output file.
# Runs in about a second.
set -u
. "$(dirname "$0")/cli_test_lib.sh"
cli_test_setup test_grad_cli "${1:-build}"

# ---- inputs and the numpy model -------------------------------------------------
cat >model.py <<'EOF'
import numpy as np

def backward(q, k, v, do, causal=False, softcap=0.0):
    """float64 attention backward in BSHD, bottom-right causal, GQA by repeating kv heads."""
    q, k, v, do = (np.asarray(x, np.float64) for x in (q, k, v, do))
    B, Sq, H, d = q.shape
    Sk, Hk = k.shape[1], k.shape[2]
    g = H // Hk
    kr, vr = np.repeat(k, g, axis=2), np.repeat(v, g, axis=2)
    t = np.einsum("bihc,bjhc->bhij", q, kr) / np.sqrt(d)
    u = softcap * np.tanh(t / softcap) if softcap > 0 else t
    vis = np.ones((Sq, Sk), bool)
    if causal:
        i, j = np.arange(Sq)[:, None], np.arange(Sk)[None, :]
        vis = j <= i + Sk - Sq
    s = np.where(vis, u, -np.inf)
    m = s.max(-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(s - m)
    l = e.sum(-1, keepdims=True)
    p = np.where(l > 0, e / np.where(l > 0, l, 1), 0.0)         # [B,H,Sq,Sk]
    o = np.einsum("bhij,bjhc->bihc", p, vr)
    dP = np.einsum("bihc,bjhc->bhij", do, vr)
    D = np.einsum("bihc,bihc->bhi", do, o)[..., None]
    dS = p * (dP - D)
    if softcap > 0:
        dS = dS * (1 - (u / softcap) ** 2)
    dq = np.einsum("bhij,bjhc->bihc", dS, kr) / np.sqrt(d)
    dk = np.einsum("bhij,bihc->bjhc", dS, q) / np.sqrt(d)
    dv = np.einsum("bhij,bihc->bjhc", p, do)
    dk = dk.reshape(B, Sk, Hk, g, d).sum(3)
    dv = dv.reshape(B, Sk, Hk, g, v.shape[3]).sum(3)
    return dq, dk, dv
EOF
cat >lowp_bits.py <<'EOFB'
import numpy as np
def bits(x):
    """float -> bf16 bit patterns ('<u2'), round to nearest even"""
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
def r(x):
    """float -> float32 holding the bf16 value"""
    return (bits(x).astype(np.uint32) << 16).view(np.float32)
EOFB
python3 - <<'EOF' || { echo "test_grad_cli.sh: generating inputs failed"; exit 1; }
import numpy as np
rng = np.random.default_rng(4321)
def rand(*shape):
    return rng.uniform(-1, 1, size=shape).astype("<f4")
B, Sq, Sk, H, Hk, d, dv = 2, 16, 12, 4, 2, 8, 6
np.save("q.npy", rand(B, Sq, H, d))
np.save("k.npy", rand(B, Sk, Hk, d))
np.save("v.npy", rand(B, Sk, Hk, dv))
np.save("do.npy", rand(B, Sq, H, dv))
np.save("do_bad_shape.npy", rand(B, Sq, H, dv + 1))
x = rand(B, Sq, H, dv); x[1, 2, 3, 4] = np.nan; np.save("do_nan.npy", x)
raw = open("do.npy", "rb").read()
open("do_trunc.npy", "wb").write(raw[:-5])
EOF

# expect_fail DESC NEEDLE CMD...: exit 2, exactly one stderr line starting with
# "flashattn" that contains NEEDLE, and no gradient file left behind.
expect_fail() {
    desc=$1; needle=$2; shift 2
    rm -f gq.npy gk.npy gv.npy
    "$@" >out.txt 2>err.txt
    rc=$?
    lines=$(wc -l <err.txt)
    if [ "$rc" != 2 ]; then
        bad "$desc: exit $rc, expected 2 ($(cat err.txt))"
    elif [ "$lines" != 1 ]; then
        bad "$desc: $lines lines on stderr, expected 1: $(cat err.txt)"
    elif ! grep -q "^flashattn" err.txt || ! grep -qF -- "$needle" err.txt; then
        bad "$desc: stderr does not contain '$needle': $(cat err.txt)"
    elif ls gq.npy gk.npy gv.npy >/dev/null 2>&1 || ls -a | grep -q '^\.fa-'; then
        bad "$desc: an output file was left behind"
    else
        ok
    fi
}

IN="-q q.npy -k k.npy -v v.npy --dout do.npy"
OUT="--dq gq.npy --dk gk.npy --dv gv.npy"

# ---- grad: success, against numpy ------------------------------------------------
if $fa grad $IN $OUT --causal >out.txt 2>err.txt && grep -q "^wrote gq.npy" out.txt; then ok
else bad "grad flash causal: $(cat err.txt)"; fi
if $fa grad $IN --dq rq.npy --dk rk.npy --dv rv.npy --causal --impl reference --threads 1 >out.txt 2>err.txt; then ok
else bad "grad reference causal: $(cat err.txt)"; fi
if $fa grad $IN --dq sq.npy --dk sk.npy --dv sv.npy --softcap 2 --block-q 4 --block-k 8 >out.txt 2>err.txt; then ok
else bad "grad flash softcap: $(cat err.txt)"; fi
if $fa grad $IN --dq bq.npy --dk bk.npy --dv bv.npy --dtype-out bf16 >out.txt 2>err.txt; then ok
else bad "grad bf16 out: $(cat err.txt)"; fi
if python3 - <<'EOF'; then ok; else bad "grad outputs have the wrong shape, dtype or values"; fi
import numpy as np, sys
from model import backward
q, k, v, do = (np.load(f) for f in ("q.npy", "k.npy", "v.npy", "do.npy"))
errs = []
def cmp(files, ref, what):
    for f, r in zip(files, ref):
        a = np.load(f)
        if a.shape != r.shape or a.dtype != np.dtype("<f4"):
            errs.append(f"{what} {f}: {a.shape} {a.dtype}")
            continue
        e = np.abs(a - r).max()
        if not e <= 1e-5 * max(1.0, np.abs(r).max()):
            errs.append(f"{what} {f}: max error {e:.3g}")
ref = backward(q, k, v, do, causal=True)
cmp(("gq.npy", "gk.npy", "gv.npy"), ref, "flash causal")
cmp(("rq.npy", "rk.npy", "rv.npy"), ref, "reference causal")
if np.abs(np.load("gq.npy")[:, :4]).max() != 0:
    errs.append("rows with no visible key have a non-zero dQ")
cmp(("sq.npy", "sk.npy", "sv.npy"), backward(q, k, v, do, softcap=2.0), "flash softcap")
for f in ("bq.npy", "bk.npy", "bv.npy"):
    if np.load(f).dtype != np.dtype("<u2"):
        errs.append(f"{f} is not <u2 (bf16)")
if errs:
    print("; ".join(errs)); sys.exit(1)
EOF

# ---- check-grad ------------------------------------------------------------------
if $fa check-grad $IN --dq gq.npy --dk gk.npy --dv gv.npy --causal >out.txt 2>err.txt &&
   grep -q "^PASS" out.txt && grep -q "^dK ok" out.txt; then ok
else bad "check-grad on grad's output: exit $? $(cat out.txt err.txt)"; fi
python3 - <<'EOF'
import numpy as np
g = np.load("gk.npy"); g[1, 7, 0, 3] += 0.5; np.save("gk_bad.npy", g)
g = np.load("gv.npy"); g[0, 0, 1, 2] = np.nan; np.save("gv_nan.npy", g)
EOF
$fa check-grad $IN --dq gq.npy --dk gk_bad.npy --dv gv.npy --causal >out.txt 2>err.txt
rc=$?
if [ "$rc" = 1 ] && grep -q "^dK FAIL" out.txt && grep -q "worst at (1, 7, 0, 3)" out.txt && grep -q "^FAIL" out.txt; then ok
else bad "check-grad on a perturbed dK: exit $rc $(cat out.txt err.txt)"; fi
$fa check-grad $IN --dq gq.npy --dk gk.npy --dv gv_nan.npy --causal >out.txt 2>err.txt
rc=$?
if [ "$rc" = 1 ] && grep -q "^dV FAIL" out.txt && grep -q "worst at (0, 0, 1, 2)" out.txt; then ok
else bad "check-grad on a NaN dV: exit $rc $(cat out.txt err.txt)"; fi
$fa check-grad $IN --dq gq.npy --dk gk.npy --dv gv.npy >out.txt 2>err.txt
rc=$?
if [ "$rc" = 1 ]; then ok; else bad "check-grad with the wrong mask passed: exit $rc"; fi
if $fa check-grad $IN --dq bq.npy --dk bk.npy --dv bv.npy >out.txt 2>err.txt && grep -q "(bf16)" out.txt; then ok
else bad "check-grad on bf16 gradients (default bf16 rule): exit $? $(cat out.txt err.txt)"; fi
if $fa check-grad $IN --dq gq.npy --dk gk_bad.npy --dv gv.npy --causal --atol 1 >out.txt 2>err.txt; then ok
else bad "check-grad --atol 1 should pass a 0.5 error"; fi

# ---- check-grad where dQ and dK vanish by cancellation ------------------------------
# Every V row of a head the same (times 100): dP_ij = dO_i . v = D_i, so dS = P o (dP - D) and
# with it dQ and dK are 0 in exact arithmetic, while any float32 kernel leaves the rounding of
# dP - D (~1e-5 here). A bound of rtol * max|G_ref| alone (the given --rtol rule) fails correct
# gradients there; the default rule's 3 * e32 (the float32 flash backward's own error) passes
# them — our flash output and an independent numpy float32 backward alike — and still fails a
# kernel that drops the D term or rounds D to bf16.
python3 - <<'EOF' || bad "generating the cancellation inputs failed"
import numpy as np
rng = np.random.default_rng(77)
B, N, H, d = 1, 96, 2, 16
f = np.float32
q = rng.standard_normal((B, N, H, d)).astype(f)
k = rng.standard_normal((B, N, H, d)).astype(f)
v = np.broadcast_to(100 * rng.standard_normal((1, 1, H, d)), (B, N, H, d)).astype(f).copy()
do = rng.standard_normal((B, N, H, d)).astype(f)
for n, x in (("cq", q), ("ck", k), ("cv", v), ("cdo", do)):
    np.save(n + ".npy", x)
from lowp_bits import r as bf16
def bwd(mode):
    sc = f(1 / np.sqrt(d))
    g = [np.zeros_like(x) for x in (q, k, v)]
    for h in range(H):
        Q, K, V, DO = q[0, :, h], k[0, :, h], v[0, :, h], do[0, :, h]
        S = (Q @ K.T) * sc
        E = np.exp(S - S.max(1, keepdims=True))
        P = (E / E.sum(1, keepdims=True)).astype(f)
        D = (DO * (P @ V)).sum(1, keepdims=True)
        D = 0 * D if mode == "noD" else bf16(D) if mode == "Dbf16" else D
        dS = P * (DO @ V.T - D)
        g[0][0, :, h], g[1][0, :, h], g[2][0, :, h] = (dS @ K) * sc, (dS.T @ Q) * sc, P.T @ DO
    return g
for mode in ("np", "noD", "Dbf16"):
    for n, x in zip("qkv", bwd(mode)):
        np.save(f"c{mode}_d{n}.npy", x.astype(f))
EOF
CIN="-q cq.npy -k ck.npy -v cv.npy --dout cdo.npy"
if $fa grad $CIN --dq cgq.npy --dk cgk.npy --dv cgv.npy >out.txt 2>err.txt; then ok
else bad "grad on the cancellation inputs: $(cat err.txt)"; fi
if $fa check-grad $CIN --dq cgq.npy --dk cgk.npy --dv cgv.npy >out.txt 2>err.txt && grep -q "^PASS" out.txt &&
   grep -qF "+ 3 * e32" out.txt && grep -q "^dQ ok .* e32 [1-9]" out.txt; then ok
else bad "check-grad (default rule) failed flash's correct cancelled gradients: $(cat out.txt err.txt)"; fi
if $fa check-grad $CIN --dq cnp_dq.npy --dk cnp_dk.npy --dv cnp_dv.npy >out.txt 2>err.txt && grep -q "^PASS" out.txt; then ok
else bad "check-grad failed an independent float32 backward's cancelled gradients: $(cat out.txt err.txt)"; fi
$fa check-grad $CIN --dq cgq.npy --dk cgk.npy --dv cgv.npy --rtol 1e-4 >out.txt 2>err.txt
rc=$?
if [ "$rc" = 1 ] && grep -q "^dQ FAIL" out.txt && ! grep -q "e32" out.txt; then ok
else bad "check-grad --rtol 1e-4 (no e32) should fail the cancelled dQ: exit $rc $(cat out.txt)"; fi
# A bf16 kernel the FlashAttention way: O stored in bf16, D = dO . O from it, dS and P rounded to
# bf16 for their products. Where dQ and dK cancel, O's rounding is most of their error (~max|dQ|);
# the bf16 rule's e32 is computed from O stored in bf16 likewise and passes it.
python3 - <<'EOF' || bad "generating the bf16 cancellation case failed"
import numpy as np
f = np.float32
from lowp_bits import bits, r as bf16
q, k, v, do = (bf16(np.load(n + ".npy")) for n in ("cq", "ck", "cv", "cdo"))
for n, x in (("bq", q), ("bk", k), ("bv", v), ("bdo", do)):
    np.save(n + ".npy", bits(x))
d = q.shape[3]
sc = f(1 / np.sqrt(d))
g = [np.zeros_like(x) for x in (q, k, v)]
for h in range(q.shape[2]):
    Q, K, V, DO = q[0, :, h], k[0, :, h], v[0, :, h], do[0, :, h]
    S = (Q @ K.T) * sc
    E = np.exp(S - S.max(1, keepdims=True))
    P = (E / E.sum(1, keepdims=True)).astype(f)
    D = (DO * bf16(P @ V)).sum(1, keepdims=True)
    dS = bf16(P * (DO @ V.T - D))
    g[0][0, :, h], g[1][0, :, h], g[2][0, :, h] = (dS @ K) * sc, (dS.T @ Q) * sc, bf16(P).T @ DO
for n, x in zip("qkv", g):
    np.save(f"bfa_d{n}.npy", bits(x))
EOF
if $fa check-grad -q bq.npy -k bk.npy -v bv.npy --dout bdo.npy --dq bfa_dq.npy --dk bfa_dk.npy --dv bfa_dv.npy \
   >out.txt 2>err.txt && grep -q "^PASS" out.txt && grep -q "O stored in the tested dtype" out.txt; then ok
else bad "check-grad failed a FlashAttention-style bf16 backward where dQ, dK cancel: $(cat out.txt err.txt)"; fi
for m in noD Dbf16; do
    $fa check-grad $CIN --dq c${m}_dq.npy --dk c${m}_dk.npy --dv c${m}_dv.npy >out.txt 2>err.txt
    rc=$?
    if [ "$rc" = 1 ] && grep -q "^dQ FAIL" out.txt && grep -q "^dK FAIL" out.txt; then ok
    else bad "check-grad passed a backward with its D term wrong ($m): exit $rc $(cat out.txt)"; fi
done

# ---- check-grad's bf16 rule against wrong gradients -----------------------------------
# A fixed rtol (5e-2 max|G_ref| for bf16) alone passed dQ 4% off and dV rows never written;
# the rule now caps it at twice the error of the same backward run plainly in bf16 (autograd's
# rounding points, as FlashAttention's tests): correct gradients (float64, rounded to bf16)
# pass, those two fail.
python3 - <<'EOF' || bad "generating the bf16 rule case failed"
import numpy as np
from model import backward
rng = np.random.default_rng(77)
from lowp_bits import bits
def val(b):
    return (b.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
t = {n: bits(rng.standard_normal(s)) for n, s in (("q", (1, 128, 4, 64)), ("k", (1, 128, 2, 64)),
                                                   ("v", (1, 128, 2, 64)), ("do", (1, 128, 4, 64)))}
for n, b in t.items():
    np.save(f"b16{n}.npy", b)
g = backward(val(t["q"]), val(t["k"]), val(t["v"]), val(t["do"]))
for n, x in zip("qkv", g):
    np.save(f"rok_d{n}.npy", bits(x))
np.save("rscale_dq.npy", bits(g[0] * 1.04))
dv = g[2].copy(); dv[:, -8:] = 0
np.save("rtail_dv.npy", bits(dv))
EOF
# GQA, 2 query heads a kv head, q = 0 (P = 1/256 exactly) and the heads' dO nearly opposite:
# a FlashAttention-style bf16 kernel rounds each head's dV before the group's sum (mha_bwd),
# as attention_ref's autograd does; the emulation must too, or its error is ~0 while the
# kernel's is half an ulp of each head's part (a review's false alarm)
python3 - <<'EOF' || bad "generating the GQA bf16 case failed"
import numpy as np
f = np.float32
from lowp_bits import bits, r as bf16
rng = np.random.default_rng(5)
S, d = 256, 64
q = np.zeros((1, S, 2, d), f)
k, v = bf16(rng.standard_normal((1, S, 1, d))), bf16(rng.standard_normal((1, S, 1, d)))
base = rng.standard_normal((1, S, 1, d))
do = bf16(np.concatenate([base, -base + 0.3 * rng.standard_normal((1, S, 1, d))], axis=2))
for n, x in (("gq", q), ("gk", k), ("gv", v), ("gdo", do)):
    np.save(n + "16.npy", bits(x))
sc = f(1 / np.sqrt(d))
dq, dk, dv = np.zeros_like(q), np.zeros((1, S, 1, d), f), np.zeros((1, S, 1, d), f)
for h in range(2):
    Q, K, V, DO = q[0, :, h], k[0, :, 0], v[0, :, 0], do[0, :, h]
    S_ = (Q @ K.T) * sc
    E = np.exp(S_ - S_.max(1, keepdims=True))
    P = (E / E.sum(1, keepdims=True)).astype(f)
    D = (DO * bf16(P @ V)).sum(1, keepdims=True)
    dS = bf16(P * (DO @ V.T - D))
    dq[0, :, h] = (dS @ K) * sc
    dk[0, :, 0] += bf16((dS.T @ Q) * sc)              # each head's part in bf16, then the sum
    dv[0, :, 0] += bf16(bf16(P).T @ DO)
for n, x in zip("qkv", (dq, dk, dv)):
    np.save(f"gfa_d{n}.npy", bits(x))
EOF
if $fa check-grad -q gq16.npy -k gk16.npy -v gv16.npy --dout gdo16.npy --dq gfa_dq.npy --dk gfa_dk.npy \
   --dv gfa_dv.npy >out.txt 2>err.txt && grep -q "^PASS" out.txt; then ok
else bad "check-grad failed a FlashAttention-style GQA bf16 backward (per-head rounding): $(cat out.txt err.txt)"; fi
RIN="-q b16q.npy -k b16k.npy -v b16v.npy --dout b16do.npy"
if $fa check-grad $RIN --dq rok_dq.npy --dk rok_dk.npy --dv rok_dv.npy >out.txt 2>err.txt &&
   grep -q "^PASS" out.txt && grep -q "bf16 emulation" out.txt; then ok
else bad "check-grad failed correct bf16 gradients: $(cat out.txt err.txt)"; fi
$fa check-grad $RIN --dq rscale_dq.npy --dk rok_dk.npy --dv rok_dv.npy >out.txt 2>err.txt
rc=$?
if [ "$rc" = 1 ] && grep -q "^dQ FAIL" out.txt && grep -q "^dK ok" out.txt; then ok
else bad "check-grad passed a bf16 dQ 4% off: exit $rc $(cat out.txt)"; fi
$fa check-grad $RIN --dq rok_dq.npy --dk rok_dk.npy --dv rtail_dv.npy >out.txt 2>err.txt
rc=$?
if [ "$rc" = 1 ] && grep -q "^dV FAIL" out.txt; then ok
else bad "check-grad passed a bf16 dV whose last 8 key rows were never written: exit $rc $(cat out.txt)"; fi

# ---- the default rule's floor is relative, and dsinks gets the bf16 cap -----------------
# expect_mismatch DESC GRAD CMD...: check-grad exits 1 with GRAD (dQ, dK, dV, dsinks) failing
expect_mismatch() {
    desc=$1; which=$2; shift 2
    "$@" >out.txt 2>err.txt
    rc=$?
    if [ "$rc" = 1 ] && grep -q "^$which FAIL" out.txt; then ok
    else bad "$desc: exit $rc $(cat out.txt err.txt)"; fi
}
# A fixed atol of 1e-6 passed all-zero gradients once dO was ~1e-7 (a loss averaged over many
# elements), and a dV 15% off at dO ~1e-6; the floor is now a * max|G_ref|. Correct gradients
# at that scale still pass.
python3 - <<'EOF2' || bad "generating the small-dO case failed"
import numpy as np
rng = np.random.default_rng()
for n in ("sq", "sk", "sv"):
    np.save(f"{n}_in.npy", rng.standard_normal((2, 48, 2, 16)).astype("<f4"))
g = rng.standard_normal((2, 48, 2, 16))
np.save("sdo_tiny.npy", (2e-7 * g).astype("<f4"))
np.save("sdo_1e6.npy", (1e-6 * g).astype("<f4"))
np.save("szero.npy", np.zeros((2, 48, 2, 16), "<f4"))
EOF2
SIN="-q sq_in.npy -k sk_in.npy -v sv_in.npy --causal"
expect_mismatch "check-grad passed all-zero gradients at dO ~2e-7" dV \
    $fa check-grad $SIN --dout sdo_tiny.npy --dq szero.npy --dk szero.npy --dv szero.npy
$fa grad $SIN --dout sdo_1e6.npy --impl reference --dtype-out f64 --dq s64q.npy --dk s64k.npy --dv s64v.npy \
    >/dev/null 2>err.txt || bad "grad reference at dO 1e-6: $(cat err.txt)"
python3 -c "
import numpy as np
for n in 'qkv': np.save(f's32{n}.npy', np.load(f's64{n}.npy').astype('<f4'))
np.save('s32v_x115.npy', (1.15 * np.load('s64v.npy')).astype('<f4'))"
if $fa check-grad $SIN --dout sdo_1e6.npy --dq s32q.npy --dk s32k.npy --dv s32v.npy >out.txt 2>&1; then ok
else bad "check-grad failed correct float32 gradients at dO ~1e-6: $(cat out.txt)"; fi
expect_mismatch "check-grad passed a dV 15% off at dO ~1e-6" dV \
    $fa check-grad $SIN --dout sdo_1e6.npy --dq s32q.npy --dk s32k.npy --dv s32v_x115.npy

# f16 gradients in f16's subnormal range (below 6.1e-5; dO ~1e-6): the exact gradients rounded to
# f16 failed when 2 * e_lp was capped at rtol * max|G_ref| (plain f16 arithmetic errs by percents
# there); all-zero gradients still fail.
python3 - <<'EOF2' || bad "generating the f16 small-gradient case failed"
import numpy as np
rng = np.random.default_rng()
for n in ("hq", "hk", "hv"):
    np.save(f"{n}_in.npy", rng.standard_normal((1, 32, 2, 16)).astype("<f2"))
np.save("hdo_in.npy", (1e-6 * rng.standard_normal((1, 32, 2, 16))).astype("<f2"))
np.save("hzero.npy", np.zeros((1, 32, 2, 16), "<f2"))
EOF2
HIN="-q hq_in.npy -k hk_in.npy -v hv_in.npy --dout hdo_in.npy"
$fa grad $HIN --impl reference --dtype-out f64 --dq h64q.npy --dk h64k.npy --dv h64v.npy >/dev/null 2>err.txt ||
    bad "grad reference f16: $(cat err.txt)"
python3 -c "
import numpy as np
for n in 'qkv': np.save(f'h16{n}.npy', np.load(f'h64{n}.npy').astype('<f2'))"
if $fa check-grad $HIN --dq h16q.npy --dk h16k.npy --dv h16v.npy >out.txt 2>&1; then ok
else bad "check-grad failed the exact gradients rounded to f16 at dO ~1e-6: $(cat out.txt)"; fi
expect_mismatch "check-grad passed all-zero f16 gradients at dO ~1e-6" dQ \
    $fa check-grad $HIN --dq hzero.npy --dk hzero.npy --dv hzero.npy

# bf16 with sinks: dsinks 4% off (or its sink probability taken against the keys' LSE alone,
# 3.7% off) passed the uncapped rtol 5e-2; the emulation now gives dsinks its cap too.
python3 - <<'EOF2' || bad "generating the bf16 sinks case failed"
import numpy as np
from lowp_bits import bits
rng = np.random.default_rng()
# V and dO positive, so every row's D = dO . O > 0 and dsinks = -sum P_sink D does not cancel
# (with signed ones it sometimes did, and 4% of a cancelled dsinks is inside the bf16 noise)
for n, pos in (("bq", 0), ("bk", 0), ("bv", 1), ("bdo", 1)):
    x = rng.standard_normal((2, 64, 4, 32))
    np.save(f"{n}_in.npy", bits(np.abs(x) if pos else x))
np.save("bsinks.npy", np.array([1.0, 0.5, 0.0, -1.0], "<f4"))
EOF2
BIN="-q bq_in.npy -k bk_in.npy -v bv_in.npy --dout bdo_in.npy --sinks bsinks.npy"
$fa grad $BIN --impl reference --dtype-out f64 --dq b64q.npy --dk b64k.npy --dv b64v.npy --dsinks-out b64s.npy \
    >/dev/null 2>err.txt || bad "grad reference with sinks: $(cat err.txt)"
python3 -c "
import numpy as np
from lowp_bits import bits
for n in 'qkv': np.save(f'b16{n}.npy', bits(np.load(f'b64{n}.npy')))
s = np.load('b64s.npy'); np.save('b32s.npy', s.astype('<f4')); np.save('b32s_x104.npy', (1.04 * s).astype('<f4'))"
BG="--dq b16q.npy --dk b16k.npy --dv b16v.npy"
if $fa check-grad $BIN $BG --dsinks b32s.npy >out.txt 2>&1 && grep -q "dsinks [0-9.e+-]*$" out.txt; then ok
else bad "check-grad failed correct bf16 gradients with sinks (or printed no emulated dsinks): $(cat out.txt)"; fi
expect_mismatch "check-grad passed a bf16 run's dsinks 4% off" dsinks $fa check-grad $BIN $BG --dsinks b32s_x104.npy

# A FlashAttention-2-style bf16 backward (O stored in bf16, D = dO . O; P and dS rounded to bf16
# for their products) on tiny problems: off by under one bf16 ulp where the emulation happened
# to round almost exactly, it FAILED 2 * e_lp alone (seeds 110 and 33 below); the floor
# a * max|G_ref| passes it. Two fixed cases plus fresh random ones.
cat >fa2_small.py <<'EOF2'
import sys
import numpy as np
from lowp_bits import bits, r
f = np.float32
seed, Sq, Sk, d = (int(x) for x in sys.argv[1:5])
rng = np.random.default_rng(seed if seed >= 0 else None)
q, k, v, do = (r(rng.standard_normal((1, n, 1, d))) for n in (Sq, Sk, Sk, Sq))
sc = f(1 / np.sqrt(d))
Q, K, V, DO = q[0, :, 0], k[0, :, 0], v[0, :, 0], do[0, :, 0]
S = (Q @ K.T) * sc
m = S.max(1, keepdims=True)
P = np.exp(S - (m + np.log(np.exp(S - m).sum(1, keepdims=True)))).astype(f)
O = r(P @ V)
D = (DO * O).sum(1, keepdims=True, dtype=f)
dS = r(P * ((DO @ V.T) - D))
g = ((dS @ K) * sc, (dS.T @ Q) * sc, r(P).T @ DO)
for n, x in (("fq", q), ("fk", k), ("fv", v), ("fdo", do)):
    np.save(f"{n}.npy", bits(x))
for n, x in zip(("fgq", "fgk", "fgv"), g):
    np.save(f"{n}.npy", bits(x[None, :, None]))
EOF2
for c in "110 1 3 16" "33 2 6 32" "-1 1 3 16" "-1 2 5 16" "-1 3 7 32" "-1 1 2 8" "-1 4 4 16" "-1 2 9 32"; do
    python3 fa2_small.py $c || { bad "fa2_small.py $c"; continue; }
    if $fa check-grad -q fq.npy -k fk.npy -v fv.npy --dout fdo.npy --dq fgq.npy --dk fgk.npy --dv fgv.npy \
            >out.txt 2>&1; then ok
    else bad "check-grad failed a correct FA2-style bf16 backward (fa2_small.py $c): $(cat out.txt)"; fi
done

# ---- bad input ---------------------------------------------------------------------
expect_fail "dO wrong shape" "do_bad_shape.npy: shape [2, 16, 4, 7] should be" \
    $fa grad -q q.npy -k k.npy -v v.npy --dout do_bad_shape.npy $OUT
expect_fail "NaN in dO" "do_nan.npy: NaN at index" $fa grad -q q.npy -k k.npy -v v.npy --dout do_nan.npy $OUT
expect_fail "truncated dO" "do_trunc.npy: truncated" $fa grad -q q.npy -k k.npy -v v.npy --dout do_trunc.npy $OUT
expect_fail "missing dO file" "nope.npy: cannot open" $fa grad -q q.npy -k k.npy -v v.npy --dout nope.npy $OUT
expect_fail "missing --dv" "missing --dv DV.npy" $fa grad $IN --dq gq.npy --dk gk.npy
expect_fail "unknown flag" "unknown option '--frob'" $fa grad $IN $OUT --frob
expect_fail "standard impl" "implementation 'standard' not available" $fa grad $IN $OUT --impl standard
expect_fail "same file twice" "are the same file" $fa grad $IN --dq gq.npy --dk gq.npy --dv gv.npy
expect_fail "output dir missing" "nodir/gv.npy: cannot write there" $fa grad $IN --dq gq.npy --dk gk.npy --dv nodir/gv.npy
expect_fail "bad window" "--window" $fa grad $IN $OUT --window x
expect_fail "check-grad wrong dK shape" "rq.npy: shape [2, 16, 4, 8] should be [batch, seqlen_k, heads_k, d]" \
    $fa check-grad $IN --dq rq.npy --dk rq.npy --dv rv.npy
expect_fail "check-grad unknown flag" "unknown option '--frob'" $fa check-grad $IN $OUT --frob
expect_fail "check-grad missing --dq" "missing --dq" $fa check-grad $IN

# ---- help ---------------------------------------------------------------------------
for cmd in grad check-grad; do
    if $fa $cmd --help >out.txt 2>err.txt && grep -q "usage: flashattn $cmd" out.txt; then ok
    else bad "$cmd --help"; fi
done

echo "test_grad_cli.sh: $pass passed, $fail failed"
[ "$fail" = 0 ]
