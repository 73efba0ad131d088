"""tests/test_python_sinks.py — attention sinks through python/flashattn.py.

The expectation is tests/ref_numpy.py's independent float64 model
(attention_forward with sinks, attention_backward_sinks). flash and reference
run in float32 here on a few dozen keys; 2e-6 of max|O| (gradients: 1e-5 of
max|G|) is ~10x the measured float32 error and far below what a sink dropped
from, or added to, the numerator changes (order 0.1).
"""

import os
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))

import flashattn as fa  # noqa: E402
sys.path.insert(0, HERE)
import ref_numpy  # noqa: E402  (tests/, the independent float64 model)

try:
    fa.library()
except OSError as e:  # pragma: no cover - only without a build
    pytest.skip(f"libflashattn.so not available: {e}", allow_module_level=True)

SEED = int(os.environ.get("FA_TEST_SEED", "0")) or np.random.SeedSequence().entropy % (2 ** 32)
B, SQ, SK, H, HK, D, DV = 2, 9, 6, 4, 2, 16, 8

OPTS = [dict(), dict(causal=True), dict(window=(2, 0), softcap=4.0), dict(causal=True, alibi=True)]


def make(rng):
    q = rng.uniform(-1.5, 1.5, (B, SQ, H, D)).astype(np.float32)
    k = rng.uniform(-1.5, 1.5, (B, SK, HK, D)).astype(np.float32)
    v = rng.uniform(-1, 1, (B, SK, HK, DV)).astype(np.float32)
    do = rng.uniform(-1, 1, (B, SQ, H, DV)).astype(np.float32)
    sinks = rng.uniform(-1, 2.5, (H,)).astype(np.float32)
    slopes = rng.uniform(0.1, 0.6, (H,)).astype(np.float32)
    return q, k, v, do, sinks, slopes


def split(opts, slopes):
    """(library kwargs, reference kwargs) of one option case."""
    lib = dict(opts)
    ref = dict(opts)
    if lib.pop("alibi", False):
        ref.pop("alibi")
        lib["alibi_slopes"] = slopes
        ref["alibi"] = slopes
    if "window" in ref:
        ref["window"] = tuple(ref["window"])
    return lib, ref


@pytest.mark.parametrize("impl", ["flash", "reference", "standard"])
@pytest.mark.parametrize("case", range(len(OPTS)))
def test_attention_with_sinks_matches_numpy_model(impl, case):
    rng = np.random.default_rng(SEED + case)
    q, k, v, _, sinks, slopes = make(rng)
    lib, ref = split(OPTS[case], slopes)
    o, lse = fa.attention(q, k, v, sinks=sinks, impl=impl, return_lse=True, **lib)
    o_ref, lse_ref = ref_numpy.attention_forward(q, k, v, sinks=sinks, **ref)
    assert np.max(np.abs(o - o_ref)) <= 2e-6 * max(1.0, np.max(np.abs(o_ref)))
    assert np.max(np.abs(lse - lse_ref)) <= 2e-6 * max(1.0, np.max(np.abs(lse_ref)))
    if OPTS[case].get("causal"):  # rows 0..SQ-SK-1 see no key: O = 0, LSE = sink
        assert np.all(o[:, :SQ - SK] == 0)
        assert np.all(lse[:, :, :SQ - SK] == sinks[None, :, None])
    # the sink matters: without it the result is far off
    o_nosink = fa.attention(q, k, v, impl=impl, **lib)
    assert np.max(np.abs(o_nosink - o_ref)) > 1e-2


@pytest.mark.parametrize("impl", ["flash", "reference"])
@pytest.mark.parametrize("case", range(len(OPTS)))
def test_grad_with_sinks_matches_numpy_model(impl, case):
    rng = np.random.default_rng(SEED + 10 + case)
    q, k, v, do, sinks, slopes = make(rng)
    lib, ref = split(OPTS[case], slopes)
    dq, dk, dv, ds = fa.grad(q, k, v, do, sinks=sinks, impl=impl, **lib)
    want = ref_numpy.attention_backward_sinks(q, k, v, do, sinks, **ref)
    for got, exp, name in zip((dq, dk, dv, ds), want, ("dq", "dk", "dv", "dsinks")):
        err = np.max(np.abs(got - exp))
        assert err <= 1e-5 * max(1.0, np.max(np.abs(exp))), f"{name}: {err}"
    assert np.max(np.abs(want[3])) > 1e-3  # dsinks is not trivially 0


