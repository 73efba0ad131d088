"""test_lowprec.py -- low-precision inputs end to end, against models written here.

Independent of src/lowprec.c and src/validate.c:
  * the FP8/FP4/INT8 code tables, computed here from the bit definitions with
    exact fractions (and e5m2 also as the top byte of an IEEE half), are
    compared code by code with the library's fa_qformat_table (and with
    ml_dtypes when it is installed);
  * an emulator of FlashAttention-3's FP8 forward data path (P scaled by 256
    and rounded to e4m3, row sums from unrounded values, key blocks of 128
    visited last to first with a running max, fp32 accumulation, bf16 out)
    and of an NVFP4 (SageAttention3-style) path makes kernel-like outputs;
    `flashattn check` must accept them, and reject the same kernels run with
    one descale off by 2x or with P saturating at 448 (the FlashAttention-4
    bug fixed in its PR 2717);
  * `flashattn run --impl reference` on code files equals the float64 model
    (tests/ref_numpy.py) on the values decoded here.
"""

import ctypes
import os
import subprocess
from fractions import Fraction

import numpy as np
import pytest

import ref_numpy

BUILD = os.environ.get("FA_BUILD", "build")
CLI = os.path.join(BUILD, "flashattn")
LIB = os.path.join(BUILD, "libflashattn.so")

E4M3, E5M2, E2M1, INT8, E8M0 = 1, 2, 3, 4, 5


# ---------------------------------------------------------------- the formats

def minifloat_value(code, ebits, mbits, bias, kind):
    """Exact value of a code from its bit fields (None for NaN, +-inf as float)."""
    width = 1 + ebits + mbits
    if code >> width:
        return None
    sign = -1 if (code >> (width - 1)) & 1 else 1
    e = (code >> mbits) & ((1 << ebits) - 1)
    m = code & ((1 << mbits) - 1)
    if kind == "e4m3" and e == (1 << ebits) - 1 and m == (1 << mbits) - 1:
        return None
    if kind == "e5m2" and e == (1 << ebits) - 1:
        return None if m else sign * float("inf")
    # values are exact: at most 4 significant bits, exponents within float64's range
    if e == 0:
        mag = Fraction(m, 1 << mbits) * Fraction(2) ** (1 - bias)
    else:
        mag = (1 + Fraction(m, 1 << mbits)) * Fraction(2) ** (e - bias)
    return sign * float(mag)  # (float first, so that the negative zero keeps its sign)


def python_table(fmt):
    out = []
    for c in range(256):
        if fmt == E4M3:
            v = minifloat_value(c, 4, 3, 7, "e4m3")
        elif fmt == E5M2:
            v = minifloat_value(c, 5, 2, 15, "e5m2")
        elif fmt == E2M1:
            v = minifloat_value(c, 2, 1, 1, "e2m1")
        elif fmt == INT8:
            v = c - 256 if c >= 128 else c
        else:
            v = None if c == 255 else Fraction(2) ** (c - 127)
        out.append(float("nan") if v is None else float(v))
    return np.array(out)


def lib():
    if not os.path.exists(LIB):
        pytest.skip("no shared library")
    L = ctypes.CDLL(LIB)
    L.fa_qformat_table.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_double)]
    L.fa_qformat_encode.argtypes = [ctypes.c_int, ctypes.c_double]
    L.fa_qformat_encode.restype = ctypes.c_uint
    return L


@pytest.mark.parametrize("fmt", [E4M3, E5M2, E2M1, INT8, E8M0])
def test_tables_equal_the_bit_definitions_every_code(fmt):
    L = lib()
    t = (ctypes.c_double * 256)()
    assert L.fa_qformat_table(fmt, t) == 0
    got = np.array(list(t))
    want = python_table(fmt)
    same = (got == want) | (np.isnan(got) & np.isnan(want))
    assert same.all(), [(c, got[c], want[c]) for c in np.nonzero(~same)[0][:5]]
    # signs of zero too
    assert np.array_equal(np.signbit(got[~np.isnan(got)]), np.signbit(want[~np.isnan(want)]))
    if fmt == E5M2:  # e5m2 is the upper byte of an IEEE half
        half = (np.arange(256, dtype=np.uint16) << 8).view(np.float16).astype(np.float64)
        assert ((got == half) | (np.isnan(got) & np.isnan(half))).all()
    try:
        import ml_dtypes  # noqa: F401
    except ImportError:
        return
    names = {E4M3: "float8_e4m3fn", E5M2: "float8_e5m2", E8M0: "float8_e8m0fnu"}
    if fmt in names:
        md = np.arange(256, dtype=np.uint8).view(getattr(ml_dtypes, names[fmt])).astype(np.float64)
        assert ((got == md) | (np.isnan(got) & np.isnan(md))).all()


