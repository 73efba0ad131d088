"""flashattn.py — a thin ctypes wrapper over libflashattn.so, taking numpy arrays.

Nothing is compiled beyond the library itself (``make`` builds
``build/libflashattn.so``). The library is found, in order, at
``$FLASHATTN_LIB`` (a path to the .so), ``$FA_BUILD/libflashattn.so``, or
``build/libflashattn.so`` next to this file's parent directory.

Layouts are FlashAttention's: q ``[batch, seqlen_q, heads, d]``, k
``[batch, seqlen_k, heads_k, d]``, v ``[batch, seqlen_k, heads_k, d_v]``,
out ``[batch, seqlen_q, heads, d_v]``, lse ``[batch, heads, seqlen_q]``.
Any strides are accepted (a transposed BHSD view works without a copy).

Element types: float32, float64, float16, and bfloat16 either as
``ml_dtypes.bfloat16`` arrays or as uint16 arrays of bfloat16 bit patterns
(``torch_tensor.view(torch.int16).numpy().view(np.uint16)``).

    import numpy as np, flashattn
    o, lse = flashattn.attention(q, k, v, causal=True, return_lse=True)
    dq, dk, dv = flashattn.grad(q, k, v, do, causal=True)
    rep = flashattn.check(q, k, v, o_gpu, dtype="bf16", causal=True)
    print(rep.text); assert rep.passed

The tolerance model is the library's (fa_check in include/flashattn.h,
docs/validation.md); this module adds none of its own.
"""

import ctypes
import os

import numpy as np

__all__ = ["attention", "grad", "check", "CheckReport", "FlashAttnError", "library"]

# ---- the C declarations, mirrored (checked against fa_check_abi_size) -------

FA_F32, FA_F64, FA_F16, FA_BF16, FA_DTYPE_COUNT = range(5)
FA_CHECK_DTYPE_AUTO = FA_DTYPE_COUNT
FA_CHECK_MAX_FAIL_ROWS = 8
_IMPLS = {"flash": 0, "reference": 1, "standard": 2}
_DTYPE_NAMES = {"f32": FA_F32, "float32": FA_F32, "f64": FA_F64, "float64": FA_F64,
                "f16": FA_F16, "float16": FA_F16, "bf16": FA_BF16, "bfloat16": FA_BF16}
_DTYPE_STR = {FA_F32: "f32", FA_F64: "f64", FA_F16: "f16", FA_BF16: "bf16"}

_i64 = ctypes.c_int64


class _Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int), ("rank", ctypes.c_int),
                ("shape", _i64 * 4), ("stride", _i64 * 4)]


class _Options(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t),
                ("scale", ctypes.c_double), ("causal", ctypes.c_int),
                ("window_left", _i64), ("window_right", _i64), ("softcap", ctypes.c_double),
                ("alibi_slopes", ctypes.POINTER(_Tensor)), ("impl", ctypes.c_int),
                ("num_threads", ctypes.c_int), ("block_q", ctypes.c_int), ("block_k", ctypes.c_int),
                ("standard_max_bytes", ctypes.c_size_t),
                ("pack_max_bytes", _i64), ("context", ctypes.c_void_p)]


class _CheckOptions(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("dtype", ctypes.c_int), ("use_tolerance", ctypes.c_int),
                ("atol", ctypes.c_double), ("rtol", ctypes.c_double),
                ("sample_rows", _i64), ("seed", ctypes.c_uint64), ("num_threads", ctypes.c_int),
                ("q_name", ctypes.c_char_p), ("k_name", ctypes.c_char_p),
                ("v_name", ctypes.c_char_p), ("out_name", ctypes.c_char_p),
                ("lse_name", ctypes.c_char_p)]


class _CheckRow(ctypes.Structure):
    _fields_ = [("batch", _i64), ("row", _i64), ("head", _i64), ("n_fail", _i64),
                ("worst_col", _i64), ("max_abs_err", ctypes.c_double)]


