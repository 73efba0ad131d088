#!/bin/sh
# tools/pair_ratio.sh [ROUNDS] — issue 14's ratio targets (causal over plain on the halved
# count, softcap 30 over plain, bf16 inputs over float32), each as the median of PAIRED
# ratios: in every round the base run and the variant run back to back (ab_time, one
# context each, as bench keeps its buffers), the round's ratio taken, then the median and
# range over rounds. On a shared machine whose speed moves in phases of minutes a ratio
# of two medians from different minutes says little; a pair one second apart says more.
#
#   cc -std=c11 -O2 -D_POSIX_C_SOURCE=200809L -Iinclude -Itools tools/ab_time.c \
#       build/libflashattn.a -fopenmp -lm -o /tmp/ab_time
#   AB=/tmp/ab_time sh tools/pair_ratio.sh 5          (about 4 minutes on 2 cores)
#
#   env: AB (the ab_time binary), THREADS (2), H (8),
#        GRID: lines "N D REPS|variant options" (REPS: ab_time's timed runs, ~1 s a call)
set -eu
rounds=${1:-5}
ab=${AB:-/tmp/ab_time}
threads=${THREADS:-2}
h=${H:-8}
[ -x "$ab" ] || { echo "pair_ratio.sh: no ab_time at $ab (see the header)" >&2; exit 2; }
case $rounds in '' | *[!0-9]* | ?????*) echo "pair_ratio.sh: ROUNDS must be an integer from 1 to 9999" >&2; exit 2 ;; esac
[ "$rounds" -ge 1 ] || { echo "pair_ratio.sh: ROUNDS must be an integer from 1 to 9999" >&2; exit 2; }
case $threads in '' | *[!0-9]* | ?????*) echo "pair_ratio.sh: THREADS must be a positive integer" >&2; exit 2 ;; esac
case $h in '' | *[!0-9]* | ?????*) echo "pair_ratio.sh: H must be a positive integer" >&2; exit 2 ;; esac
[ -f "$ab" ] || { echo "pair_ratio.sh: $ab is not a file" >&2; exit 2; }
grid=${GRID:-"1024 64 150|--causal
1024 128 80|--causal
2048 64 40|--causal
2048 128 20|--causal
4096 64 10|--causal
4096 128 5|--causal
1024 64 150|--softcap 30
4096 64 10|--softcap 30
4096 128 5|--softcap 30
4096 64 10|--dtype bf16
4096 128 5|--dtype bf16"}
# GFLOP/s of one ab_time call on the current GRID line (options: the variant's, or none)
gflops() { "$ab" "$n" "$d" "$h" "$threads" "$reps" --context "$@" | awk '{print $2}'; }
echo "paired ratios, variant GFLOP/s over base GFLOP/s, $rounds rounds, $threads threads, H = $h"
echo "$grid" | while IFS='|' read -r nd extra; do
    set -- $nd
    [ $# -gt 0 ] || continue
    [ $# = 3 ] || { echo "pair_ratio.sh: a GRID line needs \"N D REPS|options\", got \"$nd|$extra\"" >&2; exit 2; }
    n=$1 d=$2 reps=$3
    r=1 ratios=""
    while [ "$r" -le "$rounds" ]; do
        # the order alternates by round, so a machine slowing down within a round
        # does not always fall on the same side
        if [ $((r % 2)) = 1 ]; then
            a=$(gflops) b=$(gflops $extra)
        else
            b=$(gflops $extra) a=$(gflops)
        fi
        ok=1
        case $a in '' | *[!0-9.]*) ok=0 ;; esac
        case $b in '' | *[!0-9.]*) ok=0 ;; esac
        [ "$ok" = 0 ] || ok=$(awk -v a="$a" -v b="$b" 'BEGIN { print (a > 0 && b > 0) ? 1 : 0 }')
        [ "$ok" = 1 ] || { echo "pair_ratio.sh: ab_time failed on N $n d $d $extra (got '$a' and '$b')" >&2; exit 1; }
        ratios="$ratios $(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.4f", b / a }')"
        r=$((r + 1))
    done
    echo "$ratios" | tr ' ' '\n' | grep . | sort -n | awk -v n="$n" -v d="$d" -v x="$extra" '
        { v[NR] = $1 }
        END { m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
              printf "N %5d d %3d  %-14s median %.3f  (%.3f .. %.3f)\n", n, d, x, m, v[1], v[NR] }'
done
