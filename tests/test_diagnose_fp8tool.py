"""test_diagnose_fp8tool.py -- tools/fp8_torch.py and tools/fp8_h200.sh without a GPU (issue 13 item 5).

The H200 run (docs/validation.md) uses PyTorch's float8_e4m3fn and torch._scaled_mm; here the
same pipeline runs on its numpy backend: its e4m3 encoder must equal tests/test_lowprec.py's
independent table search on every rounding case (ties, subnormals, saturation), and the
driver script must get every expected verdict and first diagnosis (good: pass; one K
descale 2x: descale, or scale when the descale is per tensor; P saturating at 448:
p-saturation) on small shapes.
"""

import os
import subprocess
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tools"))
import fp8_torch  # noqa: E402
import test_lowprec as T  # noqa: E402

BUILD = os.environ.get("FA_BUILD", "build")
CLI = os.path.join(BUILD, "flashattn")


def test_e4m3_encoder_equals_a_table_search():
    rng = np.random.default_rng(7)
    vals = T.decode(np.arange(256, dtype=np.uint8), T.E4M3)
    fin = vals[np.isfinite(vals)]
    mids = (np.sort(fin)[1:] + np.sort(fin)[:-1]) / 2          # every tie
    x = np.concatenate([fin, mids, rng.standard_normal(20000) * 50, rng.standard_normal(2000) * 1e-3,
                        [500.0, -1e6, 464.0, 2.0 ** -10, -(2.0 ** -10)]])
    got = fp8_torch.e4m3_encode(x)
    want = T.rne_sat(x, T.E4M3)
    assert np.array_equal(fp8_torch.e4m3_decode(got), T.decode(want, T.E4M3)), "e4m3 rounding differs"


def test_bf16_bits_round_to_nearest_even():
    x = np.array([1.0, 1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8, -2.5, 3.0e38], np.float32)
    import ref_numpy as R
    assert np.array_equal(fp8_torch.bf16_bits(x), R.float_to_bf16_bits(x))


@pytest.mark.skipif(not os.access(CLI, os.X_OK), reason=f"{CLI} not built")
def test_driver_script_on_the_numpy_backend(tmp_path):
    env = dict(os.environ, FP8_NO_BUILD="1", FP8_BACKEND="numpy", FP8_DEVICE="cpu", FLASHATTN=CLI,
               FP8_SHAPES="1 2 2 64 1 per-head\n1 4 2 128 0 per-tensor")
    r = subprocess.run(["sh", os.path.join(ROOT, "tools", "fp8_h200.sh"), str(tmp_path)], capture_output=True,
                       text=True, env=env, cwd=ROOT, timeout=600)
    summary = (tmp_path / "fp8_summary.md").read_text()
    assert r.returncode == 0, r.stdout + r.stderr + summary
    rows = [ln for ln in summary.splitlines() if ln.startswith("| ") and not ln.startswith("| case")]
    assert len(rows) == 10, summary
    firsts = [ln.split("|")[7].strip() for ln in rows]
    assert firsts.count("descale") == 1 and firsts.count("scale") == 1 and firsts.count("p-saturation") == 2, summary
    # a broken pipeline is caught: a script run whose P saturates in the "good" output too fails
    env["FP8_SHAPES"] = "1 2 2 64 0 per-head"
    bad = tmp_path / "bad"
    r2 = subprocess.run(["sh", "-c", f"sed 's/--descale \"$DS\" --backend/--descale \"$DS\" --saturate-p --backend/' "
                         f"tools/fp8_h200.sh > {bad}.sh && sh {bad}.sh {bad}"], capture_output=True, text=True,
                        env=env, cwd=ROOT, timeout=600)
    assert r2.returncode == 1 and "UNEXPECTED" in r2.stdout, r2.stdout + r2.stderr
