# csvcols.awk — pick CSV columns BY NAME (from the header line), so a figure
# does not break when a program adds or reorders columns.
#
#   awk -F, -v cols=seqlen_q,gflops -v where=impl=flash,pass=bwd,d=64 -f plots/csvcols.awk FILE.csv
#
# Prints the `cols` of every row whose `where` columns equal the given values,
# space-separated, in the order of `cols`, one row per line (gnuplot reads
# that as plain data). A name that is not in the header is an error naming it
# (exit 2), never a silently wrong column.
BEGIN {
    ncols = split(cols, want, ",")
    nwhere = split(where, cond, ",")
    for (i = 1; i <= nwhere; i++) {
        eq = index(cond[i], "=")
        if (eq == 0) { printf "csvcols.awk: bad condition '%s' (want name=value)\n", cond[i] > "/dev/stderr"; bad = 1; exit 2 }
        wname[i] = substr(cond[i], 1, eq - 1)
        wval[i] = substr(cond[i], eq + 1)
    }
}
FNR == 1 {
    delete idx
    for (i = 1; i <= NF; i++) { gsub(/^[ \t"]+|[ \t"\r]+$/, "", $i); idx[$i] = i }
    for (i = 1; i <= ncols; i++)
        if (!(want[i] in idx)) { printf "csvcols.awk: %s has no column '%s'\n", FILENAME, want[i] > "/dev/stderr"; bad = 1; exit 2 }
    for (i = 1; i <= nwhere; i++)
        if (!(wname[i] in idx)) { printf "csvcols.awk: %s has no column '%s'\n", FILENAME, wname[i] > "/dev/stderr"; bad = 1; exit 2 }
    next
}
{
    sub(/\r$/, "")
    for (i = 1; i <= nwhere; i++) {
        v = $(idx[wname[i]])
        # numbers compare as numbers (64 == 64.0), names as strings
        if (v ~ /^-?[0-9.]+([eE][-+]?[0-9]+)?$/ && wval[i] ~ /^-?[0-9.]+([eE][-+]?[0-9]+)?$/) { if (v + 0 != wval[i] + 0) next }
        else if (v != wval[i]) next
    }
    line = $(idx[want[1]])
    for (i = 2; i <= ncols; i++) line = line " " $(idx[want[i]])
    print line
}
END { if (bad) exit 2 }
