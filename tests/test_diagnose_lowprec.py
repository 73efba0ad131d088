"""test_diagnose_lowprec.py -- `check --qkv-format ... --diagnose` names descale and p-saturation (issue 13).

The FP8 kernel is tests/test_lowprec.py's independent numpy emulation of FlashAttention-3's
data path (fp32, P scaled by 2^offset and rounded to e4m3, row sums unrounded, key blocks
of 128 last to first; written from hopper/softmax.h, no code shared with src/). Into it
one mistake is injected -- one (batch, kv head)'s K, Q or V descale off by a factor, or P
saturating at 448 (offset 12: FlashAttention-4 before its PR 2717) -- and `--diagnose`
must name that class first, with the factor and the group; the correct output (and the
same with --kernel-model fa3) must get `diagnosis: none`. Fresh random inputs per run
(FA_TEST_SEED replays one).
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
import test_lowprec as T  # noqa: E402  (the numpy FP8 kernel emulation and quantizers)

BUILD = os.environ.get("FA_BUILD", "build")
CLI = os.path.join(BUILD, "flashattn")
SEED = int(os.environ.get("FA_TEST_SEED", "0") or 0) or int(time.time()) & 0xFFFFFFFF

pytestmark = pytest.mark.skipif(not os.access(CLI, os.X_OK), reason=f"{CLI} not built")


@pytest.fixture
def fp8(tmp_path):
    return T.make_fp8_problem(tmp_path, SEED)


def diagnose(p, out, *extra):
    o = T.save(p["tmp"] / "o.npy", out)
    r = subprocess.run([CLI, *T.check_args(p, o, "--diagnose", *extra)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode in (0, 1), r.stdout + r.stderr
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("diagnosis: ")]
    return r.returncode, lines, r.stdout


def first_id(lines):
    return re.match(r"diagnosis: (\S+)", lines[0]).group(1)


def kernel(p, dq=None, dk=None, dv=None, offset=8.0):
    return T.fa3_fp8_kernel(p["q8"], p["k8"], p["v8"], p["dq"] if dq is None else dq,
                            p["dk"] if dk is None else dk, p["dv"] if dv is None else dv, offset=offset)


@pytest.mark.parametrize("model", [[], ["--kernel-model", "fa3"]])
def test_correct_fp8_output_gets_none(fp8, model):
    rc, lines, out = diagnose(fp8, kernel(fp8), *model)
    assert rc == 0 and lines == [lines[0]] and lines[0].startswith("diagnosis: none"), f"seed {SEED}: {out}"


@pytest.mark.parametrize("which,group,factor", [("dk", (1, 0), 2.0), ("dq", (0, 1), 0.5), ("dv", (0, 1), 2.0),
                                                ("dv", (1, 1), 0.5)])
def test_one_descale_off(fp8, which, group, factor):
    d = {k: fp8[k].copy() for k in ("dq", "dk", "dv")}
    d[which][group] *= factor
    rc, lines, out = diagnose(fp8, kernel(fp8, **d))
    assert rc == 1 and first_id(lines) == "descale", f"seed {SEED}: {out}"
    assert "1 of 4 descales off" in lines[0], out
    m = re.search(r"\(batch (\d+), kv head (\d+)\) (Q or K|V) x([0-9.e+-]+)", lines[0])
    assert m and (int(m.group(1)), int(m.group(2))) == group, out
    assert m.group(3) == ("V" if which == "dv" else "Q or K"), out
    assert abs(float(m.group(4)) / factor - 1) < 0.05, out


def test_p_saturation(fp8):
    rc, lines, out = diagnose(fp8, kernel(fp8, offset=12.0))
    assert rc == 1 and first_id(lines) == "p-saturation", f"seed {SEED}: {out}"
    assert "P saturated at 448 (e4m3's max)" in lines[0], out
    m = re.search(r"scaled by ~2\^([0-9.]+)", lines[0])
    assert m and abs(float(m.group(1)) - 12.0) <= 0.5, out


def test_every_descale_off_is_scale(fp8):
    """The K descale of every group off by one factor is a logit scale: `scale` names it."""
    rc, lines, out = diagnose(fp8, kernel(fp8, dk=fp8["dk"] * 2))
    assert rc == 1 and first_id(lines) == "scale", f"seed {SEED}: {out}"
