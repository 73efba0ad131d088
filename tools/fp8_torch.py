#!/usr/bin/env python3
"""An FP8 attention pipeline from PyTorch's float8 types, for `flashattn check` (issue 13 item 5).

    python3 tools/fp8_torch.py --out DIR [--batch B --heads H --heads-k HK --seqlen N --d D]
                               [--causal] [--descale per-head|per-tensor] [--seed S]
                               [--saturate-p] [--backend torch|numpy] [--device cuda|cpu]
                               [--cudnn] [--fast-accum]

FlashAttention-3's forward data path, one (batch, head) at a time:
  1. Q, K, V drawn in float32 (q std 2, k std 2, v std 1), quantized to float8_e4m3fn with
     FA-3's descales (per (batch, kv head) -- Q's too, over its head group -- amax / 448;
     or one per-tensor descale);
  2. S = Q8 K8^T in FP8 on the tensor cores, by torch._scaled_mm with the two descales,
     float32 out;
  3. softmax in float32: P~ = 2^8 exp(scale S - rowmax) (FA-3 scales P into (0, 256] so that
     e4m3 keeps its resolution), l = the row sum of the unrounded P~;
  4. P~ quantized to e4m3 (satfinite), O = (P8 V8) descale_v / l by torch._scaled_mm;
     bf16 out.
With --fast-accum both products pass use_fast_accum=True to torch._scaled_mm: the tensor cores'
FP8 accumulation without cuBLAS's periodic promotion to float32 (about 14 bits of accumulator
kept on Hopper, DeepSeek-V3's report), as a kernel that accumulates in its WGMMA registers over
the whole row (FA-3) does. With --saturate-p the exponent offset is 12 instead of 8 and P~ is clamped at 448 when it
is converted (a satfinite conversion), while l keeps the unclamped values: the
FlashAttention-4 bug fixed in its PR 2717.

Written to DIR: q.npy k.npy v.npy (the e4m3 codes, '|u1', [B, N, H or HK, D]),
dq.npy dk.npy dv.npy (float32 [B, HK] descales), o.npy (bf16 as '<u2' bit patterns,
[B, N, H, D]), o_f32.npy (the float32 output before the bf16 rounding), and
meta.txt (shape, flags, the torch version and what ran). With --cudnn it also probes
whether PyTorch's SDPA accepts float8 inputs on the cuDNN backend (the answer goes to
meta.txt and, when it runs, o_cudnn.npy: attention over the codes as values, descales 1).

--backend numpy runs the same pipeline without PyTorch (an exact e4m3 table, RNE
with saturation, float32 matmuls) so that the script's logic is testable on a machine
without a GPU; --backend torch --device cpu uses PyTorch's float8 types with float32
matmuls where torch._scaled_mm is unavailable.
"""

import argparse
import os
import sys

import numpy as np

E4M3_MAX = 448.0


# ---- e4m3 without PyTorch --------------------------------------------------------

def e4m3_table():
    """The 256 e4m3fn values by code (NaN for 0x7f / 0xff)."""
    vals = np.zeros(256)
    for c in range(256):
        s, e, m = c >> 7, (c >> 3) & 0xF, c & 7
        if e == 15 and m == 7:
            vals[c] = np.nan
            continue
        v = m / 8.0 * 2.0 ** -6 if e == 0 else (1 + m / 8.0) * 2.0 ** (e - 7)
        vals[c] = -v if s else v
    return vals


_TABLE = e4m3_table()
_POS = np.arange(127)                    # non-negative finite codes 0x00..0x7e, increasing


def e4m3_encode(x):
    """Round float values to e4m3fn codes: nearest, ties to even code, saturating at 448."""
    x = np.asarray(x, np.float64)
    a = np.minimum(np.abs(x), E4M3_MAX)
    vals = _TABLE[_POS]
    hi = np.clip(np.searchsorted(vals, a, side="left"), 0, 126)
    lo = np.maximum(hi - 1, 0)
    dlo, dhi = a - vals[lo], vals[hi] - a
    pick = np.where(dlo < dhi, lo, np.where(dhi < dlo, hi, np.where(lo % 2 == 0, lo, hi)))
    code = pick.astype(np.uint8)
    return np.where(np.signbit(x) & (code != 0), code | 0x80, code).astype(np.uint8)


def e4m3_decode(codes):
    return _TABLE[np.asarray(codes, np.uint8)]


