# mk/plots.mk — `make plots`: run the measurements, render PNGs with gnuplot.
#
# PNGs go to $(PLOT_DIR). Each figure is one gnuplot script plots/NAME.gp that
# reads `datadir` and writes `out` (both passed with -e). To add a figure:
#   1. write plots/NAME.gp and a rule that produces its data;
#   2. append $(PLOT_DIR)/NAME.png to PLOT_PNGS *above* the `plots:` rule, or
#      add a line `plots: $(PLOT_DIR)/NAME.png` anywhere.
# The GFLOP/s figure draws one core's FMA peak, measured by `flashattn bench`;
# PEAK_GFLOPS=... overrides it.

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
	./$(BUILD)/flashattn bench $(BENCH_PLOT_ARGS) --csv $@

$(PLOT_DIR)/bench_gflops.png: plots/bench_gflops.gp $(PLOT_DATA)/bench.csv
	$(GNUPLOT) -e "datadir='$(PLOT_DATA)'; out='$@'" $<

PLOT_PNGS += $(PLOT_DIR)/bench_gflops.png

# ---- add other figures above this line ---------------------------------------
plots: $(PLOT_PNGS)
	@echo "plots: $(words $^) figures in $(PLOT_DIR)"
