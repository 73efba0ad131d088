"""test_diagnose.py -- `flashattn check --diagnose` names the mistake (issue 13 items 1, 3).

For every diagnosis id the library implements, an independent float64 model
written here with numpy (tests/ref_numpy.py for the correct contract, small
variations of it for each mistake; no code shared with src/diagnose.c)
injects that one mistake into an otherwise correct output, on a shape where
the mistake is visible, and `check --diagnose` must name that class FIRST.
Correct outputs in every supported precision (f32 from the flash path, f16 and
bf16 from a numpy emulation of a low-precision kernel: inputs in the dtype, P
rounded to the dtype before P.V, output rounded) must get `diagnosis: none`.
Inputs are fresh random numbers (FA_TEST_SEED replays a run).
"""

import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import ref_numpy as R  # noqa: E402

BUILD = os.environ.get("FA_BUILD", "build")
CLI = os.path.join(BUILD, "flashattn")
SEED = int(os.environ.get("FA_TEST_SEED", "0") or 0) or int(time.time()) & 0xFFFFFFFF
LN2 = np.log(2.0)

pytestmark = pytest.mark.skipif(not os.access(CLI, os.X_OK), reason=f"{CLI} not built")


def rand(shape, salt, amp=1.0):
    return (amp * np.random.default_rng([SEED, salt]).standard_normal(shape)).astype(np.float32)


def problem(B=2, Sq=33, Sk=70, H=4, Hk=2, d=32, amp=1.0):
    return (rand((B, Sq, H, d), 1, amp), rand((B, Sk, Hk, d), 2, amp), rand((B, Sk, Hk, d), 3))


def diagnose(tmp, q, k, v, o, lse=None, flags=(), extra=()):
    """Run check --diagnose; return (exit status, the diagnosis lines, full stdout)."""
    np.save(tmp / "q.npy", q)
    np.save(tmp / "k.npy", k)
    np.save(tmp / "v.npy", v)
    np.save(tmp / "o.npy", o)
    cmd = [CLI, "check", "-q", str(tmp / "q.npy"), "-k", str(tmp / "k.npy"), "-v", str(tmp / "v.npy"),
           "--out", str(tmp / "o.npy"), "--diagnose", *flags, *extra]
    if lse is not None:
        np.save(tmp / "lse.npy", np.asarray(lse, np.float32))
        cmd += ["--lse", str(tmp / "lse.npy")]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode in (0, 1), r.stderr
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("diagnosis: ")]
    return r.returncode, lines, r.stdout


def first_id(lines):
    m = re.match(r"diagnosis: (\S+)", lines[0])
    return m.group(1)


def mask_opts(causal=False, window=None):
    flags = (["--causal"] if causal else []) + (["--window", f"{window[0]},{window[1]}"] if window else [])
    return flags, dict(causal=causal, window=window or (-1, -1))


# ---- independent models of each mistake ------------------------------------------

