"""tests/test_python.py — python/flashattn.py, the ctypes wrapper, against numpy.

Needs build/libflashattn.so (tests/run_tests.sh sets FA_BUILD to the build
directory). Checks that the struct layouts match the library, that
attention() agrees with an independent float64 numpy model (BSHD and strided
BHSD views, GQA, causal with seqlen_q != seqlen_k, bf16 bit patterns, LSE), and
that check() gives the library's verdicts: correct low-precision outputs pass,
wrong ones fail with the worst element located, bad input raises.
"""

import os
import subprocess
import sys
import zlib

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))

import flashattn as fa  # noqa: E402

try:
    fa.library()
except OSError as e:  # pragma: no cover - only without a build
    pytest.skip(f"libflashattn.so not available: {e}", allow_module_level=True)


def bf16_bits(x):
    b = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_value(bits):
    return (np.asarray(bits).astype(np.uint32) << 16).view(np.float32)


def model(q, k, v, causal=False, scale=None):
    """float64 attention in BSHD, bottom-right causal, GQA by repeating kv heads."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    B, Sq, H, d = q.shape
    Sk, Hk = k.shape[1], k.shape[2]
    k = np.repeat(k, H // Hk, axis=2)
    v = np.repeat(v, H // Hk, axis=2)
    s = np.einsum("bihd,bjhd->bhij", q, k) * (scale if scale else 1 / np.sqrt(d))
    if causal:
        i = np.arange(Sq)[:, None]
        j = np.arange(Sk)[None, :]
        s = np.where(j <= i + Sk - Sq, s, -np.inf)
    m = s.max(-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    p = np.exp(s - m)
    l = p.sum(-1, keepdims=True)
    o = np.einsum("bhij,bjhd->bihd", np.divide(p, l, out=np.zeros_like(p), where=l > 0), v)
    with np.errstate(divide="ignore"):
        lse = (m + np.log(l))[..., 0]
    return o, lse


@pytest.fixture
def rng(request):
    seed = int(os.environ.get("FA_TEST_SEED", "0")) + zlib.crc32(request.node.name.encode())
    return np.random.default_rng(seed)


def qkv(rng, B=2, Sq=24, Sk=40, H=4, Hk=2, d=16, dv=None, qscale=1.0):
    dv = dv or d
    q = (qscale * rng.standard_normal((B, Sq, H, d))).astype(np.float32)
    k = rng.standard_normal((B, Sk, Hk, d)).astype(np.float32)
    v = rng.standard_normal((B, Sk, Hk, dv)).astype(np.float32)
    return q, k, v


# ---- the binding itself ------------------------------------------------------------

def test_struct_layouts_match_the_library():
    lib = fa.library()
    for which, cls in enumerate((fa._Tensor, fa._Options, fa._CheckOptions, fa._Report)):
        assert lib.fa_check_abi_size(which) == __import__("ctypes").sizeof(cls)


# ---- attention ---------------------------------------------------------------------

@pytest.mark.parametrize("impl", ["flash", "reference", "standard"])
def test_attention_matches_numpy_model_when_causal_gqa(rng, impl):
    q, k, v = qkv(rng, Sq=30, Sk=20)  # causal with Sq > Sk: the first 10 rows see nothing
    o, lse = fa.attention(q, k, v, causal=True, impl=impl, return_lse=True)
    o_ref, lse_ref = model(q, k, v, causal=True)
    assert o.shape == o_ref.shape and o.dtype == np.float32
    np.testing.assert_allclose(o, o_ref, atol=2e-5)
    assert np.all(np.isneginf(lse[:, :, :10]))
    np.testing.assert_allclose(lse[:, :, 10:], lse_ref[:, :, 10:], atol=2e-5)
    assert np.all(o[:, :10] == 0)


def test_attention_accepts_strided_bhsd_views_and_dv(rng):
    q, k, v = qkv(rng, d=16, dv=8)
    qt = np.ascontiguousarray(q.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)  # BHSD memory
    o = fa.attention(qt, k, v, impl="reference", out_dtype=np.float64)
    np.testing.assert_allclose(o, model(q, k, v)[0], atol=1e-12)


def test_attention_reads_bf16_bit_patterns(rng):
    q, k, v = qkv(rng)
    qb, kb, vb = bf16_bits(q), bf16_bits(k), bf16_bits(v)
    o = fa.attention(qb, kb, vb, impl="reference", out_dtype="bf16")
    assert o.dtype == np.uint16
    ref = model(bf16_value(qb), bf16_value(kb), bf16_value(vb))[0]
    np.testing.assert_allclose(bf16_value(o), ref, rtol=2 ** -8, atol=1e-6)


def test_amx_reports_and_counts_the_calls_on_the_tiles(rng):
    """fa.amx(): available iff no reason; under FA_AMX=1 (read once per process: a fresh one
    each) a bf16 call with d 64 runs on the tiles exactly when AMX is available (calls + 1),
    float32 inputs and FA_AMX=0 never do, and the AMX output is float32-class against the
    float64 reference."""
    a = fa.amx()
    assert set(a) == {"available", "why_not", "calls"}
    assert a["available"] == (a["why_not"] is None) and (a["why_not"] is None or a["why_not"])
    prog = """
import sys, numpy as np
sys.path.insert(0, sys.argv[1])
import flashattn as fa
rng = np.random.default_rng(int(sys.argv[3]))
q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((1, 40, 2, 64), (1, 70, 2, 64), (1, 70, 2, 64)))
if sys.argv[2] == "bf16":
    q, k, v = ((x.view(np.uint32) >> 16).astype(np.uint16) for x in (q, k, v))
