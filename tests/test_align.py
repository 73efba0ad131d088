"""test_align.py -- both causal conventions (issue 13 item 6).

fa_options::align (python align=, CLI --align) picks which corner the mask band
and the ALiBi distance are aligned to: bottom-right (FlashAttention, the
default) or top-left (PyTorch SDPA's is_causal). Every implementation, the
backward pass and check are compared with tests/ref_numpy.py (an independent
float64 model) under both, with seqlen_q < seqlen_k and seqlen_q > seqlen_k,
causal and windowed, on fresh random inputs; and the two conventions must
really differ on those shapes (else the test could not fail).
"""

import os
import subprocess
import sys
import time

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
import flashattn as fa  # noqa: E402

import ref_numpy  # noqa: E402

BUILD = os.environ.get("FA_BUILD", "build")
CLI = os.path.join(BUILD, "flashattn")
SEED = int(os.environ.get("FA_TEST_SEED", "0") or 0) or int(time.time()) & 0xFFFFFFFF


def need_lib():
    try:
        fa.library()
    except OSError as e:  # e.g. the sanitizer build makes no shared library
        pytest.skip(f"libflashattn.so not available: {e}")


SHAPES = [(11, 37), (37, 11)]                        # Sq < Sk and Sq > Sk
MASKS = [dict(causal=True), dict(window=(4, 2)), dict(window=(3, -1), causal=True)]


def inputs(Sq, Sk, H=4, Hk=2, d=16, seed=0):
    rng = np.random.default_rng([SEED, seed])
    q = rng.standard_normal((2, Sq, H, d)).astype(np.float32)
    k = rng.standard_normal((2, Sk, Hk, d)).astype(np.float32)
    v = rng.standard_normal((2, Sk, Hk, d)).astype(np.float32)
    return q, k, v


def ref(q, k, v, align, **mask):
    return ref_numpy.attention_forward(q, k, v, causal=mask.get("causal", False),
                                       window=mask.get("window", (-1, -1)), align=align)


@pytest.mark.parametrize("shape", SHAPES, ids=["q_shorter", "q_longer"])
@pytest.mark.parametrize("mask", MASKS, ids=["causal", "window", "causal_window_left"])
@pytest.mark.parametrize("align", ["bottom-right", "top-left"])
def test_forward_every_impl(shape, mask, align):
    need_lib()
    q, k, v = inputs(*shape, seed=1)
    o_ref, lse_ref = ref(q, k, v, align, **mask)
    other, _ = ref(q, k, v, "top-left" if align == "bottom-right" else "bottom-right", **mask)
    assert np.max(np.abs(other - o_ref)) > 0.1, f"seed {SEED}: the conventions do not differ here"
    for impl, tol in (("reference", 2e-6), ("standard", 5e-5), ("flash", 5e-5)):
        o, lse = fa.attention(q, k, v, impl=impl, return_lse=True, align=align, **mask)
        assert np.max(np.abs(o - o_ref)) < tol, f"seed {SEED}: {impl} O"
        fin = np.isfinite(lse_ref)
        assert np.array_equal(np.isfinite(lse), fin), f"seed {SEED}: {impl} empty rows"
        assert np.max(np.abs(lse[fin] - lse_ref[fin])) < tol * 10, f"seed {SEED}: {impl} LSE"
        assert np.all(o[~np.broadcast_to(fin.transpose(0, 2, 1)[..., None], o.shape)] == 0)


@pytest.mark.parametrize("shape", SHAPES, ids=["q_shorter", "q_longer"])
@pytest.mark.parametrize("align", ["bottom-right", "top-left"])
def test_backward(shape, align):
    need_lib()
    q, k, v = inputs(*shape, seed=2)
    do = np.random.default_rng([SEED, 3]).standard_normal((2, shape[0], 4, 16)).astype(np.float32)
    want = ref_numpy.attention_backward(q, k, v, do, causal=True, window=(5, -1), align=align)
    for impl in ("reference", "flash"):
        got = fa.grad(q, k, v, do, causal=True, window=(5, -1), impl=impl, align=align)
        for g, w, name in zip(got, want, ("dq", "dk", "dv")):
            assert np.max(np.abs(g - w)) < 1e-4, f"seed {SEED}: {impl} {name}"


