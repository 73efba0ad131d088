"""tests/test_python_torch.py — flashattn.attention/grad/check given torch tensors.

Skipped (with the reason) where torch is not importable. Given torch tensors
of float32, float64, float16 or bfloat16, on the CPU or on CUDA when there is
one, the module copies them to the host and returns torch tensors on q's
device. Each result must equal, bit for bit, what the numpy path computes from
the same values (bf16 as uint16 bit patterns), and be close to an independent
float64 model (docs/semantics.md) within the output dtype's rounding. check()
must pass a correct bf16 output (a torch SDPA one included) and fail a wrong one.
"""

import os
import sys
import zlib

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: torch-tensor tests skipped")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))

import flashattn as fa  # noqa: E402
sys.path.insert(0, HERE)
import ref_numpy  # noqa: E402  (tests/, the independent float64 model)

try:
    fa.library()
except OSError as e:  # pragma: no cover - only without a build
    pytest.skip(f"libflashattn.so not available: {e}", allow_module_level=True)

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device"))]
DTYPES = {"float32": (torch.float32, 2e-5), "float64": (torch.float64, 1e-12),
          "float16": (torch.float16, 2e-3), "bfloat16": (torch.bfloat16, 2 ** -7)}


def model(q, k, v, causal=False):
    """O of the independent float64 model (tests/ref_numpy.py)."""
    return ref_numpy.attention_forward(q, k, v, causal=causal)[0]


def as_numpy(t):
    """The numpy input the module documents for the same values: bf16 -> uint16 bits."""
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16)
    return t.numpy()


def values(t):
    return t.detach().cpu().double().numpy()


@pytest.fixture
def gen(request):
    seed = int(os.environ.get("FA_TEST_SEED", "0")) + zlib.crc32(request.node.name.encode())
    return torch.Generator().manual_seed(seed)


def qkv(gen, dtype, device, B=2, Sq=20, Sk=33, H=4, Hk=2, d=16, dv=8):
    r = lambda *s: torch.randn(*s, generator=gen).to(dtype).to(device)  # noqa: E731
    return r(B, Sq, H, d), r(B, Sk, Hk, d), r(B, Sk, Hk, dv)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(DTYPES))
def test_attention_on_torch_tensors_returns_torch_tensors(gen, device, name):
    dtype, tol = DTYPES[name]
    q, k, v = qkv(gen, dtype, device)
    impl = "reference" if dtype == torch.float64 else "flash"
    o, lse = fa.attention(q, k, v, causal=True, out_dtype=dtype, return_lse=True, impl=impl)
    assert isinstance(o, torch.Tensor) and isinstance(lse, torch.Tensor)
    assert o.dtype == dtype and lse.dtype == torch.float32
    assert o.device.type == device and lse.device.type == device
    assert tuple(o.shape) == (2, 20, 4, 8) and tuple(lse.shape) == (2, 4, 20)
    # the same bits as the numpy path from the same values
    on, lsen = fa.attention(*(as_numpy(x) for x in (q, k, v)), causal=True, out_dtype=name,
                            return_lse=True, impl=impl)
    np.testing.assert_array_equal(as_numpy(o), on)
    np.testing.assert_array_equal(as_numpy(lse), lsen)
    want = model(values(q), values(k), values(v), causal=True)
    assert np.abs(values(o) - want).max() <= tol * max(1.0, np.abs(want).max())


@pytest.mark.parametrize("device", DEVICES)
def test_attention_takes_strided_and_requires_grad_tensors(gen, device):
    q, k, v = qkv(gen, torch.float32, device)
    qt = q.transpose(1, 2).contiguous().transpose(1, 2).requires_grad_()  # BHSD memory
    o = fa.attention(qt, k, v, out_dtype="bf16")
    assert o.dtype == torch.bfloat16 and o.device.type == device
    want = model(values(q), values(k), values(v))
    assert np.abs(values(o) - want).max() <= 2 ** -7 * max(1.0, np.abs(want).max())


