"""test_probe.py -- `flashattn probe --out DIR` (issue 13 item 2).

The probe sets must have the properties their README lines promise
(seqlen_q != seqlen_k both ways, V = 1, q = 0, uneven GQA, seqlen_k not a
multiple of 64, BHSD copies of the strided probe, scores rising with the key, a KV cache
with new keys and RoPE tables with room for offsets),
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
          "strided", "large-logits", "rotary-kvcache"]


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


def test_rotary_probe(probe_dir, tmp_path):
    """rotary-kvcache: a KV cache with new keys, cache_seqlens >= 4, RoPE tables 16 rows past the
    largest position; a kernel with the other pairing on it is named rotary-pairing, the right
    output gets none (both by tests/ref_numpy.py)."""
    d = probe_dir / "rotary-kvcache"
    q, kc, vc, kn, vn = (np.load(d / f"{x}.npy") for x in ("q", "k", "v", "k_new", "v_new"))
    cs, cos, sin = np.load(d / "cache_seqlens.npy"), np.load(d / "rotary_cos.npy"), np.load(d / "rotary_sin.npy")
    assert cs.dtype == np.int32 and np.all(cs >= 4) and np.all(cs + kn.shape[1] <= kc.shape[1])
    assert cos.shape == sin.shape == (int(cs.max()) + max(q.shape[1], kn.shape[1]) + 16, q.shape[3] // 2)
    assert np.allclose(cos ** 2 + sin ** 2, 1, atol=1e-6) and np.all(cos[0] == 1)
    flags = ["--cache-seqlens", str(d / "cache_seqlens.npy"), "--k-new", str(d / "k_new.npy"), "--v-new",
             str(d / "v_new.npy"), "--rotary-cos", str(d / "rotary_cos.npy"), "--rotary-sin",
             str(d / "rotary_sin.npy"), "--causal"]
    for inter, want in ((False, "diagnosis: none"), (True, "diagnosis: rotary-pairing")):
        o, _ = R.kvcache_forward(q, kc, vc, cs, kn, vn, rotary_cos=cos, rotary_sin=sin, rotary_interleaved=inter,
                                 causal=True)
        lines, out = diagnose(tmp_path, q, kc, vc, o.astype(np.float32), flags)
        assert lines[0].startswith(want), out


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


def tree(d):
    return sorted(str(p.relative_to(d)) for p in d.rglob("*"))


def test_failed_probe_leaves_nothing_behind(tmp_path):
    """A probe run that cannot finish names the path and the reason (never a bare 'I/O error')
    and leaves --out as it was: no half set of probe directories, no temporary directory."""
    probe = [CLI, "probe", "--seqlen", "16", "--d", "8", "--out"]
    out = tmp_path / "a"
    out.mkdir()
    (out / "tail-keys").write_text("in the way")                  # the 6th probe's directory is a file
    r = subprocess.run(probe + [str(out)], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "tail-keys" in r.stderr and "not a directory" in r.stderr and "I/O error" not in r.stderr, r.stderr
    assert tree(out) == ["tail-keys"], tree(out)
    # a directory where a file goes, in an earlier set
    out = tmp_path / "b"
    assert subprocess.run(probe + [str(out)], capture_output=True).returncode == 0
    (out / "v-ones" / "q.npy").unlink()
    (out / "v-ones" / "q.npy").mkdir()
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*")}
    r = subprocess.run(probe + [str(out), "--seed", "5"], capture_output=True, text=True)
    assert r.returncode == 2 and "v-ones/q.npy" in r.stderr and "I/O error" not in r.stderr, r.stderr
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*")} == before  # nothing replaced or added
    # a second successful run replaces the set and leaves no temporary directory
    (out / "v-ones" / "q.npy").rmdir()
    assert subprocess.run(probe + [str(out), "--seed", "5"], capture_output=True).returncode == 0
    assert not [p for p in out.iterdir() if p.name.startswith(".")]
    assert (out / "v-ones" / "q.npy").is_file() and "seed 5" in (out / "README").read_text()


def test_help_lists_only_written_dtypes(tmp_path):
    """probe --help lists the dtypes probe writes, and each one listed is accepted."""
    r = subprocess.run([CLI, "probe", "--help"], capture_output=True, text=True)
    m = re.search(r"--dtype (\S+)\]", r.stdout)
    assert m, r.stdout
    for dt in m.group(1).split("|"):
        out = tmp_path / dt
        w = subprocess.run([CLI, "probe", "--out", str(out), "--dtype", dt, "--seqlen", "8", "--d", "4"],
                           capture_output=True, text=True)
        assert w.returncode == 0, f"--help lists {dt} but: {w.stderr}"
        assert (out / "README").is_file()
