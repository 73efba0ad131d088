#!/usr/bin/env python3
"""PyTorch's CPU attention beside `flashattn bench`, on the same shapes and thread counts.

Times torch.nn.functional.scaled_dot_product_attention on float32 (or, with
--dtype bf16, bfloat16) CPU tensors (B, H, N, d) and prints one CSV row per (threads, d, N, causal): the median of
--repeats runs, and GFLOP/s counted as `flashattn bench` counts them
(4*N*N*d per head, half when causal), so the two tables compare row by row.
Run it in the same job as `flashattn bench` (tools/device_cpu.sh does) so both
see the same machine state. Needs torch; exits 0 with one line when absent.
"""
import argparse
import statistics
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", default="1024,2048,4096")
    ap.add_argument("--d", default="64,128")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--causal", default="0,1")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--dtype", default="f32", choices=["f32", "bf16"],
                    help="tensor dtype (bf16: beside `FA_AMX=1 flashattn bench --dtype bf16`)")
    a = ap.parse_args()
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        print("torch_cpu_sdpa: torch is not installed; nothing to compare")
        return 0
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    print("impl,threads,batch,heads,seqlen,d,causal,median_ms,gflops,torch,dtype")
    for t in (int(x) for x in a.threads.split(",")):
        torch.set_num_threads(t)
        for d in (int(x) for x in a.d.split(",")):
            for n in (int(x) for x in a.n.split(",")):
                g = torch.Generator().manual_seed(n * 131 + d)
                q, k, v = (torch.randn(a.batch, a.heads, n, d, generator=g).to(dtype) for _ in range(3))
                for c in (int(x) for x in a.causal.split(",")):
                    with torch.no_grad():
                        F.scaled_dot_product_attention(q, k, v, is_causal=bool(c))  # warm up
                        times = []
                        for _ in range(a.repeats):
                            t0 = time.perf_counter()
                            F.scaled_dot_product_attention(q, k, v, is_causal=bool(c))
                            times.append(time.perf_counter() - t0)
                    med = statistics.median(times)
                    flops = 4.0 * a.batch * a.heads * n * n * d * (0.5 if c else 1.0)
                    print(f"torch_sdpa,{t},{a.batch},{a.heads},{n},{d},{c},{med * 1e3:.3f},"
                          f"{flops / med / 1e9:.2f},{torch.__version__},{a.dtype}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
