#!/bin/sh
# test_varlen_cli.sh — variable-length batches through the CLI: --cu-seqlens-q,
# --cu-seqlens-k, --seqused-k in `run`, `check`, `grad` and `check-grad`.
#
# Usage: sh tests/test_varlen_cli.sh BUILD_DIR   (tests/run_tests.sh passes it)
#
# Packed inputs (Q [total_q, heads, d], K/V [total_k, heads_k, d]) with
# sequences of different lengths, one of no query and one of no key, rows
# owned by no sequence, GQA. Checks that
#   - `run` writes O [total_q, heads, d_v] and LSE [heads, total_q] matching
#     tests/ref_numpy.py's independent float64 model (varlen_forward) within
#     2e-6 of max|O|, causal and windowed, flash and reference, seqused_k too;
#   - `check` passes run's output (exit 0) and fails a perturbed one (exit 1);
#   - `grad` matches varlen_backward within 1e-5 of max|G|, and `check-grad`
#     passes grad's output, also with junk in rows no sequence owns, and fails
#     a wrong owned element, named [row, head, col];
#   - NaN/Inf in rows no sequence reads (q, k, v, dO) are no error in run, check, grad and check-grad
#     (O and the gradients bit for bit those of clean inputs); in a row a sequence reads
#     they exit 2 naming the file, [row, head, col] and the sequence;
#   - bad index files (decreasing, not starting at 0, past the end, seqused_k
#     too large, float instead of int32, mismatched lengths, a missing
#     --cu-seqlens-k, rank-4 Q) exit 2 with ONE line naming the file (and the
#     index), and leave no output file.
set -u
tests_dir=$(cd "$(dirname "$0")" && pwd)
. "$tests_dir/cli_test_lib.sh"
cli_test_setup test_varlen_cli "${1:-build}"

python3 - <<'EOF' || { echo "test_varlen_cli.sh: generating inputs failed"; exit 1; }
import numpy as np
rng = np.random.default_rng(2468)
q_lens, k_lens = [5, 0, 13, 6, 1], [9, 4, 7, 0, 19]
cq = np.concatenate([[0], np.cumsum(q_lens)]).astype("<i4")
ck = np.concatenate([[0], np.cumsum(k_lens)]).astype("<i4")
H, Hk, d, dv = 4, 2, 16, 8
np.save("q.npy", rng.uniform(-2, 2, (cq[-1] + 2, H, d)).astype("<f4"))
np.save("k.npy", rng.uniform(-2, 2, (ck[-1] + 1, Hk, d)).astype("<f4"))
np.save("v.npy", rng.uniform(-1, 1, (ck[-1] + 1, Hk, dv)).astype("<f4"))
np.save("do.npy", rng.uniform(-1, 1, (cq[-1] + 2, H, dv)).astype("<f4"))
np.save("cq.npy", cq)
np.save("ck.npy", ck)
np.save("used.npy", np.array([9, 2, 5, 0, 11], "<i4"))
np.save("q4.npy", rng.uniform(-1, 1, (1, cq[-1] + 2, H, d)).astype("<f4"))
np.save("q0.npy", np.zeros((0, H, d), "<f4"))
np.save("cq0.npy", np.zeros(len(cq), "<i4"))
bad = cq.copy(); bad[3] = bad[2] - 1; np.save("cq_dec.npy", bad)
bad = cq.copy(); bad[0] = 2; np.save("cq_start.npy", bad)
bad = ck.copy(); bad[5] = ck[-1] + 2; np.save("ck_past.npy", bad)
np.save("used_big.npy", np.array([9, 5, 5, 0, 11], "<i4"))
np.save("cq_f32.npy", cq.astype("<f4"))
np.save("cq_short.npy", cq[:-1])
EOF

# expect_fail DESC NEEDLE CMD...: exit 2, exactly one stderr line starting with
# "flashattn" that contains NEEDLE, and no output file left behind.
expect_fail() {
    desc=$1; needle=$2; shift 2
    rm -f o_bad.npy
    "$@" >out.txt 2>err.txt
    rc=$?
    lines=$(wc -l <err.txt)
    if [ "$rc" != 2 ]; then
        bad "$desc: exit $rc, expected 2 ($(cat err.txt))"
    elif [ "$lines" != 1 ]; then
        bad "$desc: $lines lines on stderr, expected 1: $(cat err.txt)"
    elif ! grep -q "^flashattn" err.txt || ! grep -qF -- "$needle" err.txt; then
        bad "$desc: stderr does not contain '$needle': $(cat err.txt)"
    elif [ -e o_bad.npy ] || ls -a | grep -q '^\.fa-'; then
        bad "$desc: an output file was left behind"
    else
        ok
    fi
}

