"""test_diagnose_dropout.py -- `check --diagnose` with dropout: dropout-mask (issue 13).

A kernel with dropout (O = (P o Z / (1 - p)) V for a 0/1 keep-mask Z, the LSE of the
undropped scores) that applies Z wrongly -- not at all, without the 1/(1-p) scale, read
transposed, or shifted by keys or rows -- is modelled here by an independent float64 numpy
model (written out below; no code shared with src/diagnose.c), and `check --diagnose
--dropout-p --dropout-mask` must name `dropout-mask` FIRST with the way it was applied.
Correct outputs (tests/ref_numpy.py's dropout model rounded to f32, and the library's own
output) get `diagnosis: none`. Fresh random inputs (FA_TEST_SEED replays a run).
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
P = 0.25


def rand(shape, salt):
    return np.random.default_rng([SEED, salt]).standard_normal(shape).astype(np.float32)


def inputs():
    q, k, v = rand((B, SQ, H, D), 1), rand((B, SK, HK, D), 2), rand((B, SK, HK, D), 3)
    keep = (np.random.default_rng([SEED, 4]).random((B, H, SQ, SK)) >= P).astype(np.uint8)
    return q, k, v, keep


def model(q, k, v, z, causal):
    """O [B, SQ, H, D] and LSE [B, H, SQ]: softmax P of the scaled scores, O = (P * z) V
    for the given per-element factor z [B, H, SQ, SK]; the LSE of the undropped scores."""
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
            den = e.sum(axis=1, keepdims=True)
            o[b, :, h] = (e / den * z[b, h]) @ v[b, :, kh]
            lse[b, h] = m[:, 0] + np.log(den[:, 0])
    return o, lse


def shifted(keep, rows, keys):
    """keep read at (i + rows, j + keys), zero outside."""
    z = np.zeros(keep.shape, np.float64)
    for i in range(SQ):
        for j in range(SK):
            r, c = i + rows, j + keys
            if 0 <= r < SQ and 0 <= c < SK:
                z[:, :, i, j] = keep[:, :, r, c]
    return z


def transposed(keep):
    """keep [SQ][SK] per (b, h) read as if it were [SK][SQ]: element (i, j) at flat j * SQ + i."""
    flat = keep.reshape(B, H, SQ * SK)
    idx = np.arange(SK)[None, :] * SQ + np.arange(SQ)[:, None]      # [SQ, SK]
    return flat[:, :, idx].astype(np.float64)


def check(tmp, arrays, extra=()):
    for name, x in arrays.items():
        np.save(tmp / f"{name}.npy", x)
    flags = ["-q", "q", "-k", "k", "-v", "v", "--out", "o", "--dropout-mask", "keep", "--lse", "lse"]
    flags = [str(tmp / f"{a}.npy") if a in arrays else a for a in flags]
    return check_diagnose([*flags, "--dropout-p", str(P), *extra])


def f32(x):
    return np.asarray(x, np.float32)


@pytest.mark.parametrize("causal", [False, True])
def test_correct_with_dropout_gets_none(tmp_path, causal):
    q, k, v, keep = inputs()
    o, lse = R.attention_forward(q, k, v, causal=causal, dropout_p=P, dropout_mask=keep)
    o2, lse2 = model(q, k, v, keep / (1 - P), causal)       # the independent model agrees
    assert np.allclose(o, o2, atol=1e-12) and np.allclose(lse, lse2, atol=1e-12)
    rc, lines, out = check(tmp_path, dict(q=q, k=k, v=v, o=f32(o), lse=f32(lse), keep=keep),
                           ["--causal"] if causal else [])
    assert rc == 0 and lines == [lines[0]] and lines[0].startswith("diagnosis: none"), f"seed {SEED}: {out}"


CASES = [
    ("none", lambda keep: np.ones(keep.shape), "not applied"),
    ("no-scale", lambda keep: keep.astype(np.float64), "without the 1/(1-p) scale"),
    ("transposed", lambda keep: transposed(keep) / (1 - P), "transposed"),
    ("key+1", lambda keep: shifted(keep, 0, 1) / (1 - P), "+1 keys off"),
    ("key-2", lambda keep: shifted(keep, 0, -2) / (1 - P), "-2 keys off"),
    ("row-1", lambda keep: shifted(keep, -1, 0) / (1 - P), "-1 rows off"),
]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name,zf,what", CASES, ids=[c[0] for c in CASES])
def test_dropout_mask(tmp_path, causal, name, zf, what):
    q, k, v, keep = inputs()
    o, lse = model(q, k, v, zf(keep), causal)
    rc, lines, out = check(tmp_path, dict(q=q, k=k, v=v, o=f32(o), lse=f32(lse), keep=keep),
                           ["--causal"] if causal else [])
    assert rc == 1 and lines and first_id(lines) == "dropout-mask", f"seed {SEED}: {out}"
    assert what in lines[0], f"seed {SEED}: {out}"
    assert float(re.search(r"explains (\d+)", lines[0]).group(1)) >= 99, out


def test_library_output_with_dropout_gets_none(tmp_path):
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
    import flashattn as fa
    try:
        fa.library()
    except OSError as e:  # the sanitizer build makes no shared library
        pytest.skip(f"libflashattn.so not available: {e}")
    q, k, v, keep = inputs()
    o, lse = fa.attention(q, k, v, causal=True, dropout_p=P, dropout_mask=keep, return_lse=True)
    rc, lines, out = check(tmp_path, dict(q=q, k=k, v=v, o=f32(o), lse=f32(lse), keep=keep), ["--causal"])
    assert rc == 0 and lines[0].startswith("diagnosis: none"), f"seed {SEED}: {out}"
    o, lse = model(q, k, v, keep.astype(np.float64), True)
    rep = fa.diagnose(q, k, v, f32(o), f32(lse), causal=True, dropout_p=P, dropout_mask=keep)
    assert rep.first == "dropout-mask" and "without the 1/(1-p)" in rep.diagnoses[0]["detail"], rep.text
