# GFLOP/s vs sequence length for each implementation and head dim, from
# `flashattn bench --csv`. Columns are found BY NAME in the header
# (plots/csvcols.awk): impl, pass, seqlen_q, d, gflops, peak_fraction.
# Called as: gnuplot -e "datadir='DIR'; out='FILE.png'" plots/bench_gflops.gp
if (!exists("plotsdir")) plotsdir = 'plots'
set terminal pngcairo size 900,620 font ",11" noenhanced
set output out
set title "flashattn bench: forward GFLOP/s (float32, B=1, H=8, non-causal)"
set xlabel "sequence length N"
set ylabel "GFLOP/s (4 N^2 d per head)"
set logscale x 2
set yrange [0:*]   # from zero: ratios between the lines read true
set key below maxrows 3
set grid
csv = datadir."/bench.csv"
cols(c, w) = sprintf("< awk -F, -v cols=%s -v where=%s -f %s/csvcols.awk '%s'", c, w, plotsdir, csv)
# the measured FMA peak of the ISA and thread count in use: gflops / peak_fraction
stats cols("gflops,peak_fraction", "impl=flash,pass=fwd") using ($2 > 0 ? $1 / $2 : NaN) nooutput name "PK"
peak = PK_max
sel(impl, d) = cols("seqlen_q,gflops", sprintf("impl=%s,pass=fwd,d=%d", impl, d))
plot \
  sel("flash", 128)    using 1:2 with linespoints lw 2 pt 7 lc rgb "#6a0dad" title "flash d=128", \
  sel("flash", 64)     using 1:2 with linespoints lw 2 pt 5 lc rgb "#008b6b" title "flash d=64", \
  sel("blas", 128)     using 1:2 with linespoints lw 1 pt 6 dt 2 lc rgb "#1f77b4" title "standard on OpenBLAS d=128", \
  sel("blas", 64)      using 1:2 with linespoints lw 1 pt 4 dt 2 lc rgb "#c07000" title "standard on OpenBLAS d=64", \
  sel("standard", 128) using 1:2 with linespoints lw 1 pt 2 dt 3 lc rgb "#b22222" title "standard d=128", \
  sel("standard", 64)  using 1:2 with linespoints lw 1 pt 1 dt 3 lc rgb "#404040" title "standard d=64", \
  peak with lines lc rgb "gray40" dt 4 title sprintf("measured FMA peak %.0f", peak)
