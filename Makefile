# flashattn — one entry point. Targets are the README's vocabulary:
#   all run test bench tutorials plots docs cuda install clean
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
ifeq ($(NO_OMP),1)
OMPFLAGS =
else
OMPFLAGS = -fopenmp
endif

CFLAGS  ?=
CFLAGS  += $(CSTD) $(WARN) $(OPT) $(OMPFLAGS) -fPIC -Iinclude -Isrc
LDLIBS  += -lm
LDFLAGS += $(OMPFLAGS)

# ---- ISA kernels: flags go on the ISA's own file only ----------------------
KERNEL_SRCS = src/kernels/scalar.c src/kernels/dispatch.c
ifeq ($(ARCH),x86_64)
ifneq ($(wildcard src/kernels/avx2.c),)
KERNEL_SRCS += src/kernels/avx2.c
CFLAGS      += -DFA_HAVE_AVX2
endif
ifneq ($(wildcard src/kernels/avx512.c),)
KERNEL_SRCS += src/kernels/avx512.c src/kernels/avx512_transpose.c
CFLAGS      += -DFA_HAVE_AVX512
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

# ---- OpenBLAS (optional, for `flashattn bench --impl blas`) -----------------
# Found by what the link needs (a test link of -lopenblas), never by a header:
# Debian's reference BLAS ships cblas.h without libopenblas.
HAVE_BLAS := $(shell printf 'void cblas_sgemm(void);int main(void){cblas_sgemm();return 0;}' | \
               $(CC) -x c - -o /dev/null -lopenblas >/dev/null 2>&1 && echo 1)
ifeq ($(NO_BLAS),1)
HAVE_BLAS :=
endif
ifeq ($(HAVE_BLAS),1)
CLI_CFLAGS = -DFA_HAVE_BLAS
CLI_LIBS   = -lopenblas
endif

LIB_SRCS = $(filter-out $(wildcard src/kernels/*.c), $(wildcard src/*.c)) $(KERNEL_SRCS)
LIB_OBJS = $(LIB_SRCS:%.c=$(BUILD)/%.o)
CLI_SRCS = $(wildcard src/cli/*.c)
CLI_OBJS = $(CLI_SRCS:%.c=$(BUILD)/%.o)

TEST_SRCS = $(filter-out tests/test_util.c,$(wildcard tests/test_*.c))
TEST_BINS = $(TEST_SRCS:tests/%.c=$(BUILD)/tests/%)

.PHONY: all run test check-deps bench tutorials plots docs cuda install clean sanitize fuzz

all: $(BUILD)/flashattn $(BUILD)/libflashattn.a $(BUILD)/libflashattn.so

# Library objects export only the FA_API names of include/flashattn.h.
$(LIB_OBJS): VISFLAGS = -fvisibility=hidden -DFA_BUILDING_LIBRARY

$(BUILD)/%.o: %.c $(wildcard include/*.h src/*.h src/kernels/*.h src/cli/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(VISFLAGS) $(ISAFLAGS) $(if $(filter src/cli/%,$<),$(CLI_CFLAGS)) -c $< -o $@

# The CLI's objects depend on what was found (OpenBLAS or not): a stamp file
# that changes when CLI_CFLAGS does, so a rebuild never links a stale object.
CLI_STAMP = $(BUILD)/cli-config.$(if $(CLI_CFLAGS),blas,noblas)
$(CLI_STAMP):
	@mkdir -p $(dir $@)
	@rm -f $(BUILD)/cli-config.*
	@touch $@
$(CLI_OBJS): $(CLI_STAMP)

$(BUILD)/libflashattn.a: $(LIB_OBJS)
	@mkdir -p $(dir $@)
	rm -f $@
	ar rcs $@ $^

$(BUILD)/libflashattn.so: $(LIB_OBJS)
	$(CC) -shared $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/flashattn: $(CLI_OBJS) $(BUILD)/libflashattn.a
	$(CC) $(LDFLAGS) -o $@ $(CLI_OBJS) $(BUILD)/libflashattn.a $(CLI_LIBS) $(LDLIBS)

run: $(BUILD)/flashattn
	./$(BUILD)/flashattn demo

# ---- tests ------------------------------------------------------------------
# `make test` installs CMocka (and the other test dependencies) with apt-get
# when they are missing and we are root; otherwise it says what to install.
check-deps:
	@sh tests/check_deps.sh

TEST_SUPPORT = tests/test_util.c
$(BUILD)/tests/%: tests/%.c $(TEST_SUPPORT) tests/test_util.h $(BUILD)/libflashattn.a $(BUILD)/flashattn
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests -o $@ $< $(TEST_SUPPORT) $(BUILD)/libflashattn.a $(LDFLAGS) -lcmocka $(LDLIBS)

test: check-deps
	@$(MAKE) --no-print-directory $(TEST_BINS)
	@sh tests/run_tests.sh $(BUILD)

bench: $(BUILD)/flashattn
	./$(BUILD)/flashattn bench --csv $(BUILD)/bench.csv

docs:
	@mkdir -p $(BUILD)/docs
	doxygen docs/Doxyfile

install: all
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib $(DESTDIR)$(PREFIX)/include
	install -m 755 $(BUILD)/flashattn $(DESTDIR)$(PREFIX)/bin/
	install -m 644 $(BUILD)/libflashattn.a $(BUILD)/libflashattn.so $(DESTDIR)$(PREFIX)/lib/
	install -m 644 include/flashattn.h $(DESTDIR)$(PREFIX)/include/

clean:
	rm -rf $(BUILD)

# Component makefiles (tutorials, plots, cuda, reliability) add their own targets.
-include $(wildcard mk/*.mk)
