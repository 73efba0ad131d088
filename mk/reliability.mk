# mk/reliability.mk — sanitizers, valgrind and fuzzing (issue 6).
#
#   make sanitize      the whole test suite built with clang -fsanitize=address,undefined
#                      into build-san/ (any report aborts: -fno-sanitize-recover=all),
#                      then a valgrind memcheck run of the CLI on small inputs
#                      (zero errors, zero leaks of any kind).
#   make fuzz          libFuzzer harnesses in tests/fuzz/, all at once (CI's minutes), each run
#                      for FUZZ_SECONDS (default 60) from the seed corpus in tests/fuzz/corpus/<name>/;
#                      executions and coverage are summarized in build-fuzz/fuzz-summary.txt.
#   make fuzz-build    only build the harnesses.
#   make fuzz-coverage after `make fuzz`: line/region coverage of each harness's target
#                      code reached by the seeds plus the inputs the fuzzer kept.
#
# OpenMP under the sanitizers: the sanitize suite is built with clang and its own OpenMP
# runtime (libomp), so the threaded paths (per-thread scratch, the shared K/V packing read
# by every thread) run under ASan/UBSan/LSan too; on Debian 12 (clang 14, libomp 14) this
# was clean with no suppressions; since test_determinism grows teams to 16 threads,
# libomp's own team descriptors are reported at exit and tests/lsan.supp suppresses them. The runtimes themselves are not built with the
# sanitizers, and a different libomp/libgomp can make LeakSanitizer report the thread
# pool it keeps until exit; if that happens, SAN_NO_OMP=1 builds the suite without
# OpenMP (every line of our code still runs; the pragmas only split loops), which is
# also clean. valgrind runs the ordinary gcc/libgomp build with --threads 2; libgomp's
# own pool and parked-thread TLS show up there as "still reachable"/"possibly lost" and
# are suppressed by tests/valgrind.supp (each entry says why; "definitely lost" and any
# allocation made by flashattn code are never suppressed).

SAN_BUILD    ?= build-san
SAN_NO_OMP   ?= 0
# On a CPU without AVX-512 the sanitizer and fuzz builds leave the AVX-512 and AMX tables
# out (NO_AVX512=1, Makefile): no test there can run them, and clang-14 with ASan+UBSan
# took 312 s for avx512.c alone on a Zen 1 (avx2.c 113 s) — twice a CI run, past its
# 30 minutes. A CPU with AVX-512 builds and sanitizes them as before.
SAN_NO_AVX512 ?= $(shell grep -qw avx512f /proc/cpuinfo 2>/dev/null || echo 1)
SAN_FLAGS     = -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
# allocator_may_return_null: test_status provokes FA_ERR_NOMEM with a 32 TiB request,
# which ASan would otherwise treat as a fatal error instead of returning NULL.
# FA_SANITIZED tells tests/test_tutorials.sh to skip its valgrind comparison
# (ASan binaries cannot run under valgrind).
# intercept_tls_get_addr=0: up to LLVM 16 / GCC 13 the runtime's __tls_get_addr interceptor
# takes a dynamic TLS block that happens to start 16 bytes past a 4 KiB boundary for a
# pre-2.25 glibc header and reads garbage as its bounds; LeakSanitizer's tracer then
# segfaults at exit ("Tracer caught signal 11 ... LeakSanitizer has encountered a fatal
# error") after every test passed. Seen once here (test_forward, FA_ISA=avx2: libomp's
# threads have dynamic TLS) in ~35 sanitizer runs. google/sanitizers#1409; fixed upstream
# in LLVM 17 ("Fix tls_get_addr handling for glibc >=2.25"); Debian 12 has clang 14.
SAN_ENV       = ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:detect_stack_use_after_return=1:strict_string_checks=1:allocator_may_return_null=1:intercept_tls_get_addr=0 \
                UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 FA_SANITIZED=1 \
                LSAN_OPTIONS=suppressions=$(abspath tests/lsan.supp):print_suppressions=0

VG_BUILD     ?= build-vg
VALGRIND      = valgrind --quiet --error-exitcode=99 --leak-check=full --show-leak-kinds=all \
                --errors-for-leak-kinds=all --track-origins=yes \
                --suppressions=tests/valgrind.supp

FUZZ_BUILD   ?= build-fuzz
FUZZ_SECONDS ?= 60
FUZZ_CC      ?= clang
FUZZ_FLAGS    = -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
FUZZERS       = $(patsubst tests/fuzz/%.c,%,$(wildcard tests/fuzz/fuzz_*.c))

.PHONY: sanitize sanitize-asan sanitize-valgrind fuzz fuzz-build

