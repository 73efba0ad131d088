"""test_diagnose_serving.py -- `check --diagnose` on varlen batches and KV caches (issue 13).

Each serving mistake -- varlen-leak, varlen-offset, paged-index, kv-append-offset -- is
injected by an independent float64 numpy model written here (small variations of
tests/ref_numpy.py's varlen_forward / kvcache_forward; no code shared with
src/diagnose.c) on a shape where it is visible, and `check --diagnose` must name that
class FIRST (with its fitted parameter where it has one). Correct outputs (the float64
reference rounded to f32, and the library's own flash output) get `diagnosis: none`,
and the per-sequence table has one entry per sequence. Fresh random inputs
(FA_TEST_SEED replays a run).
"""

import os
import re
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

H, HK, D = 4, 2, 16


def rand(shape, salt):
    return np.random.default_rng([SEED, salt]).standard_normal(shape).astype(np.float32)


def f32(x):
    return np.asarray(x, np.float32)


def check(tmp, arrays, flags):
    """Save arrays (name -> array) and run check --diagnose with flags (names in {} are paths)."""
    for name, x in arrays.items():
        np.save(tmp / f"{name}.npy", x)
    args = [a.format(**{n: str(tmp / f"{n}.npy") for n in arrays}) for a in flags]
    return check_diagnose(args)


# ---- varlen ------------------------------------------------------------------------

CQ = np.array([0, 9, 21, 40], np.int32)          # 3 sequences of 9, 12, 19 queries
CK = np.array([0, 30, 44, 83], np.int32)         # 30, 14, 39 keys


def varlen_inputs():
    return rand((int(CQ[-1]), H, D), 1), rand((int(CK[-1]), HK, D), 2), rand((int(CK[-1]), HK, D), 3)


