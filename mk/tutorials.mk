# mk/tutorials.mk — the tutorial ladder (tutorials/NN_name.c).
#
#   make tutorials                 build every step and run it with its default (small) sizes;
#                                  data files land in $(BUILD)/tutorials/*.dat
#   make tutorial-bins             build only
#   make cachegrind STEP=02 [ARGS="--n 256"]
#                                  run one step's kernel under valgrind's cachegrind with the
#                                  step's cache geometry and compare with the simulator
#
# Each step is one .c file plus tutorials/common.h, linked with the simulator
# (tutorials/cachesim.c) and the library. TUT_LIB may point at another build of
# the library; TUT_CFLAGS adds flags (e.g. TUT_CFLAGS=-march=native for step 09).

TUT_SRCS   := $(sort $(wildcard tutorials/[0-9][0-9]_*.c))
TUT_BINS   := $(TUT_SRCS:tutorials/%.c=$(BUILD)/tutorials/%)
TUT_LIB    ?= $(BUILD)/libflashattn.a
TUT_CFLAGS ?=
# GCC turns a zeroing loop into a call to memset; valgrind would then count those
# stores in memset, not in the kernel, and the cross-check would be off by them.
TUT_NOIDIOM := $(shell $(CC) -fno-tree-loop-distribute-patterns -E -x c /dev/null >/dev/null 2>&1 \
                 && echo -fno-tree-loop-distribute-patterns)

# Without OpenMP (NO_OMP=1) the `omp simd` hints still work with -fopenmp-simd; the
# parallel loop of step 10 then runs on one thread.
ifeq ($(NO_OMP),1)
TUT_NOIDIOM += $(shell $(CC) -fopenmp-simd -E -x c /dev/null >/dev/null 2>&1 && echo -fopenmp-simd) -Wno-unknown-pragmas
endif

.PHONY: tutorial-bins cachegrind
.SECONDARY: $(BUILD)/tutorials/cachesim.o

$(BUILD)/tutorials/%: tutorials/%.c tutorials/common.h tutorials/cachesim.h $(BUILD)/tutorials/cachesim.o $(TUT_LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(TUT_NOIDIOM) $(TUT_CFLAGS) -Itutorials -o $@ $< $(BUILD)/tutorials/cachesim.o \
	    $(TUT_LIB) $(LDFLAGS) $(LDLIBS)

tutorial-bins: $(TUT_BINS)

tutorials: $(TUT_BINS)
	@for t in $(TUT_BINS); do \
	    echo; "$$t" --out $(BUILD)/tutorials || exit 1; \
	done

STEP ?= 02
ARGS ?=
cachegrind: $(TUT_BINS)
	@sh tutorials/cachegrind.sh $(firstword $(filter $(BUILD)/tutorials/$(STEP)_%,$(TUT_BINS))) $(ARGS)

# The CMocka suite compiles step 01 in (to test its softmax functions) and links
# the simulator; building it also builds every step for tests/test_tutorials.sh.
$(BUILD)/tests/test_tutorials: tests/test_tutorials.c tutorials/01_softmax.c tutorials/common.h \
        $(BUILD)/tutorials/cachesim.o $(TEST_SUPPORT) tests/test_util.h $(BUILD)/libflashattn.a $(TUT_BINS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests -Itutorials -o $@ $< $(BUILD)/tutorials/cachesim.o $(TEST_SUPPORT) \
	    $(BUILD)/libflashattn.a $(LDFLAGS) -lcmocka $(LDLIBS)