def scores(q, k, v, scale=None, softcap=0.0, cap_before_scale=False, kv_map=None):
    """[B, H, Sq, Sk] final logits (before the mask), float64."""
    q, k = np.asarray(q, np.float64), np.asarray(k, np.float64)
    B, Sq, H, d = q.shape
    Hk = k.shape[2]
    scale = 1.0 / np.sqrt(d) if scale is None else scale
    kv = kv_map if kv_map is not None else [h // (H // Hk) for h in range(H)]
    dot = np.stack([np.einsum("bid,bjd->bij", q[:, :, h], k[:, :, kv[h]]) for h in range(H)], axis=1)
    if softcap > 0 and cap_before_scale:
        return scale * softcap * np.tanh(dot / softcap)
    s = scale * dot
    return softcap * np.tanh(s / softcap) if softcap > 0 else s


def softmax_out(s, v, keep, kv_map=None):
    """O [B, Sq, H, dv], LSE [B, H, Sq] from logits s [B, H, Sq, Sk] and keep [Sq, Sk]."""
    v = np.asarray(v, np.float64)
    B, H, Sq, Sk = s.shape
    Hk = v.shape[2]
    kv = kv_map if kv_map is not None else [h // (H // Hk) for h in range(H)]
    s = np.where(keep[None, None], s, -np.inf)
    m = s.max(-1, keepdims=True)
    e = np.exp(s - m)
    lsum = e.sum(-1, keepdims=True)
    p = e / lsum
    o = np.stack([p[:, h] @ v[:, :, kv[h]] for h in range(H)], axis=2)
    return o, (m + np.log(lsum))[..., 0]


def no_rescale(s, v, keep, tile):
    """Online softmax over key tiles that forgets to rescale acc and l when the max rises."""
    v = np.asarray(v, np.float64)
    B, H, Sq, Sk = s.shape
    g = H // v.shape[2]
    o = np.zeros((B, Sq, H, v.shape[3]))
    for b in range(B):
        for h in range(H):
            for i in range(Sq):
                m, l, acc = -np.inf, 0.0, 0.0
                for t0 in range(0, Sk, tile):
                    row = np.where(keep[i, t0:t0 + tile], s[b, h, i, t0:t0 + tile], -np.inf)
                    if not np.isfinite(row.max()):
                        continue
                    m = max(m, row.max())
                    w = np.exp(row - m)
                    l += w.sum()
                    acc = acc + w @ v[b, t0:t0 + tile, h // g]
                o[b, i, h] = acc / l
    return o


def f32(x):
    return np.asarray(x, np.float32)


# ---- every class: injected, then named first -----------------------------------

def test_causal_top_left(tmp_path):
    for Sq, Sk in ((24, 56), (56, 24)):           # both ways
        q, k, v = problem(Sq=Sq, Sk=Sk)
        o, lse = R.attention_forward(q, k, v, causal=True, align="top-left")
        rc, lines, out = diagnose(tmp_path, q, k, v, f32(o), lse, ["--causal"])
        assert rc == 1 and first_id(lines) == "causal-top-left", f"seed {SEED} {Sq}x{Sk}: {out}"
    # and the reverse: a FlashAttention kernel checked under --align top-left
    o, lse = R.attention_forward(q, k, v, causal=True)
    rc, lines, out = diagnose(tmp_path, q, k, v, f32(o), lse, ["--causal", "--align", "top-left"])
    assert first_id(lines) == "causal-top-left" and "bottom-right" in lines[0], out


def test_scale(tmp_path):
    q, k, v = problem()
    d = q.shape[3]
    o, lse = R.attention_forward(q, k, v, scale=1.0 / d, window=(9, 3))
    rc, lines, out = diagnose(tmp_path, q, k, v, f32(o), lse, ["--window", "9,3"])
    assert rc == 1 and first_id(lines) == "scale" and "1/d used" in lines[0], f"seed {SEED}: {out}"
    # an odd factor without LSE, in bf16
    o, _ = R.attention_forward(q, k, v, scale=1.37 / np.sqrt(d))
    bits = R.float_to_bf16_bits(o)
    rc, lines, out = diagnose(tmp_path, q, k, v, bits, None, ["--dtype", "bf16"])
    assert first_id(lines) == "scale", f"seed {SEED}: {out}"
    assert re.search(r"factor 1\.3[6-8]", lines[0]), lines[0]


def test_softcap_missing(tmp_path):
    q, k, v = problem(amp=2.5)
    o, lse = R.attention_forward(q, k, v, causal=True)
    rc, lines, out = diagnose(tmp_path, q, k, v, f32(o), lse, ["--causal", "--softcap", "2"])
    assert rc == 1 and first_id(lines) == "softcap-missing", f"seed {SEED}: {out}"


def test_softcap_order(tmp_path):
    q, k, v = problem(amp=2.5)
    flags, m = mask_opts(causal=True)
    keep = R.visible_mask(q.shape[1], k.shape[1], causal=True)
    o, lse = softmax_out(scores(q, k, v, softcap=3.0, cap_before_scale=True), v, keep)
    rc, lines, out = diagnose(tmp_path, q, k, v, f32(o), lse, flags + ["--softcap", "3"])
    assert rc == 1 and first_id(lines) == "softcap-order", f"seed {SEED}: {out}"


def test_lse_log2(tmp_path):
    q, k, v = problem()
    o, lse = R.attention_forward(q, k, v, causal=True)
    rc, lines, out = diagnose(tmp_path, q, k, v, f32(o), lse / LN2, ["--causal"])
    assert rc == 1 and first_id(lines) == "lse-log2" and "base 2" in lines[0], f"seed {SEED}: {out}"


def test_lse_unscaled(tmp_path):
    q, k, v = problem()
    keep = R.visible_mask(q.shape[1], k.shape[1], causal=True)
    o, _ = R.attention_forward(q, k, v, causal=True)
    _, lse_raw = softmax_out(scores(q, k, v, scale=1.0), v, keep)
    rc, lines, out = diagnose(tmp_path, q, k, v, f32(o), lse_raw, ["--causal"])
    assert rc == 1 and first_id(lines) == "lse-unscaled", f"seed {SEED}: {out}"


def test_gqa_head_map(tmp_path):
    q, k, v = problem(H=6, Hk=3, Sq=20, Sk=40)
    keep = R.visible_mask(20, 40)
    tile = [h % 3 for h in range(6)]            # h % Hk instead of h // (H / Hk)
    o, lse = softmax_out(scores(q, k, v, kv_map=tile), v, keep, kv_map=tile)
    rc, lines, out = diagnose(tmp_path, q, k, v, f32(o), lse)
    assert rc == 1 and first_id(lines) == "gqa-head-map", f"seed {SEED}: {out}"
    assert "= h % heads_k" in lines[0] and "1->1" in lines[0], lines[0]


def test_window_shift(tmp_path):
    q, k, v = problem(Sq=40, Sk=60)
    o, lse = R.attention_forward(q, k, v, window=(7, 0))  # kernel: one key more on the left
    rc, lines, out = diagnose(tmp_path, q, k, v, f32(o), lse, ["--window", "6,0"])
    assert rc == 1 and first_id(lines) == "window-shift" and "left window 7" in lines[0], f"seed {SEED}: {out}"


def test_empty_row(tmp_path):
    q, k, v = problem(Sq=40, Sk=16)
    o, lse = R.attention_forward(q, k, v, causal=True)
    empty = ~np.isfinite(lse)                     # [B, H, Sq]: the first 24 rows
    assert empty.any()
    o = o.copy()
    o[np.broadcast_to(empty.transpose(0, 2, 1)[..., None], o.shape)] = np.nan
    rc, lines, out = diagnose(tmp_path, q, k, v, f32(o), None, ["--causal"])
    assert rc == 1 and first_id(lines) == "empty-row" and "NaN" in lines[0], f"seed {SEED}: {out}"
    # the same O beside a correct LSE (-inf in those rows): a kernel that guards the LSE, not O
    rc, lines, out = diagnose(tmp_path, q, k, v, f32(o), lse, ["--causal"])
    assert rc == 1 and first_id(lines) == "empty-row" and "LSE is guarded" in lines[0], f"seed {SEED}: {out}"


def test_missing_rescale(tmp_path):
    q, k, v = problem(B=1, Sq=12, Sk=300, H=2, Hk=2, amp=1.5)
    keep = R.visible_mask(12, 300)
    o = no_rescale(scores(q, k, v), v, keep, 64)
    rc, lines, out = diagnose(tmp_path, q, k, v, f32(o))
    assert rc == 1 and first_id(lines) == "missing-rescale" and "64-key" in lines[0], f"seed {SEED}: {out}"


def test_tail_tile(tmp_path):
    q, k, v = problem(Sq=20, Sk=100)
    pad = 128 - 100                                 # zero K and V rows up to a multiple of 64
    kp = np.concatenate([k, np.zeros((2, pad, 2, 32), np.float32)], axis=1)
    vp = np.concatenate([v, np.zeros((2, pad, 2, 32), np.float32)], axis=1)
    o, lse = R.attention_forward(q, kp, vp)
    rc, lines, out = diagnose(tmp_path, q, k, v, f32(o), lse)
    assert rc == 1 and first_id(lines) == "tail-tile" and "100..127" in lines[0], f"seed {SEED}: {out}"


def test_layout_transposed(tmp_path):
    q, k, v = problem(Sq=24, Sk=24, H=3, Hk=3)
    o, lse = R.attention_forward(q, k, v, causal=True)
    bhsd = np.ascontiguousarray(o.transpose(0, 2, 1, 3)).reshape(o.shape)  # BHSD bytes in a BSHD file
    rc, lines, out = diagnose(tmp_path, q, k, v, f32(bhsd), lse, ["--causal"])
    assert rc == 1 and first_id(lines) == "layout-transposed", f"seed {SEED}: {out}"


# ---- correct outputs: no diagnosis, in every precision ---------------------------

def emulate(q, k, v, dt, causal):
    """A plain low-precision kernel: inputs in dt, scores and P.V in float32, P rounded to dt."""
    rnd = (lambda x: R.bf16_bits_to_float64(R.float_to_bf16_bits(x))) if dt == "bf16" else \
        (lambda x: np.asarray(x, np.float16).astype(np.float64))
    qf, kf, vf = (rnd(x).astype(np.float32) for x in (q, k, v))
    keep = R.visible_mask(q.shape[1], k.shape[1], causal=causal)
    s = scores(qf, kf, vf).astype(np.float32)
    s = np.where(keep[None, None], s, -np.inf)
    m = s.max(-1, keepdims=True)
    e = np.exp(s - m)
    lsum = e.sum(-1, keepdims=True)
    p = rnd(e / lsum).astype(np.float32)
    o = np.stack([p[:, h] @ vf[:, :, h // 2] for h in range(q.shape[2])], axis=2)
    return rnd(o), (m + np.log(lsum))[..., 0]


@pytest.mark.parametrize("dt", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("causal", [False, True])
def test_correct_outputs_get_no_diagnosis(tmp_path, dt, causal):
    q, k, v = problem(Sq=30, Sk=45)
    if dt == "f32":
        sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
        import flashattn as fa
        try:
            fa.library()
        except OSError as e:  # e.g. the sanitizer build makes no shared library
            pytest.skip(f"libflashattn.so not available: {e}")
        o, lse = fa.attention(q, k, v, causal=causal, return_lse=True)
        qs, ks, vs, os_ = q, k, v, o
    else:
        o, lse = emulate(q, k, v, dt, causal)
        if dt == "bf16":
            qs, ks, vs, os_ = (R.float_to_bf16_bits(x) for x in (q, k, v, o))
        else:
            qs, ks, vs, os_ = (np.asarray(x, np.float16) for x in (q, k, v, o))
    flags = ["--causal"] if causal else []
    rc, lines, out = diagnose(tmp_path, qs, ks, vs, os_, lse, flags)
    assert rc == 0, f"seed {SEED}: the correct {dt} output failed the check: {out}"
    assert lines == [lines[0]] and lines[0].startswith("diagnosis: none"), f"seed {SEED} {dt}: {out}"
    assert "error by head" in out and "error by sequence" in out


# ---- the python API -----------------------------------------------------------------

def test_python_diagnose():
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
    import flashattn as fa
    try:
        fa.library()
    except OSError as e:  # e.g. the sanitizer build makes no shared library
        pytest.skip(f"libflashattn.so not available: {e}")
    q, k, v = problem(Sq=24, Sk=56)
    o, lse = R.attention_forward(q, k, v, window=(5, 0), align="top-left")
    rep = fa.diagnose(q, k, v, f32(o), f32(lse), window=(5, 0), sample_rows=8)
    assert rep.first == "causal-top-left", rep.text
    assert rep.diagnoses[0]["explained"] > 0.99 and "causal-top-left" in rep.considered
    assert rep.head_rel_rms.shape == (4,) and rep.batch_rel_rms.shape == (2,)
    assert rep.rows_sampled == 2 * 4 * 8
    ok = fa.diagnose(q, k, v, f32(o), f32(lse), window=(5, 0), align="top-left")
    assert ok.first is None and ok.text.startswith("diagnosis: none")
    with pytest.raises(fa.FlashAttnError):
        fa.diagnose(q, k, v, f32(o)[:, :3], window=(5, 0))
    with pytest.raises(fa.FlashAttnError):
        fa.diagnose(q, k, v, f32(o), min_explained=2.0)


def test_unknown_mistake_gets_none(tmp_path):
    """An output no known mistake explains (random numbers of the reference's size): none, with
    the candidates considered named; the same rows with a small bias that no class models too."""
    q, k, v = problem(H=6, Hk=3, Sq=30, Sk=50)
    o, lse = R.attention_forward(q, k, v, causal=True)
    junk = rand(o.shape, 9) * np.std(o)
    rc, lines, out = diagnose(tmp_path, q, k, v, junk, None, ["--causal"])
    assert rc == 1 and lines[0].startswith("diagnosis: none (no known mistake"), f"seed {SEED}: {out}"
    assert "gqa-head-map" in lines[0] and "missing-rescale" in lines[0]
    rc, lines, out = diagnose(tmp_path, q, k, v, f32(o + 0.05), lse, ["--causal"])
    assert rc == 1 and lines[0].startswith("diagnosis: none"), f"seed {SEED}: {out}"


# ---- hostile-test findings (issue 13 follow-up) -----------------------------------

def run_cli(args):
    return subprocess.run([CLI, *map(str, args)], capture_output=True, text=True)


def test_varlen_and_kvcache_keep_the_verdict(tmp_path):
    """--diagnose on a varlen batch or a KV cache: the exit status stays the verdict's (0 pass,
    1 fail), never 2; a correct output gets 'diagnosis: none', a wrong one a diagnosis section
    (tests/test_diagnose_serving.py checks the serving classes themselves)."""
    H, Hk, d = 4, 2, 16
    cq, ck = np.array([0, 5, 17], np.int32), np.array([0, 9, 30], np.int32)
    q, k, v = rand((17, H, d), 11), rand((30, Hk, d), 12), rand((30, Hk, d), 13)
    o, _ = R.varlen_forward(q, k, v, cq, ck, causal=True)
    for name, x in dict(q=q, k=k, v=v, cq=cq, ck=ck, good=f32(o), bad=f32(o) + 0.1).items():
        np.save(tmp_path / f"{name}.npy", x)
    base = ["check", "-q", tmp_path / "q.npy", "-k", tmp_path / "k.npy", "-v", tmp_path / "v.npy", "--causal",
            "--cu-seqlens-q", tmp_path / "cq.npy", "--cu-seqlens-k", tmp_path / "ck.npy", "--diagnose"]
    def has_diagnosis(out, want):
        lines = [ln for ln in out.splitlines() if ln.startswith("diagnosis: ")]
        at_floor = lines and lines[0].startswith("diagnosis: none (the error is at the rounding level")
        return lines and at_floor == (want == 0) and "error by sequence" in out
    for out, want in (("good", 0), ("bad", 1)):
        r = run_cli(base + ["--out", tmp_path / f"{out}.npy"])
        assert r.returncode == want, f"varlen {out}: rc {r.returncode}: {r.stdout}{r.stderr}"
        assert has_diagnosis(r.stdout, want) and r.stderr == "", r.stdout + r.stderr
    # KV cache: 2 sequences of 7 queries against caches of 20 rows, 11 and 16 in use
    B, Sq, Sc = 2, 7, 20
    q, kc, vc = rand((B, Sq, H, d), 14), rand((B, Sc, Hk, d), 15), rand((B, Sc, Hk, d), 16)
    cs = np.array([11, 16], np.int32)
    o, _ = R.kvcache_forward(q, kc, vc, cs)
    for name, x in dict(q=q, kc=kc, vc=vc, cs=cs, good=f32(o), bad=f32(o) * 1.5).items():
        np.save(tmp_path / f"{name}.npy", x)
    base = ["check", "-q", tmp_path / "q.npy", "-k", tmp_path / "kc.npy", "-v", tmp_path / "vc.npy",
            "--cache-seqlens", tmp_path / "cs.npy", "--diagnose"]
    for out, want in (("good", 0), ("bad", 1)):
        r = run_cli(base + ["--out", tmp_path / f"{out}.npy"])
        assert r.returncode == want, f"kvcache {out}: rc {r.returncode}: {r.stdout}{r.stderr}"
        assert has_diagnosis(r.stdout, want) and r.stderr == "", r.stdout + r.stderr


def test_nonfinite_shown_in_tables(tmp_path):
    """A NaN (or Inf) in the tested output shows as nan (inf) in the summary line and in the
    per-head and per-sequence tables of the heads and sequences that hold it; the others stay finite."""
    q, k, v = problem(B=2, H=4, Hk=2, Sq=20, Sk=30)
    o, _ = R.attention_forward(q, k, v)
    o = f32(o)
    o[1, :, 2, :] = np.nan                                  # every row of head 2 in sequence 1
    rc, lines, out = diagnose(tmp_path, q, k, v, o, None, ["--sample-rows", "20"])
    assert rc == 1, out
    head = re.search(r"error by head \(relative RMS\):(.*)", out).group(1).split()
    seq = re.search(r"error by sequence \(relative RMS\):(.*)", out).group(1).split()
    assert "output relative RMS error nan" in out, out
    assert head[2] == "2:nan" and all(np.isfinite(float(x.split(":")[1])) for x in head[:2] + head[3:]), out
    assert seq[1] == "1:nan" and np.isfinite(float(seq[0].split(":")[1])), out
    o[1, :, 2, :] = 0.0
    o[0, 3, 1, 0] = np.inf
    rc, lines, out = diagnose(tmp_path, q, k, v, o, None, ["--sample-rows", "20"])
    head = re.search(r"error by head \(relative RMS\):(.*)", out).group(1).split()
    seq = re.search(r"error by sequence \(relative RMS\):(.*)", out).group(1).split()
    assert rc == 1 and "output relative RMS error inf" in out, out
    assert head[1] == "1:inf" and seq[0] == "0:inf" and seq[1] != "1:inf", out


def test_alibi_alignment_without_mask(tmp_path):
    """ALiBi with no causal/window mask: the alignment still moves the distances when
    seqlen_q != seqlen_k, so a kernel using the other corner is diagnosed causal-top-left
    (both ways, and the reverse under --align top-left); a correct output gets none."""
    slopes = np.array([0.5, 0.25, 0.125, 0.0625], np.float32)
    np.save(tmp_path / "al.npy", slopes)
    for Sq, Sk in ((24, 56), (56, 24)):
        q, k, v = problem(Sq=Sq, Sk=Sk)
        o, lse = R.attention_forward(q, k, v, alibi=slopes, align="top-left")
        rc, lines, out = diagnose(tmp_path, q, k, v, f32(o), lse, ["--alibi", str(tmp_path / "al.npy")])
        assert rc == 1 and first_id(lines) == "causal-top-left", f"seed {SEED} {Sq}x{Sk}: {out}"
        assert "ALiBi" in lines[0], out
        rc, lines, out = diagnose(tmp_path, q, k, v, f32(o), lse,
                                  ["--alibi", str(tmp_path / "al.npy"), "--align", "top-left"])
        assert rc == 0 and lines[0].startswith("diagnosis: none"), f"seed {SEED} {Sq}x{Sk}: {out}"
        o, lse = R.attention_forward(q, k, v, alibi=slopes)
        rc, lines, out = diagnose(tmp_path, q, k, v, f32(o), lse,
                                  ["--alibi", str(tmp_path / "al.npy"), "--align", "top-left"])
        assert rc == 1 and first_id(lines) == "causal-top-left" and "bottom-right" in lines[0], out


def test_output_unwritten(tmp_path):
    """An all-zero output (a kernel that wrote nothing) is output-unwritten, never tail-tile
    (zero keys of a 256-key tile dilute a few real keys to almost 0), for every seqlen_k;
    a kernel that skipped the second half of the query rows is output-unwritten too."""
    for Sk in (3, 9, 33, 65, 100, 300):
        q, k, v = problem(B=2, Sq=64, H=4, Hk=2, Sk=Sk)
        o, lse = R.attention_forward(q, k, v)
        rc, lines, out = diagnose(tmp_path, q, k, v, np.zeros_like(f32(o)), None)
        assert rc == 1 and first_id(lines) == "output-unwritten", f"seed {SEED} Sk {Sk}: {out}"
        assert not any("tail-tile" in ln for ln in lines), f"seed {SEED} Sk {Sk}: {out}"
    o = f32(o)
    o[:, 32:] = 0.0
    rc, lines, out = diagnose(tmp_path, q, k, v, o, lse)
    assert rc == 1 and first_id(lines) == "output-unwritten", f"seed {SEED}: {out}"
    assert not any("tail-tile" in ln for ln in lines), f"seed {SEED}: {out}"
