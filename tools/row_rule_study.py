"""tools/row_rule_study.py — how close correct bf16 / f16 kernels come to `check`'s row rule
(docs/validation.md, "The row rule"), on the CPU, with numpy models of kernels:

  fa2       FlashAttention-2's loop: key blocks last to first, P = exp(s - running max) rounded
            to the dtype before P V, the row sum of the unrounded P, O rounded at the end;
  fa2-exp2  the same with exp2 and log2(e) folded into the scale (FA2/FA3's code);
  plain     softmax normalized in float32, then P rounded, P V, O rounded (an eager attention);
  split     split-KV: 2-5 splits each an fa2 partial, merged by their LSEs in float32.

Each random configuration (dtype, d 8..256, lengths 1..1500, causal or not, GQA, logit scale
0.3..10, block 64 or 128; V normal, with one channel 10-300x, one key 1000x, or its second half
the negated first) is checked by flashattn.check; the script prints the largest
fraction of its row bound that any row reached, by d_v and over all.

    FA_BUILD=build python3 tools/row_rule_study.py [SEED [TRIALS]]

With FA_MPI_NP=P the same models are judged by `mpirun -np P build/flashattn-mpi check`
instead (its baseline has no P rounding: the row rule leans on its P floor there); lengths are
then multiples of 2P, and half the trials give the kernel float32 inputs that it rounds itself
(`--dtype` names its precision). FA_MPIRUN overrides the launcher ("mpirun --oversubscribe"),
FA_MPI_THREADS the threads a rank (1).

Every verdict must be PASS (exit status 1 otherwise).
"""

import os
import re
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import flashattn as fa  # noqa: E402


def round_bf16(x):
    u = np.ascontiguousarray(np.asarray(x, np.float32)).view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16  # round to nearest even
    return u.astype(np.uint32).view(np.float32)


def round_f16(x):
    return np.asarray(x, np.float32).astype(np.float16).astype(np.float32)


def scores(q, k, causal):
    """float32 scores [Sq, Sk] with -inf where masked (bottom-right causal)."""
    sq, sk, d = q.shape[0], k.shape[0], q.shape[1]
    s = (q @ k.T).astype(np.float32) * np.float32(1 / np.sqrt(d))
    if causal:
        keep = np.arange(sk)[None, :] <= np.arange(sq)[:, None] + sk - sq
        s = np.where(keep, s, -np.inf).astype(np.float32)
    return s


def online(s, v, rnd, lo, hi, block, base2):
    """FA2's loop over keys [lo, hi), blocks last to first: (m, l, acc), unnormalized."""
    sq, dv = s.shape[0], v.shape[1]
    m = np.full(sq, -np.inf, np.float32)
    l = np.zeros(sq, np.float32)
    acc = np.zeros((sq, dv), np.float32)
    c = np.float32(np.log2(np.e)) if base2 else np.float32(1)
    starts = list(range(lo, hi, block))
    for j0 in reversed(starts):
        sb = s[:, j0:min(hi, j0 + block)]
        mn = np.maximum(m, sb.max(1))
        ms = np.where(np.isinf(mn), 0, mn).astype(np.float32)
        ex = np.exp2 if base2 else np.exp
        alpha = ex(np.where(np.isinf(m), -np.inf, m * c - ms * c)).astype(np.float32)
        p = ex((sb * c - (ms * c)[:, None]).astype(np.float32)).astype(np.float32)
        l = alpha * l + p.sum(1, dtype=np.float32)
        acc = acc * alpha[:, None] + rnd(p) @ v[j0:min(hi, j0 + block)]
        m = mn
    return m, l, acc


