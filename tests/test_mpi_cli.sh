#!/bin/sh
# test_mpi_cli.sh — `mpirun -np P flashattn-mpi run|grad|check` against `flashattn`
# (skips with one sentence without Open MPI, like tests/test_mpi.sh):
#   1 rank: the same bits as flashattn run / grad;
#   2-4 ranks: flashattn check / check-grad (single process, float64) accept the outputs;
#   --impl reference distributed equals flashattn run --impl reference (float64, ~1e-15);
#   the same command twice: the same bytes;
#   check over the ranks: a good output passes (0), a perturbed one fails (1); bf16: a correct
#   FlashAttention-2-style kernel (tools/row_rule_study.py's model) passes with an outlier channel
#   in V, and one whose last causal rows lose their first keys fails the row rule alone, as in
#   flashattn check;
#   bad input: exit 2 on every rank, exactly one "flashattn" line, no output file.
root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/tests/cli_test_lib.sh"
cli_test_setup test_mpi_cli "${1:-build}"
if ! command -v mpicc >/dev/null 2>&1 || ! command -v mpirun >/dev/null 2>&1; then
    echo "test_mpi_cli: SKIPPED: Open MPI is not installed (apt-get install libopenmpi-dev openmpi-bin)"; exit 0
fi
fm=$build/flashattn-mpi
[ -x "$fm" ] || { echo "test_mpi_cli: $fm not built (make mpi)"; exit 1; }
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_rmaps_base_oversubscribe=1 OMP_NUM_THREADS=1
mr() { np=$1; shift; timeout 120 mpirun --oversubscribe --allow-run-as-root --bind-to none -np "$np" "$fm" "$@"; }

python3 - <<'PY'
import numpy as np, os
r = np.random.default_rng(int.from_bytes(os.urandom(4), "little"))
np.save("q.npy", r.standard_normal((2, 48, 4, 16)).astype(np.float32))
np.save("k.npy", r.standard_normal((2, 96, 2, 16)).astype(np.float32))
np.save("v.npy", r.standard_normal((2, 96, 2, 24)).astype(np.float32))
np.save("do.npy", r.standard_normal((2, 48, 4, 24)).astype(np.float32))
np.save("q50.npy", r.standard_normal((1, 50, 2, 8)).astype(np.float32))
PY
same() { python3 -c "import numpy as np,sys; sys.exit(0 if np.array_equal(np.load('$1'), np.load('$2')) else 1)"; }

for mask in "" "--causal" "--window 20,5 --softcap 10"; do
    # 1 rank: single-process bits
    "$fa" run -q q.npy -k k.npy -v v.npy -o o_sp.npy --lse l_sp.npy $mask >/dev/null || bad "flashattn run $mask"
    mr 1 run -q q.npy -k k.npy -v v.npy -o o_1.npy --lse l_1.npy $mask >/dev/null || bad "flashattn-mpi run -np 1 $mask"
    if same o_sp.npy o_1.npy && same l_sp.npy l_1.npy; then ok; else bad "run -np 1 $mask: not the bits of flashattn run"; fi
    "$fa" grad -q q.npy -k k.npy -v v.npy --dout do.npy --dq dq_sp.npy --dk dk_sp.npy --dv dv_sp.npy $mask >/dev/null ||
        bad "flashattn grad $mask"
    mr 1 grad -q q.npy -k k.npy -v v.npy --dout do.npy --dq dq_1.npy --dk dk_1.npy --dv dv_1.npy $mask >/dev/null ||
        bad "flashattn-mpi grad -np 1 $mask"
    if same dq_sp.npy dq_1.npy && same dk_sp.npy dk_1.npy && same dv_sp.npy dv_1.npy; then ok; else
        bad "grad -np 1 $mask: not the bits of flashattn grad"; fi
    for np_ in 2 3 4; do
        for layout in contiguous zigzag; do
            mr $np_ run -q q.npy -k k.npy -v v.npy -o o_p.npy --lse l_p.npy $mask --layout $layout >/dev/null ||
                bad "run -np $np_ $layout $mask"
            if "$fa" check -q q.npy -k k.npy -v v.npy --out o_p.npy --lse l_p.npy $mask >check.txt; then ok; else
                bad "flashattn check rejects run -np $np_ --layout $layout $mask"; cat check.txt; fi
        done
        mr $np_ grad -q q.npy -k k.npy -v v.npy --dout do.npy --dq dq_p.npy --dk dk_p.npy --dv dv_p.npy $mask >/dev/null ||
            bad "grad -np $np_ $mask"
        if "$fa" check-grad -q q.npy -k k.npy -v v.npy --dout do.npy --dq dq_p.npy --dk dk_p.npy --dv dv_p.npy $mask \
            >check.txt; then ok; else bad "flashattn check-grad rejects grad -np $np_ $mask"; cat check.txt; fi
    done