def rne_sat(x, fmt):
    """Round to the nearest finite value of the format, ties to the even code,
    saturating -- by searching the table (a different algorithm from the C)."""
    x = np.asarray(x, dtype=np.float64)
    if fmt == INT8:
        return (np.clip(np.rint(x), -127, 127).astype(np.int64) & 0xFF).astype(np.uint8)
    table = python_table(fmt)
    npos = {E4M3: 0x7F, E5M2: 0x7C, E2M1: 8}[fmt]
    pos = table[:npos]
    neg_bit = 0x8 if fmt == E2M1 else 0x80
    a = np.minimum(np.abs(x), pos[-1])
    hi = np.clip(np.searchsorted(pos, a), 0, npos - 1)
    lo = np.maximum(hi - 1, 0)
    dlo, dhi = a - pos[lo], pos[hi] - a
    code = np.where(dlo < dhi, lo, np.where(dhi < dlo, hi, np.where(lo % 2 == 0, lo, hi)))
    code = code | np.where(np.signbit(x), neg_bit, 0)
    return code.astype(np.uint8)


def decode(codes, fmt):
    return python_table(fmt)[codes.astype(np.int64)]


@pytest.mark.parametrize("fmt", [E4M3, E5M2, E2M1])
def test_encoder_matches_a_table_search(fmt):
    L = lib()
    rng = np.random.default_rng(7)
    mx = {E4M3: 448.0, E5M2: 57344.0, E2M1: 6.0}[fmt]
    table = python_table(fmt)
    pos = np.sort(table[np.isfinite(table) & (table >= 0)])
    mids = (pos[1:] + pos[:-1]) / 2
    xs = np.concatenate([rng.standard_normal(3000) * mx / 8, mids, -mids, pos, [mx * 1.1, -mx * 3, 1e30]])
    want = rne_sat(xs, fmt)
    got = np.array([L.fa_qformat_encode(fmt, float(x)) for x in xs], dtype=np.uint8)
    # -0 and +0 compare equal as values
    assert np.array_equal(decode(got, fmt), decode(want, fmt))


# ----------------------------------------------------------------- the kernels

def bf16(x):
    return ref_numpy.float_to_bf16_bits(x)


def fa3_fp8_kernel(q8, k8, v8, dq, dk, dv, offset=8.0, block=128, fmt=E4M3, p_fmt=None, reverse=True):
    """FlashAttention-3's FP8 forward, emulated: fp32 everywhere, as read from
    hopper/softmax.h and the sm90 mainloop. q8/k8/v8 are codes, descales are
    [B, Hk]. offset 8 gives P in (0, 256]; a larger offset makes P saturate."""
    B, Sq, H, D = q8.shape
    Sk, Hk = k8.shape[1], k8.shape[2]
    g = H // Hk
    p_fmt = p_fmt or fmt
    qf, kf, vf = (decode(c, fmt).astype(np.float32) for c in (q8, k8, v8))
    scale_log2 = np.float32(1.0 / np.sqrt(D) * np.log2(np.e))
    out = np.zeros((B, Sq, H, v8.shape[3]), np.float32)
    for b in range(B):
        for h in range(H):
            hk = h // g
            sl2 = np.float32(scale_log2 * np.float32(dq[b, hk] * dk[b, hk]))
            s = (qf[b, :, h, :] @ kf[b, :, hk, :].T).astype(np.float32)  # fp32 accumulate
            m = np.full(Sq, -np.inf, np.float32)
            l = np.zeros(Sq, np.float32)
            acc = np.zeros((Sq, v8.shape[3]), np.float32)
            nblocks = (Sk + block - 1) // block
            for nb in (range(nblocks - 1, -1, -1) if reverse else range(nblocks)):
                j0, j1 = nb * block, min(Sk, (nb + 1) * block)
                sb = s[:, j0:j1] * sl2
                mnew = np.maximum(m, sb.max(axis=1))
                r = np.where(np.isinf(m), 0, np.exp2(m - mnew)).astype(np.float32)
                l *= r
                acc *= r[:, None]
                m = mnew
                pt = np.exp2(sb - m[:, None] + np.float32(offset)).astype(np.float32)
                l += pt.sum(axis=1, dtype=np.float32)
                p8 = decode(rne_sat(pt, p_fmt), p_fmt).astype(np.float32)
                acc += p8 @ vf[b, j0:j1, hk, :]
            out[b, :, h, :] = acc / l[:, None] * np.float32(dv[b, hk])
    return bf16(out)