IN="-q q.npy -k k.npy -v v.npy"
VL="--cu-seqlens-q cq.npy --cu-seqlens-k ck.npy"

# ---- run, against the float64 model --------------------------------------------
for args in "--causal" "--window 3,2 --softcap 20" "--impl reference --causal" "--seqused-k used.npy --causal"; do
    tag=$(echo "$args" | tr -c 'a-z0-9' '_')
    if $fa run $IN $VL $args -o "o_$tag.npy" --lse "l_$tag.npy" >out.txt 2>err.txt; then ok
    else bad "run $args: $(cat err.txt)"; continue; fi
    if TESTS="$tests_dir" python3 - "$tag" $args <<'EOF'; then ok; else bad "run $args: wrong output"; fi
import os, sys
import numpy as np
sys.path.insert(0, os.environ["TESTS"])
import ref_numpy
tag, args = sys.argv[1], sys.argv[2:]
opts = dict(causal="--causal" in args)
if "--window" in args:
    opts["window"] = tuple(int(x) for x in args[args.index("--window") + 1].split(","))
if "--softcap" in args:
    opts["softcap"] = float(args[args.index("--softcap") + 1])
used = np.load("used.npy") if "--seqused-k" in args else None
q, k, v, cq, ck = (np.load(f) for f in ("q.npy", "k.npy", "v.npy", "cq.npy", "ck.npy"))
o, lse = np.load(f"o_{tag}.npy"), np.load(f"l_{tag}.npy")
o_ref, lse_ref = ref_numpy.varlen_forward(q, k, v, cq, ck, used, **opts)
errs = []
if o.shape != o_ref.shape or lse.shape != lse_ref.shape:
    errs.append(f"shapes {o.shape} {lse.shape}, expected {o_ref.shape} {lse_ref.shape}")
else:
    e = np.abs(o - o_ref).max()
    if not e <= 2e-6 * np.abs(o_ref).max():
        errs.append(f"O max error {e:.3g}")
    empty = np.isneginf(lse_ref)
    if not np.array_equal(np.isneginf(lse), empty):
        errs.append("LSE -inf rows differ")
    elif np.abs(lse[~empty] - lse_ref[~empty]).max() > 2e-6 * max(1.0, np.abs(lse_ref[~empty]).max()):
        errs.append("LSE error")
if errs:
    print("; ".join(errs)); sys.exit(1)
EOF
done

# ---- check -------------------------------------------------------------------
if $fa check $IN $VL --causal --out o___causal_.npy --lse l___causal_.npy >out.txt 2>err.txt &&
   grep -q "PASS" out.txt; then ok
else bad "check on run's output: exit $? $(cat out.txt err.txt)"; fi
python3 -c "
import numpy as np
o = np.load('o___causal_.npy'); o[7, 1, 2] += 0.05; np.save('o_perturbed.npy', o)"
$fa check $IN $VL --causal --out o_perturbed.npy >out.txt 2>err.txt
rc=$?
if [ "$rc" = 1 ]; then ok; else bad "check on a perturbed output: exit $rc, expected 1 $(cat err.txt)"; fi

# ---- grad and check-grad --------------------------------------------------------
if $fa grad $IN $VL --seqused-k used.npy --causal --dout do.npy --dq gq.npy --dk gk.npy --dv gv.npy \
    >out.txt 2>err.txt; then ok
else bad "grad varlen: $(cat err.txt)"; fi
if TESTS="$tests_dir" python3 - <<'EOF'; then ok; else bad "grad varlen: wrong gradients"; fi
import os, sys
import numpy as np
sys.path.insert(0, os.environ["TESTS"])
import ref_numpy
q, k, v, do, cq, ck, used = (np.load(f) for f in ("q.npy", "k.npy", "v.npy", "do.npy", "cq.npy", "ck.npy", "used.npy"))
want = ref_numpy.varlen_backward(q, k, v, do, cq, ck, used, causal=True)
for f, w in zip(("gq.npy", "gk.npy", "gv.npy"), want):
    g = np.load(f)
    if g.shape != w.shape or not np.abs(g - w).max() <= 1e-5 * np.abs(w).max():
        print(f, g.shape, w.shape); sys.exit(1)
EOF
if $fa check-grad $IN $VL --seqused-k used.npy --causal --dout do.npy --dq gq.npy --dk gk.npy --dv gv.npy \
    >out.txt 2>err.txt && grep -q "^PASS" out.txt; then ok
