#!/usr/bin/env python3
"""sdpa_bench.py -- PyTorch's SDPA backends on the ladder's shapes, same protocol, same CSV.

    python3 cuda/sdpa_bench.py --csv FILE --shapes "128:16384:0:16:16:1,64:1024:1:16:16:16" [--bwd]
                               [--deadline EPOCH_SECONDS] [--max-seconds S]

Each shape is d:N:causal:heads:heads_k:batch. For every shape and every backend (flash,
cuDNN, memory-efficient) it times the forward pass -- and with --bwd the backward pass
alone (torch.autograd.grad on a retained graph) -- with CUDA events around the call, one
warm-up, the median of the repeats, L2 flushed before each (a 2 x L2 buffer is
overwritten), and FlashAttention's FLOP count (forward 4 N^2 d per (batch, head), halved
when causal; backward 2.5x). Inputs: random normal bf16 in [batch, heads, N, d] (SDPA's
layout), never zeros. With heads_k < heads it passes enable_gqa=True; a backend that
refuses GQA is timed on K/V expanded to all heads (repeat_interleave) and the row says so.
A backend that refuses a shape gets a row with check=unsupported and the reason.
Rows are appended as they are measured, so a run cut short still leaves its data.
"""
import argparse
import os
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

HEADER = ("kernel,dtype,batch,heads,heads_k,seqlen_q,seqlen_k,d,causal,window_left,window_right,softcap,"
          "repeats,ms_median,ms_min,ms_max,tflops,probe_tflops,frac_probe,check,note\n")
BACKENDS = [("sdpa_flash", SDPBackend.FLASH_ATTENTION), ("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION),
            ("sdpa_efficient", SDPBackend.EFFICIENT_ATTENTION)]


def timed(fn, flush, repeats, max_seconds):
    """Median/min/max milliseconds of fn() over repeats (capped by max_seconds), L2 flushed before each."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def once():
        flush.zero_()
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end)

    warm = once()
    n = int(min(repeats, max(3, max_seconds * 1e3 // max(warm, 1e-3))))
    t = sorted(once() for _ in range(n))
    med = t[n // 2] if n % 2 else 0.5 * (t[n // 2 - 1] + t[n // 2])
    return med, t[0], t[-1], n


def row(f, name, b, h, hk, n, d, causal, reps, med, mn, mx, tflops, check, note):
    f.write(f"{name},bf16,{b},{h},{hk},{n},{n},{d},{causal},-1,{0 if causal else -1},0,{reps},"
            f"{med:.4f},{mn:.4f},{mx:.4f},{tflops:.3f},,,{check},{note}\n")
    f.flush()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--csv", required=True)
    ap.add_argument("--shapes", required=True, help="d:N:causal:heads:heads_k:batch, comma-separated")
    ap.add_argument("--bwd", action="store_true", help="also time the backward pass")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--max-seconds", type=float, default=1.5)
    ap.add_argument("--deadline", type=float, default=0, help="epoch seconds after which no new shape starts")
    a = ap.parse_args()

    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    flush = torch.empty(2 * getattr(props, "L2_cache_size", 64 << 20), dtype=torch.uint8, device=dev)
    new = not os.path.exists(a.csv) or os.path.getsize(a.csv) == 0
    with open(a.csv, "a") as f:
        if new:
            f.write(HEADER)
        print(f"sdpa_bench: torch {torch.__version__}, {props.name}, cuDNN {torch.backends.cudnn.version()}")
        for spec in a.shapes.split(","):
            if a.deadline and time.time() > a.deadline:
                print(f"sdpa_bench: deadline reached, skipping {spec} and the rest")
                break
            d, n, causal, h, hk, b = (int(x) for x in spec.split(":"))
            g = torch.Generator(device=dev).manual_seed(1)
            q = torch.randn(b, h, n, d, device=dev, dtype=torch.bfloat16, generator=g)
            k = torch.randn(b, hk, n, d, device=dev, dtype=torch.bfloat16, generator=g)
            v = torch.randn(b, hk, n, d, device=dev, dtype=torch.bfloat16, generator=g)
            do = torch.randn(b, h, n, d, device=dev, dtype=torch.bfloat16, generator=g)
            fwd_flops = 4.0 * n * n * d * b * h * (0.5 if causal else 1.0)
            for name, backend in BACKENDS:
                kk, vv, note = k, v, "enable_gqa" if hk != h else ""

                def call(qq, kx, vx, gqa):
                    with sdpa_kernel(backend):
                        return F.scaled_dot_product_attention(qq, kx, vx, is_causal=bool(causal), enable_gqa=gqa)

                try:
                    try:
                        call(q, kk, vv, hk != h)
                        gqa = hk != h
                    except RuntimeError:
                        if hk == h:
                            raise
                        kk = k.repeat_interleave(h // hk, dim=1)
                        vv = v.repeat_interleave(h // hk, dim=1)
                        note, gqa = "kv expanded to all heads (backend refused enable_gqa)", False
                        call(q, kk, vv, gqa)
                    med, mn, mx, reps = timed(lambda: call(q, kk, vv, gqa), flush, a.repeats, a.max_seconds)
                    tf = fwd_flops / (med * 1e-3) / 1e12
                    row(f, name, b, h, hk, n, d, causal, reps, med, mn, mx, tf, "torch", note)
                    print(f"  {name:15s} fwd d={d} N={n} causal={causal} H={h}:{hk} B={b}: {med:.3f} ms {tf:.1f} TFLOP/s")
                    if a.bwd:
                        qg, kg, vg = (x.detach().requires_grad_() for x in (q, kk, vv))
                        out = call(qg, kg, vg, gqa)
                        med, mn, mx, reps = timed(
                            lambda: torch.autograd.grad(out, (qg, kg, vg), do, retain_graph=True), flush, a.repeats,
                            a.max_seconds)
                        tf = 2.5 * fwd_flops / (med * 1e-3) / 1e12
                        row(f, name + "_bwd", b, h, hk, n, d, causal, reps, med, mn, mx, tf, "torch", note)
                        print(f"  {name + '_bwd':15s}     d={d} N={n} causal={causal}: {med:.3f} ms {tf:.1f} TFLOP/s")
                        del out, qg, kg, vg
                except RuntimeError as e:
                    reason = str(e).split("\n")[0].replace(",", ";")[:150]
                    f.write(f"{name},bf16,{b},{h},{hk},{n},{n},{d},{causal},-1,{0 if causal else -1},0,0,,,,,,,"
                            f"unsupported,{reason}\n")
                    f.flush()
                    print(f"  {name}: unsupported: {reason}")
            del q, k, v, do
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
