#!/bin/sh
# The CPU figures that need a quiet many-core machine, in ONE job so every ratio
# is side by side: decode targets (issue 12), forward/backward/mask/dtype costs
# and thread scaling (issue 14), PyTorch's CPU SDPA on the same shapes, and the
# ring-attention scaling (issue 16) when build/flashattn-mpi and Open MPI's
# packages were carried. Usage: sh tools/device_cpu.sh OUTDIR [BUDGET_S]
# Each part is skipped, with a line saying so, once BUDGET_S (default 400) is spent.
# ONLY="decode amx torch" (prefixes of part names) runs just those parts (and build, info).
set -u
out=${1:?usage: device_cpu.sh OUTDIR [BUDGET_S]}
budget=${2:-400}
mkdir -p "$out"
start=$(date +%s)
left() { echo $((budget - ($(date +%s) - start))); }
part() { # part NAME MIN_SECONDS_LEFT CMD...
    name=$1; need=$2; shift 2
    if [ -n "${ONLY:-}" ] && [ "$name" != build ] && [ "$name" != info ]; then
        hit=0
        for w in $ONLY; do case $name in "$w"*) hit=1 ;; esac; done
        [ $hit = 1 ] || return 0
    fi
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
lscpu 2>/dev/null | sed -n '1,20p'
# issue 12 targets: decode B=1, H=32, Hk=8, d=128, 1 query vs 32768 keys, 2 threads
part decode 40 "$fa" bench --seqlen-q 1 --n 32768 --d 128 --heads 32 --heads-k 8 --threads 2 \
    --kv-dtype f32,bf16 --num-splits 1,0 --page-size 0,16 --repeats 20 --csv "$out/decode.csv"
part decode_mqa 30 "$fa" bench --seqlen-q 1 --n 32768 --d 128 --heads 8 --heads-k 1 --threads 2 \
    --kv-dtype f32,bf16 --num-splits 1,0 --repeats 20 --csv "$out/decode_mqa.csv"
# issue 14: forward and backward, 1 and 2 threads, d 64/128
for t in 1 2; do
    part "fwd_bwd_t$t" 60 "$fa" bench --impl flash --pass fwd,bwd --n 1024,2048,4096 --d 64,128 --heads 8 \
        --threads $t --repeats 5 --csv "$out/fwdbwd_t$t.csv"
done
part causal_t2 40 "$fa" bench --impl flash --n 1024,4096 --d 64,128 --heads 8 --threads 2 --causal --repeats 5 \
    --csv "$out/causal_t2.csv"
part softcap_t2 40 "$fa" bench --impl flash --n 1024,4096 --d 64,128 --heads 8 --threads 2 --softcap 30 --repeats 5 \
    --csv "$out/softcap_t2.csv"
if "$fa" bench --help 2>&1 | grep -q -- '--dtype'; then
    for dt in f32 bf16 f16; do # --dtype takes one value: one bench each, back to back
        part "dtype_${dt}_t2" 30 "$fa" bench --impl flash --n 1024,4096 --d 64,128 --heads 8 --threads 2 --dtype $dt \
            --repeats 5 --csv "$out/dtype_${dt}_t2.csv"
    done
fi
part many_threads 40 "$fa" bench --impl flash --pass fwd,bwd --n 4096,8192 --d 128 --heads 16 --threads 16 \
    --repeats 5 --csv "$out/t16.csv"
# issue 14 item 8's grid at 16 threads (d 64/128, N 1024/4096, causal or not) beside PyTorch's
part grid16 40 "$fa" bench --impl flash --n 1024,4096 --d 64,128 --heads 8 --threads 16 --repeats 5 \
    --csv "$out/grid16.csv"
part grid16_causal 40 "$fa" bench --impl flash --n 1024,4096 --d 64,128 --heads 8 --threads 16 --causal \
    --repeats 5 --csv "$out/grid16_causal.csv"
part grid16_torch 40 python3 tools/torch_cpu_sdpa.py --n 1024,4096 --d 64,128 --threads 16 --causal 0,1 --repeats 5
# PyTorch's CPU attention, same shapes and threads
part torch_sdpa 60 python3 tools/torch_cpu_sdpa.py --n 1024,2048,4096 --d 64,128 --threads 1,2,16 --causal 0,1 \
    --repeats 5
# bf16 on AMX tiles (FA_AMX=1, where `info` says amx is available) beside PyTorch's bf16 SDPA
if "$fa" info 2>/dev/null | grep -q '^amx *: available'; then
    for t in 2 16; do
        part "amx_bf16_t$t" 30 env FA_AMX=1 "$fa" bench --impl flash --n 1024,4096 --d 64,128 --heads 16 \
            --threads $t --dtype bf16 --repeats 5 --csv "$out/amx_bf16_t$t.csv"
        part "bf16_t$t" 30 "$fa" bench --impl flash --n 1024,4096 --d 64,128 --heads 16 --threads $t --dtype bf16 \
            --repeats 5 --csv "$out/bf16_t$t.csv"
    done
    part torch_sdpa_bf16 40 python3 tools/torch_cpu_sdpa.py --n 1024,4096 --d 64,128 --heads 16 --threads 2,16 \
        --causal 0 --repeats 5 --dtype bf16
else
    echo "== amx: skipped (flashattn info: not available)"
fi
# issue 16: ring attention (needs the carried build/flashattn-mpi and build/ompi-debs)
if [ -x build/flashattn-mpi ] && [ -d build/ompi-debs ]; then
    if ! command -v mpirun >/dev/null; then
        # unpacked under /tmp, not installed into / (the image is not ours to change)
        for f in build/ompi-debs/*.deb; do dpkg -x "$f" /tmp/ompi; done
        export OPAL_PREFIX=/tmp/ompi/usr PATH="/tmp/ompi/usr/bin:$PATH"
        export LD_LIBRARY_PATH="/tmp/ompi/usr/lib/x86_64-linux-gnu:/tmp/ompi/usr/lib/x86_64-linux-gnu/openmpi/lib:${LD_LIBRARY_PATH:-}"
    fi
    part ompi 20 sh -c 'mpirun --version | head -1; ldd build/flashattn-mpi | grep "not found"; true'
    part ring 60 sh tools/ring_bench.sh --ranks "1 2 4 8" --threads 2 --bind core --tokens-per-rank 4096 --n 16384 \
        --d 128 --heads 4 --reps 3 --out "$out/ring_bench"
    part ring_t1 40 sh tools/ring_bench.sh --ranks "1 2 4 8" --threads 1 --bind core --tokens-per-rank 4096 --d 128 \
        --heads 4 --reps 3 --sweeps weak --tag t1 --out "$out/ring_bench"
    part ring_bwd 60 sh tools/ring_bench.sh --ranks "1 2 4 8" --threads 2 --bind core --tokens-per-rank 4096 --d 128 \
        --heads 4 --reps 1 --pass bwd --sweeps weak --tag bwd --out "$out/ring_bench"
else
    echo "== ring: skipped (build/flashattn-mpi or build/ompi-debs not carried)"
fi
echo "== done in $(( $(date +%s) - start )) s"
