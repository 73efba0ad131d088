#!/bin/sh
# test_kvcache_cli.sh — the KV cache through the CLI: --cache-seqlens, --k-new,
# --v-new, --cache-batch-idx, --cache-leftpad, --block-table in `run` and
# `check`, and run's --k-cache-out/--v-cache-out.
#
# Usage: sh tests/test_kvcache_cli.sh BUILD_DIR   (tests/run_tests.sh passes it)
#
# Checks that
#   - `run` against a cache (with an append, cache_batch_idx and leftpad)
#     writes O matching tests/ref_numpy.py's independent float64 model
#     (kvcache_forward) within 2e-6 of max|O|, and the caches after the append
#     (new rows in place, every other row unchanged);
#   - the same cache stored as shuffled pages (--block-table, page size 3)
#     gives bit-identical O and appends into the right pages;
#   - `check` passes run's output (the caches as they were + the new keys);
#   - FA_DECODE_TOUCH=0 and 1 give the same bits (a paged cache, 2 kv heads in
#     one task), and FA_DECODE_TOUCH=2 is refused like any malformed variable;
#   - run --num-splits 3 (split-KV) matches the model, with the same bits on 1
#     and 2 threads;
#   - bad index files (cache_seqlens + seqlen_new past the cache, a page index
#     outside the pages, a wrong length, a float file, --k-new without
#     --v-new, a cache option without --cache-seqlens) exit 2 with ONE line
#     naming the file (and the index), and leave no output file.
set -u
tests_dir=$(cd "$(dirname "$0")" && pwd)
. "$tests_dir/cli_test_lib.sh"
cli_test_setup test_kvcache_cli "${1:-build}"

