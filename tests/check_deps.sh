#!/bin/sh
# Make sure the test dependencies are present. Installs them with apt-get
# when they are missing and we are root; otherwise says exactly what to run.
missing=""
[ -f /usr/include/cmocka.h ] || missing="$missing libcmocka-dev"
command -v valgrind >/dev/null 2>&1 || missing="$missing valgrind"   # simulator vs cachegrind test
command -v python3 >/dev/null 2>&1 || missing="$missing python3 python3-numpy python3-pytest"
# Python side (numpy, pytest) for the end-to-end tests: pip first (virtualenvs,
# pyenv), then pip past Debian's externally-managed guard, then Debian's packages.
if command -v python3 >/dev/null 2>&1 && ! python3 -c "import numpy, pytest" 2>/dev/null; then
    echo "check-deps: installing numpy and pytest" >&2
    python3 -m pip install -q numpy pytest >/dev/null 2>&1 ||
        python3 -m pip install -q --break-system-packages numpy pytest >/dev/null 2>&1 ||
        { [ "$(id -u)" = 0 ] && (apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
              apt-get install -y -qq python3-numpy python3-pytest) >/dev/null 2>&1; } ||
        echo "check-deps: could not install numpy and pytest; run: python3 -m pip install numpy pytest" >&2
fi
[ -z "$missing" ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "check-deps: installing$missing with apt-get" >&2
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing) >/dev/null || {
        echo "check-deps: apt-get install$missing failed" >&2; exit 1; }
else
    echo "check-deps: missing$missing; run: sudo apt-get install -y$missing" >&2
    exit 1
fi