@pytest.mark.parametrize("shape", SHAPES, ids=["q_shorter", "q_longer"])
def test_check_follows_the_alignment(shape):
    need_lib()
    q, k, v = inputs(*shape, seed=4)
    o_tl, lse_tl = ref(q, k, v, "top-left", causal=True)
    o_tl = o_tl.astype(np.float32)
    assert fa.check(q, k, v, o_tl, lse_tl, causal=True, align="top-left", dtype="f32").passed
    assert not fa.check(q, k, v, o_tl, causal=True, dtype="f32").passed
    with pytest.raises(ValueError):
        fa.attention(q, k, v, causal=True, align="top_left")


def test_cli_align(tmp_path):
    if not os.access(CLI, os.X_OK):
        pytest.skip(f"{CLI} not built")
    q, k, v = inputs(9, 30, seed=5)
    for n, a in (("q", q), ("k", k), ("v", v)):
        np.save(tmp_path / f"{n}.npy", a)
    o_tl, _ = ref(q, k, v, "top-left", window=(3, 1))
    np.save(tmp_path / "o.npy", o_tl.astype(np.float32))
    base = [CLI, "check", "-q", str(tmp_path / "q.npy"), "-k", str(tmp_path / "k.npy"),
            "-v", str(tmp_path / "v.npy"), "--out", str(tmp_path / "o.npy"), "--window", "3,1"]
    assert subprocess.run(base + ["--align", "top-left"], capture_output=True).returncode == 0
    assert subprocess.run(base, capture_output=True).returncode == 1
    assert subprocess.run(base + ["--align", "bottom-right"], capture_output=True).returncode == 1
    r = subprocess.run(base + ["--align", "diagonal"], capture_output=True, text=True)
    assert r.returncode == 2 and "--align" in r.stderr and r.stderr.count("\n") == 1
    # run honours it too
    run = [CLI, "run", "-q", str(tmp_path / "q.npy"), "-k", str(tmp_path / "k.npy"),
           "-v", str(tmp_path / "v.npy"), "-o", str(tmp_path / "o2.npy"), "--window", "3,1",
           "--align", "top-left"]
    assert subprocess.run(run, capture_output=True).returncode == 0
    assert np.max(np.abs(np.load(tmp_path / "o2.npy") - o_tl)) < 5e-5


def test_cli_grad_align(tmp_path):
    if not os.access(CLI, os.X_OK):
        pytest.skip(f"{CLI} not built")
    q, k, v = inputs(20, 9, seed=6)
    do = np.random.default_rng([SEED, 7]).standard_normal((2, 20, 4, 16)).astype(np.float32)
    for n, a in (("q", q), ("k", k), ("v", v), ("do", do)):
        np.save(tmp_path / f"{n}.npy", a)
    want = ref_numpy.attention_backward(q, k, v, do, causal=True, align="top-left")
    other = ref_numpy.attention_backward(q, k, v, do, causal=True)
    assert np.max(np.abs(want[0] - other[0])) > 1e-2
    outs = [str(tmp_path / f"{n}.npy") for n in ("dq", "dk", "dv")]
    r = subprocess.run([CLI, "grad", "-q", str(tmp_path / "q.npy"), "-k", str(tmp_path / "k.npy"),
                        "-v", str(tmp_path / "v.npy"), "--dout", str(tmp_path / "do.npy"),
                        "--dq", outs[0], "--dk", outs[1], "--dv", outs[2], "--causal", "--align", "top-left"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    for path, w in zip(outs, want):
        assert np.max(np.abs(np.load(path) - w)) < 1e-4, f"seed {SEED}: {path}"
