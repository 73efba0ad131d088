#!/bin/sh
# Make sure the test dependencies are present. Installs them with apt-get
# when they are missing and we are root; otherwise says exactly what to run.
missing=""
[ -f /usr/include/cmocka.h ] || missing="$missing libcmocka-dev"
command -v python3 >/dev/null 2>&1 || missing="$missing python3"
# Python side (numpy, pytest) for the end-to-end tests: from PyPI if missing.
if command -v python3 >/dev/null 2>&1 && ! python3 -c "import numpy, pytest" 2>/dev/null; then
    echo "check-deps: installing numpy and pytest with pip" >&2
    python3 -m pip install -q numpy pytest >/dev/null 2>&1 || \
        echo "check-deps: pip install numpy pytest failed; python tests will fail" >&2
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
