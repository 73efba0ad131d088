# tutorial_gflops.gp — GFLOP/s of each tutorial step at N = 512, d = 64.
# gflops.dat: label gflops (written by plots/tutorial_data.sh). Optional: peak (GFLOP/s) draws a line.
if (!exists("datadir")) datadir = 'build/tutorials'
if (!exists("out")) out = 'tutorial_gflops.png'
set terminal pngcairo size 1000,550 font ",11"
set output out
set title "GFLOP/s per tutorial step (N = 512, d = 64; one thread unless marked)"
set style data histograms
set style fill solid 0.7 border -1
set boxwidth 0.8
set logscale y 10
set yrange [0.5:*]
set ylabel "GFLOP/s (4 N^2 d / time; causal: half)"
set xtics rotate by -30
set grid y
if (exists("peak") && peak > 0) {
    set yrange [0.5:peak * 2]
    set arrow from graph 0, first peak to graph 1, first peak nohead dt 2 lw 2 lc rgb "red"
    set label sprintf("one core's FMA peak, %.0f GFLOP/s", peak) at graph 0.02, first peak * 1.15 tc rgb "red"
}
plot datadir.'/gflops.dat' using 2:xtic(1) notitle
