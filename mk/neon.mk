# mk/neon.mk — the NEON kernels, cross-compiled and run under qemu-user (issue 3).
#
#   make test-neon   builds src/kernels/{scalar,neon,dispatch}.c and
#                    tests/neon/test_kernels_neon.c with $(NEON_CC) into
#                    $(BUILD)/neon/ (static, so qemu needs no sysroot) and runs
#                    the result with $(QEMU_AARCH64). The runner is plain C
#                    (no CMocka for arm64 here) sharing tests/kernel_checks.h
#                    with the x86 suite; it prints "N passed, N failed".
#   Needs: gcc-aarch64-linux-gnu, libc6-dev-arm64-cross, qemu-user.
#   On an AArch64 host NEON_CC=gcc QEMU_AARCH64= runs it natively.

NEON_CC      ?= aarch64-linux-gnu-gcc
QEMU_AARCH64 ?= qemu-aarch64
NEON_BUILD    = $(BUILD)/neon
NEON_CFLAGS   = $(CSTD) $(WARN) -O2 -g -Iinclude -Isrc -Itests -DFA_HAVE_NEON
NEON_SRCS     = src/kernels/scalar.c src/kernels/neon.c src/kernels/dispatch.c tests/neon/test_kernels_neon.c
NEON_HDRS     = $(wildcard include/*.h src/*.h src/kernels/*.h) tests/kernel_checks.h

.PHONY: test-neon

$(NEON_BUILD)/test_kernels_neon: $(NEON_SRCS) $(NEON_HDRS)
	@mkdir -p $(dir $@)
	$(NEON_CC) $(NEON_CFLAGS) -static -o $@ $(NEON_SRCS) -lm

test-neon: $(NEON_BUILD)/test_kernels_neon
	$(QEMU_AARCH64) $<