_D = ctypes.c_double
_REPORT_FIELDS = [
    ("struct_size", ctypes.c_size_t),
    ("pass_", ctypes.c_int), ("out_pass", ctypes.c_int), ("lse_pass", ctypes.c_int),
    ("dtype", ctypes.c_int), ("use_tolerance", ctypes.c_int),
    ("atol", _D), ("rtol", _D), ("bound", _D),
    ("batch", _i64), ("seqlen_q", _i64), ("seqlen_k", _i64), ("heads", _i64), ("heads_k", _i64),
    ("d", _i64), ("dv", _i64),
    ("rows_checked", _i64), ("rows_total", _i64), ("elements_checked", _i64),
    ("sample_rows", _i64), ("seed", ctypes.c_uint64),
    ("max_abs_err", _D), ("mean_abs_err", _D), ("max_rel_err", _D), ("mean_rel_err", _D),
    ("max_abs_ref", _D), ("emu_max_abs_err", _D), ("emu_mean_abs_err", _D), ("ratio", _D),
    ("n_fail", _i64), ("fail_fraction", _D), ("n_nonfinite", _i64), ("rows_failed", _i64),
    ("worst_batch", _i64), ("worst_row", _i64), ("worst_head", _i64), ("worst_col", _i64),
    ("worst_test", _D), ("worst_ref", _D), ("worst_emu", _D),
    ("n_fail_rows", ctypes.c_int), ("fail_rows", _CheckRow * FA_CHECK_MAX_FAIL_ROWS),
    ("n_heads", _i64), ("head_fail", ctypes.POINTER(_i64)), ("head_max_abs_err", ctypes.POINTER(_D)),
    ("lse_checked", ctypes.c_int), ("lse_max_abs_err", _D), ("lse_emu_max_abs_err", _D),
    ("lse_bound", _D), ("lse_n_fail", _i64), ("lse_n_empty", _i64),
    ("lse_fa2_alibi_offset", ctypes.c_int),
    ("lse_worst_batch", _i64), ("lse_worst_head", _i64), ("lse_worst_row", _i64),
    ("lse_worst_test", _D), ("lse_worst_ref", _D),
]


class _Report(ctypes.Structure):
    _fields_ = _REPORT_FIELDS

    def __init__(self, *args, **kwargs):
        # fa_check reads how much of the report it may write from struct_size
        super().__init__(*args, **kwargs)
        self.struct_size = ctypes.sizeof(_Report)


