#!/bin/sh
# tools/mask_cost.sh [BUILD] — what each mask option (or input dtype) costs the flash forward
# (and backward), measured side by side: the variants below run one after the
# other, ROUNDS times in alternation (so a neighbour's load hits them all
# alike), and the median GFLOP/s of each is printed with its ratio to the
# plain (no mask) run of the same round set. FLOPs count only visible pairs
# (bench: causal halves, a window counts its band), so 1.00 means "at full
# speed". Results on a shared machine are indicative; rerun it on a quiet one.
#
#   env: N (2048) D (64) H (8) THREADS (2) ROUNDS (5) PASS (fwd; fwd,bwd for both)
#        FA_ISA (the ISA to force; default: the best this CPU has)
#        VARIANTS: lines "name|bench options"; the first is the base of the ratios.
#        Half-precision inputs against float32, for example:
#          VARIANTS="f32|
#          bf16|--dtype bf16
#          f16|--dtype f16" sh tools/mask_cost.sh build
set -eu
build=${1:-build}
fa=$build/flashattn
n=${N:-2048}; d=${D:-64}; h=${H:-8}; threads=${THREADS:-2}; rounds=${ROUNDS:-5}; pass=${PASS:-fwd}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

variants=${VARIANTS:-"plain|
softcap 30|--softcap 30
causal|--causal
window 256,0|--window 256,0
causal+softcap 30|--causal --softcap 30"}
variants=$(echo "$variants" | sed 's/^ *//')
first=$(echo "$variants" | head -1 | cut -d'|' -f1)

echo "# mask cost: N=$n d=$d H=$h threads=$threads pass=$pass rounds=$rounds isa=${FA_ISA:-auto}"
echo "# $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) CPUs, $(date -u '+%Y-%m-%d %H:%M UTC')"
r=0
while [ "$r" -lt "$rounds" ]; do
    i=0
    echo "$variants" | while IFS='|' read -r name args; do
        # shellcheck disable=SC2086 # args is a list of options
        "$fa" bench --impl flash --pass "$pass" --n "$n" --d "$d" --heads "$h" --threads "$threads" \
            --repeats 3 $args --csv "$tmp/v$i.r$r.csv" >/dev/null
        i=$((i + 1))
    done
    r=$((r + 1))
done

# median over rounds of each variant's per-run median GFLOP/s, per pass
i=0
echo "$variants" | while IFS='|' read -r name args; do
    for p in $(echo "$pass" | tr ',' ' '); do
        med=$(cat "$tmp"/v$i.r*.csv | awk -F, -v p="$p" '$2 == p {print $15}' | sort -g |
              awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}')
        echo "$p|$name|$med"
    done
    i=$((i + 1))
done >"$tmp/summary"

printf '\n| pass | variant | GFLOP/s (median of %s rounds) | / %s |\n|---|---|---|---|\n' "$rounds" "$first"
awk -F'|' -v first="$first" '$2 == first {base[$1] = $3} {row[NR] = $0} END {
    for (k = 1; k <= NR; k++) { split(row[k], f, "|"); printf "| %s | %s | %.1f | %.2f |\n", f[1], f[2], f[3], f[3] / base[f[1]] } }' \
    "$tmp/summary"
