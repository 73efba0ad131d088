#!/bin/sh
# test_plots.sh BUILD — the memory and backward figures read bench's CSV columns
# BY NAME (run by tests/run_tests.sh).
#
# On the hand-made sample plots/sample/bench_pass.csv (not a measurement) and on
# the same rows with the columns in reverse order: plots/csvcols.awk must pick
# the same values from both; a missing column must be an error naming it; and
# gnuplot (when installed) must render plots/memory.gp and plots/backward.gp
# from both files, and plots/bench_gflops.gp from docs/figures/bench.csv with
# its columns reversed. plots/median_rows.awk must rebuild docs/figures/backward.csv
# (the README's backward figure) from the three committed device runs, and keep the
# median run of a row whose runs' columns come in different orders.
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root" || exit 1
pass=0; fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/fa_plots.XXXXXX")
trap 'rm -rf "$tmp"' EXIT INT TERM
sample=plots/sample/bench_pass.csv
awk -F, 'BEGIN { OFS = "," } { for (i = NF; i >= 1; i--) printf "%s%s", $i, (i > 1 ? "," : "\n") }' \
    "$sample" >"$tmp/reversed.csv"
cols() { awk -F, -v cols="$1" -v where="$2" -f plots/csvcols.awk "$3"; }

# the same selections from both column orders, and they are what the file says
for q in "seqlen_k,lib_peak_mib|impl=standard,pass=fwd" "seqlen_k,peak_rss_mib|impl=flash,pass=fwd" \
         "seqlen_k,gflops|impl=flash,pass=bwd,d=64" "d|"; do
    c=${q%%|*}; w=${q#*|}
    a=$(cols "$c" "$w" "$sample"); b=$(cols "$c" "$w" "$tmp/reversed.csv")
    if [ -n "$a" ] && [ "$a" = "$b" ]; then ok; else bad "csvcols $c where $w: '$a' vs '$b'"; fi
done
# by hand from the sample: standard's lib_peak_mib at N=1024 is 16.50, flash's bwd gflops 210.00
[ "$(cols seqlen_k,lib_peak_mib impl=standard,pass=fwd,seqlen_k=1024 "$tmp/reversed.csv")" = "1024 16.50" ] &&
    ok || bad "standard lib_peak_mib at N=1024"
[ "$(cols gflops impl=flash,pass=bwd,seqlen_q=512 "$tmp/reversed.csv")" = "210.00" ] && ok || bad "flash bwd gflops"
# a column that is not there is an error that names it
err=$(cols seqlen_k,no_such_col impl=flash "$sample" 2>&1 >/dev/null); rc=$?
if [ "$rc" = 2 ] && printf '%s\n' "$err" | grep -q "has no column 'no_such_col'"; then ok; else
    bad "missing column: exit $rc, '$err'"; fi
# the README's backward figure data is the median run of each row of the three committed runs
med=$(awk -F, -f plots/median_rows.awk docs/examples/device_backward_r1.csv docs/examples/device_backward_r2.csv \
      docs/examples/device_backward_r3.csv)
if [ -n "$med" ] && [ "$med" = "$(cat docs/figures/backward.csv)" ]; then ok; else
    bad "plots/median_rows.awk over docs/examples/device_backward_r*.csv is not docs/figures/backward.csv"; fi
# the median, not the first or last run: three runs of one row at 1, 3, 2 GFLOP/s keep the 2
printf 'impl,pass,gflops\nflash,fwd,1\n' >"$tmp/m1.csv"; printf 'impl,pass,gflops\nflash,fwd,3\n' >"$tmp/m2.csv"
printf 'gflops,impl,pass\n2,flash,fwd\n' >"$tmp/m3.csv"
[ "$(awk -F, -f plots/median_rows.awk "$tmp/m1.csv" "$tmp/m2.csv" "$tmp/m3.csv" | tail -1)" = "2,flash,fwd" ] &&
    ok || bad "median_rows.awk: not the median row of 1, 3, 2"
err=$(cols seqlen_k impl=flash,pass=fwd docs/figures/bench.csv 2>/dev/null; echo "rc=$?")
case $err in *rc=0) ok ;; *) bad "bench.csv without lib_peak_mib still has impl/pass/seqlen_k: $err" ;; esac

# render both figures from both column orders
if command -v gnuplot >/dev/null 2>&1; then
    for f in "$sample" "$tmp/reversed.csv"; do
        for g in memory backward; do
            out=$tmp/$g-$(basename "$f" .csv).png
            if gnuplot -e "datadir='$tmp'; csv='$f'; out='$out'; note='SAMPLE DATA (hand-made, not measured)'" \
                    plots/$g.gp 2>"$tmp/gp.err" && [ ! -s "$tmp/gp.err" ] &&
                    [ "$(od -An -c -N4 "$out" | tr -d ' ')" = '211PNG' ]; then ok; else
                bad "gnuplot plots/$g.gp on $(basename "$f"):"; cat "$tmp/gp.err"; fi
        done
    done
    # the GFLOP/s figure, from the committed data with its columns reversed
    mkdir -p "$tmp/rev"
    awk -F, '{ for (i = NF; i >= 1; i--) printf "%s%s", $i, (i > 1 ? "," : "\n") }' docs/figures/bench.csv \
        >"$tmp/rev/bench.csv"
    if gnuplot -e "datadir='$tmp/rev'; out='$tmp/bench_gflops.png'" plots/bench_gflops.gp 2>"$tmp/gp.err" &&
            [ ! -s "$tmp/gp.err" ] && [ "$(od -An -c -N4 "$tmp/bench_gflops.png" | tr -d ' ')" = '211PNG' ]; then
        ok; else bad "gnuplot plots/bench_gflops.gp on reversed columns:"; cat "$tmp/gp.err"; fi
else
    echo "test_plots: gnuplot not installed: the figures were NOT rendered (apt-get install gnuplot-nox)"
fi
echo "test_plots: $pass passed, $fail failed"
[ "$fail" = 0 ]