sanitize: sanitize-asan sanitize-valgrind
	@echo "sanitize: ASan+UBSan suite and valgrind memcheck: clean"

# The suite's own build rules, re-run with clang and the sanitizers in a separate tree.
# CFLAGS/LDFLAGS go through the environment so the top Makefile's `+=` still appends
# the project flags (a command-line CFLAGS= would replace them).
sanitize-asan:
	CFLAGS="$(SAN_FLAGS)" LDFLAGS="$(SAN_FLAGS)" $(SAN_ENV) \
	    $(MAKE) --no-print-directory BUILD=$(SAN_BUILD) CC=clang NO_OMP=$(SAN_NO_OMP) NO_BLAS=1 \
	    NO_AVX512=$(SAN_NO_AVX512) TEST_SO= test

sanitize-valgrind:
	@$(MAKE) --no-print-directory BUILD=$(VG_BUILD) $(VG_BUILD)/flashattn
	@sh tests/valgrind_cli.sh $(VG_BUILD) "$(VALGRIND)"

# ---- fuzzing -----------------------------------------------------------------
# The library is compiled with coverage instrumentation (fuzzer-no-link) and the
# sanitizers into $(FUZZ_BUILD); each harness links it with libFuzzer's main.
# The CLI objects (minus main.c) are linked into the CLI-argument harness, and the
# CLI's .npy reader/writer (src/cli/npy.c, not part of the library) into fuzz_npy.
# (A phony step, not a rule for the .a itself: inside the sub-make BUILD is
# $(FUZZ_BUILD), and a rule here for that file would shadow the top Makefile's.)
FUZZ_LIB = $(FUZZ_BUILD)/libflashattn.a
FUZZ_CLI_OBJS = $(patsubst %.c,$(FUZZ_BUILD)/%.o,$(filter-out src/cli/main.c,$(wildcard src/cli/*.c)))

.PHONY: fuzz-lib
fuzz-lib:
	@CFLAGS="$(FUZZ_FLAGS) -fsanitize=fuzzer-no-link" LDFLAGS="$(FUZZ_FLAGS)" \
	    $(MAKE) --no-print-directory BUILD=$(FUZZ_BUILD) CC=$(FUZZ_CC) NO_OMP=1 NO_BLAS=1 \
	    NO_AVX512=$(SAN_NO_AVX512) $(FUZZ_LIB) $(FUZZ_CLI_OBJS)

$(FUZZ_BUILD)/fuzz_%: tests/fuzz/fuzz_%.c fuzz-lib
	$(FUZZ_CC) -std=c11 -D_POSIX_C_SOURCE=200809L -D_DEFAULT_SOURCE -g -O1 $(FUZZ_FLAGS) \
	    -fsanitize=fuzzer -Iinclude -Isrc -Isrc/cli -o $@ $< \
	    $(if $(filter cli_args,$*),$(FUZZ_CLI_OBJS)) \
	    $(if $(filter npy,$*),$(FUZZ_BUILD)/src/cli/npy.o) \
	    $(FUZZ_LIB) -lm

fuzz-build: $(FUZZERS:%=$(FUZZ_BUILD)/%)

# Each harness: a scratch corpus in $(FUZZ_BUILD)/corpus/<name> (new finds go there,
# the committed seeds stay untouched), bounded time, leak detection on, hangs > 10 s
# and RSS > 2 GiB count as failures. The summary keeps the last status line of each.
fuzz: fuzz-build
	@rm -f $(FUZZ_BUILD)/fuzz-summary.txt
	@for f in $(FUZZERS); do \
	    name=$${f#fuzz_}; mkdir -p $(FUZZ_BUILD)/corpus/$$name $(FUZZ_BUILD)/artifacts; \
	    echo "=== $$f for $(FUZZ_SECONDS) s (the harnesses side by side)"; \
	    rm -f $(FUZZ_BUILD)/$$f.rc; \
	    { ./$(FUZZ_BUILD)/$$f -max_total_time=$(FUZZ_SECONDS) -timeout=10 -rss_limit_mb=2048 \
	        -print_final_stats=1 -detect_leaks=1 -artifact_prefix=$(FUZZ_BUILD)/artifacts/$$f- \
	        $(FUZZ_BUILD)/corpus/$$name tests/fuzz/corpus/$$name >$(FUZZ_BUILD)/$$f.log 2>&1; \
	      echo $$? >$(FUZZ_BUILD)/$$f.rc; } & \
	done; \
	wait; \
	fail=0; \
	for f in $(FUZZERS); do \
	    rc=$$(cat $(FUZZ_BUILD)/$$f.rc 2>/dev/null || echo none); \
	    execs=$$(grep -o 'stat::number_of_executed_units: *[0-9]*' $(FUZZ_BUILD)/$$f.log | grep -o '[0-9]*$$'); \
	    cov=$$(grep -E '^#[0-9]+' $(FUZZ_BUILD)/$$f.log | tail -1 | grep -o 'cov: [0-9]* ft: [0-9]*'); \
	    echo "$$f: exit $$rc, $$execs executions, $$cov" | tee -a $(FUZZ_BUILD)/fuzz-summary.txt; \
	    if [ "$$rc" != 0 ]; then tail -40 $(FUZZ_BUILD)/$$f.log; fail=1; fi; \
	done; \
	exit $$fail

# ---- coverage reached by the fuzz corpora ------------------------------------------
# `make fuzz-coverage` (after `make fuzz`): rebuild each harness with clang's source-based
# coverage, replay the seeds plus everything the fuzzer kept ($(FUZZ_BUILD)/corpus/), and
# report line/region coverage of the code each harness targets.
COV_BUILD   ?= build-cov
COV_FLAGS    = -fprofile-instr-generate -fcoverage-mapping
LLVM_COV    ?= $(firstword $(shell command -v llvm-cov-14 llvm-cov 2>/dev/null))
LLVM_PROFDATA ?= $(firstword $(shell command -v llvm-profdata-14 llvm-profdata 2>/dev/null))
COV_SOURCES_npy       = src/cli/npy.c
COV_SOURCES_cli_args  = src/cli/cli_common.c src/cli/cmd_run.c src/cli/cmd_check.c src/cli/cmd_info.c \
                        src/cli/cmd_grad.c src/cli/cmd_check_grad.c
COV_SOURCES_attention = src/api.c src/flash.c src/reference.c src/standard.c src/backward.c src/kernels/scalar.c \
                        $(wildcard src/kernels/avx512.c)

.PHONY: fuzz-coverage
fuzz-coverage:
	@CFLAGS="$(COV_FLAGS) -fsanitize=fuzzer-no-link" LDFLAGS="$(COV_FLAGS)" \
	    $(MAKE) --no-print-directory BUILD=$(COV_BUILD) CC=$(FUZZ_CC) NO_OMP=1 NO_BLAS=1 DEBUG=1 \
	    $(COV_BUILD)/libflashattn.a $(patsubst $(FUZZ_BUILD)/%,$(COV_BUILD)/%,$(FUZZ_CLI_OBJS)) >/dev/null
	@rm -f $(COV_BUILD)/coverage-summary.txt
	@for f in $(FUZZERS); do \
	    name=$${f#fuzz_}; \
	    $(FUZZ_CC) -std=c11 -D_POSIX_C_SOURCE=200809L -D_DEFAULT_SOURCE -g -O0 $(COV_FLAGS) -fsanitize=fuzzer \
	        -Iinclude -Isrc -Isrc/cli -o $(COV_BUILD)/$$f tests/fuzz/$$f.c \
	        $$( [ $$name = cli_args ] && echo $(patsubst $(FUZZ_BUILD)/%,$(COV_BUILD)/%,$(FUZZ_CLI_OBJS)) ) \
	        $$( [ $$name = npy ] && echo $(COV_BUILD)/src/cli/npy.o ) \
	        $(COV_BUILD)/libflashattn.a -lm || exit 1; \
	    mkdir -p $(FUZZ_BUILD)/corpus/$$name; \
	    LLVM_PROFILE_FILE=$(CURDIR)/$(COV_BUILD)/$$f.profraw ./$(COV_BUILD)/$$f -runs=0 -close_fd_mask=3 \
	        tests/fuzz/corpus/$$name $(FUZZ_BUILD)/corpus/$$name >/dev/null 2>&1 || exit 1; \
	    $(LLVM_PROFDATA) merge -sparse $(COV_BUILD)/$$f.profraw -o $(COV_BUILD)/$$f.profdata || exit 1; \
	    echo "== $$f: coverage of its target code (seeds + $(FUZZ_BUILD)/corpus/$$name)" \
	        | tee -a $(COV_BUILD)/coverage-summary.txt; \
	    case $$name in npy) src="$(COV_SOURCES_npy)";; cli_args) src="$(COV_SOURCES_cli_args)";; \
	        *) src="$(COV_SOURCES_attention)";; esac; \
	    $(LLVM_COV) report ./$(COV_BUILD)/$$f -instr-profile=$(COV_BUILD)/$$f.profdata $$src \
	        | tee -a $(COV_BUILD)/coverage-summary.txt; \
	done
