#!/bin/sh
# Decode before/after on one quiet host, side by side (issue 12 targets): the
# decode and decode_mqa benches of tools/device_cpu.sh, alternating two builds.
# Layout: a directory holding this script, old/ and new/ (each `git archive REV`
# unpacked, with a file REV naming the revision); run there:
#   sh device_decode_ab.sh OUTDIR
# (docs/examples/device_decode_ab.log: old = 17ecdac, K transpose + V copy +
# widen into panels; new = the direct dec_qk/dec_pv kernels.) Stops at ~BUDGET
# seconds (default 215); ROUNDS=K (default 2) interleaved rounds. T1=1 adds, after the default rounds, 1-thread cold rows
# (f32/bf16, num_splits 1, new/old/new/old) and WARM=1 warm-cache compute rows
# (--warm-cache, 256 keys, 1 thread): the compute side, without DRAM.
set -u
out=${1:?}
mkdir -p "$out" && out=$(cd "$out" && pwd) # absolute: the builds run in old/ and new/
start=$(date +%s)
budget=${BUDGET:-215}
left() { echo $((budget - ($(date +%s) - start))); }
echo "== old: $(cat old/REV); new: $(cat new/REV)"; echo "== host"; lscpu | sed -n '1,20p'; nproc
echo "== build old and new (make -j8 each, in parallel)"
(cd old && make -j8 build/flashattn >"$out/build_old.log" 2>&1; echo "old build rc $?") &
(cd new && make -j8 build/flashattn >"$out/build_new.log" 2>&1; echo "new build rc $?") &
wait
echo "== built at $(( $(date +%s) - start )) s"
dec() { # dec SIDE TAG
    [ "$(left)" -lt 25 ] && { echo "== $1 $2: skipped ($(left) s left)"; return; }
    echo "== $1 $2 ($(left) s left)"
    timeout "$(left)" "$1/build/flashattn" bench --seqlen-q 1 --n 32768 --d 128 --heads 32 --heads-k 8 --threads 2 \
        --kv-dtype f32,bf16 --num-splits 1,0 --page-size 0,16 --repeats 20 --csv "$out/decode_$1_$2.csv" 2>&1
}
mqa() { # mqa SIDE TAG
    [ "$(left)" -lt 20 ] && { echo "== $1 mqa $2: skipped ($(left) s left)"; return; }
    echo "== $1 decode_mqa $2 ($(left) s left)"
    timeout "$(left)" "$1/build/flashattn" bench --seqlen-q 1 --n 32768 --d 128 --heads 8 --heads-k 1 --threads 2 \
        --kv-dtype f32,bf16 --num-splits 1,0 --repeats 20 --csv "$out/decode_mqa_$1_$2.csv" 2>&1
}
one() { # one SIDE TAG ARGS...: H=32 Hk=8 d=128, f32/bf16, num_splits 1
    side=$1; tag=$2; shift 2
    [ "$(left)" -lt 15 ] && { echo "== $side $tag: skipped ($(left) s left)"; return; }
    echo "== $side $tag ($(left) s left)"
    timeout "$(left)" "$side/build/flashattn" bench --seqlen-q 1 --d 128 --heads 32 --heads-k 8 --kv-dtype f32,bf16 \
        --num-splits 1 "$@" --csv "$out/decode_${side}_$tag.csv" 2>&1
}
# ROUNDS (default 2) interleaved rounds of both sides, new first in odd rounds, old first in even
r=1
while [ "$r" -le "${ROUNDS:-2}" ]; do
    if [ $((r % 2)) = 1 ]; then dec new "$r"; dec old "$r"; mqa new "$r"; mqa old "$r"
    else dec old "$r"; dec new "$r"; mqa old "$r"; mqa new "$r"; fi
    r=$((r + 1))
done
if [ "${T1:-0}" = 1 ]; then
    for r in 1 2; do
        one new "t1_r$r" --n 32768 --threads 1 --repeats 9; one old "t1_r$r" --n 32768 --threads 1 --repeats 9
    done
fi
if [ "${WARM:-0}" = 1 ]; then
    for r in 1 2; do
        one new "warm_r$r" --n 256 --threads 1 --repeats 200 --warm-cache
        one old "warm_r$r" --n 256 --threads 1 --repeats 200 --warm-cache
    done
fi
echo "== done in $(( $(date +%s) - start )) s"
