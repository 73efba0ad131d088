"""test_diagnose_rotary.py -- `check --diagnose` with rotary (issue 13: rotary-pairing, rotary-offset).

A KV-cache call with new keys and rotary (flash_attn_with_kvcache's rotary_cos / rotary_sin):
each rotary mistake is injected by an independent float64 numpy model written here -- q and
k_new rotated by tests/ref_numpy.py's apply_rotary under the mistaken rule (the other
pairing, positions off by an offset, the query rule of the other mask kind, new keys from
position 0, no rotation), then ref_numpy.kvcache_forward on the rotated q and k_new; no code
shared with src/diagnose.c or src/serve.c -- and `check --diagnose` must name that class
FIRST with the fitted parameter. Both pairings, causal (query i at cache_seqlens[b] + i) and
not (every query at cache_seqlens[b]), a batch of 3 with different cache_seqlens, rotary_dim
below and equal to d. Correct outputs (the float64 model rounded to f32, and the library's
own output) get `diagnosis: none`; the other ids still work on rotary problems (scale,
kv-append-offset); bf16 inputs under a window, and a paged cache. Fresh random inputs
(FA_TEST_SEED replays a run).
"""

import os
import sys
import time

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import ref_numpy as R  # noqa: E402
from diag_cli import check_diagnose, first_id, seq_table  # noqa: E402

BUILD = os.environ.get("FA_BUILD", "build")
CLI = os.path.join(BUILD, "flashattn")
SEED = int(os.environ.get("FA_TEST_SEED", "0") or 0) or int(time.time()) & 0xFFFFFFFF

pytestmark = pytest.mark.skipif(not os.access(CLI, os.X_OK), reason=f"{CLI} not built")

B, SQ, SC, SN, H, HK, D = 3, 5, 48, 3, 4, 2, 32
CS = np.array([17, 30, 9], np.int32)                 # cached keys per sequence (before the new ones)
RO = int(CS.max()) + max(SQ, SN) + 8                 # table rows: room for offsets up to +4


def rand(shape, salt):
    return np.random.default_rng([SEED, salt]).standard_normal(shape).astype(np.float32)


def f32(x):
    return np.asarray(x, np.float32)


def tables(rd):
    """Standard RoPE tables [RO, rd / 2]: cos/sin of pos * 10000^(-2i / rd)."""
    inv = 10000.0 ** (-np.arange(0, rd, 2) / rd)
    ang = np.arange(RO)[:, None] * inv[None, :]
    return f32(np.cos(ang)), f32(np.sin(ang))


def inputs(sq=SQ, sn=SN):
    return (rand((B, sq, H, D), 31), rand((B, SC, HK, D), 32), rand((B, SC, HK, D), 33),
            rand((B, sn, HK, D), 34), rand((B, sn, HK, D), 35))


def model(q, kc, vc, kn, vn, cos, sin, causal, inter_q, inter_k, qpos=None, kpos=None, scale=None,
          drop_new=False, rnd=None, **extra):
    """(O, LSE) of a kernel that rotates q (query i of sequence b at qpos(b, i); None: not
    rotated) and k_new (new key t at kpos(b, t); None: not rotated) with the given pairings,
    then attends to the cache and the rotated new keys (ref_numpy.kvcache_forward)."""
    qr = np.array(q, np.float64)
    kr = np.array(kn, np.float64)
    for b in range(q.shape[0]):
        if qpos is not None:
            qr[b] = R.apply_rotary(q[b], cos, sin, np.array([qpos(b, i) for i in range(q.shape[1])]), inter_q)
        if kpos is not None:
            kr[b] = R.apply_rotary(kn[b], cos, sin, np.array([kpos(b, t) for t in range(kn.shape[1])]), inter_k)
    if rnd is not None:  # the rotated rows rounded to the input dtype, as FlashAttention does
        qr, kr = rnd(qr), rnd(kr)
    opts = dict(causal=causal, **extra)
    if scale is not None:
        opts["scale"] = scale
    if drop_new:
        return R.kvcache_forward(qr, kc, vc, CS, **opts)
    return R.kvcache_forward(qr, kc, vc, CS, kr, vn, **opts)


