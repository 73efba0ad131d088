#!/bin/sh
# test_corpus.sh BUILD -- `flashattn run` on every malformed or inconsistent
# .npy file in tests/corpus/bad/ (listed in tests/corpus/cases.tsv).
#
# Ensure each one is answered with exit status 2, exactly one line on stderr
# (naming the bad file when the problem is inside that file), and no output
# file -- not O, not LSE, not a temporary -- left in the output directory.
# The valid trio good_{q,k,v}.npy must run with exit 0 first, so a failure
# below is the bad file's doing.
build=${1:-build}
cli="$build/flashattn"
corpus=tests/corpus
if [ ! -x "$cli" ]; then
    echo "test_corpus: $cli not built; skipped"
    exit 0
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/fa_corpus.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT INT TERM

run_case() { # role file -> runs the CLI with `file` in place of `role`; output in $tmp/out
    q=$corpus/good_q.npy; k=$corpus/good_k.npy; v=$corpus/good_v.npy; alibi=$corpus/good_alibi.npy
    case $1 in q) q=$2 ;; k) k=$2 ;; v) v=$2 ;; alibi) alibi=$2 ;; esac
    rm -rf "$tmp/out"; mkdir "$tmp/out"
    "$cli" run -q "$q" -k "$k" -v "$v" -o "$tmp/out/o.npy" --lse "$tmp/out/lse.npy" \
        --alibi "$alibi" --causal >"$tmp/stdout" 2>"$tmp/stderr"
}

pass=0; fail=0
run_case none none; rc=$?
if [ "$rc" != 0 ]; then
    echo "FAIL good trio: exit $rc: $(cat "$tmp/stderr")"
    exit 1
fi
[ -f "$tmp/out/o.npy" ] && [ -f "$tmp/out/lse.npy" ] || { echo "FAIL good trio wrote no output"; exit 1; }

while IFS='	' read -r file role names_file desc; do
    case $file in '#'*|'') continue ;; esac
    path=$corpus/bad/$file
    run_case "$role" "$path"; rc=$?
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
        echo "FAIL $file ($desc):$why"
        sed 's/^/    stderr: /' "$tmp/stderr" | head -5
    else
        pass=$((pass+1))
    fi
done < $corpus/cases.tsv

echo "test_corpus: $pass passed, $fail failed"
[ "$fail" = 0 ]
