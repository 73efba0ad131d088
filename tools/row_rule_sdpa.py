"""tools/row_rule_sdpa.py — `check`'s row rule (docs/validation.md, "The row rule") against real
GPU kernels: PyTorch's scaled_dot_product_attention backends (flash = FlashAttention-2's
kernels, efficient, cudnn, math) in bf16 and f16 on a grid of shapes, each output checked by
flashattn.check (the library's fa_check) with the dtype rule. Prints one line per run — the
element rule's ratio, the worst row's fraction of its row bound, the verdict — and, per backend,
the largest row fraction of the correct outputs. Then two wrong outputs that the row rule is
for: a window of W - 6 keys where a causal mask was meant, on a real kernel.

    FA_BUILD=build python3 tools/row_rule_sdpa.py [--quick | --long]

With FA_MPI_NP=P each output is judged by `mpirun -np P build/flashattn-mpi check` instead
(tools/row_rule_study.py's check_mpi: FA_MPIRUN, FA_MPI_THREADS), on the grid's shapes whose
lengths split over the ranks plus longer ones (8192 to 32768 keys; --long: those alone), and the
wrong output's window is checked at 8192.

Needs torch with CUDA and build/libflashattn.so. Exit status 1 when a correct output fails or a
wrong one passes.
"""

import os
import re
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import flashattn as fa  # noqa: E402

try:
    from torch.nn.attention import SDPBackend, sdpa_kernel
except ImportError:  # pragma: no cover
    sys.exit("row_rule_sdpa.py: torch.nn.attention.sdpa_kernel is needed (torch >= 2.3)")

BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
            "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}
DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16}
# (batch, heads, heads_k, seqlen_q, seqlen_k, d, causal, q scale): causal only where Sq == Sk
# (SDPA's is_causal is aligned top-left; FlashAttention's bottom-right: the same there)
SHAPES = [(2, 4, 4, 256, 256, 64, False, 1.0), (1, 8, 8, 1024, 1024, 128, True, 1.0),
          (1, 4, 4, 2048, 2048, 64, True, 3.0), (2, 2, 2, 300, 700, 128, False, 3.0),
          (1, 8, 8, 1, 4096, 128, False, 1.0), (3, 2, 2, 65, 65, 32, True, 1.0),
          (1, 4, 4, 512, 512, 16, False, 1.0), (1, 4, 4, 512, 512, 256, True, 1.0),
          (1, 2, 2, 4096, 4096, 64, True, 1.0)]
QUICK = SHAPES[:4]
LONG = [(1, 4, 4, 8192, 8192, 128, True, 1.0), (1, 4, 4, 16384, 16384, 64, True, 1.0),
        (1, 4, 4, 8192, 8192, 64, False, 3.0), (1, 2, 2, 32768, 32768, 64, True, 1.0)]
MPI = int(os.environ.get("FA_MPI_NP", "0"))
if MPI:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import row_rule_study  # noqa: E402


class MpiVerdict:
    """What flashattn-mpi check said, shaped like the fields of fa.check's report used here."""

    def __init__(self, q, k, v, o, causal, dn):
        f = [x.float().cpu().numpy() for x in (q, k, v, o)]
        ok, self.row_ratio, self.text = row_rule_study.check_mpi(MPI, *f, causal, dn, dn)
        m = re.search(r"row rule: (\d+) of", self.text)
        self.row_n_fail = int(m.group(1)) if m else -1
        m = re.search(r"; (\d+) out of tolerance", self.text)
        self.n_fail = int(m.group(1)) if m else -1
        self.n_nonfinite = 0
        m = re.search(r"max \|test - ref\| ([0-9.e+-]+),", self.text)
        mb = re.search(r"bound ([0-9.e+-]+)", self.text)
        self.ratio = float(m.group(1)) / float(mb.group(1)) if m and mb else float("nan")
        self.ok = ok

    def __bool__(self):
        return self.ok


