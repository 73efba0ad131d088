#!/bin/sh
# The AArch64 build under qemu-user (mk/neon.mk): the NEON kernels against the
# scalar spec (tests/neon/test_kernels_neon.c), the whole library's drivers
# against the float64 reference (tests/neon/test_drivers_neon.c) and the CLI
# (tests/neon/test_cli_neon.sh). Run by tests/run_tests.sh as part of
# `make test`; $1 is the build directory. Without the cross toolchain or qemu
# it says so and skips (exit 0): NEON is then NOT tested on this machine.
build=${1:-build}
cc=${NEON_CC:-aarch64-linux-gnu-gcc}
qemu=${QEMU_AARCH64:-qemu-aarch64}
if [ "$(uname -m)" = aarch64 ]; then
    cc=${NEON_CC:-gcc}; qemu=${QEMU_AARCH64:-}
fi
if ! command -v "$cc" >/dev/null 2>&1 || { [ -n "$qemu" ] && ! command -v "$qemu" >/dev/null 2>&1; }; then
    echo "test_neon: SKIPPED — $cc or $qemu not installed; the NEON build was NOT tested"
    echo "           (apt-get install gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user)"
    exit 0
fi
exec make --no-print-directory BUILD="$build" NEON_CC="$cc" QEMU_AARCH64="$qemu" test-neon
