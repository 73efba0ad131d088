#!/bin/sh
# tools/ab_trees.sh NAME=DIR [NAME=DIR ...]
#   Side by side timing of source trees (checkouts or `git archive` copies) in
#   ONE job, for a machine that has no git history of the project (the device
#   host): builds each tree's build/libflashattn.a (make -j$JOBS), builds
#   tools/ab_time.c of the first tree against each library, measures the FMA
#   peak of each thread count once (fa_measure_fma_peak, the ceiling bench
#   reports), then for ROUNDS rounds runs every grid line on every side it
#   names, the sides alternating inside each line, so a slow spell of the
#   machine falls on all sides alike. Prints per line each side's GFLOP/s per
#   round, the median, its fraction of that thread count's peak, the
#   median's ratio to the first side's, and the paired ratio: the median (and
#   range) over rounds of each round's ratio to the first side's in that round.
#
#   Environment: ROUNDS (default 3), REPS (timed runs per ab_time call after
#   its warm-up, default 2; the call reports their median), JOBS (default 8),
#   GRID (default: the issue-14 grid below; one line per row:
#   "LABEL|SIDES|THREADS|ab_time ARGS without THREADS and REPS", SIDES "all"
#   or NAMEs separated by commas), OMP_PROC_BIND/OMP_PLACES (default close/cores:
#   pinned threads, the same for every side).
#   ab_time ARGS: N D H [--pass fwd|bwd] [--causal] ...; FLOPs 4 N^2 d H, x2.5 for bwd.
#
#   example: sh tools/ab_trees.sh main=/tmp/main new=.
set -u
[ $# -ge 1 ] || { echo "usage: ab_trees.sh NAME=DIR [NAME=DIR ...]"; exit 2; }
rounds=${ROUNDS:-3}
reps=${REPS:-2}
jobs=${JOBS:-8}
export OMP_PROC_BIND=${OMP_PROC_BIND:-close} OMP_PLACES=${OMP_PLACES:-cores}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
default_grid='fwd d64 N1024|all|1|1024 64 8 --pass fwd
fwd d128 N1024|all|1|1024 128 8 --pass fwd
fwd d64 N4096|all|1|4096 64 8 --pass fwd
fwd d128 N4096|all|1|4096 128 8 --pass fwd
bwd d64 N1024|all|1|1024 64 8 --pass bwd
bwd d128 N1024|all|1|1024 128 8 --pass bwd
bwd d64 N4096|all|1|4096 64 8 --pass bwd
bwd d128 N4096|all|1|4096 128 8 --pass bwd
fwd d64 N1024|all|2|1024 64 8 --pass fwd
fwd d128 N1024|all|2|1024 128 8 --pass fwd
fwd d64 N4096|all|2|4096 64 8 --pass fwd
fwd d128 N4096|all|2|4096 128 8 --pass fwd
bwd d64 N1024|all|2|1024 64 8 --pass bwd
bwd d128 N1024|all|2|1024 128 8 --pass bwd
bwd d64 N4096|all|2|4096 64 8 --pass bwd
bwd d128 N4096|all|2|4096 128 8 --pass bwd
fwd d128 N4096 H16|all|16|4096 128 16 --pass fwd
bwd d128 N4096 H16|all|16|4096 128 16 --pass bwd'
grid=${GRID:-$default_grid}

names=""
first=""
for arg in "$@"; do
    name=${arg%%=*}
    dir=${arg#*=}
    [ -d "$dir" ] || { echo "ab_trees: $dir is not a directory"; exit 2; }
    dir=$(cd "$dir" && pwd)
    [ -n "$first" ] || first=$dir
    echo "== build $name ($dir)"
    t0=$(date +%s)
    make -C "$dir" -j"$jobs" build/libflashattn.a >"$tmp/build_$name.log" 2>&1 ||
        { echo "build of $name failed:"; tail -20 "$tmp/build_$name.log"; exit 1; }
    ${CC:-gcc} -std=c11 -O2 -D_POSIX_C_SOURCE=200809L -I"$dir/include" "$first/tools/ab_time.c" \
        "$dir/build/libflashattn.a" -fopenmp -lm -o "$tmp/ab_$name" || exit 1
    echo "   ok in $(( $(date +%s) - t0 )) s"
    names="$names $name"
done

# the FMA peak of each thread count of the grid, through the first tree's public API
cat >"$tmp/peak.c" <<'EOF'
#include <stdio.h>
#include <stdlib.h>
#include "flashattn.h"
int main(int argc, char **argv)
{
    static const char *isas[] = {"avx512", "avx2", "neon", "scalar"};
    for (int i = 0; i < 4; i++) {
        double g = 0.0;
        if (fa_measure_fma_peak(isas[i], atoi(argv[1]), 1.0, &g) == FA_OK && g > 0.0) {
            printf("%s %.1f\n", isas[i], g);
            return 0;
        }
    }
    return 1;
}
EOF
${CC:-gcc} -std=c11 -O2 -I"$first/include" "$tmp/peak.c" "$first/build/libflashattn.a" -fopenmp -lm -o "$tmp/peak" || exit 1
for t in $(echo "$grid" | awk -F'|' '{print $3}' | sort -n -u); do
    "$tmp/peak" "$t" >"$tmp/peak_$t" || { echo "no FMA peak for $t threads"; exit 1; }
    echo "== FMA peak, $t thread(s): $(cat "$tmp/peak_$t") GFLOP/s (ISA, best of 3 one-second runs)"
done

echo "== $rounds rounds x ${reps} timed runs (+1 warm-up) per ab_time call; OMP_PROC_BIND=$OMP_PROC_BIND OMP_PLACES=$OMP_PLACES"
r=1
while [ "$r" -le "$rounds" ]; do
    echo "$grid" | while IFS='|' read -r label sides threads args; do
        key=$(echo "$label" | tr ' ' '_')
        for name in $names; do
            case ",$sides," in *",all,"* | *",$name,"*) ;; *) continue ;; esac
            # shellcheck disable=SC2086
            g=$("$tmp/ab_$name" $(echo "$args" | awk '{print $1, $2, $3}') "$threads" "$reps" \
                $(echo "$args" | cut -d' ' -f4-) </dev/null | awk '{print $2}')
            echo "${g:-nan}" >>"$tmp/res_${key}_t${threads}_$name"
        done
    done
    echo "   round $r done at $(date +%H:%M:%S)"
    r=$((r + 1))
