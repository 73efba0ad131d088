#!/bin/sh
# Run every CMocka suite in $1/tests and the script tests; print one summary
# line "N passed, N failed" and exit non-zero if anything failed.
build=${1:-build}
pass=0; fail=0; failed=""
# Each suite's wall seconds go to $build/suite-times.txt (slowest first at the end), so CI's
# 30 minutes can be budgeted from a log rather than guessed.
times="$build/suite-times.txt"; : >"$times"
t_start=$(date +%s)
lap() { now=$(date +%s); echo "$((now - t_start)) $1" >>"$times"; t_start=$now; }
for t in "$build"/tests/test_*; do
    [ -x "$t" ] || continue
    echo "=== $(basename "$t")"
    if "$t"; then pass=$((pass+1)); else fail=$((fail+1)); failed="$failed $(basename "$t")"; fi
    lap "$(basename "$t")"
done
# The drivers under every ISA the CPU runs (the loop above used the one chosen at start-up).
isas=$("$build"/flashattn info 2>/dev/null | sed -n 's/^supported: \(.*\) (FA_ISA.*/\1/p')
[ -n "$isas" ] || { echo "flashattn info lists no supported ISA"; fail=$((fail+1)); failed="$failed isa-list"; }
chosen=$("$build"/flashattn info 2>/dev/null | sed -n 's/^ISA *: \([a-z0-9]*\).*/\1/p')
for isa in $isas; do
    [ "$isa" = "$chosen" ] && continue # ran above
    # Under the sanitizers the portable kernels' drivers are left to the plain `make test`
    # (CI's 30 minutes): their loops are C without SIMD tails, and test_kernels still runs
    # them under ASan against the spec; the SIMD tables (the chosen one, avx2) keep theirs.
    if [ -n "${FA_SANITIZED:-}" ] && [ "$isa" = scalar ]; then
        echo "=== FA_ISA=scalar driver suites: skipped under the sanitizers (run in make test)"
        continue
    fi
    for s in test_forward test_backward test_determinism test_robustness test_varlen test_geometry test_kvcache test_align test_decode test_sinks test_dropout; do
        echo "=== $s (FA_ISA=$isa)"
        if FA_ISA=$isa "$build/tests/$s"; then pass=$((pass+1)); else fail=$((fail+1)); failed="$failed $s/$isa"; fi
        lap "$s/$isa"
    done
done
# Under the sanitizers (make sanitize sets FA_SANITIZED) the scripts that only
# build, install or package another copy of the project add build time and no
# sanitizer coverage of the library: they run in the plain `make test`.
san_skip="test_install.sh test_python_install.sh test_plots.sh test_probes.sh test_tsan.sh test_neon.sh test_mpi.sh test_mpi_cli.sh"
for t in tests/test_*.sh; do
    [ -f "$t" ] || continue
    if [ -n "${FA_SANITIZED:-}" ] && echo " $san_skip " | grep -q " $(basename "$t") "; then
        echo "=== $(basename "$t"): skipped under the sanitizers (runs in make test)"
        continue
    fi
    echo "=== $(basename "$t")"
    if sh "$t" "$build"; then pass=$((pass+1)); else fail=$((fail+1)); failed="$failed $(basename "$t")"; fi
    lap "$(basename "$t")"
done
if ls tests/test_*.py >/dev/null 2>&1; then
    echo "=== pytest tests/"
    if FA_BUILD="$build" python3 -m pytest -q tests; then pass=$((pass+1)); else fail=$((fail+1)); failed="$failed pytest"; fi
    lap pytest
fi
echo
echo "slowest suites (seconds; all in $times):"
sort -rn "$times" | head -8 | sed 's/^/  /'

[ -n "$failed" ] && echo "failed suites:$failed"
echo "suites: $pass passed, $fail failed"
[ "$fail" = 0 ]
