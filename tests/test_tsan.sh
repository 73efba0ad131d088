#!/bin/sh
# test_tsan.sh — concurrent first calls under ThreadSanitizer (issue 10).
# Builds the library's C files (scalar kernels, no OpenMP: libgomp is not
# instrumented and would drown the report in false positives; the threads
# here are the caller's pthreads) with -fsanitize=thread into a temporary
# directory, links tests/tsan_first_calls.c, runs it. Skipped, with one
# line, when the compiler cannot build and run a ThreadSanitizer program.
build=${1:-build}
CC=${CC:-cc}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/fa_tsan.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT INT TERM
printf 'int main(void){return 0;}\n' > "$tmp/probe.c"
if ! $CC -fsanitize=thread "$tmp/probe.c" -o "$tmp/probe" >/dev/null 2>&1 || ! "$tmp/probe" >/dev/null 2>&1; then
    echo "test_tsan: SKIPPED: $CC cannot build and run -fsanitize=thread programs here"
    exit 0
fi
srcs=$(ls src/*.c)
flags="-std=c11 -D_POSIX_C_SOURCE=200809L -D_DEFAULT_SOURCE -O1 -g -fsanitize=thread -Iinclude -Isrc -Wno-unknown-pragmas"
objs=""
for f in $srcs src/kernels/scalar.c src/kernels/dispatch.c; do
    o="$tmp/$(echo "$f" | tr / _).o"
    # shellcheck disable=SC2086
    if ! $CC $flags -DFA_BUILDING_LIBRARY -c "$f" -o "$o" 2>> "$tmp/build.log"; then
        cat "$tmp/build.log" >&2
        echo "test_tsan: FAILED to build $f" >&2
        exit 1
    fi
    objs="$objs $o"
done
# shellcheck disable=SC2086
if ! $CC $flags -o "$tmp/tsan_first_calls" tests/tsan_first_calls.c $objs -lpthread -lm 2>> "$tmp/build.log"; then
    cat "$tmp/build.log" >&2
    echo "test_tsan: FAILED to link" >&2
    exit 1
fi
TSAN_OPTIONS="halt_on_error=1 exitcode=66 ${TSAN_OPTIONS:-}" "$tmp/tsan_first_calls"
rc=$?
[ $rc -eq 0 ] || echo "test_tsan: FAILED (exit $rc)" >&2
exit $rc
