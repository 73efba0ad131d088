# flashattn — one entry point. Targets are the README's vocabulary:
#   all run test bench tutorials plots docs cuda install uninstall clean
# Options: CC=clang, NO_OMP=1 (build without OpenMP), NATIVE=1 (-march=native),
#          DEBUG=1 (-O0 -g).

CC      ?= gcc
PREFIX  ?= /usr/local
BUILD   ?= build

ARCH    := $(shell uname -m)

CSTD     = -std=c11 -D_POSIX_C_SOURCE=200809L -D_DEFAULT_SOURCE
WARN     = -Wall -Wextra -Wshadow -Wno-unused-parameter
ifeq ($(DEBUG),1)
OPT      = -O0 -g
else
OPT      = -O2 -g
endif
ifeq ($(NATIVE),1)
OPT     += -march=native
endif
# OpenMP: found by a test link of -fopenmp with $(CC) (gcc ships libgomp; clang
# needs libomp-dev). Without it the build goes on single-threaded and says so once.
ifneq ($(NO_OMP),1)
HAVE_OMP := $(shell printf '\043include <omp.h>\nint main(void){return omp_get_max_threads() < 1;}' | \
              $(CC) -fopenmp -x c - -o /dev/null >/dev/null 2>&1 && echo 1)
ifneq ($(HAVE_OMP),1)
$(warning make: $(CC) cannot build OpenMP programs (-fopenmp); building without threads: install libomp-dev (clang) or pass NO_OMP=1)
override NO_OMP := 1
endif
endif
ifeq ($(NO_OMP),1)
OMPFLAGS =
NOOMP_WARN = -Wno-unknown-pragmas # the omp pragmas are meant to be ignored then (one thread)
else
OMPFLAGS = -fopenmp
endif

CFLAGS  ?=
CFLAGS  += $(CSTD) $(WARN) $(NOOMP_WARN) $(OPT) $(OMPFLAGS) -fPIC -Iinclude -Isrc
LDLIBS  += -lm
LDFLAGS += $(OMPFLAGS)

# ---- ISA kernels: flags go on the ISA's own file only ----------------------
KERNEL_SRCS = src/kernels/scalar.c src/kernels/dispatch.c
ifeq ($(ARCH),x86_64)
ifneq ($(wildcard src/kernels/avx2.c),)
KERNEL_SRCS += src/kernels/avx2.c
CFLAGS      += -DFA_HAVE_AVX2
endif
# NO_AVX512=1 leaves the AVX-512 (and AMX) tables out: the sanitizer and fuzz builds do so
# on a CPU that cannot run them (mk/reliability.mk), where clang-14 with ASan+UBSan spent
# ~5 minutes compiling avx512.c alone (Zen 1) for code no test there can execute
ifneq ($(wildcard src/kernels/avx512.c),)
ifneq ($(NO_AVX512),1)
KERNEL_SRCS += src/kernels/avx512.c src/kernels/avx512_transpose.c
CFLAGS      += -DFA_HAVE_AVX512
endif
endif
endif
ifeq ($(ARCH),aarch64)
ifneq ($(wildcard src/kernels/neon.c),)
KERNEL_SRCS += src/kernels/neon.c
CFLAGS      += -DFA_HAVE_NEON
endif
endif
$(BUILD)/src/kernels/avx2.o:   ISAFLAGS = -mavx2 -mfma -mf16c
AVX512FLAGS = -mavx512f -mavx512vl -mavx512bw -mavx512dq -mfma -mf16c
$(BUILD)/src/kernels/avx512.o:           ISAFLAGS = $(AVX512FLAGS)
$(BUILD)/src/kernels/avx512_transpose.o: ISAFLAGS = $(AVX512FLAGS)