def varlen_model(q, k, v, spans, causal=False, window=(-1, -1), align="bottom-right"):
    """O [total_q, H, D]: sequence b's queries q0:q1 attend to K/V rows k0:k1 (any rows,
    clipped to the tensor), bottom-right aligned over those k1 - k0 keys."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    o = np.zeros(q.shape[:2] + (v.shape[2],))
    lse = np.full((q.shape[1], q.shape[0]), -np.inf)
    for q0, q1, k0, k1 in spans:
        k0c, k1c = max(k0, 0), min(k1, k.shape[0])
        ob, lb = R.attention_forward(q[None, q0:q1], k[None, k0c:k1c], v[None, k0c:k1c], causal=causal,
                                     window=window, align=align)
        o[q0:q1], lse[:, q0:q1] = ob[0], lb[0]
    return o, lse


def varlen_flags(extra=()):
    return ["-q", "{q}", "-k", "{k}", "-v", "{v}", "--out", "{o}", "--cu-seqlens-q", "{cq}",
            "--cu-seqlens-k", "{ck}", *extra]


def spans(cq=CQ, ck=CK):
    return [(int(cq[b]), int(cq[b + 1]), int(ck[b]), int(ck[b + 1])) for b in range(len(cq) - 1)]


def test_varlen_correct_gets_none(tmp_path):
    q, k, v = varlen_inputs()
    for causal in (False, True):
        o, lse = R.varlen_forward(q, k, v, CQ, CK, causal=causal)
        flags = varlen_flags(["--lse", "{lse}"] + (["--causal"] if causal else []))
        rc, lines, out = check(tmp_path, dict(q=q, k=k, v=v, o=f32(o), lse=f32(lse), cq=CQ, ck=CK), flags)
        assert rc == 0 and lines == [lines[0]] and lines[0].startswith("diagnosis: none"), f"seed {SEED}: {out}"
        assert len(seq_table(out)) == 3, out


def test_varlen_flash_output_gets_none(tmp_path):
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
    import flashattn as fa
    try:
        fa.library()
    except OSError as e:  # the sanitizer build makes no shared library
        pytest.skip(f"libflashattn.so not available: {e}")
    q, k, v = varlen_inputs()
    o, lse = fa.attention(q, k, v, causal=True, cu_seqlens_q=CQ, cu_seqlens_k=CK, return_lse=True)
    rc, lines, out = check(tmp_path, dict(q=q, k=k, v=v, o=f32(o), lse=f32(lse), cq=CQ, ck=CK),
                           varlen_flags(["--lse", "{lse}", "--causal"]))
    assert rc == 0 and lines[0].startswith("diagnosis: none"), f"seed {SEED}: {out}"


def test_varlen_leak_max_seqlen(tmp_path):
    """A kernel that attends to max_seqlen_k keys from each sequence's start (non-causal):
    sequences 1 and 2 read into the next sequence / past the end."""
    q, k, v = varlen_inputs()
    maxk = int(np.max(np.diff(CK)))
    o, _ = varlen_model(q, k, v, [(q0, q1, k0, k0 + maxk) for q0, q1, k0, _ in spans()])
    rc, lines, out = check(tmp_path, dict(q=q, k=k, v=v, o=f32(o), cq=CQ, ck=CK), varlen_flags())
    assert rc == 1 and first_id(lines) == "varlen-leak" and "max_seqlen_k" in lines[0], f"seed {SEED}: {out}"
    t = seq_table(out)
    assert t[2] < 1e-5 and min(t[0], t[1]) > 1e-2, out   # sequence 2 is the longest: untouched


def test_varlen_leak_global_causal(tmp_path):
    """cu_seqlens ignored under a causal mask: the packed batch is one long sequence."""
    q, k, v = varlen_inputs()
    o, _ = varlen_model(q, k, v, [(0, int(CQ[-1]), 0, int(CK[-1]))], causal=True)
    rc, lines, out = check(tmp_path, dict(q=q, k=k, v=v, o=f32(o), cq=CQ, ck=CK), varlen_flags(["--causal"]))
    assert rc == 1 and first_id(lines) == "varlen-leak" and "one sequence" in lines[0], f"seed {SEED}: {out}"


def test_varlen_leak_seqused_ignored(tmp_path):
    """seqused_k given, the kernel attends to the whole cu_seqlens_k span (the padding keys)."""
    q, k, v = varlen_inputs()
    used = np.array([22, 9, 30], np.int32)
    o, _ = varlen_model(q, k, v, spans())
    rc, lines, out = check(tmp_path, dict(q=q, k=k, v=v, o=f32(o), cq=CQ, ck=CK, su=used),
                           varlen_flags(["--seqused-k", "{su}"]))
    assert rc == 1 and first_id(lines) == "varlen-leak" and "seqused_k ignored" in lines[0], f"seed {SEED}: {out}"


@pytest.mark.parametrize("shift", [1, -1])
def test_varlen_offset(tmp_path, shift):
    """cu_seqlens_k off by one: every sequence's keys and values read one row late (early)."""
    q, k, v = varlen_inputs()
    o, _ = varlen_model(q, k, v, [(q0, q1, k0 + shift, k1 + shift) for q0, q1, k0, k1 in spans()], causal=True)
    rc, lines, out = check(tmp_path, dict(q=q, k=k, v=v, o=f32(o), cq=CQ, ck=CK), varlen_flags(["--causal"]))
    assert rc == 1 and first_id(lines) == "varlen-offset", f"seed {SEED}: {out}"
    m = re.search(r"off by ([+-]\d+)", lines[0])
    assert m and int(m.group(1)) == shift and "keys and values" in lines[0], out


@pytest.mark.parametrize("shift", [1, -1])
def test_varlen_offset_top_left(tmp_path, shift):
    """The same with top-left alignment, where a sequence cut at the tensor's start (shift -1:
    the first sequence loses its first key) moves every row's diagonal: the kernel's sequence
    ends at the tensor, its count shrinks (a kernel that bounds reads by the tensor)."""
    q, k, v = varlen_inputs()
    o, _ = varlen_model(q, k, v, [(q0, q1, k0 + shift, k1 + shift) for q0, q1, k0, k1 in spans()], causal=True,
                        align="top-left")
    rc, lines, out = check(tmp_path, dict(q=q, k=k, v=v, o=f32(o), cq=CQ, ck=CK),
                           varlen_flags(["--causal", "--align", "top-left"]))
    assert rc == 1 and first_id(lines) == "varlen-offset", f"seed {SEED}: {out}"
    m = re.search(r"off by ([+-]\d+)", lines[0])
    assert m and int(m.group(1)) == shift and "keys and values" in lines[0], out


