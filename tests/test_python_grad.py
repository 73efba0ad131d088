"""tests/test_python_grad.py — flashattn.grad() (fa_backward through ctypes) against numpy.

The numpy model below is an independent float64 backward written from the
formulas (docs/semantics.md): P = softmax, D = rowsum(dO o O), dS = P o (dP - D),
through the softcap derivative, dQ = scale dS K, dK = scale dS^T Q,
dV = P^T dO, GQA by summing the repeated kv heads. flash and reference must
match it within 1e-5 of max|G| (float32 over a few dozen keys: measured ~1e-7).
"""

import os
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))

import flashattn as fa  # noqa: E402

try:
    fa.library()
except OSError as e:  # pragma: no cover - only without a build
    pytest.skip(f"libflashattn.so not available: {e}", allow_module_level=True)


def model_backward(q, k, v, do, causal=False, softcap=0.0, scale=None):
    q, k, v, do = (np.asarray(x, np.float64) for x in (q, k, v, do))
    B, Sq, H, d = q.shape
    Sk, Hk = k.shape[1], k.shape[2]
    g = H // Hk
    sc = 1 / np.sqrt(d) if scale is None else scale
    kr, vr = np.repeat(k, g, axis=2), np.repeat(v, g, axis=2)
    t = sc * np.einsum("bihc,bjhc->bhij", q, kr)
    u = softcap * np.tanh(t / softcap) if softcap > 0 else t
    vis = np.ones((Sq, Sk), bool)
    if causal:
        vis = np.arange(Sk)[None, :] <= np.arange(Sq)[:, None] + Sk - Sq
    s = np.where(vis, u, -np.inf)
    m = s.max(-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(s - m)
    l = e.sum(-1, keepdims=True)
    p = np.where(l > 0, e / np.where(l > 0, l, 1), 0.0)
    o = np.einsum("bhij,bjhc->bihc", p, vr)
    dP = np.einsum("bihc,bjhc->bhij", do, vr)
    dS = p * (dP - np.einsum("bihc,bihc->bhi", do, o)[..., None])
    if softcap > 0:
        dS = dS * (1 - (u / softcap) ** 2)
    dq = sc * np.einsum("bhij,bjhc->bihc", dS, kr)
    dk = (sc * np.einsum("bhij,bihc->bjhc", dS, q)).reshape(B, Sk, Hk, g, d).sum(3)
    dv = np.einsum("bhij,bihc->bjhc", p, do).reshape(B, Sk, Hk, g, v.shape[3]).sum(3)
    return dq, dk, dv


def inputs(B=2, Sq=20, Sk=28, H=4, Hk=2, d=16, dv=12, seed=0):
    rng = np.random.default_rng(seed)
    r = lambda *s: rng.uniform(-1, 1, size=s).astype(np.float32)  # noqa: E731
    return r(B, Sq, H, d), r(B, Sk, Hk, d), r(B, Sk, Hk, dv), r(B, Sq, H, dv)


def assert_close(got, want, rel=1e-5):
    for g, w in zip(got, want):
        assert g.shape == w.shape
        err = np.abs(g.astype(np.float64) - w).max()
        assert err <= rel * max(1.0, np.abs(w).max()), err


@pytest.mark.parametrize("impl", ["flash", "reference"])
@pytest.mark.parametrize("causal,softcap", [(False, 0.0), (True, 0.0), (True, 3.0)])
def test_grad_matches_numpy_model(impl, causal, softcap):
    q, k, v, do = inputs(Sq=30 if causal else 20)  # causal with Sq > Sk: some rows see no key
    got = fa.grad(q, k, v, do, causal=causal, softcap=softcap, impl=impl)
    assert_close(got, model_backward(q, k, v, do, causal=causal, softcap=softcap))


def test_grad_accepts_bhsd_views_and_given_out_lse():
    q, k, v, do = inputs()
    bh = lambda x: np.ascontiguousarray(x.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)  # noqa: E731
    o, lse = fa.attention(q, k, v, causal=True, scale=0.4, return_lse=True)
    got = fa.grad(bh(q), bh(k), bh(v), bh(do), out=o, lse=lse, causal=True, scale=0.4)
    assert_close(got, model_backward(q, k, v, do, causal=True, scale=0.4))


def test_grad_returns_requested_dtypes():
    q, k, v, do = inputs(B=1, Sq=8, Sk=8)
    dq, dk, dv = fa.grad(q, k, v, do, grad_dtype="bf16")
    assert dq.dtype == np.uint16 and dk.dtype == np.uint16 and dv.dtype == np.uint16
    dq, _, _ = fa.grad(q, k, v, do, grad_dtype=np.float64)
    assert dq.dtype == np.float64


def test_grad_standard_impl_raises():
    q, k, v, do = inputs(B=1, Sq=8, Sk=8)
    with pytest.raises(fa.FlashAttnError, match="standard"):
        fa.grad(q, k, v, do, impl="standard")


def test_grad_bad_dout_shape_raises():
    q, k, v, do = inputs(B=1, Sq=8, Sk=8)
    with pytest.raises(fa.FlashAttnError, match="dout"):
        fa.grad(q, k, v, do[:, :, :, :5])
