#!/usr/bin/env python3
"""make_seeds.py -- write the committed libFuzzer seed corpora (tests/fuzz/corpus/).

  npy/        valid .npy files of every accepted dtype and both versions (written
              by numpy), plus every malformed file of tests/corpus/bad/
  attention/  16-byte problem headers (see fuzz_attention.c) covering each option
  cli_args/   a subcommand byte, then NUL-separated argument vectors (see fuzz_cli_args.c)

Deterministic; rerun after changing it and commit the result.
"""

import io
import os
import shutil

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "corpus")


def clean(name):
    path = os.path.join(CORPUS, name)
    os.makedirs(path, exist_ok=True)
    for f in os.listdir(path):
        os.remove(os.path.join(path, f))
    return path


def npy_seeds():
    out = clean("npy")
    rng = np.random.default_rng(1)

    def save(name, arr, version=None):
        buf = io.BytesIO()
        if version is None:
            np.save(buf, arr)
        else:
            np.lib.format.write_array(buf, arr, version=version)
        with open(os.path.join(out, name), "wb") as f:
            f.write(buf.getvalue())

    save("f32_bshd.npy", rng.standard_normal((1, 3, 2, 4)).astype("<f4"))
    save("f64_rank1.npy", rng.standard_normal(5).astype("<f8"))
    save("f16_rank2.npy", rng.standard_normal((2, 3)).astype("<f2"))
    save("bf16_bits.npy", rng.integers(0, 1 << 16, size=(2, 2, 1, 3), dtype=np.uint16))
    save("scalar.npy", np.array(1.5, dtype="<f4"))
    save("empty.npy", np.zeros((0, 3), dtype="<f4"))
    save("v2.npy", rng.standard_normal((2, 2)).astype("<f4"), version=(2, 0))
    save("nan.npy", np.array([1.0, np.nan, np.inf], dtype="<f4"))
    save("i32_cu_seqlens.npy", np.array([0, 3, 3, 7], dtype="<i4"))
    save("i32_block_table.npy", rng.integers(-2**31, 2**31, size=(2, 3), dtype="<i4"))
    save("u8_codes.npy", rng.integers(0, 256, size=(1, 2, 2, 4), dtype=np.uint8))
    bad = os.path.join(HERE, "..", "corpus", "bad")
    for f in sorted(os.listdir(bad)):
        shutil.copy(os.path.join(bad, f), os.path.join(out, "bad_" + f))


def attention_seeds():
    out = clean("attention")
    # byte: 0 B, 1 Sq, 2 Sk, 3 heads, 4 d, 5 dv, 6 dtypes, 7 flags, 8 wl, 9 wr,
    #       10 softcap/scale, 11 block_q, 12 block_k, 13 amp/slope, 14 lse dtype/layouts, 15 -
    seeds = {
        "plain": [0, 17, 17, 0, 15, 15, 0, 0x40, 0, 0, 0, 0, 0, 1, 0, 0],
        "causal_q_longer": [0, 33, 9, 0, 7, 7, 0, 0x41, 0, 0, 0, 0, 0, 1, 0, 0],
        "causal_small_blocks": [1, 29, 31, 4, 8, 5, 0, 0x41, 0, 0, 0, 3, 5, 1, 0x1e, 0],
        "window": [0, 20, 40, 1, 3, 3, 0, 0x46, 4, 2, 0, 7, 9, 1, 0, 0],
        "softcap_alibi": [1, 25, 25, 2, 16, 16, 0, 0x59, 0, 0, 0x0d, 0, 0, 0x13, 1, 0],
        "alibi_batch_head": [1, 12, 30, 5, 9, 4, 0, 0x60, 0, 0, 0, 0, 0, 0x25, 0, 0],
        "gqa_dtypes": [1, 14, 14, 7, 20, 11, 0b11100110, 0x41, 0, 0, 0, 2, 2, 2, 0x10, 0],
        "bf16_out": [0, 9, 9, 0, 4, 4, 0b11111111, 0x40, 0, 0, 0, 0, 0, 1, 0, 0],
        "zero_stride_k": [0, 8, 47, 1, 5, 6, 0, 0xc1, 0, 0, 0, 0, 0, 1, 0, 0],
        "empty_seqlen_k": [0, 8, 0, 0, 5, 6, 0, 0x41, 0, 0, 0, 0, 0, 1, 0, 0],
        "d_one": [0, 47, 47, 0, 0, 0, 0, 0x41, 0, 0, 0, 1, 1, 3, 0, 0],
    }
    for name, h in seeds.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(bytes(h) + bytes(range(32)))


def cli_seeds():
    out = clean("cli_args")
    seeds = {
        "minimal": ["-q", "Q", "-k", "K", "-v", "V", "-o", "O"],
        "all_mask_options": ["-q", "Q", "-k", "K", "-v", "V", "-o", "O", "--lse", "L", "--causal",
                             "--window", "3,-1", "--softcap", "30", "--scale", "0.125",
                             "--alibi", "A", "--impl", "reference", "--threads", "2"],
        "window_both": ["-q", "Q", "-k", "K", "-v", "V", "-o", "O", "--window", "-1,4"],
        "bad_window": ["-q", "Q", "-k", "K", "-v", "V", "-o", "O", "--window", "3"],
        "bad_number": ["-q", "Q", "-k", "K", "-v", "V", "-o", "O", "--softcap", "1e999"],
        "missing_value": ["-q", "Q", "-k"],
        "unknown_flag": ["--frobnicate", "-q", "Q"],
        "help": ["--help"],
        "equals_form": ["--impl=flash", "--scale=nan", "-qQ"],
        "negative_threads": ["-q", "Q", "-k", "K", "-v", "V", "-o", "O", "--threads", "-3"],
    }
    for name, argv in seeds.items():
        with open(os.path.join(out, name), "wb") as f:
            # first byte: subcommand (0 run, 1 check, 2 info), then NUL-separated argv[1..]
            f.write(bytes([0]) + b"\0".join(a.encode() for a in argv))
    with open(os.path.join(out, "check_options"), "wb") as f:
        f.write(bytes([1]) + b"\0".join([b"-q", b"Q", b"-k", b"K", b"-v", b"V", b"--out", b"O",
                                          b"--dtype", b"bf16", b"--atol", b"1e-3", b"--rtol", b"0",
                                          b"--sample-rows", b"4", b"--seed", b"7"]))
    with open(os.path.join(out, "info"), "wb") as f:
        f.write(bytes([2]))
    with open(os.path.join(out, "grad_options"), "wb") as f:
        f.write(bytes([3]) + b"\0".join([b"-q", b"Q", b"-k", b"K", b"-v", b"V", b"--dout", b"DO",
                                          b"--dq", b"DQ", b"--dk", b"DK", b"--dv", b"DV", b"--causal",
                                          b"--impl", b"reference", b"--dtype-out", b"bf16"]))
    with open(os.path.join(out, "check_grad_options"), "wb") as f:
        f.write(bytes([4]) + b"\0".join([b"-q", b"Q", b"-k", b"K", b"-v", b"V", b"--dout", b"DO",
                                          b"--dq", b"DQ", b"--dk", b"DK", b"--dv", b"DV",
                                          b"--dtype", b"f16", b"--atol", b"1e-2", b"--rtol", b"0.5"]))


if __name__ == "__main__":
    npy_seeds()
    attention_seeds()
    cli_seeds()
    print("seeds written under", CORPUS)