def kernel(model, q, k, v, rnd, causal, block, splits):
    b, sq, h, _ = q.shape
    sk, hk, dv = k.shape[1], k.shape[2], v.shape[3]
    out = np.zeros((b, sq, h, dv), np.float32)
    for bi in range(b):
        for hi in range(h):
            s = scores(q[bi, :, hi], k[bi, :, hi // (h // hk)], causal)
            vv = v[bi, :, hi // (h // hk)]
            with np.errstate(divide="ignore", invalid="ignore"):
                if model == "plain":
                    m = s.max(1, keepdims=True)
                    p = np.exp(s - np.where(np.isinf(m), 0, m)).astype(np.float32)
                    l = p.sum(1, keepdims=True, dtype=np.float32)
                    o = rnd(np.where(l > 0, p / l, 0).astype(np.float32)) @ vv
                elif model == "split":
                    edges = np.linspace(0, sk, splits + 1).astype(int)
                    parts = [online(s, vv, rnd, a, e, block, False) for a, e in zip(edges[:-1], edges[1:]) if e > a]
                    lse = np.stack([np.where(l > 0, m + np.log(l), -np.inf) for m, l, _ in parts]).astype(np.float32)
                    top = lse.max(0)
                    w = np.exp(lse - np.where(np.isinf(top), 0, top)).astype(np.float32)
                    o = sum(w[x][:, None] * np.where(p[1][:, None] > 0, p[2] / p[1][:, None], 0)
                            for x, p in enumerate(parts))
                    o = o / np.where(w.sum(0) > 0, w.sum(0), 1)[:, None]
                else:
                    m, l, acc = online(s, vv, rnd, 0, sk, block, model == "fa2-exp2")
                    o = np.where(l[:, None] > 0, acc / np.where(l > 0, l, 1)[:, None], 0)
            out[bi, :, hi] = rnd(o)
    return out


def save(path, x, dn):
    """x as a .npy of dtype dn: bf16 as <u2 bit patterns, f16 as <f2, else <f4."""
    x = np.ascontiguousarray(x, np.float32)
    if dn == "bf16":
        np.save(path, (round_bf16(x).view(np.uint32) >> 16).astype("<u2"))
    elif dn == "f16":
        np.save(path, x.astype("<f2"))
    else:
        np.save(path, x.astype("<f4"))


def check_mpi(np_, q, k, v, o, causal, dn, in_dn):
    """(passed, worst row ratio, report) from flashattn-mpi check over np_ ranks."""
    build = os.environ.get("FA_BUILD", "build")
    with tempfile.TemporaryDirectory() as t:
        for name, x, xd in (("q", q, in_dn), ("k", k, in_dn), ("v", v, in_dn), ("o", o, dn)):
            save(os.path.join(t, name + ".npy"), x, xd)
        cmd = os.environ.get("FA_MPIRUN", "mpirun --oversubscribe").split() + [
            "-np", str(np_), os.path.join(build, "flashattn-mpi"), "check", "--threads",
            os.environ.get("FA_MPI_THREADS", "1"), "--dtype", dn,
            "-q", f"{t}/q.npy", "-k", f"{t}/k.npy", "-v", f"{t}/v.npy", "--out", f"{t}/o.npy"]
        r = subprocess.run(cmd + (["--causal"] if causal else []), capture_output=True, text=True)
    m = re.search(r"at ([0-9.e+-]+|inf) of its bound", r.stdout)
    return r.returncode == 0, float(m.group(1)) if m else float("inf"), r.stdout + r.stderr


def main():
    seed = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    trials = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    rng = np.random.default_rng(seed)
    mpi = int(os.environ.get("FA_MPI_NP", "0"))
    by_d, worst, bad = {}, (0.0, ""), 0
    for _ in range(trials):
        dn = str(rng.choice(["bf16", "f16"]))
        rnd = round_bf16 if dn == "bf16" else round_f16
        d = int(rng.choice([8, 16, 32, 64, 128, 256]))
        sq = int(rng.choice([1, 3, 17, 128, 300, 700]))
        sk = int(rng.choice([1, 2, 5, 64, 257, 700, 1500]))
        causal = bool(rng.integers(2))
        h = int(rng.choice([1, 2, 4]))
        hk = int(rng.choice([x for x in (1, 2, 4) if h % x == 0]))
        qs = float(rng.choice([0.3, 1.0, 3.0, 10.0]))
        block = int(rng.choice([64, 128]))
        model = str(rng.choice(["fa2", "fa2-exp2", "plain", "split"]))
        if mpi:  # lengths the ring splits in 2P chunks
            sq, sk = [max(2 * mpi, (x + 2 * mpi - 1) // (2 * mpi) * 2 * mpi) for x in (sq, sk)]
        in_dn = str(rng.choice([dn, "f32"])) if mpi else dn
        qraw = qs * rng.standard_normal((1, sq, h, d))
        kraw = rng.standard_normal((1, sk, hk, d))
        q, k = rnd(qraw), rnd(kraw)
        vraw = rng.standard_normal((1, sk, hk, d))
        shape_v = str(rng.choice(["normal", "outlier channel", "outlier key", "cancelling"]))
        if shape_v == "outlier channel":  # one channel 10-300x the others (LLMs' V and O have such)
            vraw[..., int(rng.integers(d))] *= float(rng.choice([10, 30, 100, 300]))
        elif shape_v == "outlier key":  # one key's V 1000x (a BOS-like token)
            vraw[:, int(rng.integers(sk))] *= 1000.0
        elif shape_v == "cancelling" and sk >= 2:  # second half of the keys' V the negated first half
            vraw[:, sk - sk // 2:] = -vraw[:, :sk // 2]
        v = rnd(vraw)
        o = kernel(model, q, k, v, rnd, causal, block, int(rng.integers(2, 6)))
        tag = f"{model} {dn} d={d} Sq={sq} Sk={sk} H={h}/{hk} causal={causal} q*{qs} block={block} V {shape_v}"
        if mpi:
            tag += f" inputs {in_dn}"
            f32in = in_dn == "f32"
            ok, ratio, text = check_mpi(mpi, qraw if f32in else q, kraw if f32in else k, vraw if f32in else v,
                                        o, causal, dn, in_dn)
        else:
            r = fa.check(q, k, v, o, causal=causal, dtype=dn)
            ok, ratio, text = bool(r), r.row_ratio, r.text
        by_d[d] = max(by_d.get(d, 0.0), ratio)
        if ratio > worst[0]:
            worst = (ratio, tag)
        if not ok:
            bad += 1
            print(f"FAIL {tag}\n{text}")
    print("largest row fraction by d_v: " + ", ".join(f"{d}: {x:.3g}" for d, x in sorted(by_d.items())))
    print(f"largest over all: {worst[0]:.3g} ({worst[1]}); {bad} of {trials} correct outputs failed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