@pytest.mark.parametrize("device", DEVICES)
def test_grad_on_torch_tensors(gen, device):
    q, k, v = qkv(gen, torch.bfloat16, device)
    do = torch.randn(2, 20, 4, 8, generator=gen).to(torch.bfloat16).to(device)
    grads = fa.grad(q, k, v, do, causal=True, grad_dtype=torch.float32)
    want = fa.grad(*(as_numpy(x) for x in (q, k, v, do)), causal=True)
    for g, w, x in zip(grads, want, (q, k, v)):
        assert isinstance(g, torch.Tensor) and g.dtype == torch.float32
        assert g.device.type == device and g.shape == x.shape
        np.testing.assert_array_equal(as_numpy(g), w)
    gb = fa.grad(q, k, v, do, causal=True, grad_dtype="bf16")
    assert all(g.dtype == torch.bfloat16 for g in gb)
    np.testing.assert_allclose(values(gb[0]), want[0], rtol=2 ** -8, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_check_on_torch_tensors_in_one_line(gen, device):
    q, k, v = qkv(gen, torch.bfloat16, device, Sq=33)
    out = fa.attention(q, k, v, causal=True, out_dtype=torch.bfloat16)
    assert fa.check(q, k, v, out, causal=True, dtype="bf16")
    rep = fa.check(q, k, v, out, causal=True, dtype=torch.bfloat16)
    assert rep.passed and rep.dtype == "bf16"
    wrong = out.clone()
    wrong[1, 5, 3, :] += 0.05
    rep = fa.check(q, k, v, wrong, causal=True, dtype="bf16")
    assert not rep.passed and rep.worst[:3] == (1, 5, 3)


@pytest.mark.parametrize("device", DEVICES)
def test_check_passes_torch_sdpa_output(gen, device):
    """What a kernel engineer does: check a torch attention's bf16 output."""
    q, k, v = qkv(gen, torch.bfloat16, device, Sq=64, Sk=64, H=4, Hk=4, d=32, dv=32)
    out = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True).transpose(1, 2)
    rep = fa.check(q, k, v, out, causal=True, dtype="bf16")
    assert rep.passed, rep.text
    bad = torch.nn.functional.scaled_dot_product_attention(   # not causal: must fail
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)
    assert not fa.check(q, k, v, bad, causal=True, dtype="bf16")


def test_integer_torch_tensors_are_refused_unless_bf16_bits(gen):
    q, k, v = qkv(gen, torch.bfloat16, "cpu")
    qi = q.view(torch.int16)
    with pytest.raises(TypeError, match="q: int16 array refused"):
        fa.attention(qi, k, v)
    o = fa.attention(qi, k, v, bf16_bits=True)
    np.testing.assert_array_equal(o.numpy(), fa.attention(q, k, v).numpy())
    with pytest.raises(TypeError, match="complex"):
        fa.attention(q.to(torch.complex64), k, v)


def test_alibi_slopes_as_torch_tensors_are_read_by_value(gen):
    q, k, v = qkv(gen, torch.float32, "cpu")
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625])
    want = fa.attention(q.numpy(), k.numpy(), v.numpy(), causal=True,
                        alibi_slopes=slopes.numpy().astype(np.float64))
    for s in (slopes, slopes.to(torch.bfloat16), slopes.to(torch.float16)):  # exact in all three
        o = fa.attention(q, k, v, causal=True, alibi_slopes=s)
        np.testing.assert_array_equal(o.numpy(), want)


@pytest.mark.parametrize("device", DEVICES)
def test_tensors_with_a_negation_or_conjugation_bit_are_read_by_value(gen, device):
    """Ensure x.conj().imag (a lazily negated view) is read as its values, not its raw storage."""
    q, k, v = qkv(gen, torch.float32, device)
    neg_k = torch.complex(k, k).conj().imag   # = -k, a negation bit over k's storage
    assert neg_k.is_neg()
    o = fa.attention(q, neg_k, v)
    want = fa.attention(q, (-k).clone(), v)
    assert torch.equal(o, want)
    d0 = torch.ones_like(o) + o               # a dO of O's shape, never zeros
    neg_dout = torch.complex(d0, d0).conj().imag
    g = fa.grad(q, k, v, neg_dout)
    g_want = fa.grad(q, k, v, (-d0).clone())
    for a, b in zip(g, g_want):
        assert torch.equal(a, b)
