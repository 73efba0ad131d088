"""flashattn — a thin ctypes wrapper over libflashattn.so, taking numpy arrays
or torch tensors.

Install: ``pip install ./python`` from a checkout builds the library with the
project's Makefile and installs the package with the .so inside it (see the
README's Python section). Without installing, ``python/flashattn.py`` also
works from the checkout after ``make``. The library is found, in order, at
``$FLASHATTN_LIB`` (a path to the .so), ``$FA_BUILD/libflashattn.so``, the
installed package's own ``libflashattn.so``, or ``build/libflashattn.so`` of
the checkout this file sits in.

Layouts are FlashAttention's: q ``[batch, seqlen_q, heads, d]``, k
``[batch, seqlen_k, heads_k, d]``, v ``[batch, seqlen_k, heads_k, d_v]``,
out ``[batch, seqlen_q, heads, d_v]``, lse ``[batch, heads, seqlen_q]``.
Any strides are accepted (a transposed BHSD view works without a copy).
Semantics (masks, scale, softcap, ALiBi, empty rows): docs/semantics.md.

Variable-length batches (``flash_attn_varlen_func``'s layout): pass int32
``cu_seqlens_q`` and ``cu_seqlens_k`` ([batch + 1] prefix sums from 0) and
optionally ``seqused_k`` ([batch]); q is then ``[total_q, heads, d]``, k and v
``[total_k, heads_k, d]``, out ``[total_q, heads, d_v]`` and lse
``[heads, total_q]``, and every mask is aligned per sequence.

A KV cache (``flash_attn_with_kvcache``): ``attention_with_kvcache(q, k_cache,
v_cache, k, v, cache_seqlens=...)`` appends k/v into the numpy caches in place
and attends over ``cache_seqlens[b] + seqlen_new`` keys; ``block_table`` makes
the caches pages ``[num_pages, page_size, heads_k, d]``.

Inputs: numpy arrays (or anything ``np.asarray`` takes) and torch tensors.
Element types: float32, float64, float16 and bfloat16. A torch tensor of any
of these, on any device, is copied to the host (zero-copy through DLPack when
it is already there); given torch tensors, attention() and grad() return
torch tensors on the device of the first torch input (q's, normally). numpy
bfloat16 is either an ``ml_dtypes.bfloat16`` array or bit patterns in a
**uint16** array (kept for compatibility); other integer arrays, int16
included, are refused rather than read as bits (``bf16_bits=True`` also reads
int16 arrays as bf16 bit patterns, ``bf16_bits=False`` refuses uint16 too).
The same rule holds for the side inputs (alibi_slopes, sinks, rotary_cos and
rotary_sin), which are otherwise taken by value (Python ints and lists too).

    import numpy as np, flashattn
    o, lse = flashattn.attention(q, k, v, causal=True, return_lse=True)
    dq, dk, dv = flashattn.grad(q, k, v, do, causal=True)
    rep = flashattn.check(q, k, v, o_gpu, dtype="bf16", causal=True)
    print(rep.text); assert rep.passed

A GPU kernel's output checked in one line, torch tensors on CUDA included:
``assert flashattn.check(q, k, v, out, causal=True, dtype="bf16")``.

The tolerance model is the library's (fa_check in include/flashattn.h,
docs/validation.md); this module adds none of its own.
"""

import ctypes
import math
import operator
import os

import numpy as np

__all__ = ["attention", "attention_with_kvcache", "grad", "check", "CheckReport", "diagnose", "DiagnoseReport",
           "FlashAttnError", "library", "amx"]

# ---- the C declarations, mirrored (checked against fa_check_abi_size) -------

FA_F32, FA_F64, FA_F16, FA_BF16, FA_DTYPE_COUNT = range(5)
FA_CHECK_DTYPE_AUTO = FA_DTYPE_COUNT
FA_CHECK_MAX_FAIL_ROWS = 8
_IMPLS = {"flash": 0, "reference": 1, "standard": 2}
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
                ("pack_max_bytes", _i64), ("context", ctypes.c_void_p), ("align", ctypes.c_int),
                ("varlen", ctypes.c_void_p), ("kvcache", ctypes.c_void_p),
                ("sinks", ctypes.c_void_p), ("rotary", ctypes.c_void_p), ("dropout", ctypes.c_void_p),
                ("num_splits", ctypes.c_int),
                # fa_options::progress and its argument: a C hook (MPI ranks); Python leaves them NULL
                ("progress", ctypes.c_void_p), ("progress_arg", ctypes.c_void_p)]

_ALIGNS = {"bottom-right": 0, "top-left": 1}


class _KVCache(ctypes.Structure):
    _i32p = ctypes.POINTER(ctypes.c_int32)
    _fields_ = [("struct_size", ctypes.c_size_t), ("cache_seqlens", _i32p),
                ("k_new", ctypes.POINTER(_Tensor)), ("v_new", ctypes.POINTER(_Tensor)),
                ("cache_batch_idx", _i32p), ("cache_leftpad", _i32p), ("block_table", _i32p),
                ("max_pages", _i64), ("cache_seqlens_name", ctypes.c_char_p),
                ("cache_batch_idx_name", ctypes.c_char_p), ("cache_leftpad_name", ctypes.c_char_p),
                ("block_table_name", ctypes.c_char_p)]


class _BackwardExtra(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("dsinks", ctypes.POINTER(_Tensor))]


class _Dropout(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("p", ctypes.c_double), ("keep_mask", ctypes.c_void_p),
                ("keep_shape", _i64 * 4), ("keep_stride", _i64 * 4), ("keep_mask_name", ctypes.c_char_p)]


class _Rotary(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("cos", ctypes.POINTER(_Tensor)), ("sin", ctypes.POINTER(_Tensor)),
                ("interleaved", ctypes.c_int)]


class _Varlen(ctypes.Structure):
    _i32p = ctypes.POINTER(ctypes.c_int32)
    _fields_ = [("struct_size", ctypes.c_size_t), ("batch", _i64),
                ("cu_seqlens_q", _i32p), ("cu_seqlens_k", _i32p), ("seqused_k", _i32p),
                ("cu_seqlens_q_name", ctypes.c_char_p), ("cu_seqlens_k_name", ctypes.c_char_p),
                ("seqused_k_name", ctypes.c_char_p)]


class _CheckOptions(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("dtype", ctypes.c_int), ("use_tolerance", ctypes.c_int),
                ("atol", ctypes.c_double), ("rtol", ctypes.c_double),
                ("sample_rows", _i64), ("seed", ctypes.c_uint64), ("num_threads", ctypes.c_int),
                ("q_name", ctypes.c_char_p), ("k_name", ctypes.c_char_p),
                ("v_name", ctypes.c_char_p), ("out_name", ctypes.c_char_p),
                ("lse_name", ctypes.c_char_p),
                ("qkv_format", ctypes.c_int), ("kernel_model", ctypes.c_int)]


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
    ("cos_sim", _D), ("rel_l1", _D), ("rmse", _D), ("sqnr_db", _D),
    ("qkv_format", ctypes.c_int), ("p_format", ctypes.c_int), ("kernel_model", ctypes.c_int),
    ("model_max_abs_err", _D), ("model_bound", _D), ("model_n_fail", _i64),
    ("row_scale_test", _D), ("row_scale_model", _D), ("p_mismatch", ctypes.c_int),
    ("row_scale_explained", _D), ("score_allow_max", _D),
    ("row_rule", ctypes.c_int), ("row_n_fail", _i64), ("row_ratio", _D),
    ("row_worst_batch", _i64), ("row_worst_row", _i64), ("row_worst_head", _i64),
]

# low-precision formats (fa_qformat) and kernel models (fa_kernel_model)
QFORMATS = {"none": 0, "e4m3": 1, "e5m2": 2, "e2m1": 3, "int8": 4, "e8m0": 5}
KERNEL_MODELS = {None: 0, "fa3": 1, "sage": 2}


class _Report(ctypes.Structure):
    _fields_ = _REPORT_FIELDS

    def __init__(self, *args, **kwargs):
        # fa_check reads how much of the report it may write from struct_size
        super().__init__(*args, **kwargs)
        self.struct_size = ctypes.sizeof(_Report)


FA_DIAG_MAX = 8


class _Diagnosis(ctypes.Structure):
    _fields_ = [("id", ctypes.c_char * 24), ("explained", ctypes.c_double), ("param", ctypes.c_double),
                ("detail", ctypes.c_char * 160)]