else bad "check-grad on grad's output: $(cat out.txt err.txt)"; fi
# rows no sequence owns (query rows past cu_seqlens_q[-1], keys past seqused_k) are not judged,
# as check skips them; a wrong element in an owned row fails, named [row, head, col]
if python3 - <<'EOF'; then ok; else bad "check-grad: making gradients with junk in unowned rows failed"; fi
import numpy as np
cq, ck, used = np.load("cq.npy"), np.load("ck.npy"), np.load("used.npy")
gq, gk, gv = np.load("gq.npy"), np.load("gk.npy"), np.load("gv.npy")
gq[cq[-1]:] = 7.0                       # past the last sequence
gk[ck[0] + used[0]:ck[1]] = -3.0        # sequence 0: keys past seqused_k
gv[ck[-1]:] = 5.0
gv[ck[2] + used[2]:ck[3]] = 2.0         # sequence 2: keys past seqused_k
np.save("jq.npy", gq); np.save("jk.npy", gk); np.save("jv.npy", gv)
gq[cq[2] + 3, 1, 4] += 1.0              # sequence 2, its row 3, head 1, column 4
np.save("wq.npy", gq)
EOF
if $fa check-grad $IN $VL --seqused-k used.npy --causal --dout do.npy --dq jq.npy --dk jk.npy --dv jv.npy \
    >out.txt 2>err.txt && grep -q "^PASS" out.txt; then ok
else bad "check-grad judged rows no sequence owns: $(cat out.txt err.txt)"; fi
$fa check-grad $IN $VL --seqused-k used.npy --causal --dout do.npy --dq wq.npy --dk jk.npy --dv jv.npy \
    >out.txt 2>err.txt
rc=$?
if [ "$rc" = 1 ] && grep -q "^dQ FAIL.*worst at (8, 1, 4)" out.txt; then ok
else bad "check-grad on a wrong owned dQ element: exit $rc $(cat out.txt err.txt)"; fi

# ---- bad input -----------------------------------------------------------------
expect_fail "decreasing cu_seqlens_q" "cq_dec.npy: cu_seqlens_q[3] = 4 is less than cu_seqlens_q[2] = 5" \
    $fa run $IN --cu-seqlens-q cq_dec.npy --cu-seqlens-k ck.npy -o o_bad.npy
expect_fail "cu_seqlens_q not from 0" "cq_start.npy: cu_seqlens_q[0] = 2" \
    $fa run $IN --cu-seqlens-q cq_start.npy --cu-seqlens-k ck.npy -o o_bad.npy
expect_fail "cu_seqlens_k past the end" "ck_past.npy: cu_seqlens_k[5] = 41 is past the end of k" \
    $fa run $IN --cu-seqlens-q cq.npy --cu-seqlens-k ck_past.npy -o o_bad.npy
expect_fail "seqused_k too large" "used_big.npy: seqused_k[1] = 5 is outside 0..4" \
    $fa run $IN $VL --seqused-k used_big.npy -o o_bad.npy
expect_fail "float index file" "cq_f32.npy: cu_seqlens_q must be int32" \
    $fa run $IN --cu-seqlens-q cq_f32.npy --cu-seqlens-k ck.npy -o o_bad.npy
expect_fail "mismatched lengths" "ck.npy: cu_seqlens_k has 6 entries, cq_short.npy has 5" \
    $fa run $IN --cu-seqlens-q cq_short.npy --cu-seqlens-k ck.npy -o o_bad.npy
expect_fail "only one cu_seqlens" "--cu-seqlens-q needs --cu-seqlens-k" \
    $fa run $IN --cu-seqlens-q cq.npy -o o_bad.npy
expect_fail "rank-4 Q with varlen" "q4.npy: expected rank 3" \
    $fa run -q q4.npy -k k.npy -v v.npy $VL -o o_bad.npy
expect_fail "no query rows with varlen" "q0.npy: total_q (rows) must be >= 1, got 0" \
    $fa run -q q0.npy -k k.npy -v v.npy --cu-seqlens-q cq0.npy --cu-seqlens-k ck.npy -o o_bad.npy
expect_fail "grad with a bad index file" "cq_dec.npy: cu_seqlens_q[3]" \
    $fa grad $IN --cu-seqlens-q cq_dec.npy --cu-seqlens-k ck.npy --dout do.npy --dq o_bad.npy --dk gk2.npy --dv gv2.npy
expect_fail "check with a bad index file" "ck_past.npy: cu_seqlens_k[5]" \
    $fa check $IN --cu-seqlens-q cq.npy --cu-seqlens-k ck_past.npy --out o___causal_.npy