# ---- AMX (opt-in at run time: FA_AMX=1; src/kernels/amx.c, src/amx.c) -------
# Built where the compiler knows the AMX and AVX512-BF16 intrinsics (GCC 11+,
# clang 12+); elsewhere src/amx.c says "not here" and the tile code is left out.
AMXFLAGS = $(AVX512FLAGS) -mavx512bf16 -mamx-tile -mamx-bf16
ifeq ($(ARCH)$(NO_AVX512),x86_64)
HAVE_AMX := $(shell printf '\043include <immintrin.h>\nint main(void){_tile_release();return 0;}' | \
              $(CC) $(AMXFLAGS) -x c - -o /dev/null >/dev/null 2>&1 && echo 1)
endif
ifeq ($(HAVE_AMX),1)
KERNEL_SRCS += src/kernels/amx.c
CFLAGS      += -DFA_HAVE_AMX
$(BUILD)/src/kernels/amx.o: ISAFLAGS = $(AMXFLAGS)
endif

# ---- OpenBLAS (optional, for `flashattn bench --impl blas`) -----------------
# Found by what the link needs (a test link of -lopenblas), never by a header:
# Debian's reference BLAS ships cblas.h without libopenblas.
HAVE_BLAS := $(shell printf 'void cblas_sgemm(void);int main(void){cblas_sgemm();return 0;}' | \
               $(CC) -x c - -o /dev/null -lopenblas >/dev/null 2>&1 && echo 1)
ifeq ($(NO_BLAS),1)
HAVE_BLAS :=
endif
# The CLI does not link it: `bench --impl blas` opens it by its soname (dlopen) when asked.
# A linked OpenBLAS runs its constructor in every command, a thread pool whose threads each
# allocate a 128 MiB buffer, and under an address-space limit (ulimit -v) they retry that
# allocation forever: `flashattn --version` never exited (cmd_bench.c, blas_open).
ifeq ($(HAVE_BLAS),1)
BLAS_SONAME := $(shell readelf -d "$$($(CC) -print-file-name=libopenblas.so)" 2>/dev/null | \
                 sed -n 's/.*(SONAME).*\[\(.*\)\].*/\1/p' | head -1)
ifeq ($(BLAS_SONAME),)
$(warning make: -lopenblas links but no shared libopenblas with a soname was found (readelf -d): bench --impl blas is left out)
HAVE_BLAS :=
endif
endif
ifeq ($(HAVE_BLAS),1)
CLI_CFLAGS = -DFA_HAVE_BLAS -DFA_BLAS_SONAME='"$(BLAS_SONAME)"'
CLI_LIBS   = -ldl
endif