done

med() { sort -g "$1" | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
echo
# paired: each round's GFLOP/s over the first side's in the same round (the sides of one
# round ran back to back, so a slow spell of the host falls on both): median (min..max)
paired() {
    paste "$1" "$2" | awk '$1 + 0 > 0 && $2 + 0 > 0 {print $2 / $1}' | sort -g |
        awk '{a[NR] = $1} END {if (!NR) {print "-"; exit}
             m = (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2
             printf "%.3f (%.2f..%.2f)", m, a[1], a[NR]}'
}
printf '%-22s %3s %-6s %-26s %9s %7s %8s  %s\n' "row" "thr" "side" "GFLOP/s per round" "median" "peak" "/first" "paired /first"
echo "$grid" | while IFS='|' read -r label sides threads args; do
    key=$(echo "$label" | tr ' ' '_')
    pk=$(awk '{print $2}' "$tmp/peak_$threads")
    base=""
    basef=""
    for name in $names; do
        f="$tmp/res_${key}_t${threads}_$name"
        [ -f "$f" ] || continue
        m=$(med "$f")
        [ -n "$base" ] || { base=$m; basef=$f; }
        printf '%-22s %3s %-6s %-26s %9.1f %6.1f%% %8.3f  %s\n' "$label" "$threads" "$name" "$(tr '\n' ' ' <"$f")" "$m" \
            "$(awk -v a="$m" -v p="$pk" 'BEGIN {print 100 * a / p}')" "$(awk -v a="$m" -v b="$base" 'BEGIN {print a / b}')" \
            "$(paired "$basef" "$f")"
    done
done