class _DiagnoseOptions(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("dtype", ctypes.c_int), ("sample_rows", _i64),
                ("seed", ctypes.c_uint64), ("num_threads", ctypes.c_int), ("min_explained", ctypes.c_double),
                ("qkv_format", ctypes.c_int)]


class _DiagnoseReport(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("n", ctypes.c_int), ("items", _Diagnosis * FA_DIAG_MAX),
                ("out_significant", ctypes.c_int), ("lse_significant", ctypes.c_int),
                ("out_rel_rms", ctypes.c_double), ("lse_rms", ctypes.c_double), ("rows_sampled", _i64),
                ("n_considered", ctypes.c_int), ("considered", ctypes.c_char * 256),
                ("n_heads", _i64), ("head_rel_rms", ctypes.POINTER(ctypes.c_double)),
                ("n_batch", _i64), ("batch_rel_rms", ctypes.POINTER(ctypes.c_double))]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.struct_size = ctypes.sizeof(_DiagnoseReport)


class FlashAttnError(RuntimeError):
    """A library call failed; the message is fa_last_error()'s."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


# ---- loading ----------------------------------------------------------------

_lib = None


def _library_candidates():
    """Where the library may be, most explicit first: [(path, how it was chosen)]."""
    env = os.environ.get("FLASHATTN_LIB")
    if env:
        return [(env, "$FLASHATTN_LIB")]
    build = os.environ.get("FA_BUILD")
    if build:
        return [(os.path.join(build, "libflashattn.so"), "$FA_BUILD")]
    here = os.path.dirname(os.path.abspath(__file__))
    return [(os.path.join(here, "libflashattn.so"), "the installed package"),
            (os.path.join(os.path.dirname(here), "build", "libflashattn.so"), "the checkout")]


def _find_library():
    cands = _library_candidates()
    for path, _ in cands:
        if os.path.exists(path):
            return path
    return cands[-1][0]


def amx():
    """Intel AMX for bfloat16 inputs (opt-in with the environment variable FA_AMX=1, which the
    library reads once, at its first call: set it before importing): a dict with ``available`` (bool), ``why_not`` (None, or what is missing: the CPU
    feature, the OS state, Linux's permission, or the build) and ``calls`` (how many forwards in
    this process have run on the tiles; read it before and after a call to know whether that
    call did, or was handed over to the float32 path). The first query asks Linux for the
    tile-data permission, as the library's first AMX call would."""
    lib = library()
    why = lib.fa_amx_why_not()
    return {"available": bool(lib.fa_amx_available()), "why_not": why.decode() if why else None,
            "calls": int(lib.fa_amx_calls())}


def library():
    """The loaded ctypes.CDLL (loaded once; struct layouts verified)."""
    global _lib
    if _lib is not None:
        return _lib
    path = _find_library()
    if not os.path.exists(path):
        tried = ", ".join(f"{p} ({how})" for p, how in _library_candidates())
        raise OSError(f"flashattn: libflashattn.so not found (tried {tried}); "
                      "run `make` in the checkout, `pip install ./python`, or set FLASHATTN_LIB")
    lib = ctypes.CDLL(path)
    lib.fa_last_error.restype = ctypes.c_char_p
    lib.fa_status_string.restype = ctypes.c_char_p
    lib.fa_status_string.argtypes = [ctypes.c_int]
    lib.fa_amx_available.restype = ctypes.c_int
    lib.fa_amx_available.argtypes = []
    lib.fa_amx_why_not.restype = ctypes.c_char_p
    lib.fa_amx_why_not.argtypes = []
    lib.fa_amx_calls.restype = ctypes.c_long
    lib.fa_amx_calls.argtypes = []
    # the by-value *_default() exports return the library's own layout; the
    # mirror is filled with *_init(ptr, sizeof mirror), which writes no more
    lib.fa_options_init.argtypes = [ctypes.POINTER(_Options), ctypes.c_size_t]
    lib.fa_options_init.restype = None
    lib.fa_check_options_init.argtypes = [ctypes.POINTER(_CheckOptions), ctypes.c_size_t]
    lib.fa_check_options_init.restype = None
    lib.fa_varlen_init.argtypes = [ctypes.POINTER(_Varlen), ctypes.c_size_t]
    lib.fa_varlen_init.restype = None
    lib.fa_kvcache_init.argtypes = [ctypes.POINTER(_KVCache), ctypes.c_size_t]
    lib.fa_kvcache_init.restype = None
    lib.fa_check_abi_size.restype = ctypes.c_size_t
    lib.fa_check_abi_size.argtypes = [ctypes.c_int]
    tp = ctypes.POINTER(_Tensor)
    lib.fa_forward.argtypes = [tp, tp, tp, tp, tp, ctypes.POINTER(_Options)]
    lib.fa_forward.restype = ctypes.c_int
    lib.fa_backward.argtypes = [tp, tp, tp, tp, tp, tp, tp, tp, tp, ctypes.POINTER(_Options)]
    lib.fa_backward.restype = ctypes.c_int
    lib.fa_backward_extra_init.argtypes = [ctypes.POINTER(_BackwardExtra), ctypes.c_size_t]
    lib.fa_backward_extra_init.restype = None
    lib.fa_dropout_init.argtypes = [ctypes.POINTER(_Dropout), ctypes.c_size_t]
    lib.fa_dropout_init.restype = None
    lib.fa_rotary_init.argtypes = [ctypes.POINTER(_Rotary), ctypes.c_size_t]
    lib.fa_rotary_init.restype = None
    lib.fa_backward_ex.argtypes = [tp, tp, tp, tp, tp, tp, tp, tp, tp, ctypes.POINTER(_Options),
                                   ctypes.POINTER(_BackwardExtra)]
    lib.fa_backward_ex.restype = ctypes.c_int
    lib.fa_check.argtypes = [tp, tp, tp, tp, tp, ctypes.POINTER(_Options),
                             ctypes.POINTER(_CheckOptions), ctypes.POINTER(_Report)]
    lib.fa_check.restype = ctypes.c_int
    lib.fa_check_report_free.argtypes = [ctypes.POINTER(_Report)]
    lib.fa_check_report_format.argtypes = [ctypes.POINTER(_Report), ctypes.c_char_p, ctypes.c_size_t]
    lib.fa_check_report_format.restype = ctypes.c_size_t
    lib.fa_diagnose_options_init.argtypes = [ctypes.POINTER(_DiagnoseOptions), ctypes.c_size_t]
    lib.fa_diagnose_options_init.restype = None
    lib.fa_diagnose.argtypes = [tp, tp, tp, tp, tp, ctypes.POINTER(_Options),
                                ctypes.POINTER(_DiagnoseOptions), ctypes.POINTER(_DiagnoseReport)]
    lib.fa_diagnose.restype = ctypes.c_int
    lib.fa_diagnose_report_free.argtypes = [ctypes.POINTER(_DiagnoseReport)]
    lib.fa_diagnose_report_format.argtypes = [ctypes.POINTER(_DiagnoseReport), ctypes.c_char_p, ctypes.c_size_t]
    lib.fa_diagnose_report_format.restype = ctypes.c_size_t
    # fa_tensor is not versioned: exact match. The versioned structs carry
    # struct_size, so a library whose struct is larger (a newer version that
    # appended fields) still reads this older mirror; a smaller one cannot.
    for which, cls in enumerate((_Tensor, _Options, _CheckOptions, _Report, _DiagnoseOptions, _DiagnoseReport,
                                 _Varlen, _KVCache, _BackwardExtra, _Dropout, _Rotary)):
        want = lib.fa_check_abi_size(which)
        ok = want == ctypes.sizeof(cls) if cls is _Tensor else want >= ctypes.sizeof(cls)
        if not ok:
            raise OSError(f"flashattn: {cls.__name__} is {ctypes.sizeof(cls)} bytes here but "
                          f"{want} in {path}; python/flashattn.py is out of date with the library")
    _lib = lib
    return lib


def _raise(status):
    lib = library()
    msg = lib.fa_last_error().decode("utf-8", "replace")
    name = lib.fa_status_string(status).decode()
    raise FlashAttnError(status, f"{name}: {msg}" if msg else name)


