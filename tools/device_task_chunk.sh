#!/bin/sh
# tools/device_task_chunk.sh OUTDIR — for the 16-core device host, in ONE call: does handing a
# thread several consecutive pieces of one head (src/flash.c, task_chunk) beat the
# heads-interleaved order at 16 threads? At N = 1024 a 64-row piece streams its head's whole
# packed K/V (1.1 MiB at d = 128) for 64 rows; pieces of one head in a row on one thread find
# it in L2. Each row runs tools/ab_chunk.c: the settings alternate call by call in one process
# (threads pinned), which is the only comparison that holds on this host (two runs of one
# binary there differ by up to 15%); then PyTorch's CPU SDPA on the same rows, once.
#   usage (from the repository root): sh tools/device_task_chunk.sh OUTDIR   (about 5 minutes)
#   environment: THREADS (16), SETTINGS ("0 8 4 0": interleaved, 8 and 4 pieces a grab, and
#   interleaved again as the control), ROWS (lines "N D ROUNDS|options"), TORCH_N (1024,2048,4096),
#   FLAGS (more ab_chunk options, e.g. --tail: tools/device_tail_split.sh), TORCH (1; 0 skips
#   PyTorch), LOG (task_chunk.log)
set -u
out=${1:-/tmp/task_chunk}
threads=${THREADS:-16}
settings=${SETTINGS:-"0 8 4 0"}
log=$out/${LOG:-task_chunk.log}
mkdir -p "$out"
make -j16 build/libflashattn.a >/dev/null 2>&1 || { echo "the library did not build"; exit 1; }
ab=$out/ab_chunk
cc -std=c11 -O2 -D_POSIX_C_SOURCE=200809L -Iinclude -Isrc -Itools tools/ab_chunk.c build/libflashattn.a \
    -fopenmp -lm -o "$ab" || exit 1
export OMP_PROC_BIND=close OMP_PLACES=cores
lscpu | sed -n '/Model name/p;/^L1d/p;/^L2/p;/^L3/p' | tee "$log"
rows=${ROWS:-'1024 128 300|
1024 64 400|
2048 128 80|
2048 64 150|
4096 128 20|
4096 64 40|
1024 128 400|--causal
1024 64 500|--causal'}
echo "$rows" | while IFS='|' read -r nd extra; do
    set -- $nd
    "$ab" "$1" "$2" 8 "$threads" "$3" $extra ${FLAGS:-} -- $settings
done 2>&1 | tee -a "$log"
[ "${TORCH:-1}" = 0 ] || python3 tools/torch_cpu_sdpa.py --n "${TORCH_N:-1024,2048,4096}" --d 64,128 --threads "$threads" --causal 0,1 \
    --repeats 7 2>&1 | tail -13 | tee -a "$log"
rm -f "$ab"
