#!/bin/sh
# test_cli_extremes.sh — regression tests for the LIBRARY halves of issue 17
# (items 17.3 and 17.7's scratch per thread), through the CLI. The ranges are
# fa_resolve's (include/flashattn.h FA_SCALE_MAX, FA_SOFTCAP_*, FA_ALIBI_BIAS_MAX;
# docs/semantics.md).
#
# Usage: sh tests/test_cli_extremes.sh BUILD_DIR
#
# 17.3: extreme accepted values must be computed right or refused (exit 2,
#       one line), never exit 0 with a wrong or non-finite result:
#         --softcap 1e-50 (flash ignores it today), --softcap 1e39 (NaN),
#         --softcap 1e300 (wrong O, LSE = inf), an ALiBi slope of -1e37 (NaN in
#         flash and standard), --scale 1e39 (all NaN, exit 0).
#       "Right" is the float64 reference (--impl reference), which is correct
#       for all of these; each implementation is compared with it.
# 17.7: scratch is allocated per thread that gets a task, not per requested
#       thread: a 4-token problem at --threads 1024 must not make the library
#       allocate gigabytes (4.2 GB today). Measured with bench's lib_peak_mib
#       (the library's own allocation counter), bounded by 64 MiB (about 2 MiB
#       with the fix; tests/test_memory.c also pins fa_workspace_bytes).
set -u
. "$(dirname "$0")/cli_test_lib.sh"
cli_test_setup test_cli_extremes "${1:-build}"

python3 - <<'EOF' || { echo "test_cli_extremes.sh: generating inputs failed"; exit 1; }
import numpy as np
rng = np.random.default_rng(173)
def rand(*shape):
    return rng.uniform(-1, 1, size=shape).astype("<f4")
B, Sq, Sk, H, d = 1, 24, 40, 2, 16
np.save("q.npy", rand(B, Sq, H, d))
np.save("k.npy", rand(B, Sk, H, d))
np.save("v.npy", rand(B, Sk, H, d))
np.save("alibi_huge.npy", np.array([-1e37, 0.5], dtype="<f4"))
# just inside the range: |slope| x (max(Sq, Sk) - 1) = 4e36 x 39 = 1.56e38 <= FLT_MAX / 2
np.save("alibi_edge.npy", np.array([-4e36, 4e36], dtype="<f4"))
EOF

must_run=0 # 1: the case is inside the accepted ranges and must be computed, not refused
# case DESC ARGS...: every implementation either refuses (exit 2, one line) or
# matches the float64 reference (O within 1e-5, LSE within 1e-5 relative, both
# finite where the reference is).
case_() {
    desc=$1; shift
    if ! "$fa" run -q q.npy -k k.npy -v v.npy -o ref_o.npy --lse ref_l.npy --impl reference "$@" >out.txt 2>err.txt; then
        if [ "$must_run" = 1 ]; then bad "$desc: inside the range, the reference refused: $(cat err.txt)"; return; fi
        # the reference refusing is fine only if everyone refuses
        for impl in flash standard; do
            "$fa" run -q q.npy -k k.npy -v v.npy -o o.npy --impl $impl "$@" >out.txt 2>err.txt
            rc=$?
            if [ "$rc" = 2 ] && [ "$(wc -l <err.txt)" = 1 ]; then ok; else bad "$desc: reference refused, $impl exit $rc"; fi
        done
        return
    fi
    for impl in flash standard; do
        rm -f o.npy l.npy
        "$fa" run -q q.npy -k k.npy -v v.npy -o o.npy --lse l.npy --impl $impl "$@" >out.txt 2>err.txt
        rc=$?
        if [ "$rc" = 2 ] && [ "$(wc -l <err.txt)" = 1 ] && [ "$must_run" = 0 ]; then ok; continue; fi
        if [ "$rc" != 0 ]; then bad "$desc: $impl exit $rc $(cat err.txt)"; continue; fi
        if python3 - <<'EOF'; then ok; else bad "$desc: $impl exit 0 with a result unlike the reference"; fi
import numpy as np, sys
o, l, ro, rl = (np.load(f).astype(np.float64) for f in ("o.npy", "l.npy", "ref_o.npy", "ref_l.npy"))
bad = []
if not np.isfinite(o).all(): bad.append("non-finite O")
elif np.abs(o - ro).max() > 1e-5: bad.append(f"O error {np.abs(o - ro).max():.3g}")
fin = np.isfinite(rl)
if not np.array_equal(np.isfinite(l), fin): bad.append("LSE finiteness differs")
elif fin.any() and (np.abs(l[fin] - rl[fin]) / np.maximum(1, np.abs(rl[fin]))).max() > 1e-5: bad.append("LSE differs")
if bad: sys.exit(print("; ".join(bad)) or 1)
EOF
    done
}

case_ "--softcap 1e-50" --softcap 1e-50
case_ "--softcap 1e39" --softcap 1e39
case_ "--softcap 1e300" --softcap 1e300
case_ "ALiBi slope -1e37" --alibi alibi_huge.npy
case_ "--scale 1e39" --scale 1e39
case_ "--scale 1e39 causal" --scale 1e39 --causal
# check accepts exactly what run accepts: it refuses the same values (exit 2, one line)
"$fa" run -q q.npy -k k.npy -v v.npy -o plain.npy >/dev/null 2>&1 || bad "plain run failed"
for args in "--softcap 1e-50" "--softcap 1e39" "--softcap 1e300" "--alibi alibi_huge.npy" "--scale 1e39"; do
    # shellcheck disable=SC2086
    "$fa" check -q q.npy -k k.npy -v v.npy -o plain.npy $args >out.txt 2>err.txt
    rc=$?
    if [ "$rc" = 2 ] && [ "$(wc -l <err.txt)" = 1 ]; then ok; else bad "check $args: exit $rc $(cat err.txt)"; fi
done

# just inside the accepted ranges: computed (never refused), and right
must_run=1
case_ "--softcap 1e-30" --softcap 1e-30
case_ "--softcap 1e37" --softcap 1e37
case_ "ALiBi slopes +-4e36" --alibi alibi_edge.npy
case_ "--scale 1e-300" --scale 1e-300
case_ "--scale 1e38 --softcap 2" --scale 1e38 --softcap 2

# 17.7: scratch per thread that gets a task
if "$fa" bench --impl flash --n 4 --d 64 --heads 1 --threads 1024 --repeats 1 --warmup 0 --no-check --csv t.csv \
        >out.txt 2>err.txt; then
    mib=$(python3 -c "import csv; print(next(csv.DictReader(open('t.csv')))['lib_peak_mib'])")
    if python3 -c "import sys; sys.exit(0 if float('$mib') <= 64 else 1)"; then ok
    else bad "a 4-token problem at --threads 1024 made the library allocate $mib MiB"; fi
else
    bad "bench at --threads 1024: exit $? $(cat err.txt)"
fi

echo "test_cli_extremes.sh: $pass passed, $fail failed"
[ "$fail" = 0 ]