# ---- arguments: integers, floats, dtype names -----------------------------------
#
# ctypes converts a Python int to c_int / c_int64 by truncating it silently
# (2**64 + 5 becomes 5), so every integer is range-checked here first, and
# non-integers (2.5, "3") are refused instead of truncated.

_INT_MAX = 2 ** 31 - 1
_INT64_MAX = 2 ** 63 - 1
_UINT64_MAX = 2 ** 64 - 1


def _int_arg(value, name, lo, hi):
    try:
        v = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {value!r}") from None
    if not lo <= v <= hi:
        raise ValueError(f"{name} = {v} is out of range [{lo}, {hi}]")
    return v


def _window_side(value, name):
    """None or -1: unbounded; otherwise a number of keys >= 0 (the CLI's rule)."""
    if value is None:
        return -1
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be an integer or None, got {value!r}")
    try:
        v = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer or None, got {value!r}") from None
    if v < -1:
        raise ValueError(f"{name} = {v}: expected -1 or None (unbounded) or a number of keys >= 0")
    if v > _INT64_MAX:
        raise ValueError(f"{name} = {v} is out of range [-1, {_INT64_MAX}]")
    return v


def _bool_arg(value, name, none_is_false=True):
    """True/False (numpy bools and 0-d arrays of them, the integers 0 and 1; None is False
    where False is the default); a string such as "False" is refused, not read as true."""
    if value is None and none_is_false:
        return False
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value[()]
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)) and value in (0, 1):
        return bool(value)
    raise TypeError(f"{name} must be True or False, got {value!r}")


def _float_arg(value, name):
    # float() would take "30" and True: a number is asked for
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value[()]
    if isinstance(value, (str, bytes, bool, np.bool_)) or (isinstance(value, np.generic)
                                                          and value.dtype.kind not in "iuf"):
        raise TypeError(f"{name} must be a number, got {value!r}")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a number, got {value!r}") from None
    except OverflowError:  # an int past the doubles (10**400)
        raise ValueError(f"{name} = {value!r} is out of range (beyond every double)") from None


def _scale_arg(scale):
    """None selects 1/sqrt(d). 0 is refused: the C API uses 0.0 as its marker for
    the default, so it cannot be passed through; FlashAttention itself would
    honour softmax_scale=0 (uniform attention), so silently meaning 1/sqrt(d)
    would be wrong, and the CLI refuses --scale 0 too."""
    if scale is None:
        return 0.0
    s = _float_arg(scale, "scale")
    if s == 0.0:
        raise ValueError("scale = 0 is not supported (the library reads 0 as 'use the default "
                         "1/sqrt(d)'); pass scale=None for the default")
    if not math.isfinite(s):
        raise ValueError(f"scale = {s} is not a finite number")
    return s


_DTYPE_NAMES = {"f32": FA_F32, "float32": FA_F32, "fp32": FA_F32,
                "f64": FA_F64, "float64": FA_F64, "fp64": FA_F64,
                "f16": FA_F16, "float16": FA_F16, "fp16": FA_F16, "half": FA_F16,
                "bf16": FA_BF16, "bfloat16": FA_BF16}
_TORCH_DTYPES = {"torch.float32": FA_F32, "torch.float64": FA_F64,
                 "torch.float16": FA_F16, "torch.bfloat16": FA_BF16}
_NP_OUT = {FA_F32: np.float32, FA_F64: np.float64, FA_F16: np.float16, FA_BF16: np.uint16}


def _is_torch(x):
    """A torch.Tensor (or subclass such as nn.Parameter), without importing torch."""
    return any(c.__module__.split(".")[0] == "torch" and c.__name__ == "Tensor"
               for c in type(x).__mro__)


def _dtype_code(x, what):
    """fa_dtype of a dtype given by name ("f32", "f16", "bf16", "float64", ...),
    numpy dtype (np.float16, ml_dtypes.bfloat16) or torch dtype (torch.bfloat16)."""
    if x is None:
        pass  # np.dtype(None) would be float64: refuse instead
    elif isinstance(x, str):
        if x.lower() in _DTYPE_NAMES:
            return _DTYPE_NAMES[x.lower()]
    elif type(x).__module__.split(".")[0] == "torch":
        if str(x) in _TORCH_DTYPES:
            return _TORCH_DTYPES[str(x)]
    else:
        try:
            dt = np.dtype(x)
        except TypeError:
            dt = None
        if dt is not None:
            if dt.name == "bfloat16":
                return FA_BF16
            for code, np_t in _NP_OUT.items():
                if code != FA_BF16 and dt == np_t:
                    return code
    raise ValueError(f"{what}: {x!r} is not a supported dtype; use 'f32', 'f64', 'f16' or 'bf16' "
                     "(or the numpy/torch float32, float64, float16, bfloat16 dtypes)")


# ---- inputs: numpy arrays and torch tensors -> fa_tensor ----------------------------

def _fa_dtype(arr, name="array", bf16_bits=None):
    """fa_dtype of a numpy array. uint16 holds bf16 bit patterns unless
    bf16_bits is False; int16 does only when bf16_bits is True; every other
    integer or non-float type is refused."""
    dt = arr.dtype
    if dt == np.float32:
        return FA_F32
    if dt == np.float64:
        return FA_F64
    if dt == np.float16:
        return FA_F16
    if dt.name == "bfloat16":
        return FA_BF16
    if dt == np.uint16 and bf16_bits is not False:
        return FA_BF16
    if dt == np.int16 and bf16_bits is True:
        return FA_BF16
    if dt.kind in "iub":
        raise TypeError(f"{name}: {dt} array refused: integer arrays are not read as bfloat16 bit "
                        "patterns unless asked (uint16, or int16 with bf16_bits=True); convert "
                        "values to a float type")
    raise TypeError(f"{name}: unsupported dtype {dt}: use float32, float64, float16, "
                    "or bfloat16 (ml_dtypes.bfloat16, or uint16 bit patterns)")


def _torch_to_numpy(t, name):
    """A host numpy view (or copy) of a torch tensor; bf16 becomes uint16 bits."""
    t = t.detach()
    # A tensor may carry a lazy negation or conjugation bit (x.conj().imag,
    # torch._neg_view): DLPack and .numpy() would export the raw storage and drop
    # the sign. Materialize those bits first (a no-op for ordinary tensors).
    if hasattr(t, "resolve_neg"):
        t = t.resolve_neg()
    if hasattr(t, "resolve_conj"):
        t = t.resolve_conj()
    if t.device.type != "cpu":
        t = t.to("cpu")
    if str(t.dtype) == "torch.bfloat16":
        import torch  # already imported: t is a torch tensor
        return t.view(torch.int16).numpy().view(np.uint16)
    if str(t.dtype) in _TORCH_DTYPES:
        try:
            return np.from_dlpack(t)
        except (AttributeError, TypeError, RuntimeError, BufferError):
            return t.numpy()
    if str(t.dtype) in ("torch.int16", "torch.uint16", "torch.int8", "torch.uint8",
                        "torch.int32", "torch.int64", "torch.bool"):
        return t.numpy()  # refused by _fa_dtype unless it is bf16 bits the caller asked for
    raise TypeError(f"{name}: torch dtype {t.dtype} is not supported: use float32, float64, "
                    "float16 or bfloat16")


def _as_array(x, name):
    if _is_torch(x):
        arr = _torch_to_numpy(x, name)
    else:
        arr = np.asarray(x)
    if not arr.dtype.isnative and arr.dtype.itemsize > 1:
        arr = arr.astype(arr.dtype.newbyteorder("="))
    if any(s < 0 or s % arr.itemsize for s in arr.strides):
        arr = np.ascontiguousarray(arr)
    return arr


def _tensor(arr, name, bf16_bits=None, code=None):
    if arr.ndim < 1 or arr.ndim > 4:
        raise ValueError(f"{name}: rank {arr.ndim} is not supported (1..4)")
    t = _Tensor()
    t.data = arr.ctypes.data
    t.dtype = _fa_dtype(arr, name, bf16_bits) if code is None else code
    t.rank = arr.ndim
    for i in range(arr.ndim):
        t.shape[i] = arr.shape[i]
        t.stride[i] = arr.strides[i] // arr.itemsize
    return t


def _output(shape, code):
    """A fresh numpy output and its fa_tensor; bf16 is uint16 bit patterns."""
    arr = np.empty(shape, dtype=_NP_OUT[code])
    return arr, _tensor(arr, "output", code=code)