done

# the same command twice: the same bytes
mr 3 run -q q.npy -k k.npy -v v.npy -o r1.npy --causal >/dev/null && mr 3 run -q q.npy -k k.npy -v v.npy -o r2.npy --causal >/dev/null
if cmp -s r1.npy r2.npy; then ok; else bad "run -np 3 twice: different bytes"; fi

# --impl reference, distributed: float64 equal to the single-process reference
"$fa" run -q q.npy -k k.npy -v v.npy -o ref_sp.npy --impl reference --dtype-out f64 --causal >/dev/null
mr 4 run -q q.npy -k k.npy -v v.npy -o ref_4.npy --impl reference --dtype-out f64 --causal >/dev/null
if python3 -c "import numpy as np,sys; a,b=np.load('ref_sp.npy'),np.load('ref_4.npy'); sys.exit(0 if a.dtype==np.float64 and np.abs(a-b).max() <= 1e-13*np.abs(a).max() else 1)"; then ok
else bad "run --impl reference -np 4: differs from the single-process reference"; fi

# check over the ranks: the flash output passes, a perturbed one fails
"$fa" run -q q.npy -k k.npy -v v.npy -o o_sp.npy --lse l_sp.npy --causal >/dev/null
if mr 3 check -q q.npy -k k.npy -v v.npy --out o_sp.npy --lse l_sp.npy --causal >check.txt; then ok; else
    bad "flashattn-mpi check rejects flashattn's output"; cat check.txt; fi
python3 -c "import numpy as np; o=np.load('o_sp.npy'); o[1,40,2,3]+=1e-3; np.save('o_bad.npy', o)"
mr 3 check -q q.npy -k k.npy -v v.npy --out o_bad.npy --causal >check.txt 2>/dev/null
rc=$?
if [ $rc = 1 ] && grep -q "FAIL" check.txt && grep -q "1 out of tolerance" check.txt; then ok; else
    bad "flashattn-mpi check on a perturbed output: exit $rc (want 1)"; cat check.txt; fi

# bf16 over the ranks: the P-rounding allowance and the row rule (fresh random inputs each run)
python3 - "$root/tools" <<'PY'
import os, sys
import numpy as np
sys.path.insert(0, sys.argv[1])
import row_rule_study as rr
r = np.random.default_rng(int.from_bytes(os.urandom(4), "little"))
q = 1.5 * r.standard_normal((1, 1024, 4, 64))
k = rr.round_bf16(r.standard_normal((1, 1024, 2, 64)))
# rows 1021-1023 lean towards key 0 (its logit ~2.4 above their mean: P ~ 0.4%), the key a
# window of 1020 takes from them below. On purely random draws 2 of 60 such outputs passed
# `flashattn check` (the keys left out happened to weigh little): a flaky test. With the lean,
# 60 of 60 failed it by the row rule (worst row 1.9-6.7x its bound), most by the element rule
# too, and the correct FA2 model passed 60 of 60.
q[0, 1021:, :, :] += 0.3 * k[0, 0, [0, 0, 1, 1], :]
q = rr.round_bf16(q)
v = r.standard_normal((1, 1024, 2, 64))
v[..., 5] *= 100  # an outlier channel: P's rounding then dominates the row errors
v = rr.round_bf16(v)
for name, x in (("qb", q), ("kb", k), ("vb", v)):
    rr.save(name + ".npy", x, "bf16")