def right_qpos(causal):
    return (lambda b, i: int(CS[b]) + i) if causal else (lambda b, i: int(CS[b]))


def right_kpos(b, t):
    return int(CS[b]) + t


def check(tmp, arrays, causal, inter, extra=()):
    for name, x in arrays.items():
        np.save(tmp / f"{name}.npy", x)
    flags = ["-q", "q", "-k", "kc", "-v", "vc", "--out", "o", "--cache-seqlens", "cs", "--k-new", "kn",
             "--v-new", "vn", "--rotary-cos", "cos", "--rotary-sin", "sin"]
    flags = [str(tmp / f"{a}.npy") if a in arrays else a for a in flags]
    if "lse" in arrays:
        flags += ["--lse", str(tmp / "lse.npy")]
    flags += (["--causal"] if causal else []) + (["--rotary-interleaved"] if inter else []) + list(extra)
    return check_diagnose(flags)


def arrays(q, kc, vc, kn, vn, cos, sin, o, lse=None):
    a = dict(q=q, kc=kc, vc=vc, kn=kn, vn=vn, cs=CS, cos=cos, sin=sin, o=f32(o))
    if lse is not None:
        a["lse"] = f32(lse)
    return a


CASES = [(inter, causal, rd) for inter in (True, False) for causal in (True, False) for rd in (D // 2, D)]
IDS = [f"{'gptj' if i else 'neox'}-{'causal' if c else 'full'}-rd{r}" for i, c, r in CASES]


@pytest.mark.parametrize("inter,causal,rd", CASES, ids=IDS)
def test_correct_gets_none(tmp_path, inter, causal, rd):
    q, kc, vc, kn, vn = inputs()
    cos, sin = tables(rd)
    o, lse = R.kvcache_forward(q, kc, vc, CS, kn, vn, rotary_cos=cos, rotary_sin=sin, rotary_interleaved=inter,
                               causal=causal)
    rc, lines, out = check(tmp_path, arrays(q, kc, vc, kn, vn, cos, sin, o, lse), causal, inter)
    assert rc == 0 and lines == [lines[0]] and lines[0].startswith("diagnosis: none"), f"seed {SEED}: {out}"
    assert len(seq_table(out)) == B, out


def test_library_output_gets_none(tmp_path):
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
    import flashattn as fa
    try:
        fa.library()
    except OSError as e:  # the sanitizer build makes no shared library
        pytest.skip(f"libflashattn.so not available: {e}")
    q, kc, vc, kn, vn = inputs()
    cos, sin = tables(D)
    for inter in (True, False):
        o, lse = fa.attention_with_kvcache(q, kc.copy(), vc.copy(), kn, vn, cache_seqlens=CS, rotary_cos=cos,
                                           rotary_sin=sin, rotary_interleaved=inter, causal=True, return_lse=True)
        rc, lines, out = check(tmp_path, arrays(q, kc, vc, kn, vn, cos, sin, o, lse), True, inter)
        assert rc == 0 and lines[0].startswith("diagnosis: none"), f"seed {SEED}: {out}"


@pytest.mark.parametrize("inter,causal,rd", CASES, ids=IDS)
def test_pairing(tmp_path, inter, causal, rd):
    """The kernel pairs the other way (GPT-J where GPT-NeoX is meant, or the reverse)."""
    q, kc, vc, kn, vn = inputs()
    cos, sin = tables(rd)
    o, lse = model(q, kc, vc, kn, vn, cos, sin, causal, not inter, not inter, right_qpos(causal), right_kpos)
    rc, lines, out = check(tmp_path, arrays(q, kc, vc, kn, vn, cos, sin, o, lse), causal, inter)
    assert rc == 1 and first_id(lines) == "rotary-pairing", f"seed {SEED}: {out}"
    assert "on q and k_new" in lines[0], out
    want = "(2i, 2i+1) (GPT-J, interleaved) used" if not inter else "(i, i + rotary_dim/2) (GPT-NeoX) used"
    assert want in lines[0], out
    assert all(x > 1e-3 for x in seq_table(out)), out


def test_pairing_keys_only(tmp_path):
    """Only the new keys rotated with the other pairing (the cache writer's bug): O only."""
    q, kc, vc, kn, vn = inputs()
    cos, sin = tables(D)
    o, _ = model(q, kc, vc, kn, vn, cos, sin, True, False, True, right_qpos(True), right_kpos)
    rc, lines, out = check(tmp_path, arrays(q, kc, vc, kn, vn, cos, sin, o), True, False)
    assert rc == 1 and first_id(lines) == "rotary-pairing" and "k_new only" in lines[0], f"seed {SEED}: {out}"


@pytest.mark.parametrize("inter,causal,delta", [(True, True, 1), (False, False, -2), (True, False, 3),
                                                (False, True, -1)])
def test_offset_both(tmp_path, inter, causal, delta):
    """cos/sin sliced at cache_seqlens + delta: q and k_new rotated delta positions off."""
    q, kc, vc, kn, vn = inputs()
    cos, sin = tables(D // 2)
    qp = right_qpos(causal)
    o, lse = model(q, kc, vc, kn, vn, cos, sin, causal, inter, inter, lambda b, i: qp(b, i) + delta,
                   lambda b, t: right_kpos(b, t) + delta)
    rc, lines, out = check(tmp_path, arrays(q, kc, vc, kn, vn, cos, sin, o, lse), causal, inter)
    assert rc == 1 and first_id(lines) == "rotary-offset", f"seed {SEED}: {out}"
    assert f"q and k_new rotated at positions {delta:+d} off" in lines[0], out


def test_offset_queries_only_python(tmp_path):
    """Only the queries off by +2 (k_new right), through python's diagnose(): param = 2."""
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
    import flashattn as fa
    try:
        fa.library()
    except OSError as e:
        pytest.skip(f"libflashattn.so not available: {e}")
    q, kc, vc, kn, vn = inputs()
    cos, sin = tables(D)
    o, lse = model(q, kc, vc, kn, vn, cos, sin, True, True, True, lambda b, i: int(CS[b]) + i + 2, right_kpos)
    rep = fa.diagnose(q, kc, vc, f32(o), f32(lse), causal=True, cache_seqlens=CS, k_new=kn, v_new=vn,
                      rotary_cos=cos, rotary_sin=sin, rotary_interleaved=True)
    assert rep.first == "rotary-offset" and rep.diagnoses[0]["param"] == 2, rep.text
    assert "q (k_new right) rotated at positions +2 off" in rep.diagnoses[0]["detail"], rep.text
    assert rep.batch_rel_rms.shape == (B,)
    o, lse = R.kvcache_forward(q, kc, vc, CS, kn, vn, rotary_cos=cos, rotary_sin=sin, rotary_interleaved=True,
                               causal=True)
    rep = fa.diagnose(q, kc, vc, f32(o), f32(lse), causal=True, cache_seqlens=CS, k_new=kn, v_new=vn,
                      rotary_cos=cos, rotary_sin=sin, rotary_interleaved=True)
    assert rep.first is None and rep.text.startswith("diagnosis: none"), rep.text


@pytest.mark.parametrize("causal", [True, False])
def test_offset_query_rule_swapped(tmp_path, causal):
    """The causal and non-causal position rules swapped: a causal call with every query at
    cache_seqlens[b], or a non-causal call with query i at cache_seqlens[b] + i."""
    q, kc, vc, kn, vn = inputs()
    cos, sin = tables(D)
    o, lse = model(q, kc, vc, kn, vn, cos, sin, causal, False, False, right_qpos(not causal), right_kpos)
    rc, lines, out = check(tmp_path, arrays(q, kc, vc, kn, vn, cos, sin, o, lse), causal, False)
    assert rc == 1 and first_id(lines) == "rotary-offset", f"seed {SEED}: {out}"
    want = "every query at cache_seqlens[b] (the non-causal rule)" if causal else \
        "query i at cache_seqlens[b] + i (the causal rule)"
    assert want in lines[0], out


def test_offset_new_keys_from_zero(tmp_path):
    """New key t rotated at position t instead of cache_seqlens[b] + t."""
    q, kc, vc, kn, vn = inputs()
    cos, sin = tables(D)
    o, _ = model(q, kc, vc, kn, vn, cos, sin, True, True, True, right_qpos(True), lambda b, t: t)
    rc, lines, out = check(tmp_path, arrays(q, kc, vc, kn, vn, cos, sin, o), True, True)
    assert rc == 1 and first_id(lines) == "rotary-offset" and "new key t rotated at position t" in lines[0], \
        f"seed {SEED}: {out}"


def test_offset_all_from_zero(tmp_path):
    """cos/sin not sliced at cache_seqlens: q and k_new rotated from position 0."""
    q, kc, vc, kn, vn = inputs()
    cos, sin = tables(D)
    o, _ = model(q, kc, vc, kn, vn, cos, sin, True, False, False, lambda b, i: i, lambda b, t: t)
    rc, lines, out = check(tmp_path, arrays(q, kc, vc, kn, vn, cos, sin, o), True, False)
    assert rc == 1 and first_id(lines) == "rotary-offset" and "from position 0" in lines[0], f"seed {SEED}: {out}"


@pytest.mark.parametrize("side", ["q", "k_new"])
def test_rotary_not_applied(tmp_path, side):
    """Rotary skipped on q (or on k_new): named as rotary-offset, the detail says which."""
    q, kc, vc, kn, vn = inputs()
    cos, sin = tables(D)
    o, lse = model(q, kc, vc, kn, vn, cos, sin, False, True, True, None if side == "q" else right_qpos(False),
                   None if side == "k_new" else right_kpos)
    rc, lines, out = check(tmp_path, arrays(q, kc, vc, kn, vn, cos, sin, o, lse), False, True)
    assert rc == 1 and first_id(lines) == "rotary-offset", f"seed {SEED}: {out}"
    assert f"rotary not applied to {side} ({side} used unrotated)" in lines[0], out


@pytest.mark.parametrize("inter,causal,delta", [(True, False, -3), (False, True, 4)])
def test_decode_offset(tmp_path, inter, causal, delta):
    """Decoding: one query and one new key per sequence (12 sampled rows: every variant scored
    on every row), q and k_new rotated delta positions off."""
    q, kc, vc, kn, vn = inputs(1, 1)
    cos, sin = tables(D)
    o, lse = model(q, kc, vc, kn, vn, cos, sin, causal, inter, inter, lambda b, i: int(CS[b]) + delta,
                   lambda b, t: int(CS[b]) + delta)
    rc, lines, out = check(tmp_path, arrays(q, kc, vc, kn, vn, cos, sin, o, lse), causal, inter)
    assert rc == 1 and first_id(lines) == "rotary-offset", f"seed {SEED}: {out}"
    assert f"q and k_new rotated at positions {delta:+d} off" in lines[0], out
    o, lse = R.kvcache_forward(q, kc, vc, CS, kn, vn, rotary_cos=cos, rotary_sin=sin, rotary_interleaved=inter,
                               causal=causal)
    rc, lines, out = check(tmp_path, arrays(q, kc, vc, kn, vn, cos, sin, o, lse), causal, inter)
    assert rc == 0 and lines[0].startswith("diagnosis: none"), f"seed {SEED}: {out}"


def test_other_ids_with_rotary(tmp_path):
    """Rotary right, another mistake: 1/d as the scale is `scale`; the new keys left out is
    kv-append-offset."""
    q, kc, vc, kn, vn = inputs()
    cos, sin = tables(D // 2)
    o, lse = model(q, kc, vc, kn, vn, cos, sin, True, False, False, right_qpos(True), right_kpos, scale=1.0 / D)
    rc, lines, out = check(tmp_path, arrays(q, kc, vc, kn, vn, cos, sin, o, lse), True, False)
    assert rc == 1 and first_id(lines) == "scale" and "1/d used" in lines[0], f"seed {SEED}: {out}"
    o, _ = model(q, kc, vc, kn, vn, cos, sin, True, False, False, right_qpos(True), right_kpos, drop_new=True)
    rc, lines, out = check(tmp_path, arrays(q, kc, vc, kn, vn, cos, sin, o), True, False)
    assert rc == 1 and first_id(lines) == "kv-append-offset" and "new keys left out" in lines[0], \
        f"seed {SEED}: {out}"


def test_bf16_window(tmp_path):
    """bf16 inputs and output, a local window (queries at their own positions, as causal): the
    right output (the numpy model on the bf16 values, rounded to bf16) gets none; every query
    rotated at cache_seqlens[b] (the non-causal rule) is rotary-offset."""
    bf = lambda x: R.bf16_bits_to_float64(R.float_to_bf16_bits(x))  # noqa: E731
    q, kc, vc, kn, vn = (bf(x) for x in inputs())
    cos, sin = tables(D)
    win = dict(window=(6, 0))
    flags = ["--window", "6,0"]
    bits = lambda x: R.float_to_bf16_bits(np.asarray(x, np.float32))  # noqa: E731
    for qpos, want in ((right_qpos(True), "diagnosis: none"),
                       (right_qpos(False), "diagnosis: rotary-offset (explains")):
        o, lse = model(q, kc, vc, kn, vn, cos, sin, False, True, True, qpos, right_kpos, rnd=bf, **win)
        a = arrays(*(bits(x) for x in (q, kc, vc, kn, vn)), cos, sin, bits(o), lse)
        a["o"] = bits(o)
        rc, lines, out = check(tmp_path, a, False, True, flags)
        assert lines[0].startswith(want), f"seed {SEED}: {out}"
        if want.startswith("diagnosis: rotary"):
            assert rc == 1 and "every query at cache_seqlens[b] (the non-causal rule)" in lines[0], out
        else:
            assert rc == 0, out


def test_paged_pairing_python():
    """Paged KV (the cache in permuted pages of 8 rows): the right output gets none, the other
    pairing is rotary-pairing (python's diagnose())."""
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
    import flashattn as fa
    try:
        fa.library()
    except OSError as e:
        pytest.skip(f"libflashattn.so not available: {e}")
    q, kc, vc, kn, vn = inputs()
    cos, sin = tables(D)
    ps, maxp = 8, SC // 8
    npages = B * maxp + 2
    table = np.random.default_rng([SEED, 36]).permutation(npages)[:B * maxp].reshape(B, maxp).astype(np.int32)
    kp, vp = rand((npages, ps, HK, D), 37), rand((npages, ps, HK, D), 38)
    for b in range(B):
        for e in range(maxp):
            kp[table[b, e]], vp[table[b, e]] = kc[b, e * ps:(e + 1) * ps], vc[b, e * ps:(e + 1) * ps]
    for inter, want in ((False, None), (True, "rotary-pairing")):
        o, lse = model(q, kc, vc, kn, vn, cos, sin, True, inter, inter, right_qpos(True), right_kpos)
        rep = fa.diagnose(q, kp, vp, f32(o), f32(lse), causal=True, cache_seqlens=CS, k_new=kn, v_new=vn,
                          block_table=table, rotary_cos=cos, rotary_sin=sin, rotary_interleaved=False)
        assert rep.first == want, rep.text
        if want:
            assert rep.diagnoses[0]["param"] == 1 and "on q and k_new" in rep.diagnoses[0]["detail"], rep.text
