# backward.gp — GFLOP/s of flash's backward pass next to its forward pass.
# Reads $(datadir)/backward.csv, written by `flashattn bench --impl flash
# --pass fwd,bwd --csv`. Columns are found BY NAME in the CSV header
# (plots/csvcols.awk): impl, pass, seqlen_k, d, gflops. One line per
# (pass, head dim) present in the data (head dims: the `d` column's values).
# Called as: gnuplot -e "datadir='DIR'; out='FILE.png'" plots/backward.gp
# (plotsdir='plots' and csv='FILE' may be given too; note='...' adds a line to the title).
if (!exists("plotsdir")) plotsdir = 'plots'
if (!exists("csv")) csv = datadir.'/backward.csv'
if (!exists("note")) note = ''
set terminal pngcairo size 900,620 font ",11" noenhanced
set output out
sel(pass, d) = sprintf("< awk -F, -v cols=seqlen_k,gflops -v where=impl=flash,pass=%s,d=%s -f %s/csvcols.awk '%s'", \
                       pass, d, plotsdir, csv)
# the head dims in the data, sorted, as a word list
dims = system(sprintf("awk -F, -v cols=d -f %s/csvcols.awk '%s' | sort -n -u | tr '\\n' ' '", plotsdir, csv))
if (words(dims) == 0) { print "backward.gp: no rows in ".csv; exit status 1 }
set title "flash: backward against forward GFLOP/s (float32, B=1, H=8, non-causal)".(note eq '' ? '' : "\n".note)
set xlabel "sequence length N"
set ylabel "GFLOP/s (as flashattn bench counts them)"
set logscale x 2
set yrange [0:*]
set key below maxrows 2
set grid
# one colour per head dim: forward solid, backward dashed
plot \
  for [i=1:words(dims)] sel("fwd", word(dims, i)) using 1:2 with linespoints lw 2 pt 7 lc i \
      title "forward d=".word(dims, i), \
  for [i=1:words(dims)] sel("bwd", word(dims, i)) using 1:2 with linespoints lw 2 dt 2 pt 5 lc i \
      title "backward d=".word(dims, i)