def judge(q, k, v, o, causal, dn):
    return MpiVerdict(q, k, v, o, causal, dn) if MPI else fa.check(q, k, v, o, causal=causal, dtype=dn)


def run(backend, dt, shape, seed, mask=None):
    b, h, hk, sq, sk, d, causal, qs = shape
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = (qs * torch.randn(b, h, sq, d, device="cuda", generator=g)).to(dt)
    k = torch.randn(b, hk, sk, d, device="cuda", generator=g).to(dt)
    v = torch.randn(b, hk, sk, d, device="cuda", generator=g)
    v[..., 0] *= float(os.environ.get("ROW_RULE_V_OUTLIER", "1"))  # an outlier channel of V
    v = v.to(dt)
    with sdpa_kernel([BACKENDS[backend]]):
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal and mask is None)
    torch.cuda.synchronize()
    # SDPA's [B, H, S, d] -> FlashAttention's [B, S, H, d]
    return [x.transpose(1, 2).contiguous() for x in (q, k, v, o)]


def main():
    quick = "--quick" in sys.argv
    bad = 0
    worst = {}
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    print(f"{'backend':9} {'dtype':5} {'B':>2} {'H':>2} {'Sq':>5} {'Sk':>5} {'d':>4} {'causal':6} {'qs':>4}"
          f" {'ratio':>7} {'row':>6} {'rows over':>9} verdict")
    for backend in BACKENDS:
        for dn, dt in DTYPES.items():
            shapes = QUICK if quick else SHAPES
            if MPI:  # lengths the ring splits (2P chunks under causal), then the long ones
                shapes = [x for x in shapes if x[3] % (2 * MPI) == 0 and x[4] % (2 * MPI) == 0] + LONG
                if "--long" in sys.argv:
                    shapes = LONG
            for n, shape in enumerate(shapes):
                try:
                    q, k, v, o = run(backend, dt, shape, 1000 + n)
                except RuntimeError as e:  # a backend without this shape or dtype here
                    print(f"{backend:9} {dn:5} {shape}: not run ({str(e).splitlines()[0][:80]})")
                    continue
                r = judge(q, k, v, o, shape[6], dn)
                b, h, hk, sq, sk, d, causal, qs = shape
                print(f"{backend:9} {dn:5} {b:2} {h:2} {sq:5} {sk:5} {d:4} {str(causal):6} {qs:4}"
                      f" {r.ratio:7.3g} {r.row_ratio:6.3g} {r.row_n_fail:9} {'PASS' if r else 'FAIL'}")
                worst[backend] = max(worst.get(backend, 0.0), r.row_ratio)
                if not r:
                    bad += 1
                    print(r.text)
    print("largest row fraction of the correct outputs: " +
          ", ".join(f"{b} {w:.3g}" for b, w in worst.items()))
    # wrong outputs: a window of W keys where causal was meant (rows past W lose keys)
    for dn, dt in DTYPES.items():
        sq = 8192 if MPI else 2048
        w = sq - 6
        i = torch.arange(sq, device="cuda")[:, None]
        j = torch.arange(sq, device="cuda")[None, :]
        mask = (j <= i) & (j >= i - w)
        q, k, v, o = run("efficient", dt, (1, 4, 4, sq, sq, 64, True, 1.0), 7, mask=mask)
        r = judge(q, k, v, o, True, dn)
        elements_pass = r.n_fail == 0 and r.n_nonfinite == 0
        print(f"wrong ({dn}): window ({w}, 0) for causal, Sq = Sk = {sq}: ratio {r.ratio:.3g}, elements over "
              f"{r.n_fail}, rows over the row rule {r.row_n_fail} (worst {r.row_ratio:.3g} of its bound): "
              f"{'PASS' if r else 'FAIL'}{' (the element rule alone would pass it)' if elements_pass else ''}")
        if r:
            bad += 1
    print(f"row_rule_sdpa: {bad} unexpected verdicts")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
