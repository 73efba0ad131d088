# GFLOP/s vs sequence length for each implementation and head dim, from
# `flashattn bench --csv` (columns: impl,pass,isa,threads,batch,heads,heads_k,
# seqlen_q,seqlen_k,d,causal,median_ms,min_ms,max_ms,gflops,peak_fraction,peak_rss_mib).
# Called as: gnuplot -e "datadir='DIR'; out='FILE.png'" plots/bench_gflops.gp
set terminal pngcairo size 900,620 font ",11" noenhanced
set output out
set datafile separator ","
set title "flashattn bench: forward GFLOP/s (float32, B=1, H=8, non-causal)"
set xlabel "sequence length N"
set ylabel "GFLOP/s (4 N^2 d per head)"
set logscale x 2
set key below maxrows 3
set grid
csv = datadir."/bench.csv"
# the measured FMA peak of the ISA and thread count in use: gflops / peak_fraction
stats csv using ((strcol(1) eq "flash" && $16 > 0) ? $15 / $16 : NaN) every ::1 nooutput name "PK"
peak = PK_max
sel(impl, d) = sprintf("< awk -F, '$1==\"%s\" && $10==%d' %s", impl, d, csv)
plot \
  sel("flash", 128)    using 8:15 with linespoints lw 2 pt 7 title "flash d=128", \
  sel("flash", 64)     using 8:15 with linespoints lw 2 pt 5 title "flash d=64", \
  sel("blas", 128)     using 8:15 with linespoints lw 1 pt 6 dt 2 title "standard on OpenBLAS d=128", \
  sel("blas", 64)      using 8:15 with linespoints lw 1 pt 4 dt 2 title "standard on OpenBLAS d=64", \
  sel("standard", 128) using 8:15 with linespoints lw 1 pt 2 dt 3 title "standard d=128", \
  sel("standard", 64)  using 8:15 with linespoints lw 1 pt 1 dt 3 title "standard d=64", \
  peak with lines lc rgb "gray40" dt 4 title sprintf("measured FMA peak %.0f", peak)