def quantize_fp8_per_head(x, fmt=E4M3):
    """torchao's fp8 recipe: per-(batch, kv head) descale amax/448."""
    amax = np.abs(x).max(axis=(1, 3))  # [B, H]
    ds = (amax / {E4M3: 448.0, E5M2: 57344.0, INT8: 127.0}[fmt]).astype(np.float32)
    codes = rne_sat(x / ds[:, None, :, None], fmt)
    return codes, ds


def save(path, arr):
    np.save(path, np.ascontiguousarray(arr))
    return str(path)


def run(args):
    return subprocess.run([CLI] + [str(a) for a in args], capture_output=True, text=True, timeout=300)


@pytest.fixture
def fp8_problem(tmp_path):
    if not os.path.exists(CLI):
        pytest.skip("no CLI")
    return make_fp8_problem(tmp_path, int(os.environ.get("FA_TEST_SEED", "0")) % 2**32 or None)


def make_fp8_problem(tmp_path, seed):
    rng = np.random.default_rng(seed)
    B, Sq, Sk, H, Hk, D = 2, 64, 300, 4, 2, 64
    q = rng.standard_normal((B, Sq, H, D)) * 2.0
    k = rng.standard_normal((B, Sk, Hk, D)) * 2.0
    v = rng.standard_normal((B, Sk, Hk, D))
    # Q's descale is per kv head too (FlashAttention-3): quantize Q with the max over its group
    qg = q.reshape(B, Sq, Hk, H // Hk, D)
    amax_q = np.abs(qg).max(axis=(1, 3, 4))
    dq = (amax_q / 448.0).astype(np.float32)
    q8 = rne_sat(q / np.repeat(dq, H // Hk, axis=1)[:, None, :, None], E4M3)
    k8, dk = quantize_fp8_per_head(k)
    v8, dv = quantize_fp8_per_head(v)
    raw = dict(q=q, k=k, v=v)
    files = dict(q=save(tmp_path / "q8.npy", q8), k=save(tmp_path / "k8.npy", k8),
                 v=save(tmp_path / "v8.npy", v8), dq=save(tmp_path / "dq.npy", dq),
                 dk=save(tmp_path / "dk.npy", dk), dv=save(tmp_path / "dv.npy", dv))
    return dict(q8=q8, k8=k8, v8=v8, dq=dq, dk=dk, dv=dv, files=files, tmp=tmp_path, raw=raw)


def check_args(p, out, *extra):
    f = p["files"]
    return ["check", "-q", f["q"], "-k", f["k"], "-v", f["v"], "--out", out, "--qkv-format", "e4m3",
            "--descale-q", f["dq"], "--descale-k", f["dk"], "--descale-v", f["dv"], *extra]


def test_fp8_kernel_emulation_passes_and_wrong_descale_or_saturated_p_fail(fp8_problem):
    p = fp8_problem
    good = fa3_fp8_kernel(p["q8"], p["k8"], p["v8"], p["dq"], p["dk"], p["dv"])
    o = save(p["tmp"] / "o.npy", good)
    for extra in ([], ["--kernel-model", "fa3"]):
        r = run(check_args(p, o, *extra))
        assert r.returncode == 0, r.stdout + r.stderr
        assert "metrics: cos sim" in r.stdout and "SQNR" in r.stdout
        assert "MISMATCH" not in r.stdout
    # the kernel ran with the K descale of one (batch, kv head) off by 2x
    dk2 = p["dk"].copy()
    dk2[1, 0] *= 2
    bad = fa3_fp8_kernel(p["q8"], p["k8"], p["v8"], p["dq"], dk2, p["dv"])
    ob = save(p["tmp"] / "o_dk.npy", bad)
    for extra in ([], ["--kernel-model", "fa3"]):
        r = run(check_args(p, ob, *extra))
        assert r.returncode == 1, r.stdout + r.stderr
        assert "MISMATCH" not in r.stdout, r.stdout  # a K descale reshapes the softmax, it does not scale rows
    # ... the V descale off by 2x
    dv2 = p["dv"].copy()
    dv2[0, 1] *= 2
    bad = fa3_fp8_kernel(p["q8"], p["k8"], p["v8"], p["dq"], p["dk"], dv2)
    ob = save(p["tmp"] / "o_dv.npy", bad)
    r = run(check_args(p, ob, "--kernel-model", "fa3"))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "P/ROW-SUM MISMATCH" in r.stdout
    # P saturated at 448: exp2 offset 12 lets P reach 4096 (FlashAttention-4 before PR 2717);
    # the row sums keep the unclamped values
    sat = fa3_fp8_kernel(p["q8"], p["k8"], p["v8"], p["dq"], p["dk"], p["dv"], offset=12.0)
    os_ = save(p["tmp"] / "o_sat.npy", sat)
    for extra in ([], ["--kernel-model", "fa3"]):
        r = run(check_args(p, os_, *extra))
        assert r.returncode == 1, r.stdout + r.stderr
        assert "P/ROW-SUM MISMATCH" in r.stdout, r.stdout


def test_run_reference_is_exact_attention_on_the_decoded_values(fp8_problem):
    p = fp8_problem
    f = p["files"]
    o = p["tmp"] / "o_ref.npy"
    r = run(["run", "--impl", "reference", "-q", f["q"], "-k", f["k"], "-v", f["v"], "-o", o, "--dtype-out", "f64",
             "--qkv-format", "e4m3", "--descale-q", f["dq"], "--descale-k", f["dk"], "--descale-v", f["dv"],
             "--causal"])
    assert r.returncode == 0, r.stderr
    g = 2
    q = decode(p["q8"], E4M3) * np.repeat(p["dq"], g, axis=1)[:, None, :, None].astype(np.float64)
    k = decode(p["k8"], E4M3) * p["dk"][:, None, :, None].astype(np.float64)
    v = decode(p["v8"], E4M3) * p["dv"][:, None, :, None].astype(np.float64)
    want, _ = ref_numpy.attention_forward(q, k, v, causal=True)
    got = np.load(o)
    assert np.max(np.abs(got - want)) <= 1e-12 * max(1.0, np.max(np.abs(want)))


# ------------------------------------------------------------------------ FP4

def nvfp4_quantize(x, axis, rng_global=None):
    """NVFP4 (torchao's recipe): global = amax/(448*6); per 16 along `axis` an e4m3
    scale (amax_block/6)/global; elements x/(global*scale) rounded to e2m1."""
    glob = np.float32(np.abs(x).max() / (448.0 * 6.0))
    xm = np.moveaxis(x, axis, -1)
    shp = xm.shape
    n = shp[-1]
    nb = (n + 15) // 16
    pad = np.zeros(shp[:-1] + (nb * 16,))
    pad[..., :n] = xm
    blocks = pad.reshape(shp[:-1] + (nb, 16))
    sc = np.abs(blocks).max(axis=-1) / 6.0 / glob
    sc8 = rne_sat(np.clip(sc, 2.0 ** -9, 448.0), E4M3)
    scv = decode(sc8, E4M3)
    codes = rne_sat(blocks / (scv[..., None] * glob), E2M1).reshape(shp[:-1] + (nb * 16,))[..., :n]
    return np.moveaxis(codes, -1, axis), np.moveaxis(sc8, -1, axis), glob


def nvfp4_decode(codes, sc8, glob, axis):
    c = np.moveaxis(decode(codes, E2M1), axis, -1)
    s = np.repeat(np.moveaxis(decode(sc8, E4M3), axis, -1), 16, axis=-1)[..., :c.shape[-1]]
    return np.moveaxis(c * s * np.float64(glob), -1, axis)


def fp4_kernel(q, k, v):
    """An NVFP4 attention data path (SageAttention3's P quantization): fp32 scores on the
    dequantized inputs, P~ = 448*6*exp(s - max), per 16 keys a scale max/6 rounded to e4m3,
    P~ rounded to e2m1 against the unrounded scale, row sums from P~, bf16 output."""
    B, Sq, H, D = q.shape
    Hk = k.shape[2]
    out = np.zeros((B, Sq, H, v.shape[3]), np.float32)
    for b in range(B):
        for h in range(H):
            hk = h // (H // Hk)
            s = (q[b, :, h, :].astype(np.float32) @ k[b, :, hk, :].astype(np.float32).T) * np.float32(1 / np.sqrt(D))
            pt = (np.float32(2688.0) * np.exp(s - s.max(axis=1, keepdims=True))).astype(np.float32)
            l = pt.sum(axis=1, dtype=np.float32)
            Sk = pt.shape[1]
            acc = np.zeros((Sq, v.shape[3]), np.float32)
            for j0 in range(0, Sk, 16):
                blk = pt[:, j0:j0 + 16]
                sc = blk.max(axis=1) / np.float32(6)
                p4 = decode(rne_sat(blk / sc[:, None], E2M1), E2M1) * decode(rne_sat(sc, E4M3), E4M3)[:, None]
                acc += p4.astype(np.float32) @ v[b, j0:j0 + 16, hk, :].astype(np.float32)
            out[b, :, h, :] = acc / l[:, None]
    return bf16(out)


def pack(codes):
    c = codes.reshape(codes.shape[:-1] + (codes.shape[-1] // 2, 2))
    return (c[..., 0] | (c[..., 1] << 4)).astype(np.uint8)


def test_fp4_kernel_emulation_passes_and_wrong_global_scale_fails(tmp_path):
    if not os.path.exists(CLI):
        pytest.skip("no CLI")
    rng = np.random.default_rng(int(os.environ.get("FA_TEST_SEED", "1")) % 2**32 or None)
    B, Sq, Sk, H, Hk, D = 1, 48, 200, 2, 1, 64
    qx = rng.standard_normal((B, Sq, H, D)) * 1.5
    kx = rng.standard_normal((B, Sk, Hk, D)) * 1.5
    vx = rng.standard_normal((B, Sk, Hk, D))
    q4, qs, qg = nvfp4_quantize(qx, 3)
    k4, ks, kg = nvfp4_quantize(kx, 3)
    v4, vs, vg = nvfp4_quantize(vx, 1)  # V along tokens
    q, k, v = nvfp4_decode(q4, qs, qg, 3), nvfp4_decode(k4, ks, kg, 3), nvfp4_decode(v4, vs, vg, 1)
    files = [save(tmp_path / n, a) for n, a in
             (("q4.npy", pack(q4)), ("k4.npy", pack(k4)), ("v4.npy", pack(v4)),
              ("qs.npy", qs), ("ks.npy", ks), ("vs.npy", vs))]

    def args(out, vglob):
        return ["check", "-q", files[0], "-k", files[1], "-v", files[2], "--out", out, "--qkv-format", "e2m1",
                "--fp4-packed", "--scale-format", "nvfp4", "--scale-q", files[3], "--scale-k", files[4],
                "--scale-v", files[5], "--global-scale-q", repr(float(qg)), "--global-scale-k", repr(float(kg)),
                "--global-scale-v", repr(float(vglob))]

    good = save(tmp_path / "o.npy", fp4_kernel(q, k, v))
    r = run(args(good, vg))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "in blocks of 16 with e4m3 scales" in r.stdout
    r = run(args(good, vg) + ["--kernel-model", "sage"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "kernel model sage (P*2688 in e2m1" in r.stdout
    # the kernel used V's global scale twice (off by 2x)
    bad = save(tmp_path / "o_bad.npy", fp4_kernel(q, k, v * 2))
    r = run(args(bad, vg))
    assert r.returncode == 1, r.stdout + r.stderr
    # run --impl reference on the packed codes is the float64 model on the decoded values
    o = tmp_path / "o_ref.npy"
    r = run(["run", "--impl", "reference"] + args(o, vg)[1:7:] + ["-o", o] + args(o, vg)[9:] )
    assert r.returncode == 0, r.stderr
    want, _ = ref_numpy.attention_forward(q, k, v)
    assert np.max(np.abs(np.load(o) - want)) <= 1e-6 * np.max(np.abs(want))


# ------------------------------------------------------------------ bad input

def test_bad_low_precision_input_gets_one_line_and_exit_2(fp8_problem):
    p = fp8_problem
    f = p["files"]
    t = p["tmp"]
    o = save(t / "o.npy", fa3_fp8_kernel(p["q8"], p["k8"], p["v8"], p["dq"], p["dk"], p["dv"]))
    nan_dq = p["dq"].copy()
    nan_dq[0, 1] = np.nan
    f_nan = save(t / "dq_nan.npy", nan_dq)
    f_shape = save(t / "dq_shape.npy", p["dq"][:, :1].copy())
    q_nan = p["q8"].copy()
    q_nan[0, 3, 1, 5] = 0x7F
    f_qnan = save(t / "q_nan.npy", q_nan)
    f_f32 = save(t / "q_f32.npy", p["q8"].astype(np.float32))
    base = ["check", "-q", f["q"], "-k", f["k"], "-v", f["v"], "--out", o]
    cases = [
        (base + ["--qkv-format", "e4m3", "--descale-q", f_nan], "dq_nan.npy): scale [0, 1] is NaN"),
        (base + ["--qkv-format", "e4m3", "--descale-q", "1e39"], "not a finite float32 scale"),
    ] + [  # a non-zero number that reads as 0, or rounds to 0 in float32, is not a zero scale
        (base + ["--qkv-format", "e4m3", "--descale-v", x], f"--descale-v: {x} is too small")
        for x in ("1e-400", "1e-50", "-1e-320")
    ] + [
        (base + ["--qkv-format", "e4m3", "--descale-q", f_shape], "should be [batch, heads_k]"),
        (["check", "-q", f_qnan, "-k", f["k"], "-v", f["v"], "--out", o, "--qkv-format", "e4m3"], "NaN"),
        (["check", "-q", f_f32, "-k", f["k"], "-v", f["v"], "--out", o, "--qkv-format", "e4m3"], "|u1"),
        (base + ["--qkv-format", "fp8"], "--qkv-format"),
        (base + ["--qkv-format", "e4m3", "--fp4-packed"], "--fp4-packed"),
        (base + ["--descale-q", f["dq"]], "--qkv-format"),
        (base + ["--qkv-format", "e4m3", "--scale-q", f["q"]], "--scale-format"),
        (base + ["--qkv-format", "e4m3", "--kernel-model", "sage9"], "--kernel-model"),
        (base + ["--kernel-model", "fa3"], "--qkv-format"),
        (base + ["--qkv-format", "e4m3", "--cache-seqlens", f["dq"]], "not supported"),
    ] + [  # a zero global scale would be read as "not given" (1); 1e-50 is 0 in float32
        (base + ["--qkv-format", "e2m1", "--scale-q", f["q"], "--scale-format", "nvfp4", "--global-scale-q", g],
         f"--global-scale-q: {g} is not a finite float32 scale > 0") for g in ("0", "1e-50", "-2")
    ]
    for args, needle in cases:
        r = run(args)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and needle in lines[0], (args, r.stderr)


# ------------------------------------------------------------------- python API

def test_python_dequantize_and_check_report_the_metrics(fp8_problem):
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
    os.environ.setdefault("FA_BUILD", BUILD)
    import flashattn
    try:
        flashattn.library()
    except OSError as e:  # e.g. the sanitizer build makes no shared library
        pytest.skip(f"libflashattn.so not available: {e}")
    p = fp8_problem
    q = flashattn.dequantize(p["q8"], "e4m3", descale=p["dq"])
    k = flashattn.dequantize(p["k8"], "e4m3", descale=p["dk"])
    v = flashattn.dequantize(p["v8"], "e4m3", descale=p["dv"])
    assert np.array_equal(q, decode(p["q8"], E4M3) * np.repeat(p["dq"], 2, axis=1)[:, None, :, None])
    assert np.array_equal(v, decode(p["v8"], E4M3) * p["dv"][:, None, :, None])
    out = ref_numpy.bf16_bits_to_float64(fa3_fp8_kernel(p["q8"], p["k8"], p["v8"], p["dq"], p["dk"], p["dv"]))
    rep = flashattn.check(q, k, v, out, qkv_format="e4m3", kernel_model="fa3")
    assert rep.passed, rep.text
    assert rep.qkv_format == "e4m3" and rep.p_format == "e4m3" and rep.kernel_model == 1
    ref, _ = ref_numpy.attention_forward(q, k, v)
    err = out - ref
    # the portable metrics, recomputed here from their definitions
    assert rep.cos_sim == pytest.approx(np.sum(out * ref) / np.sqrt(np.sum(out ** 2) * np.sum(ref ** 2)), rel=1e-9)
    assert rep.rel_l1 == pytest.approx(np.sum(np.abs(err)) / np.sum(np.abs(ref)), rel=1e-6)
    assert rep.rmse == pytest.approx(np.sqrt(np.mean(err ** 2)), rel=1e-6)
    assert rep.sqnr_db == pytest.approx(10 * np.log10(np.sum(ref ** 2) / np.sum(err ** 2)), rel=1e-6)
    assert rep.sqnr_db > 25.0  # torchao's FP8 gate
    assert "metrics: cos sim" in rep.text
    # the same output is wrong for a V descale off by 2x
    bad = flashattn.check(q, k, v, out * 2, qkv_format="e4m3")
    assert not bad.passed and bad.p_mismatch
    # and any check, low-precision or not, carries the metrics
    plain = flashattn.check(q, k, v, out, dtype="bf16")
    assert plain.cos_sim == pytest.approx(rep.cos_sim) and plain.qkv_format == "none"
    with pytest.raises(flashattn.FlashAttnError, match="NaN"):
        c = p["q8"].copy()
        c[0, 0, 0, 0] = 0x7F
        flashattn.dequantize(c, "e4m3", descale=p["dq"])
    # NVFP4 in Python agrees with the decoder here
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 20, 2, 32))
    c4, s8, g = nvfp4_quantize(x, 1)
    got = flashattn.dequantize(pack(c4), "e2m1", packed=True, block_scales=s8, scale_format="nvfp4",
                               global_scale=g, along="tokens")
    assert np.array_equal(got, nvfp4_decode(c4, s8, np.float32(g), 1))
    # MXFP4 (e8m0 scales, one per 32 elements, no global scale) in Python and through the CLI
    e8 = rng.integers(120, 134, size=(1, 20, 2, 1)).astype(np.uint8)
    c4m = rng.integers(0, 16, size=(1, 20, 2, 32)).astype(np.uint8)
    e2m1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])
    want_mx = e2m1[c4m] * np.ldexp(1.0, e8.astype(np.int64) - 127)
    got = flashattn.dequantize(pack(c4m), "e2m1", packed=True, block_scales=e8, scale_format="mxfp4")
    assert np.array_equal(got, want_mx)
    if os.path.exists(CLI):
        t = p["tmp"]
        fq, fs = save(t / "mx_q.npy", c4m), save(t / "mx_s.npy", e8)
        fv_s = save(t / "mx_vs.npy", rng.integers(120, 134, size=(1, 1, 2, 32)).astype(np.uint8))
        o_mx = t / "mx_o.npy"
        r = run(["run", "--impl", "reference", "-q", fq, "-k", fq, "-v", fq, "-o", o_mx, "--qkv-format", "e2m1",
                 "--scale-format", "mxfp4", "--scale-q", fs, "--scale-k", fs, "--scale-v", fv_s])
        assert r.returncode == 0, r.stderr
        vals = e2m1[c4m]
        vv = vals * np.ldexp(1.0, np.load(fv_s).astype(np.int64) - 127)  # V's scales along tokens
        want_o, _ = ref_numpy.attention_forward(want_mx, want_mx, vv)
        assert np.max(np.abs(np.load(o_mx) - want_o)) <= 1e-6 * np.max(np.abs(want_o))
    # scale arguments that would be ignored, or read as something else, are refused
    args = dict(packed=True, block_scales=s8, scale_format="nvfp4", along="tokens")
    for bad_g in (0.0, 1e-50, -1.0, float("inf"), float("nan")):  # 0 (and 1e-50 -> 0) would read as 1
        with pytest.raises(ValueError, match="global_scale must be a finite float32 > 0"):
            flashattn.dequantize(pack(c4), "e2m1", global_scale=bad_g, **args)
    with pytest.raises(ValueError, match="MXFP4 has no global scale"):
        flashattn.dequantize(pack(c4), "e2m1", **dict(args, scale_format="mxfp4"), global_scale=2.0)
    with pytest.raises(ValueError, match="global_scale goes with NVFP4 block_scales"):
        flashattn.dequantize(p["q8"], "e4m3", descale=p["dq"], global_scale=2.0)
    with pytest.raises(ValueError, match="scale_format 'nvfp4' needs block_scales"):
        flashattn.dequantize(p["q8"], "e4m3", descale=p["dq"], scale_format="nvfp4")
    with pytest.raises(ValueError, match="along='tokens' needs block_scales"):
        flashattn.dequantize(p["q8"], "e4m3", along="tokens")
    with pytest.raises(TypeError, match="packed must be True or False"):
        flashattn.dequantize(pack(c4), "e2m1", **dict(args, packed="False"))
    with pytest.raises(ValueError, match="not a finite float32 scale"):  # as the CLI says it
        flashattn.dequantize(p["q8"], "e4m3", descale=1e39)
    for bad in ("2", True, np.array("2")):  # float() would take them
        with pytest.raises(TypeError, match="descale must be a number"):
            flashattn.dequantize(p["q8"], "e4m3", descale=bad)
        with pytest.raises(TypeError, match="global_scale must be a number"):
            flashattn.dequantize(pack(c4), "e2m1", global_scale=bad, **args)


@pytest.mark.parametrize("fmt,name,p_fmt", [(E5M2, "e5m2", E5M2), (INT8, "int8", E4M3)])
def test_e5m2_and_int8_kernels_pass_and_a_wrong_descale_fails(fp8_problem, fmt, name, p_fmt):
    """e5m2 Q, K, V with P in e5m2; INT8 Q, K, V with P in e4m3 (SageAttention's P):
    per-tensor descales this time (a number on the command line)."""
    p = fp8_problem
    t = p["tmp"]
    B, Hk = p["dk"].shape
    codes, scales = {}, {}
    for n in "qkv":
        x = p["raw"][n]
        amax = np.abs(x).max()
        ds = np.float32(amax / {E5M2: 57344.0, INT8: 127.0}[fmt])
        codes[n] = rne_sat(x / ds, fmt)
        scales[n] = ds
    files = {n: save(t / f"{n}_{name}.npy", codes[n]) for n in "qkv"}
    full = {n: np.full((B, Hk), scales[n], np.float32) for n in "qkv"}

    def args(out, *extra):
        return ["check", "-q", files["q"], "-k", files["k"], "-v", files["v"], "--out", out, "--qkv-format", name,
                "--descale-q", repr(float(scales["q"])), "--descale-k", repr(float(scales["k"])),
                "--descale-v", repr(float(scales["v"])), *extra]

    good = fa3_fp8_kernel(codes["q"], codes["k"], codes["v"], full["q"], full["k"], full["v"], fmt=fmt, p_fmt=p_fmt)
    o = save(t / f"o_{name}.npy", good)
    for extra in ([], ["--kernel-model", "fa3"]):
        r = run(args(o, *extra))
        assert r.returncode == 0, r.stdout + r.stderr
    bad = fa3_fp8_kernel(codes["q"], codes["k"], codes["v"], full["q"], full["k"] * 2, full["v"], fmt=fmt,
                         p_fmt=p_fmt)
    r = run(args(save(t / f"o_{name}_bad.npy", bad)))
    assert r.returncode == 1, r.stdout + r.stderr


def test_sageattention_style_fp8_kernel_passes_the_sage_model(fp8_problem):
    """SageAttention2's P path (static offset log2 448, blocks of 64 first to last) on FP8 inputs."""
    p = fp8_problem
    out = fa3_fp8_kernel(p["q8"], p["k8"], p["v8"], p["dq"], p["dk"], p["dv"], offset=np.log2(448.0),
                         block=64, reverse=False)
    o = save(p["tmp"] / "o_sage.npy", out)
    for extra in ([], ["--kernel-model", "sage"]):
        r = run(check_args(p, o, *extra))
        assert r.returncode == 0, r.stdout + r.stderr
    assert "kernel model sage (P*448" in r.stdout
    sat = fa3_fp8_kernel(p["q8"], p["k8"], p["v8"], p["dq"], p["dk"], p["dv"], offset=np.log2(448.0) + 3,
                         block=64, reverse=False)
    r = run(check_args(p, save(p["tmp"] / "o_sage_sat.npy", sat), "--kernel-model", "sage"))
    assert r.returncode == 1 and "P/ROW-SUM MISMATCH" in r.stdout, r.stdout
