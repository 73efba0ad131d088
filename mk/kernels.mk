# mk/kernels.mk — the micro-kernel benchmark (issue 3).
#
#   make bench-kernels   single-thread GFLOP/s of qk and pv and ns/score of
#                        softmax and the softcap line for every ISA this CPU runs, next to that
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

# make exp2-ulp        the AVX-512 softmax's base-2 exp: its polynomial over every float
#                      of [-1/2, 1/2], and P against exp(s - m) in double through the
#                      table's softmax (tools/exp2_ulp.c; simd_exp.h quotes it).
.PHONY: exp2-ulp
$(BUILD)/tools/exp2_ulp: tools/exp2_ulp.c $(BUILD)/libflashattn.a src/kernels/kernels.h src/kernels/simd_exp.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< $(BUILD)/libflashattn.a $(LDFLAGS) $(LDLIBS)

exp2-ulp: $(BUILD)/tools/exp2_ulp
	./$(BUILD)/tools/exp2_ulp $(EXP2_ULP_ARGS)
