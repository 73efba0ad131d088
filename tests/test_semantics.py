"""test_semantics.py -- `flashattn run` against an independent float64 model.

Each case writes Q, K, V (and ALiBi slopes) as .npy files into a temporary
directory, runs `$FA_BUILD/flashattn run --impl flash` and `--impl reference`
with --lse, and compares O and LSE with tests/ref_numpy.py, which was written
from docs/semantics.md and shares no code with the library.

Acceptance (issue 2): flash within 5e-5 absolute, reference within 2e-6, in
both O and LSE; rows with no visible key must be exactly O = 0, LSE = -inf.

Seeded: FA_TEST_SEED replays a run (the seed is printed on failure).
"""

import os
import subprocess
import sys
import time
import zlib

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ref_numpy  # noqa: E402

BUILD = os.environ.get("FA_BUILD", "build")
CLI = os.path.join(BUILD, "flashattn")
SEED = int(os.environ.get("FA_TEST_SEED", "0") or 0) or int(time.time()) & 0xFFFFFFFF
TOL = {"flash": 5e-5, "reference": 2e-6}

needs_cli = pytest.mark.skipif(not os.access(CLI, os.X_OK), reason=f"{CLI} not built")


# --------------------------------------------------------------------------
# Case construction
# --------------------------------------------------------------------------

def case(name, B=1, Sq=17, Sk=17, H=2, Hk=None, d=16, dv=None, dtype="f32",
         causal=False, window=None, softcap=0.0, scale=None, alibi=None, amp=1.0):
    """One semantic case. alibi is None, 'head' ([H] slopes) or 'batch_head' ([B, H])."""
    return pytest.param(dict(B=B, Sq=Sq, Sk=Sk, H=H, Hk=Hk or H, d=d, dv=dv or d,
                             dtype=dtype, causal=causal, window=window,
                             softcap=softcap, scale=scale, alibi=alibi, amp=amp), id=name)


FIXED_CASES = [
    case("plain_square", B=2, Sq=37, Sk=37, H=3, d=16),
    case("plain_q_shorter", Sq=13, Sk=70, d=32),
    case("plain_q_longer", Sq=70, Sk=13, d=32),
    case("causal_square", Sq=65, Sk=65, d=64),
    case("causal_q_shorter", Sq=20, Sk=53, d=16),
    case("causal_q_longer_has_empty_rows", Sq=53, Sk=20, d=16),
    case("window_both_q_shorter", Sq=30, Sk=61, window=(5, 3)),
    case("window_both_q_longer", Sq=61, Sk=30, window=(7, 2)),
    case("window_left_only", Sq=40, Sk=40, window=(4, -1)),
    case("window_right_only", Sq=25, Sk=40, window=(-1, 6)),
    case("window_diagonal_only", Sq=33, Sk=19, window=(0, 0)),
    case("window_left_with_causal", Sq=45, Sk=45, window=(9, -1), causal=True),
    case("window_right_beyond_seqlen_k", Sq=40, Sk=10, window=(3, 15)),
    case("softcap", Sq=29, Sk=31, softcap=5.0, amp=3.0),
    case("softcap_with_large_scale", Sq=29, Sk=31, softcap=2.0, scale=2.5),
    case("explicit_scale", Sq=21, Sk=34, scale=0.37),
    case("alibi_per_head_causal", B=2, Sq=40, Sk=40, H=4, causal=True, alibi="head"),
    case("alibi_per_batch_head", B=2, Sq=23, Sk=47, H=3, alibi="batch_head"),
    case("alibi_q_longer_causal", Sq=47, Sk=23, H=2, causal=True, alibi="head"),
    case("alibi_after_softcap", Sq=31, Sk=31, H=2, softcap=3.0, alibi="head", amp=2.0),
    case("gqa", B=2, Sq=19, Sk=27, H=6, Hk=2, d=16),
    case("mqa_causal", Sq=27, Sk=19, H=4, Hk=1, causal=True),
    case("dv_larger_than_d", Sq=18, Sk=22, d=24, dv=40),
    case("dv_smaller_than_d", Sq=18, Sk=22, d=64, dv=8),
    case("d_one", Sq=9, Sk=11, d=1, dv=3),
    case("seqlen_one", Sq=1, Sk=1, d=8),
    case("one_query_many_keys_causal", Sq=1, Sk=100, causal=True),
    case("many_queries_one_key_causal", Sq=100, Sk=1, causal=True),
    case("f16_inputs", Sq=33, Sk=29, dtype="f16", causal=True),
    case("bf16_inputs", Sq=33, Sk=29, dtype="bf16", window=(4, 4)),
    case("f64_inputs", Sq=33, Sk=29, dtype="f64", softcap=4.0),
    case("everything_at_once", B=2, Sq=41, Sk=26, H=4, Hk=2, d=20, dv=12, dtype="bf16",
         causal=True, window=(6, -1), softcap=4.0, alibi="batch_head", scale=0.3),
    case("block_edges", Sq=129, Sk=257, H=1, d=32, causal=True),
]