ref = fa.attention(q, k, v, impl="reference")
before = fa.amx()["calls"]
o = fa.attention(q, k, v)
print(fa.amx()["calls"] - before, float(np.max(np.abs(o - ref))))
"""
    for env, dt, want in (("1", "bf16", int(a["available"])), ("0", "bf16", 0), ("1", "f32", 0)):
        r = subprocess.run([sys.executable, "-c", prog, os.path.join(os.path.dirname(HERE), "python"), dt,
                            str(int(rng.integers(1 << 31)))], capture_output=True, text=True,
                           env=dict(os.environ, FA_AMX=env))
        assert r.returncode == 0, r.stderr
        calls, err = r.stdout.split()
        assert int(calls) == want and float(err) < 1e-5, (env, dt, r.stdout)


def test_attention_raises_with_the_library_message(rng):
    q, k, v = qkv(rng, H=3, Hk=2)
    with pytest.raises(fa.FlashAttnError, match="not a multiple"):
        fa.attention(q, k, v)


# ---- check -------------------------------------------------------------------------

def test_check_passes_reference_rounded_to_bf16_with_lse(rng):
    q, k, v = qkv(rng, Sq=16, Sk=48)
    qb, kb, vb = bf16_bits(q), bf16_bits(k), bf16_bits(v)
    o, lse = model(bf16_value(qb), bf16_value(kb), bf16_value(vb), causal=True)
    rep = fa.check(qb, kb, vb, bf16_bits(o), lse.astype(np.float32), causal=True)
    assert rep.passed and bool(rep)
    assert rep.dtype == "bf16"  # inferred from the uint16 arrays
    assert rep.lse_checked and rep.lse_pass
    assert "verdict: PASS" in rep.text and "rule: bf16 emulation" in rep.text
    assert 0 < rep.ratio <= 2


def test_check_fails_a_perturbed_row_and_locates_it(rng):
    q, k, v = qkv(rng)
    o = model(q, k, v)[0].astype(np.float32)
    o[1, 7, 2, :] += 0.01
    rep = fa.check(q, k, v, o, dtype="f32")
    assert not rep.passed
    assert rep.worst[:3] == (1, 7, 2)
    assert rep.rows_failed == 1
    assert rep.fail_rows[0]["row"] == 7 and rep.fail_rows[0]["head"] == 2
    assert rep.head_fail.tolist() == [0, 0, o.shape[3], 0]
    assert "failing row (batch 1, row 7, head 2)" in rep.text


def test_check_fails_scale_off_by_one_percent_in_bf16(rng):
    q, k, v = qkv(rng, B=1, Sq=16, Sk=1024, H=2, Hk=2, d=32, qscale=3.0)
    qb, kb, vb = bf16_bits(q), bf16_bits(k), bf16_bits(v)
    o = model(bf16_value(qb), bf16_value(kb), bf16_value(vb), scale=1.01 / np.sqrt(32))[0]
    rep = fa.check(qb, kb, vb, bf16_bits(o))
    assert not rep.passed
    assert rep.ratio > 2


def test_check_sampled_rows_and_explicit_tolerance(rng):
    q, k, v = qkv(rng, Sq=50, Sk=60)
    o = model(q, k, v, causal=True)[0].astype(np.float16)
    rep = fa.check(q, k, v, o, causal=True, sample_rows=5, seed=9)
    assert rep.passed and rep.dtype == "f16"
    assert rep.rows_checked == 2 * 4 * 5 and rep.sample_rows == 5
    tight = fa.check(q, k, v, o, causal=True, atol=1e-7)
    assert not tight.passed and tight.use_tolerance


def test_check_nan_output_fails_and_bad_input_raises(rng):
    q, k, v = qkv(rng)
    o = model(q, k, v)[0]
    o[0, 0, 0, 0] = np.nan
    rep = fa.check(q, k, v, o, atol=1.0)
    assert not rep.passed and rep.n_nonfinite == 1
    with pytest.raises(fa.FlashAttnError, match="out"):
        fa.check(q, k, v, o[:, :5])
    k[0, 0, 0, 0] = np.inf
    with pytest.raises(fa.FlashAttnError, match="finite"):
        fa.check(q, k, v, o)


def test_check_refuses_inputs_beyond_f16_instead_of_passing_anything(rng):
    # fa_check's f16 emulation rounds inputs to f16: 7e4 would be inf there and
    # the bound infinite, so any output would pass; the library refuses it.
    q, k, v = qkv(rng)
    o = model(q, k, v)[0]
    o[0, 0, 0, 0] += 0.5  # wrong
    k[0, 1, 0, 2] = 7e4
    with pytest.raises(fa.FlashAttnError, match="65504"):
        fa.check(q, k, v, o, dtype="f16")
    assert not fa.check(q, k, v, o, atol=1e-3).passed  # an explicit tolerance still checks
    k[0, 1, 0, 2] = 6e4  # in range: a finite bound, and the wrong output fails
    o = model(q, k, v)[0]
    o[0, 0, 0, 0] += 0.5
    rep = fa.check(q, k, v, o, dtype="f16")
    assert not rep.passed and np.isfinite(rep.bound)


def test_check_matches_flash_output_in_f32(rng):
    q, k, v = qkv(rng, Sq=33, Sk=70, d=64)
    o, lse = fa.attention(q, k, v, causal=True, window=(20, 0), return_lse=True)
    rep = fa.check(q, k, v, o, lse, causal=True, window=(20, 0))
    assert rep.passed, rep.text
