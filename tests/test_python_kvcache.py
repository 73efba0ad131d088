"""tests/test_python_kvcache.py — flashattn.attention_with_kvcache (a KV cache, paged or not).

The expectation is tests/ref_numpy.py's independent float64 model
(kvcache_forward: each sequence attends to its cache rows then its new keys,
masks aligned to that count). flash and reference run in float32 over at most
~40 keys: 2e-6 of max|O| leaves ~10x margin over the measured error and
catches any wrong row, page or offset. The append must land in the caches in
place; a paged cache must give the contiguous cache's bits.
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
B, H, HK, D, DV, SC, BC = 3, 4, 2, 16, 8, 40, 4


def make(rng, sq, sn):
    q = rng.uniform(-2, 2, (B, sq, H, D)).astype(np.float32)
    kc = rng.uniform(-2, 2, (BC, SC, HK, D)).astype(np.float32)
    vc = rng.uniform(-1, 1, (BC, SC, HK, DV)).astype(np.float32)
    kn = rng.uniform(-2, 2, (B, sn, HK, D)).astype(np.float32) if sn else None
    vn = rng.uniform(-1, 1, (B, sn, HK, DV)).astype(np.float32) if sn else None
    return q, kc, vc, kn, vn


MASKS = [dict(), dict(causal=True), dict(causal=True, window=(5, -1), softcap=20.0)]


@pytest.mark.parametrize("sq, sn", [(1, 0), (1, 1), (4, 3)])
@pytest.mark.parametrize("mask", range(len(MASKS)))
@pytest.mark.parametrize("impl", ["flash", "reference", "standard"])
@pytest.mark.parametrize("indexed", [False, True])
def test_kvcache_matches_the_float64_model(sq, sn, mask, impl, indexed):
    rng = np.random.default_rng([SEED, sq, sn, mask, int(indexed)])
    q, kc, vc, kn, vn = make(rng, sq, sn)
    seqlens = np.array([10, 0, 25], np.int32)
    idx = np.array([2, 0, 3], np.int32) if indexed else None
    pad = np.array([2, 0, 5], np.int32) if indexed else None
    opts = MASKS[mask]
    model = dict(causal=opts.get("causal", False), window=opts.get("window", (-1, -1)),
                 softcap=opts.get("softcap", 0.0))
    want, want_lse = ref_numpy.kvcache_forward(q, kc, vc, seqlens, kn, vn, idx, pad, **model)
    kc0, vc0 = kc.copy(), vc.copy()
    o, lse = fa.attention_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=seqlens, cache_batch_idx=idx,
                                       cache_leftpad=pad, impl=impl, return_lse=True, **opts)
    assert np.abs(o - want).max() <= 2e-6 * np.abs(want).max(), f"seed {SEED}"
    fin = np.isfinite(want_lse)
    assert np.array_equal(np.isneginf(lse), ~fin)
    assert np.abs(lse[fin] - want_lse[fin]).max() <= 2e-6 * max(1.0, np.abs(want_lse[fin]).max())
    # the append, in place, and nothing else
    expect_k, expect_v = kc0.copy(), vc0.copy()
    for b in range(B):
        row = b if idx is None else idx[b]
        if sn:
            expect_k[row, seqlens[b]:seqlens[b] + sn] = kn[b]
            expect_v[row, seqlens[b]:seqlens[b] + sn] = vn[b]
    assert np.array_equal(kc, expect_k) and np.array_equal(vc, expect_v)
    if impl == "flash":  # check reads the caches as they were and the new keys, writes nothing
        rep = fa.check(q, kc0, vc0, o, lse, cache_seqlens=seqlens, k_new=kn, v_new=vn, cache_batch_idx=idx,
                       cache_leftpad=pad, **opts)
        assert rep.passed, rep.text


@pytest.mark.parametrize("page_size", [1, 3, 16, 256])
def test_paged_cache_gives_the_contiguous_bits(page_size):
    rng = np.random.default_rng([SEED, page_size])
    q, kc, vc, kn, vn = make(rng, 4, 3)
    kc, vc = kc[:B].copy(), vc[:B].copy()
    seqlens = np.array([10, 0, 25], np.int32)
    maxp = -(-SC // page_size)
    npages = B * maxp + 3
    perm = rng.permutation(npages).astype(np.int32)
    table = perm[:B * maxp].reshape(B, maxp)
    kp = rng.uniform(-9, 9, (npages, page_size, HK, D)).astype(np.float32)
    vp = rng.uniform(-9, 9, (npages, page_size, HK, DV)).astype(np.float32)
    for b in range(B):
        for r in range(seqlens[b]):
            kp[table[b, r // page_size], r % page_size] = kc[b, r]
            vp[table[b, r // page_size], r % page_size] = vc[b, r]
    o1 = fa.attention_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=seqlens, causal=True)
    o2 = fa.attention_with_kvcache(q, kp, vp, kn, vn, cache_seqlens=seqlens, block_table=table, causal=True)
    assert np.array_equal(o1, o2)
    for b in range(B):
        for r in range(seqlens[b], seqlens[b] + 3):
            assert np.array_equal(kp[table[b, r // page_size], r % page_size], kc[b, r])


def test_kvcache_bad_arguments_raise():
    rng = np.random.default_rng(5)
    q, kc, vc, kn, vn = make(rng, 2, 3)
    with pytest.raises(fa.FlashAttnError, match=r"cache_seqlens\[2\] \+ seqlen_new = 38 \+ 3 is past the cache"):
        fa.attention_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=[1, 2, 38])
    with pytest.raises(fa.FlashAttnError, match=r"block_table\[0\]\[0\] = 7 is outside the pages"):
        fa.attention_with_kvcache(q, kc, vc, cache_seqlens=[1, 2, 3], block_table=[[7], [0], [1]])
    with pytest.raises(ValueError, match="k_cache must be .*non-negative strides"):
        fa.attention_with_kvcache(q, kc[:, ::-1], vc, kn, vn, cache_seqlens=[1, 2, 3])
    ro = vc.copy()
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="v_cache must be a writable numpy array"):
        fa.attention_with_kvcache(q, kc, ro, kn, vn, cache_seqlens=[1, 2, 3])
