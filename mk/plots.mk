# mk/plots.mk — `make plots`: run the measurements, render PNGs with gnuplot.
#
# PNGs go to $(PLOT_DIR). Figures: the tutorial steps (4), flashattn bench's
# GFLOP/s vs N, extra memory vs N, backward vs forward GFLOP/s. Each figure is
# one gnuplot script plots/NAME.gp that reads `datadir` and writes `out` (both
# passed with -e). To add a figure:
#   1. write plots/NAME.gp and a rule that produces its data;
#   2. append $(PLOT_DIR)/NAME.png to PLOT_PNGS *above* the `plots:` rule, or
#      add a line `plots: $(PLOT_DIR)/NAME.png` anywhere.
# The GFLOP/s figure draws one core's FMA peak, measured by `flashattn bench`;
# PEAK_GFLOPS=... overrides it.

# The tutorial figures need the tutorial programs built first: $(TUT_BINS) comes
# from mk/tutorials.mk, which the top Makefile includes before this file.
# (An empty list is fine: a source tree without tutorials/, as in the Python sdist.)
ifeq ($(origin TUT_BINS),undefined)
$(error mk/plots.mk: TUT_BINS is not defined; the Makefile must include mk/tutorials.mk before mk/plots.mk)
endif

PLOT_DIR    := $(BUILD)/plots
PLOT_DATA   := $(PLOT_DIR)/data
PEAK_GFLOPS ?= 0
GNUPLOT     ?= gnuplot

# ---- tutorials: one measurement run feeds four figures ----------------------
TUT_PLOT_STAMP := $(PLOT_DATA)/tutorials.stamp
TUT_PLOTS      := tutorial_misses tutorial_time_memory tutorial_io tutorial_gflops

$(TUT_PLOT_STAMP): $(TUT_BINS) plots/tutorial_data.sh $(BUILD)/flashattn
	@mkdir -p $(PLOT_DATA)
	@echo "plots: running the tutorial steps (about a minute)"
	sh plots/tutorial_data.sh $(BUILD) $(PLOT_DATA)
	@touch $@

$(PLOT_DIR)/tutorial_%.png: plots/tutorial_%.gp $(TUT_PLOT_STAMP)
	$(GNUPLOT) -e "datadir='$(PLOT_DATA)'; out='$@'; \
	    peak=$(if $(filter-out 0,$(PEAK_GFLOPS)),$(PEAK_GFLOPS),$$(cat $(PLOT_DATA)/peak.txt 2>/dev/null || echo 0))" $<

PLOT_PNGS += $(TUT_PLOTS:%=$(PLOT_DIR)/%.png)

# ---- flashattn bench: GFLOP/s vs N per implementation -----------------------
BENCH_PLOT_ARGS ?= --n 512,1024,2048,4096 --d 64,128 --repeats 3
$(PLOT_DATA)/bench.csv: $(BUILD)/flashattn
	@mkdir -p $(PLOT_DATA)
	@echo "plots: running flashattn bench (a minute or two)"
	$(FA_CLI) bench $(BENCH_PLOT_ARGS) --csv $@

$(PLOT_DIR)/bench_gflops.png: plots/bench_gflops.gp $(PLOT_DATA)/bench.csv
	$(GNUPLOT) -e "datadir='$(PLOT_DATA)'; out='$@'" $<

PLOT_PNGS += $(PLOT_DIR)/bench_gflops.png

# ---- extra memory vs N (standard quadratic, flash flat) and backward vs forward --
# Both read `flashattn bench --csv` columns BY NAME (plots/csvcols.awk), so new
# or reordered columns do not break them. Memory: one bench process per
# implementation, so each peak RSS (a process high-water mark) is that
# implementation's own; lib_peak_mib is the library's allocation counter.
MEM_PLOT_ARGS  ?= --n 512,1024,2048,4096,8192 --d 64 --repeats 1
PASS_PLOT_ARGS ?= --n 512,1024,2048,4096 --d 64,128 --repeats 3
PASS_NEEDS      = the memory and backward figures need 'flashattn bench --pass fwd,bwd' \
                  with a lib_peak_mib CSV column
$(PLOT_DATA)/memory.csv: $(BUILD)/flashattn plots/csvcols.awk
	@mkdir -p $(PLOT_DATA)
	@echo "plots: flashattn bench --pass fwd, flash then standard (extra memory vs N)"
	@for impl in flash standard; do \
	    $(FA_CLI) bench --impl $$impl --pass fwd $(MEM_PLOT_ARGS) --csv $@.$$impl || { \
	        rm -f $@.flash $@.standard; echo "make plots: flashattn bench --pass failed; $(PASS_NEEDS)" >&2; exit 1; }; \
	done
	@awk -F, -v cols=lib_peak_mib -f plots/csvcols.awk $@.flash >/dev/null || { \
	    echo "make plots: $(PASS_NEEDS)" >&2; exit 1; }
	@{ cat $@.flash; tail -n +2 $@.standard; } >$@.tmp && mv $@.tmp $@ && rm -f $@.flash $@.standard

$(PLOT_DATA)/backward.csv: $(BUILD)/flashattn plots/csvcols.awk
	@mkdir -p $(PLOT_DATA)
	@echo "plots: flashattn bench --impl flash --pass fwd,bwd (backward vs forward GFLOP/s)"
	@$(FA_CLI) bench --impl flash --pass fwd,bwd $(PASS_PLOT_ARGS) --csv $@.tmp || { \
	    rm -f $@.tmp; echo "make plots: flashattn bench --pass fwd,bwd failed; $(PASS_NEEDS)" >&2; exit 1; }
	@mv $@.tmp $@

$(PLOT_DIR)/memory.png: plots/memory.gp $(PLOT_DATA)/memory.csv
	$(GNUPLOT) -e "datadir='$(PLOT_DATA)'; out='$@'" $<

$(PLOT_DIR)/backward.png: plots/backward.gp $(PLOT_DATA)/backward.csv
	$(GNUPLOT) -e "datadir='$(PLOT_DATA)'; out='$@'" $<

PLOT_PNGS += $(PLOT_DIR)/memory.png $(PLOT_DIR)/backward.png

# ---- add other figures above this line ---------------------------------------
# Groups, for rendering part of the set: make plots-tutorials / plots-bench /
# plots-memory / plots-backward.
.PHONY: plots-tutorials plots-bench plots-memory plots-backward
plots-tutorials: $(TUT_PLOTS:%=$(PLOT_DIR)/%.png)
plots-bench: $(PLOT_DIR)/bench_gflops.png
plots-memory: $(PLOT_DIR)/memory.png
plots-backward: $(PLOT_DIR)/backward.png

plots: $(PLOT_PNGS)
	@echo "plots: $(words $^) figures in $(PLOT_DIR)"
