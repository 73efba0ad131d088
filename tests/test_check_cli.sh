#!/bin/sh
# test_check_cli.sh — `flashattn check` end to end, with verdicts known in advance.
#
# Usage: sh tests/test_check_cli.sh BUILD_DIR   (tests/run_tests.sh passes it)
#
# Builds small problems with python3 + numpy (bf16 as '<u2' bit patterns, f16,
# f32), produces outputs with `flashattn run` and with numpy, and checks:
#   - exit 0 for correct outputs: the flash path in f32, the reference rounded to
#     bf16 and f16, a plain bf16 attention written in numpy, with and without an
#     LSE, causal with seqlen_q != seqlen_k, GQA, --sample-rows;
#   - exit 1 for wrong ones: one row perturbed, scale off by 1%, causal aligned
#     top-left, a NaN, a wrong LSE — and the report names the worst element;
#   - exit 2, one line on stderr naming the file, for files whose shapes
#     disagree, wrong dtypes, truncated files, NaN inputs and bad options.
# Runs in a few seconds.
set -u
. "$(dirname "$0")/cli_test_lib.sh"
cli_test_setup test_check_cli "${1:-build}"

# expect STATUS NAME -- ARGS...: run `flashattn check ARGS`, require exit STATUS.
expect() {
    want=$1; name=$2; shift 3
    "$fa" check "$@" >out.txt 2>err.txt
    got=$?
    if [ "$got" = "$want" ]; then ok; else bad "$name: exit $got, want $want"; cat out.txt err.txt; fi
}
# expect_usage NAME FILE -- ARGS...: exit 2, exactly one stderr line, naming FILE, nothing on stdout.
expect_usage() {
    name=$1; file=$2; shift 3
    "$fa" check "$@" >out.txt 2>err.txt
    got=$?
    lines=$(wc -l <err.txt)
    if [ "$got" != 2 ]; then bad "$name: exit $got, want 2"; cat err.txt; return; fi
    if [ "$lines" != 1 ]; then bad "$name: $lines stderr lines, want 1"; cat err.txt; return; fi
    if [ -n "$file" ] && ! grep -q -- "$file" err.txt; then bad "$name: message does not name $file: $(cat err.txt)"; return; fi
    if [ -s out.txt ]; then bad "$name: printed a report on bad input"; return; fi
    ok
}

# ---- inputs -------------------------------------------------------------------
python3 - <<'EOF' || { echo "test_check_cli.sh: generating inputs failed"; exit 1; }
import numpy as np
rng = np.random.default_rng(4321)

def bf16_bits(x):
    b = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype("<u2")

def bf16_value(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)

