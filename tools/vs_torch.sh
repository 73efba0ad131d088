#!/bin/sh
# flashattn's flash forward beside PyTorch's CPU scaled_dot_product_attention on
# issue 14's grid (d 64/128, N 1024/4096, causal or not; B=1, H=8, float32), in
# interleaved rounds so that both see the same machine state: each round runs
# `flashattn bench` (plain, then --causal) and tools/torch_cpu_sdpa.py once.
# Prints every round's rows, then per row the medians over rounds, flash's
# fraction of bench's measured FMA peak, and flash / torch (median of the
# per-round ratios, with their min..max).
# Usage: sh tools/vs_torch.sh [THREADS] [ROUNDS] [OUTDIR]   (defaults 16 3 /tmp/vs_torch)
# Threads are pinned (OMP_PROC_BIND=close, OMP_PLACES=cores) unless already set.
set -u
threads=${1:-16}
rounds=${2:-3}
out=${3:-/tmp/vs_torch}
fa=${FA:-build/flashattn}
case $threads in '' | *[!0-9]*) echo "vs_torch.sh: THREADS must be a positive integer" >&2; exit 2 ;; esac
case $rounds in '' | *[!0-9]*) echo "vs_torch.sh: ROUNDS must be a positive integer" >&2; exit 2 ;; esac
[ -x "$fa" ] || { echo "vs_torch.sh: no $fa (make build/flashattn)" >&2; exit 2; }
python3 -c 'import torch' 2>/dev/null || { echo "vs_torch.sh: torch is not installed here; nothing to compare"; exit 0; }
export OMP_PROC_BIND=${OMP_PROC_BIND:-close} OMP_PLACES=${OMP_PLACES:-cores}
mkdir -p "$out"
rows="$out/rows.csv"
echo "round,impl,d,n,causal,gflops,peak_fraction" >"$rows"
r=1
while [ "$r" -le "$rounds" ]; do
    for c in 0 1; do
        flag=; [ "$c" = 1 ] && flag=--causal
        "$fa" bench --impl flash --n 1024,4096 --d 64,128 --heads 8 --threads "$threads" --repeats 5 \
            --no-check $flag --csv "$out/flash_${r}_${c}.csv" >/dev/null || { echo "vs_torch.sh: bench failed" >&2; exit 1; }
        # columns: d=10 causal=11 gflops=15 peak_fraction=16, seqlen_q=8
        awk -F, -v r="$r" 'NR > 1 { print r ",flash," $10 "," $8 "," $11 "," $15 "," $16 }' "$out/flash_${r}_${c}.csv" >>"$rows"
    done
    python3 tools/torch_cpu_sdpa.py --n 1024,4096 --d 64,128 --threads "$threads" --causal 0,1 --repeats 5 |
        awk -F, -v r="$r" '$1 == "torch_sdpa" { print r ",torch," $6 "," $5 "," $7 "," $9 "," }' >>"$rows"
    r=$((r + 1))
done
cat "$rows"
echo
echo "medians over $rounds rounds, $threads threads (GFLOP/s; causal on the halved count)"
awk -F, '
function med(a, n,   i, j, t) { for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
                                return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
NR > 1 { k = $3 " " $4 " " $5; keys[k] = 1; v[$2, k, $1] = $6; if ($2 == "flash") pf[k, $1] = $7; rr[$1] = 1 }
END {
    printf "%-4s %-5s %-6s %10s %8s %10s %12s %17s\n", "d", "N", "causal", "flash", "of_peak", "torch", "flash/torch", "rounds min..max"
    nk = 0; for (k in keys) ks[++nk] = k
    for (i = 2; i <= nk; i++) { t = ks[i]; for (j = i - 1; j >= 1 && ks[j] > t; j--) ks[j + 1] = ks[j]; ks[j + 1] = t }
    for (i = 1; i <= nk; i++) {
        k = ks[i]; nf = nt = nr = np = 0; lo = 1e9; hi = 0
        for (r in rr) {
            if ((("flash", k, r) in v)) { f[++nf] = v["flash", k, r]; p[++np] = pf[k, r] }
            if ((("torch", k, r) in v)) t2[++nt] = v["torch", k, r]
            if ((("flash", k, r) in v) && (("torch", k, r) in v) && v["torch", k, r] > 0) {
                x = v["flash", k, r] / v["torch", k, r]; q[++nr] = x; if (x < lo) lo = x; if (x > hi) hi = x }
        }
        split(k, kk, " ")
        printf "%-4s %-5s %-6s %10.1f %7.1f%% %10.1f %11.2fx %8.2f..%.2f\n", kk[1], kk[2], kk[3],
               nf ? med(f, nf) : 0, np ? 100 * med(p, np) : 0, nt ? med(t2, nt) : 0, nr ? med(q, nr) : 0, lo, hi
    }
}' "$rows"
