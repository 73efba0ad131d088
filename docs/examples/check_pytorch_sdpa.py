#!/usr/bin/env python3
"""Validate PyTorch's GPU attention kernels with `flashattn check`.

Runs torch.nn.functional.scaled_dot_product_attention on a CUDA device with the
FlashAttention-2 ("flash") and cuDNN backends, in bf16 and fp16, on three
problems — non-causal, causal with seqlen_q != seqlen_k (bottom-right aligned,
torch.nn.attention.bias.causal_lower_right), and GQA (enable_gqa=True) — saves
q, k, v and the output as .npy (BSHD layout; bf16 as '<u2' bit patterns), and
checks every output with `flashattn check` (expected: pass). It also checks the
log-sum-exp of the private flash/cuDNN ops, a row-sampled check, and three
deliberately wrong outputs (expected: fail): causal aligned top-left instead of
bottom-right, one row perturbed, and the softmax scale off by 1%.

It prints a results table (and writes it as Markdown with --results).

    make && python3 docs/examples/check_pytorch_sdpa.py --flashattn build/flashattn

Everything here is what a kernel engineer would do by hand; see docs/validation.md.
"""

import argparse
import datetime
import math
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback

import numpy as np

try:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.bias import causal_lower_right
except ImportError as e:  # pragma: no cover - needs a GPU machine
    sys.exit(f"check_pytorch_sdpa.py needs PyTorch with CUDA: {e}")

BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
CHECK_DTYPE = {"bf16": "bf16", "fp16": "f16"}

# B, H (query heads), Hk (kv heads), Sq, Sk, d, mask
PROBLEMS = {
    "non-causal": dict(B=2, H=16, Hk=16, Sq=1024, Sk=1024, d=128, causal=False),
    "causal Sq<Sk": dict(B=2, H=16, Hk=16, Sq=512, Sk=1536, d=128, causal=True),
    "GQA 16/4": dict(B=2, H=16, Hk=4, Sq=1024, Sk=1024, d=128, causal=False),
}


# ---- saving -------------------------------------------------------------------

def save_bshd(path, t):
    """Save a [B, H, S, D] (or [B, H, S]) torch tensor as .npy in flashattn's layout:
    BSHD for 4-d tensors; bf16 as its bit patterns ('<u2')."""
    if t.dim() == 4:
        t = t.transpose(1, 2)
    t = t.contiguous().cpu()
    if t.dtype == torch.bfloat16:
        arr = t.view(torch.int16).numpy().view(np.uint16)
    else:
        arr = t.numpy()
    np.save(path, arr)


def make_inputs(p, dtype, seed):
    """q, k, v in BHSD on the GPU. q is scaled by 3 so scores have std ~3: the
    softmax is sharp but spread over many keys, which makes a 1% scale error
    visible above bf16's resolution."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = 3.0 * torch.randn(p["B"], p["H"], p["Sq"], p["d"], device="cuda", generator=g)
    k = torch.randn(p["B"], p["Hk"], p["Sk"], p["d"], device="cuda", generator=g)
    v = torch.randn(p["B"], p["Hk"], p["Sk"], p["d"], device="cuda", generator=g)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def sdpa(q, k, v, p, backend, scale=None, top_left=False):
    """The public API, restricted to one backend (None: let PyTorch choose)."""
    kw = dict(scale=scale)
    if p["Hk"] != p["H"]:
        kw["enable_gqa"] = True
    if p["causal"]:
        if top_left:
            kw["is_causal"] = True  # PyTorch's is_causal is aligned top-left
        else:
            kw["attn_mask"] = causal_lower_right(p["Sq"], p["Sk"])
    if backend is None:
        return F.scaled_dot_product_attention(q, k, v, **kw)
    with sdpa_kernel([BACKENDS[backend]]):
        return F.scaled_dot_product_attention(q, k, v, **kw)


def private_op_with_lse(q, k, v, backend):
    """Output and natural-log LSE [B, H, Sq] from the backend's own op (non-causal)."""
    if backend == "flash":
        res = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, False, False)
    else:
        res = torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, False, False)
    out, lse = res[0], res[1]
    return out, lse.reshape(q.shape[0], q.shape[1], q.shape[2]).float()


