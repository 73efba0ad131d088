#!/usr/bin/env python3
"""make_corpus.py -- write the malformed/inconsistent .npy corpus (tests/corpus/).

Every case is one bad file that replaces one of a valid trio good_q.npy,
good_k.npy, good_v.npy (or is passed as --alibi) in `flashattn run`.
tests/test_corpus.sh expects, for every case: exit status 2, exactly one line
on stderr, and no output file left behind. The files are committed; rerun
this script (deterministic) after changing it and commit the result.

cases.tsv columns: file, role (q|k|v|alibi), names_file (1 when the message
must name the bad file: problems inside one file, as opposed to
inconsistencies between files), description.
"""

import os
import struct

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
BAD = os.path.join(HERE, "bad")

# The valid trio: B=1, Sq=4, Sk=5, H=2 (= heads_k), d=8, float32.
GOOD = {"q": (1, 4, 2, 8), "k": (1, 5, 2, 8), "v": (1, 5, 2, 8)}


def values(shape, seed):
    n = int(np.prod(shape)) if len(shape) else 1
    return ((np.arange(n, dtype=np.float64) * 0.37 + seed) % 2.0 - 1.0).reshape(shape)


def header_bytes(header, version=(1, 0), pad=True):
    """Magic + version + length + header text, padded to a 64-byte boundary like numpy."""
    text = header.encode("latin1") if isinstance(header, str) else header
    lenfmt, prefix = ("<H", 10) if version[0] == 1 else ("<I", 12)
    if pad:
        total = prefix + len(text) + 1
        text += b" " * ((64 - total % 64) % 64) + b"\n"
    return b"\x93NUMPY" + bytes(version) + struct.pack(lenfmt, len(text)) + text


def npy(descr="<f4", fortran=False, shape=(1, 4, 2, 8), data=None, version=(1, 0)):
    """A .npy image built by hand (so that it can be made wrong on purpose)."""
    hdr = "{'descr': '%s', 'fortran_order': %s, 'shape': %s, }" % (
        descr, "True" if fortran else "False", repr(tuple(shape)))
    if data is None:
        data = values(shape, 0.25).astype(np.dtype(descr)).tobytes()
    return header_bytes(hdr, version) + data


def good_bytes(role, dtype="<f4"):
    shape = GOOD[role]
    return npy(descr=dtype, shape=shape,
               data=values(shape, {"q": 0.1, "k": 0.5, "v": 0.9}[role]).astype(dtype).tobytes())


def with_value(role, index, value):
    shape = GOOD[role]
    a = values(shape, 0.3).astype(np.float32).reshape(-1)
    a[index] = value
    return npy(shape=shape, data=a.tobytes())


