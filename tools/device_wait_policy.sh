#!/bin/sh
# tools/device_wait_policy.sh — for the 16-core device host, in ONE call: does the OpenMP wait
# policy move flashattn's 16-thread forward (issue 14 item 8: d 128 N 1024 at 1.1-1.2x PyTorch's
# CPU SDPA where 1.3x is asked)? libgomp's default spins GOMP_SPINCOUNT rounds at a barrier and
# then sleeps on a futex, so a call that follows a pause (bench's repeats, or the packing pass's
# barrier) may wake sleeping threads; `active` spins without end, `passive` sleeps at once.
# Rounds alternate the three policies (unset, active, passive) on `flashattn bench` (threads
# pinned, OMP_PROC_BIND=close OMP_PLACES=cores), and PyTorch's CPU SDPA (tools/torch_cpu_sdpa.py)
# runs under unset and active in each round, so every ratio comes from one machine state.
#   usage (from the repository root, after make): sh tools/device_wait_policy.sh [ROUNDS] [OUTDIR]
set -u
rounds=${1:-3}
out=${2:-/tmp/wait_policy}
fa=${FA:-build/flashattn}
[ -x "$fa" ] || { echo "device_wait_policy.sh: no $fa (make build/flashattn)" >&2; exit 2; }
mkdir -p "$out"
export OMP_PROC_BIND=close OMP_PLACES=cores
rows="$out/rows.csv"
echo "round,who,policy,d,n,gflops" >"$rows"
have_torch=0
python3 -c 'import torch' 2>/dev/null && have_torch=1
r=1
while [ "$r" -le "$rounds" ]; do
    for pol in unset active passive; do
        if [ $pol = unset ]; then unset OMP_WAIT_POLICY; else export OMP_WAIT_POLICY=$pol; fi
        timeout 120 "$fa" bench --impl flash --n 1024,4096 --d 64,128 --heads 8 --threads 16 --repeats 7 \
            --no-check --csv "$out/b_${r}_$pol.csv" >/dev/null 2>&1 || echo "bench failed ($pol, round $r)"
        awk -F, -v r="$r" -v p="$pol" 'NR > 1 { print r ",flash," p "," $10 "," $8 "," $15 }' "$out/b_${r}_$pol.csv" >>"$rows"
        if [ $have_torch = 1 ] && [ $pol != passive ]; then
            timeout 120 python3 tools/torch_cpu_sdpa.py --n 1024,4096 --d 64,128 --threads 16 --causal 0 --repeats 7 2>/dev/null |
                awk -F, -v r="$r" -v p="$pol" '$1 == "torch_sdpa" { print r ",torch," p "," $6 "," $5 "," $9 }' >>"$rows"
        fi
    done
    r=$((r + 1))
done
unset OMP_WAIT_POLICY
cat "$rows"
echo
echo "medians over $rounds rounds, 16 threads pinned (GFLOP/s, non-causal, B 1, H 8, float32)"
awk -F, '
function med(a, n,   i, j, t) { for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
                                return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
NR > 1 { k = $2 " " $3 " d" $4 " N" $5; c[k]++; v[k, c[k]] = $6; keys[k] = 1 }
END { for (k in keys) { n = c[k]; for (i = 1; i <= n; i++) a[i] = v[k, i]; printf "%-32s %8.1f  (%d rounds)\n", k, med(a, n), n } }' "$rows" | sort
