"""tests/test_python_args.py — the edges of python/flashattn.py's arguments.

Before these fixes: scale=0.0 silently meant 1/sqrt(d); ctypes truncated
integers (window=(2**64 + 5, 0) became 5, num_threads=2**32 + 1 became 1);
window=(-5, -7) was silently unbounded where the CLI refuses -2;
out_dtype="f16" failed with numpy's TypeError; an int16 array was read as
bfloat16 bit patterns. Each test here failed then. Results are compared with
an independent float64 numpy model (docs/semantics.md) on fresh random inputs.
"""

import os
import sys
import zlib

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


def model(q, k, v, causal=False):
    """O of the independent float64 model (tests/ref_numpy.py)."""
    return ref_numpy.attention_forward(q, k, v, causal=causal)[0]


@pytest.fixture
def qkv(request):
    seed = int(os.environ.get("FA_TEST_SEED", "0")) + zlib.crc32(request.node.name.encode())
    rng = np.random.default_rng(seed)
    r = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    return r(2, 12, 4, 16), r(2, 20, 2, 16), r(2, 20, 2, 8)


def do(q, k, v):
    return q[:, :, :, :8].copy()


# ---- scale ------------------------------------------------------------------------

def test_scale_zero_is_refused_not_read_as_the_default(qkv):
    q, k, v = qkv
    with pytest.raises(ValueError, match="scale = 0"):
        fa.attention(q, k, v, scale=0.0)
    with pytest.raises(ValueError, match="scale = 0"):
        fa.grad(q, k, v, do(q, k, v), scale=0)
    with pytest.raises(ValueError, match="scale = 0"):
        fa.check(q, k, v, model(q, k, v), scale=-0.0)
    with pytest.raises(ValueError, match="scale"):
        fa.attention(q, k, v, scale=float("nan"))
    # None is the default 1/sqrt(d), and a given scale is used as given
    np.testing.assert_allclose(fa.attention(q, k, v, scale=None), model(q, k, v), atol=2e-5)
    np.testing.assert_allclose(fa.attention(q, k, v, scale=1 / 4.0), model(q, k, v), atol=2e-5)


# ---- integers are range-checked before ctypes can truncate them ----------------------

@pytest.mark.parametrize("kwargs", [
    dict(window=(2 ** 64 + 5, 0)),      # was truncated to (5, 0)
    dict(window=(0, 2 ** 63)),          # was -2**63: unbounded
    dict(num_threads=2 ** 32 + 1),      # was 1
    dict(num_threads=2 ** 31),          # was INT_MIN
    dict(num_threads=-1),
])
def test_out_of_range_integers_are_refused(qkv, kwargs):
    q, k, v = qkv
    name = "window" if "window" in kwargs else "num_threads"
    for call in (lambda: fa.attention(q, k, v, **kwargs),
                 lambda: fa.grad(q, k, v, do(q, k, v), **kwargs),
                 lambda: fa.check(q, k, v, model(q, k, v), **kwargs)):
        with pytest.raises(ValueError, match=name):
            call()


def test_check_sample_rows_and_seed_are_range_checked(qkv):
    q, k, v = qkv
    o = model(q, k, v)
    for kwargs, name in ((dict(sample_rows=-1), "sample_rows"),
                         (dict(sample_rows=2 ** 64 + 3), "sample_rows"),
                         (dict(seed=-1), "seed"), (dict(seed=2 ** 64), "seed")):
        with pytest.raises(ValueError, match=name):
            fa.check(q, k, v, o, **kwargs)
    assert fa.check(q, k, v, o, sample_rows=3, seed=2 ** 64 - 1).rows_checked == 2 * 4 * 3


def test_non_integer_counts_are_refused_not_truncated(qkv):
    q, k, v = qkv
    with pytest.raises(TypeError, match="num_threads"):
        fa.attention(q, k, v, num_threads=2.5)
    with pytest.raises(TypeError, match="window"):
        fa.attention(q, k, v, window=(3.7, 0))
    with pytest.raises(TypeError, match="sample_rows"):
        fa.check(q, k, v, model(q, k, v), sample_rows=1.5)
    # numpy integers are integers
    o = fa.attention(q, k, v, window=(np.int64(-1), np.int32(0)), num_threads=np.int64(1))
    np.testing.assert_allclose(o, model(q, k, v, causal=True), atol=2e-5)


# ---- windows ---------------------------------------------------------------------

@pytest.mark.parametrize("window", [(-5, -7), (-2, 0), (0, -2), (None, -3)])
def test_negative_windows_other_than_minus_one_are_refused(qkv, window):
    q, k, v = qkv
    with pytest.raises(ValueError, match="window"):
        fa.attention(q, k, v, window=window)
    with pytest.raises(ValueError, match="window"):
        fa.check(q, k, v, model(q, k, v), window=window)


