"""ref_numpy.py -- an independent float64 model of FlashAttention's forward pass.

Written from the semantics (docs/semantics.md), not from the C code,
so that the C implementations can be checked against something that did not
share their mistakes. Everything is float64 and deliberately plain: one
(batch, head) at a time, the whole score matrix materialized.

The contract, in the order it is applied to each logit s_ij:

    s = scale * (q_i . k_j)                       scale defaults to 1/sqrt(d)
    s = softcap * tanh(s / softcap)               only when softcap > 0
    s = s - slope * |i + Sk - Sq - j|             ALiBi, after the cap, not capped
    keep j iff  j >= i + Sk - Sq - window_left    (unless window_left < 0)
           and  j <= i + Sk - Sq + window_right   (unless window_right < 0)
                                                  causal means window_right = 0
    P = softmax over the kept keys, O_i = sum_j P_ij v_j
    LSE_i = ln sum_j exp(s_ij) over the kept keys (natural log)

A query row with no kept key has O_i = 0 and LSE_i = -inf.
GQA/MQA: query head h reads kv head h // (heads // heads_k).

Shapes: q [B, Sq, H, d], k [B, Sk, Hk, d], v [B, Sk, Hk, dv],
        o [B, Sq, H, dv], lse [B, H, Sq]; alibi slopes [H] or [B, H].
"""

import numpy as np


def bf16_bits_to_float64(bits):
    """bfloat16 stored as uint16 bit patterns -> float64 values."""
    bits = np.asarray(bits, dtype=np.uint16)
    return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def float_to_bf16_bits(x):
    """Round float values to bfloat16 (nearest even) and return uint16 bits."""
    f = np.ascontiguousarray(np.asarray(x, dtype=np.float32))
    u = f.view(np.uint32).astype(np.uint64)
    nan = np.isnan(f)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    out = rounded.astype(np.uint16)
    out[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)
    return out


def diag_offset(seqlen_q, seqlen_k, align="bottom-right"):
    """Key that query row 0 lines up with: Sk - Sq bottom-right (FlashAttention),
    0 top-left (PyTorch SDPA's is_causal)."""
    assert align in ("bottom-right", "top-left"), align
    return seqlen_k - seqlen_q if align == "bottom-right" else 0


def visible_mask(seqlen_q, seqlen_k, window_left=-1, window_right=-1, causal=False,
                 align="bottom-right"):
    """Boolean [Sq, Sk]: True where key j is visible to query i (bottom-right aligned,
    or top-left with align="top-left")."""
    if causal:
        window_right = 0
    i = np.arange(seqlen_q, dtype=np.int64)[:, None]
    j = np.arange(seqlen_k, dtype=np.int64)[None, :]
    diag = i + diag_offset(seqlen_q, seqlen_k, align)
    keep = np.ones((seqlen_q, seqlen_k), dtype=bool)
    if window_left >= 0:
        keep &= j >= diag - window_left
    if window_right >= 0:
        keep &= j <= diag + window_right
    return keep


def _slope(alibi, b, h):
    if alibi is None:
        return 0.0
    alibi = np.asarray(alibi, dtype=np.float64)
    if alibi.ndim == 1:
        return float(alibi[h])
    return float(alibi[b, h])


