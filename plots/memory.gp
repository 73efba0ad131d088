# memory.gp — extra memory against sequence length: standard attention
# materializes the N x N scores (quadratic), flash keeps blocks (flat).
# (flash's own allocations grow only until its shared K/V copy reaches its cap,
# FA_FLASH_SHARED_MAX, 16 MiB by default; then they stay flat.)
# Reads $(datadir)/memory.csv, written by `flashattn bench --pass fwd --csv`
# (one bench process per implementation, so each process's peak RSS is its own).
# Columns are found BY NAME in the CSV header (plots/csvcols.awk): impl, pass,
# seqlen_k, lib_peak_mib (peak of the library's allocation counter, MiB) and
# peak_rss_mib (the process's peak resident set, MiB: inputs included).
# Called as: gnuplot -e "datadir='DIR'; out='FILE.png'" plots/memory.gp
# (plotsdir='plots' and csv='FILE' may be given too; note='...' adds a line to the title).
if (!exists("plotsdir")) plotsdir = 'plots'
if (!exists("csv")) csv = datadir.'/memory.csv'
if (!exists("note")) note = ''
set terminal pngcairo size 900,700 font ",11" noenhanced
set output out
sel(impl, cols) = sprintf("< awk -F, -v cols=%s -v where=impl=%s,pass=fwd -f %s/csvcols.awk '%s'", \
                          cols, impl, plotsdir, csv)
set title "Memory of the forward pass against N (float32, B=1, H=8)".(note eq '' ? '' : "\n".note)
set xlabel "sequence length N (seqlen_q = seqlen_k)"
set ylabel "MiB (log scale)"
set logscale xy 2
set key below center vertical maxrows 4
set bmargin 9
set grid
plot \
  sel("standard", "seqlen_k,lib_peak_mib") using 1:2 with linespoints lw 2 pt 7 lc rgb "#c0392b" \
      title "standard: library allocations (S and P: grows as N^2)", \
  sel("flash", "seqlen_k,lib_peak_mib")    using 1:2 with linespoints lw 2 pt 5 lc rgb "#1f6fb2" \
      title "flash: library allocations (bounded: its blocks plus a shared K/V copy of at most 16 MiB)", \
  sel("standard", "seqlen_k,peak_rss_mib") using 1:2 with linespoints lw 1 pt 6 dt 2 lc rgb "#c0392b" \
      title "standard: peak RSS of the process", \
  sel("flash", "seqlen_k,peak_rss_mib")    using 1:2 with linespoints lw 1 pt 4 dt 2 lc rgb "#1f6fb2" \
      title "flash: peak RSS of the process (the inputs Q, K, V, O grow as N)"