# ---- non-finite values: only the rows sequences read must be finite (docs/semantics.md) ----
# q rows 25, 26 and k row 39 belong to no sequence; with used.npy key 11 (sequence 1 reads 9, 10)
# and keys 31..38 (sequence 4 reads 20..30) are never read. Row 6 of q is sequence 2's.
python3 -c "
import numpy as np
q = np.load('q.npy'); q[25:] = np.nan; np.save('q_junk.npy', q)
k = np.load('k.npy'); k[39] = np.nan; k[11] = np.inf; k[31:39, 1] = np.nan; np.save('k_junk.npy', k)
q = np.load('q.npy'); q[6, 1, 3] = np.nan; np.save('q_nan.npy', q)
k = np.load('k.npy'); k[30, 0, 5] = -np.inf; np.save('k_inf.npy', k)
g = np.load('do.npy'); g[25:] = np.nan; np.save('do_junk.npy', g)
g = np.load('do.npy'); g[19, 2, 1] = np.inf; np.save('do_inf.npy', g)"
JUNK="-q q_junk.npy -k k_junk.npy -v v.npy $VL --seqused-k used.npy --causal"
if $fa run $JUNK -o o_junk.npy >out.txt 2>err.txt && $fa run $IN $VL --seqused-k used.npy --causal -o o_clean.npy \
    >out.txt 2>err.txt && python3 -c "
import numpy as np, sys
a, b = np.load('o_junk.npy'), np.load('o_clean.npy')
sys.exit(0 if np.array_equal(a[:25], b[:25]) else 1)"; then ok
else bad "run with NaN/Inf only in rows no sequence reads: $(cat err.txt)"; fi
if $fa check $JUNK --out o_clean.npy >out.txt 2>err.txt && grep -q PASS out.txt; then ok
else bad "check with NaN/Inf only in unread rows: exit $? $(cat out.txt err.txt)"; fi
if $fa grad $JUNK --dout do_junk.npy --dq jq.npy --dk jk.npy --dv jv.npy >out.txt 2>err.txt &&
   $fa check-grad $JUNK --dout do_junk.npy --dq gq.npy --dk gk.npy --dv gv.npy >out.txt 2>err.txt && grep -q PASS out.txt &&
   cmp -s jq.npy gq.npy; then ok
else bad "grad/check-grad with NaN/Inf only in unread rows: $(cat out.txt err.txt)"; fi
expect_fail "run, NaN in a row a sequence reads" "q_nan.npy: element [6,1,3] (sequence 2) is NaN" \
    $fa run -q q_nan.npy -k k.npy -v v.npy $VL --causal -o o_bad.npy
expect_fail "run, -Inf in a key a sequence reads" "k_inf.npy: element [30,0,5] (sequence 4) is Inf" \
    $fa run -q q.npy -k k_inf.npy -v v.npy $VL --seqused-k used.npy --causal -o o_bad.npy
expect_fail "check, NaN in a row a sequence reads" "q_nan.npy: element [6,1,3] (sequence 2) is NaN" \
    $fa check -q q_nan.npy -k k.npy -v v.npy $VL --causal --out o___causal_.npy
expect_fail "grad, NaN in a row a sequence reads" "q_nan.npy: element [6,1,3] (sequence 2) is NaN" \
    $fa grad -q q_nan.npy -k k.npy -v v.npy $VL --causal --dout do.npy --dq o_bad.npy --dk gk3.npy --dv gv3.npy
expect_fail "grad, Inf in a dO row a sequence owns" "do_inf.npy: element [19,2,1] (sequence 3) is Inf" \
    $fa grad $IN $VL --causal --dout do_inf.npy --dq o_bad.npy --dk gk3.npy --dv gv3.npy
expect_fail "check-grad, Inf in a dO row a sequence owns" "do_inf.npy: element [19,2,1] (sequence 3) is Inf" \
    $fa check-grad $IN $VL --causal --dout do_inf.npy --dq gq.npy --dk gk.npy --dv gv.npy
expect_fail "check-grad, NaN in a row a sequence reads" "q_nan.npy: element [6,1,3] (sequence 2) is NaN" \
    $fa check-grad -q q_nan.npy -k k.npy -v v.npy $VL --causal --dout do.npy --dq gq.npy --dk gk.npy --dv gv.npy

# every sequence empty: nothing is compared, and check says so (a PASS alone would mislead)
python3 -c "import numpy as np; np.save('cq_empty.npy', np.zeros(6, '<i4'))"
$fa check $IN --cu-seqlens-q cq_empty.npy --cu-seqlens-k ck.npy --out o_perturbed.npy >out.txt 2>err.txt
rc=$?
if [ "$rc" = 0 ] && grep -q "no output row was compared" err.txt; then ok
else bad "all sequences empty: exit $rc, expected 0 with a warning on stderr ($(cat err.txt))"; fi

echo "test_varlen_cli: $pass passed, $fail failed"
[ "$fail" = 0 ]
