#!/bin/sh
# The AArch64 CLI ($1/flashattn, mk/neon.mk) under qemu-user ($QEMU_AARCH64;
# empty: run natively): every file it reads is one it wrote itself (probe's
# random inputs, seeded by FA_TEST_SEED or the clock), so no numpy is needed.
# FA_NEON_OMP=0 (set by mk/neon.mk for a build without OpenMP) skips the
# thread comparison.
#   - `info` and `--version` say the NEON kernels are in use;
#   - run (flash, causal, GQA, odd d = 37) then check against the float64
#     reference passes, and check of that output without --causal fails
#     (exit 1: the check can fail);
#   - grad then check-grad passes;
#   - a decode call (seqlen_q 4, a KV cache with 3 new keys appended,
#     num_splits 3: src/decode.c with NEON's dec_qk/dec_pv) then check passes;
#     1 and 2 threads write the same bytes; the cache written back holds k_new
#     at cache_seqlens[b] and nothing else changed.
# Prints "N passed, N failed"; exit 1 on any failure.
export LC_ALL=C # byte-wise text tools on .npy files
build=${1:-build/neon}
qemu=${QEMU_AARCH64-qemu-aarch64}
# shellcheck disable=SC2086 # $qemu: the emulator, or nothing (native)
fa() { $qemu "$build/flashattn" "$@"; }
seed=${FA_TEST_SEED:-$(date +%s)}
t=$build/cli-test
rm -rf "$t"
mkdir -p "$t"
pass=0
fail=0
ok() { pass=$((pass + 1)); echo "[       OK ] $1"; rm -f "$t/out" "$t/err"; }
notok() { fail=$((fail + 1)); echo "[  FAILED  ] $1"; cat "$t/out" "$t/err" 2>/dev/null | tail -5 | sed "s/^/             /"; rm -f "$t/out" "$t/err"; }
# expect STATUS NAME COMMAND...: the command exits with STATUS
expect() {
    want=$1; name=$2; shift 2
    "$@" >"$t/out" 2>"$t/err"
    got=$?
    if [ "$got" = "$want" ]; then ok "$name"; else notok "$name (exit $got, expected $want)"; fi
}
echo "[ seed     ] FA_TEST_SEED=$seed"

if fa info >"$t/info" 2>"$t/err" && grep -q '^ISA *: neon ' "$t/info"; then ok "flashattn info: ISA neon"
else notok "flashattn info does not say ISA neon: $(grep '^ISA' "$t/info")"; fi
if fa --version 2>"$t/err" | grep -q '; neon in use)'; then ok "flashattn --version: neon in use"
else notok "flashattn --version does not say neon in use"; fi

p=$t/probe
expect 0 "probe writes random inputs (d 37, GQA 4/2)" \
    fa probe --out "$p" --batch 2 --seqlen 40 --heads 4 --heads-k 2 --d 37 --seed "$seed"

f=$p/q-shorter # seqlen_q 20 < seqlen_k 70
expect 0 "run: flash forward, causal" fa run -q "$f/q.npy" -k "$f/k.npy" -v "$f/v.npy" -o "$t/o.npy" \
    --lse "$t/lse.npy" --causal --threads 2 --block-q 16 --block-k 16
expect 0 "check: that output against the float64 reference" fa check -q "$f/q.npy" -k "$f/k.npy" -v "$f/v.npy" \
    --out "$t/o.npy" --lse "$t/lse.npy" --causal
fa check -q "$f/q.npy" -k "$f/k.npy" -v "$f/v.npy" --out "$t/o.npy" >"$t/out" 2>"$t/err"
got=$?
if [ "$got" = 1 ] && grep -q '^verdict: FAIL' "$t/out"; then ok "check: the causal output checked without --causal fails"
else notok "check: the causal output checked without --causal: exit $got, expected 1 and verdict: FAIL"; fi

# dO: any random tensor of O's shape; the probe's q (d_v = d) is one
expect 0 "grad: flash backward, causal" fa grad -q "$f/q.npy" -k "$f/k.npy" -v "$f/v.npy" --dout "$f/q.npy" \
    --dq "$t/dq.npy" --dk "$t/dk.npy" --dv "$t/dv.npy" --causal --threads 2
expect 0 "check-grad: those gradients against the float64 reference" fa check-grad -q "$f/q.npy" -k "$f/k.npy" \
    -v "$f/v.npy" --dout "$f/q.npy" --dq "$t/dq.npy" --dk "$t/dk.npy" --dv "$t/dv.npy" --causal

# the rotary-kvcache probe's cache (seqlen_q 4, caches of 48 rows, 3 new keys) without its rotary
# tables: rotary is not the decode path (src/decode.c), and the new keys then go in as they are
f=$p/rotary-kvcache
kv="--cache-seqlens $f/cache_seqlens.npy --k-new $f/k_new.npy --v-new $f/v_new.npy --causal"
kvrun="$kv --num-splits 3 --block-k 16" # (execution options: run only)
# shellcheck disable=SC2086
expect 0 "run: decode over a KV cache (3 new keys appended, 3 splits), 2 threads" fa run -q "$f/q.npy" \
    -k "$f/k.npy" -v "$f/v.npy" -o "$t/od2.npy" --lse "$t/ld2.npy" --threads 2 --k-cache-out "$t/kc.npy" $kvrun
