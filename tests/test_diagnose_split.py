"""test_diagnose_split.py -- `check --diagnose` names a wrong split-KV combine (split-combine, issue 13).

A split-KV (flash-decoding) kernel computes a partial (O_s, LSE_s) over each chunk of the keys
and merges them; the merge is where it goes wrong. An independent float64 numpy model here
splits the keys into n chunks of ceil(seqlen_k / n), computes each partial exactly, and merges
them one wrong way -- the partial outputs averaged, the partial sums used as weights without
rescaling to a common max, only the last split kept, the LSE taken as the max of the partial
LSEs -- and `--diagnose` must name split-combine first with the number of splits. The right
merge gets `diagnosis: none`. Fresh random inputs (FA_TEST_SEED replays a run).
"""

import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import ref_numpy as R  # noqa: E402

BUILD = os.environ.get("FA_BUILD", "build")
CLI = os.path.join(BUILD, "flashattn")
SEED = int(os.environ.get("FA_TEST_SEED", "0") or 0) or int(time.time()) & 0xFFFFFFFF

pytestmark = pytest.mark.skipif(not os.access(CLI, os.X_OK), reason=f"{CLI} not built")


def rand(shape, salt, amp=1.0):
    return (amp * np.random.default_rng([SEED, salt]).standard_normal(shape)).astype(np.float32)


def split_kv(q, k, v, n, merge, causal=False):
    """O [B, Sq, H, D], LSE [B, H, Sq] of a split-KV kernel with n splits and the given merge."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    B, Sq, H, D = q.shape
    Sk, Hk = k.shape[1], k.shape[2]
    chunk = -(-Sk // n)
    keep = R.visible_mask(Sq, Sk, causal=causal)
    o = np.zeros((B, Sq, H, v.shape[3]))
    lse = np.zeros((B, H, Sq))
    for b in range(B):
        for h in range(H):
            s = q[b, :, h] @ k[b, :, h // (H // Hk)].T / np.sqrt(D)
            s = np.where(keep, s, -np.inf)
            parts = []
            for c in range(n):
                sc = s[:, c * chunk:(c + 1) * chunk]
                if sc.shape[1] == 0:
                    continue
                m = sc.max(1, keepdims=True)
                e = np.exp(sc - m)
                lsum = e.sum(1, keepdims=True)
                parts.append((e @ v[b, c * chunk:(c + 1) * chunk, h // (H // Hk)], lsum, m))
            accs = np.stack([p[0] for p in parts])            # [n, Sq, dv]: unnormalized, own max
            ls = np.stack([p[1] for p in parts])              # [n, Sq, 1]
            ms = np.stack([p[2] for p in parts])
            lses = ms + np.log(ls)
            M = lses.max(0)
            w = np.exp(lses - M)
            right_o, right_lse = (w * accs / ls).sum(0) / w.sum(0), M + np.log(w.sum(0))
            if merge == "mean":
                ob, lb = (accs / ls).mean(0), right_lse
            elif merge == "own-max":
                ob, lb = accs.sum(0) / ls.sum(0), right_lse
            elif merge == "last":
                ob, lb = accs[-1] / ls[-1], lses[-1]
            elif merge == "lse-max":
                ob, lb = right_o, M
            else:
                ob, lb = right_o, right_lse
            o[b, :, h], lse[b, h] = ob, lb[:, 0]
    return o, lse


def diagnose(tmp, q, k, v, o, lse):
    for name, x in dict(q=q, k=k, v=v, o=np.asarray(o, np.float32), lse=np.asarray(lse, np.float32)).items():
        np.save(tmp / f"{name}.npy", x)
    r = subprocess.run([CLI, "check", "-q", tmp / "q.npy", "-k", tmp / "k.npy", "-v", tmp / "v.npy", "--out",
                        tmp / "o.npy", "--lse", tmp / "lse.npy", "--diagnose"], capture_output=True, text=True)
    assert r.returncode in (0, 1), r.stderr
    return r.returncode, [ln for ln in r.stdout.splitlines() if ln.startswith("diagnosis: ")], r.stdout


def problem():
    return rand((2, 4, 4, 32), 1, 1.5), rand((2, 300, 2, 32), 2, 1.5), rand((2, 300, 2, 32), 3)


def test_right_merge_gets_none(tmp_path):
    q, k, v = problem()
    o, lse = split_kv(q, k, v, 3, "right")
    rc, lines, out = diagnose(tmp_path, q, k, v, o, lse)
    assert rc == 0 and lines[0].startswith("diagnosis: none"), f"seed {SEED}: {out}"


@pytest.mark.parametrize("merge,n,words", [("mean", 3, "averaged"), ("own-max", 4, "without rescaling"),
                                           ("last", 5, "last split"), ("lse-max", 3, "max of the splits' LSEs")])
def test_wrong_merge_is_split_combine(tmp_path, merge, n, words):
    q, k, v = problem()
    o, lse = split_kv(q, k, v, n, merge)
    rc, lines, out = diagnose(tmp_path, q, k, v, o, lse)
    assert rc == 1 and lines[0].startswith("diagnosis: split-combine"), f"seed {SEED}: {out}"
    m = re.search(r"(\d+) splits of the keys: (.*)\)", lines[0])
    assert m and int(m.group(1)) == n and words in m.group(2), out
