#!/bin/sh
# tools/gpu_mpi_row_rule.sh OUTDIR [--long] — on the GPU machine: `flashattn-mpi check`'s bf16/f16 rules
# (docs/distributed.md, "The command": P's rounding allowance and the row rule over the ring)
# against real kernels' outputs — PyTorch SDPA's backends on tools/row_rule_sdpa.py's grid and
# on 8192-16384 keys, and a real kernel run with a window where causal was meant — judged by
# mpirun -np ${NP:-4} ranks of ${THREADS:-4} threads.
#   The host has no mpicc and no Open MPI: carry build/flashattn-mpi (make mpi, here) and
#   build/ompi-debs (sh tools/ompi_debs.sh download); they are unpacked under /tmp, not installed.
# Log: OUTDIR/sdpa_mpi.log.
set -u
OUT=${1:-build/mpi_row_rule}
[ $# -gt 0 ] && shift
mkdir -p "$OUT"
if ! command -v mpirun >/dev/null; then
    for f in build/ompi-debs/*.deb; do dpkg -x "$f" /tmp/ompi; done
    export OPAL_PREFIX=/tmp/ompi/usr PATH="/tmp/ompi/usr/bin:$PATH"
    export LD_LIBRARY_PATH="/tmp/ompi/usr/lib/x86_64-linux-gnu:/tmp/ompi/usr/lib/x86_64-linux-gnu/openmpi/lib:${LD_LIBRARY_PATH:-}"
fi
mpirun --version | head -1
[ -x build/flashattn-mpi ] || { echo "gpu_mpi_row_rule: no build/flashattn-mpi (make mpi here, then carry it)"; exit 2; }
ldd build/flashattn-mpi | grep "not found"
make -j"$(nproc)" build/libflashattn.so >"$OUT/build.log" 2>&1 || { echo "gpu_mpi_row_rule: build failed"; tail -20 "$OUT/build.log"; exit 2; }
FA_MPI_NP=${NP:-4} FA_MPI_THREADS=${THREADS:-4} FA_MPIRUN="mpirun --allow-run-as-root --oversubscribe --bind-to none" \
    FA_BUILD=build PYTHONUNBUFFERED=1 python3 tools/row_rule_sdpa.py "$@" 2>&1 | tee "$OUT/sdpa_mpi.log"