# shellcheck disable=SC2086
expect 0 "check: the decode output against the float64 reference" fa check -q "$f/q.npy" -k "$f/k.npy" \
    -v "$f/v.npy" --out "$t/od2.npy" --lse "$t/ld2.npy" $kv
# shellcheck disable=SC2086
expect 0 "run: the decode with decode.c's own key block (no --block-k) and split heuristic" fa run -q "$f/q.npy" \
    -k "$f/k.npy" -v "$f/v.npy" -o "$t/odb.npy" --lse "$t/ldb.npy" --threads 2 $kv
# shellcheck disable=SC2086
expect 0 "check: that output against the float64 reference" fa check -q "$f/q.npy" -k "$f/k.npy" \
    -v "$f/v.npy" --out "$t/odb.npy" --lse "$t/ldb.npy" $kv
# shellcheck disable=SC2086
expect 0 "run: the same decode on 1 thread" fa run -q "$f/q.npy" -k "$f/k.npy" -v "$f/v.npy" -o "$t/od1.npy" \
    --lse "$t/ld1.npy" --threads 1 $kvrun
if [ "${FA_NEON_OMP:-1}" = 0 ]; then
    echo "[ SKIPPED  ] decode with 3 splits on 1 and 2 threads: built without OpenMP"
elif cmp -s "$t/od1.npy" "$t/od2.npy" && cmp -s "$t/ld1.npy" "$t/ld2.npy"; then
    ok "decode with 3 splits: 1 and 2 threads write the same bytes"
else
    notok "decode with 3 splits: 1 and 2 threads write different O or LSE"
fi

# the cache written back: rows cache_seqlens[b] + t of sequence b are k_new[b][t], byte for byte,
# and no other byte differs from the input cache (.npy headers are text: the shapes come from them)
npy_shape() { head -c 256 "$1" | tr -d '\n' | sed -n "s/.*'shape': *(\([0-9, ]*\)).*/\1/p" | tr -d ' '; }
field() { echo "$1" | cut -d, -f"$2"; }
four() { echo "$1" | grep -Eq '^[0-9]+,[0-9]+,[0-9]+,[0-9]+$'; }
check_cache() {
    for x in "$f/k.npy" "$f/k_new.npy" "$f/cache_seqlens.npy" "$t/kc.npy"; do
        [ -s "$x" ] || { notok "the cache written back: $x is missing"; return; }
    done
    shape=$(npy_shape "$f/k.npy") # B,S,HK,D of the cache
    nshape=$(npy_shape "$f/k_new.npy") # B,SN,HK,D
    if ! four "$shape" || ! four "$nshape"; then notok "the cache written back: cannot read the shapes of k, k_new"; return; fi
    nb=$(field "$shape" 1); rows=$(field "$shape" 2); sn=$(field "$nshape" 2)
    rowb=$(( $(field "$shape" 3) * $(field "$shape" 4) * 4 ))
    hdr=$(( $(wc -c <"$f/k.npy") - nb * rows * rowb ))
    hnew=$(( $(wc -c <"$f/k_new.npy") - nb * sn * rowb ))
    lens=$(tail -c $((4 * nb)) "$f/cache_seqlens.npy" | od -An -v -t d4)
    wrong=0
    [ "$(wc -c <"$t/kc.npy")" = "$(wc -c <"$f/k.npy")" ] || wrong=1
    b=0
    for cs in $lens; do
        i=0
        while [ "$wrong" = 0 ] && [ "$i" -lt "$sn" ]; do
            cmp -s -n "$rowb" -i "$((hdr + (b * rows + cs + i) * rowb)):$((hnew + (b * sn + i) * rowb))" \
                "$t/kc.npy" "$f/k_new.npy" || wrong=$((wrong + 1))
            i=$((i + 1))
        done
        b=$((b + 1))
    done
    outside=$(cmp -l "$f/k.npy" "$t/kc.npy" 2>/dev/null | awk -v hdr="$hdr" -v rowb="$rowb" -v rows="$rows" \
        -v sn="$sn" -v lens="$lens" '
        BEGIN { split(lens, cs, " ") }
        { off = $1 - 1 - hdr; r = int(off / rowb); b = int(r / rows); j = r - b * rows
          if (off < 0 || j < cs[b + 1] || j >= cs[b + 1] + sn) out++ }
        END { print out + 0 }')
    if [ "$wrong" = 0 ] && [ "$outside" = 0 ]; then
        ok "the cache written back holds k_new exactly at rows cache_seqlens[b] .. + $((sn - 1)), nothing else changed"
    else
        notok "the cache written back (--k-cache-out): $wrong appended rows wrong, $outside bytes changed elsewhere"
    fi
}
check_cache

rm -rf "$t"
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