def test_varlen_offset_queries(tmp_path):
    """cu_seqlens_q off by one: each sequence computes its rows from the next query row."""
    q, k, v = varlen_inputs()
    qs = np.concatenate([q[1:], np.zeros_like(q[:1])])   # row r computed from query r + 1
    o, _ = varlen_model(qs, k, v, spans(), window=(6, 6))
    rc, lines, out = check(tmp_path, dict(q=q, k=k, v=v, o=f32(o), cq=CQ, ck=CK), varlen_flags(["--window", "6,6"]))
    assert rc == 1 and first_id(lines) == "varlen-offset" and "queries read 1 row late" in lines[0], \
        f"seed {SEED}: {out}"


# ---- KV cache and paged KV -------------------------------------------------------------

B, SQ, SC, SN = 3, 5, 40, 3
CS = np.array([17, 30, 9], np.int32)               # cached keys per sequence (before the new ones)


def cache_inputs():
    return (rand((B, SQ, H, D), 11), rand((B, SC, HK, D), 12), rand((B, SC, HK, D), 13),
            rand((B, SN, HK, D), 14), rand((B, SN, HK, D), 15))


def cache_model(q, kc, vc, rows_of, causal=True):
    """O [B, SQ, H, D]: sequence b attends (bottom-right) to the key/value rows rows_of(b) returns."""
    q = np.asarray(q, np.float64)
    o = np.zeros(q.shape[:3] + (vc.shape[-1],))
    for b in range(B):
        kb, vb = rows_of(b)
        o[b] = R.attention_forward(q[b:b + 1], kb[None], vb[None], causal=causal)[0][0]
    return o


def cache_flags(extra=()):
    return ["-q", "{q}", "-k", "{kc}", "-v", "{vc}", "--out", "{o}", "--cache-seqlens", "{cs}",
            "--k-new", "{kn}", "--v-new", "{vn}", *extra]


def test_kvcache_correct_gets_none(tmp_path):
    q, kc, vc, kn, vn = cache_inputs()
    o, lse = R.kvcache_forward(q, kc, vc, CS, kn, vn, causal=True)
    rc, lines, out = check(tmp_path, dict(q=q, kc=kc, vc=vc, kn=kn, vn=vn, cs=CS, o=f32(o), lse=f32(lse)),
                           cache_flags(["--causal", "--lse", "{lse}"]))
    assert rc == 0 and lines[0].startswith("diagnosis: none"), f"seed {SEED}: {out}"
    assert len(seq_table(out)) == B


def test_kv_append_slot_off(tmp_path):
    """New keys appended one slot late: cache row cache_seqlens[b] (stale) is attended, the
    new keys sit one position later."""
    q, kc, vc, kn, vn = cache_inputs()
    kc64, vc64 = (np.asarray(x, np.float64) for x in (kc, vc))

    def rows(b):
        n = int(CS[b])
        return (np.concatenate([kc64[b, :n + 1], kn[b]]), np.concatenate([vc64[b, :n + 1], vn[b]]))

    o = cache_model(q, kc, vc, rows)
    rc, lines, out = check(tmp_path, dict(q=q, kc=kc, vc=vc, kn=kn, vn=vn, cs=CS, o=f32(o)), cache_flags(["--causal"]))
    assert rc == 1 and first_id(lines) == "kv-append-offset" and "cache_seqlens +1" in lines[0], f"seed {SEED}: {out}"


def test_kv_new_keys_left_out(tmp_path):
    """Attention over the cache_seqlens cached keys only (the new ones never attended)."""
    q, kc, vc, kn, vn = cache_inputs()
    o = cache_model(q, kc, vc, lambda b: (np.asarray(kc[b, :CS[b]], np.float64), np.asarray(vc[b, :CS[b]], np.float64)))
    rc, lines, out = check(tmp_path, dict(q=q, kc=kc, vc=vc, kn=kn, vn=vn, cs=CS, o=f32(o)), cache_flags(["--causal"]))
    assert rc == 1 and first_id(lines) == "kv-append-offset" and "new keys left out" in lines[0], f"seed {SEED}: {out}"


def test_kv_one_key_too_few(tmp_path):
    """No new keys: attention over cache_seqlens - 1 keys (the last cached key dropped)."""
    q, kc, vc, _, _ = cache_inputs()
    o = cache_model(q, kc, vc, lambda b: (np.asarray(kc[b, :CS[b] - 1], np.float64),
                                          np.asarray(vc[b, :CS[b] - 1], np.float64)), causal=False)
    flags = ["-q", "{q}", "-k", "{kc}", "-v", "{vc}", "--out", "{o}", "--cache-seqlens", "{cs}"]
    rc, lines, out = check(tmp_path, dict(q=q, kc=kc, vc=vc, cs=CS, o=f32(o)), flags)
    assert rc == 1 and first_id(lines) == "kv-append-offset" and "-1 keys" in lines[0], f"seed {SEED}: {out}"


