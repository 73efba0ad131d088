# mk/mpi.mk — ring attention over Open MPI (issue 16; docs/distributed.md).
#
#   make mpi        build/libflashattn_mpi.a, build/flashattn-mpi and the MPI test program
#
# Built only when MPICC (default mpicc) compiles and links an MPI program (a real
# probe, not a look for the file); without it the part is absent, `make mpi`
# stops with one sentence, and tests/test_mpi.sh skips with one. `make all` and
# `make test` build it when it is found.

# mpicc wraps the compiler of $(CC) (OMPI_CC), so the MPI part and the library
# share one compiler and one OpenMP runtime. Under the sanitizers (make sanitize
# sets FA_SANITIZED) the part is left out: Open MPI's own allocations are not
# leak-clean, and LeakSanitizer would report them.
MPICC ?= mpicc
MPICC_RUN = OMPI_CC="$(CC)" $(MPICC)
HAVE_MPI := $(shell printf '\043include <mpi.h>\nint main(int c, char **v){int p; MPI_Init_thread(&c, &v, MPI_THREAD_FUNNELED, &p); return MPI_Finalize();}\n' | \
              OMPI_CC="$(CC)" $(MPICC) -x c - -o /dev/null >/dev/null 2>&1 && echo 1)

MPI_LIB_OBJS = $(BUILD)/mpi/mpi/ring.o
MPI_CLI_SRCS = $(wildcard src/cli_mpi/*.c)
MPI_CLI_OBJS = $(MPI_CLI_SRCS:src/%.c=$(BUILD)/mpi/%.o)
# The flashattn CLI's shared layer (parsing, .npy files, outputs), linked, not copied.
MPI_CLI_REUSE = $(BUILD)/src/cli/cli_common.o $(BUILD)/src/cli/npy.o
MPI_BINS = $(BUILD)/flashattn-mpi $(BUILD)/libflashattn_mpi.a $(BUILD)/tests/mpi_ring_check

.PHONY: mpi
ifeq ($(HAVE_MPI),1)
mpi: $(MPI_BINS)
ifeq ($(FA_SANITIZED),)
all: $(MPI_BINS)
TEST_BINS += $(MPI_BINS)
endif

$(BUILD)/mpi/%.o: src/%.c src/mpi/flashattn_mpi.h include/flashattn.h $(wildcard src/cli/*.h src/cli_mpi/*.h)
	@mkdir -p $(dir $@)
	$(MPICC_RUN) $(CFLAGS) -Isrc/mpi -Isrc/cli -c $< -o $@

$(BUILD)/libflashattn_mpi.a: $(MPI_LIB_OBJS)
	rm -f $@
	ar rcs $@ $^

$(BUILD)/flashattn-mpi: $(MPI_CLI_OBJS) $(MPI_CLI_REUSE) $(BUILD)/libflashattn_mpi.a $(BUILD)/libflashattn.a
	$(MPICC_RUN) $(LDFLAGS) -o $@ $(MPI_CLI_OBJS) $(MPI_CLI_REUSE) $(BUILD)/libflashattn_mpi.a $(BUILD)/libflashattn.a $(LDLIBS)

$(BUILD)/tests/mpi_ring_check: tests/test_mpi_ring.c $(BUILD)/libflashattn_mpi.a $(BUILD)/libflashattn.a src/mpi/flashattn_mpi.h
	@mkdir -p $(dir $@)
	$(MPICC_RUN) $(CFLAGS) -Isrc/mpi -o $@ $< $(BUILD)/libflashattn_mpi.a $(BUILD)/libflashattn.a $(LDFLAGS) $(LDLIBS)
else
mpi:
	$(error make mpi: $(MPICC) cannot build an MPI program; install Open MPI: apt-get install libopenmpi-dev openmpi-bin)
endif