def random_cases(n, seed):
    """n random combinations of every option, reproducible from the seed."""
    rng = np.random.default_rng(seed)
    out = []
    for idx in range(n):
        Hk = int(rng.choice([1, 2, 3]))
        H = Hk * int(rng.choice([1, 2, 3]))
        w = rng.integers(-1, 12, size=2) if rng.random() < 0.4 else None
        out.append(case(
            f"random_{idx}", B=int(rng.integers(1, 3)), Sq=int(rng.integers(1, 90)),
            Sk=int(rng.integers(1, 90)), H=H, Hk=Hk, d=int(rng.choice([1, 4, 8, 16, 40, 64])),
            dv=int(rng.choice([1, 8, 16, 24, 64])),
            dtype=str(rng.choice(["f32", "f32", "f16", "bf16", "f64"])),
            causal=bool(rng.random() < 0.4),
            window=None if w is None else (int(w[0]), int(w[1])),
            softcap=float(rng.choice([0.0, 0.0, 1.5, 10.0])),
            scale=None if rng.random() < 0.7 else float(rng.uniform(0.05, 1.5)),
            alibi=[None, None, "head", "batch_head"][int(rng.integers(0, 4))]))
    return out


# --------------------------------------------------------------------------
# Running one case
# --------------------------------------------------------------------------

def _make_inputs(c, rng):
    def rand(shape):
        return rng.uniform(-c["amp"], c["amp"], size=shape)

    q = rand((c["B"], c["Sq"], c["H"], c["d"]))
    k = rand((c["B"], c["Sk"], c["Hk"], c["d"]))
    v = rand((c["B"], c["Sk"], c["Hk"], c["dv"]))
    stored, values = [], []
    for x in (q, k, v):
        if c["dtype"] == "f32":
            s = x.astype(np.float32); val = s.astype(np.float64)
        elif c["dtype"] == "f64":
            s = x.astype(np.float64); val = s
        elif c["dtype"] == "f16":
            s = x.astype(np.float16); val = s.astype(np.float64)
        else:  # bf16 as <u2 bit patterns
            s = ref_numpy.float_to_bf16_bits(x); val = ref_numpy.bf16_bits_to_float64(s)
        stored.append(s)
        values.append(val)
    slopes = None
    if c["alibi"] == "head":
        slopes = (2.0 ** -np.arange(1, c["H"] + 1)).astype(np.float32)
    elif c["alibi"] == "batch_head":
        slopes = rng.uniform(0.01, 0.6, size=(c["B"], c["H"])).astype(np.float32)
    return stored, values, slopes


def _run_cli(tmp, impl, c, has_alibi):
    args = [CLI, "run", "-q", str(tmp / "q.npy"), "-k", str(tmp / "k.npy"),
            "-v", str(tmp / "v.npy"), "-o", str(tmp / f"o_{impl}.npy"),
            "--lse", str(tmp / f"lse_{impl}.npy"), "--impl", impl]
    if c["causal"]:
        args.append("--causal")
    if c["window"] is not None:
        args += ["--window", f"{c['window'][0]},{c['window'][1]}"]
    if c["softcap"]:
        args += ["--softcap", repr(c["softcap"])]
    if c["scale"] is not None:
        args += ["--scale", repr(c["scale"])]
    if has_alibi:
        args += ["--alibi", str(tmp / "alibi.npy")]
    res = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, f"{' '.join(args)}\nexit {res.returncode}\n{res.stderr}"
    o = np.load(tmp / f"o_{impl}.npy").astype(np.float64)
    lse = np.load(tmp / f"lse_{impl}.npy").astype(np.float64)
    return o, lse


