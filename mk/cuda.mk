# mk/cuda.mk — the CUDA ladder (cuda/NN_*.cu) and its harness build/cuda/flashattn-cuda.
#
#   make cuda          build the rungs and the harness with nvcc (without nvcc: says so, succeeds)
#   make cuda-test     the harness's CPU-side self-test (no GPU needed; what CI runs)
#   make cuda-regs     ptxas's register / spill report of the tensor-core rungs (04*, 05*)
#   sh cuda/run_h200.sh OUTDIR   on a GPU machine: build, validate and time the grid, PyTorch SDPA beside it
#   sh cuda/run_tc.sh OUTDIR     on a GPU machine: validate rungs 04/04b everywhere, time 03/04 vs SDPA
#   sh cuda/run_tc2.sh OUTDIR    on the H200: 04b/04bd validation and timings, ncu, sanitizers
#   sh cuda/run_tc3.sh OUTDIR    on the H200: rungs 05/05ws validated and timed beside 03/04/04b and SDPA
#   sh cuda/run_tc4.sh OUTDIR    on the H200: rung 05pp (ping-pong) validated, sanitized, timed beside 05ws and SDPA
#
# The harness links libflashattn.a: every rung is validated by the library's own fa_check.
# Targets: sm_90 machine code plus compute_80 PTX (portable: the driver compiles it for any
# later GPU). Nothing in rungs 01-04b needs sm_90a (no wgmma/setmaxnreg): 04's mma.sync, ldmatrix
# and cp.async are sm_80 instructions. Rung 05 (wgmma) is Hopper's own: sm_90a machine code only
# (HOPPER_ARCH; the -gencode form, see the device notes); on another GPU its launch fails with
# "no kernel image", which the harness reports.
# NVCC=..., CUDA_ARCH=..., HOPPER_ARCH=..., NVCCFLAGS=... override.

NVCC      ?= nvcc
CUDA_ARCH ?= -gencode arch=compute_90,code=sm_90 -gencode arch=compute_80,code=compute_80
HOPPER_ARCH ?= -gencode arch=compute_90a,code=sm_90a
NVCCFLAGS ?= -O3 -std=c++17 -lineinfo
HAVE_NVCC := $(shell command -v $(NVCC) 2>/dev/null)
CUDA_DIR  := $(BUILD)/cuda
CUDA_SRCS := $(sort $(wildcard cuda/[0-9][0-9]*.cu)) cuda/fma_probe.cu cuda/flashattn_cuda.cu
CUDA_OBJS := $(CUDA_SRCS:cuda/%.cu=$(CUDA_DIR)/%.o)
CUDA_BIN  := $(CUDA_DIR)/flashattn-cuda
CUDA_CSV  ?= cuda/results/h200.csv

.PHONY: cuda-test

ifeq ($(HAVE_NVCC),)
cuda cuda-test:
	@echo "make $@: nvcc not found, so the CUDA ladder is not built (install the CUDA toolkit or set NVCC=/path/to/nvcc)."
else
cuda: $(CUDA_BIN)

cuda-test: $(CUDA_BIN)
	$(CUDA_BIN) --self-test
endif

$(CUDA_DIR)/%.o: cuda/%.cu cuda/common.cuh cuda/ladder.h cuda/mma.cuh include/flashattn.h
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) $(if $(filter 05%,$*),$(HOPPER_ARCH),$(CUDA_ARCH)) $(if $(filter 04% 05%,$*),$(TC_PTXAS)) $(if $(OMPFLAGS),-Xcompiler $(OMPFLAGS)) -Iinclude -c $< -o $@

# The tensor-core rungs (04*) hold their tiles in registers: a spill to local memory is a build
# error for them, not a silent slowdown. `make cuda-regs` prints ptxas's register/spill report.
TC_PTXAS := -Xptxas -warn-spills,-Werror
.PHONY: cuda-regs
cuda-regs:
	@for f in $(sort $(wildcard cuda/04*.cu cuda/05*.cu)); do \
	    case $$f in cuda/05*) arch="$(HOPPER_ARCH)";; *) arch="-gencode arch=compute_90,code=sm_90";; esac; \
	    echo "== $$f ($$arch)"; \
	    $(NVCC) $(NVCCFLAGS) $$arch -Xptxas -v -Iinclude -c $$f -o /dev/null 2>&1 | \
	        sed -n 's/.*Compiling entry function .\(_Z[A-Za-z0-9_]*\).*/\1/p; s/^ptxas info *: Used/  Used/p; s/^ *\([0-9]* bytes stack.*\)/  \1/p' | \
	        { command -v c++filt >/dev/null && c++filt || cat; }; \
	done

$(CUDA_BIN): $(CUDA_OBJS) $(BUILD)/libflashattn.a
	$(NVCC) $(CUDA_ARCH) -o $@ $(CUDA_OBJS) $(BUILD)/libflashattn.a $(if $(OMPFLAGS),-Xcompiler $(OMPFLAGS)) -lm

# `make plots` draws the ladder against PyTorch SDPA from the committed CSV, when it is there.
# With the tensor-core run's CSV (CUDA_TC_CSV) it also draws build/plots/cuda_tensor.png: rungs
# 03-05ws and SDPA's backends at the target shape, forward and backward, from that one run.
CUDA_TC_CSV ?= cuda/results/tc3/h200_tc3.csv
# And from the ping-pong run's CSV (CUDA_PP_CSV), build/plots/cuda_pingpong.png: 05ws, 05pp and SDPA's
# forward backends at the target shape, from that one run.
CUDA_PP_CSV ?= cuda/results/tc4/h200_tc4.csv
ifneq ($(wildcard $(CUDA_CSV)),)
plots: $(BUILD)/plots/cuda_ladder.png
$(BUILD)/plots/cuda_ladder.png: plots/cuda_ladder.gp $(CUDA_CSV)
	@mkdir -p $(dir $@)
	$(or $(GNUPLOT),gnuplot) -e "csv='$(CUDA_CSV)'; out='$@'" $<
ifneq ($(wildcard $(CUDA_TC_CSV)),)
plots: $(BUILD)/plots/cuda_tensor.png
$(BUILD)/plots/cuda_tensor.png: plots/cuda_ladder.gp $(CUDA_CSV) $(CUDA_TC_CSV)
	@mkdir -p $(dir $@)
	$(or $(GNUPLOT),gnuplot) -e "csv='$(CUDA_CSV)'; out='$(BUILD)/plots/cuda_ladder.png'; tc='$(CUDA_TC_CSV)'; out_tc='$@'" $<
endif
ifneq ($(wildcard $(CUDA_PP_CSV)),)
plots: $(BUILD)/plots/cuda_pingpong.png
$(BUILD)/plots/cuda_pingpong.png: plots/cuda_ladder.gp $(CUDA_CSV) $(CUDA_PP_CSV)
	@mkdir -p $(dir $@)
	$(or $(GNUPLOT),gnuplot) -e "csv='$(CUDA_CSV)'; out='$(BUILD)/plots/cuda_ladder.png'; tc='$(CUDA_PP_CSV)'; out_tc='$@'; tc_title='05ws vs 05pp (ping-pong) vs PyTorch SDPA forward on one H200, same run (bf16, d = 128, N = 16384, 16 heads)'" $<
endif
endif