PS = 8                                             # page size


def paged_inputs():
    q, _, _, kn, vn = cache_inputs()
    maxp = (SC + PS - 1) // PS
    npages = B * maxp + 2
    kp, vp = rand((npages, PS, HK, D), 21), rand((npages, PS, HK, D), 22)
    perm = np.random.default_rng([SEED, 23]).permutation(npages)[:B * maxp]
    return q, kp, vp, kn, vn, perm.reshape(B, maxp).astype(np.int32)


def paged_rows(kp, vp, kn, vn, table):
    def rows(b):
        n = int(CS[b])
        ks = [kp[table(b, r // PS), r % PS] for r in range(n)]
        vs = [vp[table(b, r // PS), r % PS] for r in range(n)]
        return (np.concatenate([np.asarray(ks, np.float64), kn[b]]), np.concatenate([np.asarray(vs, np.float64), vn[b]]))
    return rows


def paged_flags():
    return cache_flags(["--causal", "--block-table", "{bt}"])


def test_paged_correct_gets_none(tmp_path):
    q, kp, vp, kn, vn, bt = paged_inputs()
    o = cache_model(q, kp, vp, paged_rows(kp, vp, kn, vn, lambda b, e: bt[b, e]))
    rc, lines, out = check(tmp_path, dict(q=q, kc=kp, vc=vp, kn=kn, vn=vn, cs=CS, bt=bt, o=f32(o)), paged_flags())
    assert rc == 0 and lines[0].startswith("diagnosis: none"), f"seed {SEED}: {out}"


def test_paged_next_entry(tmp_path):
    """block_table read one entry late: logical page e read from the table's entry e + 1."""
    q, kp, vp, kn, vn, bt = paged_inputs()
    o = cache_model(q, kp, vp, paged_rows(kp, vp, kn, vn, lambda b, e: bt[b, e + 1]))
    rc, lines, out = check(tmp_path, dict(q=q, kc=kp, vc=vp, kn=kn, vn=vn, cs=CS, bt=bt, o=f32(o)), paged_flags())
    assert rc == 1 and first_id(lines) == "paged-index" and "r / page_size +1" in lines[0], f"seed {SEED}: {out}"


def test_paged_table_ignored(tmp_path):
    """Pages read in storage order (the block table ignored)."""
    q, kp, vp, kn, vn, bt = paged_inputs()
    maxp = bt.shape[1]
    o = cache_model(q, kp, vp, paged_rows(kp, vp, kn, vn, lambda b, e: b * maxp + e))
    rc, lines, out = check(tmp_path, dict(q=q, kc=kp, vc=vp, kn=kn, vn=vn, cs=CS, bt=bt, o=f32(o)), paged_flags())
    assert rc == 1 and first_id(lines) == "paged-index" and "ignored" in lines[0], f"seed {SEED}: {out}"


def test_python_diagnose_serving():
    """flashattn.diagnose() takes the varlen and KV-cache arguments as check() does."""
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
    import flashattn as fa
    try:
        fa.library()
    except OSError as e:  # the sanitizer build makes no shared library
        pytest.skip(f"libflashattn.so not available: {e}")
    q, k, v = varlen_inputs()
    o, _ = varlen_model(q, k, v, [(q0, q1, k0 + 1, k1 + 1) for q0, q1, k0, k1 in spans()], causal=True)
    rep = fa.diagnose(q, k, v, f32(o), causal=True, cu_seqlens_q=CQ, cu_seqlens_k=CK, sample_rows=8)
    assert rep.first == "varlen-offset" and rep.diagnoses[0]["param"] == 1, rep.text
    assert rep.batch_rel_rms.shape == (3,)
    q, kp, vp, kn, vn, bt = paged_inputs()
    o = cache_model(q, kp, vp, paged_rows(kp, vp, kn, vn, lambda b, e: bt[b, e]))
    rep = fa.diagnose(q, kp, vp, f32(o), causal=True, cache_seqlens=CS, k_new=kn, v_new=vn, block_table=bt)
    assert rep.first is None and rep.text.startswith("diagnosis: none"), rep.text
