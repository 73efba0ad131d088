#!/bin/sh
# Run every CMocka suite in $1/tests and the script tests; print one summary
# line "N passed, N failed" and exit non-zero if anything failed.
build=${1:-build}
pass=0; fail=0; failed=""
for t in "$build"/tests/test_*; do
    [ -x "$t" ] || continue
    echo "=== $(basename "$t")"
    if "$t"; then pass=$((pass+1)); else fail=$((fail+1)); failed="$failed $(basename "$t")"; fi
done
for t in tests/test_*.sh; do
    [ -f "$t" ] || continue
    echo "=== $(basename "$t")"
    if sh "$t" "$build"; then pass=$((pass+1)); else fail=$((fail+1)); failed="$failed $(basename "$t")"; fi
done
if ls tests/test_*.py >/dev/null 2>&1; then
    echo "=== pytest tests/"
    if FA_BUILD="$build" python3 -m pytest -q tests; then pass=$((pass+1)); else fail=$((fail+1)); failed="$failed pytest"; fi
fi
echo
[ -n "$failed" ] && echo "failed suites:$failed"
echo "suites: $pass passed, $fail failed"
[ "$fail" = 0 ]
