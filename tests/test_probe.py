"""test_probe.py -- `flashattn probe --out DIR` (issue 13 item 2).

The probe sets must have the properties their README lines promise
(seqlen_q != seqlen_k both ways, V = 1, q = 0, uneven GQA, seqlen_k not a
multiple of 64, BHSD copies of the strided probe, scores rising with the key),
one README line per probe, and a mistake injected into an output computed on
a probe (by tests/ref_numpy.py, the independent float64 model) must be named
by `check --diagnose`. Bad usage: one line, exit 2, no README.
"""

import os
import re
import subprocess
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import ref_numpy as R  # noqa: E402

BUILD = os.environ.get("FA_BUILD", "build")
CLI = os.path.join(BUILD, "flashattn")
pytestmark = pytest.mark.skipif(not os.access(CLI, os.X_OK), reason=f"{CLI} not built")
PROBES = ["q-shorter", "q-longer", "v-ones", "q-zero", "gqa-uneven", "tail-keys", "rising-scores",
          "strided", "large-logits"]


@pytest.fixture(scope="module")
def probe_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("probe")
    r = subprocess.run([CLI, "probe", "--out", str(d), "--batch", "1", "--seqlen", "48", "--heads", "4",
                        "--heads-k", "2", "--d", "16", "--seed", "3"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return d


def load(d, name):
    return tuple(np.load(d / name / f"{x}.npy") for x in "qkv")


def test_readme_has_one_line_per_probe(probe_dir):
    text = (probe_dir / "README").read_text()
    for name in PROBES:
        lines = [ln for ln in text.splitlines() if ln.startswith(name + " ")]
        assert len(lines) == 1 and "]: " in lines[0], name
        assert os.path.isdir(probe_dir / name)


def test_probe_properties(probe_dir):
    q, k, v = load(probe_dir, "q-shorter")
    assert q.shape[1] < k.shape[1]
    q, k, v = load(probe_dir, "q-longer")
    assert q.shape[1] > k.shape[1]
    q, k, v = load(probe_dir, "v-ones")
    assert np.all(v == 1) and np.std(q) > 0.5
    q, k, v = load(probe_dir, "q-zero")
    assert np.all(q == 0) and np.std(k) > 0.5
    q, k, v = load(probe_dir, "gqa-uneven")
    assert (q.shape[2], k.shape[2]) == (6, 3)
    q, k, v = load(probe_dir, "tail-keys")
    assert all(k.shape[1] % t for t in (16, 32, 64, 128))
    q, k, v = load(probe_dir, "strided")
    B, S, H, d = q.shape
    assert len({S, H, d}) == 3 and k.shape[1] != S
    for x in "qkv":
        a, bh = np.load(probe_dir / "strided" / f"{x}.npy"), np.load(probe_dir / "strided" / f"{x}_bhsd.npy")
        assert np.array_equal(bh.transpose(0, 2, 1, 3), a)
    q, k, v = load(probe_dir, "rising-scores")
    s = np.einsum("bihd,bjhd->bhij", q[:, :, :2].astype(np.float64), k.astype(np.float64))
    assert np.all(np.argmax(s, axis=-1) > 0.9 * k.shape[1])       # the max is among the last keys
    # the probe is seeded: a second run writes the same bytes
    assert np.array_equal(load(probe_dir, "q-shorter")[0], load(probe_dir, "q-shorter")[0])


def diagnose(tmp, q, k, v, o, flags):
    for n, a in (("q", q), ("k", k), ("v", v), ("o", o)):
        np.save(tmp / f"{n}.npy", a)
    r = subprocess.run([CLI, "check", "-q", str(tmp / "q.npy"), "-k", str(tmp / "k.npy"), "-v", str(tmp / "v.npy"),
                        "--out", str(tmp / "o.npy"), "--diagnose", *flags], capture_output=True, text=True)
    return [ln for ln in r.stdout.splitlines() if ln.startswith("diagnosis: ")], r.stdout


def test_probes_separate_classes(probe_dir, tmp_path):
    # a top-left kernel on q-longer under --causal
    q, k, v = load(probe_dir, "q-longer")
    o, _ = R.attention_forward(q, k, v, causal=True, align="top-left")
    lines, out = diagnose(tmp_path, q, k, v, o.astype(np.float32), ["--causal"])
    assert lines[0].startswith("diagnosis: causal-top-left"), out
    # h % heads_k on gqa-uneven
    q, k, v = load(probe_dir, "gqa-uneven")
    kk = k[:, :, [h % 3 for h in range(6)]]
    vv = v[:, :, [h % 3 for h in range(6)]]
    o, _ = R.attention_forward(q, kk, vv)
    lines, out = diagnose(tmp_path, q, k, v, o.astype(np.float32), [])
    assert lines[0].startswith("diagnosis: gqa-head-map"), out
    # zero-padded tail on tail-keys
    q, k, v = load(probe_dir, "tail-keys")
    pad = -k.shape[1] % 64
    z = np.zeros((k.shape[0], pad) + k.shape[2:], np.float32)
    o, _ = R.attention_forward(q, np.concatenate([k, z], 1), np.concatenate([v, z], 1))
    lines, out = diagnose(tmp_path, q, k, v, o.astype(np.float32), [])
    assert lines[0].startswith("diagnosis: tail-tile"), out


def test_bad_usage(tmp_path):
    for args, what in ((["probe"], "--out"), (["probe", "--out", str(tmp_path / "p"), "--heads", "7"], "multiple"),
                       (["probe", "--out", str(tmp_path / "p"), "--dtype", "f64"], "--dtype"),
                       (["probe", "--out", str(tmp_path / "p"), "--bogus"], "unknown option")):
        r = subprocess.run([CLI, *args], capture_output=True, text=True)
        assert r.returncode == 2 and what in r.stderr and r.stderr.count("\n") == 1, r.stderr
        assert not os.path.exists(tmp_path / "p" / "README")
    f = tmp_path / "file"
    f.write_text("x")
    r = subprocess.run([CLI, "probe", "--out", str(f)], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    r = subprocess.run([CLI, "probe", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "--out DIR" in r.stdout