python3 - <<'EOF' || { echo "test_kvcache_cli.sh: generating inputs failed"; exit 1; }
import numpy as np
rng = np.random.default_rng(1357)
B, Sq, H, Hk, d, dv, Sc, Bc, Sn, ps = 3, 4, 4, 2, 16, 8, 40, 4, 3, 3
np.save("q.npy", rng.uniform(-2, 2, (B, Sq, H, d)).astype("<f4"))
kc = rng.uniform(-2, 2, (Bc, Sc, Hk, d)).astype("<f4")
vc = rng.uniform(-1, 1, (Bc, Sc, Hk, dv)).astype("<f4")
np.save("kc.npy", kc)
np.save("vc.npy", vc)
np.save("kn.npy", rng.uniform(-2, 2, (B, Sn, Hk, d)).astype("<f4"))
np.save("vn.npy", rng.uniform(-1, 1, (B, Sn, Hk, dv)).astype("<f4"))
seqlens = np.array([10, 0, 25], "<i4")
np.save("sl.npy", seqlens)
np.save("idx.npy", np.array([2, 0, 3], "<i4"))
np.save("pad.npy", np.array([2, 0, 5], "<i4"))
# the first B cache rows as shuffled pages of 3 rows
maxp = -(-Sc // ps)
npages = B * maxp + 2
table = rng.permutation(npages)[:B * maxp].reshape(B, maxp).astype("<i4")
kp = rng.uniform(-9, 9, (npages, ps, Hk, d)).astype("<f4")
vp = rng.uniform(-9, 9, (npages, ps, Hk, dv)).astype("<f4")
for b in range(B):
    for r in range(seqlens[b]):
        kp[table[b, r // ps], r % ps] = kc[b, r]
        vp[table[b, r // ps], r % ps] = vc[b, r]
np.save("kp.npy", kp)
np.save("vp.npy", vp)
np.save("table.npy", table)
bad = table.copy(); bad[2, 5] = npages + 4; np.save("table_bad.npy", bad)
np.save("sl_past.npy", np.array([10, 0, 38], "<i4"))
np.save("sl_short.npy", np.array([10, 0], "<i4"))
np.save("sl_f32.npy", seqlens.astype("<f4"))
EOF

# expect_fail DESC NEEDLE CMD...: exit 2, exactly one stderr line starting with
# "flashattn" that contains NEEDLE, and no output file left behind.
expect_fail() {
    desc=$1; needle=$2; shift 2
    rm -f o_bad.npy kc_bad.npy
    "$@" >out.txt 2>err.txt
    rc=$?
    lines=$(wc -l <err.txt)
    if [ "$rc" != 2 ]; then
        bad "$desc: exit $rc, expected 2 ($(cat err.txt))"
    elif [ "$lines" != 1 ]; then
        bad "$desc: $lines lines on stderr, expected 1: $(cat err.txt)"
    elif ! grep -q "^flashattn" err.txt || ! grep -qF -- "$needle" err.txt; then
        bad "$desc: stderr does not contain '$needle': $(cat err.txt)"
    elif [ -e o_bad.npy ] || [ -e kc_bad.npy ] || ls -a | grep -q '^\.fa-'; then
        bad "$desc: an output file was left behind"
    else
        ok
    fi
}

NEW="--k-new kn.npy --v-new vn.npy"

# ---- run against the model, and the caches after the append -----------------------
if $fa run -q q.npy -k kc.npy -v vc.npy --cache-seqlens sl.npy $NEW --cache-batch-idx idx.npy \
    --cache-leftpad pad.npy --causal -o o.npy --lse l.npy --k-cache-out kc2.npy --v-cache-out vc2.npy \
    >out.txt 2>err.txt; then ok
else bad "run with a cache: $(cat err.txt)"; fi
if TESTS="$tests_dir" python3 - <<'EOF'; then ok; else bad "run with a cache: wrong output or caches"; fi
import os, sys
import numpy as np
sys.path.insert(0, os.environ["TESTS"])
import ref_numpy
q, kc, vc, kn, vn = (np.load(f) for f in ("q.npy", "kc.npy", "vc.npy", "kn.npy", "vn.npy"))
sl, idx, pad = (np.load(f) for f in ("sl.npy", "idx.npy", "pad.npy"))
want, want_lse = ref_numpy.kvcache_forward(q, kc, vc, sl, kn, vn, idx, pad, causal=True)
o, lse = np.load("o.npy"), np.load("l.npy")
assert o.shape == want.shape and np.abs(o - want).max() <= 2e-6 * np.abs(want).max(), "O"
fin = np.isfinite(want_lse)
assert np.array_equal(np.isneginf(lse), ~fin) and np.abs(lse[fin] - want_lse[fin]).max() <= 2e-6 * np.abs(want_lse[fin]).max()
ek, ev = kc.copy(), vc.copy()
for b in range(3):
    ek[idx[b], sl[b]:sl[b] + 3] = kn[b]
    ev[idx[b], sl[b]:sl[b] + 3] = vn[b]
assert np.array_equal(np.load("kc2.npy"), ek) and np.array_equal(np.load("vc2.npy"), ev), "caches"
EOF

# ---- paged: the contiguous bits ---------------------------------------------------
python3 -c "
import numpy as np
np.save('kc3.npy', np.load('kc.npy')[:3]); np.save('vc3.npy', np.load('vc.npy')[:3])"
if $fa run -q q.npy -k kc3.npy -v vc3.npy --cache-seqlens sl.npy $NEW --causal -o oc.npy \
        --k-cache-out kc3o.npy --v-cache-out vc3o.npy >out.txt 2>err.txt &&
   $fa run -q q.npy -k kp.npy -v vp.npy --cache-seqlens sl.npy $NEW --block-table table.npy --causal -o op.npy \
        --k-cache-out kpo.npy --v-cache-out vpo.npy >out.txt 2>err.txt; then ok
else bad "run paged: $(cat err.txt)"; fi
if python3 - <<'EOF'; then ok; else bad "paged O differs from contiguous, or the append missed its page"; fi
import numpy as np
assert np.array_equal(np.load("oc.npy"), np.load("op.npy")), "O"
kc, kp, table, sl = np.load("kc3o.npy"), np.load("kpo.npy"), np.load("table.npy"), np.load("sl.npy")
for b in range(3):
    for r in range(sl[b] + 3):
        assert np.array_equal(kp[table[b, r // 3], r % 3], kc[b, r]), (b, r)
EOF

# ---- FA_DECODE_TOUCH: going through the cache in address order changes no bit ------
for t in 0 1; do
    FA_DECODE_TOUCH=$t $fa run -q q.npy -k kp.npy -v vp.npy --cache-seqlens sl.npy --block-table table.npy --causal \
        --threads 1 -o ot$t.npy --lse lt$t.npy >out.txt 2>err.txt || bad "run FA_DECODE_TOUCH=$t: $(cat err.txt)"
done
if cmp -s ot0.npy ot1.npy && cmp -s lt0.npy lt1.npy; then ok; else bad "FA_DECODE_TOUCH=1 changed O or LSE bits"; fi
expect_fail "FA_DECODE_TOUCH=2" "FA_DECODE_TOUCH=2: must be 0 or 1" \
    env FA_DECODE_TOUCH=2 $fa run -q q.npy -k kc3.npy -v vc3.npy --cache-seqlens sl.npy -o o_bad.npy

# ---- split-KV (--num-splits): the model, and the same bits for any --threads ---------
for t in 1 2; do
    $fa run -q q.npy -k kc3.npy -v vc3.npy --cache-seqlens sl.npy --causal --block-k 4 --num-splits 3 \
        --threads $t -o os$t.npy --lse ls$t.npy >out.txt 2>err.txt || bad "run --num-splits 3 --threads $t: $(cat err.txt)"
done
if TESTS="$tests_dir" python3 - <<'EOF'; then ok; else bad "--num-splits 3: wrong O/LSE, or bits differ between 1 and 2 threads"; fi
import os, sys
import numpy as np
sys.path.insert(0, os.environ["TESTS"])
import ref_numpy
q, kc, vc, sl = np.load("q.npy"), np.load("kc.npy")[:3], np.load("vc.npy")[:3], np.load("sl.npy")
want, want_lse = ref_numpy.kvcache_forward(q, kc, vc, sl, None, None, None, None, causal=True)
o1, o2, l1, l2 = (np.load(f) for f in ("os1.npy", "os2.npy", "ls1.npy", "ls2.npy"))
assert np.array_equal(o1, o2) and np.array_equal(l1, l2), "bits"
assert np.abs(o1 - want).max() <= 2e-6 * np.abs(want).max(), "O"
fin = np.isfinite(want_lse)
assert np.array_equal(np.isneginf(l1), ~fin) and np.abs(l1[fin] - want_lse[fin]).max() <= 2e-6 * np.abs(want_lse[fin]).max()
EOF
expect_fail "--num-splits -1" "--num-splits" \
    $fa run -q q.npy -k kc.npy -v vc.npy --cache-seqlens sl.npy --num-splits -1 -o o_bad.npy

# ---- check --------------------------------------------------------------------------
if $fa check -q q.npy -k kc.npy -v vc.npy --cache-seqlens sl.npy $NEW --cache-batch-idx idx.npy \
    --cache-leftpad pad.npy --causal --out o.npy --lse l.npy >out.txt 2>err.txt && grep -q "PASS" out.txt; then ok
else bad "check with a cache: exit $? $(cat out.txt err.txt)"; fi
if $fa check -q q.npy -k kp.npy -v vp.npy --cache-seqlens sl.npy $NEW --block-table table.npy --causal \
    --out op.npy >out.txt 2>err.txt && grep -q "PASS" out.txt; then ok
else bad "check with a paged cache: exit $? $(cat out.txt err.txt)"; fi

# --dtype f16: a value that overflows f16 is refused where a sequence reads it (a new key is named
# by its own file), and ignored in a cache row no sequence reads (cache 1: idx is 2, 0, 3)
python3 -c "
import numpy as np
k = np.load('kn.npy'); k[1, 1, 0, 2] = 70000; np.save('kn_big.npy', k)
k = np.load('kc.npy'); k[1, 11, 1, 3] = 70000; np.save('kc_big_unused.npy', k)"
expect_fail "check --dtype f16: a new key past f16's range" \
    "kn_big.npy: batch 1, new key 1, head 0, element 2 = 70000 overflows f16" \
    $fa check -q q.npy -k kc.npy -v vc.npy --cache-seqlens sl.npy --k-new kn_big.npy --v-new vn.npy \
    --cache-batch-idx idx.npy --cache-leftpad pad.npy --causal --out o.npy --dtype f16
if $fa check -q q.npy -k kc_big_unused.npy -v vc.npy --cache-seqlens sl.npy $NEW --cache-batch-idx idx.npy \
    --cache-leftpad pad.npy --causal --out o.npy --dtype f16 >out.txt 2>err.txt && grep -q "PASS" out.txt; then ok
else bad "check --dtype f16 refused a cache row no sequence reads: exit $? $(cat out.txt err.txt)"; fi

# ---- bad input ----------------------------------------------------------------------
expect_fail "past the cache" "sl_past.npy: cache_seqlens[2] + seqlen_new = 38 + 3 is past the cache" \
    $fa run -q q.npy -k kc.npy -v vc.npy --cache-seqlens sl_past.npy $NEW -o o_bad.npy --k-cache-out kc_bad.npy
expect_fail "page outside the pages" "table_bad.npy: block_table[2][5]" \
    $fa run -q q.npy -k kp.npy -v vp.npy --cache-seqlens sl.npy $NEW --block-table table_bad.npy -o o_bad.npy
expect_fail "cache_seqlens of the wrong length" "sl_short.npy: cache_seqlens has 2 entries, should be batch = 3" \
    $fa run -q q.npy -k kc.npy -v vc.npy --cache-seqlens sl_short.npy -o o_bad.npy
expect_fail "float index file" "sl_f32.npy: cache_seqlens must be int32" \
    $fa run -q q.npy -k kc.npy -v vc.npy --cache-seqlens sl_f32.npy -o o_bad.npy
expect_fail "--k-new without --v-new" "--k-new needs --v-new" \
    $fa run -q q.npy -k kc.npy -v vc.npy --cache-seqlens sl.npy --k-new kn.npy -o o_bad.npy
expect_fail "a cache option without --cache-seqlens" "--block-table needs --cache-seqlens" \
    $fa run -q q.npy -k kp.npy -v vp.npy --block-table table.npy -o o_bad.npy
expect_fail "paged with a leftpad" "block_table (table.npy) (paged) cannot be combined with cache_leftpad (pad.npy)" \
    $fa run -q q.npy -k kp.npy -v vp.npy --cache-seqlens sl.npy --block-table table.npy --cache-leftpad pad.npy -o o_bad.npy
expect_fail "paged with a cache_batch_idx" "cannot be combined with cache_batch_idx (idx.npy)" \
    $fa run -q q.npy -k kp.npy -v vp.npy --cache-seqlens sl.npy --block-table table.npy --cache-batch-idx idx.npy -o o_bad.npy
expect_fail "check past the cache" "sl_past.npy: cache_seqlens[2]" \
    $fa check -q q.npy -k kc.npy -v vc.npy --cache-seqlens sl_past.npy $NEW --out o.npy

# ---- NaN in the cache: refused where a sequence reads it, ignored where none does ---
python3 -c "
import numpy as np
k = np.load('kc.npy'); k[2, 7, 1, 3] = np.nan; np.save('kc_nan_used.npy', k)     # cache 2 row 7: sequence 0 (idx 2) reads 0..9
k = np.load('kc.npy'); k[2, 30, 0, 0] = np.nan; np.save('kc_nan_unused.npy', k)  # row 30: past every sequence's rows
np.save('idx_dup.npy', np.array([2, 0, 2], '<i4'))"
expect_fail "run: NaN in a cache row a sequence reads" "kc_nan_used.npy: sequence 0, key 7, head 1, element 3 (element [2,7,1,3] of the cache) is NaN" \
    $fa run -q q.npy -k kc_nan_used.npy -v vc.npy --cache-seqlens sl.npy --cache-batch-idx idx.npy -o o_bad.npy
# the same in pages: sequence 2's key 8 is row 8 of its cache, slot 2 of page table[2, 2]
python3 -c "
import numpy as np
k = np.load('vp.npy'); t = np.load('table.npy'); k[t[2, 2], 2, 0, 1] = np.inf; np.save('vp_inf.npy', k)
print(t[2, 2])" >page.txt
expect_fail "run: Inf in a page a sequence reads, named by page and slot" \
    "vp_inf.npy: sequence 2, key 8, head 0, element 1 (element [$(cat page.txt),2,0,1] of the pages) is Inf" \
    $fa run -q q.npy -k kp.npy -v vp_inf.npy --cache-seqlens sl.npy --block-table table.npy -o o_bad.npy
if $fa run -q q.npy -k kc_nan_unused.npy -v vc.npy --cache-seqlens sl.npy --cache-batch-idx idx.npy -o o_nan.npy \
        >out.txt 2>err.txt && [ ! -s err.txt ]; then ok
else bad "run with a NaN in an unused cache row: $(cat err.txt)"; fi
# sequence 0 appends rows 10..12 of cache 2, which sequence 2 (also cache 2) reads as keys 10..12
expect_fail "run: an append into rows another sequence reads" \
    "idx_dup.npy: sequence 0 would append into the cache row that sequence 2 reads as its key 10 (cache 2, row 10)" \
    $fa run -q q.npy -k kc.npy -v vc.npy --cache-seqlens sl.npy --cache-batch-idx idx_dup.npy $NEW -o o_bad.npy

# ---- messages name the file: k_new / v_new and the rotary tables ----------------------
python3 -c "
import numpy as np
np.save('kn64.npy', np.load('kn.npy').astype('<f8'))
np.save('vn_short.npy', np.load('vn.npy')[:, :2].copy())
np.save('cos_wide.npy', np.ones((64, 10), '<f4')); np.save('sin_wide.npy', np.zeros((64, 10), '<f4'))
np.save('cos_4.npy', np.ones((64, 4), '<f4')); np.save('sin_3.npy', np.zeros((64, 3), '<f4'))"
expect_fail "k_new of another dtype names its file" "kn64.npy: k_new/v_new must have the caches' dtypes" \
    $fa run -q q.npy -k kc.npy -v vc.npy --cache-seqlens sl.npy --cache-batch-idx idx.npy --k-new kn64.npy \
        --v-new vn.npy -o o_bad.npy
expect_fail "v_new of another length names its file" "vn_short.npy: shape" \
    $fa run -q q.npy -k kc.npy -v vc.npy --cache-seqlens sl.npy --cache-batch-idx idx.npy --k-new kn.npy \
        --v-new vn_short.npy -o o_bad.npy
expect_fail "rotary wider than d names the cos file" "cos_wide.npy: rotary_dim = 2 x 10 = 20 must be in 2..d = 16" \
    $fa run -q q.npy -k kc.npy -v vc.npy --cache-seqlens sl.npy --cache-batch-idx idx.npy $NEW \
        --rotary-cos cos_wide.npy --rotary-sin sin_wide.npy -o o_bad.npy

expect_fail "cos and sin of different shapes name both files" \
    "sin_3.npy: shape [64,3] differs from cos_4.npy [64,4]" \
    $fa run -q q.npy -k kc.npy -v vc.npy --cache-seqlens sl.npy --cache-batch-idx idx.npy $NEW \
        --rotary-cos cos_4.npy --rotary-sin sin_3.npy -o o_bad.npy

echo "test_kvcache_cli: $pass passed, $fail failed"
[ "$fail" = 0 ]
