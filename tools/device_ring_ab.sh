#!/bin/sh
# tools/device_ring_ab.sh DIR OUTDIR [BUDGET_S] — ring attention (issue 16) before/after on the
# 16-core device host, side by side in ONE job: weak scaling P = 1, 2, 4, 8 (4096 tokens per rank,
# d = 128, 4 heads, 2 threads per rank bound to cores) of each side in turn, the order reversed
# every round (ROUNDS, default 3), so a slow spell of the shared host falls on every side alike;
# then the host's own ceiling (ring_bench's alone sweep; ALONE=0: not) and, while time is left,
# BWD_ROUNDS (default 1) backward weak rounds per side, the order reversed likewise.
#   DIR holds ompi-debs/ (tools/ompi_debs.sh download DIR/ompi-debs) and one folder per side with
#   its flashattn-mpi (built here: the host has no mpicc) and optionally a file ENV of VAR=VALUE
#   words the side runs under (new0/ENV: FA_RING_PIECES=0 runs new's binary without pieces).
#   SIDES (default "old new") names the folders, in the first round's order.
# RANKS (default 1,2,4,8) and SWEEPS (default weak; "weak alone": each round also measures the
# host's ceiling beside the ring) change what a round runs.
# Each part is skipped, with a line saying so, once BUDGET_S (default 480) is spent.
set -u
dir=${1:?usage: device_ring_ab.sh DIR OUTDIR [BUDGET_S]}
out=${2:?usage: device_ring_ab.sh DIR OUTDIR [BUDGET_S]}
budget=${3:-480}
mkdir -p "$out"
start=$(date +%s)
left() { echo $((budget - ($(date +%s) - start))); }
if ! command -v mpirun >/dev/null; then
    # unpacked under /tmp, not installed into / (the image is not ours to change)
    for f in "$dir"/ompi-debs/*.deb; do dpkg -x "$f" /tmp/ompi; done
    export OPAL_PREFIX=/tmp/ompi/usr PATH="/tmp/ompi/usr/bin:$PATH"
    export LD_LIBRARY_PATH="/tmp/ompi/usr/lib/x86_64-linux-gnu:/tmp/ompi/usr/lib/x86_64-linux-gnu/openmpi/lib:${LD_LIBRARY_PATH:-}"
fi
mpirun --version | head -1
lscpu | sed -n '1,20p'
sides=${SIDES:-old new}
for s in $sides; do
    [ -x "$dir/$s/flashattn-mpi" ] || { echo "no $dir/$s/flashattn-mpi"; exit 1; }
    echo "side $s: $(cat "$dir/$s/REV" 2>/dev/null) env: $(cat "$dir/$s/ENV" 2>/dev/null)"
    ldd "$dir/$s/flashattn-mpi" | grep "not found"
done
rb="--ranks ${RANKS:-1,2,4,8} --bind core --tokens-per-rank 4096 --d 128 --heads 4 --threads 2"
side() { # side NAME TAG ARGS...: ring_bench.sh with the side's binary and ENV
    s=$1; tag=$2; shift 2
    if [ "$(left)" -lt 45 ]; then echo "== $s $tag: skipped ($(left) s left)"; return; fi
    echo "== $s $tag ($(left) s left)"
    env $(cat "$dir/$s/ENV" 2>/dev/null) timeout "$(left)" sh tools/ring_bench.sh $rb --build "$dir/$s" \
        --out "$out/$s" --tag "$tag" "$@" 2>&1 | grep -E "P=|^weak|note"
}
rounds=${ROUNDS:-3}
r=1
order=$sides
while [ "$r" -le "$rounds" ]; do
    for s in $order; do side "$s" "r$r" --reps 2 --sweeps "${SWEEPS:-weak}"; done
    order=$(for s in $order; do echo "$s"; done | awk '{ a[NR] = $0 } END { for (i = NR; i >= 1; i--) printf "%s ", a[i] }')
    r=$((r + 1))
done
first=$(echo $sides | cut -d' ' -f1)
[ "${ALONE:-1}" = 1 ] && side "$first" alone --reps 1 --sweeps alone
r=1
order=$sides
while [ "$r" -le "${BWD_ROUNDS:-1}" ]; do
    for s in $order; do side "$s" "bwd$r" --reps 1 --pass bwd --sweeps weak; done
    order=$(for s in $order; do echo "$s"; done | awk '{ a[NR] = $0 } END { for (i = NR; i >= 1; i--) printf "%s ", a[i] }')
    r=$((r + 1))
done
echo "== done in $(( $(date +%s) - start )) s"
