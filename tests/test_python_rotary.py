"""tests/test_python_rotary.py — rotary embedding inside attention_with_kvcache (and check).

The expectation is tests/ref_numpy.py's independent float64 model
(kvcache_forward with rotary_cos/rotary_sin: apply_rotary on q and k_new at
FlashAttention's positions). The library rounds the rotated rows to float32
(as FlashAttention rounds to its input dtype), so O may differ from the float64
model by a few float32 ulps of the inputs: 1e-5 of max|O|; a wrong pairing or
position moves O by order 0.1.
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
B, H, HK, D, DV, SC, BC, SQ, SN, RO = 3, 4, 2, 16, 8, 30, 4, 3, 2, 40


def tables(rd):
    pos = np.arange(RO)[:, None]
    ang = pos * 100.0 ** (-2.0 * np.arange(rd // 2)[None, :] / rd)
    return np.cos(ang), np.sin(ang)


def make(rng):
    q = rng.uniform(-2, 2, (B, SQ, H, D)).astype(np.float32)
    kc = rng.uniform(-2, 2, (BC, SC, HK, D)).astype(np.float32)
    vc = rng.uniform(-1, 1, (BC, SC, HK, DV)).astype(np.float32)
    kn = rng.uniform(-2, 2, (B, SN, HK, D)).astype(np.float32)
    vn = rng.uniform(-1, 1, (B, SN, HK, DV)).astype(np.float32)
    return q, kc, vc, kn, vn


@pytest.mark.parametrize("impl", ["flash", "reference", "standard"])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("rd", [D, 6])
@pytest.mark.parametrize("mask", [dict(), dict(causal=True), dict(window=(4, -1))])
def test_rotary_matches_numpy_model(impl, interleaved, rd, mask):
    rng = np.random.default_rng(SEED + rd + 2 * interleaved)
    q, kc, vc, kn, vn = make(rng)
    cos, sin = tables(rd)
    seqlens = np.array([5, 0, 12], np.int32)
    idx = np.array([2, 0, 3], np.int32)
    want, want_lse = ref_numpy.kvcache_forward(q, kc, vc, seqlens, kn, vn, idx, rotary_cos=cos, rotary_sin=sin,
                                               rotary_interleaved=interleaved, **mask)
    kc2, vc2 = kc.copy(), vc.copy()
    o, lse = fa.attention_with_kvcache(q, kc2, vc2, kn, vn, cache_seqlens=seqlens, cache_batch_idx=idx,
                                       rotary_cos=cos, rotary_sin=sin, rotary_interleaved=interleaved, impl=impl,
                                       return_lse=True, **mask)
    assert np.max(np.abs(o - want)) <= 1e-5 * np.max(np.abs(want))
    fin = np.isfinite(want_lse)  # (causal: sequence 1 has 2 keys for 3 queries: its first row is empty)
    assert np.array_equal(np.isneginf(lse), ~fin)
    assert np.max(np.abs(lse[fin] - want_lse[fin])) <= 1e-5 * np.max(np.abs(want_lse[fin]))
    for b in range(B):  # the appended keys are the rotated ones; dims past rd untouched
        rot = ref_numpy.apply_rotary(kn[b], cos, sin, seqlens[b] + np.arange(SN), interleaved)
        got = kc2[idx[b], seqlens[b]:seqlens[b] + SN]
        assert np.max(np.abs(got - rot)) <= 1e-6 * np.max(np.abs(rot))
        assert np.array_equal(got[..., rd:], kn[b][..., rd:])
    # the other pairing is far off (the check can fail)
    o2 = fa.attention_with_kvcache(q, kc.copy(), vc.copy(), kn, vn, cache_seqlens=seqlens, cache_batch_idx=idx,
                                   rotary_cos=cos, rotary_sin=sin, rotary_interleaved=not interleaved, impl=impl,
                                   **mask)
    assert np.max(np.abs(o2 - want)) > 1e-2


def test_check_with_rotary():
    rng = np.random.default_rng(SEED + 100)
    q, kc, vc, kn, vn = make(rng)
    cos, sin = tables(D)
    seqlens = np.array([5, 0, 12], np.int32)
    o, lse = fa.attention_with_kvcache(q, kc.copy(), vc.copy(), kn, vn, cache_seqlens=seqlens, rotary_cos=cos,
                                       rotary_sin=sin, causal=True, return_lse=True)
    args = dict(cache_seqlens=seqlens, k_new=kn, v_new=vn, rotary_cos=cos, rotary_sin=sin, causal=True)
    assert fa.check(q, kc, vc, o, lse, **args)
    o2 = fa.attention_with_kvcache(q, kc.copy(), vc.copy(), kn, vn, cache_seqlens=seqlens, causal=True)
    assert not fa.check(q, kc, vc, o2, **args)


def test_bad_rotary_is_refused():
    rng = np.random.default_rng(SEED + 200)
    q, kc, vc, kn, vn = make(rng)
    cos, sin = tables(D)
    seqlens = np.array([5, 0, 12], np.int32)
    with pytest.raises(fa.FlashAttnError, match="rotary needs a KV cache with new keys"):
        fa.attention_with_kvcache(q, kc, vc, cache_seqlens=seqlens, rotary_cos=cos, rotary_sin=sin)
    with pytest.raises(fa.FlashAttnError, match=r"cos/sin have 13 positions, but sequence 2 needs position 13"):
        fa.attention_with_kvcache(q, kc.copy(), vc.copy(), kn, vn, cache_seqlens=seqlens, rotary_cos=cos[:13],
                                  rotary_sin=sin[:13])
    with pytest.raises(ValueError, match="go together"):
        fa.attention_with_kvcache(q, kc.copy(), vc.copy(), kn, vn, cache_seqlens=seqlens, rotary_cos=cos)