def test_minus_one_and_none_mean_unbounded(qkv):
    q, k, v = qkv
    want, want_causal = model(q, k, v), model(q, k, v, causal=True)
    for w in ((-1, -1), (None, None), None):
        np.testing.assert_allclose(fa.attention(q, k, v, window=w), want, atol=2e-5)
    for w in ((-1, 0), (None, 0)):
        np.testing.assert_allclose(fa.attention(q, k, v, window=w), want_causal, atol=2e-5)
    with pytest.raises(ValueError, match="pair"):
        fa.attention(q, k, v, window=5)


# ---- dtype names -----------------------------------------------------------------

@pytest.mark.parametrize("name,np_type,tol", [
    ("f32", np.float32, 2e-5), ("float32", np.float32, 2e-5), (np.float32, np.float32, 2e-5),
    ("f64", np.float64, 1e-12), (np.dtype("float64"), np.float64, 1e-12),
    ("f16", np.float16, 2e-3), ("float16", np.float16, 2e-3), (np.float16, np.float16, 2e-3),
    ("bf16", np.uint16, 2 ** -7), ("bfloat16", np.uint16, 2 ** -7),
])
def test_out_dtype_accepts_the_documented_names(qkv, name, np_type, tol):
    q, k, v = qkv
    impl = "reference" if np_type == np.float64 else "flash"
    o = fa.attention(q, k, v, out_dtype=name, impl=impl)
    assert o.dtype == np_type
    got = ref_numpy.bf16_bits_to_float64(o) if np_type == np.uint16 else o.astype(np.float64)
    want = model(q, k, v)
    assert np.abs(got - want).max() <= tol * max(1.0, np.abs(want).max())


def test_grad_and_check_accept_dtype_names(qkv):
    q, k, v = qkv
    dq, dk, dv = fa.grad(q, k, v, do(q, k, v), grad_dtype="f16")
    assert dq.dtype == dk.dtype == dv.dtype == np.float16
    dq32, _, _ = fa.grad(q, k, v, do(q, k, v), grad_dtype="f32")
    np.testing.assert_allclose(dq, dq32, atol=2e-3 * max(1.0, np.abs(dq32).max()))
    o16 = model(q, k, v).astype(np.float16)
    for dt in ("f16", "half", np.float16):
        rep = fa.check(q, k, v, o16, dtype=dt)
        assert rep.passed and rep.dtype == "f16"


@pytest.mark.parametrize("bad", ["int8", "f8", "float128", "", np.int32, np.complex64, None])
def test_unknown_dtypes_are_refused_with_a_clear_message(qkv, bad):
    q, k, v = qkv
    with pytest.raises(ValueError, match="out_dtype: .* is not a supported dtype"):
        fa.attention(q, k, v, out_dtype=bad)
    with pytest.raises(ValueError, match="grad_dtype"):
        fa.grad(q, k, v, do(q, k, v), grad_dtype=bad)
    if bad is not None:  # dtype=None means "infer" in check
        with pytest.raises(ValueError, match="dtype"):
            fa.check(q, k, v, model(q, k, v), dtype=bad)


# ---- integer arrays are not bfloat16 unless asked -----------------------------------

@pytest.mark.parametrize("int_type", [np.int16, np.int32, np.int64, np.int8, np.uint8, bool])
def test_integer_arrays_are_refused(qkv, int_type):
    q, k, v = qkv
    qi = (100 * q).astype(int_type)  # integer data, not bit patterns
    with pytest.raises(TypeError, match="q: .* refused"):
        fa.attention(qi, k, v)
    with pytest.raises(TypeError, match="q: .* refused"):
        fa.check(qi, k, v, model(q, k, v))
    with pytest.raises(TypeError, match="dout: .* refused"):
        fa.grad(q, k, v, do(q, k, v).astype(int_type))


def test_bf16_bits_flag_reads_int16_and_can_refuse_uint16(qkv):
    q, k, v = qkv
    qb, kb, vb = ref_numpy.float_to_bf16_bits(q), ref_numpy.float_to_bf16_bits(k), ref_numpy.float_to_bf16_bits(v)
    from_uint16 = fa.attention(qb, kb, vb, impl="reference")   # the compatible default
    from_int16 = fa.attention(qb.view(np.int16), kb.view(np.int16), vb.view(np.int16),
                              impl="reference", bf16_bits=True)
    np.testing.assert_array_equal(from_uint16, from_int16)
    want = model(ref_numpy.bf16_bits_to_float64(qb), ref_numpy.bf16_bits_to_float64(kb), ref_numpy.bf16_bits_to_float64(vb))
    np.testing.assert_allclose(from_uint16, want, atol=2e-5)
    with pytest.raises(TypeError, match="int16 array refused"):
        fa.attention(qb.view(np.int16), kb, vb)
    with pytest.raises(TypeError, match="uint16 array refused"):
        fa.attention(qb, kb, vb, bf16_bits=False)
    rep = fa.check(qb.view(np.int16), kb, vb, ref_numpy.float_to_bf16_bits(want), bf16_bits=True)
    assert rep.passed and rep.dtype == "bf16"