def _compare(name, got, want, tol):
    assert got.shape == want.shape, f"{name}: shape {got.shape}, expected {want.shape}"
    assert not np.isnan(got).any(), f"{name}: NaN at {np.argwhere(np.isnan(got))[0]}"
    inf_want = np.isinf(want)
    # Infinities (LSE of empty rows) must match exactly, sign included.
    bad_inf = (np.isinf(got) != inf_want) | (inf_want & (got != want))
    assert not bad_inf.any(), (f"{name}: infinity mismatch at {np.argwhere(bad_inf)[0]}: "
                               f"got {got[tuple(np.argwhere(bad_inf)[0])]}")
    err = np.where(inf_want, 0.0, np.abs(got - np.where(inf_want, 0.0, want)))
    if err.size:
        worst = np.unravel_index(np.argmax(err), err.shape)
        assert err[worst] <= tol, (f"{name}: max abs error {err[worst]:.3e} > {tol:.0e} "
                                   f"at {worst}: got {got[worst]!r}, want {want[worst]!r}")


@needs_cli
@pytest.mark.parametrize("c", FIXED_CASES + random_cases(40, SEED))
def test_run_matches_float64_model(c, tmp_path):
    """Ensure flash and reference agree with the float64 model for every option."""
    rng = np.random.default_rng([SEED, zlib.crc32(repr(sorted(c.items())).encode())])
    stored, values, slopes = _make_inputs(c, rng)
    for name, arr in zip(("q", "k", "v"), stored):
        np.save(tmp_path / f"{name}.npy", arr)
    if slopes is not None:
        np.save(tmp_path / "alibi.npy", slopes)
    window = c["window"] if c["window"] is not None else (-1, -1)
    o_ref, lse_ref = ref_numpy.attention_forward(
        *values, scale=c["scale"], causal=c["causal"], window=window,
        softcap=c["softcap"], alibi=slopes)
    for impl in ("reference", "flash"):
        o, lse = _run_cli(tmp_path, impl, c, slopes is not None)
        ctx = f"[FA_TEST_SEED={SEED}] {impl}"
        _compare(f"{ctx} O", o, o_ref, TOL[impl])
        _compare(f"{ctx} LSE", lse, lse_ref, TOL[impl])
        empty = np.isinf(lse_ref)
        if empty.any():
            rows = np.transpose(np.nonzero(empty))  # (b, h, i)
            for b, h, i in rows:
                assert np.all(o[b, i, h, :] == 0.0), f"{ctx}: empty row ({b},{i},{h}) not zero"


def test_model_agrees_with_brute_force_formula():
    """Ensure the float64 model itself matches a literal transcription of the formula."""
    rng = np.random.default_rng(SEED)
    B, Sq, Sk, H, Hk, d, dv = 1, 6, 4, 2, 1, 3, 2
    q = rng.standard_normal((B, Sq, H, d))
    k = rng.standard_normal((B, Sk, Hk, d))
    v = rng.standard_normal((B, Sk, Hk, dv))
    slopes = np.array([0.25, 0.5])
    o, lse = ref_numpy.attention_forward(q, k, v, scale=0.7, causal=True, window=(1, -1),
                                         softcap=2.0, alibi=slopes)
    for h in range(H):
        for i in range(Sq):
            num, den = np.zeros(dv), 0.0
            for j in range(Sk):
                off = i + Sk - Sq
                if not (off - 1 <= j <= off):
                    continue
                s = 0.7 * sum(q[0, i, h, c] * k[0, j, 0, c] for c in range(d))
                s = 2.0 * np.tanh(s / 2.0) - slopes[h] * abs(off - j)
                num += np.exp(s) * v[0, j, 0]
                den += np.exp(s)
            if den == 0:
                assert lse[0, h, i] == -np.inf and np.all(o[0, i, h] == 0)
            else:
                assert abs(lse[0, h, i] - np.log(den)) < 1e-12
                assert np.allclose(o[0, i, h], num / den, atol=1e-12, rtol=0)


