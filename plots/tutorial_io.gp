# tutorial_io.gp — slow-tier traffic against the IO-complexity bounds (step 12).
# 12.dat: 1 n 2 d 3 M_bytes 4 b 5 std_bytes 6 std_bound 7 std_ratio 8 flash_bytes 9 flash_bound 10 flash_ratio
# 12_blocks.dat: 1 n 2 d 3 M_bytes 4 b 5 fits 6 flash_bytes 7 flash_bound 8 ratio
if (!exists("datadir")) datadir = 'build/tutorials'
if (!exists("out")) out = 'tutorial_io.png'
set terminal pngcairo size 1300,520 font ",11"
set output out
set multiplot layout 1,3 title "Slow-tier traffic (simulated fast memory of M bytes) against the bounds"
set grid
set logscale x 2
set logscale y 10
set format y "%.0s%c"
set key left top
set xlabel "N"
set ylabel "bytes moved"
plot for [m in "16384 32768 65536"] datadir.'/12.dat' using ($3 == m ? $1 : 1/0):8 with linespoints lw 2 \
         title sprintf("flash, M = %d KiB", m/1024), \
     for [m in "16384 32768 65536"] datadir.'/12.dat' using ($3 == m ? $1 : 1/0):5 with linespoints dt 2 lw 2 \
         title sprintf("standard, M = %d KiB", m/1024)
set logscale x 10
set format x "%.0s%c"
set xlabel "bound (bytes): 4(Nd + N^2) standard, 4 N^2 d^2 / (M/4) flash"
set ylabel "measured bytes"
plot datadir.'/12.dat' using 9:8 with points pt 7 ps 1.3 title "flash", \
     datadir.'/12.dat' using 6:5 with points pt 5 ps 1.3 title "standard", \
     x * 25 with lines dt 2 lc rgb "gray" title "25 x bound", \
     x * 8 with lines dt 3 lc rgb "gray" title "8 x bound"
unset logscale y
set logscale x 2
set format x "%g"
set xlabel "block size b (Br = Bc = b)"
set ylabel "flash bytes moved"
set key right top
plot datadir.'/12_blocks.dat' using 4:($5 != 0 ? $6 : 1/0) with linespoints pt 7 lw 2 title "blocks fit in M", \
     datadir.'/12_blocks.dat' using 4:($5 != 0 ? 1/0 : $6) with points pt 6 ps 1.5 title "blocks overflow M"
unset multiplot
