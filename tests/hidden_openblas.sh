#!/bin/sh
# hidden_openblas.sh [make goals...] — prove that a fresh clone builds and runs
# without OpenBLAS on a machine where OpenBLAS IS installed (run by .ci/run).
#
# In a private mount namespace (unshare -m, so nothing outside sees it), every
# file that `-lopenblas` resolves to is hidden: Debian keeps the real .so/.a in
# a directory of their own (.../openblas-pthread/), which gets an empty tmpfs
# mounted over it; a real file anywhere else gets /dev/null bound over it. Then
# the same test link the Makefile uses must fail, a fresh clone is built with
# the given goals (default: run), and the built CLI must say that `bench
# --impl blas` is not built and must not be linked against OpenBLAS.
# Needs root (mount namespaces). Exit 0 = proven, 1 = not.
set -eu
cc=${CC:-cc}
blas_links() {
    printf 'void cblas_sgemm(void);int main(void){cblas_sgemm();return 0;}\n' |
        $cc -x c - -o /dev/null -lopenblas >/dev/null 2>&1
}
root=$(cd "$(dirname "$0")/.." && pwd)
if [ "${FA_HIDDEN_INSIDE:-}" != 1 ]; then
    if ! blas_links; then
        echo "hidden_openblas: OpenBLAS is not installed, so there is nothing to hide; install libopenblas-dev to run this check" >&2
        exit 1
    fi
    FA_HIDDEN_INSIDE=1 exec unshare -m sh "$0" "$@"
fi

# ---- inside the private mount namespace -------------------------------------
for round in 1 2 3 4; do
    blas_links || break
    for name in libopenblas.so libopenblas.a; do
        p=$($cc -print-file-name=$name)
        [ "$p" = "$name" ] && continue             # not on the search path
        real=$(readlink -f "$p")
        [ -e "$real" ] || continue                  # already hidden (dangling link)
        dir=$(dirname "$real")
        case $(basename "$dir") in
            *openblas*) mount -t tmpfs none "$dir"; echo "hidden_openblas: hid $dir (tmpfs)" ;;
            *) mount --bind /dev/null "$real"; echo "hidden_openblas: hid $real (/dev/null)" ;;
        esac
    done
done
if blas_links; then
    echo "hidden_openblas: could not hide OpenBLAS: $cc still links -lopenblas" >&2
    exit 1
fi
echo "hidden_openblas: $cc can no longer link -lopenblas"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/fa-noblas.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
git clone -q "$root" "$tmp/src"
[ $# -gt 0 ] || set -- run
for goal in "$@"; do # one after the other: `make test` is not timed against a demo
    make -C "$tmp/src" --no-print-directory -j2 "$goal"
done
cli=$tmp/src/build/flashattn
if ldd "$cli" | grep -qi openblas; then
    echo "hidden_openblas: FAIL: the CLI is linked against OpenBLAS" >&2; exit 1
fi
rc=0
msg=$("$cli" bench --impl blas --n 64 --d 64 --repeats 1 2>&1) || rc=$?
echo "flashattn bench --impl blas: $msg (exit $rc)"
if [ "$rc" != 2 ] || ! printf '%s\n' "$msg" | grep -q "not built"; then
    echo "hidden_openblas: FAIL: expected 'not built' and exit 2 from bench --impl blas" >&2; exit 1
fi
"$cli" --version
echo "hidden_openblas: make $* and the CLI work with OpenBLAS hidden: 1 passed, 0 failed"