def _torch_result(arr, code, device):
    """numpy result -> torch tensor on `device` (bf16 bit patterns -> torch.bfloat16)."""
    import torch
    if code == FA_BF16:
        t = torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16)
    else:
        t = torch.from_numpy(arr)
    return t.to(device) if str(device) != "cpu" else t


def _values(x, name, bf16_bits=None):
    """A side input (ALiBi slopes, sinks, rotary tables) as float32/float64 values, the only
    types the library takes for them: a torch tensor of any float type by value; uint16
    (int16 with bf16_bits=True) as bf16 bit patterns, by the rule q, k and v follow
    (bf16_bits=False refuses uint16); other numbers (Python ints, float16, ...) by value."""
    if _is_torch(x):
        import torch
        x = x.detach().to("cpu", torch.float64)
    a = _as_array(x, name)
    if a.dtype in (np.float32, np.float64):
        return a
    if a.dtype in (np.uint16, np.int16):
        _fa_dtype(a, name, bf16_bits)  # refuses what is not to be read as bf16 bits
        return (a.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    if a.dtype.kind not in "iuf" and a.dtype.name != "bfloat16":
        raise TypeError(f"{name}: unsupported dtype {a.dtype}: give float values")
    return a.astype(np.float64)


def _dropout(p, mask, keep):
    """A _Dropout from dropout_p and a keep-mask (bool or uint8 0/1, rank 4), or None."""
    if mask is None:
        if p:
            raise ValueError("dropout_p needs dropout_mask: the keep-mask is an input "
                             "(uint8 or bool [batch, heads, seqlen_q, seqlen_k])")
        return None
    if _is_torch(mask):
        mask = mask.detach().to("cpu").numpy()
    m = np.asarray(mask)
    if m.dtype == np.bool_:
        m = m.astype(np.uint8)
    if m.dtype != np.uint8:
        raise ValueError(f"dropout_mask must be uint8 or bool (0 drop, 1 keep), got {m.dtype}")
    if m.ndim != 4:
        raise ValueError(f"dropout_mask must be rank 4 [batch, heads, seqlen_q, seqlen_k], got rank {m.ndim}")
    p = _float_arg(p, "dropout_p")
    lib = library()
    d = _Dropout()
    lib.fa_dropout_init(ctypes.byref(d), ctypes.sizeof(_Dropout))
    d.p = p
    if any(st < 0 for st in m.strides) or not any(m.strides[r] for r in range(4) if m.shape[r] > 1):
        m = np.ascontiguousarray(m)  # reversed or fully broadcast views: give the library plain bytes
    d.keep_mask = m.ctypes.data
    for r in range(4):
        d.keep_shape[r] = m.shape[r]
        d.keep_stride[r] = m.strides[r]
    if not any(d.keep_stride[r] for r in range(4)):
        d.keep_stride[3] = 1  # all strides 0 would read as C order; one element needs any stride
    keep += [m, d]
    return d


def _rotary(cos, sin, interleaved, keep, bf16_bits=None):
    """A _Rotary from the cos/sin tables [seqlen_ro, rotary_dim / 2], or None."""
    if cos is None and sin is None:
        return None
    if cos is None or sin is None:
        raise ValueError("rotary_cos and rotary_sin go together")
    tabs = []
    for x, name in ((cos, "rotary_cos"), (sin, "rotary_sin")):
        a = _values(x, name, bf16_bits)
        t = _tensor(a, name)
        keep += [a, t]
        tabs.append(t)
    lib = library()
    r = _Rotary()
    lib.fa_rotary_init(ctypes.byref(r), ctypes.sizeof(_Rotary))
    r.cos = ctypes.pointer(tabs[0])
    r.sin = ctypes.pointer(tabs[1])
    r.interleaved = int(_bool_arg(interleaved, "rotary_interleaved", none_is_false=False))
    keep.append(r)
    return r


def _options(causal, window, softcap, scale, alibi_slopes, impl, num_threads, keep, align="bottom-right",
             sinks=None, dropout_p=0.0, dropout_mask=None, bf16_bits=None, standard_max_bytes=None):
    """fa_options from the keyword arguments, every value checked first."""
    scale = _scale_arg(scale)
    if align not in _ALIGNS:
        raise ValueError(f"align must be 'bottom-right' or 'top-left', got {align!r}")
    if window is None:
        wl = wr = None
    else:
        try:
            wl, wr = window
        except (TypeError, ValueError):
            raise ValueError(f"window must be a pair (left, right), got {window!r}") from None
    wl = _window_side(wl, "window left")
    wr = _window_side(wr, "window right")
    softcap = _float_arg(softcap if softcap is not None else 0.0, "softcap")
    if impl not in _IMPLS:
        raise ValueError(f"impl must be one of {sorted(_IMPLS)}, got {impl!r}")
    num_threads = _int_arg(num_threads, "num_threads", 0, _INT_MAX)
    lib = library()
    opt = _Options()
    lib.fa_options_init(ctypes.byref(opt), ctypes.sizeof(_Options))
    opt.scale = scale
    opt.causal = int(_bool_arg(causal, "causal"))
    opt.window_left = wl
    opt.window_right = wr
    opt.softcap = softcap
    opt.impl = _IMPLS[impl]
    opt.num_threads = num_threads
    opt.align = _ALIGNS[align]
    if standard_max_bytes is not None:  # None: the library's default cap (1 GiB)
        if isinstance(standard_max_bytes, (bool, np.bool_)):
            raise TypeError("standard_max_bytes must be an integer number of bytes, not a bool")
        opt.standard_max_bytes = _int_arg(standard_max_bytes, "standard_max_bytes", 1,
                                          2 ** (8 * ctypes.sizeof(ctypes.c_size_t)) - 1)
    if alibi_slopes is not None:
        a = _values(alibi_slopes, "alibi_slopes", bf16_bits)
        ta = _tensor(a, "alibi_slopes")
        keep += [a, ta]
        opt.alibi_slopes = ctypes.pointer(ta)
    if sinks is not None:
        a = _values(sinks, "sinks", bf16_bits)
        ts = _tensor(a, "sinks")
        keep += [a, ts]
        opt.sinks = ctypes.addressof(ts)
    d = _dropout(dropout_p, dropout_mask, keep)
    if d is not None:
        opt.dropout = ctypes.addressof(d)
    return opt


def _index_array(x, name, rank=1):
    """An int32 index array (cu_seqlens, seqused_k, ...): integers that fit int32."""
    if _is_torch(x):
        x = x.detach().to("cpu").numpy()
    a = np.asarray(x)
    if a.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integers (int32), got dtype {a.dtype}")
    if a.ndim != rank:
        raise ValueError(f"{name} must have rank {rank}, got shape {a.shape}")
    if a.size and (a.min() < -2 ** 31 or a.max() > 2 ** 31 - 1):
        raise ValueError(f"{name} holds values outside the int32 range")
    return np.ascontiguousarray(a, dtype=np.int32)


def _varlen(cu_seqlens_q, cu_seqlens_k, seqused_k, keep):
    """A fa_varlen pointer from the varlen arguments, or None (all None). The
    values are checked by the library (FlashAttnError naming the index)."""
    if cu_seqlens_q is None and cu_seqlens_k is None:
        if seqused_k is not None:
            raise ValueError("seqused_k needs cu_seqlens_q and cu_seqlens_k")
        return None
    if cu_seqlens_q is None or cu_seqlens_k is None:
        raise ValueError("varlen needs both cu_seqlens_q and cu_seqlens_k")
    cq = _index_array(cu_seqlens_q, "cu_seqlens_q")
    ck = _index_array(cu_seqlens_k, "cu_seqlens_k")
    if cq.size < 1 or ck.size != cq.size:
        raise ValueError(f"cu_seqlens_q and cu_seqlens_k must both have batch + 1 >= 1 entries "
                         f"(got {cq.size} and {ck.size})")
    vl = _Varlen()
    library().fa_varlen_init(ctypes.byref(vl), ctypes.sizeof(_Varlen))
    vl.batch = cq.size - 1
    i32p = ctypes.POINTER(ctypes.c_int32)
    vl.cu_seqlens_q = cq.ctypes.data_as(i32p)
    vl.cu_seqlens_k = ck.ctypes.data_as(i32p)
    keep += [cq, ck, vl]
    if seqused_k is not None:
        u = _index_array(seqused_k, "seqused_k")
        if u.size != cq.size - 1:
            raise ValueError(f"seqused_k must have batch = {cq.size - 1} entries, got {u.size}")
        vl.seqused_k = u.ctypes.data_as(i32p)
        keep.append(u)
    return vl


def _kvcache(q, k_cache, k, v, cache_seqlens, cache_batch_idx, cache_leftpad, block_table, bf16_bits, keep,
             new_names=("k", "v")):
    """A fa_kvcache from the cache arguments (values checked by the library); new_names are
    the caller's names of the new keys and values."""
    batch = q.shape[0]
    if isinstance(cache_seqlens, (int, np.integer)) and not isinstance(cache_seqlens, (bool, np.bool_)):
        cache_seqlens = np.full(batch, _int_arg(cache_seqlens, "cache_seqlens", 0, _INT_MAX), np.int32)
    kv = _KVCache()
    library().fa_kvcache_init(ctypes.byref(kv), ctypes.sizeof(_KVCache))
    i32p = ctypes.POINTER(ctypes.c_int32)
    for field, x in (("cache_seqlens", cache_seqlens), ("cache_batch_idx", cache_batch_idx),
                     ("cache_leftpad", cache_leftpad)):
        if x is None:
            continue
        a = _index_array(x, field)
        if a.size != batch:
            raise ValueError(f"{field} must have batch = {batch} entries, got {a.size}")
        setattr(kv, field, a.ctypes.data_as(i32p))
        keep.append(a)
    if block_table is not None:
        bt = _index_array(block_table, "block_table", rank=2)
        if bt.shape[0] != batch or bt.shape[1] < 1:
            raise ValueError(f"block_table must be [batch = {batch}, max_pages >= 1], got {bt.shape}")
        kv.block_table = bt.ctypes.data_as(i32p)
        kv.max_pages = bt.shape[1]
        keep.append(bt)
    if (k is None) != (v is None):
        raise ValueError(f"{new_names[0]} and {new_names[1]} (the new keys and values) go together")
    if k is not None:
        kn, vn = _as_array(k, new_names[0]), _as_array(v, new_names[1])
        tkn, tvn = _tensor(kn, new_names[0], bf16_bits), _tensor(vn, new_names[1], bf16_bits)
        keep += [kn, vn, tkn, tvn]
        kv.k_new = ctypes.pointer(tkn)
        kv.v_new = ctypes.pointer(tvn)
    keep.append(kv)
    return kv


def _cache_for_check(arrs, k_new, v_new, cache_seqlens, cache_batch_idx, cache_leftpad, block_table, bf16_bits,
                     keep):
    """check()'s and diagnose()'s KV cache: None without cache_seqlens, when no other cache
    argument may be given either (they would be ignored, and a kernel judged without them)."""
    if cache_seqlens is None:
        given = [n for n, x in (("k_new", k_new), ("v_new", v_new), ("cache_batch_idx", cache_batch_idx),
                                ("cache_leftpad", cache_leftpad), ("block_table", block_table)) if x is not None]
        if given:
            raise ValueError(f"{', '.join(given)} need{'s' if len(given) == 1 else ''} cache_seqlens (the KV "
                             "cache's lengths)")
        return None
    return _kvcache(arrs[0], arrs[1], k_new, v_new, cache_seqlens, cache_batch_idx, cache_leftpad, block_table,
                    bf16_bits, keep, ("k_new", "v_new"))


def _torch_device(*xs):
    """The device of the first torch tensor among xs, or None if none is one."""
    for x in xs:
        if _is_torch(x):
            return x.device
    return None


# ---- attention ------------------------------------------------------------------

def _num_splits(n):
    """num_splits as a C int (the library refuses negatives with a message)."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise TypeError(f"num_splits must be an int (got {type(n).__name__})")
    if not -2**31 <= int(n) < 2**31:
        raise ValueError(f"num_splits {int(n)} is out of range")
    return int(n)


def attention(q, k, v, *, causal=False, window=None, softcap=0.0, scale=None,
              alibi_slopes=None, impl="flash", return_lse=False, out_dtype=np.float32,
              num_threads=0, bf16_bits=None, align="bottom-right", cu_seqlens_q=None,
              cu_seqlens_k=None, seqused_k=None, sinks=None, dropout_p=0.0, dropout_mask=None,
              num_splits=0, standard_max_bytes=None):
    """Exact attention forward: O = softmax(mask(scale * Q K^T)) V.

    q, k, v: numpy arrays or torch tensors (any device; copied to the host).
    window: (left, right) in keys, None or -1 for unbounded (other negative
    values are refused); masks are aligned bottom-right (docs/semantics.md), or
    top-left (PyTorch SDPA's is_causal) with align="top-left".
    scale: None for 1/sqrt(d); 0 is refused. out_dtype: "f32" (default),
    "f64", "f16", "bf16", or a numpy/torch dtype. Returns O and, with
    return_lse, LSE float32 [batch, heads, seqlen_q]. Given numpy inputs these
    are numpy arrays (bf16 O as uint16 bit patterns); given torch tensors,
    torch tensors on the first torch input's device (bf16 O as torch.bfloat16).
    bf16_bits: see the module doc (None: uint16 inputs are bf16 bits).
    cu_seqlens_q, cu_seqlens_k, seqused_k: a variable-length batch (module
    doc): q [total_q, heads, d], k/v [total_k, heads_k, d], O [total_q, heads,
    d_v], LSE [heads, total_q]; alibi_slopes [batch, heads] are per sequence.
    sinks: None, or attention sinks [heads] (float): one logit per head in the
    final-score domain, added to the softmax denominator only
    (LSE = ln(sum_j e^s_ij + e^sink_h)); a row with no visible key gets O = 0
    and LSE = sink.
    dropout_p, dropout_mask: dropout with a given keep-mask (uint8 or bool 0/1,
    [batch, heads, seqlen_q, seqlen_k]; varlen: [batch, heads, max q_len, max
    k_len]): O = (P * Z / (1 - p)) V, the LSE undropped.
    num_splits: split-KV of the decoding path (seqlen_q <= 16): 0 heuristic,
    1 none, n splits (the bits are identical for a fixed n at any thread count).
    standard_max_bytes: impl="standard" only: the cap on its score matrix in
    bytes (None: the library's 1 GiB); a problem above it raises FlashAttnError.
    """
    return_lse = _bool_arg(return_lse, "return_lse")
    lib = library()
    keep = []
    device = _torch_device(q, k, v)
    q, k, v = (_as_array(x, n) for x, n in ((q, "q"), (k, "k"), (v, "v")))
    tq, tk, tv = (_tensor(a, n, bf16_bits) for a, n in ((q, "q"), (k, "k"), (v, "v")))
    vl = _varlen(cu_seqlens_q, cu_seqlens_k, seqused_k, keep)
    code = _dtype_code(out_dtype, "out_dtype")
    opt = _options(causal, window, softcap, scale, alibi_slopes, impl, num_threads, keep, align, sinks,
                   dropout_p, dropout_mask, bf16_bits, standard_max_bytes)
    opt.num_splits = _num_splits(num_splits)
    if vl is not None:
        if q.ndim != 3 or v.ndim != 3:
            raise ValueError("varlen: q, k, v must be rank 3 [total, heads, d]")
        opt.varlen = ctypes.addressof(vl)
        o, to = _output((q.shape[0], q.shape[1], v.shape[2]), code)
        lse, tl = _output((q.shape[1], q.shape[0]), FA_F32) if return_lse else (None, None)
    else:
        if q.ndim != 4 or v.ndim != 4:
            raise ValueError("q, k, v must be rank 4 [batch, seqlen, heads, d]")
        B, Sq, H = q.shape[:3]
        dv = v.shape[3]
        o, to = _output((B, Sq, H, dv), code)
        lse, tl = _output((B, H, Sq), FA_F32) if return_lse else (None, None)
    st = lib.fa_forward(ctypes.byref(tq), ctypes.byref(tk), ctypes.byref(tv), ctypes.byref(to),
                        ctypes.byref(tl) if tl is not None else None, ctypes.byref(opt))
    if st != 0:
        _raise(st)
    if device is not None:
        o = _torch_result(o, code, device)
        lse = _torch_result(lse, FA_F32, device) if return_lse else None
    return (o, lse) if return_lse else o


def attention_with_kvcache(q, k_cache, v_cache, k=None, v=None, *, cache_seqlens, cache_batch_idx=None,
                           cache_leftpad=None, block_table=None, causal=False, window=None, softcap=0.0,
                           scale=None, alibi_slopes=None, impl="flash", return_lse=False,
                           out_dtype=np.float32, num_threads=0, bf16_bits=None, align="bottom-right",
                           sinks=None, rotary_cos=None, rotary_sin=None, rotary_interleaved=True,
                           num_splits=0, standard_max_bytes=None):
    """Attention against a KV cache, as FlashAttention's flash_attn_with_kvcache.

    q [batch, seqlen_q, heads, d]; k_cache/v_cache [batch_cache, seqlen_cache,
    heads_k, d] numpy arrays, or pages [num_pages, page_size, heads_k, d] with
    block_table [batch, max_pages] (int32). cache_seqlens: int or [batch] int32.
    k, v (optional) [batch, seqlen_new, heads_k, d]: written into k_cache and
    v_cache IN PLACE at cache_seqlens[b] (so the caches must be writable numpy
    arrays of the same dtypes); sequence b then attends to cache rows
    cache_leftpad[b] .. cache_seqlens[b] - 1 of cache cache_batch_idx[b] and its
    new keys, masks bottom-right aligned to that count. Returns O (and LSE
    [batch, heads, seqlen_q] with return_lse) like attention(); sinks as there.
    rotary_cos, rotary_sin [seqlen_ro, rotary_dim / 2]: rotary embedding of q
    and k before attention (needs k, v; the rotated k is what is appended), as
    flash_attn_with_kvcache: new key t at cache_seqlens[b] + t, queries at
    cache_seqlens[b] + i when causal or windowed, else at cache_seqlens[b];
    rotary_interleaved=True (FlashAttention's default here) pairs (2i, 2i+1),
    False pairs (i, i + rotary_dim / 2); dims past rotary_dim are untouched.
    num_splits, standard_max_bytes: as in attention() (split-KV: 0 heuristic, 1
    none, n splits; the standard path's cap on its score matrix).
    """
    return_lse = _bool_arg(return_lse, "return_lse")
    lib = library()
    keep = []
    device = _torch_device(q)
    q = _as_array(q, "q")
    if k is not None:
        for name, c in (("k_cache", k_cache), ("v_cache", v_cache)):
            if not isinstance(c, np.ndarray) or not c.flags.writeable:
                raise ValueError(f"{name} must be a writable numpy array (the new keys are appended into "
                                 "it in place)")
            # (a cache of no elements has no memory to share: nothing is appended into it)
            if c.size > 0 and not np.may_share_memory(_as_array(c, name), c):
                raise ValueError(f"{name} must be in native byte order with non-negative strides that are "
                                 "multiples of its item size (the new keys are appended into it in place; "
                                 "a converted copy would not be the caller's cache)")
    kc, vc = _as_array(k_cache, "k_cache"), _as_array(v_cache, "v_cache")
    tq, tk, tv = (_tensor(a, n, bf16_bits) for a, n in ((q, "q"), (kc, "k_cache"), (vc, "v_cache")))
    if q.ndim != 4 or kc.ndim != 4 or vc.ndim != 4:
        raise ValueError("q and the caches must be rank 4")
    kv = _kvcache(q, kc, k, v, cache_seqlens, cache_batch_idx, cache_leftpad, block_table, bf16_bits, keep)
    code = _dtype_code(out_dtype, "out_dtype")
    opt = _options(causal, window, softcap, scale, alibi_slopes, impl, num_threads, keep, align, sinks,
                   bf16_bits=bf16_bits, standard_max_bytes=standard_max_bytes)
    opt.kvcache = ctypes.addressof(kv)
    opt.num_splits = _num_splits(num_splits)
    rot = _rotary(rotary_cos, rotary_sin, rotary_interleaved, keep, bf16_bits)
    if rot is not None:
        opt.rotary = ctypes.addressof(rot)
    B, Sq, H = q.shape[:3]
    o, to = _output((B, Sq, H, vc.shape[3]), code)
    lse, tl = _output((B, H, Sq), FA_F32) if return_lse else (None, None)
    st = lib.fa_forward(ctypes.byref(tq), ctypes.byref(tk), ctypes.byref(tv), ctypes.byref(to),
                        ctypes.byref(tl) if tl is not None else None, ctypes.byref(opt))
    if st != 0:
        _raise(st)
    if device is not None:
        o = _torch_result(o, code, device)
        lse = _torch_result(lse, FA_F32, device) if return_lse else None
    return (o, lse) if return_lse else o


# ---- grad (backward pass) ----------------------------------------------------------

def grad(q, k, v, dout, *, out=None, lse=None, causal=False, window=None, softcap=0.0,
         scale=None, alibi_slopes=None, impl="flash", grad_dtype=np.float32, num_threads=0,
         bf16_bits=None, align="bottom-right", cu_seqlens_q=None, cu_seqlens_k=None, seqused_k=None,
         sinks=None, dropout_p=0.0, dropout_mask=None):
    """Attention backward pass (fa_backward): returns (dq, dk, dv), and with
    sinks (as in attention()) (dq, dk, dv, dsinks), dsinks float64 [heads]:
    dsinks_h = -sum_{b,i} e^(sink_h - LSE_bhi) (dO_bhi . O_bhi). dropout_p and
    dropout_mask as in attention(): the backward uses the same keep-mask.

    dout is dLoss/dO ``[batch, seqlen_q, heads, d_v]``. out and lse are the
    forward's O and LSE; when either is None, both are recomputed by the
    library. For GQA/MQA, dk and dv are summed over the query heads sharing a
    kv head. grad_dtype: "f32" (default), "f64", "f16", "bf16", or a
    numpy/torch dtype. Inputs may be numpy arrays or torch tensors (any
    device); the gradients are numpy arrays (bf16 as uint16 bit patterns), or
    torch tensors on the device of the first of q, k, v, dout that is one.
    impl: "flash" or "reference" ("standard" has no backward pass and raises
    FlashAttnError).
    Options, bf16_bits and the varlen arguments as in attention() (varlen:
    every array without its batch dimension, the gradients too).
    """
    lib = library()
    keep = []
    device = _torch_device(q, k, v, dout)
    q, k, v, dout = (_as_array(x, n) for x, n in ((q, "q"), (k, "k"), (v, "v"), (dout, "dout")))
    vl = _varlen(cu_seqlens_q, cu_seqlens_k, seqused_k, keep)
    rank = 3 if vl is not None else 4
    if q.ndim != rank or k.ndim != rank or v.ndim != rank or dout.ndim != rank:
        raise ValueError("q, k, v, dout must be rank 3 [total, heads, d] (varlen)" if vl is not None else
                         "q, k, v, dout must be rank 4 [batch, seqlen, heads, d]")
    tq, tk, tv, tdo = (_tensor(x, n, bf16_bits)
                       for x, n in ((q, "q"), (k, "k"), (v, "v"), (dout, "dout")))
    to = tl = None
    if out is not None and lse is not None:
        out, lse = _as_array(out, "out"), _as_array(lse, "lse")
        to, tl = _tensor(out, "out", bf16_bits), _tensor(lse, "lse", bf16_bits)
    code = _dtype_code(grad_dtype, "grad_dtype")
    opt = _options(causal, window, softcap, scale, alibi_slopes, impl, num_threads, keep, align, sinks,
                   dropout_p, dropout_mask, bf16_bits)
    if vl is not None:
        opt.varlen = ctypes.addressof(vl)
    (dq, tdq), (dk, tdk), (dv, tdv) = (_output(x.shape, code) for x in (q, k, v))
    extra = _BackwardExtra()
    lib.fa_backward_extra_init(ctypes.byref(extra), ctypes.sizeof(_BackwardExtra))
    ds = None
    if sinks is not None:
        ds, tds = _output((q.shape[-2],), FA_F64)
        keep.append(tds)
        extra.dsinks = ctypes.pointer(tds)
    st = lib.fa_backward_ex(ctypes.byref(tq), ctypes.byref(tk), ctypes.byref(tv),
                            ctypes.byref(to) if to is not None else None,
                            ctypes.byref(tl) if tl is not None else None,
                            ctypes.byref(tdo), ctypes.byref(tdq), ctypes.byref(tdk), ctypes.byref(tdv),
                            ctypes.byref(opt), ctypes.byref(extra))
    if st != 0:
        _raise(st)
    out = (dq, dk, dv) if ds is None else (dq, dk, dv, ds)
    if device is not None:
        return tuple(_torch_result(g, code if g is not ds else FA_F64, device) for g in out)
    return out


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
        names = {c: n for n, c in QFORMATS.items()}
        self.qkv_format = names.get(rep.qkv_format, str(rep.qkv_format))
        self.p_format = names.get(rep.p_format, str(rep.p_format))
        self.p_mismatch = bool(rep.p_mismatch)
        self.row_rule = bool(rep.row_rule)
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
          num_threads=0, bf16_bits=None, align="bottom-right", cu_seqlens_q=None, cu_seqlens_k=None,
          seqused_k=None, cache_seqlens=None, k_new=None, v_new=None, cache_batch_idx=None,
          cache_leftpad=None, block_table=None, qkv_format=None, kernel_model=None, sinks=None,
          dropout_p=0.0, dropout_mask=None, rotary_cos=None, rotary_sin=None, rotary_interleaved=True):
    """Check a tested attention output (and optionally its LSE) against the
    float64 reference, by the library's one tolerance model.

    q, k, v, out, lse: numpy arrays or torch tensors on any device (copied to
    the host), e.g. a CUDA kernel's bf16 output:
    ``flashattn.check(q, k, v, out, causal=True, dtype="bf16")``.
    dtype: the precision the tested kernel ran in ("bf16", "f16", "f32", or a
    numpy/torch dtype; None infers it from the arrays). atol/rtol: replace
    the default emulation rule by |out - ref| <= atol + rtol * |ref| (either
    given; the other defaults to 0). sample_rows: check that many random
    query rows per (batch, head), drawn with seed (0 <= seed < 2**64).
    Options, bf16_bits and the varlen arguments as in attention() (varlen:
    the report's batch and row name the sequence and the row within it).
    A KV cache as in attention_with_kvcache() (k, v are then the caches, as
    before the append; k_new/v_new are read, nothing is written).
    qkv_format: "e4m3", "e5m2", "e2m1" or "int8" when the kernel read Q, K, V
    in that format: pass them dequantized (see dequantize()); the
    low-precision rule (FlashAttention-3's FP8 rule, bf16 output) replaces the
    dtype rule. kernel_model="fa3" or "sage" also emulates that kernel's data
    path. Every report has cos_sim, rel_l1, rmse and sqnr_db. sinks: the
    attention sinks the kernel ran with, as in attention(); dropout_p and
    dropout_mask: the dropout it ran with (its keep-mask), as in attention();
    rotary_cos, rotary_sin, rotary_interleaved: with a KV cache, as in
    attention_with_kvcache() (q and k_new are passed unrotated).
    Returns a CheckReport (true when it passed); raises FlashAttnError on bad
    input.
    """
    lib = library()
    keep = []
    arrs = [_as_array(x, n) for x, n in ((q, "q"), (k, "k"), (v, "v"), (out, "out"))]
    tq, tk, tv, to = (_tensor(a, n, bf16_bits) for a, n in zip(arrs, ("q", "k", "v", "out")))
    tl = None
    if lse is not None:
        lse_a = _as_array(lse, "lse")
        keep.append(lse_a)
        tl = _tensor(lse_a, "lse", bf16_bits)
    opt = _options(causal, window, softcap, scale, alibi_slopes, "reference", num_threads, keep, align, sinks,
                   dropout_p, dropout_mask, bf16_bits)
    vl = _varlen(cu_seqlens_q, cu_seqlens_k, seqused_k, keep)
    if vl is not None:
        opt.varlen = ctypes.addressof(vl)
    kv = _cache_for_check(arrs, k_new, v_new, cache_seqlens, cache_batch_idx, cache_leftpad, block_table,
                          bf16_bits, keep)
    if kv is not None:
        opt.kvcache = ctypes.addressof(kv)
    rot = _rotary(rotary_cos, rotary_sin, rotary_interleaved, keep, bf16_bits)
    if rot is not None:
        opt.rotary = ctypes.addressof(rot)
    co = _CheckOptions()
    lib.fa_check_options_init(ctypes.byref(co), ctypes.sizeof(_CheckOptions))
    if dtype is not None:
        co.dtype = _dtype_code(dtype, "dtype")
    if atol is not None or rtol is not None:
        co.use_tolerance = 1
        co.atol = _float_arg(atol or 0.0, "atol")
        co.rtol = _float_arg(rtol or 0.0, "rtol")
    co.sample_rows = _int_arg(sample_rows, "sample_rows", 0, _INT64_MAX)
    co.seed = _int_arg(seed, "seed", 0, _UINT64_MAX)
    co.num_threads = _int_arg(num_threads, "num_threads", 0, _INT_MAX)
    if qkv_format is not None:
        if qkv_format not in ("e4m3", "e5m2", "e2m1", "int8"):
            raise ValueError(f"qkv_format must be 'e4m3', 'e5m2', 'e2m1' or 'int8', got {qkv_format!r}")
        co.qkv_format = QFORMATS[qkv_format]
    if kernel_model not in KERNEL_MODELS:
        raise ValueError(f"kernel_model must be None, 'fa3' or 'sage', got {kernel_model!r}")
    co.kernel_model = KERNEL_MODELS[kernel_model]
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


# ---- low-precision inputs --------------------------------------------------------

class _QTensor(ctypes.Structure):
    _fields_ = [("codes", ctypes.c_void_p), ("format", ctypes.c_int), ("packed", ctypes.c_int),
                ("shape", _i64 * 4), ("scale_kind", ctypes.c_int), ("scale", ctypes.c_double),
                ("head_scale", ctypes.c_void_p), ("scale_heads", _i64),
                ("block_scale", ctypes.c_void_p), ("block_scale_shape", _i64 * 4),
                ("scale_axis", ctypes.c_int), ("global_scale", ctypes.c_double)]


def dequantize(codes, qkv_format, *, descale=None, block_scales=None, scale_format=None,
               global_scale=None, along="d", packed=False):
    """Decode low-precision codes exactly into a float64 array (fa_dequantize).

    codes: uint8 array [batch, seqlen, heads, dim] (dim/2 bytes when packed:
    two e2m1 codes per byte, the first in the low nibble). qkv_format: "e4m3",
    "e5m2", "e2m1" or "int8". One scale: descale = a number (per tensor) or a
    float32 array [batch, heads_k] (FlashAttention-3's; for Q, heads_k divides
    its heads and head h uses h // (heads // heads_k)); or block_scales (uint8
    codes) with scale_format "nvfp4" (e4m3 per 16, times global_scale) or
    "mxfp4" (e8m0 per 32), along "d" (the last axis) or "tokens" (axis 1).
    """
    lib = library()
    lib.fa_dequantize.argtypes = [ctypes.POINTER(_QTensor), ctypes.c_char_p, ctypes.POINTER(_Tensor)]
    lib.fa_dequantize.restype = ctypes.c_int
    if qkv_format not in ("e4m3", "e5m2", "e2m1", "int8"):
        raise ValueError(f"qkv_format must be 'e4m3', 'e5m2', 'e2m1' or 'int8', got {qkv_format!r}")
    c = np.ascontiguousarray(_as_array(codes, "codes"))
    if c.dtype != np.uint8 or c.ndim != 4:
        raise ValueError(f"codes must be a 4-d uint8 array, got {c.dtype} with {c.ndim} dims")
    x = _QTensor()
    x.codes = c.ctypes.data
    x.format = QFORMATS[qkv_format]
    packed = _bool_arg(packed, "packed")
    x.packed = 1 if packed else 0
    shape = list(c.shape)
    if packed:
        shape[3] *= 2
    for i in range(4):
        x.shape[i] = shape[i]
    keep = [c]
    if descale is not None and block_scales is not None:
        raise ValueError("give descale or block_scales, not both")
    if block_scales is None:  # what only block scales use must not be given (and then ignored) without them
        if global_scale is not None:
            raise ValueError("global_scale goes with NVFP4 block_scales (scale_format='nvfp4')")
        if scale_format is not None:
            raise ValueError(f"scale_format {scale_format!r} needs block_scales")
        if along != "d":
            raise ValueError(f"along={along!r} needs block_scales")
    if descale is not None:
        if np.ndim(descale) == 0:
            x.scale_kind = 1
            d = _float_arg(descale, "descale")
            with np.errstate(over="ignore"):
                f = np.float32(d)
            if math.isfinite(d) and not np.isfinite(f):  # 1e39 is finite, its float32 is not
                raise ValueError(f"descale {d!r} is not a finite float32 scale")
            x.scale = float(f)
        else:
            ds = np.ascontiguousarray(descale, dtype=np.float32)
            if ds.ndim != 2:
                raise ValueError(f"descale must be a number or a [batch, heads_k] array, got {ds.ndim} dims")
            keep.append(ds)
            x.scale_kind = 2
            x.head_scale = ds.ctypes.data
            x.scale_heads = ds.shape[1]
            if ds.shape[0] != shape[0]:
                raise ValueError(f"descale has batch {ds.shape[0]}, codes {shape[0]}")
    elif block_scales is not None:
        if scale_format not in ("nvfp4", "mxfp4"):
            raise ValueError(f"scale_format must be 'nvfp4' or 'mxfp4', got {scale_format!r}")
        bs = np.ascontiguousarray(block_scales)
        if bs.dtype != np.uint8 or bs.ndim != 4:
            raise ValueError("block_scales must be a 4-d uint8 array of scale codes")
        keep.append(bs)
        x.scale_kind = 3 if scale_format == "nvfp4" else 4
        x.block_scale = bs.ctypes.data
        for i in range(4):
            x.block_scale_shape[i] = bs.shape[i]
        if along not in ("d", "tokens"):
            raise ValueError(f"along must be 'd' or 'tokens', got {along!r}")
        x.scale_axis = 3 if along == "d" else 1
        if global_scale is not None and scale_format == "mxfp4":
            raise ValueError("global_scale: MXFP4 has no global scale")
        if scale_format == "nvfp4":  # MXFP4 has no global scale: the struct's 0 (given one, the library refuses)
            g = np.float32(1.0 if global_scale is None else _float_arg(global_scale, "global_scale"))
            if not (np.isfinite(g) and g > 0):  # the C struct reads 0 as "not given" (1)
                raise ValueError(f"global_scale must be a finite float32 > 0, got {global_scale!r} "
                                 f"(as float32: {g!r})")
            x.global_scale = float(g)
    out = np.empty(shape, dtype=np.float64)
    t = _tensor(out, "out")
    st = lib.fa_dequantize(ctypes.byref(x), b"codes", ctypes.byref(t))
    if st != 0:
        _raise(st)
    return out


# ---- diagnose ---------------------------------------------------------------------

class DiagnoseReport:
    """What fa_diagnose found. ``diagnoses`` is a list of dicts (id, explained,
    param, detail), best first, empty for "diagnosis: none"; ``text`` is what
    `flashattn check --diagnose` prints; head_rel_rms / batch_rel_rms are the
    per-head and per-sequence error tables (numpy arrays)."""

    def __init__(self, rep, text):
        self.diagnoses = [dict(id=d.id.decode(), explained=d.explained, param=d.param,
                               detail=d.detail.decode()) for d in rep.items[:rep.n]]
        self.out_significant = bool(rep.out_significant)
        self.lse_significant = bool(rep.lse_significant)
        self.out_rel_rms = rep.out_rel_rms
        self.lse_rms = rep.lse_rms
        self.rows_sampled = rep.rows_sampled
        self.considered = [x for x in rep.considered.decode().split(", ") if x]
        self.head_rel_rms = np.array([rep.head_rel_rms[i] for i in range(rep.n_heads)])
        self.batch_rel_rms = np.array([rep.batch_rel_rms[i] for i in range(rep.n_batch)])
        self.text = text

    @property
    def first(self):
        """The best diagnosis id, or None."""
        return self.diagnoses[0]["id"] if self.diagnoses else None

    def __repr__(self):
        return f"DiagnoseReport(first={self.first!r}, diagnoses={len(self.diagnoses)})"

    def __str__(self):
        return self.text


def diagnose(q, k, v, out, lse=None, *, causal=False, window=None, softcap=0.0, scale=None,
             alibi_slopes=None, dtype=None, sample_rows=32, seed=0, min_explained=0.8,
             num_threads=0, bf16_bits=None, align="bottom-right", cu_seqlens_q=None, cu_seqlens_k=None,
             seqused_k=None, cache_seqlens=None, k_new=None, v_new=None, cache_batch_idx=None,
             cache_leftpad=None, block_table=None, qkv_format=None, sinks=None, dropout_p=0.0,
             dropout_mask=None, rotary_cos=None, rotary_sin=None, rotary_interleaved=True):
    """Name the known mistake behind a wrong output (fa_diagnose; `check --diagnose`).

    Arguments as for check() (varlen batches and KV caches, paged or not,
    included); sample_rows rows per (sequence, head) are evaluated (0: all).
    sinks: [heads] attention sinks of the tested kernel (`sink-missing` is then
    a candidate); dropout_p, dropout_mask: its dropout (`dropout-mask`).
    rotary_cos, rotary_sin, rotary_interleaved: with a KV cache, the rotary
    embedding the kernel was to apply, as in check() (q and k_new passed
    unrotated; `rotary-pairing` and `rotary-offset` are then candidates).
    qkv_format ("e4m3", "e5m2", "e2m1", "int8"; q, k, v passed dequantized):
    the rounding floor follows P's format, and `descale` and `p-saturation`
    are candidates.
    Returns a DiagnoseReport; raises FlashAttnError on bad input.
    """
    lib = library()
    keep = []
    arrs = [_as_array(x, n) for x, n in ((q, "q"), (k, "k"), (v, "v"), (out, "out"))]
    tq, tk, tv, to = (_tensor(a, n, bf16_bits) for a, n in zip(arrs, ("q", "k", "v", "out")))
    tl = None
    if lse is not None:
        lse_a = _as_array(lse, "lse")
        keep.append(lse_a)
        tl = _tensor(lse_a, "lse", bf16_bits)
    opt = _options(causal, window, softcap, scale, alibi_slopes, "reference", num_threads, keep, align,
                   sinks=sinks, dropout_p=dropout_p, dropout_mask=dropout_mask, bf16_bits=bf16_bits)
    vl = _varlen(cu_seqlens_q, cu_seqlens_k, seqused_k, keep)
    if vl is not None:
        opt.varlen = ctypes.addressof(vl)
    kv = _cache_for_check(arrs, k_new, v_new, cache_seqlens, cache_batch_idx, cache_leftpad, block_table,
                          bf16_bits, keep)
    if kv is not None:
        opt.kvcache = ctypes.addressof(kv)
    rot = _rotary(rotary_cos, rotary_sin, rotary_interleaved, keep, bf16_bits)
    if rot is not None:
        opt.rotary = ctypes.addressof(rot)
    do = _DiagnoseOptions()
    lib.fa_diagnose_options_init(ctypes.byref(do), ctypes.sizeof(_DiagnoseOptions))
    if dtype is not None:
        do.dtype = _dtype_code(dtype, "dtype")
    do.sample_rows = _int_arg(sample_rows, "sample_rows", 0, _INT64_MAX)
    do.seed = _int_arg(seed, "seed", 0, _UINT64_MAX)
    do.num_threads = _int_arg(num_threads, "num_threads", 0, _INT_MAX)
    do.min_explained = _float_arg(min_explained, "min_explained")
    if qkv_format is not None:
        if qkv_format not in ("e4m3", "e5m2", "e2m1", "int8"):
            raise ValueError(f"qkv_format must be 'e4m3', 'e5m2', 'e2m1' or 'int8', got {qkv_format!r}")
        do.qkv_format = QFORMATS[qkv_format]
    rep = _DiagnoseReport()
    st = lib.fa_diagnose(ctypes.byref(tq), ctypes.byref(tk), ctypes.byref(tv), ctypes.byref(to),
                         ctypes.byref(tl) if tl is not None else None, ctypes.byref(opt),
                         ctypes.byref(do), ctypes.byref(rep))
    if st != 0:
        _raise(st)
    try:
        n = lib.fa_diagnose_report_format(ctypes.byref(rep), None, 0)
        buf = ctypes.create_string_buffer(n + 1)
        lib.fa_diagnose_report_format(ctypes.byref(rep), buf, n + 1)
        return DiagnoseReport(rep, buf.value.decode())
    finally:
        lib.fa_diagnose_report_free(ctypes.byref(rep))