def test_numpy_model_dsinks_is_the_derivative():
    """The model's own backward against central differences of its forward (float64)."""
    rng = np.random.default_rng(SEED + 20)
    q, k, v, do, sinks, _ = (x.astype(np.float64) for x in make(rng))
    _, _, _, ds = ref_numpy.attention_backward_sinks(q, k, v, do, sinks, causal=True)
    for h in range(H):
        e = np.zeros(H)
        e[h] = 1e-6
        lp = np.sum(ref_numpy.attention_forward(q, k, v, sinks=sinks + e, causal=True)[0] * do)
        lm = np.sum(ref_numpy.attention_forward(q, k, v, sinks=sinks - e, causal=True)[0] * do)
        assert abs((lp - lm) / 2e-6 - ds[h]) <= 1e-6 * max(1.0, abs(ds[h]))


def test_check_with_sinks():
    rng = np.random.default_rng(SEED + 30)
    q, k, v, _, sinks, _ = make(rng)
    o, lse = fa.attention(q, k, v, sinks=sinks, causal=True, return_lse=True)
    assert fa.check(q, k, v, o, lse, sinks=sinks, causal=True)
    o2, lse2 = fa.attention(q, k, v, causal=True, return_lse=True)
    rep = fa.check(q, k, v, o2, lse2, sinks=sinks, causal=True)
    assert not rep.passed and not rep.out_pass and not rep.lse_pass


def test_sinks_with_varlen_and_kvcache():
    rng = np.random.default_rng(SEED + 40)
    sinks = rng.uniform(-1, 2, (H,)).astype(np.float32)
    cuq = np.array([0, 3, 8, 12], np.int32)
    cuk = np.array([0, 5, 5, 11], np.int32)
    q = rng.uniform(-1.5, 1.5, (12, H, D)).astype(np.float32)
    k = rng.uniform(-1.5, 1.5, (11, HK, D)).astype(np.float32)
    v = rng.uniform(-1, 1, (11, HK, DV)).astype(np.float32)
    o, lse = fa.attention(q, k, v, sinks=sinks, causal=True, return_lse=True, cu_seqlens_q=cuq, cu_seqlens_k=cuk)
    o_ref, lse_ref = ref_numpy.varlen_forward(q, k, v, cuq, cuk, sinks=sinks, causal=True)
    assert np.max(np.abs(o - o_ref)) <= 2e-6 and np.max(np.abs(lse - lse_ref)) <= 1e-5
    kc = rng.uniform(-1.5, 1.5, (2, 20, HK, D)).astype(np.float32)
    vc = rng.uniform(-1, 1, (2, 20, HK, DV)).astype(np.float32)
    qc = rng.uniform(-1.5, 1.5, (2, 3, H, D)).astype(np.float32)
    kn = rng.uniform(-1.5, 1.5, (2, 3, HK, D)).astype(np.float32)
    vn = rng.uniform(-1, 1, (2, 3, HK, DV)).astype(np.float32)
    seqlens = np.array([9, 0], np.int32)
    o_ref, lse_ref = ref_numpy.kvcache_forward(qc, kc, vc, seqlens, kn, vn, sinks=sinks, causal=True)
    o, lse = fa.attention_with_kvcache(qc, kc, vc, kn, vn, cache_seqlens=seqlens, sinks=sinks, causal=True,
                                       return_lse=True)
    assert np.max(np.abs(o - o_ref)) <= 2e-6 and np.max(np.abs(lse - lse_ref)) <= 1e-5


def test_bad_sinks_are_refused():
    rng = np.random.default_rng(SEED + 50)
    q, k, v, do, sinks, _ = make(rng)
    with pytest.raises(fa.FlashAttnError, match=r"sinks: shape must be \[heads=4\]"):
        fa.attention(q, k, v, sinks=sinks[:3])
    bad = sinks.copy()
    bad[1] = np.inf
    with pytest.raises(fa.FlashAttnError, match=r"sinks: element \[1\] is inf"):
        fa.attention(q, k, v, sinks=bad)
