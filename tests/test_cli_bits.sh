#!/bin/sh
# test_cli_bits.sh — `flashattn info`'s recipe for reproducing bits on another machine
# (its last line: FA_ISA=... FA_L2_BYTES=...) reproduces the default bits of every pass, not
# just the forward's; and FA_BLOCK_Q / FA_BLOCK_K at the rule's blocks do too (they stand in
# for the L2 rule, no longer pinning the backward's and decoding's blocks).
#
# Usage: sh tests/test_cli_bits.sh BUILD_DIR   (tests/run_tests.sh passes it)
#
# For each ISA this CPU runs (scalar is slow and has one block rule: skipped), on d = 128:
#   - the forward (run, seqlen_q 300), the backward (grad: its blocks are the forward's
#     capped at 128) and decoding (run, seqlen_q 3: its own key block) with defaults;
#   - the same three under the recipe on "another machine" (FA_L1D_BYTES=32K and 3 threads,
#     the recipe's FA_L2_BYTES replacing a Zen 3's 512K), and under FA_BLOCK_Q/K set to the
#     rule's d = 128 blocks;
#   every output byte for byte equal to the default's.
# And `--block-q`/`--block-k` (the options, which fix every pass's blocks) at values that
# differ from the decode's key block do change the decode's bits (so the comparison above
# can see a difference).
set -u
tests_dir=$(cd "$(dirname "$0")" && pwd)
. "$tests_dir/cli_test_lib.sh"
cli_test_setup test_cli_bits "${1:-build}"

python3 - <<'EOF' || { echo "test_cli_bits.sh: generating inputs failed"; exit 1; }
import numpy as np
rng = np.random.default_rng(20261206)
for name, (sq, sk) in dict(f=(300, 300), d=(3, 1200)).items():
    np.save(f"q{name}.npy", rng.standard_normal((1, sq, 4, 128)).astype("<f4"))
    np.save(f"k{name}.npy", rng.standard_normal((1, sk, 2, 128)).astype("<f4"))
    np.save(f"v{name}.npy", rng.standard_normal((1, sk, 2, 128)).astype("<f4"))
    np.save(f"do{name}.npy", rng.standard_normal((1, sq, 4, 128)).astype("<f4"))
EOF

# passes TAG [ENV...]: the three passes' outputs into TAG_*.npy
passes() {
    tag=$1; shift
    env "$@" "$fa" run -q qf.npy -k kf.npy -v vf.npy -o "${tag}_of.npy" --lse "${tag}_lf.npy" >/dev/null 2>err.txt &&
        env "$@" "$fa" grad -q qf.npy -k kf.npy -v vf.npy --dout dof.npy --dq "${tag}_dq.npy" --dk "${tag}_dk.npy" \
            --dv "${tag}_dv.npy" >/dev/null 2>>err.txt &&
        env "$@" "$fa" run -q qd.npy -k kd.npy -v vd.npy -o "${tag}_od.npy" --lse "${tag}_ld.npy" >/dev/null 2>>err.txt ||
        { bad "$tag: a pass failed: $(cat err.txt)"; return 1; }
}

# same A B: every output of tags A and B byte for byte equal
same() {
    for f in of lf dq dk dv od ld; do
        if ! cmp -s "$1_$f.npy" "$2_$f.npy"; then
            bad "$isa: $2's $f differs from $1's"
            return 1
        fi
    done
    ok
}

isas=$("$fa" info | sed -n 's/^supported: \(.*\) (FA_ISA.*/\1/p')
for isa in $isas; do
    [ "$isa" = scalar ] && continue
    recipe=$(FA_ISA=$isa "$fa" info | tail -1)
    case $recipe in *"FA_ISA=$isa FA_L2_BYTES="*) ok ;;
    *) bad "$isa: info's last line is not a recipe: $recipe"; continue ;; esac
    passes "${isa}_def" FA_ISA="$isa" || continue
    # shellcheck disable=SC2086 # the recipe is words
    passes "${isa}_rec" $recipe && same "${isa}_def" "${isa}_rec"
    # shellcheck disable=SC2086 # (the recipe's FA_L2_BYTES comes last: it wins)
    passes "${isa}_oth" FA_L2_BYTES=512K FA_L1D_BYTES=32K OMP_NUM_THREADS=3 $recipe && same "${isa}_def" "${isa}_oth"
    blocks=$(FA_ISA=$isa "$fa" info | sed -n '/d = 128/,/used:/s/.*used: Br = \([0-9]*\), Bc = \([0-9]*\).*/FA_BLOCK_Q=\1 FA_BLOCK_K=\2/p')
    # shellcheck disable=SC2086
    passes "${isa}_blk" FA_ISA="$isa" $blocks && same "${isa}_def" "${isa}_blk"
    # the options fix decoding's key block too: another key block, other bits
    if FA_ISA=$isa "$fa" run -q qd.npy -k kd.npy -v vd.npy -o "${isa}_opt_od.npy" --block-q 16 --block-k 16 \
            >/dev/null 2>err.txt; then
        if cmp -s "${isa}_def_od.npy" "${isa}_opt_od.npy"; then
            bad "$isa: --block-k 16 left decoding's bits unchanged: the comparison cannot see a block change"
        else ok; fi
    else bad "$isa: run --block-k 16: $(cat err.txt)"; fi
done

echo "test_cli_bits: $pass passed, $fail failed"
[ "$fail" = 0 ]