LIB_SRCS = $(filter-out $(wildcard src/kernels/*.c), $(wildcard src/*.c)) $(KERNEL_SRCS)
LIB_OBJS = $(LIB_SRCS:%.c=$(BUILD)/%.o)
CLI_SRCS = $(wildcard src/cli/*.c)
CLI_OBJS = $(CLI_SRCS:%.c=$(BUILD)/%.o)

# tests/test_mpi*.c are MPI programs run under mpirun by tests/test_mpi.sh (mk/mpi.mk).
TEST_SRCS = $(filter-out tests/test_util.c tests/test_mpi%.c,$(wildcard tests/test_*.c))
TEST_BINS = $(TEST_SRCS:tests/%.c=$(BUILD)/tests/%)

.PHONY: all run test check-deps bench tutorials plots docs cuda clean sanitize fuzz

all: $(BUILD)/flashattn $(BUILD)/libflashattn.a $(BUILD)/libflashattn.so

# Library objects export only the FA_API names of include/flashattn.h.
$(LIB_OBJS): VISFLAGS = -fvisibility=hidden -DFA_BUILDING_LIBRARY

$(BUILD)/%.o: %.c $(wildcard include/*.h src/*.h src/kernels/*.h src/cli/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(VISFLAGS) $(ISAFLAGS) $(if $(filter src/cli/%,$<),$(CLI_CFLAGS)) -c $< -o $@

# The CLI's objects depend on what was found (OpenBLAS or not): a stamp file
# that changes when CLI_CFLAGS does, so a rebuild never links a stale object.
CLI_STAMP = $(BUILD)/cli-config.$(if $(CLI_CFLAGS),blas-$(BLAS_SONAME),noblas)
$(CLI_STAMP):
	@mkdir -p $(dir $@)
	@rm -f $(BUILD)/cli-config.*
	@touch $@
$(CLI_OBJS): $(CLI_STAMP)

$(BUILD)/libflashattn.a: $(LIB_OBJS)
	@mkdir -p $(dir $@)
	rm -f $@
	ar rcs $@ $^

# Version from the header, the one place it is written.
FA_VER_PART = $(shell sed -n 's/^.define FA_VERSION_$(1) \([0-9][0-9]*\).*/\1/p' include/flashattn.h)
VERSION_MAJOR := $(call FA_VER_PART,MAJOR)
VERSION_MINOR := $(call FA_VER_PART,MINOR)
VERSION_PATCH := $(call FA_VER_PART,PATCH)
VERSION       := $(VERSION_MAJOR).$(VERSION_MINOR).$(VERSION_PATCH)
ifneq ($(words $(VERSION_MAJOR) $(VERSION_MINOR) $(VERSION_PATCH)),3)
$(error Makefile: could not read FA_VERSION_MAJOR/MINOR/PATCH from include/flashattn.h)
endif
# The soname names the ABI. While MAJOR is 0 every MINOR may break it (0.2 ->
# 0.3 changed the fa_options layout: a 0.2 program must not load a 0.3 library
# under the same name), so it is libflashattn.so.0.MINOR (libflashattn.so.0.7);
# from 1.0 on it is libflashattn.so.MAJOR.
SOVERSION     := $(if $(filter 0,$(VERSION_MAJOR)),$(VERSION_MAJOR).$(VERSION_MINOR),$(VERSION_MAJOR))
SONAME        := libflashattn.so.$(SOVERSION)

# The shared library carries its soname (see SOVERSION); the link of that
# name next to it lets programs linked against build/ run from there.
# (relinked when the Makefile changes, so a new soname reaches an existing build/)
$(BUILD)/libflashattn.so: $(LIB_OBJS) Makefile
	$(CC) -shared $(LDFLAGS) -Wl,-soname,$(SONAME) -o $@ $(LIB_OBJS) $(LDLIBS)
	ln -sf libflashattn.so $(BUILD)/$(SONAME)

$(BUILD)/flashattn: $(CLI_OBJS) $(BUILD)/libflashattn.a
	$(CC) $(LDFLAGS) -o $@ $(CLI_OBJS) $(BUILD)/libflashattn.a $(CLI_LIBS) $(LDLIBS)

# The CLI as a command, whether BUILD is relative or absolute.
FA_CLI = $(if $(filter /%,$(BUILD)),,./)$(BUILD)/flashattn

run: $(BUILD)/flashattn
	$(FA_CLI) demo

# ---- tests ------------------------------------------------------------------
# `make test` installs CMocka (and the other test dependencies) with apt-get
# when they are missing and we are root; otherwise it says what to install.
check-deps:
	@CC="$(CC)" sh tests/check_deps.sh

TEST_SUPPORT = tests/test_util.c
# The .npy reader/writer is the CLI's (src/cli/npy.c), not the library's: the
# suites that test it link its object beside the library.
# test_cli_npy tests the CLI's loaders of index and code files (cli_common.c).
NPY_OBJ   = $(BUILD)/src/cli/npy.o
NPY_TESTS = $(BUILD)/tests/test_npy $(BUILD)/tests/test_status
$(NPY_TESTS): $(NPY_OBJ)
$(NPY_TESTS): TEST_OBJS = $(NPY_OBJ)
$(BUILD)/tests/test_cli_npy: $(NPY_OBJ) $(BUILD)/src/cli/cli_common.o
$(BUILD)/tests/test_cli_npy: TEST_OBJS = $(NPY_OBJ) $(BUILD)/src/cli/cli_common.o
$(BUILD)/tests/%: tests/%.c $(TEST_SUPPORT) $(wildcard tests/*.h) $(BUILD)/libflashattn.a $(BUILD)/flashattn
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests -o $@ $< $(TEST_SUPPORT) $(TEST_OBJS) $(BUILD)/libflashattn.a $(LDFLAGS) -lcmocka $(LDLIBS)

# The shared library first: two suites that may run at once (test_install.sh's make install,
# test_python_install.sh's editable install) would otherwise both link it on a fresh tree.
# The sanitizer suite makes none (its Python tests skip): mk/reliability.mk passes TEST_SO=.
TEST_SO ?= $(BUILD)/libflashattn.so
test: check-deps
	@$(MAKE) --no-print-directory $(TEST_BINS) $(TEST_SO)
	@sh tests/run_tests.sh $(BUILD)

bench: $(BUILD)/flashattn
	$(FA_CLI) bench --csv $(BUILD)/bench.csv

DOXYGEN ?= doxygen
docs:
	@mkdir -p $(BUILD)/docs
	$(DOXYGEN) docs/Doxyfile

install: all
# (the install and uninstall rules: mk/install.mk)

clean:
	rm -rf $(BUILD)

# Component makefiles (tutorials, plots, cuda, reliability) add their own targets.
# Order matters where one uses another's variables in a prerequisite list
# (expanded as the file is read): mk/plots.mk needs $(TUT_BINS) from
# mk/tutorials.mk, so the files that define such variables come first.
MK_FIRST := mk/tutorials.mk
include $(MK_FIRST) $(filter-out $(MK_FIRST),$(sort $(wildcard mk/*.mk)))

# ---- optional tools: each found by a real probe -----------------------------
# A goal that needs a tool the machine lacks stops before doing anything, with
# one sentence naming the tool and the package (GNU make's $(error), exit 2);
# goals that do not need it never look for it. `make test` finds CMocka, numpy
# and pytest in tests/check_deps.sh (it installs them when run as root).
, := ,
GOALS := $(or $(MAKECMDGOALS),all)
# $(call fa_need,GOALS,FOUND,WHAT,PACKAGES): FOUND empty means missing.
fa_need = $(if $(filter $(1),$(GOALS)),$(if $(2),,$(error make $(firstword $(filter $(1),$(GOALS))): $(3) not found; install it: apt-get install $(4))))
fa_have = $(shell command -v $(1) 2>/dev/null)
# $(call fa_links,CC,FLAGS,PROGRAM): 1 when CC FLAGS compiles and links PROGRAM.
fa_links = $(shell printf '%s\n' '$(3)' | $(1) $(2) -x c - -o /dev/null >/dev/null 2>&1 && echo 1)

$(call fa_need,docs,$(call fa_have,$(DOXYGEN)),$(DOXYGEN),doxygen)
$(call fa_need,plots plots-tutorials plots-bench plots-memory plots-backward,$(call fa_have,$(GNUPLOT)),$(GNUPLOT),gnuplot-nox)
$(call fa_need,cachegrind sanitize sanitize-valgrind,$(call fa_have,valgrind),valgrind,valgrind)
$(call fa_need,sanitize sanitize-asan,$(call fa_links,clang,$(SAN_FLAGS),int main(void){return 0;}),clang with -fsanitize=address$(,)undefined,clang libclang-rt-14-dev)
$(call fa_need,fuzz fuzz-build fuzz-coverage,$(call fa_links,$(FUZZ_CC),-fsanitize=fuzzer,int LLVMFuzzerTestOneInput(const char *d$(,) unsigned long n){return 0;}),$(FUZZ_CC) with libFuzzer (-fsanitize=fuzzer),clang libclang-rt-14-dev)
$(call fa_need,fuzz-coverage,$(and $(LLVM_COV),$(LLVM_PROFDATA)),llvm-cov and llvm-profdata,llvm)
$(call fa_need,test-neon,$(call fa_have,$(NEON_CC)),$(NEON_CC) (the AArch64 cross compiler),gcc-aarch64-linux-gnu libc6-dev-arm64-cross)
$(call fa_need,test-neon,$(if $(QEMU_AARCH64),$(call fa_have,$(QEMU_AARCH64)),native),$(QEMU_AARCH64),qemu-user)