def attention_forward(q, k, v, scale=None, causal=False, window=(-1, -1),
                      softcap=0.0, alibi=None, align="bottom-right", sinks=None, dropout_p=0.0,
                      dropout_mask=None):
    """Return (o, lse) in float64 for the FlashAttention forward contract.

    q, k, v are array-likes of any float dtype (already decoded from bf16 if
    needed); window is (left, right) with negative meaning unbounded.
    sinks: None or [H] attention sinks, one extra logit per head in the
    denominator only: LSE = ln(sum_j e^s_ij + e^sink_h), O = sum_j e^(s_ij - LSE) v_j;
    a row with no visible key gets O = 0, LSE = sink.
    dropout_mask: None or [B, H, Sq, Sk] 0/1 keep-mask Z: O = (P o Z / (1 - dropout_p)) V,
    the LSE of the undropped scores.
    """
    if sinks is not None or dropout_mask is not None:
        return _forward_ext(q, k, v, sinks, dropout_p, dropout_mask, scale, causal, window, softcap, alibi,
                            align)
    q = np.asarray(q, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    B, Sq, H, d = q.shape
    Bk, Sk, Hk, dk = k.shape
    Bv, Skv, Hkv, dv = v.shape
    assert (Bk, dk) == (B, d) and (Bv, Skv, Hkv) == (B, Sk, Hk), "inconsistent shapes"
    assert Hk > 0 and H % Hk == 0, "heads must be a multiple of heads_k"
    if scale is None or scale == 0:
        scale = 1.0 / np.sqrt(d)
    group = H // Hk
    window_left, window_right = window
    keep = visible_mask(Sq, Sk, window_left, window_right, causal, align)
    off = diag_offset(Sq, Sk, align)
    rel = np.abs(np.arange(Sq)[:, None] + off - np.arange(Sk)[None, :]).astype(np.float64)

    o = np.zeros((B, Sq, H, dv), dtype=np.float64)
    lse = np.full((B, H, Sq), -np.inf, dtype=np.float64)
    for b in range(B):
        for h in range(H):
            hk = h // group
            s = scale * (q[b, :, h, :] @ k[b, :, hk, :].T)            # [Sq, Sk]
            if softcap > 0:
                s = softcap * np.tanh(s / softcap)
            slope = _slope(alibi, b, h)
            if slope != 0.0:
                s = s - slope * rel
            for i in range(Sq):
                cols = np.nonzero(keep[i])[0]
                if cols.size == 0:
                    continue                                          # O = 0, LSE = -inf
                row = s[i, cols]
                m = np.max(row)
                if np.isnan(m):
                    o[b, i, h, :] = np.nan
                    lse[b, h, i] = np.nan
                    continue
                if np.isinf(m):
                    # +inf logit: softmax mass on the +inf keys; -inf everywhere: no mass.
                    w = (row == m).astype(np.float64)
                    lse[b, h, i] = m
                else:
                    w = np.exp(row - m)
                    lse[b, h, i] = m + np.log(np.sum(w))
                total = np.sum(w)
                if total == 0:
                    continue
                o[b, i, h, :] = (w / total) @ v[b, cols, hk, :]
    return o, lse


def _logits(q, k, scale, causal, window, softcap, alibi, align):
    """(s [B, H, Sq, Sk] final logits with -inf where masked, keep [Sq, Sk])."""
    q = np.asarray(q, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    B, Sq, H, d = q.shape
    Sk, Hk = k.shape[1], k.shape[2]
    if scale is None or scale == 0:
        scale = 1.0 / np.sqrt(d)
    keep = visible_mask(Sq, Sk, window[0], window[1], causal, align)
    off = diag_offset(Sq, Sk, align)
    rel = np.abs(np.arange(Sq)[:, None] + off - np.arange(Sk)[None, :]).astype(np.float64)
    s = np.empty((B, H, Sq, Sk))
    t = np.empty((B, H, Sq, Sk))
    for b in range(B):
        for h in range(H):
            t[b, h] = scale * (q[b, :, h, :] @ k[b, :, h // (H // Hk), :].T)
            x = softcap * np.tanh(t[b, h] / softcap) if softcap > 0 else t[b, h].copy()
            x = x - _slope(alibi, b, h) * rel
            s[b, h] = np.where(keep, x, -np.inf)
    return s, t, keep, scale


def _sinks_and_keep(sinks, dropout_p, dropout_mask, B, H, Sq, Sk):
    sinks = np.full(H, -np.inf) if sinks is None else np.asarray(sinks, dtype=np.float64)
    if dropout_mask is None:
        z = np.ones((B, H, Sq, Sk))
    else:
        z = np.asarray(dropout_mask, dtype=np.float64) / (1.0 - dropout_p)
    return sinks, z


def _forward_ext(q, k, v, sinks, dropout_p, dropout_mask, scale, causal, window, softcap, alibi, align):
    v = np.asarray(v, dtype=np.float64)
    s, _, _, _ = _logits(q, k, scale, causal, window, softcap, alibi, align)
    B, H, Sq, Sk = s.shape
    sinks, zk = _sinks_and_keep(sinks, dropout_p, dropout_mask, B, H, Sq, Sk)
    Hk = v.shape[2]
    o = np.zeros((B, Sq, H, v.shape[3]))
    lse = np.full((B, H, Sq), -np.inf)
    for b in range(B):
        for h in range(H):
            sink = sinks[h]
            m = np.maximum(np.max(s[b, h], axis=1, initial=-np.inf), sink)   # [Sq]
            empty = m == -np.inf                                              # no key, no sink
            m[empty] = 0.0
            w = np.exp(s[b, h] - m[:, None])                                  # masked: 0
            z = w.sum(axis=1) + np.exp(sink - m)
            lse[b, h] = np.where(empty, -np.inf, m + np.log(np.where(empty, 1.0, z)))
            z[empty] = 1.0
            o[b, :, h, :] = (w * zk[b, h] / z[:, None]) @ v[b, :, h // (H // Hk), :]
    return o, lse


def attention_backward_sinks(q, k, v, dout, sinks, **opts):
    """(dq, dk, dv, dsinks) with attention sinks [H] (attention_backward_ext)."""
    return attention_backward_ext(q, k, v, dout, sinks=sinks, **opts)


def attention_backward_ext(q, k, v, dout, sinks=None, dropout_p=0.0, dropout_mask=None, scale=None,
                           causal=False, window=(-1, -1), softcap=0.0, alibi=None, align="bottom-right"):
    """(dq, dk, dv, dsinks) in float64 with attention sinks [H] and/or dropout.
    P_ij = e^(s_ij - LSE_i) with the sink in LSE; with the keep-mask Z~ = Z / (1 - p),
    O = (P o Z~) V, so dV = (P o Z~)^T dO and dS = P o (Z~ o dP - D), D = dO . O; the
    sink (a logit whose value row is 0): dsink_h = -sum_{b,i} e^(sink_h - LSE_i) D_i
    (dsinks is None without sinks)."""
    has_sinks = sinks is not None
    k = np.asarray(k, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    qd = np.asarray(q, dtype=np.float64)
    dout = np.asarray(dout, dtype=np.float64)
    s, t, keep, scale = _logits(q, k, scale, causal, window, softcap, alibi, align)
    _, lse = _forward_ext(q, k, v, sinks, dropout_p, dropout_mask, scale, causal, window, softcap, alibi, align)
    B, H, Sq, Sk = s.shape
    sinks, zk = _sinks_and_keep(sinks, dropout_p, dropout_mask, B, H, Sq, Sk)
    Hk = k.shape[2]
    dq, dk, dv = np.zeros_like(qd), np.zeros_like(k), np.zeros_like(v)
    dsinks = np.zeros(H)
    for b in range(B):
        for h in range(H):
            hk = h // (H // Hk)
            lb = np.where(np.isfinite(lse[b, h]), lse[b, h], 0.0)
            p = np.exp(s[b, h] - lb[:, None])
            pz = p * zk[b, h]
            o = pz @ v[b, :, hk, :]
            do = dout[b, :, h, :]
            big_d = np.sum(do * o, axis=1)
            ds = p * (zk[b, h] * (do @ v[b, :, hk, :].T) - big_d[:, None])
            if softcap > 0:
                ds = ds * (1.0 - np.tanh(t[b, h] / softcap) ** 2)
            dq[b, :, h, :] += scale * (ds @ k[b, :, hk, :])
            dk[b, :, hk, :] += scale * (ds.T @ qd[b, :, h, :])
            dv[b, :, hk, :] += pz.T @ do
            if has_sinks:
                dsinks[h] -= np.sum(np.exp(sinks[h] - lse[b, h]) * big_d)
    return dq, dk, dv, (dsinks if has_sinks else None)


def attention_forward_rows(q, k, v, rows, **opts):
    """Like attention_forward but only for the query rows listed (cheap checks at large N).

    Returns (o_rows [B, len(rows), H, dv], lse_rows [B, H, len(rows)]). The
    mask still uses the full seqlen_q, so the rows mean the same as in the full problem.
    """
    q = np.asarray(q, dtype=np.float64)
    Sq = q.shape[1]
    Sk = np.asarray(k).shape[1]
    rows = np.asarray(rows, dtype=np.int64)
    causal = opts.pop("causal", False)
    wl, wr = opts.pop("window", (-1, -1))
    off = diag_offset(Sq, Sk, opts.pop("align", "bottom-right"))
    if causal:
        wr = 0
    # Each row is solved on its own with its own diagonal i + Sk - Sq, which is
    # all the mask and the ALiBi distance depend on.
    outs, lses = [], []
    for i in rows:
        diag = int(i) + off
        o1, l1 = _single_row(q[:, i:i + 1], k, v, diag, wl, wr, **opts)
        outs.append(o1)
        lses.append(l1)
    return np.concatenate(outs, axis=1), np.concatenate(lses, axis=2)


def _single_row(q1, k, v, diag, wl, wr, scale=None, softcap=0.0, alibi=None):
    k = np.asarray(k, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    B, _, H, d = q1.shape
    Sk, Hk, dv = k.shape[1], k.shape[2], v.shape[3]
    if scale is None or scale == 0:
        scale = 1.0 / np.sqrt(d)
    group = H // Hk
    j = np.arange(Sk)
    keep = np.ones(Sk, dtype=bool)
    if wl >= 0:
        keep &= j >= diag - wl
    if wr >= 0:
        keep &= j <= diag + wr
    rel = np.abs(diag - j).astype(np.float64)
    o = np.zeros((B, 1, H, dv))
    lse = np.full((B, H, 1), -np.inf)
    cols = np.nonzero(keep)[0]
    if cols.size == 0:
        return o, lse
    for b in range(B):
        for h in range(H):
            hk = h // group
            s = scale * (k[b, cols, hk, :] @ q1[b, 0, h, :])
            if softcap > 0:
                s = softcap * np.tanh(s / softcap)
            slope = _slope(alibi, b, h)
            if slope != 0.0:
                s = s - slope * rel[cols]
            m = np.max(s)
            w = np.exp(s - m)
            lse[b, h, 0] = m + np.log(np.sum(w))
            o[b, 0, h, :] = (w / np.sum(w)) @ v[b, cols, hk, :]
    return o, lse


def attention_backward(q, k, v, dout, scale=None, causal=False, window=(-1, -1),
                       softcap=0.0, alibi=None, align="bottom-right"):
    """Return (dq, dk, dv) in float64 for the FlashAttention backward contract.

    Straight from docs/semantics.md: with P the softmax over visible keys,
        D_i = dO_i . O_i,  dP = dO V^T,  dS = P o (dP - D),
        dS' = dS o (1 - tanh^2(t / softcap)) when softcap > 0 (t = scale q.k),
        dQ = scale dS' K,  dK = scale dS'^T Q,  dV = P^T dO,
    dK and dV summed over the query heads that share a kv head; ALiBi slopes
    are constants; rows with no visible key contribute nothing.
    """
    q = np.asarray(q, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    dout = np.asarray(dout, dtype=np.float64)
    B, Sq, H, d = q.shape
    Sk, Hk, dv_dim = k.shape[1], k.shape[2], v.shape[3]
    if scale is None or scale == 0:
        scale = 1.0 / np.sqrt(d)
    group = H // Hk
    keep = visible_mask(Sq, Sk, window[0], window[1], causal, align)
    off = diag_offset(Sq, Sk, align)
    rel = np.abs(np.arange(Sq)[:, None] + off - np.arange(Sk)[None, :]).astype(np.float64)
    dq = np.zeros_like(q)
    dk = np.zeros_like(k)
    dv = np.zeros_like(v)
    for b in range(B):
        for h in range(H):
            hk = h // group
            t = scale * (q[b, :, h, :] @ k[b, :, hk, :].T)                # [Sq, Sk]
            s = softcap * np.tanh(t / softcap) if softcap > 0 else t.copy()
            slope = _slope(alibi, b, h)
            if slope != 0.0:
                s = s - slope * rel
            s = np.where(keep, s, -np.inf)
            m = np.max(s, axis=1, keepdims=True)
            empty = ~np.isfinite(m[:, 0])
            m[empty] = 0.0
            p = np.exp(s - m)
            p[empty] = 0.0
            denom = p.sum(axis=1, keepdims=True)
            denom[empty] = 1.0
            p = p / denom                                                  # [Sq, Sk]
            o = p @ v[b, :, hk, :]                                         # [Sq, dv]
            do = dout[b, :, h, :]
            big_d = np.sum(do * o, axis=1, keepdims=True)
            dp = do @ v[b, :, hk, :].T
            ds = p * (dp - big_d)
            if softcap > 0:
                ds = ds * (1.0 - np.tanh(t / softcap) ** 2)
            dq[b, :, h, :] += scale * (ds @ k[b, :, hk, :])
            dk[b, :, hk, :] += scale * (ds.T @ q[b, :, h, :])
            dv[b, :, hk, :] += p.T @ do
    return dq, dk, dv


def _varlen_spans(cu_seqlens_q, cu_seqlens_k, seqused_k):
    """(q0, q1, k0, k1) of each sequence of a variable-length batch."""
    cq = [int(x) for x in cu_seqlens_q]
    ck = [int(x) for x in cu_seqlens_k]
    spans = []
    for b in range(len(cq) - 1):
        nk = ck[b + 1] - ck[b] if seqused_k is None else int(seqused_k[b])
        spans.append((cq[b], cq[b + 1], ck[b], ck[b] + nk))
    return spans


def _seq_alibi(alibi, b):
    """A sequence's slopes: [H] as given, or row b of [batch, H]."""
    if alibi is None:
        return None
    alibi = np.asarray(alibi, dtype=np.float64)
    return alibi if alibi.ndim == 1 else alibi[b]


def varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k=None, alibi=None, **opts):
    """(o [total_q, H, dv], lse [H, total_q]) of a variable-length batch
    (flash_attn_varlen_func's layout): each sequence is its own problem, with
    its own lengths for the masks; rows no sequence owns get O = 0, LSE = -inf.
    """
    q = np.asarray(q, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    o = np.zeros((q.shape[0], q.shape[1], v.shape[2]))
    lse = np.full((q.shape[1], q.shape[0]), -np.inf)
    mask = opts.pop("dropout_mask", None)  # [batch, H, max_q, max_k]: sequence b's corner
    for b, (q0, q1, k0, k1) in enumerate(_varlen_spans(cu_seqlens_q, cu_seqlens_k, seqused_k)):
        if q1 == q0:
            continue
        if mask is not None:
            opts["dropout_mask"] = np.asarray(mask)[b:b + 1, :, :q1 - q0, :k1 - k0]
        ob, lb = attention_forward(q[None, q0:q1], k[None, k0:k1], v[None, k0:k1],
                                   alibi=_seq_alibi(alibi, b), **opts)
        o[q0:q1] = ob[0]
        lse[:, q0:q1] = lb[0]
    return o, lse


def varlen_backward(q, k, v, dout, cu_seqlens_q, cu_seqlens_k, seqused_k=None, alibi=None, **opts):
    """(dq, dk, dv) of a variable-length batch; rows no sequence owns get 0."""
    q = np.asarray(q, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    dout = np.asarray(dout, dtype=np.float64)
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    for b, (q0, q1, k0, k1) in enumerate(_varlen_spans(cu_seqlens_q, cu_seqlens_k, seqused_k)):
        if q1 == q0 or k1 == k0:
            continue                                                   # no query or no key: no gradient
        g = attention_backward(q[None, q0:q1], k[None, k0:k1], v[None, k0:k1], dout[None, q0:q1],
                               alibi=_seq_alibi(alibi, b), **opts)
        dq[q0:q1], dk[k0:k1], dv[k0:k1] = g[0][0], g[1][0], g[2][0]
    return dq, dk, dv


def apply_rotary(x, cos, sin, positions, interleaved):
    """x [S, heads, d] rotated at positions [S]: pairs (2i, 2i+1) (interleaved, GPT-J) or
    (i, i + rd/2) (GPT-NeoX) of the first rd = 2 * cos.shape[1] dims become
    (x1 cos - x2 sin, x1 sin + x2 cos); the rest is untouched."""
    x = np.array(x, dtype=np.float64)
    cos = np.asarray(cos, dtype=np.float64)
    sin = np.asarray(sin, dtype=np.float64)
    half = cos.shape[1]
    c = cos[positions][:, None, :]
    s_ = sin[positions][:, None, :]
    if interleaved:
        x1, x2 = x[..., 0:2 * half:2].copy(), x[..., 1:2 * half:2].copy()
        x[..., 0:2 * half:2] = x1 * c - x2 * s_
        x[..., 1:2 * half:2] = x1 * s_ + x2 * c
    else:
        x1, x2 = x[..., :half].copy(), x[..., half:2 * half].copy()
        x[..., :half] = x1 * c - x2 * s_
        x[..., half:2 * half] = x1 * s_ + x2 * c
    return x


def kvcache_forward(q, k_cache, v_cache, cache_seqlens, k_new=None, v_new=None, cache_batch_idx=None,
                    cache_leftpad=None, block_table=None, alibi=None, rotary_cos=None, rotary_sin=None,
                    rotary_interleaved=False, **opts):
    """(o, lse) of attention against a KV cache (flash_attn_with_kvcache): sequence b
    attends to cache rows cache_leftpad[b] .. cache_seqlens[b] - 1 of cache
    cache_batch_idx[b] (or, paged, logical rows r at page block_table[b, r // page_size],
    row r % page_size), then to its new keys; each sequence is its own problem
    (masks aligned to its key count). The caches are not modified.
    rotary_cos/sin: q and k_new are rotated first (apply_rotary), new key t at
    cache_seqlens[b] + t, query i at cache_seqlens[b] + i when causal or windowed
    (opts causal / window; a window side of at least the cache's row capacity counts as
    none, as in FlashAttention-2), else at cache_seqlens[b].
    """
    q = np.asarray(q, dtype=np.float64)
    kc = np.asarray(k_cache, dtype=np.float64)
    vc = np.asarray(v_cache, dtype=np.float64)
    B = q.shape[0]
    o = np.zeros((B, q.shape[1], q.shape[2], vc.shape[3]))
    lse = np.full((B, q.shape[2], q.shape[1]), -np.inf)
    for b in range(B):
        n = int(cache_seqlens[b])
        pad = 0 if cache_leftpad is None else int(cache_leftpad[b])
        if block_table is not None:
            ps = kc.shape[1]
            rows = [(int(block_table[b][r // ps]), r % ps) for r in range(pad, n)]
            kb = np.stack([kc[p_, r_] for p_, r_ in rows]) if rows else np.zeros((0,) + kc.shape[2:])
            vb = np.stack([vc[p_, r_] for p_, r_ in rows]) if rows else np.zeros((0,) + vc.shape[2:])
        else:
            row = b if cache_batch_idx is None else int(cache_batch_idx[b])
            kb, vb = kc[row, pad:n], vc[row, pad:n]
        qb = q[b:b + 1]
        knb = None if k_new is None else np.asarray(k_new[b], dtype=np.float64)
        if rotary_cos is not None:
            # FlashAttention-2's rule: causal or local, a window side counting only below the
            # cache's row capacity (mha_fwd_kvcache treats a wider one as unbounded)
            w = opts.get("window", (-1, -1))
            cap = np.asarray(block_table).shape[1] * kc.shape[1] if block_table is not None else kc.shape[1]
            per_row = opts.get("causal", False) or 0 <= w[0] < cap or 0 <= w[1] < cap
            sq = q.shape[1]
            qpos = n + (np.arange(sq) if per_row else np.zeros(sq, dtype=np.int64))
            qb = apply_rotary(q[b], rotary_cos, rotary_sin, qpos, rotary_interleaved)[None]
            knb = apply_rotary(knb, rotary_cos, rotary_sin, n + np.arange(knb.shape[0]), rotary_interleaved)
        if k_new is not None:
            kb = np.concatenate([kb, knb])
            vb = np.concatenate([vb, np.asarray(v_new[b], dtype=np.float64)])
        ob, lb = attention_forward(qb, kb[None], vb[None], alibi=_seq_alibi(alibi, b), **opts)
        o[b], lse[b] = ob[0], lb[0]
    return o, lse
