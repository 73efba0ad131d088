#!/bin/sh
# Make sure the test dependencies are present, each found by a real probe:
# CMocka by compiling and linking a program against it with $CC (the header
# alone proves nothing), valgrind and python3 by running them, numpy and pytest
# by importing them. Installs what is missing with apt-get (and pip for numpy
# and pytest) when we are root; otherwise says in one sentence what to run.
cc=${CC:-cc}
missing=""
cmocka_links() {
    printf '%s\n' '#include <stdarg.h>' '#include <stddef.h>' '#include <setjmp.h>' '#include <stdint.h>' \
        '#include <cmocka.h>' 'int main(void) { cmocka_set_message_output(CM_OUTPUT_STDOUT); return 0; }' |
        $cc -x c - -o /dev/null -lcmocka >/dev/null 2>&1
}
cmocka_links || missing="$missing libcmocka-dev"
valgrind --version >/dev/null 2>&1 || missing="$missing valgrind"   # simulator vs cachegrind test
python3 -c 'pass' >/dev/null 2>&1 || missing="$missing python3 python3-numpy python3-pytest"
# tests/test_install.sh: the example is built with pkg-config; the man page is rendered
pkg-config --version >/dev/null 2>&1 || missing="$missing pkg-config"
man --version >/dev/null 2>&1 || missing="$missing man-db"
groff --version >/dev/null 2>&1 || missing="$missing groff-base"
# Python side (numpy, pytest) for the end-to-end tests: pip first (virtualenvs,
# pyenv), then pip past Debian's externally-managed guard, then Debian's packages.
if python3 -c 'pass' >/dev/null 2>&1 && ! python3 -c "import numpy, pytest" 2>/dev/null; then
    echo "check-deps: installing numpy and pytest" >&2
    python3 -m pip install -q numpy pytest >/dev/null 2>&1 ||
        python3 -m pip install -q --break-system-packages numpy pytest >/dev/null 2>&1 ||
        { [ "$(id -u)" = 0 ] && (apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
              apt-get install -y -qq python3-numpy python3-pytest) >/dev/null 2>&1; }
    if ! python3 -c "import numpy, pytest" 2>/dev/null; then
        echo "make test: numpy and pytest not found and could not be installed; run: python3 -m pip install numpy pytest" >&2
        exit 1
    fi
fi
[ -z "$missing" ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "check-deps: installing$missing with apt-get" >&2
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing) >/dev/null 2>&1 || {
        echo "make test: apt-get install$missing failed; install them and run make test again" >&2; exit 1; }
    if case $missing in *libcmocka-dev*) ! cmocka_links;; *) false;; esac; then
        echo "make test: libcmocka-dev is installed but $cc cannot link -lcmocka" >&2; exit 1
    fi
else
    echo "make test:$missing not found; install it: sudo apt-get install -y$missing" >&2
    exit 1
fi
