"""test_diagnose_sinks.py -- `check --diagnose` with attention sinks: sink-missing (issue 13).

A kernel with attention sinks (one logit sink_h per query head in the softmax denominator
only) that leaves the sink out of O's denominator, of the LSE, or of both is modelled here
by an independent float64 numpy model (plain softmax attention written out below; no code
shared with src/diagnose.c), and `check --diagnose --sinks` must name `sink-missing`
FIRST, with the way it was left out. Correct outputs (tests/ref_numpy.py's sinks model
rounded to f32, and the library's own flash output) get `diagnosis: none`. The python
diagnose() gives the same answer. Fresh random inputs (FA_TEST_SEED replays a run).
"""

import os
import re
import sys
import time

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import ref_numpy as R  # noqa: E402
from diag_cli import check_diagnose, first_id  # noqa: E402

BUILD = os.environ.get("FA_BUILD", "build")
CLI = os.path.join(BUILD, "flashattn")
SEED = int(os.environ.get("FA_TEST_SEED", "0") or 0) or int(time.time()) & 0xFFFFFFFF

pytestmark = pytest.mark.skipif(not os.access(CLI, os.X_OK), reason=f"{CLI} not built")

B, SQ, SK, H, HK, D = 2, 24, 40, 4, 2, 16


def rand(shape, salt):
    return np.random.default_rng([SEED, salt]).standard_normal(shape).astype(np.float32)


def inputs():
    q, k, v = rand((B, SQ, H, D), 1), rand((B, SK, HK, D), 2), rand((B, SK, HK, D), 3)
    # sinks in [1, 3]: e^sink is a visible share of the row's denominator (about 40 e^0.5)
    sinks = (1.0 + 2.0 * np.random.default_rng([SEED, 4]).random(H)).astype(np.float32)
    return q, k, v, sinks


def model(q, k, v, sinks, causal, sink_in_o, sink_in_lse):
    """O [B, SQ, H, D] and LSE [B, H, SQ] of attention with sinks, written out: the sink of
    head h joins O's denominator when sink_in_o, the LSE when sink_in_lse."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    o = np.zeros((B, SQ, H, D))
    lse = np.zeros((B, H, SQ))
    for b in range(B):
        for h in range(H):
            kh = h // (H // HK)
            s = q[b, :, h] @ k[b, :, kh].T / np.sqrt(D)
            if causal:
                s = np.where(np.arange(SK)[None, :] <= np.arange(SQ)[:, None] + (SK - SQ), s, -np.inf)
            m = s.max(axis=1, keepdims=True)
            e = np.exp(s - m)
            den = e.sum(axis=1)
            with_sink = den + np.exp(float(sinks[h]) - m[:, 0])
            o[b, :, h] = (e @ v[b, :, kh]) / (with_sink if sink_in_o else den)[:, None]
            lse[b, h] = m[:, 0] + np.log(with_sink if sink_in_lse else den)
    return o, lse


def check(tmp, arrays, extra=()):
    for name, x in arrays.items():
        np.save(tmp / f"{name}.npy", x)
    flags = ["-q", "q", "-k", "k", "-v", "v", "--out", "o", "--sinks", "sinks"]
    if "lse" in arrays:
        flags += ["--lse", "lse"]
    flags = [str(tmp / f"{a}.npy") if a in arrays else a for a in flags]
    return check_diagnose([*flags, *extra])


def f32(x):
    return np.asarray(x, np.float32)


@pytest.mark.parametrize("causal", [False, True])
def test_correct_with_sinks_gets_none(tmp_path, causal):
    q, k, v, sinks = inputs()
    o, lse = R.attention_forward(q, k, v, causal=causal, sinks=sinks)
    # the independent model agrees with ref_numpy on the right answer
    o2, lse2 = model(q, k, v, sinks, causal, True, True)
    assert np.allclose(o, o2, atol=1e-12) and np.allclose(lse, lse2, atol=1e-12)
    rc, lines, out = check(tmp_path, dict(q=q, k=k, v=v, o=f32(o), lse=f32(lse), sinks=sinks),
                           ["--causal"] if causal else [])
    assert rc == 0 and lines == [lines[0]] and lines[0].startswith("diagnosis: none"), f"seed {SEED}: {out}"


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("in_o,in_lse,what", [
    (False, False, "denominator and of the LSE"),
    (False, True, "left out of O's denominator"),
    (True, False, "left out of the LSE"),
])
def test_sink_missing(tmp_path, causal, in_o, in_lse, what):
    q, k, v, sinks = inputs()
    o, lse = model(q, k, v, sinks, causal, in_o, in_lse)
    rc, lines, out = check(tmp_path, dict(q=q, k=k, v=v, o=f32(o), lse=f32(lse), sinks=sinks),
                           ["--causal"] if causal else [])
    assert rc == 1 and lines and first_id(lines) == "sink-missing", f"seed {SEED}: {out}"
    assert what in lines[0], f"seed {SEED}: {out}"
    assert float(re.search(r"explains (\d+)", lines[0]).group(1)) >= 99, out


def test_sink_missing_without_lse(tmp_path):
    q, k, v, sinks = inputs()
    o, _ = model(q, k, v, sinks, False, False, False)
    rc, lines, out = check(tmp_path, dict(q=q, k=k, v=v, o=f32(o), sinks=sinks))
    assert rc == 1 and lines and first_id(lines) == "sink-missing", f"seed {SEED}: {out}"


def test_sinks_on_a_right_output_without_sinks(tmp_path):
    """The kernel has no sinks but the check is told it has: the output is the sink-free
    softmax, which is exactly sink-missing's prediction."""
    q, k, v, sinks = inputs()
    o, lse = R.attention_forward(q, k, v)
    rc, lines, out = check(tmp_path, dict(q=q, k=k, v=v, o=f32(o), lse=f32(lse), sinks=sinks))
    assert rc == 1 and first_id(lines) == "sink-missing", f"seed {SEED}: {out}"


def _lib():
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
    import flashattn as fa
    try:
        fa.library()
    except OSError as e:  # the sanitizer build makes no shared library
        pytest.skip(f"libflashattn.so not available: {e}")
    return fa


def test_flash_output_with_sinks_gets_none(tmp_path):
    fa = _lib()
    q, k, v, sinks = inputs()
    o, lse = fa.attention(q, k, v, causal=True, sinks=sinks, return_lse=True)
    rc, lines, out = check(tmp_path, dict(q=q, k=k, v=v, o=f32(o), lse=f32(lse), sinks=sinks), ["--causal"])
    assert rc == 0 and lines[0].startswith("diagnosis: none"), f"seed {SEED}: {out}"


def test_python_diagnose_sink_missing():
    fa = _lib()
    q, k, v, sinks = inputs()
    o, lse = model(q, k, v, sinks, False, False, True)
    rep = fa.diagnose(q, k, v, f32(o), f32(lse), sinks=sinks)
    assert rep.first == "sink-missing" and rep.diagnoses[0]["param"] == 2, f"seed {SEED}: {rep.text}"
    assert "left out of O's denominator" in rep.diagnoses[0]["detail"], rep.text
    assert "sink-missing" in rep.considered
    o, lse = R.attention_forward(q, k, v, sinks=sinks)
    rep = fa.diagnose(q, k, v, f32(o), f32(lse), sinks=sinks)
    assert rep.first is None, f"seed {SEED}: {rep.text}"
