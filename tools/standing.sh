#!/bin/sh
# tools/standing.sh [BUILD] — the readings behind docs/performance.md's table "Where the
# targets stand", in one run, one after the other (ratios are paired inside
# tools/pair_ratio.sh). About 10 minutes on 2 cores; run it on an otherwise idle machine
# and keep its output as a log under docs/examples/.
#   env: ROUNDS (pair_ratio.sh's rounds, 7). Runs from the repository root (it cd's there).
set -eu
cd "$(dirname "$0")/.."
build=${1:-build}
fa=$build/flashattn
rounds=${ROUNDS:-7}
[ -x "$fa" ] || { echo "standing.sh: no $fa (run make first)" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
ab=$tmp/ab_time # built here against this build's library, never a stale one
cc -std=c11 -O2 -D_POSIX_C_SOURCE=200809L -Iinclude -Itools tools/ab_time.c "$build/libflashattn.a" \
    -fopenmp -lm -o "$ab"
echo "== commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown), $(date -u)"
grep -m1 'model name' /proc/cpuinfo || true
"$fa" info | sed -n '1,4p'
echo "== forward beside standard and OpenBLAS, 2 threads"
impls=flash,standard,blas
ls "$build"/cli-config.blas-* >/dev/null 2>&1 || impls=flash,standard # OpenBLAS not built in: no blas rows
"$fa" bench --impl $impls --n 1024,4096 --d 64,128 --heads 8 --threads 2
echo "== 1 and 2 threads, fwd and bwd"
"$fa" bench --impl flash --n 1024,2048,4096 --d 64,128 --heads 8 --threads 1,2 --pass fwd,bwd
echo "== AVX2 forced"
FA_ISA=avx2 "$fa" bench --impl flash --n 4096 --d 64,128 --heads 8 --threads 2
echo "== AVX2 forced, blocks planned for a 512 KiB L2 (FA_L2_BYTES=512K, Zen 3's)"
FA_ISA=avx2 FA_L2_BYTES=512K "$fa" bench --impl flash --n 4096 --d 64,128 --heads 8 --threads 2
echo "== paired ratios"
AB=$ab sh tools/pair_ratio.sh "$rounds"
echo "== decode, GQA"
"$fa" bench --seqlen-q 1 --n 32768 --d 128 --heads 32 --heads-k 8 --threads 2 --kv-dtype f32,bf16 \
    --page-size 0,16 --repeats 30
echo "== decode, MQA"
"$fa" bench --seqlen-q 1 --n 32768 --d 128 --heads 8 --heads-k 1 --threads 2 --kv-dtype f32,bf16 \
    --num-splits 1,0 --repeats 30
echo "== done $(date -u)"
