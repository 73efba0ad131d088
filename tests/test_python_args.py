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


# ---- side inputs: the bf16-bits rule, by value otherwise ------------------------------

def test_side_inputs_follow_the_bf16_bits_rule(qkv):
    """uint16 ALiBi slopes, sinks and rotary tables were read as integers (16256.0 for a bf16 1.0)."""
    q, k, v = qkv
    vals = np.array([0.3, -0.7, 0.45, 1.2], np.float32)
    bits = ref_numpy.float_to_bf16_bits(vals)
    exact = ref_numpy.bf16_bits_to_float64(bits)  # the values the bits stand for
    for name in ("alibi_slopes", "sinks"):
        want = fa.attention(q, k, v, impl="reference", **{name: exact})
        np.testing.assert_array_equal(fa.attention(q, k, v, impl="reference", **{name: bits}), want)
        np.testing.assert_array_equal(
            fa.attention(q, k, v, impl="reference", bf16_bits=True, **{name: bits.view(np.int16)}), want)
        with pytest.raises(TypeError, match=f"{name}: uint16 array refused"):
            fa.attention(q, k, v, bf16_bits=False, **{name: bits})
        with pytest.raises(TypeError, match=f"{name}: int16 array refused"):
            fa.attention(q, k, v, **{name: bits.view(np.int16)})
        # a Python list of numbers is taken by value, ints included
        np.testing.assert_array_equal(fa.attention(q, k, v, impl="reference", **{name: [1, 0, 2, 1]}),
                                      fa.attention(q, k, v, impl="reference",
                                                   **{name: np.array([1.0, 0.0, 2.0, 1.0])}))
    # rotary tables through the KV cache
    rng = np.random.default_rng(7)
    kc = rng.standard_normal((2, 24, 2, 16)).astype(np.float32)
    vc = rng.standard_normal((2, 24, 2, 8)).astype(np.float32)
    ang = rng.uniform(0, 3, (24, 4))
    cb, sb = ref_numpy.float_to_bf16_bits(np.cos(ang)), ref_numpy.float_to_bf16_bits(np.sin(ang))
    kn = rng.standard_normal((2, 2, 2, 16)).astype(np.float32)
    vn = rng.standard_normal((2, 2, 2, 8)).astype(np.float32)
    caches = [(kc.copy(), vc.copy()) for _ in range(2)]  # each call appends into its own
    want = fa.attention_with_kvcache(q[:, :3], *caches[0], kn, vn, cache_seqlens=[20, 9], impl="reference",
                                     rotary_cos=ref_numpy.bf16_bits_to_float64(cb),
                                     rotary_sin=ref_numpy.bf16_bits_to_float64(sb))
    got = fa.attention_with_kvcache(q[:, :3], *caches[1], kn, vn, cache_seqlens=[20, 9], impl="reference",
                                    rotary_cos=cb, rotary_sin=sb)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(caches[0][0], caches[1][0])  # the same rotated keys appended


# ---- the KV cache's arguments ----------------------------------------------------------

def test_cache_arguments_without_cache_seqlens_are_refused_not_ignored(qkv):
    """check() ignored k_new/v_new (and the other cache arguments) without cache_seqlens: a kernel
    that skipped the new keys PASSED."""
    rng = np.random.default_rng(3)
    f = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    q, kc, vc, kn, vn = f(2, 1, 4, 8), f(2, 10, 2, 8), f(2, 10, 2, 8), f(2, 2, 2, 8), f(2, 2, 2, 8)
    wrong = fa.attention(q, kc, vc)  # the whole cache, no new keys
    for call in (fa.check, fa.diagnose):
        for kw in (dict(k_new=kn, v_new=vn), dict(block_table=[[0], [1]]), dict(cache_batch_idx=[1, 0]),
                   dict(cache_leftpad=[0, 1])):
            with pytest.raises(ValueError, match="need.* cache_seqlens"):
                call(q, kc, vc, wrong, **kw)
    with pytest.raises(ValueError, match="k_new and v_new"):
        fa.check(q, kc, vc, wrong, cache_seqlens=[3, 4], k_new=kn)
    assert not fa.check(q, kc, vc, wrong, cache_seqlens=[3, 4], k_new=kn, v_new=vn).passed


def test_scalar_cache_seqlens_is_range_checked():
    q = np.zeros((1, 1, 2, 8), np.float32)
    kn = np.ones((1, 1, 2, 8), np.float32)
    kc, vc = np.zeros((1, 16, 2, 8), np.float32), np.zeros((1, 16, 2, 8), np.float32)
    for bad in (2 ** 32 + 3, -1):
        with pytest.raises(ValueError, match="cache_seqlens"):
            fa.attention_with_kvcache(q, kc, vc, kn, kn, cache_seqlens=bad)
    assert not kc.any()  # nothing appended


def test_a_memmap_cache_takes_the_append_in_place(tmp_path):
    """np.memmap caches were refused as 'not writable numpy arrays'."""
    rng = np.random.default_rng(5)
    kc = np.lib.format.open_memmap(tmp_path / "kc.npy", mode="w+", dtype=np.float32, shape=(1, 16, 2, 8))
    vc = np.lib.format.open_memmap(tmp_path / "vc.npy", mode="w+", dtype=np.float32, shape=(1, 16, 2, 8))
    kc[:] = rng.standard_normal(kc.shape)
    vc[:] = rng.standard_normal(vc.shape)
    kn, vn = rng.standard_normal((2, 1, 1, 2, 8)).astype(np.float32)
    q = rng.standard_normal((1, 1, 2, 8)).astype(np.float32)
    plain_k, plain_v = np.array(kc), np.array(vc)
    o = fa.attention_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=3, impl="reference")
    np.testing.assert_array_equal(kc[0, 3], kn[0, 0])
    np.testing.assert_array_equal(vc[0, 3], vn[0, 0])
    o2 = fa.attention_with_kvcache(q, plain_k, plain_v, kn, vn, cache_seqlens=3, impl="reference")
    np.testing.assert_array_equal(o, o2)
    rev = np.zeros((1, 16, 2, 8), np.float32)[:, ::-1]
    with pytest.raises(ValueError, match="non-negative strides"):
        fa.attention_with_kvcache(q, rev, vc, kn, vn, cache_seqlens=3)