rr.save("ob.npy", rr.kernel("fa2", q, k, v, rr.round_bf16, True, 128, 1), "bf16")
PY
if mr 2 check -q qb.npy -k kb.npy -v vb.npy --out ob.npy --causal >check.txt && grep -q "^  row rule: 0 of 4096 rows" check.txt
then ok; else bad "flashattn-mpi check rejects a correct bf16 FA2-style output (or no row rule line)"; cat check.txt; fi
"$fa" run -q qb.npy -k kb.npy -v vb.npy -o ow.npy --window 1020,0 --dtype-out bf16 >/dev/null
"$fa" check -q qb.npy -k kb.npy -v vb.npy --out ow.npy --causal >check1.txt
rc1=$?
mr 2 check -q qb.npy -k kb.npy -v vb.npy --out ow.npy --causal >check.txt 2>/dev/null
rc=$?
# (the element rule alone passed it before the row rule: rows 1021-1023 lose 1-3 of ~1000 keys,
# key 0 among them)
if [ $rc = 1 ] && [ $rc1 = 1 ] && grep -q "^  row rule: [1-9][0-9]* of 4096 rows over it" check.txt &&
    grep -q "^row rule: [1-9][0-9]* of 4096 rows over it" check1.txt; then ok
else bad "a window of 1020 keys for a causal mask at 1024: flashattn-mpi check exit $rc, flashattn check $rc1 (want 1, 1, rows over the row rule in both)"
    cat check.txt check1.txt; fi

# bad input: exit 2 on every rank, one message, nothing written
refuse() { # refuse NP WHAT ARGS...
    np_=$1; what=$2; shift 2
    rm -f out.npy
    mr "$np_" "$@" >out.txt 2>err.txt
    rc=$?
    n=$(grep -c "^flashattn" err.txt)
    if [ $rc != 0 ] && [ "$n" = 1 ] && [ ! -e out.npy ] && ! grep -q "Exit code: *[013-9]" err.txt; then ok; else
        bad "$what: exit $rc, $n message lines (want 1), out.npy $( [ -e out.npy ] && echo written || echo absent)"
        cat err.txt
    fi
}
refuse 4 "seqlen 50 over 4 ranks" run -q q50.npy -k q50.npy -v q50.npy -o out.npy
refuse 3 "50 rows over 3 ranks, zigzag (6 chunks)" run -q q50.npy -k q50.npy -v q50.npy -o out.npy --causal
refuse 2 "missing file" run -q nothere.npy -k k.npy -v v.npy -o out.npy
refuse 3 "unknown option" run -q q.npy -k k.npy -v v.npy -o out.npy --bogus
refuse 2 "ALiBi" run -q q.npy -k k.npy -v v.npy -o out.npy --alibi q.npy
# parsed by the shared option parser: refused over the ring, never silently dropped (hostile test)
python3 -c "import numpy as np; np.save('sinks.npy', np.ones(4, np.float32)); np.save('cos.npy', np.ones((64, 4), np.float32))"
refuse 2 "attention sinks" run -q q.npy -k k.npy -v v.npy -o out.npy --sinks sinks.npy
refuse 2 "attention sinks" check -q q.npy -k k.npy -v v.npy -o q.npy --sinks sinks.npy
refuse 2 "dropout" grad -q q.npy -k k.npy -v v.npy --dout q.npy --dq dq.npy --dk dk.npy --dv dv.npy --dropout-p 0.3 --dropout-mask sinks.npy
refuse 2 "rotary" run -q q.npy -k k.npy -v v.npy -o out.npy --rotary-cos cos.npy --rotary-sin cos.npy
# an MPMD launch where one rank's arguments are bad stops every rank (it hung: hostile test)
for bad in 1 0; do
    rm -f out.npy
    if [ $bad = 1 ]; then a0=""; a1="--bogus"; else a0="--bogus"; a1=""; fi
    timeout 60 mpirun --oversubscribe --allow-run-as-root --bind-to none -np 1 "$fm" run -q q.npy -k k.npy -v v.npy \
        -o out.npy $a0 : -np 1 "$fm" run -q q.npy -k k.npy -v v.npy -o out.npy $a1 >out.txt 2>err.txt
    rc=$?
    if [ $rc != 0 ] && [ $rc != 124 ] && [ ! -e out.npy ] && [ "$(grep -c '^flashattn' err.txt)" = 1 ]; then ok
    else bad "MPMD, bad option on rank $bad: exit $rc (124 = hung), $(grep -c '^flashattn' err.txt) message lines"; fi
