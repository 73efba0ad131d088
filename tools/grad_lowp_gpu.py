#!/usr/bin/env python3
"""Real bf16 / fp16 attention gradients from PyTorch's GPU backends, judged by two flashattn
builds side by side (`check-grad`): does a rule still pass every correct kernel, and does it
fail wrong ones?

For each shape (random inputs: q, k, v, dO standard normal), dtype (bf16, fp16) and SDPA
backend (flash, cudnn, efficient, math) the autograd backward's dQ, dK, dV are saved and
checked; then, expected to fail, the flash backend's gradients with dQ scaled by 1.04 and
with the last 8 key rows of dV zeroed (a tail tile never written). Prints one line per
(case, build): verdict, then each gradient's max error / bound.

    python3 tools/grad_lowp_gpu.py --old OLD/build/flashattn --new build/flashattn
    python3 tools/grad_lowp_gpu.py --old build/flashattn --new build/flashattn --shapes 2 --dtypes fp16

(the same build given twice is judged once; --shapes/--dtypes pick a part of the grid.)
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile

import numpy as np

try:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
except ImportError as e:  # pragma: no cover - needs a GPU machine
    sys.exit(f"grad_lowp_gpu.py needs PyTorch with CUDA: {e}")

BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}


def save_bshd(path, t):
    """[B, H, S, D] torch tensor -> BSHD .npy (bf16 as '<u2' bit patterns, fp16 as '<f2')."""
    t = t.detach().transpose(1, 2).contiguous().cpu()
    if t.dtype == torch.bfloat16:
        np.save(path, t.view(torch.int16).numpy().view(np.uint16))
    else:
        np.save(path, t.numpy())


def grads(q, k, v, do, backend, causal):
    q, k, v = (x.detach().clone().requires_grad_(True) for x in (q, k, v))
    with sdpa_kernel([BACKENDS[backend]]):
        o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    o.backward(do)
    return q.grad, k.grad, v.grad


def judge(exe, d, tag, causal):
    args = [exe, "check-grad", "-q", f"{d}/q.npy", "-k", f"{d}/k.npy", "-v", f"{d}/v.npy", "--dout", f"{d}/do.npy",
            "--dq", f"{d}/dq_{tag}.npy", "--dk", f"{d}/dk_{tag}.npy", "--dv", f"{d}/dv_{tag}.npy"]
    if causal:
        args.append("--causal")
    r = subprocess.run(args, capture_output=True, text=True)
    figs = []
    for g in ("dQ", "dK", "dV"):
        m = re.search(rf"^{g} (ok|FAIL)\s+max abs err (\S+)\s+bound (\S+)", r.stdout, re.M)
        figs.append(f"{g} {float(m.group(2)):.2e}/{float(m.group(3)):.2e}" if m else f"{g} ?")
    verdict = {0: "PASS", 1: "FAIL"}.get(r.returncode, f"rc {r.returncode}: {r.stderr.strip()[:120]}")
    return verdict, "  ".join(figs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--old", required=True)
    ap.add_argument("--new", required=True)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--shapes", default="0,1,2", help="which of the three shapes to run (indices, comma-separated)")
    ap.add_argument("--dtypes", default="bf16,fp16")
    a = ap.parse_args()
    root = a.dir or tempfile.mkdtemp(prefix="grad_lowp_")
    shapes = [(2, 8, 512, 64, False), (2, 8, 1024, 128, True), (1, 16, 2048, 64, True)]
    shapes = [shapes[int(i)] for i in a.shapes.split(",")]
    builds = (("old", a.old), ("new", a.new)) if os.path.realpath(a.old) != os.path.realpath(a.new) else (("new", a.new),)
    bad = 0
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    for (B, H, S, D, causal) in shapes:
        for dt_name, dt in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
            if dt_name not in a.dtypes.split(","):
                continue
            g = torch.Generator(device="cuda").manual_seed(B * 1000 + S + D)
            q, k, v, do = (torch.randn(B, H, S, D, device="cuda", dtype=dt, generator=g) for _ in range(4))
            d = os.path.join(root, f"b{B}h{H}s{S}d{D}c{int(causal)}{dt_name}")
            os.makedirs(d, exist_ok=True)
            for n, t in zip("q k v do".split(), (q, k, v, do)):
                save_bshd(f"{d}/{n}.npy", t)
            cases = []
            for be in BACKENDS:
                try:
                    gq, gk, gv = grads(q, k, v, do, be, causal)
                except RuntimeError as e:
                    print(f"  {be} {dt_name} B{B} H{H} S{S} d{D}: not run ({str(e).splitlines()[0][:80]})")
                    continue
                for n, t in zip(("dq", "dk", "dv"), (gq, gk, gv)):
                    save_bshd(f"{d}/{n}_{be}.npy", t)
                cases.append((be, 0))
                if be == "flash" or (be == "efficient" and not any(c[0] == "flash" for c in cases)):
                    save_bshd(f"{d}/dq_{be}_scale.npy", gq * 1.04)
                    save_bshd(f"{d}/dk_{be}_scale.npy", gk)
                    save_bshd(f"{d}/dv_{be}_scale.npy", gv)
                    gv2 = gv.clone()
                    gv2[:, :, -8:, :] = 0
                    save_bshd(f"{d}/dq_{be}_tail.npy", gq)
                    save_bshd(f"{d}/dk_{be}_tail.npy", gk)
                    save_bshd(f"{d}/dv_{be}_tail.npy", gv2)
                    cases += [(f"{be}_scale", 1), (f"{be}_tail", 1)]
            for tag, expect_fail in cases:
                for build, exe in builds:
                    verdict, figs = judge(exe, d, tag, causal)
                    ok = verdict == ("FAIL" if expect_fail else "PASS")
                    if build == "new" and not ok:
                        bad += 1
                    print(f"{dt_name} B{B} H{H} S{S} d{D}{' causal' if causal else ''} {tag:15s} {build}: "
                          f"{verdict:4s} {'(expected)' if ok else '(UNEXPECTED)'}  {figs}")
    print(f"new build: {bad} unexpected verdicts")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
