#!/bin/sh
# test_layout.sh — the one-way layout of docs/../DESIGN.md ("Data flows one way"),
# checked on the sources so that it cannot regress (issue 10, item 1):
#   1. the CLI (src/cli/) uses the library like any user: its files include
#      only their own headers (src/cli/*.h) and the public include/flashattn.h,
#      never a header of the library under src/ (internal.h, kernels/kernels.h ...);
#   2. the library (src/*.c, src/*.h, src/kernels/*) never includes the CLI;
#   3. libflashattn.a carries none of the CLI's file code (no fa_npy_* or
#      fa_outfile_* symbol: the .npy reader/writer is src/cli/npy.c).
# The checker is first run on two small trees that break rules 1 and 2, and
# must refuse them: a check that cannot fail proves nothing.
build=${1:-build}
fail=0

# check_tree ROOT: print one line per violation under ROOT/src; exit 1 if any.
check_tree() {
    root=$1
    bad=0
    for f in "$root"/src/cli/*.c "$root"/src/cli/*.h; do
        [ -f "$f" ] || continue
        rel=${f#"$root"/}
        # every include as "x (quotes) or <x (angle brackets), one per line
        for inc in $(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*\(["<][^">]*\)[">].*/\1/p' "$f"); do
            name=${inc#?}
            case $inc in
            '"flashattn.h'|'<flashattn.h') continue ;;
            '"'*/*) : ;;   # a path in quotes (../internal.h, kernels/kernels.h) leaves src/cli/
            '"'*) [ -f "$root/src/cli/$name" ] && continue ;;
            *) # <x>: a system header, unless the library has a header of that name
               [ -f "$root/src/$name" ] || continue ;;
            esac
            case $inc in '"'*) inc="$inc\"" ;; *) inc="$inc>" ;; esac
            echo "test_layout: $rel includes $inc: the CLI may include only src/cli/ headers and flashattn.h"
            bad=1
        done
    done
    for f in "$root"/src/*.c "$root"/src/*.h "$root"/src/kernels/*; do
        [ -f "$f" ] || continue
        rel=${f#"$root"/}
        dir=$(dirname "$f")
        for inc in $(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*\(["<][^">]*\)[">].*/\1/p' "$f"); do
            name=${inc#?}
            case $name in
            cli/*|*/cli/*) : ;;
            *) # a bare name that only the CLI has (npy.h, cli.h) reaches the CLI too
               { [ -f "$root/src/cli/$name" ] && [ ! -f "$dir/$name" ] && [ ! -f "$root/src/$name" ]; } || continue ;;
            esac
            case $inc in '"'*) inc="$inc\"" ;; *) inc="$inc>" ;; esac
            echo "test_layout: library file $rel includes $inc from the CLI (src/cli/)"
            bad=1
        done
    done
    return $bad
}

# --- the checker must catch both directions on a broken copy ------------------
tmp=$(mktemp -d "${TMPDIR:-/tmp}/fa_layout.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT INT TERM
mkdir -p "$tmp/a/src/cli" "$tmp/a/src/kernels" "$tmp/b/src/cli" "$tmp/b/src/kernels" "$tmp/c/src/cli"
printf '#include "flashattn.h"\n' > "$tmp/a/src/internal.h"
printf '#include "kernels.h"\n' > "$tmp/a/src/kernels/kernels.h"
printf '#include <stdio.h>\n#include <sys/stat.h>\n#include "npy.h"\n  #  include "internal.h"\n' > "$tmp/a/src/cli/cmd_x.c"
printf '#include "flashattn.h"\n' > "$tmp/a/src/cli/npy.h"
if check_tree "$tmp/a" >/dev/null; then
    echo "test_layout: FAILED: the checker accepted a CLI file that includes src/internal.h"; fail=1
fi
cp -r "$tmp/a/src" "$tmp/b/" && printf '#include <stdio.h>\n#include "npy.h"\n' > "$tmp/b/src/cli/cmd_x.c"
check_tree "$tmp/b" >/dev/null || { echo "test_layout: FAILED: the checker refused a clean tree"; fail=1; }
printf '#include "internal.h"\n#include "cli/npy.h"\n' > "$tmp/b/src/api.c"
if check_tree "$tmp/b" >/dev/null; then
    echo "test_layout: FAILED: the checker accepted a library file that includes cli/npy.h"; fail=1
fi
printf '#include "kernels.h"\n#include "cli.h"\n' > "$tmp/b/src/api.c" && printf '\n' > "$tmp/b/src/cli/cli.h"
if check_tree "$tmp/b" >/dev/null; then
    echo "test_layout: FAILED: the checker accepted a library file that includes cli.h by its bare name"; fail=1
fi
printf '#include <internal.h>\n' > "$tmp/c/src/cli/cmd_y.c" && printf '\n' > "$tmp/c/src/internal.h"
if check_tree "$tmp/c" >/dev/null; then
    echo "test_layout: FAILED: the checker accepted a CLI file that includes <internal.h>"; fail=1
fi

# --- the real tree ------------------------------------------------------------
check_tree . || fail=1

# --- the built library carries no CLI file code --------------------------------
if [ -f "$build/libflashattn.a" ]; then
    syms=$(nm -g --defined-only "$build/libflashattn.a" 2>/dev/null | grep -E ' (fa_npy_|fa_outfile_|fa_path_resolve)' )
    if [ -n "$syms" ]; then
        echo "test_layout: $build/libflashattn.a defines the CLI's file code:"; echo "$syms" | head -5; fail=1
    fi
    if ar t "$build/libflashattn.a" | grep -qx 'npy.o'; then
        echo "test_layout: $build/libflashattn.a contains npy.o"; fail=1
    fi
else
    echo "test_layout: $build/libflashattn.a missing (build first)"; fail=1
fi

[ $fail -eq 0 ] && echo "test_layout: ok (CLI includes only src/cli/ and flashattn.h; the library never the CLI; no npy.o in the library)"
exit $fail