done
# the default rule's baseline must exist (hostile review): inputs the dtype cannot hold, and a
# float32 baseline whose sums overflow, are refused (they gave an infinite bound: garbage passed)
python3 - <<'PY'
import numpy as np
r = np.random.default_rng(5)
v = r.standard_normal((2, 96, 2, 24)).astype(np.float32)
v[1, 7, 0, 3] = 1e5  # beyond f16's 65504
np.save("v_f16big.npy", v)
np.save("g.npy", (100 * r.standard_normal((2, 48, 4, 24))).astype(np.float32))
np.save("q5.npy", (0.1 * r.standard_normal((1, 64, 1, 16))).astype(np.float32))
np.save("k5.npy", r.standard_normal((1, 64, 1, 16)).astype(np.float32))
np.save("v5.npy", (1e37 * (1 + r.random((1, 64, 1, 16)))).astype(np.float32))  # f32 sums overflow
np.save("g5.npy", r.standard_normal((1, 64, 1, 16)).astype(np.float32))
PY
refuse 2 "V beyond f16 under --dtype f16" check -q q.npy -k k.npy -v v_f16big.npy --out g.npy --dtype f16
grep -q "v_f16big.npy: element \[1,7,0,3\] = 100000 overflows f16" err.txt || bad "the f16 overflow message names no element"
refuse 2 "a float32 baseline that overflows" check -q q5.npy -k k5.npy -v v5.npy --out g5.npy
# NaN in the tested output fails (exit 1), it is not bad input; an LSE's -inf for an empty row is accepted
python3 -c "import numpy as np; o=np.load('o_sp.npy'); o[0,10,1,3]=np.nan; np.save('o_nan.npy', o)"
mr 2 check -q q.npy -k k.npy -v v.npy --out o_nan.npy --causal >check.txt 2>err.txt
rc=$?
if [ $rc = 1 ] && grep -q "FAIL" check.txt; then ok; else bad "a NaN in the tested output: exit $rc (want 1)"; cat err.txt; fi
python3 -c "
import numpy as np; r=np.random.default_rng(6)
np.save('qe.npy', r.standard_normal((1, 96, 2, 16)).astype(np.float32))
np.save('ke.npy', r.standard_normal((1, 48, 2, 16)).astype(np.float32))
np.save('ve.npy', r.standard_normal((1, 48, 2, 16)).astype(np.float32))"
"$fa" run -q qe.npy -k ke.npy -v ve.npy -o oe.npy --lse le.npy --causal >/dev/null
python3 -c "import numpy as np,sys; sys.exit(0 if np.isneginf(np.load('le.npy')).any() else 1)" || bad "le.npy has no -inf row"
if mr 2 check -q qe.npy -k ke.npy -v ve.npy --out oe.npy --lse le.npy --causal >check.txt 2>err.txt; then ok
else bad "an LSE with -inf for the empty rows (causal, seqlen_q 96 > seqlen_k 48) was not accepted"; cat err.txt; fi
refuse 2 "dtype-out bf16" run -q q.npy -k k.npy -v v.npy -o out.npy --dtype-out bf16
refuse 3 "dO of the wrong shape" grad -q q.npy -k k.npy -v v.npy --dout q.npy --dq out.npy --dk dk.npy --dv dv.npy
refuse 2 "bad layout" run -q q.npy -k k.npy -v v.npy -o out.npy --layout spiral
# one rank takes any length, also under --causal (zigzag needs none with P = 1)
if mr 1 run -q q50.npy -k q50.npy -v q50.npy -o o50.npy --causal >/dev/null &&
    "$fa" run -q q50.npy -k q50.npy -v q50.npy -o o50_sp.npy --causal >/dev/null && same o50.npy o50_sp.npy; then ok
else bad "run -np 1 --causal on 50 rows: refused or not the single-process bits"; fi

echo "test_mpi_cli: $pass passed, $fail failed"
[ "$fail" = 0 ]
