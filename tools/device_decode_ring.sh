#!/bin/sh
# tools/device_decode_ring.sh OUTDIR [BUDGET_S] — the decode (issue 12) and ring (issue 16) targets
# on the 16-core device host, in ONE job, each measurement repeated in interleaved rounds so a slow
# spell of the shared host falls on every row alike:
#   decode  bench --seqlen-q 1, H=32 Hk=8 d=128, 32768 keys, 2 threads, f32/bf16 x splits 1/auto x
#           pages $PAGES (default 0,16), cold cache (the default), 3 rounds; MQA (H=8 Hk=1) likewise;
#           WARM=1 adds one warm round (--warm-cache): what an L3-resident cache reads at;
#   ring    tools/ring_bench.sh weak scaling P = 1,2,4,8 with 1 thread per rank (RING_ROUNDS, default
#           5, interleaved, 3 repeats each) and 2 threads (3 rounds), the full host's ceiling (the
#           alone sweep: P independent one-rank runs at once), strong scaling at N = 16384 and the
#           causal contiguous/zigzag sweep (3 rounds) (needs build/flashattn-mpi and build/ompi-debs
#           carried: tools/ompi_debs.sh).
# Each part is skipped, with a line saying so, once BUDGET_S (default 420) is spent.
set -u
out=${1:?usage: device_decode_ring.sh OUTDIR [BUDGET_S]}
budget=${2:-420}
mkdir -p "$out"
start=$(date +%s)
left() { echo $((budget - ($(date +%s) - start))); }
part() { # part NAME MIN_SECONDS_LEFT CMD...
    name=$1; need=$2; shift 2
    if [ "$(left)" -lt "$need" ]; then echo "== $name: skipped ($(left) s left, needs $need)"; return; fi
    echo "== $name ($(left) s left): $*"
    t0=$(date +%s)
    timeout "$(left)" "$@" 2>&1
    echo "== $name: rc $? in $(( $(date +%s) - t0 )) s"
}
fa=build/flashattn
part build 30 make -j16 build/flashattn
[ -x "$fa" ] || { echo "no $fa"; exit 1; }
part info 5 "$fa" info
pages=${PAGES:-0,16}
dec="--seqlen-q 1 --n 32768 --d 128 --threads 2 --kv-dtype f32,bf16 --num-splits 1,0 --repeats 15"
# (BK_AB, which ran the rows again with FA_BLOCK_K=N to pin the decode block, is gone: since the
# fourteenth session FA_BLOCK_K stands in for the L2 rule and decoding keeps its own key block;
# tools/ab_decode.c sets fa_options.block_k for that comparison)
for r in 1 2 3; do
    part "decode_r$r" 40 "$fa" bench $dec --heads 32 --heads-k 8 --page-size "$pages" --csv "$out/decode_r$r.csv"
    part "decode_mqa_r$r" 25 "$fa" bench $dec --heads 8 --heads-k 1 --csv "$out/decode_mqa_r$r.csv"
done
[ "${WARM:-0}" = 1 ] && part decode_warm 30 "$fa" bench $dec --heads 32 --heads-k 8 --page-size 0,16 --warm-cache --csv "$out/decode_warm.csv"
if [ -x build/flashattn-mpi ] && [ -d build/ompi-debs ]; then
    if ! command -v mpirun >/dev/null; then
        # unpacked under /tmp, not installed into / (the image is not ours to change)
        for f in build/ompi-debs/*.deb; do dpkg -x "$f" /tmp/ompi; done
        export OPAL_PREFIX=/tmp/ompi/usr PATH="/tmp/ompi/usr/bin:$PATH"
        export LD_LIBRARY_PATH="/tmp/ompi/usr/lib/x86_64-linux-gnu:/tmp/ompi/usr/lib/x86_64-linux-gnu/openmpi/lib:${LD_LIBRARY_PATH:-}"
    fi
    part ompi 20 sh -c 'mpirun --version | head -1; ldd build/flashattn-mpi | grep "not found"; true'
    rb="--ranks 1,2,4,8 --bind core --tokens-per-rank 4096 --d 128 --heads 4 --out $out/ring_bench"
    part ring_weak_t1 90 sh tools/ring_bench.sh $rb --reps 3 --threads 1 --rounds "${RING_ROUNDS:-5}" --sweeps weak --tag t1
    part ring_weak_t2 40 sh tools/ring_bench.sh $rb --reps 2 --threads 2 --rounds 3 --sweeps weak --tag t2
    part ring_alone_t2 20 sh tools/ring_bench.sh $rb --reps 1 --threads 2 --rounds 2 --sweeps alone --tag t2
    part ring_strong_t2 20 sh tools/ring_bench.sh $rb --reps 3 --threads 2 --n 16384 --sweeps strong --tag t2
    part ring_causal_t2 40 sh tools/ring_bench.sh $rb --reps 1 --threads 2 --n 16384 --rounds 3 --sweeps causal --tag t2
else
    echo "== ring: skipped (build/flashattn-mpi or build/ompi-debs not carried)"
fi
echo "== done in $(( $(date +%s) - start )) s"
