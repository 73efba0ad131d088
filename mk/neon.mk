# mk/neon.mk — the NEON build, cross-compiled and run under qemu-user (issues 3, 12).
#
#   make test-neon   1. the kernels: src/kernels/{scalar,neon,dispatch}.c and
#                       tests/neon/test_kernels_neon.c against the scalar spec;
#                    2. the whole library (every src/*.c and the AArch64 kernel
#                       files) as $(BUILD)/neon/libflashattn.a, the CLI as
#                       $(BUILD)/neon/flashattn, and tests/neon/test_drivers_neon.c:
#                       the drivers (flash forward, backward, the decode path over
#                       contiguous, half and paged KV caches with split-KV) through
#                       the public API against the float64 reference;
#                    3. tests/neon/test_cli_neon.sh: the AArch64 CLI (info says
#                       neon; probe, run, check, grad, check-grad on its own files).
#                    All static (qemu needs no sysroot), with OpenMP when
#                    $(NEON_CC) links -fopenmp statically (NEON_NO_OMP=1: without).
#                    Each runner is plain C or sh (no CMocka for arm64 here) and
#                    prints "N passed, N failed"; test-neon fails if any does.
#   Needs: gcc-aarch64-linux-gnu, libc6-dev-arm64-cross, qemu-user.
#   On an AArch64 host NEON_CC=gcc QEMU_AARCH64= runs it natively.

NEON_CC      ?= aarch64-linux-gnu-gcc
NEON_AR      ?= $(if $(filter %gcc,$(NEON_CC)),$(patsubst %gcc,%ar,$(NEON_CC)),ar)
QEMU_AARCH64 ?= qemu-aarch64
NEON_BUILD    = $(BUILD)/neon
NEON_CFLAGS   = $(CSTD) $(WARN) -O2 -g -Iinclude -Isrc -Itests -DFA_HAVE_NEON
NEON_SRCS     = src/kernels/scalar.c src/kernels/neon.c src/kernels/dispatch.c tests/neon/test_kernels_neon.c
NEON_HDRS     = $(wildcard include/*.h src/*.h src/kernels/*.h src/cli/*.h) tests/kernel_checks.h

# OpenMP for the AArch64 build: a static link of -fopenmp (Debian's cross gcc
# ships libgomp.a), probed only when a goal is NEON's (make test-neon, or a
# file under $(NEON_BUILD)/).
ifneq ($(filter test-neon $(NEON_BUILD)/%,$(MAKECMDGOALS)),)
ifneq ($(NEON_NO_OMP),1)
NEON_OMPFLAGS := $(shell printf '\043include <omp.h>\nint main(void){return omp_get_max_threads() < 1;}' | \
                   $(NEON_CC) -fopenmp -static -x c - -o /dev/null >/dev/null 2>&1 && echo -fopenmp)
endif
endif

NEON_LIB_SRCS = $(filter-out $(wildcard src/kernels/*.c), $(wildcard src/*.c)) \
                src/kernels/scalar.c src/kernels/neon.c src/kernels/dispatch.c
NEON_LIB_OBJS = $(NEON_LIB_SRCS:%.c=$(NEON_BUILD)/obj/%.o)
NEON_CLI_OBJS = $(CLI_SRCS:%.c=$(NEON_BUILD)/obj/%.o)
# Objects remember whether they were built with OpenMP (a stamp per choice).
NEON_OMP_STAMP = $(NEON_BUILD)/omp-config.$(if $(NEON_OMPFLAGS),omp,noomp)

.PHONY: test-neon

$(NEON_BUILD)/omp-config.%:
	@mkdir -p $(dir $@)
	@rm -f $(NEON_BUILD)/omp-config.*
	@touch $@

$(NEON_BUILD)/test_kernels_neon: $(NEON_SRCS) $(NEON_HDRS)
	@mkdir -p $(dir $@)
	$(NEON_CC) $(NEON_CFLAGS) -static -o $@ $(NEON_SRCS) -lm

# The library objects as on the host: only the FA_API names visible.
$(NEON_LIB_OBJS): $(NEON_BUILD)/obj/%.o: %.c $(NEON_HDRS) $(NEON_OMP_STAMP)
	@mkdir -p $(dir $@)
	$(NEON_CC) $(NEON_CFLAGS) $(NEON_OMPFLAGS) -fvisibility=hidden -DFA_BUILDING_LIBRARY -c $< -o $@

$(NEON_CLI_OBJS): $(NEON_BUILD)/obj/%.o: %.c $(NEON_HDRS) $(NEON_OMP_STAMP)
	@mkdir -p $(dir $@)
	$(NEON_CC) $(NEON_CFLAGS) $(NEON_OMPFLAGS) -c $< -o $@

$(NEON_BUILD)/libflashattn.a: $(NEON_LIB_OBJS)
	rm -f $@
	$(NEON_AR) rcs $@ $^

# (libgomp.a warns that dlopen in a static program needs glibc's shared
# libraries at run time: it is never called here; the warning is filtered)
$(NEON_BUILD)/flashattn: $(NEON_CLI_OBJS) $(NEON_BUILD)/libflashattn.a
	@rm -f $@
	$(NEON_CC) $(NEON_OMPFLAGS) -static -o $@ $^ -lm 2>$@.log || { cat $@.log; exit 1; }
	@grep -v -e 'dlopen' -e 'goacc_profiling' $@.log || true

$(NEON_BUILD)/test_drivers_neon: tests/neon/test_drivers_neon.c $(NEON_HDRS) $(NEON_BUILD)/libflashattn.a
	@rm -f $@
	$(NEON_CC) $(NEON_CFLAGS) $(NEON_OMPFLAGS) -static -o $@ $< $(NEON_BUILD)/libflashattn.a -lm 2>$@.log || \
	  { cat $@.log; exit 1; }
	@grep -v -e 'dlopen' -e 'goacc_profiling' $@.log || true

test-neon: $(NEON_BUILD)/test_kernels_neon $(NEON_BUILD)/test_drivers_neon $(NEON_BUILD)/flashattn
	@rc=0; \
	echo "== NEON kernels against the scalar spec ($(NEON_BUILD)/test_kernels_neon)"; \
	$(QEMU_AARCH64) $(NEON_BUILD)/test_kernels_neon || rc=1; \
	echo "== the drivers on AArch64 against the float64 reference ($(NEON_BUILD)/test_drivers_neon, $(if $(NEON_OMPFLAGS),OpenMP,no OpenMP))"; \
	$(QEMU_AARCH64) $(NEON_BUILD)/test_drivers_neon || rc=1; \
	echo "== the AArch64 CLI ($(NEON_BUILD)/flashattn)"; \
	QEMU_AARCH64="$(QEMU_AARCH64)" FA_NEON_OMP=$(if $(NEON_OMPFLAGS),1,0) sh tests/neon/test_cli_neon.sh $(NEON_BUILD) || rc=1; \
	exit $$rc
