#!/bin/sh
# Run every CMocka suite in $1/tests and the script tests; print one summary
# line "N passed, N failed" and exit non-zero if anything failed.
# Internal: `run_tests.sh --lane BUILD LANE_DIR MAIN_PID SUITE...` is the second lane (below):
# it runs the suites one after another, one line each in LANE_DIR/status, and starts no
# more once the main run (MAIN_PID) is gone.
if [ "${1:-}" = --lane ]; then
    build=$2 lane=$3 main=$4
    shift 4
    echo $$ >"$lane/pid" # its process group when started by setsid
    for name in "$@"; do
        kill -0 "$main" 2>/dev/null || break
        s=$(date +%s)
        case $name in
            *.sh) sh "tests/$name" "$build" >"$lane/$name.log" 2>&1 ;;
            *) if [ -x "$build/tests/$name" ]; then "$build/tests/$name" >"$lane/$name.log" 2>&1
               else echo "$name skip 0" >>"$lane/status"; continue; fi ;;
        esac
        rc=$?
        echo "$name $rc $(($(date +%s) - s))" >>"$lane/status"
    done
    echo done >>"$lane/status"
    exit 0
fi
build=${1:-build}
# From any directory: the build directory made absolute, then the repository root.
case $build in /*) ;; *) build=$(pwd)/$build ;; esac
self=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
cd "$(dirname "$self")/.." || exit 2
pass=0; fail=0; failed=""
# Each suite's wall seconds go to $build/suite-times.txt (slowest first at the end), so CI's
# 30 minutes can be budgeted from a log rather than guessed.
times="$build/suite-times.txt"; : >"$times"
t_start=$(date +%s)
lap() { now=$(date +%s); echo "$((now - t_start)) $1" >>"$times"; t_start=$now; }
# Under the sanitizers (make sanitize sets FA_SANITIZED) the scripts that only
# build, install or package another copy of the project add build time and no
# sanitizer coverage of the library: they run in the plain `make test`.
san_skip="test_install.sh test_python_install.sh test_plots.sh test_probes.sh test_tsan.sh test_neon.sh test_mpi.sh test_mpi_cli.sh"
san_skipped() { [ -n "${FA_SANITIZED:-}" ] && case " $san_skip " in *" $1 "*) true ;; *) false ;; esac; }

# A second lane, on a machine with 2 or more CPUs: the suites in $beside run one after
# another in the background while the loops below run the rest (CI's 30 minutes on a
# 2-core machine: the four took ~225 of `make test`'s ~420 s there, and test_memory
# and test_tutorials.sh ~145 of the sanitized suite's). They were picked because they
# share nothing with the others: their own trees or temporary directories
# (test_neon.sh builds in $build/neon, test_python_install.sh in temporary ones; the
# `test` target links the shared library first, so its editable install has nothing to link),
# nothing timed, no Open MPI (its ranks spin while they wait, and the MPI suites stay
# in the main lane). Their output is printed after the main lane's. The lane runs in a
# process group of its own (setsid), which an interrupt or kill of this run stops too.
# FA_TEST_LANES=1 (or 0) runs everything in one lane, in the old order.
beside=""
# nproc counts the CPUs this process may use (its affinity), but follows OMP_NUM_THREADS
ncpu=$(OMP_NUM_THREADS= OMP_THREAD_LIMIT= nproc 2>/dev/null || getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1)
case ${FA_TEST_LANES:-2} in 0 | 1) ncpu=1 ;; esac
if [ "$ncpu" -ge 2 ] 2>/dev/null; then
    for name in test_neon.sh test_python_install.sh test_tutorials.sh test_memory; do
        san_skipped "$name" || beside="${beside:+$beside }$name"
    done
fi
is_beside() { case " $beside " in *" $1 "*) true ;; *) false ;; esac; }
rm -rf "$build"/lane2 "$build"/lane2.*
lane=$build/lane2.$$ # this run's own: a lane left over from a killed run writes elsewhere
if [ -n "$beside" ]; then
    mkdir -p "$lane"
    if setsid -w true 2>/dev/null; then # -w: wait, should setsid have to fork
        setsid -w sh "$self" --lane "$build" "$lane" $$ $beside &
    else
        sh "$self" --lane "$build" "$lane" $$ $beside &
    fi
    lane_pid=$!
    stop_lane() {
        lp=$(cat "$lane/pid" 2>/dev/null)
        [ -n "$lp" ] && kill -TERM "-$lp" 2>/dev/null # its group (dash takes no "--" here)
        kill -TERM "$lane_pid" 2>/dev/null
    }
    trap 'trap - INT TERM HUP; stop_lane; exit 130' INT TERM HUP
    echo "(beside the loops below, in a second lane: $beside)"
fi

for t in "$build"/tests/test_*; do
    [ -x "$t" ] || continue
    is_beside "$(basename "$t")" && continue
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
for t in tests/test_*.sh; do
    [ -f "$t" ] || continue
    is_beside "$(basename "$t")" && continue
    if san_skipped "$(basename "$t")"; then
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
if [ -n "$beside" ]; then
    echo "=== waiting for the second lane ($beside)"
    wait "$lane_pid"
    trap - INT TERM HUP
    for name in $beside; do
        line=$(grep "^$name " "$lane/status" 2>/dev/null) # "NAME RC SECONDS"
        rc=${line#* } secs=${line##* }
        rc=${rc%% *}
        [ "$rc" = skip ] && continue
        echo "=== $name (ran in the second lane)"
        cat "$lane/$name.log" 2>/dev/null
        if [ -z "$line" ]; then
            echo "$name: no result (the second lane did not finish it)"
            fail=$((fail+1)); failed="$failed $name"
            continue
        fi
        if [ "$rc" = 0 ]; then pass=$((pass+1)); else fail=$((fail+1)); failed="$failed $name"; fi
        echo "$secs $name (second lane)" >>"$times"
    done
    grep -qx done "$lane/status" 2>/dev/null || { fail=$((fail+1)); failed="$failed second-lane"; }
fi
echo
echo "slowest suites (seconds; all in $times):"
sort -rn "$times" | head -8 | sed 's/^/  /'

[ -n "$failed" ] && echo "failed suites:$failed"
echo "suites: $pass passed, $fail failed"
[ "$fail" = 0 ]