def cases():
    q = good_bytes("q")
    f4 = lambda shape: values(shape, 0.7).astype("<f4").tobytes()  # noqa: E731
    yield "empty_file", "q", 1, "zero bytes", b""
    yield "bad_magic", "q", 1, "magic string is not \\x93NUMPY", b"\x93NUMPX" + q[6:]
    yield "not_npy_text", "k", 1, "a text file", b"hello, this is not a numpy file\n"
    yield "only_magic", "q", 1, "file ends right after the magic and version", q[:8]
    yield "truncated_header_length", "q", 1, "file ends inside the header-length field", q[:9]
    yield "truncated_header", "q", 1, "file ends inside the header text", q[:40]
    hdr_len = struct.unpack("<H", q[8:10])[0]
    yield ("header_past_end", "k", 1, "header length points past the end of the file",
           q[:8] + struct.pack("<H", 60000) + q[10:])
    yield "truncated_data", "v", 1, "data is 4 bytes short", good_bytes("v")[:-4]
    yield "truncated_data_half", "q", 1, "only half of the data", q[:10 + hdr_len + 64]
    yield "trailing_bytes", "v", 1, "8 extra bytes after the data", good_bytes("v") + b"\0" * 8
    yield "unsupported_version_9", "q", 1, "format version 9.0", q[:6] + b"\x09\x00" + q[8:]
    yield ("unsupported_version_3", "q", 1, "format version 3.0 (utf8 header)",
           npy(shape=GOOD["q"], version=(3, 0)))
    yield "dtype_int32", "q", 1, "descr '<i4'", npy(descr="<i4", shape=GOOD["q"])
    yield ("dtype_big_endian", "k", 1, "descr '>f4'",
           npy(descr=">f4", shape=GOOD["k"], data=values(GOOD["k"], 0).astype(">f4").tobytes()))
    yield ("dtype_complex", "v", 1, "descr '<c8'",
           npy(descr="<c8", shape=GOOD["v"], data=values(GOOD["v"], 0).astype("<c8").tobytes()))
    yield ("dtype_uint32", "q", 1, "descr '<u4'",
           npy(descr="<u4", shape=GOOD["q"], data=b"\0" * (4 * 64)))
    yield ("dtype_garbage", "q", 1, "descr 'nonsense'",
           npy(descr="nonsense", shape=GOOD["q"], data=f4(GOOD["q"])))
    yield ("dtype_structured", "q", 1, "a structured dtype (descr is a list)",
           header_bytes("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1, 4, 2, 8), }")
           + f4(GOOD["q"]))
    yield "fortran_order", "k", 1, "fortran_order True", npy(fortran=True, shape=GOOD["k"],
                                                             data=f4(GOOD["k"]))
    yield "negative_shape", "q", 1, "shape (1, -4, 2, 8)", npy(shape=(1, -4, 2, 8), data=f4(GOOD["q"]))
    yield ("overflowing_shape", "q", 1, "shape whose element count overflows 64 bits",
           npy(shape=(1 << 40, 1 << 40, 2, 8), data=f4(GOOD["q"])))
    yield ("overflowing_bytes", "k", 1, "element count fits 63 bits but bytes do not",
           npy(shape=(1 << 31, 1 << 30, 1, 1), data=f4(GOOD["k"])))
    yield ("shape_larger_than_int64", "q", 1, "an extent above 2^63",
           npy(shape=(1 << 64, 1, 1, 1), data=f4((1,))))
    yield ("huge_shape_small_file", "v", 1, "shape promises 6.4 GB, file holds 320 bytes",
           npy(shape=(1, 100000000, 2, 8), data=f4(GOOD["v"])))
    yield "rank_3", "q", 0, "q has rank 3", npy(shape=(4, 2, 8), data=f4((4, 2, 8)))
    yield "rank_5", "k", 0, "k has rank 5", npy(shape=(1, 1, 5, 2, 8), data=f4((1, 1, 5, 2, 8)))
    yield "rank_0", "v", 0, "v is a scalar", npy(shape=(), data=f4(()))
    yield ("shape_as_list", "q", 1, "shape written as a list, not a tuple",
           header_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': [1, 4, 2, 8], }")
           + f4(GOOD["q"]))
    yield ("shape_with_float", "q", 1, "a float extent",
           header_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (1, 4.0, 2, 8), }")
           + f4(GOOD["q"]))
    yield ("header_missing_shape", "k", 1, "no 'shape' key",
           header_bytes("{'descr': '<f4', 'fortran_order': False, }") + f4(GOOD["k"]))
    yield ("header_extra_key", "k", 1, "an unknown key besides the three",
           header_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (1, 5, 2, 8), 'x': 1, }")
           + f4(GOOD["k"]))
    yield ("header_not_a_dict", "v", 1, "header is not a dict literal",
           header_bytes("hello world") + f4(GOOD["v"]))
    yield ("header_unterminated", "q", 1, "header dict never closes",
           header_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (1, 4, 2, 8), ")
           + f4(GOOD["q"]))
    yield ("header_nul_byte", "q", 1, "a NUL byte inside the header",
           header_bytes(b"{'descr': '<f4', 'fortran_order': False, 'shape': (1, 4, 2, 8),\0}")
           + f4(GOOD["q"]))
    yield ("header_no_newline", "q", 1, "header not terminated by a newline",
           header_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (1, 4, 2, 8), }" + " " * 53,
                        pad=False) + f4(GOOD["q"]))
    yield ("header_length_zero", "q", 1, "header length 0",
           b"\x93NUMPY\x01\x00\x00\x00" + f4(GOOD["q"]))
    yield ("v2_truncated_header_length", "k", 1, "v2.0 file ending inside its 4-byte length",
           b"\x93NUMPY\x02\x00\x10\x00")
    yield ("v2_header_past_end", "k", 1, "v2.0 header length of 4 GiB",
           b"\x93NUMPY\x02\x00\xff\xff\xff\xff" + b"{" * 64)
    yield "zero_seqlen_q", "q", 0, "q has seqlen 0", npy(shape=(1, 0, 2, 8), data=b"")
    yield "zero_head_dim", "k", 0, "k has d = 0", npy(shape=(1, 5, 2, 0), data=b"")
    yield "zero_batch", "v", 0, "v has batch 0", npy(shape=(0, 5, 2, 8), data=b"")
    yield "mismatched_head_dim", "k", 0, "k has d = 7, q has 8", npy(shape=(1, 5, 2, 7),
                                                                  data=f4((1, 5, 2, 7)))
    yield "mismatched_seqlen_kv", "v", 0, "v has seqlen 6, k has 5", npy(shape=(1, 6, 2, 8),
                                                                      data=f4((1, 6, 2, 8)))
    yield "mismatched_batch", "k", 0, "k has batch 2, q has 1", npy(shape=(2, 5, 2, 8),
                                                                 data=f4((2, 5, 2, 8)))
    yield "mismatched_kv_heads", "v", 0, "v has 1 head, k has 2", npy(shape=(1, 5, 1, 8),
                                                                   data=f4((1, 5, 1, 8)))
    yield "heads_not_divisible", "q", 0, "q has 3 heads, k has 2", npy(shape=(1, 4, 3, 8),
                                                                    data=f4((1, 4, 3, 8)))
    yield "nan_value", "q", 1, "a NaN at flat index 5", with_value("q", 5, np.nan)
    yield "inf_value", "k", 1, "+inf at flat index 17", with_value("k", 17, np.inf)
    yield "neg_inf_value", "v", 1, "-inf at the last index", with_value("v", 79, -np.inf)
    yield ("nan_f16", "q", 1, "a NaN in a float16 file",
           npy(descr="<f2", shape=GOOD["q"],
               data=np.where(np.arange(64) == 9, np.nan, 0.5).astype("<f2").tobytes()))
    yield ("nan_bf16_bits", "k", 1, "a NaN bit pattern in a bfloat16 (<u2) file",
           npy(descr="<u2", shape=GOOD["k"],
               data=np.where(np.arange(80) == 3, 0x7FC1, 0x3F80).astype("<u2").tobytes()))
    yield ("alibi_wrong_length", "alibi", 0, "3 slopes for 2 heads",
           npy(shape=(3,), data=f4((3,))))
    yield ("alibi_wrong_rank", "alibi", 0, "slopes of rank 3",
           npy(shape=(1, 2, 1), data=f4((1, 2, 1))))
    yield ("alibi_nan", "alibi", 1, "a NaN slope",
           npy(shape=(2,), data=np.array([0.5, np.nan], "<f4").tobytes()))


def main():
    os.makedirs(BAD, exist_ok=True)
    for name in os.listdir(BAD):
        os.remove(os.path.join(BAD, name))
    for role in ("q", "k", "v"):
        with open(os.path.join(HERE, f"good_{role}.npy"), "wb") as f:
            f.write(good_bytes(role))
    with open(os.path.join(HERE, "good_alibi.npy"), "wb") as f:
        f.write(npy(shape=(2,), data=np.array([0.5, 0.25], "<f4").tobytes()))
    rows = []
    for name, role, names_file, desc, data in cases():
        fname = f"{name}.npy"
        with open(os.path.join(BAD, fname), "wb") as f:
            f.write(data)
        rows.append(f"{fname}\t{role}\t{names_file}\t{desc}\n")
    with open(os.path.join(HERE, "cases.tsv"), "w") as f:
        f.write("# file\trole\tnames_file\tdescription (generated by make_corpus.py)\n")
        f.writelines(rows)
    print(f"wrote {len(rows)} cases to {BAD}")


if __name__ == "__main__":
    main()
