# mk/kernels.mk — the micro-kernel benchmark (issue 3).
#
#   make bench-kernels   single-thread GFLOP/s of qk and pv and ns/score of
#                        softmax for every ISA this CPU runs, next to that
#                        ISA's measured FMA peak (tools/bench_kernels.c).
#                        BENCH_KERNELS_ARGS="avx2" limits it to some ISAs.

.PHONY: bench-kernels

$(BUILD)/tools/bench_kernels: tools/bench_kernels.c $(BUILD)/libflashattn.a src/kernels/kernels.h src/kernels/fma_peak.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< $(BUILD)/libflashattn.a $(LDFLAGS) $(LDLIBS)

bench-kernels: $(BUILD)/tools/bench_kernels
	./$(BUILD)/tools/bench_kernels $(BENCH_KERNELS_ARGS)

# make tanh-ulp        the SIMD tanh's error over every float of |x| < 10 against
#                      tanh in double and libm's tanhf (tools/tanh_ulp.c).
.PHONY: tanh-ulp
$(BUILD)/tools/tanh_ulp: tools/tanh_ulp.c $(BUILD)/libflashattn.a src/kernels/kernels.h src/kernels/simd_exp.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< $(BUILD)/libflashattn.a $(LDFLAGS) $(LDLIBS)

tanh-ulp: $(BUILD)/tools/tanh_ulp
	./$(BUILD)/tools/tanh_ulp $(TANH_ULP_ARGS)