def test_model_backward_agrees_with_finite_differences():
    """Ensure the float64 backward model is the gradient of the forward model."""
    rng = np.random.default_rng(SEED + 1)
    B, Sq, Sk, H, Hk, d, dv = 1, 5, 7, 4, 2, 3, 2
    q = rng.standard_normal((B, Sq, H, d))
    k = rng.standard_normal((B, Sk, Hk, d))
    v = rng.standard_normal((B, Sk, Hk, dv))
    dout = rng.standard_normal((B, Sq, H, dv))
    opts = dict(scale=0.6, causal=True, window=(3, -1), softcap=1.5,
                alibi=np.array([0.1, 0.2, 0.3, 0.4]))
    grads = ref_numpy.attention_backward(q, k, v, dout, **opts)

    def loss(qq, kk, vv):
        return float(np.sum(ref_numpy.attention_forward(qq, kk, vv, **opts)[0] * dout))

    eps = 1e-6
    for which, (x, g) in enumerate(zip((q, k, v), grads)):
        for idx in np.ndindex(x.shape):
            xp, xm = x.copy(), x.copy()
            xp[idx] += eps
            xm[idx] -= eps
            args_p = [q, k, v]
            args_m = [q, k, v]
            args_p[which], args_m[which] = xp, xm
            fd = (loss(*args_p) - loss(*args_m)) / (2 * eps)
            assert abs(fd - g[idx]) < 1e-6, (which, idx, fd, g[idx])


def _has_grad():
    if not os.access(CLI, os.X_OK):
        return False
    return subprocess.run([CLI, "grad", "--help"], capture_output=True).returncode == 0


GRAD_CASES = [
    case("grad_plain", B=2, Sq=23, Sk=31, H=2, d=16),
    case("grad_causal_q_longer_has_empty_rows", Sq=40, Sk=17, d=16, causal=True),
    case("grad_window", Sq=33, Sk=45, window=(6, 2)),
    case("grad_softcap_alibi", Sq=29, Sk=29, H=2, softcap=3.0, alibi="head", amp=2.0),
    case("grad_gqa_alibi_batch_head", B=2, Sq=19, Sk=27, H=6, Hk=2, alibi="batch_head", causal=True),
    case("grad_mqa_dv_differs", Sq=21, Sk=18, H=4, Hk=1, d=24, dv=8),
    case("grad_bf16_inputs", Sq=25, Sk=25, dtype="bf16", causal=True, window=(5, -1)),
]


@pytest.mark.skipif(not _has_grad(), reason="flashattn grad not available")
@pytest.mark.parametrize("c", GRAD_CASES)
def test_grad_matches_float64_model(c, tmp_path):
    """Ensure `flashattn grad` (flash and reference) gives the float64 model's dQ, dK, dV."""
    rng = np.random.default_rng([SEED, zlib.crc32(repr(sorted(c.items())).encode())])
    stored, values, slopes = _make_inputs(c, rng)
    for name, arr in zip(("q", "k", "v"), stored):
        np.save(tmp_path / f"{name}.npy", arr)
    dout = rng.uniform(-1, 1, size=(c["B"], c["Sq"], c["H"], c["dv"])).astype(np.float32)
    np.save(tmp_path / "dout.npy", dout)
    args_mask = []
    if c["causal"]:
        args_mask.append("--causal")
    if c["window"] is not None:
        args_mask += ["--window", f"{c['window'][0]},{c['window'][1]}"]
    if c["softcap"]:
        args_mask += ["--softcap", repr(c["softcap"])]
    if c["scale"] is not None:
        args_mask += ["--scale", repr(c["scale"])]
    if slopes is not None:
        np.save(tmp_path / "alibi.npy", slopes)
        args_mask += ["--alibi", str(tmp_path / "alibi.npy")]
    window = c["window"] if c["window"] is not None else (-1, -1)
    want = ref_numpy.attention_backward(*values, dout, scale=c["scale"], causal=c["causal"],
                                        window=window, softcap=c["softcap"], alibi=slopes)
    for impl, rel in (("reference", 2e-6), ("flash", 1e-4)):
        outs = [tmp_path / f"d{n}_{impl}.npy" for n in "qkv"]
        args = [CLI, "grad", "-q", str(tmp_path / "q.npy"), "-k", str(tmp_path / "k.npy"),
                "-v", str(tmp_path / "v.npy"), "--dout", str(tmp_path / "dout.npy"),
                "--dq", str(outs[0]), "--dk", str(outs[1]), "--dv", str(outs[2]),
                "--impl", impl] + args_mask
        res = subprocess.run(args, capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, f"{' '.join(args)}\nexit {res.returncode}\n{res.stderr}"
        for name, path, w in zip(("dQ", "dK", "dV"), outs, want):
            got = np.load(path).astype(np.float64)
            tol = rel * max(1.0, float(np.max(np.abs(w))))
            _compare(f"[FA_TEST_SEED={SEED}] {impl} {name}", got, w, tol)
