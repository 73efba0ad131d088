#!/usr/bin/env python3
"""Real GPU outputs where the old `check` / `check-grad` rules raised false alarms.

Two regimes, both with correct PyTorch GPU kernels, each judged by two flashattn builds side
by side (OLD, NEW: their CLIs given on the command line):

1. `check` at large logits (q drawn with std QSTD: scores of 10^2 .. 10^3): float32 SDPA on
   the math and memory-efficient backends (TF32 off), bf16 on the flash and cuDNN backends;
   and, expected to fail, the float32 output with the softmax scale 1% off.
2. `check-grad` where dQ and dK vanish by cancellation (V rows of a head alike to 1e-4, so
   dS = P o (dP - D) is a rounding residue): the autograd backward of float32 SDPA (math,
   efficient) and bf16 SDPA (flash, cuDNN); and, expected to fail, a float32 backward computed
   here in torch whose D = rowsum(dO o O) is rounded to bf16.

Prints one line per (case, build): verdict, max error and the rule's figures.

    python3 docs/examples/check_rules_gpu.py --old OLD/flashattn --new build/flashattn
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
    sys.exit(f"check_rules_gpu.py needs PyTorch with CUDA: {e}")

BACKENDS = {"math": SDPBackend.MATH, "efficient": SDPBackend.EFFICIENT_ATTENTION,
            "flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}


def save_bshd(path, t):
    """[B, H, S, D] torch tensor -> BSHD .npy (bf16 as '<u2' bit patterns)."""
    t = t.detach().transpose(1, 2).contiguous().cpu()
    if t.dtype == torch.bfloat16:
        np.save(path, t.view(torch.int16).numpy().view(np.uint16))
    else:
        np.save(path, t.float().numpy())


def sdpa(q, k, v, backend, scale=None):
    with sdpa_kernel([BACKENDS[backend]]):
        return F.scaled_dot_product_attention(q, k, v, scale=scale)


def try_save(path, fn, what):
    """Run fn (an SDPA call) and save its output; False (and a line saying why) if the
    backend does not run this case."""
    try:
        save_bshd(path, fn())
        return True
    except RuntimeError as e:
        print(f"| check | {what} | - | - | - | skipped: {str(e).splitlines()[0][:80]} | | |")
        return False


def run(exe, args):
    r = subprocess.run([exe] + args, capture_output=True, text=True)
    return r.returncode, r.stdout + r.stderr


def grab(pattern, text):
    m = re.search(pattern, text)
    return m.group(1) if m else "-"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--old", required=True, help="flashattn CLI with the previous rules")
    ap.add_argument("--new", required=True, help="flashattn CLI with the current rules")
    ap.add_argument("--qstd", type=float, default=100.0, help="std of q in part 1")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--dir", default=None)
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    d = a.dir or tempfile.mkdtemp()
    os.makedirs(d, exist_ok=True)
    print(f"# {torch.cuda.get_device_name()} torch {torch.__version__}; q std {a.qstd}; dir {d}")
    print("| part | case | seed | expect | build | verdict | max abs err | detail |")
    print("|---|---|---|---|---|---|---|---|")
    tally = {}

    def judge(part, case, seed, expect, args):
        for name, exe in (("old", a.old), ("new", a.new)):
            rc, out = run(exe, args)
            v = {0: "PASS", 1: "FAIL"}.get(rc, f"ERROR({rc})")
            if part == "check":
                err = grab(r"output  max abs err (\S+)", out)
                detail = "ratio " + grab(r"tested / emulated max error: (\S+)", out)
                allow = grab(r"here up to (\S+)", out)
                if allow != "-":
                    detail += f", allowance up to {allow}"
            else:
                worst = [m for m in re.findall(r"^(d[QKV]) +(?:ok|FAIL) +max abs err (\S+) +bound (\S+)", out, re.M)]
                err = ", ".join(f"{g} {e}" for g, e, _ in worst) or "-"
                detail = "bounds " + ", ".join(f"{g} {b}" for g, _, b in worst)
            ok = v == expect
            tally[(name, ok)] = tally.get((name, ok), 0) + 1
            print(f"| {part} | {case} | {seed} | {expect} | {name} | {v}{'' if ok else ' (!)'} | {err} | {detail} |",
                  flush=True)

    B, H, N = 1, 8, 1024
    for seed in range(a.seeds):
        torch.manual_seed(seed)
        # ---- part 1: check at large logits ---------------------------------------------
        for dd in (64, 128):
            q = a.qstd * torch.randn(B, H, N, dd, device="cuda")
            k = torch.randn(B, H, N, dd, device="cuda")
            v = torch.randn(B, H, N, dd, device="cuda")
            base = f"{d}/s{seed}_d{dd}"

            def check_backends(pre, dtype, qkv, backends):
                """save Q, K, V as {base}_{pre}q.npy ..., check each backend's output (expect PASS);
                returns the check arguments naming the inputs"""
                for n, t in zip("qkv", qkv):
                    save_bshd(f"{base}_{pre}{n}.npy", t)
                inp = ["check"] + [x for n in "qkv" for x in (f"-{n}", f"{base}_{pre}{n}.npy")]
                for be in backends:
                    out = f"{base}_{pre}o_{be}.npy"
                    if try_save(out, lambda: sdpa(*qkv, be), f"{dtype} {be} d{dd}"):
                        judge("check", f"{dtype} {be} d{dd}", seed, "PASS", inp + ["--out", out])
                return inp

            inp = check_backends("", "f32", (q, k, v), ("math", "efficient"))
            save_bshd(f"{base}_o_scale.npy", sdpa(q, k, v, "efficient", scale=1.01 / dd ** 0.5))
            judge("check", f"f32 efficient d{dd}, scale x1.01", seed, "FAIL",
                  inp + ["--out", f"{base}_o_scale.npy"])
            check_backends("b", "bf16", tuple(x.bfloat16() for x in (q, k, v)), ("flash", "cudnn"))

        # ---- part 2: check-grad where dQ, dK cancel --------------------------------------
        dd, n2 = 64, 512
        q = torch.randn(B, H, n2, dd, device="cuda")
        k = torch.randn(B, H, n2, dd, device="cuda")
        v = 30.0 * torch.randn(B, H, 1, dd, device="cuda").expand(B, H, n2, dd)
        v = (v + 30.0 * 1e-4 * torch.randn(B, H, n2, dd, device="cuda")).contiguous()
        do = torch.randn(B, H, n2, dd, device="cuda")
        base = f"{d}/g{seed}"
        for dt, tag, backends in ((torch.float32, "f32", ("math", "efficient")),
                                  (torch.bfloat16, "bf16", ("flash", "cudnn"))):
            qq, kk, vv, dO = (x.to(dt) for x in (q, k, v, do))
            for n, t in (("q", qq), ("k", kk), ("v", vv), ("do", dO)):
                save_bshd(f"{base}_{tag}_{n}.npy", t)
            inp = ["check-grad", "-q", f"{base}_{tag}_q.npy", "-k", f"{base}_{tag}_k.npy",
                   "-v", f"{base}_{tag}_v.npy", "--dout", f"{base}_{tag}_do.npy"]
            for be in backends:
                x = [t.clone().requires_grad_(True) for t in (qq, kk, vv)]
                try:
                    sdpa(*x, be).backward(dO)
                except RuntimeError as e:  # a backend this build or card does not run
                    print(f"| check-grad | {tag} {be} | {seed} | - | - | skipped: {str(e).splitlines()[0][:80]} | | |")
                    continue
                names = []
                for n, t in zip("qkv", x):
                    save_bshd(f"{base}_{tag}_d{n}_{be}.npy", t.grad)
                    names.append(f"{base}_{tag}_d{n}_{be}.npy")
                judge("check-grad", f"{tag} {be} (V rows alike)", seed, "PASS",
                      inp + ["--dq", names[0], "--dk", names[1], "--dv", names[2]])
            if dt == torch.float32:  # a backward whose D is rounded to bf16: wrong
                sc = dd ** -0.5
                P = torch.softmax((qq @ kk.transpose(-1, -2)) * sc, -1)
                O = P @ vv
                D = (dO * O).sum(-1, keepdim=True).bfloat16().float()
                dS = P * (dO @ vv.transpose(-1, -2) - D)
                grads = ((dS @ kk) * sc, (dS.transpose(-1, -2) @ qq) * sc, P.transpose(-1, -2) @ dO)
                names = []
                for n, t in zip("qkv", grads):
                    save_bshd(f"{base}_{tag}_d{n}_bad.npy", t)
                    names.append(f"{base}_{tag}_d{n}_bad.npy")
                judge("check-grad", "f32, D rounded to bf16", seed, "FAIL",
                      inp + ["--dq", names[0], "--dk", names[1], "--dv", names[2]])
    for name in ("old", "new"):
        print(f"{name}: {tally.get((name, True), 0)} verdicts as expected, {tally.get((name, False), 0)} not")


if __name__ == "__main__":
    main()