def attention(q, k, v, causal=False, scale=None, top_left=False):
    """float64 reference in BSHD; GQA by repeating kv heads."""
    B, Sq, H, d = q.shape; Sk, Hk = k.shape[1], k.shape[2]
    k = np.repeat(k, H // Hk, axis=2); v = np.repeat(v, H // Hk, axis=2)
    s = np.einsum("bihd,bjhd->bhij", q, k) * (scale if scale else 1 / np.sqrt(d))
    if causal:
        i = np.arange(Sq)[:, None]; j = np.arange(Sk)[None, :]
        s = np.where(j <= i + (0 if top_left else Sk - Sq), s, -np.inf)
    m = s.max(-1, keepdims=True); p = np.exp(s - m); l = p.sum(-1, keepdims=True)
    return np.einsum("bhij,bjhd->bihd", p / l, v), np.ascontiguousarray((m + np.log(l))[..., 0])

def plain_bf16(q, k, v, causal=False):
    """A plain bf16 kernel: f32 scores, P rounded to bf16, f32 P.V, output rounded."""
    B, Sq, H, d = q.shape; Sk, Hk = k.shape[1], k.shape[2]
    k = np.repeat(k, H // Hk, axis=2); v = np.repeat(v, H // Hk, axis=2)
    s = np.einsum("bihd,bjhd->bhij", q, k).astype(np.float32) * np.float32(1 / np.sqrt(d))
    if causal:
        i = np.arange(Sq)[:, None]; j = np.arange(Sk)[None, :]
        s = np.where(j <= i + Sk - Sq, s, -np.inf).astype(np.float32)
    p = np.exp(s - s.max(-1, keepdims=True)); p = (p / p.sum(-1, keepdims=True)).astype(np.float32)
    p = bf16_value(bf16_bits(p))
    return bf16_bits(np.einsum("bhij,bjhd->bihd", p, v).astype(np.float32))

# bf16 problem: causal, seqlen_q < seqlen_k, GQA 4/2; q scaled so a 1% scale error shows
B, Sq, Sk, H, Hk, d = 1, 24, 512, 4, 2, 32
qb = bf16_bits(3 * rng.standard_normal((B, Sq, H, d)))
kb = bf16_bits(rng.standard_normal((B, Sk, Hk, d)))
vb = bf16_bits(rng.standard_normal((B, Sk, Hk, d)))
for n, a in (("qb", qb), ("kb", kb), ("vb", vb)):
    np.save(n + ".npy", a)
q, k, v = (bf16_value(x).astype(np.float64) for x in (qb, kb, vb))
o, lse = attention(q, k, v, causal=True)
np.save("ob_ref.npy", bf16_bits(o))                         # reference rounded: pass
np.save("ob_plain.npy", plain_bf16(q, k, v, causal=True))   # plain bf16 kernel: pass
np.save("lse.npy", lse.astype("<f4"))
l2 = lse.copy(); l2[0, 1, 7] += 0.05; np.save("lse_bad.npy", l2.astype("<f4"))
o2 = o.copy(); o2[0, 9, 3, :] += 0.1; np.save("ob_row.npy", bf16_bits(o2))
o3, _ = attention(q, k, v, causal=True, scale=1.01 / np.sqrt(d)); np.save("ob_scale.npy", bf16_bits(o3))
o4, _ = attention(q, k, v, causal=True, top_left=True); np.save("ob_topleft.npy", bf16_bits(o4))
o5 = o.astype("<f4").copy(); o5[0, 2, 1, 5] = np.nan; np.save("o_nan.npy", o5)
# the same values as float32, for --dtype bf16
for n, a in (("qv", q), ("kv", k), ("vv", v)):
    np.save(n + ".npy", a.astype("<f4"))
np.save("ov_ref.npy", bf16_value(bf16_bits(o)))
np.save("ov_row32.npy", o2.astype("<f4"))                   # float32 values, one row off: no hint
# f16 problem
qh = (rng.standard_normal((2, 16, 2, 16))).astype("<f2")
kh = (rng.standard_normal((2, 20, 2, 16))).astype("<f2")
vh = (rng.standard_normal((2, 20, 2, 16))).astype("<f2")
for n, a in (("qh", qh), ("kh", kh), ("vh", vh)):
    np.save(n + ".npy", a)
oh, _ = attention(*(x.astype(np.float64) for x in (qh, kh, vh)))
np.save("oh_ref.npy", oh.astype("<f2"))
# bad files
np.save("o_short.npy", o[:, :20].astype("<f4"))                 # seqlen_q disagrees
np.save("o_rank3.npy", o[0].astype("<f4"))
np.save("o_i4.npy", np.zeros(o.shape, dtype="<i4"))             # wrong dtype
np.save("lse_short.npy", lse[:, :3].astype("<f4"))
np.save("lse_f16.npy", lse.astype("<f2"))
np.save("k_d8.npy", bf16_bits(rng.standard_normal((B, Sk, Hk, 8))))
q_nan = bf16_value(qb).copy(); q_nan[0, 3, 1, 2] = np.nan; np.save("q_nan.npy", q_nan)
raw = open("ob_ref.npy", "rb").read(); open("o_trunc.npy", "wb").write(raw[:-5])
EOF

# ---- accepted -------------------------------------------------------------------
expect 0 "reference rounded to bf16" -- -q qb.npy -k kb.npy -v vb.npy --out ob_ref.npy --causal
grep -q "rule: bf16 emulation" out.txt || bad "auto dtype from '<u2' files should be bf16"
grep -q "verdict: PASS" out.txt || bad "report lacks 'verdict: PASS'"
expect 0 "plain bf16 kernel" -- -q qb.npy -k kb.npy -v vb.npy --out ob_plain.npy --causal --dtype bf16
expect 0 "with LSE" -- -q qb.npy -k kb.npy -v vb.npy --out ob_ref.npy --lse lse.npy --causal
expect 0 "f32 values with --dtype bf16" -- -q qv.npy -k kv.npy -v vv.npy --out ov_ref.npy --causal --dtype bf16
expect 0 "sampled rows" -- -q qb.npy -k kb.npy -v vb.npy --out ob_plain.npy --causal --sample-rows 5 --seed 3
grep -q "rows checked: 20 of 96" out.txt || bad "sampled report: $(grep 'rows checked' out.txt)"
expect 0 "f16 reference rounded" -- -q qh.npy -k kh.npy -v vh.npy --out oh_ref.npy
grep -q "rule: f16 emulation" out.txt || bad "auto dtype from '<f2' files should be f16"
"$fa" run -q qh.npy -k kh.npy -v vh.npy -o o_flash.npy --lse l_flash.npy >/dev/null 2>&1 || bad "run failed"
expect 0 "flash f32 output" -- -q qh.npy -k kh.npy -v vh.npy --out o_flash.npy --lse l_flash.npy --dtype f32
expect 0 "explicit atol" -- -q qb.npy -k kb.npy -v vb.npy --out ob_row.npy --causal --atol 0.5

# ---- rejected -----------------------------------------------------------------
expect 1 "one row perturbed" -- -q qb.npy -k kb.npy -v vb.npy --out ob_row.npy --causal
grep -q "worst element (batch, row, head, col) = (0, 9, 3," out.txt || bad "worst element not at (0, 9, 3): $(grep worst out.txt)"
grep -q "failing row (batch 0, row 9, head 3)" out.txt || bad "failing row not listed"
grep -q "failures cluster in 1 of 4 heads" out.txt || bad "no per-head summary"
expect 1 "scale off by 1%" -- -q qb.npy -k kb.npy -v vb.npy --out ob_scale.npy --causal
expect 1 "causal aligned top-left" -- -q qb.npy -k kb.npy -v vb.npy --out ob_topleft.npy --causal
expect 1 "sampled top-left" -- -q qb.npy -k kb.npy -v vb.npy --out ob_topleft.npy --causal --sample-rows 3
expect 1 "not causal at all" -- -q qb.npy -k kb.npy -v vb.npy --out ob_ref.npy
expect 1 "NaN in the tested output" -- -q qb.npy -k kb.npy -v vb.npy --out o_nan.npy --causal --atol 1e9
grep -q "NON-FINITE: 1 tested elements" out.txt || bad "NaN not reported"
expect 1 "wrong LSE" -- -q qb.npy -k kb.npy -v vb.npy --out ob_ref.npy --lse lse_bad.npy --causal
grep -q "lse worst (batch, head, row) = (0, 1, 7)" out.txt || bad "LSE worst row not reported"
expect 1 "tight explicit atol" -- -q qb.npy -k kb.npy -v vb.npy --out ob_ref.npy --causal --atol 1e-6
# a bf16 output saved as float32, float32 inputs, no --dtype: float32's rule fails it, and says why
expect 1 "bf16 values as float32 without --dtype" -- -q qv.npy -k kv.npy -v vv.npy --out ov_ref.npy --causal
grep -q "rule: f32 emulation" out.txt || bad "float32 files should get the f32 rule"
grep -q "^hint: every value of ov_ref.npy is a bf16 value.*--dtype bf16" out.txt || bad "no bf16 hint: $(grep hint out.txt)"
expect 1 "float32 values one row off" -- -q qv.npy -k kv.npy -v vv.npy --out ov_row32.npy --causal
grep -q "^hint:" out.txt && bad "a hint for an output that is not bf16-valued"

# ---- bad usage or input: exit 2, one line naming the file ------------------------
expect_usage "tested output shape disagrees" o_short.npy -- -q qb.npy -k kb.npy -v vb.npy --out o_short.npy
expect_usage "tested output rank 3" o_rank3.npy -- -q qb.npy -k kb.npy -v vb.npy --out o_rank3.npy
expect_usage "tested output int32" o_i4.npy -- -q qb.npy -k kb.npy -v vb.npy --out o_i4.npy
expect_usage "tested output truncated" o_trunc.npy -- -q qb.npy -k kb.npy -v vb.npy --out o_trunc.npy
expect_usage "LSE shape disagrees" lse_short.npy -- -q qb.npy -k kb.npy -v vb.npy --out ob_ref.npy --lse lse_short.npy
expect_usage "LSE float16" lse_f16.npy -- -q qb.npy -k kb.npy -v vb.npy --out ob_ref.npy --lse lse_f16.npy
expect_usage "k head dim disagrees" k_d8.npy -- -q qb.npy -k k_d8.npy -v vb.npy --out ob_ref.npy
expect_usage "NaN in q" q_nan.npy -- -q q_nan.npy -k kb.npy -v vb.npy --out ob_ref.npy
expect_usage "missing file" nothere.npy -- -q qb.npy -k kb.npy -v vb.npy --out nothere.npy
expect_usage "unknown option" --tolerance -- -q qb.npy -k kb.npy -v vb.npy --out ob_ref.npy --tolerance 1
expect_usage "missing --out" --out -- -q qb.npy -k kb.npy -v vb.npy
expect_usage "bad --dtype" --dtype -- -q qb.npy -k kb.npy -v vb.npy --out ob_ref.npy --dtype f8
expect_usage "negative --atol" --atol -- -q qb.npy -k kb.npy -v vb.npy --out ob_ref.npy --atol -1
expect_usage "zero --sample-rows" --sample-rows -- -q qb.npy -k kb.npy -v vb.npy --out ob_ref.npy --sample-rows 0
"$fa" check --help >out.txt 2>&1 && grep -q "sample-rows" out.txt && ok || bad "check --help"

# ---- the LSE of a kernel summing in FlashAttention-2's order ---------------------------
# One decode row of 16384 keys whose last key is dominant (16.75 nats above the rest): FA2
# visits key blocks of 128 last to first and adds each term straight into a thread's running
# sum, which already holds ~1, so every small term (e^-16.75, under half an ulp) is lost — the
# LSE is 2.2e-4 low, a correct kernel's (O, in bf16, hides it). The rule's emulation sums in
# that order too and accepts it; an LSE that leaves out one key of 4096 on a flat row still
# fails (test_check.c), and a float32 O keeps the strict order: O and LSE from only the last
# half of the keys fail.
python3 - <<'EOF' || bad "generating the FlashAttention-2-order LSE failed"
import numpy as np
N, d, BN = 16384, 64, 128
q = np.zeros((1, 1, 1, d), np.float32); q[..., 0] = 1.0
k = np.zeros((1, N, 1, d), np.float32); k[0, :, 0, 0] = 8.0; k[0, N - 1, 0, 0] = 24.75
v = (np.round(np.random.default_rng(5).standard_normal((1, N, 1, d)) * 8) / 8).astype(np.float32)
s = k[0, :, 0, 0].astype(np.float32)              # scale 1, q = e_0: the scores exactly
m = np.float32(s.max())
p = np.exp((s - m).astype(np.float32)).astype(np.float32)
rs = np.zeros(4, np.float32)
for nb in range(N // BN - 1, -1, -1):              # last block first
    for j in range(nb * BN, nb * BN + BN):
        rs[(j % 8) // 2] = np.float32(rs[(j % 8) // 2] + p[j])
tot = np.float32(np.float32(rs[0] + rs[1]) + np.float32(rs[2] + rs[3]))
o = ((p[:, None] * v[0, :, 0]).sum(0) / tot).astype(np.float32)
ob = o.view(np.uint32).astype(np.uint64)                      # FA2 writes O in bf16 (RNE)
o = ((ob + 0x7FFF + ((ob >> 16) & 1)) >> 16).astype(np.uint16)
for n, x in (("fq", q), ("fk", k), ("fv", v), ("fo", o.reshape(1, 1, 1, d)),
             ("flse", np.array(m + np.log(tot), np.float32).reshape(1, 1, 1))):
    np.save(f"{n}.npy", x)
EOF
expect 0 "an LSE summed in FlashAttention-2's order" -- -q fq.npy -k fk.npy -v fv.npy --out fo.npy --lse flse.npy \
    --scale 1 --threads 1
python3 - <<'EOF' || bad "generating the half-the-keys output failed"
import numpy as np
k, v = np.load("fk.npy"), np.load("fv.npy")
s = k[0, :, 0, 0].astype(np.float64)
h = s[8192:]                                       # a window bug: only the last 8192 keys
p = np.exp(h - h.max())
np.save("ho.npy", ((p[:, None] * v[0, 8192:, 0]).sum(0) / p.sum()).astype(np.float32).reshape(1, 1, 1, -1))
np.save("hlse.npy", np.array(h.max() + np.log(p.sum()), np.float32).reshape(1, 1, 1))
EOF
expect 1 "float32 O and LSE from half the keys (the FA2-order row)" -- -q fq.npy -k fk.npy -v fv.npy --out ho.npy \
    --lse hlse.npy --scale 1 --threads 1

echo "test_check_cli.sh: $pass passed, $fail failed"
[ "$fail" = 0 ]
