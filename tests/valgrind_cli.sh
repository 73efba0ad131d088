#!/bin/sh
# valgrind_cli.sh BUILD "VALGRIND COMMAND" -- memcheck the CLI on small inputs.
#
# Ensure `flashattn run` (every implementation, every option, 1 and 2 threads),
# `grad` and `check-grad`, refused inputs, a bad flag, and `flashattn info` run
# under valgrind memcheck
# with zero errors and zero leaks of any kind (--errors-for-leak-kinds=all
# --error-exitcode=99: any report turns into exit status 99).
build=${1:-build}
vg=${2:-valgrind --error-exitcode=99 --leak-check=full --show-leak-kinds=all --errors-for-leak-kinds=all}
cli="$build/flashattn"
c=tests/corpus
tmp=$(mktemp -d "${TMPDIR:-/tmp}/fa_vg.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT INT TERM
fail=0; n=0

check() { # expected-exit description -- command...
    want=$1; what=$2; shift 2
    n=$((n+1))
    $vg "$@" >"$tmp/out" 2>"$tmp/err"; rc=$?
    if [ "$rc" != "$want" ]; then
        fail=$((fail+1))
        echo "FAIL valgrind: $what: exit $rc (want $want)"
        tail -30 "$tmp/err" | sed 's/^/    /'
    fi
}

qkv="-q $c/good_q.npy -k $c/good_k.npy -v $c/good_v.npy"
for impl in flash reference standard; do
    for threads in 1 2; do
        check 0 "run --impl $impl --threads $threads" "$cli" run $qkv -o "$tmp/o.npy" --lse "$tmp/l.npy" \
            --impl $impl --threads $threads --causal --window 2,-1 --softcap 5 --alibi $c/good_alibi.npy
    done
done
check 0 "run with the default options" "$cli" run $qkv -o "$tmp/o.npy"
check 0 "run --dtype-out bf16" "$cli" run $qkv -o "$tmp/o.npy" --dtype-out bf16
check 2 "run on a truncated file" "$cli" run -q $c/bad/truncated_data.npy -k $c/good_k.npy \
    -v $c/good_v.npy -o "$tmp/o2.npy"
check 2 "run on a NaN input" "$cli" run -q $c/bad/nan_value.npy -k $c/good_k.npy \
    -v $c/good_v.npy -o "$tmp/o2.npy"
check 2 "run on mismatched shapes" "$cli" run -q $c/good_q.npy -k $c/bad/mismatched_head_dim.npy \
    -v $c/good_v.npy -o "$tmp/o2.npy" --alibi $c/good_alibi.npy
check 2 "run with a bad alibi file" "$cli" run $qkv -o "$tmp/o2.npy" --alibi $c/bad/alibi_wrong_length.npy
check 2 "run with an unknown flag" "$cli" run $qkv -o "$tmp/o2.npy" --frobnicate
# backward: good_q.npy doubles as dO (same shape [1, 4, 2, 8] since d_v = d)
grads="--dq $tmp/dq.npy --dk $tmp/dk.npy --dv $tmp/dv.npy"
for impl in flash reference; do
    check 0 "grad --impl $impl" "$cli" grad $qkv --dout $c/good_q.npy $grads --impl $impl --threads 2 \
        --causal --softcap 5 --alibi $c/good_alibi.npy
done
check 0 "check-grad on flash's gradients" "$cli" check-grad $qkv --dout $c/good_q.npy $grads \
    --causal --softcap 5 --alibi $c/good_alibi.npy
check 2 "grad with a NaN dO" "$cli" grad $qkv --dout $c/bad/nan_value.npy --dq "$tmp/x.npy" \
    --dk "$tmp/y.npy" --dv "$tmp/z.npy"
check 0 "info" "$cli" info
# diagnosis (issue 13): a top-left kernel's output checked bottom-right, and probe
check 0 "run --align top-left" "$cli" run $qkv -o "$tmp/tl.npy" --lse "$tmp/tll.npy" --causal --align top-left \
    --alibi $c/good_alibi.npy
check 1 "check --diagnose" "$cli" check $qkv --out "$tmp/tl.npy" --lse "$tmp/tll.npy" --causal \
    --alibi $c/good_alibi.npy --diagnose --sample-rows 2
check 0 "probe" "$cli" probe --out "$tmp/probe" --batch 1 --seqlen 16 --heads 2 --heads-k 1 --d 4
# output files (issue 17): a symlinked output, the same file twice, an endless input
# (bench is left to the AddressSanitizer suite: its FMA-peak probe takes minutes under valgrind)
ln -s "$tmp/target.npy" "$tmp/link.npy"
check 0 "run -o a dangling symlink" "$cli" run $qkv -o "$tmp/link.npy" --lse "$tmp/l2.npy"
check 2 "run -o X --lse ./X" "$cli" run $qkv -o "$tmp/x.npy" --lse "$tmp/./x.npy"
check 2 "run -q /dev/zero" "$cli" run -q /dev/zero -k $c/good_k.npy -v $c/good_v.npy -o "$tmp/o3.npy"
echo "valgrind_cli: $((n-fail)) of $n runs clean"
[ "$fail" = 0 ]
