# tutorial_misses.gp — L1 misses [sim] against N for the attention steps.
# Usage: gnuplot -e "datadir='build/plots/data'; out='x.png'" plots/tutorial_misses.gp
# Columns of NN.dat: 1 n, 8 l1_miss_sim (see TUT_DAT_COLUMNS in tutorials/common.h).
if (!exists("datadir")) datadir = 'build/tutorials'
if (!exists("out")) out = 'tutorial_misses.png'
set terminal pngcairo size 900,600 font ",11"
set output out
set title "L1 misses against sequence length [simulator, one head, d = 64]"
set xlabel "N (sequence length)"
set ylabel "L1 misses (simulated)"
set logscale x 2
set logscale y 10
set format y "%.0s%c"
set key left top
set grid
f(x) = x
plot datadir.'/02.dat' using 1:8 with linespoints lw 2 title "02 naive (S, P stored)", \
     datadir.'/03.dat' using 1:8 with linespoints lw 2 title "03 blocked matmuls", \
     datadir.'/04.dat' using 1:8 with linespoints lw 2 title "04 fused rows", \
     datadir.'/05.dat' using 1:8 with linespoints lw 2 title "05 online, one pass per row", \
     datadir.'/06.dat' using 1:8 with linespoints lw 2 title "06 FlashAttention (K/V outer)", \
     datadir.'/07.dat' using 1:8 with linespoints lw 2 title "07 FlashAttention-2 (Q outer)", \
     datadir.'/07.dat' using 1:($1*$1/2) with lines dt 2 lc rgb "gray" title "N^2 / 2 (slope of N^2)"
