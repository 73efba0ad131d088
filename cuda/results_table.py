#!/usr/bin/env python3
"""results_table.py -- the measured table of cuda/README.md, from run_h200.sh's CSV.

    python3 cuda/results_table.py cuda/results/h200.csv > table.md

One row per ladder run: kernel, dtype, d, N (batch = 16384 / N), heads, causal, TFLOP/s,
fraction of the FP32 FMA ceiling measured by the same harness call, and the ratio to
PyTorch's SDPA flash and cuDNN backends on the same shape in the same run (forward rungs
against their forward, the backward rung against their backward), then how it was validated.
"""
import csv
import sys


def main():
    rows = list(csv.DictReader(open(sys.argv[1])))
    sdpa = {}
    for r in rows:
        if r["kernel"].startswith("sdpa") and r["check"] == "torch":
            key = (r["kernel"], r["d"], r["seqlen_q"], r["heads"], r["heads_k"], r["causal"])
            sdpa[key] = float(r["tflops"])

    def ratio(r, backend):
        name = backend + ("_bwd" if "_bwd" in r["kernel"] else "")
        t = sdpa.get((name, r["d"], r["seqlen_q"], r["heads"], r["heads_k"], r["causal"]))
        return f"{float(r['tflops']) / t:.3f}" if t else "-"

    print("| kernel | dtype | d | N | heads | causal | TFLOP/s | of FP32 ceiling | vs SDPA flash | vs SDPA cuDNN | validated |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    ladder = [r for r in rows if not r["kernel"].startswith("sdpa")]
    ladder.sort(key=lambda r: (-int(r["d"]), int(r["heads"]) != 16, -int(r["seqlen_q"]), int(r["causal"]), r["kernel"]))
    for r in ladder:
        heads = r["heads"] if r["heads"] == r["heads_k"] else f"{r['heads']}:{r['heads_k']}"
        # the FP32 FMA probe is the CUDA cores' ceiling: it bounds rungs 01-03b, not the
        # tensor-core rungs (04 and later), which it would show at "450%"
        if r["kernel"][:2].isdigit() and int(r["kernel"][:2]) >= 4:
            frac = "n/a (tensor cores)"
        else:
            frac = f"{100 * float(r['tflops']) / float(r['probe_tflops']):.1f}% of {float(r['probe_tflops']):.1f}"
        print(f"| {r['kernel']} | {r['dtype']} | {r['d']} | {r['seqlen_q']} | {heads} | {r['causal']} | "
              f"{float(r['tflops']):.2f} | {frac} | {ratio(r, 'sdpa_flash')} | {ratio(r, 'sdpa_cudnn')} | {r['check']} |")
    print()
    print("PyTorch SDPA, same run, bf16, TFLOP/s (forward / backward):")
    print()
    print("| d | N | heads | causal | flash | cuDNN | memory-efficient |")
    print("|---|---|---|---|---|---|---|")
    shapes = []
    for r in rows:
        key = (r["d"], r["seqlen_q"], r["heads"], r["heads_k"], r["causal"])
        if r["kernel"].startswith("sdpa") and key not in shapes:
            shapes.append(key)
    for d, n, h, hk, c in shapes:
        cells = []
        for b in ("sdpa_flash", "sdpa_cudnn", "sdpa_efficient"):
            f, w = sdpa.get((b, d, n, h, hk, c)), sdpa.get((b + "_bwd", d, n, h, hk, c))
            cells.append(f"{f:.0f} / {w:.0f}" if f and w else f"{f:.0f} / -" if f else "unsupported")
        heads = h if h == hk else f"{h}:{hk}"
        print(f"| {d} | {n} | {heads} | {c} | " + " | ".join(cells) + " |")

if __name__ == "__main__":
    main()