def bf16_bits(x):
    """float32 -> bf16 bit patterns (round to nearest even)."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype(np.uint16)


# ---- the pipeline ------------------------------------------------------------------

def descales(x, B, HK, per_tensor):
    """FA-3's descales [B, HK] of x [B, N, Hx, D] (Hx a multiple of HK): amax / 448 of each
    (batch, kv head)'s group, or one amax / 448 everywhere."""
    a = np.abs(x)
    if per_tensor:
        return np.full((B, HK), a.max() / E4M3_MAX, np.float32)
    g = x.shape[2] // HK
    return (a.reshape(B, x.shape[1], HK, g, x.shape[3]).max(axis=(1, 3, 4)) / E4M3_MAX).astype(np.float32)


def expand(ds, H):
    return np.repeat(ds, H // ds.shape[1], axis=1)[:, None, :, None]


def run_numpy(q, k, v, dq, dk, dv, a):
    B, N, H, D = q.shape
    HK = k.shape[2]
    q8 = e4m3_encode(q / expand(dq, H))
    k8, v8 = e4m3_encode(k / expand(dk, HK)), e4m3_encode(v / expand(dv, HK))
    qf, kf, vf = (e4m3_decode(c).astype(np.float32) for c in (q8, k8, v8))
    o = np.zeros((B, N, H, D), np.float32)
    scale = np.float32(1.0 / np.sqrt(D))
    offset = np.float32(2.0 ** (12 if a.saturate_p else 8))
    mask = np.tril(np.ones((N, N), bool)) if a.causal else None
    for b in range(B):
        for h in range(H):
            hk = h // (H // HK)
            s = (qf[b, :, h] @ kf[b, :, hk].T) * np.float32(dq[b, hk] * dk[b, hk])
            s = s * scale
            if mask is not None:
                s = np.where(mask, s, -np.inf)
            pt = (np.exp(s - s.max(1, keepdims=True)) * offset).astype(np.float32)
            l = pt.sum(1, dtype=np.float32)
            p8 = e4m3_decode(e4m3_encode(pt)).astype(np.float32)     # satfinite: clamps at 448
            o[b, :, h] = (p8 @ vf[b, :, hk]) * np.float32(dv[b, hk]) / l[:, None]
    return q8, k8, v8, o, "numpy emulation (float32 matmuls, exact e4m3 table)"


def run_torch(q, k, v, dq, dk, dv, a):
    import torch
    dev = torch.device(a.device)
    f8 = torch.float8_e4m3fn
    B, N, H, D = q.shape
    HK = k.shape[2]

    def quant(x, ds, hx):
        t = torch.from_numpy(np.ascontiguousarray(x / expand(ds, hx), np.float32)).to(dev)
        return t.clamp(-E4M3_MAX, E4M3_MAX).to(f8)

    q8, k8, v8 = quant(q, dq, H), quant(k, dk, HK), quant(v, dv, HK)
    scale = 1.0 / np.sqrt(D)
    offset = 2.0 ** (12 if a.saturate_p else 8)
    o = torch.empty((B, N, H, D), dtype=torch.float32, device=dev)
    mask = torch.ones((N, N), dtype=torch.bool, device=dev).tril() if a.causal else None
    one = torch.ones((), dtype=torch.float32, device=dev)
    how = []

    def mm(x8, y8_colmajor, sx, sy):
        """x8 @ y8 with descales sx, sy, float32 out: torch._scaled_mm on the GPU's FP8 tensor cores."""
        if dev.type == "cuda":
            try:
                r = torch._scaled_mm(x8, y8_colmajor, scale_a=sx, scale_b=sy, out_dtype=torch.float32,
                                     use_fast_accum=a.fast_accum)
                tag = "torch._scaled_mm (float32 out, use_fast_accum=%s)" % a.fast_accum
                if tag not in how:
                    how.append(tag)
                return r
            except RuntimeError as e:  # a PyTorch without float32 output for FP8 GEMMs
                if not any(x.startswith("torch._scaled_mm (bf16") for x in how):
                    how.append("torch._scaled_mm (bf16 out: float32 out refused: %s)" % str(e).splitlines()[0][:120])
                return torch._scaled_mm(x8, y8_colmajor, scale_a=sx, scale_b=sy, out_dtype=torch.bfloat16,
                                        use_fast_accum=a.fast_accum).float()
        if "float32 matmul (cpu)" not in how:
            how.append("float32 matmul (cpu)")
        return (x8.float() @ y8_colmajor.float()) * (sx * sy)

    for b in range(B):
        for h in range(H):
            hk = h // (H // HK)
            sq = torch.tensor(float(dq[b, hk]), device=dev)
            sk = torch.tensor(float(dk[b, hk]), device=dev)
            sv = torch.tensor(float(dv[b, hk]), device=dev)
            s = mm(q8[b, :, h].contiguous(), k8[b, :, hk].contiguous().t(), sq, sk) * scale
            if mask is not None:
                s = s.masked_fill(~mask, float("-inf"))
            pt = torch.exp(s - s.amax(1, keepdim=True)) * offset
            l = pt.sum(1)
            p8 = pt.clamp(max=E4M3_MAX).to(f8)           # satfinite conversion
            vcol = v8[b, :, hk].t().contiguous().t()     # column-major [N, D]
            o[b, :, h] = mm(p8, vcol, one, sv) / l[:, None]
    codes = [x.view(torch.uint8).cpu().numpy() for x in (q8, k8, v8)]
    return codes[0], codes[1], codes[2], o.cpu().numpy(), " + ".join(how) + f" (torch {torch.__version__})"


def probe_cudnn(q8, k8, v8, a, out):
    """Does PyTorch's SDPA take float8 inputs on the cuDNN backend? Returns a line for meta.txt."""
    try:
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except Exception as e:  # pragma: no cover
        return f"cudnn fp8 sdpa: not probed ({e})"
    dev = torch.device(a.device)
    t = [torch.from_numpy(x).to(dev).view(torch.float8_e4m3fn).transpose(1, 2) for x in (q8, k8, v8)]
    try:
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            o = F.scaled_dot_product_attention(*t, is_causal=a.causal, enable_gqa=t[0].shape[1] != t[1].shape[1])
        o = o.transpose(1, 2).float().cpu().numpy()
        np.save(os.path.join(out, "o_cudnn.npy"), bf16_bits(o))
        return f"cudnn fp8 sdpa: ran, output dtype {o.dtype} (o_cudnn.npy: attention over the codes, descales 1)"
    except Exception as e:
        msg = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        return f"cudnn fp8 sdpa: not available in this PyTorch ({type(e).__name__}: {msg})"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--heads-k", type=int, default=8)
    ap.add_argument("--seqlen", type=int, default=512)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--descale", choices=("per-head", "per-tensor"), default="per-head")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--saturate-p", action="store_true")
    ap.add_argument("--also-saturated", metavar="DIR2",
                    help="also run the pipeline with --saturate-p on the same inputs, into DIR2")
    ap.add_argument("--backend", choices=("torch", "numpy"), default="torch")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--cudnn", action="store_true")
    ap.add_argument("--fast-accum", action="store_true")
    a = ap.parse_args(argv)
    B, N, H, HK, D = a.batch, a.seqlen, a.heads, a.heads_k, a.d
    if min(B, N, H, HK, D) < 1 or H % HK:
        sys.exit("fp8_torch.py: --batch, --seqlen, --heads, --heads-k, --d must be >= 1, heads a multiple of heads-k")
    if a.backend == "torch" and a.device.startswith("cuda") and (N % 16 or D % 16):
        sys.exit("fp8_torch.py: torch._scaled_mm needs --seqlen and --d multiples of 16")
    rng = np.random.default_rng(a.seed)
    q = (rng.standard_normal((B, N, H, D)) * 2.0).astype(np.float32)
    k = (rng.standard_normal((B, N, HK, D)) * 2.0).astype(np.float32)
    v = rng.standard_normal((B, N, HK, D)).astype(np.float32)
    per_tensor = a.descale == "per-tensor"
    dq, dk, dv = descales(q, B, HK, per_tensor), descales(k, B, HK, per_tensor), descales(v, B, HK, per_tensor)
    run = run_torch if a.backend == "torch" else run_numpy
    jobs = [(a.out, a.saturate_p)] + ([(a.also_saturated, True)] if a.also_saturated else [])
    for out, sat in jobs:
        a.saturate_p = sat
        q8, k8, v8, o, how = run(q, k, v, dq, dk, dv, a)
        os.makedirs(out, exist_ok=True)
        for name, x in dict(q=q8, k=k8, v=v8, dq=dq, dk=dk, dv=dv, o=bf16_bits(o), o_f32=o).items():
            np.save(os.path.join(out, f"{name}.npy"), np.ascontiguousarray(x))
        lines = [f"shape B={B} N={N} H={H} HK={HK} d={D} causal={int(a.causal)} descale={a.descale} "
                 f"seed={a.seed} saturate_p={int(sat)} fast_accum={int(a.fast_accum)}", f"ran: {how}"]
        if a.cudnn and not sat:
            lines.append(probe_cudnn(q8, k8, v8, a, out) if a.backend == "torch" else "cudnn fp8 sdpa: not probed (numpy)")
        with open(os.path.join(out, "meta.txt"), "w") as f:
            f.write("\n".join(lines) + "\n")
        print("\n".join(lines))


if __name__ == "__main__":
    main()
