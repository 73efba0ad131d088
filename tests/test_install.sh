#!/bin/sh
# test_install.sh BUILD — packaging as a C user meets it (run by tests/run_tests.sh).
#
# `make install PREFIX=<temp>` from BUILD, then: every file where it belongs, the
# soname and its links; docs/examples/example.c built with
# `pkg-config --cflags --libs flashattn` against the installed copy (shared and
# static) and run (flash vs the float64 reference on fresh random inputs);
# `nm -D` of the installed .so lists exactly the FA_API functions of the header;
# the man page renders with no groff warning and names every flag the CLI's
# --help texts print; `flashattn --version` / fa_version() report the ISAs;
# `make uninstall` leaves no file behind. Also a DESTDIR staging round trip.
# Prints "N passed, N failed"; exit 1 on any failure.
build=${1:-build}
root=$(cd "$(dirname "$0")/.." && pwd)
case $build in /*) ;; *) build=$root/$build ;; esac
pass=0; fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
check() { # check DESCRIPTION COMMAND...: pass if the command succeeds
    d=$1; shift
    if "$@"; then ok; else bad "$d"; fi
}
for tool in pkg-config nm man groff; do
    command -v $tool >/dev/null 2>&1 || { echo "test_install: $tool not found (make check-deps installs it)"; exit 1; }
done
tmp=$(mktemp -d "${TMPDIR:-/tmp}/fa_install.XXXXXX")
trap 'rm -rf "$tmp"' EXIT INT TERM
prefix=$tmp/prefix
mk() { make -C "$root" --no-print-directory BUILD="$build" "$@"; }

version=$(sed -n 's/^#define FA_VERSION "\(.*\)"/\1/p' "$root/include/flashattn.h")
major=${version%%.*}
# the soname's version: 0.MINOR while MAJOR is 0 (every 0.x may break the ABI), else MAJOR
minor=${version#*.}; minor=${minor%%.*}
if [ "$major" = 0 ]; then sover="0.$minor"; else sover=$major; fi

# ---- install ---------------------------------------------------------------
if ! mk install PREFIX="$prefix" >"$tmp/install.log" 2>&1; then
    cat "$tmp/install.log"; echo "test_install: make install failed"; exit 1
fi
for f in bin/flashattn include/flashattn.h lib/libflashattn.a lib/libflashattn.so.$version \
         lib/pkgconfig/flashattn.pc share/man/man1/flashattn.1; do
    check "installed $f" test -f "$prefix/$f"
done
check "libflashattn.so.$sover -> libflashattn.so.$version" \
    test "$(readlink "$prefix/lib/libflashattn.so.$sover")" = "libflashattn.so.$version"
check "libflashattn.so -> libflashattn.so.$sover" \
    test "$(readlink "$prefix/lib/libflashattn.so")" = "libflashattn.so.$sover"
soname=$(LC_ALL=C readelf -d "$prefix/lib/libflashattn.so.$version" 2>/dev/null |
         sed -n 's/.*(SONAME).*\[\(.*\)\].*/\1/p')
check "soname is libflashattn.so.$sover (got '$soname')" test "$soname" = "libflashattn.so.$sover"

# ---- pkg-config and the example program -------------------------------------
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
check "pkg-config --modversion = $version" test "$(pkg-config --modversion flashattn)" = "$version"
cc=${CC:-cc}
# CFLAGS/LDFLAGS from the environment: under `make sanitize` the library is
# built with the sanitizers and the program must be too.
if $cc -std=c11 -Wall -Wextra -Werror ${CFLAGS:-} -o "$tmp/example" "$root/docs/examples/example.c" \
        $(pkg-config --cflags --libs flashattn) ${LDFLAGS:-} -lm 2>"$tmp/cc.log"; then
    ok
    check "example links libflashattn.so.$sover" sh -c "readelf -d '$tmp/example' | grep -q 'NEEDED.*libflashattn.so.$sover\]'"
    if LD_LIBRARY_PATH="$prefix/lib" "$tmp/example" >"$tmp/ex.out" 2>&1; then ok; else bad "example (shared) failed:"; fi
    cat "$tmp/ex.out"
    check "example reports fa_version()" grep -q "^libflashattn $version (ISA: scalar" "$tmp/ex.out"
else
    cat "$tmp/cc.log"; bad "example.c did not build with pkg-config --cflags --libs flashattn"
fi
if [ -z "${FA_SANITIZED:-}" ]; then # no static ASan runtime
    if $cc -std=c11 -static -o "$tmp/example-static" "$root/docs/examples/example.c" \
            $(pkg-config --cflags --libs --static flashattn) >"$tmp/ccs.log" 2>&1; then
        if "$tmp/example-static" >/dev/null 2>&1; then ok; else bad "example (static) failed"; fi
    else
        cat "$tmp/ccs.log"; bad "example.c did not link statically with pkg-config --static"
    fi
fi

# ---- exported symbols: exactly the FA_API functions of the header ------------
sed -n 's/^FA_API[^(]*[ *]\(fa_[a-z0-9_]*\)(.*/\1/p' "$root/include/flashattn.h" | sort -u >"$tmp/api"
nm -D --defined-only "$prefix/lib/libflashattn.so.$version" | awk '{print $NF}' |
    grep -v -e '^_init$' -e '^_fini$' -e '^_edata$' -e '^_end$' -e '^__bss_start$' | sort -u >"$tmp/exported"
