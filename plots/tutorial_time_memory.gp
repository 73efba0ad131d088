# tutorial_time_memory.gp — time and workspace against N for the attention steps.
# Columns of NN.dat: 1 n, 5 time_ms, 7 ws_bytes.
if (!exists("datadir")) datadir = 'build/tutorials'
if (!exists("out")) out = 'tutorial_time_memory.png'
set terminal pngcairo size 1200,500 font ",11"
set output out
set multiplot layout 1,2 title "Tutorial steps: time and extra memory against N (one head, d = 64, one thread)"
set logscale x 2
set logscale y 10
set format y "%.0s%c"
set grid
set xlabel "N"
set key left top
set ylabel "time (ms, median)"
plot for [s in "02 03 04 05 06 07"] datadir.'/'.s.'.dat' using 1:5 with linespoints lw 2 title s
set ylabel "workspace (bytes) beyond Q, K, V, O"
set logscale y 10
plot for [s in "02 03 04 05 06 07"] datadir.'/'.s.'.dat' using 1:($7 > 0 ? $7 : 1) with linespoints lw 2 title s
unset multiplot
