#!/bin/sh
# test_probes.sh BUILD — an optional dependency the machine lacks is named in
# one sentence, never met as a compiler or linker error (run by run_tests.sh).
#
# Each goal is asked for with its tool replaced by a name that does not exist;
# make must stop before doing anything, exit non-zero, and print exactly one
# line: "make GOAL: TOOL ... not found; install it: apt-get install PACKAGE".
# A compiler that cannot link OpenMP makes the build go on without -fopenmp,
# saying so in one line. (OpenBLAS: tests/hidden_openblas.sh, run by CI.)
# The nested makes drop MAKEFLAGS/CFLAGS/LDFLAGS inherited from a calling make
# (make sanitize exports its flags, -fopenmp included).
build=${1:-build}
root=$(cd "$(dirname "$0")/.." && pwd)
case $build in /*) ;; *) build=$root/$build ;; esac
pass=0; fail=0
tmp=$(mktemp -d "${TMPDIR:-/tmp}/fa_probes.XXXXXX")
trap 'rm -rf "$tmp"' EXIT INT TERM
missing=fa-no-such-tool

# expect_one_sentence GOAL PACKAGE VAR=VALUE...
expect_one_sentence() {
    goal=$1; pkg=$2; shift 2
    # -n: nothing runs even if the probe wrongly passed
    out=$(env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL -u CFLAGS -u LDFLAGS make -C "$root" --no-print-directory -n BUILD="$build" "$goal" "$@" 2>&1)
    rc=$?
    lines=$(printf '%s\n' "$out" | wc -l)
    if [ "$rc" != 0 ] && [ "$lines" = 1 ] &&
        printf '%s\n' "$out" | grep -q "make $goal: $missing.* not found; install it: apt-get install $pkg"; then
        pass=$((pass + 1))
    else
        fail=$((fail + 1))
        echo "FAIL: make $goal $* (exit $rc, $lines lines):"
        printf '%s\n' "$out" | head -5
    fi
}
expect_one_sentence docs doxygen DOXYGEN=$missing
expect_one_sentence plots gnuplot-nox GNUPLOT=$missing
expect_one_sentence fuzz "clang libclang-rt-14-dev" FUZZ_CC=$missing
expect_one_sentence fuzz-build "clang libclang-rt-14-dev" FUZZ_CC=$missing
expect_one_sentence test-neon "gcc-aarch64-linux-gnu libc6-dev-arm64-cross" NEON_CC=$missing
expect_one_sentence test-neon qemu-user NEON_CC=sh QEMU_AARCH64=$missing

# A goal that does not need the tool never looks for it.
if env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL -u CFLAGS -u LDFLAGS make -C "$root" --no-print-directory -n BUILD="$build" all DOXYGEN=$missing GNUPLOT=$missing \
        FUZZ_CC=$missing NEON_CC=$missing >/dev/null 2>&1; then
    pass=$((pass + 1))
else
    fail=$((fail + 1)); echo "FAIL: make all looked for a tool it does not need"
fi

# A compiler without OpenMP: one warning line, then a build with no -fopenmp.
cat >"$tmp/cc-no-omp" <<'EOF'
#!/bin/sh
for a in "$@"; do [ "$a" = -fopenmp ] && { echo "cc-no-omp: no OpenMP here" >&2; exit 1; }; done
exec cc "$@"
EOF
chmod +x "$tmp/cc-no-omp"
out=$(env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL -u CFLAGS -u LDFLAGS make -C "$root" --no-print-directory -n BUILD="$tmp/b" CC="$tmp/cc-no-omp" NO_OMP=0 all 2>&1 >"$tmp/cmds")
if [ "$(printf '%s\n' "$out" | wc -l)" = 1 ] &&
        printf '%s\n' "$out" | grep -q "cannot build OpenMP programs (-fopenmp); building without threads" &&
        grep -q 'cc-no-omp.*-c src/api.c' "$tmp/cmds" && ! grep -q -- '-fopenmp' "$tmp/cmds"; then
    pass=$((pass + 1))
else
    fail=$((fail + 1)); echo "FAIL: compiler without OpenMP: '$out'"; grep -m2 -- '-fopenmp' "$tmp/cmds"
fi

echo "test_probes: $pass passed, $fail failed"
[ "$fail" = 0 ]