def test_thread_counts_past_the_library_limit_are_refused(qkv):
    """An OpenMP runtime that cannot create a thread ends the process: the library refuses first."""
    q, k, v = qkv
    with pytest.raises(fa.FlashAttnError, match="num_threads"):
        fa.attention(q, k, v, num_threads=4097)  # FA_MAX_THREADS + 1
    with pytest.raises(fa.FlashAttnError, match="num_threads"):
        fa.check(q, k, v, model(q, k, v), num_threads=4097)


@pytest.mark.parametrize("kwargs", [dict(causal="False"), dict(causal="yes"), dict(causal=2),
                                    dict(softcap="30"), dict(scale="0.5"), dict(softcap=True),
                                    dict(window=(True, False))])
def test_strings_and_bools_are_refused_where_they_would_be_misread(qkv, kwargs):
    """causal="False" turned causal masking on (bool of a non-empty string), softcap="30"
    and scale="0.5" went through float(), window=(True, False) became (1, 0)."""
    q, k, v = qkv
    with pytest.raises(TypeError, match="must be"):
        fa.attention(q, k, v, **kwargs)


def test_bool_like_values_are_taken(qkv):
    q, k, v = qkv
    want = model(q, k, v, causal=True)
    for c in (True, np.bool_(True), 1, np.int64(1), np.array(True)):
        assert np.abs(fa.attention(q, k, v, causal=c) - want).max() < 1e-5
    for c in (np.bool_(False), None, np.array(0)):
        assert np.abs(fa.attention(q, k, v, causal=c) - model(q, k, v)).max() < 1e-5


def test_return_lse_and_0d_string_arrays_are_not_misread(qkv):
    """return_lse="False" returned the (O, LSE) tuple; np.array("30") went through float()."""
    q, k, v = qkv
    for bad in (dict(return_lse="False"), dict(softcap=np.array("30")), dict(scale=np.array("0.5"))):
        with pytest.raises(TypeError, match="must be"):
            fa.attention(q, k, v, **bad)
    assert isinstance(fa.attention(q, k, v, return_lse=np.bool_(True)), tuple)
    assert np.abs(fa.attention(q, k, v, softcap=np.array(30.0)) - fa.attention(q, k, v, softcap=30.0)).max() == 0


def test_rotary_interleaved_none_is_refused_not_read_as_the_other_pairing():
    """None is False only where False is the default: rotary_interleaved's is True."""
    rng = np.random.default_rng(7)
    q = rng.standard_normal((1, 1, 2, 8)).astype(np.float32)
    kc = rng.standard_normal((1, 4, 1, 8)).astype(np.float32)
    vc = kc.copy()
    cos = np.ones((8, 2), np.float32)
    with pytest.raises(TypeError, match="rotary_interleaved must be True or False"):
        fa.attention_with_kvcache(q, kc, vc, cache_seqlens=2, rotary_cos=cos, rotary_sin=0 * cos,
                                  rotary_interleaved=None)


def test_standard_max_bytes_caps_the_standard_path(qkv):
    """The standard path's score-matrix cap is reachable from Python (its error names it)."""
    q, k, v = qkv
    want = model(q, k, v)
    assert np.abs(fa.attention(q, k, v, impl="standard") - want).max() < 1e-5
    with pytest.raises(fa.FlashAttnError, match="standard_max_bytes"):
        fa.attention(q, k, v, impl="standard", standard_max_bytes=64)
    big = fa.attention(q, k, v, impl="standard", standard_max_bytes=1 << 20)
    assert np.abs(big - want).max() < 1e-5
    for bad, err in ((0, ValueError), (-1, ValueError), (1.5, TypeError), ("4096", TypeError), (True, TypeError),
                     (2 ** 64, ValueError)):
        with pytest.raises(err, match="standard_max_bytes"):
            fa.attention(q, k, v, impl="standard", standard_max_bytes=bad)


def test_standard_max_bytes_reaches_the_kvcache_call():
    rng = np.random.default_rng(11)
    q = rng.standard_normal((1, 4, 2, 8)).astype(np.float32)
    kc = rng.standard_normal((1, 40, 1, 8)).astype(np.float32)
    vc = rng.standard_normal((1, 40, 1, 8)).astype(np.float32)
    want = fa.attention_with_kvcache(q, kc, vc, cache_seqlens=30, impl="reference")
    got = fa.attention_with_kvcache(q, kc, vc, cache_seqlens=30, impl="standard", standard_max_bytes=1 << 16)
    assert np.abs(got - want).max() < 1e-5
    with pytest.raises(fa.FlashAttnError, match="standard_max_bytes"):
        fa.attention_with_kvcache(q, kc, vc, cache_seqlens=30, impl="standard", standard_max_bytes=16)


def test_integers_beyond_every_double_are_refused_as_values(qkv):
    """float(10**400) raises OverflowError: a ValueError naming the argument instead."""
    q, k, v = qkv
    for kwargs in ({"softcap": 10 ** 400}, {"scale": 10 ** 400}):
        with pytest.raises(ValueError, match="out of range"):
            fa.attention(q, k, v, **kwargs)