class FlashAttnError(RuntimeError):
    """A library call failed; the message is fa_last_error()'s."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


# ---- loading ----------------------------------------------------------------

_lib = None


def _find_library():
    env = os.environ.get("FLASHATTN_LIB")
    if env:
        return env
    build = os.environ.get("FA_BUILD")
    if build:
        return os.path.join(build, "libflashattn.so")
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.join(os.path.dirname(here), "build", "libflashattn.so")


def library():
    """The loaded ctypes.CDLL (loaded once; struct layouts verified)."""
    global _lib
    if _lib is not None:
        return _lib
    path = _find_library()
    if not os.path.exists(path):
        raise OSError(f"flashattn: {path} not found; run `make` first or set FLASHATTN_LIB")
    lib = ctypes.CDLL(path)
    lib.fa_last_error.restype = ctypes.c_char_p
    lib.fa_status_string.restype = ctypes.c_char_p
    lib.fa_status_string.argtypes = [ctypes.c_int]
    lib.fa_options_default.restype = _Options
    lib.fa_check_options_default.restype = _CheckOptions
    lib.fa_check_abi_size.restype = ctypes.c_size_t
    lib.fa_check_abi_size.argtypes = [ctypes.c_int]
    tp = ctypes.POINTER(_Tensor)
    lib.fa_forward.argtypes = [tp, tp, tp, tp, tp, ctypes.POINTER(_Options)]
    lib.fa_forward.restype = ctypes.c_int
    lib.fa_backward.argtypes = [tp, tp, tp, tp, tp, tp, tp, tp, tp, ctypes.POINTER(_Options)]
    lib.fa_backward.restype = ctypes.c_int
    lib.fa_check.argtypes = [tp, tp, tp, tp, tp, ctypes.POINTER(_Options),
                             ctypes.POINTER(_CheckOptions), ctypes.POINTER(_Report)]
    lib.fa_check.restype = ctypes.c_int
    lib.fa_check_report_free.argtypes = [ctypes.POINTER(_Report)]
    lib.fa_check_report_format.argtypes = [ctypes.POINTER(_Report), ctypes.c_char_p, ctypes.c_size_t]
    lib.fa_check_report_format.restype = ctypes.c_size_t
    for which, cls in enumerate((_Tensor, _Options, _CheckOptions, _Report)):
        want = lib.fa_check_abi_size(which)
        if want != ctypes.sizeof(cls):
            raise OSError(f"flashattn: {cls.__name__} is {ctypes.sizeof(cls)} bytes here but "
                          f"{want} in {path}; python/flashattn.py is out of date with the header")
    _lib = lib
    return lib


def _raise(status):
    lib = library()
    msg = lib.fa_last_error().decode("utf-8", "replace")
    name = lib.fa_status_string(status).decode()
    raise FlashAttnError(status, f"{name}: {msg}" if msg else name)


# ---- numpy <-> fa_tensor ------------------------------------------------------

def _fa_dtype(arr):
    dt = arr.dtype
    if dt == np.float32:
        return FA_F32
    if dt == np.float64:
        return FA_F64
    if dt == np.float16:
        return FA_F16
    if dt == np.uint16 or dt == np.int16 or dt.name == "bfloat16":
        return FA_BF16
    raise TypeError(f"unsupported dtype {dt}: use float32, float64, float16, "
                    "or bfloat16 (ml_dtypes.bfloat16 or uint16 bit patterns)")


def _as_array(x, name):
    arr = np.asarray(x)
    if not arr.dtype.isnative and arr.dtype.itemsize > 1:
        arr = arr.astype(arr.dtype.newbyteorder("="))
    if any(s < 0 or s % arr.itemsize for s in arr.strides):
        arr = np.ascontiguousarray(arr)
    return arr


def _tensor(arr, name):
    if arr.ndim < 1 or arr.ndim > 4:
        raise ValueError(f"{name}: rank {arr.ndim} is not supported (1..4)")
    t = _Tensor()
    t.data = arr.ctypes.data
    t.dtype = _fa_dtype(arr)
    t.rank = arr.ndim
    for i in range(arr.ndim):
        t.shape[i] = arr.shape[i]
        t.stride[i] = arr.strides[i] // arr.itemsize
    return t


def _options(causal, window, softcap, scale, alibi_slopes, impl, num_threads, keep):
    lib = library()
    opt = lib.fa_options_default()
    opt.scale = 0.0 if scale is None else float(scale)
    opt.causal = int(bool(causal))
    wl, wr = (-1, -1) if window is None else window
    opt.window_left = -1 if wl is None else int(wl)
    opt.window_right = -1 if wr is None else int(wr)
    opt.softcap = float(softcap or 0.0)
    if impl not in _IMPLS:
        raise ValueError(f"impl must be one of {sorted(_IMPLS)}")
    opt.impl = _IMPLS[impl]
    opt.num_threads = int(num_threads)
    if alibi_slopes is not None:
        a = _as_array(alibi_slopes, "alibi_slopes")
        if a.dtype not in (np.float32, np.float64):
            a = a.astype(np.float64)
        ta = _tensor(a, "alibi_slopes")
        keep += [a, ta]
        opt.alibi_slopes = ctypes.pointer(ta)
    return opt


# ---- attention ------------------------------------------------------------------

def attention(q, k, v, *, causal=False, window=None, softcap=0.0, scale=None,
              alibi_slopes=None, impl="flash", return_lse=False, out_dtype=np.float32,
              num_threads=0):
    """Exact attention forward: O = softmax(mask(scale * Q K^T)) V.

    window: (left, right) in keys, None/-1 for unbounded; masks are aligned
    bottom-right (DESIGN.md). Returns O (out_dtype: float32, float64, float16,
    or "bf16" for uint16 bit patterns) and, with return_lse, LSE float32
    [batch, heads, seqlen_q].
    """
    lib = library()
    keep = []
    q, k, v = (_as_array(x, n) for x, n in ((q, "q"), (k, "k"), (v, "v")))
    tq, tk, tv = _tensor(q, "q"), _tensor(k, "k"), _tensor(v, "v")
    if q.ndim != 4 or v.ndim != 4:
        raise ValueError("q, k, v must be rank 4 [batch, seqlen, heads, d]")
    B, Sq, H = q.shape[:3]
    dv = v.shape[3]
    if isinstance(out_dtype, str) and out_dtype in ("bf16", "bfloat16"):
        o = np.empty((B, Sq, H, dv), dtype=np.uint16)
    else:
        o = np.empty((B, Sq, H, dv), dtype=out_dtype)
    to = _tensor(o, "o")
    lse = np.empty((B, H, Sq), dtype=np.float32) if return_lse else None
    tl = _tensor(lse, "lse") if return_lse else None
    opt = _options(causal, window, softcap, scale, alibi_slopes, impl, num_threads, keep)
    st = lib.fa_forward(ctypes.byref(tq), ctypes.byref(tk), ctypes.byref(tv), ctypes.byref(to),
                        ctypes.byref(tl) if tl is not None else None, ctypes.byref(opt))
    if st != 0:
        _raise(st)
    return (o, lse) if return_lse else o


# ---- grad (backward pass) ----------------------------------------------------------

def grad(q, k, v, dout, *, out=None, lse=None, causal=False, window=None, softcap=0.0,
         scale=None, alibi_slopes=None, impl="flash", grad_dtype=np.float32, num_threads=0):
    """Attention backward pass (fa_backward): returns (dq, dk, dv).

    dout is dLoss/dO ``[batch, seqlen_q, heads, d_v]``. out and lse are the
    forward's O and LSE; when either is None, both are recomputed by the
    library. For GQA/MQA, dk and dv are summed over the query heads sharing a
    kv head. grad_dtype: float32 (default), float64, float16 or "bf16" (uint16
    bit patterns). impl: "flash" or "reference" ("standard" has no backward
    pass and raises FlashAttnError).
    """
    lib = library()
    keep = []
    q, k, v, dout = (_as_array(x, n) for x, n in ((q, "q"), (k, "k"), (v, "v"), (dout, "dout")))
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4 or dout.ndim != 4:
        raise ValueError("q, k, v, dout must be rank 4 [batch, seqlen, heads, d]")
    tq, tk, tv, tdo = (_tensor(x, n) for x, n in ((q, "q"), (k, "k"), (v, "v"), (dout, "dout")))
    to = tl = None
    if out is not None and lse is not None:
        out, lse = _as_array(out, "out"), _as_array(lse, "lse")
        to, tl = _tensor(out, "out"), _tensor(lse, "lse")
    if isinstance(grad_dtype, str) and grad_dtype in ("bf16", "bfloat16"):
        gdt = np.uint16
    else:
        gdt = np.dtype(grad_dtype)
    dq = np.empty(q.shape, dtype=gdt)
    dk = np.empty(k.shape, dtype=gdt)
    dv = np.empty(v.shape, dtype=gdt)
    tdq, tdk, tdv = _tensor(dq, "dq"), _tensor(dk, "dk"), _tensor(dv, "dv")
    opt = _options(causal, window, softcap, scale, alibi_slopes, impl, num_threads, keep)
    st = lib.fa_backward(ctypes.byref(tq), ctypes.byref(tk), ctypes.byref(tv),
                         ctypes.byref(to) if to is not None else None,
                         ctypes.byref(tl) if tl is not None else None,
                         ctypes.byref(tdo), ctypes.byref(tdq), ctypes.byref(tdk), ctypes.byref(tdv),
                         ctypes.byref(opt))
    if st != 0:
        _raise(st)
    return dq, dk, dv


# ---- check ----------------------------------------------------------------------

class CheckReport:
    """What fa_check found. ``passed`` is the verdict; ``text`` is the report
    `flashattn check` prints; every field of fa_check_report is an attribute
    (``pass`` is spelled ``passed``); per-head arrays are numpy arrays."""

    def __init__(self, rep, text):
        for name, _ in _REPORT_FIELDS:
            if name in ("fail_rows", "head_fail", "head_max_abs_err"):
                continue
            setattr(self, name, getattr(rep, name))
        self.passed = bool(rep.pass_)
        del self.pass_
        self.dtype = _DTYPE_STR.get(rep.dtype, str(rep.dtype))
        self.fail_rows = [dict(batch=r.batch, row=r.row, head=r.head, n_fail=r.n_fail,
                               worst_col=r.worst_col, max_abs_err=r.max_abs_err)
                          for r in rep.fail_rows[:rep.n_fail_rows]]
        n = rep.n_heads
        self.head_fail = np.array([rep.head_fail[i] for i in range(n)], dtype=np.int64)
        self.head_max_abs_err = np.array([rep.head_max_abs_err[i] for i in range(n)])
        self.worst = (rep.worst_batch, rep.worst_row, rep.worst_head, rep.worst_col)
        self.text = text

    def __bool__(self):
        return self.passed

    def __repr__(self):
        return (f"CheckReport(passed={self.passed}, max_abs_err={self.max_abs_err:.3g}, "
                f"emu_max_abs_err={self.emu_max_abs_err:.3g}, n_fail={self.n_fail})")

    def __str__(self):
        return self.text


def check(q, k, v, out, lse=None, *, causal=False, window=None, softcap=0.0, scale=None,
          alibi_slopes=None, dtype=None, atol=None, rtol=None, sample_rows=0, seed=0,
          num_threads=0):
    """Check a tested attention output (and optionally its LSE) against the
    float64 reference, by the library's one tolerance model.

    dtype: the precision the tested kernel ran in ("bf16", "f16", "f32"; None
    infers it from the arrays). atol/rtol: replace the default emulation rule
    by |out - ref| <= atol + rtol * |ref| (either given; the other defaults
    to 0). sample_rows: check that many random query rows per (batch, head).
    Returns a CheckReport; raises FlashAttnError on bad input.
    """
    lib = library()
    keep = []
    arrs = [_as_array(x, n) for x, n in ((q, "q"), (k, "k"), (v, "v"), (out, "out"))]
    tq, tk, tv, to = (_tensor(a, n) for a, n in zip(arrs, ("q", "k", "v", "out")))
    tl = None
    if lse is not None:
        lse_a = _as_array(lse, "lse")
        keep.append(lse_a)
        tl = _tensor(lse_a, "lse")
    opt = _options(causal, window, softcap, scale, alibi_slopes, "reference", num_threads, keep)
    co = lib.fa_check_options_default()
    if dtype is not None:
        if dtype not in _DTYPE_NAMES:
            raise ValueError(f"dtype must be one of {sorted(_DTYPE_NAMES)}")
        co.dtype = _DTYPE_NAMES[dtype]
    if atol is not None or rtol is not None:
        co.use_tolerance = 1
        co.atol = float(atol or 0.0)
        co.rtol = float(rtol or 0.0)
    co.sample_rows = int(sample_rows)
    co.seed = int(seed) & 0xFFFFFFFFFFFFFFFF
    co.num_threads = int(num_threads)
    rep = _Report()
    st = lib.fa_check(ctypes.byref(tq), ctypes.byref(tk), ctypes.byref(tv), ctypes.byref(to),
                      ctypes.byref(tl) if tl is not None else None, ctypes.byref(opt),
                      ctypes.byref(co), ctypes.byref(rep))
    if st != 0:
        _raise(st)
    try:
        n = lib.fa_check_report_format(ctypes.byref(rep), None, 0)
        buf = ctypes.create_string_buffer(n + 1)
        lib.fa_check_report_format(ctypes.byref(rep), buf, n + 1)
        return CheckReport(rep, buf.value.decode())
    finally:
        lib.fa_check_report_free(ctypes.byref(rep))
