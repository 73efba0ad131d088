#!/bin/sh
# tools/device_standing_t21.sh OUTDIR — one device call's readings of the issue-12 decode
# targets (2 threads, three benches back to back) and of issue 14's sixteen threads beside
# PyTorch (tools/vs_torch.sh 16 2) on the GPU machine's CPU host. Twenty-first session.
set -u
out=${1:?usage: device_standing_t21.sh OUTDIR}
mkdir -p "$out"
make -j16 build/flashattn >"$out/build.log" 2>&1 || { tail -20 "$out/build.log"; exit 1; }
lscpu | sed -n '1,20p'
./build/flashattn info | sed -n '1,4p'
for i in 1 2 3; do
    echo "== decode GQA, bench $i ($(date -u +%T))"
    ./build/flashattn bench --seqlen-q 1 --n 32768 --d 128 --heads 32 --heads-k 8 --threads 2 \
        --kv-dtype f32,bf16 --page-size 0,16 --repeats 30 --csv "$out/dec$i.csv" 2>&1 | sed -n '2,4p;/^flash/p'
    echo "== decode MQA, bench $i"
    ./build/flashattn bench --seqlen-q 1 --n 32768 --d 128 --heads 8 --heads-k 1 --threads 2 \
        --kv-dtype f32,bf16 --num-splits 1,0 --repeats 30 --csv "$out/mqa$i.csv" 2>&1 | sed -n '/^flash/p'
done
echo "== vs_torch 16 threads, 2 rounds ($(date -u +%T))"
sh tools/vs_torch.sh 16 2 "$out/vt" 2>&1 | tail -14
