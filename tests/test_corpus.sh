#!/bin/sh
# test_corpus.sh BUILD -- `flashattn run`, `grad` and `check` on every malformed
# or inconsistent .npy file in tests/corpus/bad/ (listed in tests/corpus/cases.tsv).
#
# Ensure each one is answered with exit status 2, exactly one line on stderr
# (naming the bad file when the problem is inside that file), and no output
# file -- not O, not LSE, not a gradient, not a temporary -- left in the output
# directory. The valid trio good_{q,k,v}.npy must succeed first with each
# command, so a failure below is the bad file's doing.
build=${1:-build}
cli="$build/flashattn"
corpus=tests/corpus
if [ ! -x "$cli" ]; then
    echo "test_corpus: $cli not built; skipped"
    exit 0
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/fa_corpus.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT INT TERM

# run_case COMMAND ROLE FILE: the command with FILE in place of ROLE's good file;
# outputs go to $tmp/out. good_q.npy doubles as dO and as check's tested output
# (both have Q's shape since d_v = d).
run_case() {
    q=$corpus/good_q.npy; k=$corpus/good_k.npy; v=$corpus/good_v.npy; alibi=$corpus/good_alibi.npy
    case $2 in q) q=$3 ;; k) k=$3 ;; v) v=$3 ;; alibi) alibi=$3 ;; esac
    rm -rf "$tmp/out"; mkdir "$tmp/out"
    case $1 in
    run) "$cli" run -q "$q" -k "$k" -v "$v" -o "$tmp/out/o.npy" --lse "$tmp/out/lse.npy" \
            --alibi "$alibi" --causal ;;
    grad) "$cli" grad -q "$q" -k "$k" -v "$v" --dout $corpus/good_q.npy --dq "$tmp/out/dq.npy" \
            --dk "$tmp/out/dk.npy" --dv "$tmp/out/dv.npy" --alibi "$alibi" --causal ;;
    check) "$cli" check -q "$q" -k "$k" -v "$v" --out $corpus/good_q.npy --alibi "$alibi" --causal \
            --atol 10 --rtol 0 ;;
    esac >"$tmp/stdout" 2>"$tmp/stderr"
}

pass=0; fail=0
for cmd in run grad check; do
    run_case $cmd none none; rc=$?
    if [ "$rc" != 0 ]; then
        echo "FAIL $cmd on the good trio: exit $rc: $(cat "$tmp/stderr")"
        exit 1
    fi
    case $cmd in
    run) [ -f "$tmp/out/o.npy" ] && [ -f "$tmp/out/lse.npy" ] || { echo "FAIL run wrote no output"; exit 1; } ;;
    grad) [ -f "$tmp/out/dq.npy" ] && [ -f "$tmp/out/dv.npy" ] || { echo "FAIL grad wrote no output"; exit 1; } ;;
    esac

    while IFS='	' read -r file role names_file desc; do
        case $file in '#'*|'') continue ;; esac
        path=$corpus/bad/$file
        run_case $cmd "$role" "$path"; rc=$?
        lines=$(grep -c '' "$tmp/stderr")
        left=$(ls -A "$tmp/out")
        why=""
        [ "$rc" = 2 ] || why="$why exit $rc (want 2);"
        [ "$lines" = 1 ] || why="$why $lines stderr lines (want 1);"
        [ -z "$left" ] || why="$why left behind: $left;"
        if [ "$names_file" = 1 ] && ! grep -q "$file" "$tmp/stderr"; then
            why="$why message does not name $file;"
        fi
        if [ -n "$why" ]; then
            fail=$((fail+1))
            echo "FAIL $cmd $file ($desc):$why"
            sed 's/^/    stderr: /' "$tmp/stderr" | head -5
        else
            pass=$((pass+1))
        fi
    done < $corpus/cases.tsv
done

echo "test_corpus: $pass passed, $fail failed"
[ "$fail" = 0 ]
