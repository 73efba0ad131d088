#!/usr/bin/env python3
"""Regenerate the .npy fixtures of tests/test_npy.c with numpy.

The files are committed so the C tests do not need numpy; this script records
exactly how they were made. Values are chosen to be exact in every dtype, so
the C test can compare bit for bit:

  f32_2x3.npy      '<f4' (2, 3)        arange(6) / 2
  f64_1x2x3x4.npy  '<f8' (1, 2, 3, 4)  arange(24) / 4 - 3
  f16_4.npy        '<f2' (4,)          [1, -2.5, 2**-24 (smallest subnormal), 65504 (largest)]
  bf16_2x2.npy     '<u2' (2, 2)        bfloat16 bit patterns of [1, -2, 0.5, 3.140625]
  f32_v2.npy       '<f4' (4,)          arange(4), written as format version 2.0
  f32_scalar.npy   '<f4' ()            7.0 (rank 0)
  f32_0x3.npy      '<f4' (0, 3)        empty
  f32_fortran.npy  '<f4' (2, 3)        arange(6), Fortran order (must be rejected)
  i4_3.npy         '<i4' (3,)          arange(3): an int32 index file (raw integers, not a tensor)
  i4_2x3.npy       '<i4' (2, 3)        [INT32_MIN, -1, 0, 1, 7, INT32_MAX]
  i4_0.npy         '<i4' (0,)          empty (an index file of batch 0)
  i4_big_3.npy     '>i4' (3,)          (must be rejected: big-endian)
  u1_4.npy         '|u1' (4,)          [0, 1, 127, 255]: a uint8 code file
  u1_1x2x3x2.npy   '|u1' (1, 2, 3, 2)  (arange(12) * 21 + 3) % 256
  f4_big_3.npy     '>f4' (3,)          (must be rejected: big-endian)
  f32_v3.npy       '<f4' (2,)          format version 3.0 (must be rejected)
"""
import os
import numpy as np
from numpy.lib import format as npf

here = os.path.dirname(os.path.abspath(__file__))


def save(name, arr, version=None):
    with open(os.path.join(here, name), "wb") as f:
        npf.write_array(f, arr, version=version)


save("f32_2x3.npy", (np.arange(6, dtype="<f4") / 2).reshape(2, 3))
save("f64_1x2x3x4.npy", (np.arange(24, dtype="<f8") / 4 - 3).reshape(1, 2, 3, 4))
save("f16_4.npy", np.array([1.0, -2.5, 2.0**-24, 65504.0], dtype="<f2"))
bits = (np.array([1.0, -2.0, 0.5, 3.140625], dtype="<f4").view("<u4") >> 16).astype("<u2")
save("bf16_2x2.npy", bits.reshape(2, 2))
save("f32_v2.npy", np.arange(4, dtype="<f4"), version=(2, 0))
save("f32_scalar.npy", np.array(7.0, dtype="<f4"))
save("f32_0x3.npy", np.zeros((0, 3), dtype="<f4"))
save("f32_fortran.npy", np.asfortranarray(np.arange(6, dtype="<f4").reshape(2, 3)))
save("i4_3.npy", np.arange(3, dtype="<i4"))
save("i4_2x3.npy", np.array([-2**31, -1, 0, 1, 7, 2**31 - 1], dtype="<i4").reshape(2, 3))
save("i4_0.npy", np.zeros((0,), dtype="<i4"))
save("i4_big_3.npy", np.arange(3, dtype=">i4"))
save("u1_4.npy", np.array([0, 1, 127, 255], dtype="|u1"))
save("u1_1x2x3x2.npy", ((np.arange(12) * 21 + 3) % 256).astype("|u1").reshape(1, 2, 3, 2))
save("f4_big_3.npy", np.arange(3, dtype=">f4"))
save("f32_v3.npy", np.arange(2, dtype="<f4"), version=(3, 0))