# ---- running flashattn check --------------------------------------------------

def run_check(exe, files, extra, log):
    cmd = [exe, "check", "-q", files["q"], "-k", files["k"], "-v", files["v"], "--out", files["o"]]
    if "lse" in files:
        cmd += ["--lse", files["lse"]]
    cmd += extra
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True)
    secs = time.time() - t0
    log.write("$ " + " ".join(cmd) + f"\n{r.stdout}{r.stderr}exit {r.returncode}\n\n")
    log.flush()
    out = r.stdout

    def grab(pattern):
        m = re.search(pattern, out)
        return m.group(1) if m else "-"

    return dict(rc=r.returncode, secs=secs,
                err=grab(r"output  max abs err (\S+)"),
                emu=grab(r"baseline: max abs err (\S+)"),
                ratio=grab(r"tested / emulated max error: (\S+)"),
                lse=grab(r"lse max abs err (\S+)"),
                stderr=r.stderr.strip())


def verdict(rc):
    return {0: "PASS", 1: "FAIL"}.get(rc, f"ERROR({rc})")


# ---- main -------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--flashattn", default="build/flashattn", help="path to the flashattn CLI")
    ap.add_argument("--dir", default=None, help="where to write the .npy files (default: a temp dir)")
    ap.add_argument("--results", default=None, help="also write the table as Markdown here")
    ap.add_argument("--logs", default=None, help="write every check's full report here")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--small", action="store_true", help="8x shorter sequences, 4 heads (a quick run)")
    args = ap.parse_args()
    if args.small:
        for p in PROBLEMS.values():
            p.update(H=4, Hk=1 if p["Hk"] != p["H"] else 4, Sq=p["Sq"] // 8, Sk=p["Sk"] // 8)

    if not torch.cuda.is_available():
        sys.exit("check_pytorch_sdpa.py: no CUDA device")
    exe = os.path.abspath(args.flashattn)
    work = args.dir or tempfile.mkdtemp(prefix="fa_sdpa_")
    os.makedirs(work, exist_ok=True)
    log = open(args.logs, "w") if args.logs else open(os.path.join(work, "checks.log"), "w")
    dev = torch.cuda.get_device_name()
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print(f"device: {dev}; torch {torch.__version__}, CUDA {torch.version.cuda}, "
          f"cuDNN {torch.backends.cudnn.version()}; {stamp}", flush=True)

    rows = []

    def record(case, backend, dtype, p, expect, files, extra):
        res = run_check(exe, files, extra, log)
        shape = f"B{p['B']} H{p['H']}/{p['Hk']} Sq{p['Sq']} Sk{p['Sk']} d{p['d']}"
        got = verdict(res["rc"])
        ok = "yes" if got == expect else "NO"
        rows.append([case, backend, dtype, shape, " ".join(extra), expect, got, ok, res["err"],
                     res["emu"], res["ratio"], res["lse"], f"{res['secs']:.1f}"])
        print(f"  {case:28s} {backend:8s} {dtype:5s} expect {expect} got {got} "
              f"(err {res['err']}, emu {res['emu']}, ratio {res['ratio']}, lse {res['lse']})"
              + (f" [{res['stderr']}]" if res["rc"] == 2 else ""), flush=True)

    def skipped(case, backend, dtype, p, expect, why):
        shape = f"B{p['B']} H{p['H']}/{p['Hk']} Sq{p['Sq']} Sk{p['Sk']} d{p['d']}"
        rows.append([case, backend, dtype, shape, "", expect, "not run", "-", "-", "-", "-", "-", "-"])
        print(f"  {case:28s} {backend:8s} {dtype:5s} NOT RUN: {why}", flush=True)

    seed = args.seed
    for dname, dt in DTYPES.items():
        for pname, p in PROBLEMS.items():
            seed += 1
            q, k, v = make_inputs(p, dt, seed)
            base = os.path.join(work, f"{dname}_{pname.replace(' ', '_').replace('/', '-')}")
            files = {"q": base + "_q.npy", "k": base + "_k.npy", "v": base + "_v.npy"}
            save_bshd(files["q"], q)
            save_bshd(files["k"], k)
            save_bshd(files["v"], v)
            mask = ["--causal"] if p["causal"] else []
            cdt = ["--dtype", CHECK_DTYPE[dname]]

            # 1. every backend, expected to pass
            for bname in BACKENDS:
                try:
                    o = sdpa(q, k, v, p, bname)
                    torch.cuda.synchronize()
                except Exception as e:  # the backend refused this problem
                    skipped(pname, bname, dname, p, "PASS", f"{type(e).__name__}: {str(e).splitlines()[0][:120]}")
                    continue
                f = dict(files, o=f"{base}_o_{bname}.npy")
                save_bshd(f["o"], o)
                record(pname, bname, dname, p, "PASS", f, mask + cdt)
                if bname == "flash" and p["causal"]:
                    record(pname + " (sampled 64 rows)", bname, dname, p, "PASS", f,
                           mask + cdt + ["--sample-rows", "64", "--seed", "1"])

            # 2. output + LSE from the backends' own ops (non-causal, MHA)
            if pname == "non-causal":
                for bname in BACKENDS:
                    try:
                        o, lse = private_op_with_lse(q, k, v, bname)
                        torch.cuda.synchronize()
                    except Exception as e:
                        skipped(pname + " + LSE", bname, dname, p, "PASS",
                                f"{type(e).__name__}: {str(e).splitlines()[0][:120]}")
                        continue
                    f = dict(files, o=f"{base}_o_{bname}_op.npy", lse=f"{base}_lse_{bname}.npy")
                    save_bshd(f["o"], o)
                    np.save(f["lse"], lse.cpu().numpy())
                    record(pname + " + LSE", bname + " op", dname, p, "PASS", f, mask + cdt)

            # 3. deliberately wrong outputs, expected to fail
            def broken(name, make):
                try:
                    o = make()
                except Exception as e:
                    skipped(name, "flash", dname, p, "FAIL", f"{type(e).__name__}: {str(e).splitlines()[0][:120]}")
                    return
                f = dict(files, o=f"{base}_o_{len(rows)}_broken.npy")
                save_bshd(f["o"], o)
                record(name, "flash" if "top-left" not in name else "default", dname, p, "FAIL", f,
                       mask + cdt)

            if p["causal"]:
                # PyTorch's is_causal is aligned top-left; any backend PyTorch picks
                broken("BROKEN: causal top-left", lambda: sdpa(q, k, v, p, None, top_left=True))
            if pname == "non-causal":
                hb, rb = min(5, p["H"] - 1), min(100, p["Sq"] - 1)

                def perturbed():
                    o = sdpa(q, k, v, p, "flash").clone()
                    o[1, hb, rb, :] = o[1, hb, rb, :] + 0.1  # [batch, head, row, :] in BHSD
                    return o

                broken(f"BROKEN: row (1,{rb},h{hb}) +0.1", perturbed)
                broken("BROKEN: scale x1.01",
                       lambda: sdpa(q, k, v, p, "flash", scale=1.01 / math.sqrt(p["d"])))

    # ---- the table ----
    head = ["case", "backend", "dtype", "shape", "check options", "expect", "verdict", "as expected",
            "max abs err", "emulated err", "ratio", "lse err", "check s"]
    lines = [f"Results on {dev} (torch {torch.__version__}, CUDA {torch.version.cuda}, "
             f"cuDNN {torch.backends.cudnn.version()}), {stamp}", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    bad = [r for r in rows if r[7] == "NO"]
    lines += ["", f"{len(rows)} checks, {len(bad)} not as expected"]
    text = "\n".join(lines)
    print("\n" + text)
    if args.results:
        with open(args.results, "w") as fh:
            fh.write(text + "\n")
    log.close()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
