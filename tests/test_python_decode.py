"""num_splits through the Python wrapper: split-KV decoding against tests/ref_numpy.py's
float64 model, the same bits for a fixed split count at any thread count, refusals."""
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
sys.path.insert(0, os.path.dirname(__file__))
fa = pytest.importorskip("flashattn")
try:
    fa.library()
except OSError:
    pytest.skip("libflashattn.so is not built", allow_module_level=True)
import ref_numpy  # noqa: E402


def _inputs(seed, B=2, Sq=1, Sk=700, H=8, Hk=2, d=32):
    r = np.random.default_rng(seed)
    return (r.standard_normal((B, Sq, H, d)).astype(np.float32),
            r.standard_normal((B, Sk, Hk, d)).astype(np.float32),
            r.standard_normal((B, Sk, Hk, d)).astype(np.float32))


@pytest.mark.parametrize("splits", [1, 2, 3, 7, 0])
@pytest.mark.parametrize("causal", [False, True])
def test_split_kv_matches_float64_model(splits, causal):
    q, k, v = _inputs(100 + splits)
    o, lse = fa.attention(q, k, v, causal=causal, num_splits=splits, return_lse=True)
    ro, rlse = ref_numpy.attention_forward(q, k, v, causal=causal)
    assert np.abs(o - ro).max() < 2e-5
    assert np.abs(lse - rlse).max() < 2e-5


def test_fixed_split_count_same_bits_any_thread_count():
    q, k, v = _inputs(7, Sq=3)
    a = fa.attention(q, k, v, num_splits=5, num_threads=1)
    b = fa.attention(q, k, v, num_splits=5, num_threads=2)
    assert a.tobytes() == b.tobytes()


def test_kvcache_num_splits_matches_unsplit():
    q, k, v = _inputs(9, B=1, Sk=512)
    seqlens = np.array([300], dtype=np.int32)
    a = fa.attention_with_kvcache(q, k, v, cache_seqlens=seqlens, num_splits=1)
    b = fa.attention_with_kvcache(q, k, v, cache_seqlens=seqlens, num_splits=4)
    ro = ref_numpy.attention_forward(q, k[:, :300], v[:, :300])
    ro = ro[0] if isinstance(ro, tuple) else ro
    assert np.abs(a - ro).max() < 2e-5 and np.abs(b - ro).max() < 2e-5


@pytest.mark.parametrize("bad, exc", [(-1, RuntimeError), (1.5, TypeError), (True, TypeError)])
def test_bad_num_splits_refused(bad, exc):
    q, k, v = _inputs(3)
    with pytest.raises((exc, ValueError)) as e:
        fa.attention(q, k, v, num_splits=bad)
    assert "num_splits" in str(e.value)