if [ -s "$tmp/api" ] && cmp -s "$tmp/api" "$tmp/exported"; then ok; else
    bad "exported symbols differ from the header's FA_API functions:"; diff "$tmp/api" "$tmp/exported"
fi
check "every exported symbol starts with fa_" sh -c "! grep -v '^fa_' '$tmp/exported'"

# ---- the man page ------------------------------------------------------------
man1=$prefix/share/man/man1/flashattn.1
if MANWIDTH=80 man --warnings -l "$man1" >"$tmp/man.txt" 2>"$tmp/man.err" && [ ! -s "$tmp/man.err" ] &&
        grep -q '^EXIT STATUS' "$tmp/man.txt"; then ok; else bad "man -l warned or failed:"; cat "$tmp/man.err"; fi
if groff -ww -z -man -Tutf8 "$man1" 2>"$tmp/groff.err" && [ ! -s "$tmp/groff.err" ]; then ok; else
    bad "groff -ww warned:"; cat "$tmp/groff.err"; fi
for sec in NAME SYNOPSIS DESCRIPTION COMMANDS 'MASK OPTIONS' ENVIRONMENT 'EXIT STATUS' EXAMPLES 'SEE ALSO'; do
    check "man page section $sec" grep -q "^$sec" "$tmp/man.txt"
done
sed 's/\\-/-/g' "$man1" >"$tmp/man.src"
check "man page .TH names flashattn $version" grep -q "^\.TH FLASHATTN 1 .*\"flashattn $version\"" "$man1"
fa=$prefix/bin/flashattn
for cmd in run check probe grad check-grad bench demo info; do
    check "man page has a section for $cmd" grep -q "^\.SS \"flashattn $cmd\"" "$tmp/man.src"
    "$fa" "$cmd" --help >"$tmp/help" 2>&1
    for flag in $(grep -o -- '--[a-z][a-z0-9-]*' "$tmp/help" | sort -u); do
        check "man page names $cmd's $flag" grep -q -e "$flag\\b" "$tmp/man.src"
    done
done
for var in $(grep -o 'FA_[A-Z0-9_]*\|OMP_NUM_THREADS' "$tmp/help" | sort -u) FA_FLASH_SHARED_MAX; do
    check "man page ENVIRONMENT names $var" grep -q "$var" "$tmp/man.src"
done

# ---- --version / fa_version() ------------------------------------------------
v=$("$fa" --version)
isa=$("$fa" info | sed -n 's/^ISA *: \([a-z0-9]*\).*/\1/p')
check "--version format: '$v'" sh -c "printf '%s\n' '$v' | grep -Eq '^flashattn $version \(ISA: scalar( [a-z0-9]+)* compiled; [a-z0-9]+ in use\)$'"
check "--version's ISA in use is info's ($isa)" sh -c "printf '%s\n' '$v' | grep -q 'compiled; $isa in use)'"
check "FA_ISA=scalar --version" sh -c "FA_ISA=scalar '$fa' --version | grep -q 'scalar in use)'"
check "FA_ISA=bogus --version says none usable" sh -c "FA_ISA=bogus '$fa' --version | grep -q 'none usable: FA_ISA=bogus'"

# ---- uninstall leaves nothing ------------------------------------------------
mk uninstall PREFIX="$prefix" >"$tmp/uninstall.log" 2>&1 || { cat "$tmp/uninstall.log"; bad "make uninstall failed"; }
left=$(find "$prefix" ! -type d)
check "uninstall left no file (left: $left)" test -z "$left"

# ---- DESTDIR staging: files under DESTDIR, paths in the .pc without it --------
stage=$tmp/stage
mk install DESTDIR="$stage" PREFIX=/opt/fa >/dev/null 2>&1 || bad "make install DESTDIR=... failed"
check "DESTDIR install puts the CLI in DESTDIR/PREFIX/bin" test -x "$stage/opt/fa/bin/flashattn"
check "the staged .pc says prefix=/opt/fa" grep -qx 'prefix=/opt/fa' "$stage/opt/fa/lib/pkgconfig/flashattn.pc"
mk uninstall DESTDIR="$stage" PREFIX=/opt/fa >/dev/null 2>&1 || bad "make uninstall DESTDIR=... failed"
left=$(find "$stage" ! -type d)
check "DESTDIR uninstall left no file (left: $left)" test -z "$left"

# ---- install paths the recipes would split or that the .pc cannot carry --------
echo keep >"$tmp/precious"
if mk uninstall PREFIX="$tmp/precious x" >"$tmp/sp.out" 2>&1; then bad "uninstall accepted a PREFIX with a space"
else grep -q "contains whitespace" "$tmp/sp.out" && ok || bad "PREFIX with a space: $(cat "$tmp/sp.out")"; fi
check "uninstall with a spaced PREFIX removed nothing outside it" test -f "$tmp/precious"
if mk install PREFIX=relative-prefix >"$tmp/rel.out" 2>&1; then bad "install accepted a relative PREFIX"
else grep -q "not an absolute path" "$tmp/rel.out" && ok || bad "relative PREFIX: $(cat "$tmp/rel.out")"; fi
check "a refused install created nothing" test ! -e "$root/relative-prefix"

echo "test_install: $pass passed, $fail failed"
[ "$fail" = 0 ]
