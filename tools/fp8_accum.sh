#!/bin/sh
# fp8_accum.sh -- does `flashattn check`'s FP8 rule hold for FP8 tensor-core accumulation at long
# rows? (The rule's baseline accumulates in float32; Hopper's FP8 WGMMA keeps ~14 bits of its
# accumulator, and a kernel like FlashAttention-3 accumulates a whole row of keys there.)
#
#   sh tools/fp8_accum.sh [OUTDIR]      (OUTDIR defaults to $OUT, the device tool's folder)
#
# For each N of FP8_ACCUM_NS (default "8192 32768"; B 1, H = HK = FP8_ACCUM_H (2), d 128,
# per-head descales, non-causal) runs tools/fp8_torch.py twice on the same inputs: float32
# accumulation (cuBLAS's promotion) and --fast-accum, prints the largest difference between the
# two outputs, and checks both with `flashattn check --qkv-format e4m3` (FA-3's rule); the
# fast-accum one also with --kernel-model fa3. Expect every verdict PASS; the ratio column says
# how far each sits from the bound (the bound is ~2). Needs a CUDA GPU, PyTorch, build/flashattn.
set -u
OUTDIR=${1:-${OUT:-}}
[ -n "$OUTDIR" ] || { echo "fp8_accum.sh: give OUTDIR (or set OUT)" >&2; exit 2; }
mkdir -p "$OUTDIR" || exit 2
FA=${FLASHATTN:-build/flashattn}
[ -x "$FA" ] || { echo "fp8_accum.sh: no $FA" >&2; exit 2; }
NS=${FP8_ACCUM_NS:-"8192 32768"}
H=${FP8_ACCUM_H:-2}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
bad=0
for n in $NS; do
    for acc in f32 fast; do
        flag=
        [ $acc = fast ] && flag=--fast-accum
        python3 tools/fp8_torch.py --out "$WORK/$n-$acc" --seqlen "$n" --heads "$H" --heads-k "$H" --d 128 \
            $flag | sed "s/^/[$n $acc] /"
    done
    python3 - "$WORK/$n-f32/o_f32.npy" "$WORK/$n-fast/o_f32.npy" <<'PY'
import sys, numpy as np
a, b = (np.load(x) for x in sys.argv[1:3])
print("[N %d] max |o_fast - o_f32| %.3e (max |o| %.3f), mean %.3e" % (a.shape[1], np.abs(a - b).max(), np.abs(a).max(), np.abs(a - b).mean()))
PY
    for acc in f32 fast; do
        d=$WORK/$n-$acc
        models="none"
        [ $acc = fast ] && models="none fa3"
        for m in $models; do
            extra=
            [ $m = fa3 ] && extra="--kernel-model fa3"
            t0=$(date +%s)
            "$FA" check -q "$d/q.npy" -k "$d/k.npy" -v "$d/v.npy" --out "$d/o.npy" --qkv-format e4m3 \
                --descale-q "$d/dq.npy" --descale-k "$d/dk.npy" --descale-v "$d/dv.npy" $extra >"$WORK/c.txt" 2>&1
            rc=$?
            v=$(grep -m1 '^verdict' "$WORK/c.txt")
            r=$(grep -m1 'max error:' "$WORK/c.txt")
            b=$(grep -m1 'baseline: max abs err' "$WORK/c.txt")
            echo "N $n accum $acc model $m: rc $rc, $v | $r | $b ($(( $(date +%s) - t0 )) s)"
            [ $rc = 0 ] || bad=1
        done
    done
done
exit $bad
