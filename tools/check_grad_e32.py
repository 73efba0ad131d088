#!/usr/bin/env python3
"""check_grad_e32.py SEEDS [BUILD] — how close `flashattn check-grad`'s e32 comes to the error of
other correct float32 backwards where dQ and dK nearly vanish by cancellation.

e32 (src/cli/cmd_check_grad.c) is the largest error of this library's float32 flash backward over
four summation orders: the best SIMD kernels with the library's key block, 16 and 32
(FA_BLOCK_K), and the scalar kernels (FA_ISA=scalar). For SEEDS seeds x 4 shapes (B = 1, H = 2,
V rows of a head alike to 1e-4 relative, so that dS = P o (dP - D) is a rounding residue), this
prints, per other implementation (numpy's materialized float32 backward; the AVX2 kernels; the
scalar kernels), the largest ratio of its max error to e32 over dQ and dK, beside the same for an
e32 taken over the three SIMD runs only. check-grad allows 3 e32, so a ratio under 3 passes.
Needs numpy; the references come from `flashattn grad --impl reference --dtype-out f64`.
"""
import os
import subprocess
import sys
import tempfile

import numpy as np

f = np.float32


def numpy_backward(q, k, v, do):
    """A materialized float32 attention backward (no mask), BSHD, B = 1."""
    _, _, heads, d = q.shape
    sc = f(1 / np.sqrt(d))
    g = [np.zeros_like(x) for x in (q, k, v)]
    for h in range(heads):
        Q, K, V, DO = q[0, :, h], k[0, :, h], v[0, :, h], do[0, :, h]
        S = (Q @ K.T) * sc
        E = np.exp(S - S.max(1, keepdims=True))
        P = (E / E.sum(1, keepdims=True)).astype(f)
        D = (DO * (P @ V)).sum(1, keepdims=True)
        dS = P * (DO @ V.T - D)
        g[0][0, :, h], g[1][0, :, h], g[2][0, :, h] = (dS @ K) * sc, (dS.T @ Q) * sc, P.T @ DO
    return g


def main():
    seeds = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    fa = os.path.join(sys.argv[2] if len(sys.argv) > 2 else "build", "flashattn")
    fa = os.path.abspath(fa)
    tmp = tempfile.mkdtemp()
    os.chdir(tmp)

    def grad(env, out, extra=()):
        e = dict(os.environ)
        e.update(env)
        subprocess.run([fa, "grad", "-q", "q.npy", "-k", "k.npy", "-v", "v.npy", "--dout", "do.npy",
                        "--dq", out + "q.npy", "--dk", out + "k.npy", "--dv", out + "v.npy", *extra],
                       env=e, check=True, capture_output=True)
        return [np.load(out + c + ".npy").astype(np.float64) for c in "qkv"]

    runs = {"simd": {}, "b16": {"FA_BLOCK_K": "16"}, "b32": {"FA_BLOCK_K": "32"},
            "scalar": {"FA_ISA": "scalar"}, "avx2": {"FA_ISA": "avx2"}}
    worst = {}
    for seed in range(seeds):
        for n, d, vs in ((64, 16, 100), (200, 64, 30), (96, 32, 1000), (128, 128, 10)):
            rng = np.random.default_rng(seed)
            q = rng.standard_normal((1, n, 2, d)).astype(f)
            k = rng.standard_normal((1, n, 2, d)).astype(f)
            v = np.broadcast_to(vs * rng.standard_normal((1, 1, 2, d)), (1, n, 2, d)).astype(f)
            v = (v + rng.standard_normal(v.shape) * vs * 1e-4).astype(f)
            do = rng.standard_normal((1, n, 2, d)).astype(f)
            for name, x in (("q", q), ("k", k), ("v", v), ("do", do)):
                np.save(name + ".npy", x)
            ref = grad({}, "r", ("--impl", "reference", "--dtype-out", "f64"))
            errs = {}
            for name, env in runs.items():
                try:
                    errs[name] = [np.abs(a - r).max() for a, r in zip(grad(env, name), ref)]
                except subprocess.CalledProcessError:  # an ISA this CPU or build lacks
                    pass
            errs["numpy"] = [np.abs(a.astype(np.float64) - r).max() for a, r in zip(numpy_backward(q, k, v, do), ref)]
            for t in (0, 1):  # dQ, dK
                e3 = max(errs[x][t] for x in ("simd", "b16", "b32"))
                e4 = max(e3, errs["scalar"][t])
                for other in ("numpy", "avx2", "scalar"):
                    if other not in errs:
                        continue
                    for label, e in (("e32 (4 orders)", e4), ("3 SIMD runs only", e3)):
                        key = (other, label)
                        worst[key] = max(worst.get(key, 0.0), errs[other][t] / e)
    print(f"{seeds} seeds x 4 shapes, dQ and dK: the largest error / e32")
    for (other, label), r in sorted(worst.items()):
        print(f"  {other:7s} against {label:17s} {r:.2f}")


if __name__ == "__main__":
    main()
