# median_rows.awk — the median run of each bench row, over several `flashattn bench --csv`
# files of the same rows (run back to back), so a figure shows one run's whole row, not a
# mean of runs. Rows are matched by impl, pass, threads, seqlen_q, seqlen_k, d, causal; the row
# kept is the one with the median gflops (the lower middle one for an even count). Output:
# the first file's header, then the rows in the first file's order.
#
#   awk -F, -f plots/median_rows.awk run1.csv run2.csv run3.csv > median.csv
#
# (docs/figures/backward.csv is this over docs/examples/device_backward_r{1,2,3}.csv.)
# a column by name; "" when the file has no such column (never $0 by accident)
function field(name) { return (name in col) ? $col[name] : "" }
FNR == 1 {
    split("", col)
    for (i = 1; i <= NF; i++) col[$i] = i
    if (NR == 1) header = $0
    if (!("gflops" in col)) { printf "median_rows.awk: %s has no gflops column\n", FILENAME > "/dev/stderr"; bad = 1; exit 2 }
    next
}
{
    key = field("impl") FS field("pass") FS field("threads") FS field("seqlen_q") FS field("seqlen_k") FS field("d") FS field("causal")
    if (!(key in n)) order[++nkeys] = key
    n[key]++
    row[key, n[key]] = $0
    g[key, n[key]] = field("gflops") + 0
}
END {
    if (bad) exit 2
    print header
    for (k = 1; k <= nkeys; k++) {
        key = order[k]
        m = n[key]
        for (i = 1; i <= m; i++) idx[i] = i
        for (i = 2; i <= m; i++)           # insertion sort of the runs by gflops
            for (j = i; j > 1 && g[key, idx[j - 1]] > g[key, idx[j]]; j--) { t = idx[j]; idx[j] = idx[j - 1]; idx[j - 1] = t }
        print row[key, idx[int((m + 1) / 2)]]
    }
}
