#!/bin/sh
# tools/dtype_cost.sh [BUILD] — float16 and bfloat16 inputs against float32, side
# by side (tools/mask_cost.sh with the dtypes as its variants; same env: N, D,
# H, THREADS, ROUNDS, PASS, FA_ISA; FA_FLASH_SHARED_MAX=0 for the per-tile
# packing that long sequences take). Indicative on a shared machine.
set -eu
VARIANTS="f32|
bf16|--dtype bf16
f16|--dtype f16" exec sh "$(dirname "$0")/mask_cost.sh" "$@"
