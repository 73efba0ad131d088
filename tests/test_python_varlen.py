"""tests/test_python_varlen.py — variable-length batches through flashattn.attention/grad/check.

The expectation is tests/ref_numpy.py's independent float64 model
(varlen_forward / varlen_backward: each sequence its own problem, masks
aligned with its own lengths, rows no sequence owns O = 0 and LSE = -inf,
zero gradients). flash and reference run in float32 over at most ~60 keys:
their error against the model is a few float32 roundings of max|O| (measured
~1e-7 relative); the bounds below, 2e-6 of max|O| and 1e-5 of max|G| (the
grad suite's), leave a margin of ~10x and still catch any wrong row, key,
mask or offset (those are O(1) errors).
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


def make_batch(rng, q_lens, k_lens, H=4, Hk=2, d=16, dv=8, pad_q=2, pad_k=1):
    cu_q = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(k_lens)]).astype(np.int32)
    q = rng.uniform(-2, 2, (cu_q[-1] + pad_q, H, d)).astype(np.float32)
    k = rng.uniform(-2, 2, (cu_k[-1] + pad_k, Hk, d)).astype(np.float32)
    v = rng.uniform(-1, 1, (cu_k[-1] + pad_k, Hk, dv)).astype(np.float32)
    return q, k, v, cu_q, cu_k


CASES = [
    dict(q_lens=[5, 0, 13, 6, 1], k_lens=[9, 4, 7, 0, 19], used=None),
    dict(q_lens=[7, 3, 1, 10], k_lens=[12, 3, 8, 10], used=[5, 0, 8, 10]),
    dict(q_lens=[40, 17], k_lens=[23, 60], used=None),
]
MASKS = [
    dict(),
    dict(causal=True),
    dict(window=(3, 2), softcap=20.0),
    dict(causal=True, window=(4, -1), alibi="batch"),
]


def _opts(mask, rng, H, batch):
    o = dict(mask)
    model = dict(causal=o.get("causal", False), window=o.get("window", (-1, -1)) or (-1, -1),
                 softcap=o.get("softcap", 0.0))
    if o.get("alibi") == "batch":
        slopes = rng.uniform(0.05, 0.5, (batch, H))
        o["alibi_slopes"] = slopes
        model["alibi"] = slopes
    o.pop("alibi", None)
    return o, model


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("mask", range(len(MASKS)))
@pytest.mark.parametrize("impl", ["flash", "reference", "standard"])
def test_varlen_forward_matches_the_float64_model(case, mask, impl):
    rng = np.random.default_rng([SEED, case, mask])
    c = CASES[case]
    q, k, v, cu_q, cu_k = make_batch(rng, c["q_lens"], c["k_lens"])
    opts, model = _opts(MASKS[mask], rng, q.shape[1], len(c["q_lens"]))
    o, lse = fa.attention(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, seqused_k=c["used"],
                          impl=impl, return_lse=True, **opts)
    o_ref, lse_ref = ref_numpy.varlen_forward(q, k, v, cu_q, cu_k, c["used"], **model)
    assert o.shape == o_ref.shape and lse.shape == lse_ref.shape == (q.shape[1], q.shape[0])
    scale = max(np.abs(o_ref).max(), 1e-30)
    assert np.abs(o - o_ref).max() <= 2e-6 * scale, f"seed {SEED}"
    empty = np.isneginf(lse_ref)
    assert np.array_equal(np.isneginf(lse), empty), f"seed {SEED}"
    assert np.abs(lse[~empty] - lse_ref[~empty]).max() <= 2e-6 * max(1.0, np.abs(lse_ref[~empty]).max())
    assert np.all(o[cu_q[-1]:] == 0) and np.all(np.isneginf(lse[:, cu_q[-1]:]))
    if impl == "flash":
        rep = fa.check(q, k, v, o, lse, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, seqused_k=c["used"], **opts)
        assert rep.passed, rep.text


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("mask", range(len(MASKS)))
@pytest.mark.parametrize("impl", ["flash", "reference"])
def test_varlen_backward_matches_the_float64_model(case, mask, impl):
    rng = np.random.default_rng([SEED, case, mask, 7])
    c = CASES[case]
    q, k, v, cu_q, cu_k = make_batch(rng, c["q_lens"], c["k_lens"])
    do = rng.uniform(-1, 1, (q.shape[0], q.shape[1], v.shape[2])).astype(np.float32)
    opts, model = _opts(MASKS[mask], rng, q.shape[1], len(c["q_lens"]))
    got = fa.grad(q, k, v, do, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, seqused_k=c["used"], impl=impl, **opts)
    want = ref_numpy.varlen_backward(q, k, v, do, cu_q, cu_k, c["used"], **model)
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        assert g.shape == w.shape
        assert np.abs(g - w).max() <= 1e-5 * max(np.abs(w).max(), 1e-30), f"{name}, seed {SEED}"


def test_varlen_check_points_at_the_sequence_and_row():
    rng = np.random.default_rng([SEED, 99])
    q, k, v, cu_q, cu_k = make_batch(rng, [5, 9, 4], [6, 9, 3])
    o = fa.attention(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, causal=True)
    o[cu_q[1] + 3, 2, 1] += 0.05
    rep = fa.check(q, k, v, o, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, causal=True)
    assert not rep.passed
    assert rep.worst == (1, 3, 2, 1)


@pytest.mark.parametrize("cu_q, cu_k, used, needle", [
    ([1, 5, 9], [0, 4, 8], None, "cu_seqlens_q[0] = 1"),
    ([0, 5, 4], [0, 4, 8], None, "cu_seqlens_q[2] = 4 is less than cu_seqlens_q[1] = 5"),
    ([0, 5, 99], [0, 4, 8], None, "cu_seqlens_q[2] = 99 is past the end of q"),
    ([0, 5, 9], [0, 4, 9], None, "cu_seqlens_k[2] = 9 is past the end of k"),
    ([0, 5, 9], [0, 4, 8], [5, 1], "seqused_k[0] = 5 is outside 0..4"),
])
def test_varlen_bad_index_arrays_raise_with_the_index(cu_q, cu_k, used, needle):
    rng = np.random.default_rng(3)
    q = rng.standard_normal((9, 2, 8)).astype(np.float32)
    k = rng.standard_normal((8, 2, 8)).astype(np.float32)
    with pytest.raises(fa.FlashAttnError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        fa.attention(q, k, k, cu_seqlens_q=np.array(cu_q, np.int32), cu_seqlens_k=np.array(cu_k, np.int32),
                     seqused_k=used)


def test_varlen_arguments_are_checked_in_python():
    q = np.zeros((4, 2, 8), np.float32)
    with pytest.raises(ValueError, match="both"):
        fa.attention(q, q, q, cu_seqlens_q=[0, 4])
    with pytest.raises(TypeError, match="int32"):
        fa.attention(q, q, q, cu_seqlens_q=[0.0, 4.0], cu_seqlens_k=[0, 4])
    with pytest.raises(ValueError, match="int32 range"):
        fa.attention(q, q, q, cu_seqlens_q=[0, 2 ** 33], cu_seqlens_k=[0, 4])
    with pytest.raises(ValueError, match="rank 3"):
        fa.attention(q[None], q[None], q[None], cu_seqlens_q=[0, 4], cu_seqlens_k=[0, 4])
