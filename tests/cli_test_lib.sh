# tests/cli_test_lib.sh — what the CLI test scripts share; sourced, not run.
#
#   . "$(dirname "$0")/cli_test_lib.sh"
#   cli_test_setup NAME BUILD
#
# Sets `fa` (the CLI, absolute path), makes and enters a temporary directory
# removed on exit, and defines ok/bad counters (pass, fail). Exits 1 if the CLI
# is not built; exits 0 with a SKIPPED line if python3 with numpy is missing.
cli_test_setup() {
    cli_test_name=$1
    build=${2:-build}
    case $build in /*) ;; *) build=$(pwd)/$build ;; esac
    fa=$build/flashattn
    [ -x "$fa" ] || { echo "$cli_test_name: $fa not built"; exit 1; }
    if ! python3 -c "import numpy" 2>/dev/null; then
        echo "$cli_test_name: SKIPPED: python3 with numpy is not available (make check-deps installs it)"
        exit 0
    fi
    tmp=$(mktemp -d "${TMPDIR:-/tmp}/fa_$cli_test_name.XXXXXX")
    trap 'rm -rf "$tmp"' EXIT INT TERM
    cd "$tmp" || exit 1
    pass=0
    fail=0
}
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
