/**
 * @file flashattn.h
 * @brief flashattn: exact attention on CPUs, computed the FlashAttention way.
 *
 * This is the whole public API. Everything is prefixed `fa_`.
 *
 * Semantics follow Dao-AILab/flash-attention v2.x `flash_attn_func`:
 *
 *   - Q `[batch][seqlen_q][heads][d]`, K `[batch][seqlen_k][heads_k][d]`,
 *     V `[batch][seqlen_k][heads_k][d_v]`, O `[batch][seqlen_q][heads][d_v]`,
 *     LSE `[batch][heads][seqlen_q]`. Any strides are accepted (BHSD too).
 *   - GQA/MQA: `heads % heads_k == 0`; query head h reads kv head
 *     `h / (heads / heads_k)`.
 *   - `s = scale * (q . k)`; softcap `s = c * tanh(s / c)`; ALiBi
 *     `s -= slope * |i + seqlen_k - seqlen_q - j|`; then the mask; then softmax.
 *   - Masks are aligned to the bottom-right corner: key j is visible to query i
 *     iff `j >= i + seqlen_k - seqlen_q - window_left` (unless window_left < 0)
 *     and `j <= i + seqlen_k - seqlen_q + window_right` (unless window_right < 0).
 *     `causal` means window_right = 0. fa_options::align = FA_ALIGN_TOP_LEFT
 *     drops the `seqlen_k - seqlen_q` term (PyTorch SDPA's convention).
 *   - A query row with no visible key gets O = 0 and LSE = -inf (LSE = the
 *     sink with fa_options::sinks). "No visible
 *     key" is decided from the mask alone: a row that sees keys but whose
 *     scores are NaN (a NaN in q, say) gets NaN, never the empty-row result.
 *   - The full semantics: docs/semantics.md.
 *
 * Reproducibility. The flash path's bits are identical for any thread count
 * and across runs, for a given (kernel ISA, block sizes). Both follow the
 * machine: the ISA is the best one the CPU supports, the blocks are derived
 * from the detected L2 (fa_block_sizes). To get the same bits on another
 * machine, pin both: FA_ISA=... (or fa_context_create with an ISA) and
 * FA_BLOCK_Q / FA_BLOCK_K (or fa_options::block_q / block_k); `flashattn
 * info` prints what is in force.
 *
 * Versioned structs. fa_options, fa_check_options and fa_check_report begin
 * with `struct_size`, set by their *_default() / *_init() functions to the
 * size the caller was compiled with; the library reads (and, for the report,
 * writes) only the fields that fit in it, so a program compiled against an
 * older header keeps working when later versions append fields. A
 * struct_size that is no published layout's size is refused (FA_ERR_OPTION),
 * and so is a newer caller's larger struct unless every byte this library
 * does not know is zero; fa_check writes back report->struct_size = the
 * bytes it wrote (min of the caller's size and the library's). Bindings fill
 * their mirror with fa_options_init(&o, sizeof mirror), not by value.
 *
 * Errors are values: every function returns an ::fa_status; a message naming
 * the problem is available from fa_last_error() on the calling thread.
 * The library never prints and never exits.
 */
#ifndef FLASHATTN_H
#define FLASHATTN_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

/** @brief Major version: changes when the ABI breaks. */
#define FA_VERSION_MAJOR 0
/** @brief Minor version: new functions or fields, compatible. */
#define FA_VERSION_MINOR 7
/** @brief Patch version: fixes only. */
#define FA_VERSION_PATCH 0
/** @brief Library version string, "MAJOR.MINOR.PATCH". */
#define FA_VERSION "0.7.0"
/** @brief The version as one comparable number: MAJOR*10000 + MINOR*100 + PATCH. */
#define FA_VERSION_NUMBER (FA_VERSION_MAJOR * 10000 + FA_VERSION_MINOR * 100 + FA_VERSION_PATCH)

/**
 * @brief Marks a public function. The library is compiled with
 * `-fvisibility=hidden` and FA_BUILDING_LIBRARY, so only names marked FA_API
 * are exported from libflashattn.so; everything else stays internal.
 */
#if defined(FA_BUILDING_LIBRARY) && (defined(__GNUC__) || defined(__clang__))
#define FA_API __attribute__((visibility("default")))
#else
#define FA_API
#endif

/**
 * @brief Version and instruction sets of the library actually linked.
 *
 * A static string such as `"0.2.0 (ISA: scalar avx2 avx512 compiled; avx512 in use)"`:
 * FA_VERSION of the library (not of the header the caller compiled against),
 * the kernel sets this build contains, and the one the dispatcher chose for
 * this CPU (FA_ISA forces it). When FA_ISA names a set this build or this CPU
 * lacks, the part after "compiled;" says so instead. Built on the first call;
 * never NULL, never fails, safe from any thread.
 */
FA_API const char *fa_version(void);

/** @brief Status codes returned by every fallible function. */
typedef enum fa_status {
    FA_OK = 0,              /**< Success. */
    FA_ERR_NULL_ARG,        /**< A required pointer argument was NULL. */
    FA_ERR_DTYPE,           /**< Unsupported or disallowed element type. */
    FA_ERR_SHAPE,           /**< Tensor shapes are inconsistent with each other or invalid. */
    FA_ERR_HEADS,           /**< heads is not a multiple of heads_k. */
    FA_ERR_STRIDE,          /**< A stride is invalid (e.g. negative, or outputs overlap). */
    FA_ERR_OPTION,          /**< An option is out of range (window, softcap, scale, threads, ...). */
    FA_ERR_ALIBI,           /**< ALiBi slopes have the wrong shape or type. */
    FA_ERR_IMPL,            /**< Unknown implementation requested. */
    FA_ERR_NOMEM,           /**< Memory allocation failed. */
    FA_ERR_TOO_LARGE,       /**< The request exceeds a configured memory cap (standard path). */
    FA_ERR_ISA,             /**< A forced instruction set is unknown or not supported by this CPU. */
    FA_ERR_IO,              /**< File could not be opened, read, or written. */
    FA_ERR_FORMAT,          /**< A file is malformed (bad .npy header, truncated, ...). */
    FA_ERR_NONFINITE,       /**< NaN or Inf where finite values are required. */
    FA_ERR_INDEX,           /**< An index array (cu_seqlens, seqused_k, cache_seqlens, block_table, ...) is invalid; the message names the index. */
    FA_STATUS_COUNT         /**< Number of status codes (not a status). */
} fa_status;

/** @brief Element types of tensors. */
typedef enum fa_dtype {
    FA_F32 = 0, /**< IEEE binary32. */
    FA_F64,     /**< IEEE binary64. */
    FA_F16,     /**< IEEE binary16 (half). */
    FA_BF16,    /**< bfloat16 (upper 16 bits of a binary32). */
    FA_DTYPE_COUNT /**< Number of dtypes (not a dtype). */
} fa_dtype;

/** @brief Largest head dimension (d and d_v) accepted; larger gives FA_ERR_SHAPE. */
#define FA_HEAD_DIM_MAX 4096

/** @brief Most OpenMP threads a call (or a context, or fa_check / fa_diagnose) may ask for;
 *  more gives FA_ERR_OPTION. (An OpenMP runtime that cannot create a thread ends the
 *  process instead of failing the call, so absurd counts are refused first; the result's
 *  bits never depend on the thread count.) A thread count of 0 takes the OpenMP default
 *  (OMP_NUM_THREADS), capped at this. */
#define FA_MAX_THREADS 4096

/**
 * @name Accepted ranges of the score parameters
 * The flash and standard paths compute scores in float32, so every path
 * (reference and fa_check included, so that check and run agree) refuses a
 * parameter whose float32 image would be 0 or infinite, or whose product
 * would overflow float32 (FA_ERR_OPTION / FA_ERR_ALIBI, naming the value and
 * the range). See docs/semantics.md.
 * @{
 */
/** @brief Largest |scale|: FLT_MAX. (Any smaller nonzero scale is accepted: below FLT_MIN its
 * float32 image is subnormal or 0, which moves a float32 score by at most ~2.4e-7.) */
#define FA_SCALE_MAX 3.4028234663852886e+38
/** @brief Smallest softcap other than 0 (off): 2^-126, so that 1/softcap is a float32. */
#define FA_SOFTCAP_MIN 1.1754943508222875e-38
/** @brief Largest softcap: 2^126, so that 1/softcap is a normal float32. */
#define FA_SOFTCAP_MAX 8.507059173023462e+37
/** @brief Largest ALiBi bias |slope| x (max(seqlen_q, seqlen_k) - 1): FLT_MAX / 2. */
#define FA_ALIBI_BIAS_MAX 1.7014117331926443e+38
/** @} */

/** @brief Maximum rank of a tensor descriptor. */
#define FA_MAX_RANK 4

/**
 * @brief A strided view of a dense array; the library never owns `data`.
 *
 * Strides are in elements, not bytes. A NULL stride array in
 * fa_tensor_make() means "C-contiguous" (a stride of 0 is a real stride: it
 * broadcasts an input, and is refused for an output dimension of extent > 1).
 * Attention tensors are rank 4
 * (Q, K, V, O) or rank 3 (LSE); ALiBi slopes are rank 1 `[heads]` or
 * rank 2 `[batch][heads]`.
 */
typedef struct fa_tensor {
    void *data;                     /**< First element. */
    fa_dtype dtype;                 /**< Element type. */
    int rank;                       /**< Number of dimensions, 1..FA_MAX_RANK. */
    int64_t shape[FA_MAX_RANK];     /**< Extent of each dimension. */
    int64_t stride[FA_MAX_RANK];    /**< Stride of each dimension, in elements. */
} fa_tensor;

/** @brief Implementations, all behind the same API and semantics. */
typedef enum fa_impl {
    FA_IMPL_FLASH = 0,  /**< Tiled online-softmax forward pass, SIMD + OpenMP; O(block) memory. */
    FA_IMPL_REFERENCE,  /**< Plain loops, float64 accumulation: the trusted result. */
    FA_IMPL_STANDARD,   /**< Textbook float32 path materializing S and P per head; memory-capped. */
    FA_IMPL_COUNT       /**< Number of implementations (not an implementation). */
} fa_impl;

/**
 * @brief A reusable execution context (see fa_context_create()): a pinned
 * kernel ISA, a default thread count, and a scratch arena reused across calls.
 */
typedef struct fa_context fa_context;

/**
 * @brief A variable-length batch: FlashAttention's `flash_attn_varlen_func`
 * layout, given to any call through fa_options::varlen. Initialize with
 * fa_varlen_init() (or fa_varlen_default()).
 *
 * The sequences are concatenated along the rows, and the tensors lose their
 * batch dimension:
 *   q `[total_q][heads][d]`, k `[total_k][heads_k][d]`, v `[total_k][heads_k][d_v]`
 *   (rank 3), o and dout `[total_q][heads][d_v]`, dq `[total_q][heads][d]`,
 *   dk `[total_k][heads_k][d]`, dv `[total_k][heads_k][d_v]` (rank 3), and
 *   lse `[heads][total_q]` (rank 2).
 * Sequence b (0 <= b < batch) owns query rows cu_seqlens_q[b] ..
 * cu_seqlens_q[b+1] - 1 and keys cu_seqlens_k[b] .. cu_seqlens_k[b] + n_b - 1,
 * where n_b = cu_seqlens_k[b+1] - cu_seqlens_k[b], or seqused_k[b] when
 * seqused_k is given (the rest of that sequence's keys are ignored).
 * Everything is per sequence: causal and window masks are aligned to the
 * bottom-right corner of that sequence's own q_len x n_b matrix, ALiBi
 * distances likewise, and `[batch][heads]` ALiBi slopes are indexed by the
 * sequence. Zero-length sequences (queries or keys) are allowed; a query row
 * with no key gets O = 0 and LSE = -inf, as any empty row.
 *
 * Rows no sequence owns (past cu_seqlens_q[batch], or keys past
 * seqused_k[b]) are written too: O = 0 and LSE = -inf for such query rows,
 * dQ = 0, and dK = dV = 0 for keys no query sees.
 *
 * Checked on every call (FA_ERR_INDEX, the message names the array and the
 * index): cu_seqlens_q[0] and cu_seqlens_k[0] are 0; neither decreases; no
 * entry is past total_q (q.shape[0]) or total_k (k.shape[0]); 0 <=
 * seqused_k[b] <= cu_seqlens_k[b+1] - cu_seqlens_k[b]. The arrays are read
 * by the call only; they must stay valid **and unchanged** during it: the call
 * validates them once and then reads them again wherever it needs a
 * sequence's rows (they are not copied), so another thread writing them
 * meanwhile makes the result undefined (rows outside the tensors included).
 */
typedef struct fa_varlen {
    size_t struct_size;            /**< sizeof(fa_varlen) of the caller; set by fa_varlen_init(). */
    int64_t batch;                 /**< Number of sequences (>= 0). */
    const int32_t *cu_seqlens_q;   /**< `[batch + 1]` prefix sums of the query lengths, from 0. */
    const int32_t *cu_seqlens_k;   /**< `[batch + 1]` prefix sums of the key lengths, from 0. */
    const int32_t *seqused_k;      /**< NULL, or `[batch]`: sequence b uses only its first seqused_k[b] keys. */
    const char *cu_seqlens_q_name; /**< Name in messages (e.g. a file name); NULL: none. */
    const char *cu_seqlens_k_name; /**< Name in messages; NULL: none. */
    const char *seqused_k_name;    /**< Name in messages; NULL: none. */
} fa_varlen;

/** @brief Set every field of `vl` to its default (no arrays, batch 0), and
 *  struct_size to `struct_size` (the caller's sizeof(fa_varlen)). */
FA_API void fa_varlen_init(fa_varlen *vl, size_t struct_size);

#if defined(FA_BUILDING_LIBRARY) || defined(FA_NO_INLINE_DEFAULTS)
/** @brief A fa_varlen with every field at its default. */
FA_API fa_varlen fa_varlen_default(void);
#else
/** @brief A fa_varlen with every field at its default. */
static inline fa_varlen fa_varlen_default(void)
{
    fa_varlen v;
    fa_varlen_init(&v, sizeof v);
    return v;
}
#endif

/**
 * @brief A KV cache (FlashAttention's `flash_attn_with_kvcache`), given to
 * fa_forward and fa_check through fa_options::kvcache. Initialize with
 * fa_kvcache_init() (or fa_kvcache_default()). Forward only.
 *
 * q is `[batch][seqlen_q][heads][d]` as usual; k and v are the caches:
 *   contiguous `[batch_cache][seqlen_cache][heads_k][d]` (v: `d_v`), or, with
 *   block_table, pages `[num_pages][page_size][heads_k][d]` (any page size).
 * Sequence b attends to n_b = cache_seqlens[b] - cache_leftpad[b] + seqlen_new
 * keys: the cache rows cache_leftpad[b] .. cache_seqlens[b] - 1 of cache
 * cache_batch_idx[b] (default b), then its seqlen_new new keys k_new[b]
 * (v_new[b]), which fa_forward appends IN PLACE at rows cache_seqlens[b] ..
 * cache_seqlens[b] + seqlen_new - 1 of the cache (fa_check reads them from
 * k_new/v_new and writes nothing). A call that fails after the append puts
 * the rows it overwrote back (it keeps a copy of them first: memory of the
 * size of k_new and v_new, FA_ERR_NOMEM with nothing appended when that copy
 * cannot be made), so a failed call leaves the caches as they were. Masks, ALiBi and the bottom-right alignment
 * use n_b keys (key positions counted from cache_leftpad[b]). Paged: logical
 * key row r of sequence b is row r % page_size of page
 * block_table[b][r / page_size]; results are bit-identical to the same cache
 * stored contiguously.
 *
 * Checked on every call (FA_ERR_INDEX, naming the array and the index):
 * 0 <= cache_leftpad[b] <= cache_seqlens[b]; cache_seqlens[b] + seqlen_new
 * within the cache (seqlen_cache, or max_pages * page_size);
 * 0 <= cache_batch_idx[b] < batch_cache; every block_table entry a sequence
 * uses in 0..num_pages-1; no cache row written by two sequences' appends, nor
 * appended to where a sequence (the same one included) reads its cache.
 * k_new and v_new have the caches' dtypes. block_table cannot be combined with
 * cache_batch_idx or cache_leftpad (as in FlashAttention). As for fa_varlen,
 * the index arrays are validated once and read again during the call (not
 * copied): they must not change while it runs.
 */
typedef struct fa_kvcache {
    size_t struct_size;              /**< sizeof(fa_kvcache) of the caller; set by fa_kvcache_init(). */
    const int32_t *cache_seqlens;    /**< `[batch]` current cache lengths (required; batch = q's). */
    const fa_tensor *k_new;          /**< NULL, or new keys `[batch][seqlen_new][heads_k][d]` to append. */
    const fa_tensor *v_new;          /**< NULL, or new values `[batch][seqlen_new][heads_k][d_v]` (with k_new). */
    const int32_t *cache_batch_idx;  /**< NULL, or `[batch]`: the cache row of sequence b. */
    const int32_t *cache_leftpad;    /**< NULL, or `[batch]`: the first valid cache row of sequence b. */
    const int32_t *block_table;      /**< NULL, or `[batch][max_pages]` page indices (paged KV). */
    int64_t max_pages;               /**< block_table's row length. */
    const char *cache_seqlens_name;  /**< Name of cache_seqlens in messages (e.g. its file); NULL: none. */
    const char *cache_batch_idx_name; /**< Name of cache_batch_idx in messages; NULL: none. */
    const char *cache_leftpad_name;  /**< Name of cache_leftpad in messages; NULL: none. */
    const char *block_table_name;    /**< Name of block_table in messages; NULL: none. */
    const char *k_new_name;          /**< Name of k_new in messages (e.g. its file); NULL: "k_new". (Added in 0.6.) */
    const char *v_new_name;          /**< Name of v_new in messages; NULL: "v_new". (Added in 0.6.) */
} fa_kvcache;

/** @brief Set every field of `kv` to its default (no cache) and struct_size to `struct_size`. */
FA_API void fa_kvcache_init(fa_kvcache *kv, size_t struct_size);

#if defined(FA_BUILDING_LIBRARY) || defined(FA_NO_INLINE_DEFAULTS)
/** @brief A fa_kvcache with every field at its default. */
FA_API fa_kvcache fa_kvcache_default(void);
#else
/** @brief A fa_kvcache with every field at its default. */
static inline fa_kvcache fa_kvcache_default(void)
{
    fa_kvcache kv;
    fa_kvcache_init(&kv, sizeof kv);
    return kv;
}
#endif

/**
 * @brief Rotary position embedding applied inside the call (FlashAttention's
 * `flash_attn_with_kvcache` rotary_cos / rotary_sin), given through
 * fa_options::rotary. Initialize with fa_rotary_init() (or fa_rotary_default()).
 * Versioned: later versions only append fields.
 *
 * As in FlashAttention it needs a KV cache with new keys (fa_kvcache::k_new):
 * q and k_new are rotated before attention, and the rotated k_new is what is
 * appended into the cache. Positions: new key t of sequence b at
 * cache_seqlens[b] + t; query row i at cache_seqlens[b] + i when the mask is
 * causal or windowed (a window side >= 0 and below the cache's row capacity,
 * FlashAttention's "local"), else every query row at cache_seqlens[b]. With rotary_dim = 2 x cos.shape[1], each pair
 * (x1, x2) of the first rotary_dim elements of a row becomes
 * (x1 cos - x2 sin, x1 sin + x2 cos) with cos[pos][i], sin[pos][i]; the pairs
 * are (2i, 2i+1) when interleaved (GPT-J) and (i, i + rotary_dim/2) otherwise
 * (GPT-NeoX); elements past rotary_dim are untouched. The rotation is computed
 * in float64 and the rotated rows are rounded to the dtype of q (k_new), as
 * FlashAttention rounds them to its input dtype. The call allocates one
 * rotated copy of q and of k_new (not counted by fa_workspace_bytes).
 *
 * Refused: cos and sin not both rank 2 of one shape [seqlen_ro][rotary_dim/2],
 * f32 or f64, finite; rotary_dim > d; seqlen_ro too short for the largest
 * position (FA_ERR_SHAPE, naming it); rotary without a KV cache with k_new
 * (FA_ERR_OPTION).
 */
typedef struct fa_rotary {
    size_t struct_size;    /**< sizeof(fa_rotary) of the caller; set by fa_rotary_init(). */
    const fa_tensor *cos;  /**< `[seqlen_ro][rotary_dim / 2]`, f32 or f64. */
    const fa_tensor *sin;  /**< `[seqlen_ro][rotary_dim / 2]`, same shape. */
    int interleaved;       /**< Non-zero: GPT-J pairs (2i, 2i+1); 0: GPT-NeoX pairs (i, i + rotary_dim/2). */
    const char *cos_name;  /**< Name of cos in messages (e.g. its file); NULL: "rotary cos". (Added in 0.6.) */
    const char *sin_name;  /**< Name of sin in messages; NULL: "rotary sin". (Added in 0.6.) */
} fa_rotary;

/** @brief Set every field of @p r to its default (no tables, half-split) and struct_size to @p struct_size. */
FA_API void fa_rotary_init(fa_rotary *r, size_t struct_size);

#if defined(FA_BUILDING_LIBRARY) || defined(FA_NO_INLINE_DEFAULTS)
/** @brief A fa_rotary with every field at its default. */
FA_API fa_rotary fa_rotary_default(void);
#else
/** @brief A fa_rotary with every field at its default. */
static inline fa_rotary fa_rotary_default(void)
{
    fa_rotary r;
    fa_rotary_init(&r, sizeof r);
    return r;
}
#endif

/**
 * @brief Dropout with a caller-supplied keep-mask (FlashAttention's dropout,
 * reproduced for validation), given to fa_forward, fa_backward and fa_check
 * through fa_options::dropout. Initialize with fa_dropout_init() (or
 * fa_dropout_default()). Versioned: later versions only append fields.
 *
 * With Z the keep-mask and P the softmax of the (undropped) scores:
 *   O_i = sum_j P_ij Z_ij / (1 - p) v_j,   LSE_i = the undropped LSE,
 * and the backward pass uses the same Z: dV = (P o Z / (1-p))^T dO,
 * dS = P o (Z / (1-p) o dP - D), D = dO . O.
 *
 * keep_mask holds one byte per (batch, head, query row, key): 1 keep, 0 drop;
 * any other value is refused (FA_ERR_INDEX, naming the element). Its logical
 * shape is `[batch][heads][seqlen_q][seqlen_k]`; for a variable-length batch
 * `[batch][heads][max q_len][max k_len]` (FlashAttention's varlen layout: entry
 * [b][h][i][j] is query i, key j of sequence b). keep_stride gives the strides
 * in bytes (elements) of the four dimensions; all zero means C-contiguous.
 * (fa_tensor has no uint8 dtype: adding one would change FA_DTYPE_COUNT, which
 * is FA_CHECK_DTYPE_AUTO; so the mask is described here.)
 * p must be in [0, 1). KV caches (fa_kvcache) take no dropout.
 */
typedef struct fa_dropout {
    size_t struct_size;           /**< sizeof(fa_dropout) of the caller; set by fa_dropout_init(). */
    double p;                     /**< Drop probability, 0 <= p < 1: kept values are scaled by 1/(1-p). */
    const uint8_t *keep_mask;     /**< The keep-mask, 0/1 bytes (required). */
    int64_t keep_shape[4];        /**< Its shape: [batch, heads, seqlen_q, seqlen_k] (varlen: max lengths). */
    int64_t keep_stride[4];       /**< Its strides in bytes; all 0: C-contiguous. */
    const char *keep_mask_name;   /**< Name in messages (e.g. its file); NULL: "dropout keep_mask". */
} fa_dropout;

/** @brief Set every field of @p d to its default (p = 0, no mask) and struct_size to @p struct_size. */
FA_API void fa_dropout_init(fa_dropout *d, size_t struct_size);

#if defined(FA_BUILDING_LIBRARY) || defined(FA_NO_INLINE_DEFAULTS)
/** @brief A fa_dropout with every field at its default. */
FA_API fa_dropout fa_dropout_default(void);
#else
/** @brief A fa_dropout with every field at its default. */
static inline fa_dropout fa_dropout_default(void)
{
    fa_dropout d;
    fa_dropout_init(&d, sizeof d);
    return d;
}
#endif

/**
 * @brief Attention options. Initialize with fa_options_default().
 *
 * Fields after `standard_max_bytes` were added in 0.3; later versions only
 * append. The library reads only the first `struct_size` bytes.
 */
typedef struct fa_options {
    size_t struct_size;       /**< sizeof(fa_options) of the caller; set by fa_options_default(). */
    double scale;             /**< Softmax scale; 0 selects the default 1/sqrt(d). Else |scale| <= FA_SCALE_MAX. */
    int causal;               /**< Non-zero: causal mask (sets window_right = 0). */
    int64_t window_left;      /**< Keys to the left of the diagonal; < 0 means unbounded. */
    int64_t window_right;     /**< Keys to the right of the diagonal; < 0 means unbounded. */
    double softcap;           /**< > 0 enables s = softcap * tanh(s / softcap) (in [FA_SOFTCAP_MIN, FA_SOFTCAP_MAX]); 0 disables. */
    const fa_tensor *alibi_slopes; /**< NULL, or float32/float64 finite slopes `[heads]` or `[batch][heads]`; |slope| x (max(Sq, Sk) - 1) <= FA_ALIBI_BIAS_MAX. */
    fa_impl impl;             /**< Which implementation runs. */
    int num_threads;          /**< OpenMP threads (at most FA_MAX_THREADS); 0 uses the OpenMP default (OMP_NUM_THREADS), capped at FA_MAX_THREADS. */
    int block_q;              /**< Flash row block Br; 0 derives it from the cache sizes. */
    int block_k;              /**< Flash column block Bc; 0 derives it from the cache sizes. */
    size_t standard_max_bytes;/**< Cap on the standard path's S/P scratch; 0 = default (1 GiB). */
    int64_t pack_max_bytes;   /**< Cap on the K/V (forward) and Q/K (backward) panels the flash path
                                   packs once and shares between threads; 0 packs per tile; < 0 (the
                                   default) uses FA_FLASH_SHARED_MAX or 16 MiB. */
    fa_context *context;      /**< NULL, or a context from fa_context_create(). */
    int align;                /**< Mask alignment (an ::fa_align): FA_ALIGN_BOTTOM_RIGHT (0, the default,
                                   FlashAttention's) or FA_ALIGN_TOP_LEFT (PyTorch SDPA's is_causal).
                                   Added after 0.3.0's context. */
    const fa_varlen *varlen;  /**< NULL, or a variable-length batch (see fa_varlen): the tensors are
                                   then packed, without a batch dimension. Appended after align. */
    const fa_kvcache *kvcache; /**< NULL, or a KV cache (see fa_kvcache): k and v are then the caches
                                   (or pages). Forward and check only. Appended after varlen. */
    const fa_tensor *sinks;   /**< NULL, or float32/float64 `[heads]`: one learnable logit per head, in the
                                   scaled-logit domain, added to the softmax denominator only
                                   (LSE = ln(sum_j e^{s_ij} + e^{sink_h})); a row with no visible key then
                                   gets O = 0 and LSE = sink_h. Finite, |sink| <= FLT_MAX. Its gradient:
                                   fa_backward_ex. Appended after kvcache (0.5). */
    const struct fa_rotary *rotary;   /**< NULL, or rotary embedding of q and k_new inside the call (see fa_rotary;
                                           KV cache with new keys only). */
    const struct fa_dropout *dropout; /**< NULL, or dropout with a caller-supplied keep-mask (see fa_dropout). */
    int num_splits;           /**< Split-KV for decoding: 0 = heuristic, 1 = no split, n > 1 = n key splits
                                   (results are bit-identical for a fixed count, whatever the thread
                                   count). Used by FA_IMPL_FLASH when seqlen_q <= 16 (its decode path,
                                   which also packs a GQA group's query heads into one tile); clamped
                                   to the key blocks and to 128. The heuristic splits only when heads_k
                                   (x row chunks) is below 16 tasks, into enough splits to make 16; it
                                   looks at neither the batch nor the thread count, so a sequence's bits
                                   depend on neither. */
    void (*progress)(void *arg); /**< NULL, or a function the call runs now and then, after a task, on
                                   the thread that made the call (OpenMP thread 0 of the call's team),
                                   while the call's other threads go on computing: a way to drive the
                                   caller's own asynchronous work — an MPI rank's transfers
                                   (fa_ring_forward) — without stopping the computation. Within one call
                                   it never runs twice at once (two calls made at once with the same
                                   progress_arg may). It must return (no longjmp, no exception through
                                   it), should return soon (the call waits for it at its end), must not
                                   touch the call's tensors and must not call into flashattn; it cannot
                                   change a result. How often it runs depends on the tasks thread 0 takes
                                   (possibly never). Run by the flash forward's task loops (not its
                                   packing, not its decode path for seqlen_q <= 16) and the flash
                                   backward's; not by the reference or standard paths. Appended after
                                   num_splits (0.6). */
    void *progress_arg;       /**< Passed to progress. */
} fa_options;

/**
 * @brief Which corner the mask band (and the ALiBi distance) is aligned to.
 *
 * Bottom-right (FlashAttention >= 2.1): query row i lines up with key
 * i + seqlen_k - seqlen_q. Top-left (PyTorch SDPA's `is_causal`, FlashAttention
 * < 2.1): row i lines up with key i. The two agree when seqlen_q == seqlen_k.
 */
typedef enum fa_align {
    FA_ALIGN_BOTTOM_RIGHT = 0, /**< Diagonal offset seqlen_k - seqlen_q (the default). */
    FA_ALIGN_TOP_LEFT = 1      /**< Diagonal offset 0. */
} fa_align;

/** @brief Default cap on the standard path's materialized S and P, in bytes. */
#define FA_STANDARD_DEFAULT_MAX_BYTES ((size_t)1 << 30)

/**
 * @brief Zero the first @p struct_size bytes of @p opt, then set the fields
 * that fit to the defaults (non-causal, no window, flash, pack_max_bytes -1)
 * with `opt->struct_size = struct_size`; writes nothing past struct_size.
 * The ABI-stable way to initialize options.
 */
FA_API void fa_options_init(fa_options *opt, size_t struct_size);

#if defined(FA_BUILDING_LIBRARY) || defined(FA_NO_INLINE_DEFAULTS)
/** @brief Options with every field at its default (for bindings that mirror
 *  this exact struct; C code gets the inline version below). */
FA_API fa_options fa_options_default(void);
#else
/** @brief Options with every field at its default (non-causal, no window,
 *  flash), struct_size = the sizeof this code was compiled with. */
static inline fa_options fa_options_default(void)
{
    fa_options o;
    fa_options_init(&o, sizeof o);
    return o;
}
#endif

/**
 * @brief Create a context: a kernel ISA, a default thread count and a scratch
 * arena that calls given this context (fa_options::context) reuse.
 *
 * With a context, a call's scratch (per-thread tiles, packed panels, the
 * backward's D) comes from the arena, which grows to the largest call seen,
 * so a loop of same-shaped calls allocates nothing after the first. One
 * context serves one call at a time; a second thread using it concurrently
 * is correct but allocates as without a context.
 *
 * @param ctx          Receives the context.
 * @param isa          "scalar", "avx2", "avx512", "neon", or NULL / "" for the
 *                     dispatcher's choice (FA_ISA or the best supported).
 * @param num_threads  Threads of calls whose options say 0; 0: the OpenMP default.
 * @return FA_OK, FA_ERR_ISA (unknown or unsupported ISA), FA_ERR_OPTION, FA_ERR_NOMEM.
 */
FA_API fa_status fa_context_create(fa_context **ctx, const char *isa, int num_threads);

/** @brief Free a context and its arena. NULL is allowed. */
FA_API void fa_context_destroy(fa_context *ctx);

/** @brief Name of the context's kernel ISA. */
FA_API const char *fa_context_isa(const fa_context *ctx);

/** @brief Bytes the context's arena holds now (0 before the first call). */
FA_API size_t fa_context_arena_bytes(const fa_context *ctx);

/**
 * @brief Fill a tensor descriptor.
 * @param t       Descriptor to fill.
 * @param data    Element storage (not copied, not owned).
 * @param dtype   Element type.
 * @param rank    Number of dimensions (1..FA_MAX_RANK).
 * @param shape   `rank` extents.
 * @param stride  `rank` strides in elements, or NULL for C-contiguous.
 * @return FA_OK, or FA_ERR_NULL_ARG / FA_ERR_SHAPE / FA_ERR_DTYPE.
 */
FA_API fa_status fa_tensor_make(fa_tensor *t, void *data, fa_dtype dtype, int rank,
                         const int64_t *shape, const int64_t *stride);

/** @brief Number of elements of a tensor (product of its shape; 0 when any extent
 *  is 0). -1 when the shape is invalid: a negative extent, a rank outside
 *  1..FA_MAX_RANK, or a product that overflows int64. */
FA_API int64_t fa_tensor_numel(const fa_tensor *t);

/** @brief Size in bytes of one element of `dtype` (0 for an invalid dtype). */
FA_API size_t fa_dtype_size(fa_dtype dtype);

/** @brief Short name of a dtype: "f32", "f64", "f16", "bf16". */
FA_API const char *fa_dtype_name(fa_dtype dtype);

/**
 * @brief Element at logical index @p index (t->rank entries) as a double;
 * NaN for a NULL or out-of-range argument.
 */
FA_API double fa_tensor_get(const fa_tensor *t, const int64_t *index);

/**
 * @brief Exact attention forward pass: O = softmax(mask(scale Q K^T)) V.
 *
 * @param q    Query  `[batch][seqlen_q][heads][d]`, any dtype.
 * @param k    Key    `[batch][seqlen_k][heads_k][d]`, any dtype.
 * @param v    Value  `[batch][seqlen_k][heads_k][d_v]`, any dtype.
 * @param o    Output `[batch][seqlen_q][heads][d_v]`, written; float32, float64,
 *             float16 or bfloat16 (rounded to nearest even on store).
 * @param lse  Optional log-sum-exp `[batch][heads][seqlen_q]`, float32 or float64
 *             (natural log; -inf for rows with no visible key). May be NULL.
 * @param opt  Options, or NULL for fa_options_default().
 * @return FA_OK or an error status (see fa_last_error()).
 *
 * With opt->varlen (a variable-length batch, see fa_varlen) q, k, v and o are
 * packed without a batch dimension (`[total][heads][d]`) and lse is
 * `[heads][total_q]`; the same holds for fa_backward, fa_check and
 * fa_workspace_bytes.
 *
 * Inputs may contain NaN or Inf; the computation does not crash, and a NaN in
 * a key or value row reaches only the query rows that see it; a NaN in a query
 * row gives that row O = NaN and LSE = NaN (it sees keys: it is not empty).
 *
 * Outputs must not overlap q, k, v, the ALiBi slopes or each other, and must
 * map distinct indices to distinct elements (no zero stride on a dimension
 * longer than 1; sorted by stride, each stride larger than the furthest offset
 * the smaller dimensions reach): FA_ERR_STRIDE. The overlap test between two
 * tensors compares their address ranges, so outputs interleaved in one buffer
 * without sharing an element (e.g. a packed dqkv) are refused too.
 * d and d_v must be in 1..FA_HEAD_DIM_MAX (FA_ERR_SHAPE); the largest element
 * offset of every view must fit 64 bits in bytes (FA_ERR_STRIDE); the standard
 * path takes at most INT_MAX query rows and keys (FA_ERR_TOO_LARGE).
 */
FA_API fa_status fa_forward(const fa_tensor *q, const fa_tensor *k, const fa_tensor *v,
                     fa_tensor *o, fa_tensor *lse, const fa_options *opt);

/** @brief Human-readable name of a status code. */
FA_API const char *fa_status_string(fa_status status);

/**
 * @brief Detailed message for the most recent error on the calling thread.
 *
 * Names the argument and the problem, e.g. "q: heads (6) is not a multiple of
 * k heads (4)". Empty string after a success.
 */
FA_API const char *fa_last_error(void);

/** @brief Name of an implementation: "flash", "reference", "standard". */
FA_API const char *fa_impl_name(fa_impl impl);

/**
 * @brief Parse an implementation name.
 * @return FA_OK, or FA_ERR_IMPL if `name` is not one of the known names.
 */
FA_API fa_status fa_impl_from_name(const char *name, fa_impl *impl);

/** @brief Cache sizes the flash path plans for. */
typedef struct fa_cpu_info {
    size_t l1d_bytes;        /**< L1 data cache per core. */
    size_t l2_bytes;         /**< L2 cache per core. */
    size_t l3_bytes;         /**< Last-level cache (shared), 0 if unknown. */
    size_t line_bytes;       /**< Cache line size. */
    int cache_source;        /**< 0 = fallback defaults, 1 = sysconf/sysfs, 3 = FA_L1D_BYTES/FA_L2_BYTES. */
    const char *isa;         /**< Kernel ISA in use: "scalar", "avx2", "avx512", "neon". */
    int simd_width;          /**< float32 lanes of the chosen kernel. */
    int max_threads;         /**< OpenMP default thread count (1 without OpenMP). */
} fa_cpu_info;

/** @brief Detected cache geometry, chosen ISA and thread count. */
FA_API fa_status fa_get_cpu_info(fa_cpu_info *info);

/**
 * @brief Block sizes the flash path will use for head dims d and d_v.
 *
 * The rule (docs/performance.md): M = per-core L2 bytes / 4 floats; square
 * blocks B = Br = Bc, the largest multiple of 16 (the SIMD width) with
 * B^2 + 2 B (d + d_v) <= 3/4 M — what one task keeps hot: Q_i, K_j^T, V_j,
 * the score tile S and O_i — clamped to [16, 256]; Br is then rounded down to
 * the kernel's register-block rows. `opt->block_q`/`block_k` (when non-zero)
 * and the environment variables FA_BLOCK_Q / FA_BLOCK_K override the derived
 * values. The blocks (with the ISA) determine the flash path's bits: pin them
 * to reproduce results across machines with different L2 sizes.
 *
 * @param d        Head dimension of Q and K.
 * @param d_v      Head dimension of V and O.
 * @param opt      Options (may be NULL).
 * @param block_q  Receives Br.
 * @param block_k  Receives Bc.
 */
FA_API fa_status fa_block_sizes(int64_t d, int64_t d_v, const fa_options *opt,
                         int *block_q, int *block_k);

/**
 * @brief Rows per strip of a whole score tile in the flash forward.
 *
 * The forward runs qk, the score transforms, softmax and dropout of a whole
 * Br x Bc tile in strips of this many rows (S's rows filling about 3/4 of L1d,
 * a multiple of the kernel's register-block rows), then P V once over the
 * tile; Br means whole tiles (two row blocks would not fit L1d, or
 * FA_STRIP_ROWS=0). FA_STRIP_ROWS=N pins it. Strips never change a bit.
 * The answer is for fa_block_sizes' Br; for a given seqlen_q the forward may
 * use a smaller Br (blocks spread evenly over the rows), and a strip is never
 * longer than the block it cuts. Since 0.6.
 *
 * @param d     Head dimension of Q and K.
 * @param d_v   Head dimension of V and O.
 * @param opt   Options (may be NULL): the blocks and the context's kernels.
 * @param rows  Receives the rows per strip (the Br of fa_block_sizes when whole).
 * @return FA_OK; FA_ERR_NULL_ARG (rows NULL), FA_ERR_SHAPE (a head dim outside
 *         1..FA_HEAD_DIM_MAX), or fa_block_sizes' errors.
 */
FA_API fa_status fa_strip_rows(int64_t d, int64_t d_v, const fa_options *opt, int *rows);

/**
 * @brief Bytes of scratch memory the chosen implementation will allocate.
 *
 * For FA_IMPL_STANDARD this is proportional to seqlen_q x seqlen_k; for
 * FA_IMPL_FLASH it is O(threads x block); for FA_IMPL_REFERENCE O(threads x seqlen_k).
 */
FA_API fa_status fa_workspace_bytes(const fa_tensor *q, const fa_tensor *k, const fa_tensor *v,
                             const fa_options *opt, size_t *bytes);


/**
 * @brief Scratch-memory accounting of the library's own allocations.
 *
 * Every buffer the library allocates goes through one counting allocator, so
 * tests can assert memory ceilings (the flash path allocates O(threads x block),
 * never O(seqlen_q x seqlen_k)).
 */
typedef struct fa_alloc_stats {
    size_t current_bytes;   /**< Bytes allocated now. */
    size_t peak_bytes;      /**< High-water mark since the last fa_alloc_stats_reset(). */
    size_t total_allocs;    /**< Number of allocations since the last reset. */
} fa_alloc_stats;

/** @brief Read the allocation counters. */
FA_API void fa_alloc_stats_get(fa_alloc_stats *stats);

/** @brief Reset peak_bytes to current_bytes and total_allocs to 0. */
FA_API void fa_alloc_stats_reset(void);

/* ---- validation (flashattn check) API: see issue 4 ---- */

/**
 * @defgroup check Validating an attention output (flashattn check)
 *
 * fa_check() compares a tested attention output — typically from a GPU kernel
 * in bf16 or fp16 — against the float64 reference, under one tolerance model
 * shared by the CLI (`flashattn check`), python/flashattn.py, the tests and the
 * CUDA harness. See docs/validation.md.
 *
 * **Default rule (FlashAttention's own test rule, reproduced on the CPU).**
 * For the precision the tested kernel ran in (fa_check_options::dtype), the
 * checker also computes a plain attention the way a low-precision
 * implementation would: inputs rounded to the dtype, scores (q * scale) . k
 * accumulated in float32, P = softmax rounded to the dtype before P·V
 * (accumulated in float32), the output rounded to the dtype. Its max abs error
 * against the float64 reference is the *emulation error* e_emu. The tested
 * output passes iff its max abs error e_test <= 2 * e_emu + atol, with the
 * small atol = a * max|O_ref|, a = 2^-9 for bf16 and 2^-12 for f16 (half the
 * dtype's unit roundoff: a guard against a degenerate, near-zero emulation
 * error) and 2^-18 for f32 (float32's plain-attention error is pure
 * accumulation noise, so its max is a noisy statistic; the floor keeps
 * correct SIMD kernels from failing by chance).
 * Every element with |O_test - O_ref| above that bound counts as out of
 * tolerance.
 *
 * **Explicit rule.** With fa_check_options::use_tolerance set, an element is
 * out of tolerance iff |O_test - O_ref| > atol + rtol * |O_ref| (numpy's
 * allclose), and the check passes iff no element is.
 *
 * NaN or Inf anywhere in the checked part of the tested output always fails.
 *
 * **LSE** (optional, `[batch][heads][seqlen_q]`, f32 or f64): a row with no
 * visible key must be -inf or +inf (FlashAttention 3/4 and 2 conventions);
 * other rows must be finite and within 2 * (emulated LSE error) +
 * 1e-4 * max(1, max|LSE_ref|) (default rule) or atol + rtol * |LSE_ref|
 * (explicit rule). Under causal masking with ALiBi, FlashAttention-2 reports
 * an LSE higher by slope * (i + seqlen_k - seqlen_q); the checker accepts that
 * convention too when it fits better, and says so in the report.
 *
 * **Row sampling.** fa_check_options::sample_rows = K > 0 checks K distinct
 * query rows per (batch, head), chosen by a seeded generator, exactly, in
 * O(K * seqlen_k * d) per (batch, head). Each sampled row is computed with the
 * full problem geometry (bottom-right mask alignment uses seqlen_q), so the
 * result for a row is the same as in a full check.
 * @{
 */

/** @brief fa_check_options::dtype value: infer the precision from the tensors. */
#define FA_CHECK_DTYPE_AUTO FA_DTYPE_COUNT

/** @brief How many failing rows a report lists (the first in (batch, row, head) order). */
#define FA_CHECK_MAX_FAIL_ROWS 8

/** @brief Options of fa_check(). Initialize with fa_check_options_default(). */
typedef struct fa_check_options {
    size_t struct_size;  /**< sizeof(fa_check_options) of the caller; set by fa_check_options_default(). */
    /** Precision the tested kernel ran in: FA_BF16, FA_F16 or FA_F32 (FA_F64 is
     *  checked with the f32 rule). FA_CHECK_DTYPE_AUTO (the default) takes the
     *  lowest precision among the dtypes of q, k, v and the tested output. */
    fa_dtype dtype;
    int use_tolerance;   /**< Non-zero: atol/rtol below replace the emulation rule. */
    double atol;         /**< Absolute tolerance of the explicit rule (>= 0). */
    double rtol;         /**< Relative tolerance of the explicit rule (>= 0). */
    int64_t sample_rows; /**< K > 0: check K random query rows per (batch, head); 0: all rows. */
    uint64_t seed;       /**< Seed of the row sampler. */
    int num_threads;     /**< OpenMP threads (at most FA_MAX_THREADS); 0 uses the OpenMP default (OMP_NUM_THREADS), capped at FA_MAX_THREADS. */
    /* Names used in error messages (e.g. file names); NULL selects the default. */
    const char *q_name;   /**< Name of q in messages (default "q"). */
    const char *k_name;   /**< Name of k in messages (default "k"). */
    const char *v_name;   /**< Name of v in messages (default "v"). */
    const char *out_name; /**< Name of the tested output in messages (default "out"). */
    const char *lse_name; /**< Name of the tested LSE in messages (default "lse"). */
    /* Appended in 0.4 (low-precision inputs). */
    /** An ::fa_qformat: the format Q, K and V were stored in (they are passed
     *  dequantized, see fa_dequantize). Not FA_QF_NONE: the low-precision rule
     *  (FlashAttention-3's FP8 rule) replaces the dtype rule; dtype is ignored. */
    int qkv_format;
    /** An ::fa_kernel_model: also emulate that kernel's data path and hold the
     *  output to 2x its error (needs qkv_format). */
    int kernel_model;
} fa_check_options;

/** @brief One failing query row in a report. */
typedef struct fa_check_row {
    int64_t batch;             /**< Batch index of the row. */
    int64_t row;               /**< Query row (index into seqlen_q). */
    int64_t head;              /**< Query head. */
    int64_t n_fail;            /**< Elements of the row out of tolerance (NaN/Inf included). */
    int64_t worst_col;         /**< Column of the row's largest error. */
    double max_abs_err;        /**< Largest |O_test - O_ref| in the row (+inf for NaN/Inf). */
} fa_check_row;

/**
 * @brief What fa_check() found. Release with fa_check_report_free().
 *
 * Indices are logical: (batch, row, head, col) of O `[batch][seqlen_q][heads][d_v]`.
 */
typedef struct fa_check_report {
    size_t struct_size;        /**< Set by the caller (fa_check_report_init()); fa_check writes only this many bytes. */
    int pass;                  /**< 1: the output (and the LSE, when given) is within tolerance. */
    int out_pass;              /**< 1: the output is within tolerance. */
    int lse_pass;              /**< 1: the LSE is within tolerance (1 when no LSE was given). */
    fa_dtype dtype;            /**< Precision rule applied (FA_BF16, FA_F16 or FA_F32). */
    int use_tolerance;         /**< 1: explicit atol/rtol rule; 0: emulation rule. */
    double atol;               /**< atol in force (emulation rule: a * max|O_ref|, see above). */
    double rtol;               /**< rtol in force (0 under the emulation rule). */
    double bound;              /**< Emulation rule: 2 * emu_max_abs_err + atol; explicit: atol. */

    int64_t batch;             /**< Problem geometry: batch. */
    int64_t seqlen_q;          /**< Problem geometry: query rows. */
    int64_t seqlen_k;          /**< Problem geometry: keys. */
    int64_t heads;             /**< Problem geometry: query heads. */
    int64_t heads_k;           /**< Problem geometry: key/value heads. */
    int64_t d;                 /**< Problem geometry: head dim of Q and K. */
    int64_t dv;                /**< Problem geometry: head dim of V and O. */
    int64_t rows_checked;      /**< Query rows compared (batch * heads * rows per head). */
    int64_t rows_total;        /**< batch * heads * seqlen_q. */
    int64_t elements_checked;  /**< rows_checked * dv. */
    int64_t sample_rows;       /**< Rows per (batch, head) when sampling, else 0. */
    uint64_t seed;             /**< Sampler seed used. */

    double max_abs_err;        /**< max |O_test - O_ref| (+inf if any NaN/Inf). */
    double mean_abs_err;       /**< Mean over finite elements. */
    double max_rel_err;        /**< max |O_test - O_ref| / max(|O_ref|, 1e-3 * max|O_ref|). */
    double mean_rel_err;       /**< Mean of the same. */
    double max_abs_ref;        /**< max |O_ref| over the checked rows. */
    double emu_max_abs_err;    /**< Max abs error of the low-precision emulation vs the reference. */
    double emu_mean_abs_err;   /**< Mean abs error of the emulation. */
    double ratio;              /**< max_abs_err / emu_max_abs_err (inf if the latter is 0). */

    int64_t n_fail;            /**< Elements out of tolerance (NaN/Inf included). */
    double fail_fraction;      /**< n_fail / elements_checked. */
    int64_t n_nonfinite;       /**< NaN or Inf elements in the checked tested output. */
    int64_t rows_failed;       /**< Rows with at least one element out of tolerance. */

    int64_t worst_batch;       /**< Element of max_abs_err: batch (-1 if none). */
    int64_t worst_row;         /**< Element of max_abs_err: query row. */
    int64_t worst_head;        /**< Element of max_abs_err: head. */
    int64_t worst_col;         /**< Element of max_abs_err: column of d_v. */
    double worst_test;         /**< Tested value there. */
    double worst_ref;          /**< Reference value there. */
    double worst_emu;          /**< Emulated value there. */

    int n_fail_rows;           /**< Entries used in fail_rows. */
    fa_check_row fail_rows[FA_CHECK_MAX_FAIL_ROWS]; /**< First failing rows in (batch, row, head) order. */

    int64_t n_heads;           /**< Length of the per-head arrays (= heads). */
    int64_t *head_fail;        /**< [heads] elements out of tolerance per query head (all batches). */
    double *head_max_abs_err;  /**< [heads] max abs error per query head. */

    int lse_checked;           /**< 1 if a tested LSE was given. */
    double lse_max_abs_err;    /**< max |LSE_test - LSE_ref| over rows with visible keys. */
    double lse_emu_max_abs_err;/**< Same for the float32 emulation. */
    double lse_bound;          /**< Tolerance the LSE max error was held to (max over rows under the explicit rule). */
    int64_t lse_n_fail;        /**< Rows whose LSE is out of tolerance. */
    int64_t lse_n_empty;       /**< Rows with no visible key (either infinity accepted). */
    int lse_fa2_alibi_offset;  /**< 1: the LSE follows FlashAttention-2's causal-ALiBi offset. */
    int64_t lse_worst_batch;   /**< Row of the largest LSE error: batch (-1 if none). */
    int64_t lse_worst_head;    /**< Row of the largest LSE error: head. */
    int64_t lse_worst_row;     /**< Row of the largest LSE error: query row. */
    double lse_worst_test;     /**< Tested LSE there. */
    double lse_worst_ref;      /**< Reference LSE there (with the offset when it applies). */

    /* Appended in 0.4: portable metrics (every report) and the low-precision rule. */
    double cos_sim;            /**< Cosine similarity of test and reference over the finite checked elements. */
    double rel_l1;             /**< Relative L1: sum |test - ref| / sum |ref|. */
    double rmse;               /**< Root mean square error. */
    double sqnr_db;            /**< 10 log10(sum ref^2 / sum (test - ref)^2) in dB (+inf when equal). */
    int qkv_format;            /**< The ::fa_qformat of the low-precision rule, FA_QF_NONE when off. */
    int p_format;              /**< Format P was rounded to in the baseline (::fa_qformat). */
    int kernel_model;          /**< The ::fa_kernel_model emulated, or 0. */
    double model_max_abs_err;  /**< Max abs error of the kernel model vs the reference. */
    double model_bound;        /**< 2 * model_max_abs_err + atol (the model's bound, applied too). */
    int64_t model_n_fail;      /**< Elements beyond model_bound. */
    double row_scale_test;     /**< Worst row of the tested output: the factor a with test ~ a * ref (least squares). */
    double row_scale_model;    /**< The same for the kernel model, or for the baseline without one (its largest |a - 1|). */
    int p_mismatch;            /**< 1: rows of the output are scaled against the reference well beyond the
                                    model (P saturated, or row sums not from the P used in P.V, or a wrong
                                    V descale), and that scaling explains at least 80% of the squared error. */
    double row_scale_explained;/**< Fraction of the squared error that a per-row factor (test ~ a * ref) explains. */
    double score_allow_max;    /**< Emulation rules: the largest per-element allowance — score rounding, and
                                    since 0.7 for bf16 / f16 P's and O's rounding (an element passes iff its
                                    error <= max(bound, its allowance); see docs/validation.md); 0 under an
                                    explicit atol/rtol. */

    /* Appended in 0.7: the row rule of the bf16 / f16 emulation rules. */
    int row_rule;              /**< 1: the row rule applied (the emulation rule for bf16 or f16): each checked
                                    row's L2 error must be at most max(K * the emulation's L2 error on that row,
                                    3 u sqrt(sum_j P_j^2 |v_j|^2)) + a * |ref row|_2, or the L2 norm of the
                                    row's allowances where larger; K = 2 sqrt(max(1, 64 / d_v)), u the dtype's
                                    unit roundoff, a the rule's atol unit (docs/validation.md, "The row rule"). */
    int64_t row_n_fail;        /**< Rows over the row rule (they fail the check even when no element does). */
    double row_ratio;          /**< Largest row L2 error over its row bound (<= 1 passes; 0 when no rule). */
    int64_t row_worst_batch;   /**< The row of row_ratio: batch (-1 if none). */
    int64_t row_worst_row;     /**< The row of row_ratio: query row. */
    int64_t row_worst_head;    /**< The row of row_ratio: head. */
} fa_check_report;

/** @brief Set the first @p struct_size bytes of @p opt to the default check
 *  options, with `opt->struct_size = struct_size`. */
FA_API void fa_check_options_init(fa_check_options *opt, size_t struct_size);

#if defined(FA_BUILDING_LIBRARY) || defined(FA_NO_INLINE_DEFAULTS)
/** @brief Default check options (for bindings that mirror this exact struct). */
FA_API fa_check_options fa_check_options_default(void);
#else
/** @brief Default check options: dtype auto, emulation rule, all rows, seed 0. */
static inline fa_check_options fa_check_options_default(void)
{
    fa_check_options o;
    fa_check_options_init(&o, sizeof o);
    return o;
}
#endif

/** @brief An empty report with struct_size set, ready for fa_check(). */
static inline fa_check_report fa_check_report_init(void)
{
    fa_check_report r;
    memset(&r, 0, sizeof r);
    r.struct_size = sizeof r;
    return r;
}

/**
 * @brief Check a tested attention output (and optionally its LSE) against the
 *        float64 reference.
 *
 * @param q        Query  `[batch][seqlen_q][heads][d]`, any dtype; must be finite.
 * @param k        Key    `[batch][seqlen_k][heads_k][d]`; must be finite.
 * @param v        Value  `[batch][seqlen_k][heads_k][d_v]`; must be finite.
 * @param out      Tested output `[batch][seqlen_q][heads][d_v]`, any dtype.
 * @param lse      Tested LSE `[batch][heads][seqlen_q]`, f32 or f64; NULL to skip.
 * @param attn     The attention options the tested kernel ran with (mask, scale,
 *                 softcap, ALiBi); impl, threads and blocks are ignored. NULL: defaults.
 * @param copt     Check options, NULL for fa_check_options_default().
 * @param report   Receives the findings (its first report->struct_size bytes are zeroed
 *                 first; initialize it with fa_check_report_init()); free with
 *                 fa_check_report_free().
 * @return FA_OK when the comparison ran — the verdict is report->pass, not the
 *         status — or an error status for bad arguments (shape mismatch,
 *         non-finite inputs: FA_ERR_NONFINITE, ...) with a message naming the
 *         tensor by its name from @p copt.
 */
FA_API fa_status fa_check(const fa_tensor *q, const fa_tensor *k, const fa_tensor *v,
                   const fa_tensor *out, const fa_tensor *lse, const fa_options *attn,
                   const fa_check_options *copt, fa_check_report *report);

/** @brief Free the arrays a report owns and zero it. Safe on a zeroed report. */
FA_API void fa_check_report_free(fa_check_report *report);

/**
 * @brief Validate q, k, v and the options as fa_forward() does, then require every
 *        element the attention reads to be finite — fa_check()'s input rule, for a
 *        caller that wants bad input refused before a forward pass (the CLI's `run`).
 *
 * What is read: the rows in use of a varlen batch (fa_varlen) or of a KV cache
 * (fa_kvcache: the cache rows cache_leftpad[b] .. cache_seqlens[b] - 1 of each
 * sequence, paged or not, and k_new/v_new), otherwise all of q, k and v. Rows no
 * sequence reads may hold anything. (Added in 0.6.)
 *
 * @param q       Query, as for fa_forward().
 * @param k       Keys (or the K cache, with a fa_kvcache in @p attn).
 * @param v       Values (or the V cache).
 * @param attn    The attention options (varlen, kvcache, masks); NULL: defaults.
 * @param q_name  Name of q in messages (e.g. its file); NULL: "q".
 * @param k_name  Name of k in messages; NULL: "k".
 * @param v_name  Name of v in messages; NULL: "v".
 * @return FA_OK; an argument error as fa_forward() would give it; FA_ERR_NONFINITE naming
 *         the tensor, the sequence (or batch) and the element.
 */
FA_API fa_status fa_check_inputs(const fa_tensor *q, const fa_tensor *k, const fa_tensor *v,
                                 const fa_options *attn, const char *q_name, const char *k_name,
                                 const char *v_name);

/**
 * @brief Write the human-readable report (what `flashattn check` prints).
 *
 * snprintf-like: writes at most @p size bytes including the terminating NUL
 * and returns the length the full text needs (excluding the NUL).
 */
FA_API size_t fa_check_report_format(const fa_check_report *report, char *buf, size_t size);

/** @brief The structs whose sizes fa_check_abi_size() reports. */
typedef enum fa_abi_struct {
    FA_ABI_TENSOR = 0,        /**< fa_tensor */
    FA_ABI_OPTIONS = 1,       /**< fa_options */
    FA_ABI_CHECK_OPTIONS = 2, /**< fa_check_options */
    FA_ABI_CHECK_REPORT = 3,  /**< fa_check_report */
    FA_ABI_DIAGNOSE_OPTIONS = 4, /**< fa_diagnose_options */
    FA_ABI_DIAGNOSE_REPORT = 5,  /**< fa_diagnose_report */
    FA_ABI_VARLEN = 6,           /**< fa_varlen */
    FA_ABI_KVCACHE = 7,          /**< fa_kvcache */
    FA_ABI_BACKWARD_EXTRA = 8,   /**< fa_backward_extra */
    FA_ABI_DROPOUT = 9,          /**< fa_dropout */
    FA_ABI_ROTARY = 10,          /**< fa_rotary */
    FA_ABI_STRUCT_COUNT       /**< Number of entries (not a struct). */
} fa_abi_struct;

/** @brief sizeof the library's struct @p which (an ::fa_abi_struct), for
 *         bindings that mirror the structs; 0 for an unknown value. */
FA_API size_t fa_check_abi_size(int which);

/** @} */

/* ---- low-precision inputs (FP8, FP4, INT8): see docs/validation.md ---- */

/**
 * @defgroup lowprec Low-precision inputs (FP8, FP4, INT8)
 *
 * GPU kernels that run in FP8 or FP4 read Q, K and V as 8- or 4-bit codes plus
 * scales. The library decodes them exactly (256-entry tables built from the
 * bit definitions) into float32/float64 tensors that every other entry point
 * takes; `run --impl reference` on them is exact attention on the dequantized
 * values, and fa_check judges a low-precision kernel's output with
 * fa_check_options::qkv_format set (FlashAttention-3's FP8 rule, see
 * fa_check).
 *
 * Formats (value of a code; S = sign bit):
 *   - FA_QF_E4M3 (FP8 e4m3fn): bias 7, no infinity, 0x7f/0xff NaN, max 448.
 *   - FA_QF_E5M2 (FP8 e5m2): bias 15, IEEE-like, 0x7c/0xfc infinity, max 57344.
 *   - FA_QF_E2M1 (FP4): 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives (codes
 *     0x0..0xf); one code per byte (upper nibble 0), or two per byte
 *     (fa_qtensor::packed: element 2i in the low nibble, 2i+1 in the high).
 *   - FA_QF_INT8: two's complement, value = code (symmetric, no zero point).
 *   - FA_QF_E8M0 (MX block scale): 2^(code - 127), 0xff NaN.
 * Encoders round to nearest, ties to even, and saturate to the largest finite
 * value (as the GPU's cvt.rn.satfinite does; INT8 to +-127); NaN gives the
 * format's NaN code (0 for FP4 and INT8, which have none).
 * @{
 */

/** @brief Number formats of low-precision codes. */
typedef enum fa_qformat {
    FA_QF_NONE = 0, /**< Not a low-precision input. */
    FA_QF_E4M3,     /**< FP8 e4m3fn. */
    FA_QF_E5M2,     /**< FP8 e5m2. */
    FA_QF_E2M1,     /**< FP4 e2m1. */
    FA_QF_INT8,     /**< Symmetric INT8. */
    FA_QF_E8M0,     /**< MX scale: a power of two (block scales only). */
    FA_QF_COUNT     /**< Number of formats (not a format). */
} fa_qformat;

/** @brief "e4m3", "e5m2", "e2m1", "int8", "e8m0" ("none" for FA_QF_NONE), or NULL. */
FA_API const char *fa_qformat_name(int format);

/** @brief The format named @p name (as fa_qformat_name spells it; "e4m3fn" too), or FA_QF_NONE. */
FA_API fa_qformat fa_qformat_parse(const char *name);

/**
 * @brief The exact value of every code 0..255 of @p format.
 *
 * Codes that are no number of the format (e2m1 bytes above 0x0f, which only
 * occur unpacked) are NaN. @return FA_OK, FA_ERR_NULL_ARG, FA_ERR_OPTION for
 * an unknown format.
 */
FA_API fa_status fa_qformat_table(int format, double table[256]);

/** @brief The value of one code (NaN for an unknown format). */
FA_API double fa_qformat_decode(int format, unsigned code);

/** @brief The code of @p x: round to nearest even, saturating (see above). */
FA_API unsigned fa_qformat_encode(int format, double x);

/** @brief How a fa_qtensor is scaled. */
typedef enum fa_qscale_kind {
    FA_QSCALE_NONE = 0, /**< value = decoded code. */
    FA_QSCALE_TENSOR,   /**< value = code * fa_qtensor::scale (one fp32 for the tensor). */
    FA_QSCALE_HEAD,     /**< value = code * head_scale[b][h / (heads / scale_heads)] (FlashAttention-3's
                             per-(batch, kv head) fp32 descales: Q's too are per kv head). */
    FA_QSCALE_NVFP4,    /**< value = code * e4m3 block scale (one per 16 elements) * global_scale. */
    FA_QSCALE_MXFP4,    /**< value = code * e8m0 block scale (one per 32 elements). */
    FA_QSCALE_COUNT     /**< Number of kinds (not a kind). */
} fa_qscale_kind;

/**
 * @brief A low-precision tensor: codes plus scales, logical shape
 *        `[batch][seqlen][heads][dim]` (Q, K or V).
 *
 * Codes and block scales are C-contiguous bytes. Packed e2m1 holds dim/2
 * bytes per row (dim must be even). Block scales run along fa_qtensor::scale_axis:
 * 3 (the head dim, the default: Q and K) or 1 (tokens: V as FP4 kernels quantize
 * it); their shape is the tensor's with that axis replaced by ceil(extent / block).
 */
typedef struct fa_qtensor {
    const uint8_t *codes;       /**< The codes. */
    int format;                 /**< An ::fa_qformat other than FA_QF_NONE and FA_QF_E8M0. */
    int packed;                 /**< e2m1 only: two codes per byte, the first in the low nibble. */
    int64_t shape[4];           /**< Logical shape (elements, not bytes). */
    int scale_kind;             /**< An ::fa_qscale_kind. */
    double scale;               /**< FA_QSCALE_TENSOR: the scale (must be 0 with any other kind). */
    const float *head_scale;    /**< FA_QSCALE_HEAD: `[batch][scale_heads]` float32. */
    int64_t scale_heads;        /**< FA_QSCALE_HEAD: heads of head_scale; must divide shape[2]. */
    const uint8_t *block_scale; /**< NVFP4: e4m3 codes (>= 0); MXFP4: e8m0 codes. */
    int64_t block_scale_shape[4]; /**< Shape of block_scale. */
    int scale_axis;             /**< 3 (head dim; also 0 means 3) or 1 (tokens). */
    double global_scale;        /**< NVFP4: the fp32 per-tensor scale (0 means 1; negative refused;
                                     must be 0 with any other kind). */
} fa_qtensor;

/** @brief Block length of a block-scale kind: 16 (NVFP4), 32 (MXFP4), else 0. */
FA_API int64_t fa_qscale_block(int scale_kind);

/**
 * @brief Decode @p x into @p out (float32 or float64, rank 4, shape = x->shape,
 *        any strides).
 *
 * Refused with one message naming @p name (e.g. the file): an unknown format
 * or scale kind, a code that is NaN or infinite (inputs must be finite) or no
 * e2m1 code, scales of the wrong shape, a NaN or infinite scale, a negative
 * NVFP4 block scale, an odd dim for packed e2m1, a fa_qtensor::scale or
 * fa_qtensor::global_scale given with a scale kind that does not use it, and for
 * a float32 @p out a value (code times scales) beyond float32's range (FLT_MAX;
 * a float64 @p out holds it). Nothing is written on error.
 */
FA_API fa_status fa_dequantize(const fa_qtensor *x, const char *name, fa_tensor *out);

/** @brief Kernel data paths fa_check can emulate (fa_check_options::kernel_model). */
typedef enum fa_kernel_model {
    FA_KERNEL_MODEL_NONE = 0, /**< The default rule only. */
    FA_KERNEL_MODEL_FA3,      /**< FlashAttention-3 FP8: P scaled by 256 (exp2 offset 8), rounded to the
                                   format, row sums from the unrounded values, key blocks of 128 visited
                                   last to first with a running max, fp32 accumulators, bf16 output. */
    FA_KERNEL_MODEL_SAGE,     /**< SageAttention: FP8 P scaled by 448 (exp2 offset log2 448), row sums
                                   unrounded, key blocks of 64 first to last (SageAttention2); for e2m1,
                                   SageAttention3's two-level P: 448*6 exp(s - m), per 16 keys an e4m3
                                   scale max/6, e2m1 elements (blocks of 128). */
    FA_KERNEL_MODEL_COUNT     /**< Number of models (not a model). */
} fa_kernel_model;

/** @} */

/* ---- diagnosis (flashattn check --diagnose): issue 13 ---- */

/**
 * @defgroup diagnose Why did a kernel fail (flashattn check --diagnose)
 *
 * fa_diagnose() names the known mistake behind a wrong attention output. On
 * sampled query rows it evaluates a float64 model of the reference under each
 * candidate mistake of the vocabulary (docs/validation.md, "Why did my kernel
 * fail") that the problem's shape makes possible, fits the mistake's parameter
 * where it has one (a scale factor, a window shift, a head map, a log base, a
 * tile size, a rotary position offset), and ranks the candidates by the
 * fraction of the error each explains:
 *
 *     explained = 1 - ||T - C||^2 / ||T - R||^2      (T tested, C candidate, R reference)
 *
 * on the sampled rows, averaged over the output and the LSE when both are
 * wrong. A candidate is listed when it explains at least
 * fa_diagnose_options::min_explained. When the tested error is at the rounding
 * level of the kernel's precision (relative RMS below 2^-6 bf16, 2^-9 f16,
 * 2^-16 f32; LSE RMS below 5e-4 max(1, RMS LSE)) nothing is listed.
 *
 * Ids: causal-top-left, scale, softcap-missing, softcap-order, lse-log2,
 * lse-unscaled, gqa-head-map, window-shift, empty-row, missing-rescale,
 * tail-tile, layout-transposed, output-unwritten; varlen-leak, varlen-offset,
 * paged-index, kv-append-offset (variable-length batches and KV caches, per
 * sequence); split-combine; sink-missing and dropout-mask (with sinks or
 * dropout); p-saturation and descale (low-precision inputs, qkv_format);
 * rotary-pairing and rotary-offset (with fa_options::rotary: the reference and
 * every other candidate read q and k_new rotated the problem's way, these two
 * re-rotate them under a mistaken rule; rotary-offset's param is the fitted
 * position offset, NaN for its named variants: the query rule of the other
 * mask kind, new keys from position 0, rotary not applied to q or k_new).
 * @{
 */

/** @brief Entries of fa_diagnose_report::items. */
#define FA_DIAG_MAX 8

/** @brief One diagnosis: a vocabulary id, how much of the error it explains, its fitted parameter. */
typedef struct fa_diagnosis {
    char id[24];          /**< Vocabulary id, e.g. "scale". */
    double explained;     /**< Fraction of the error it explains (<= 1). */
    double param;         /**< The fitted parameter as a number (factor, shift, base, tile), or NaN. */
    char detail[160];     /**< The fitted parameter in words. */
} fa_diagnosis;

/** @brief Options of fa_diagnose(). Initialize with fa_diagnose_options_init(). */
typedef struct fa_diagnose_options {
    size_t struct_size;   /**< sizeof(fa_diagnose_options) of the caller. */
    fa_dtype dtype;       /**< Precision the kernel ran in (sets the rounding floor); FA_CHECK_DTYPE_AUTO (default). */
    int64_t sample_rows;  /**< Rows per (batch, head); 0: every row. Row 0 and the last row are always among them. */
    uint64_t seed;        /**< Seed of the row sampler. */
    int num_threads;      /**< OpenMP threads (at most FA_MAX_THREADS); 0: the OpenMP default. */
    double min_explained; /**< List candidates explaining at least this fraction (default 0.8). */
    int qkv_format;       /**< The ::fa_qformat Q, K, V were read in (passed dequantized), FA_QF_NONE (default)
                               when not low precision: sets the rounding floor from P's format and makes
                               `descale` and `p-saturation` candidates. (Added in 0.5.) */
} fa_diagnose_options;

/** @brief What fa_diagnose() found. Initialize with fa_diagnose_report_init(); free with fa_diagnose_report_free(). */
typedef struct fa_diagnose_report {
    size_t struct_size;        /**< Set by fa_diagnose_report_init(). */
    int n;                     /**< Diagnoses listed in items (0: none). */
    fa_diagnosis items[FA_DIAG_MAX]; /**< Best first. */
    int out_significant;       /**< 1: the output's error is above the rounding floor. */
    int lse_significant;       /**< 1: an LSE was given and its error is above its floor. */
    double out_rel_rms;        /**< ||T - R|| / ||R|| over the sampled rows (NaN when a sampled
                                    tested value is NaN, else inf with an Inf; the per-head and
                                    per-sequence values likewise). */
    double lse_rms;            /**< RMS LSE error over sampled rows with visible keys (0: no LSE). */
    int64_t rows_sampled;      /**< Query rows evaluated (all batches and heads). */
    int n_considered;          /**< Candidates the shape made possible and that were evaluated. */
    char considered[256];      /**< Their ids, comma-separated. */
    int64_t n_heads;           /**< Length of head_rel_rms. */
    double *head_rel_rms;      /**< [heads] relative RMS output error per query head. */
    int64_t n_batch;           /**< Length of batch_rel_rms. */
    double *batch_rel_rms;     /**< [batch] relative RMS output error per batch entry (sequence). */
} fa_diagnose_report;

/** @brief Set the first @p struct_size bytes of @p opt to the defaults (auto dtype,
 *  every row, seed 0, min_explained 0.8). */
FA_API void fa_diagnose_options_init(fa_diagnose_options *opt, size_t struct_size);

/** @brief An empty report with struct_size set, ready for fa_diagnose(). */
static inline fa_diagnose_report fa_diagnose_report_init(void)
{
    fa_diagnose_report r;
    memset(&r, 0, sizeof r);
    r.struct_size = sizeof r;
    return r;
}

/**
 * @brief Diagnose a tested output (and LSE): which known mistake explains its error.
 *
 * Arguments as for fa_check() (same validation, same names in messages:
 * fa_check_options' defaults); @p dopt NULL selects the defaults. Cost:
 * O(rows x seqlen_k x (d + d_v)) per candidate evaluation, with the dot
 * products cached per row when they fit in 256 MiB.
 * @return FA_OK when the diagnosis ran (the findings are in @p report), or an error status.
 */
FA_API fa_status fa_diagnose(const fa_tensor *q, const fa_tensor *k, const fa_tensor *v,
                             const fa_tensor *out, const fa_tensor *lse, const fa_options *attn,
                             const fa_diagnose_options *dopt, fa_diagnose_report *report);

/** @brief Free the arrays a report owns and zero it. Safe on a zeroed report. */
FA_API void fa_diagnose_report_free(fa_diagnose_report *report);

/**
 * @brief The text `flashattn check --diagnose` prints: `diagnosis: <id> (explains X% of
 * the error; <parameter>)` lines best first, or `diagnosis: none (...)`, then the
 * per-head and per-sequence error tables. snprintf-like.
 */
FA_API size_t fa_diagnose_report_format(const fa_diagnose_report *report, char *buf, size_t size);

/** @} */

/* ---- backward pass API ---- */

/**
 * @defgroup backward Backward pass (flashattn grad)
 *
 * fa_backward() computes the gradients of a scalar loss with respect to Q, K
 * and V, given dO = dLoss/dO, with FlashAttention-2's semantics (docs/semantics.md):
 *
 *     P    = exp(s - LSE)           (the softmax, from the final logits s)
 *     D_i  = dO_i . O_i
 *     dP   = dO V^T
 *     dS   = P o (dP - D)           (o: elementwise; D broadcast along a row)
 *     dS'  = dS o (1 - tanh^2(t / softcap))   when softcap > 0, t = scale (q . k)
 *     dQ   = scale dS' K,   dK = scale dS'^T Q,   dV = P^T dO
 *
 * For GQA/MQA, dK and dV of a kv head are summed over the query heads that
 * share it. A query row with no visible key contributes nothing to any
 * gradient (its dQ row is 0). ALiBi slopes are constants (no gradient).
 *
 * Implementations: FA_IMPL_REFERENCE (float64 loops, the trusted result) and
 * FA_IMPL_FLASH (tiled, float32, recomputes P from Q, K and LSE tile by tile,
 * never materializing seqlen_q x seqlen_k; scratch O(threads x block), plus
 * O(batch x heads x seqlen_q) for D and at most 16 MiB of packed operand
 * panels; fa_options::pack_max_bytes or the environment variable
 * FA_FLASH_SHARED_MAX (bytes, e.g. 4M) changes that cap, 0 packing per tile instead). FA_IMPL_STANDARD is not available for
 * the backward pass and returns FA_ERR_IMPL. Both implementations are
 * deterministic: the same inputs give the same bits for any thread count (no
 * atomics; every output element is accumulated by one thread in a fixed order).
 * @{
 */

/**
 * @brief Attention backward pass: dQ, dK, dV from dO.
 *
 * @param q     Query `[batch][seqlen_q][heads][d]`, any dtype.
 * @param k     Key   `[batch][seqlen_k][heads_k][d]`, any dtype.
 * @param v     Value `[batch][seqlen_k][heads_k][d_v]`, any dtype.
 * @param o     Forward output `[batch][seqlen_q][heads][d_v]`, any dtype, or
 *              NULL: then O is recomputed by a forward pass of the same
 *              implementation (extra memory O(batch x seqlen_q x heads x d_v)):
 *              for flash, the tiled float32 forward with fa_forward's blocks,
 *              so the gradients are those given fa_forward's own f32 (or f64)
 *              O and LSE wherever fa_forward is tiled (not its few-row decode
 *              path or the opt-in AMX one).
 * @param lse   Forward log-sum-exp `[batch][heads][seqlen_q]`, f32 or f64
 *              (-inf, or +inf, for rows with no visible key), or NULL: then it
 *              is recomputed by a forward pass like @p o. O and LSE must come
 *              from the same inputs and options; they are not re-checked.
 * @param dout  dO = dLoss/dO `[batch][seqlen_q][heads][d_v]`, any dtype.
 * @param dq    Written: dLoss/dQ, shape of @p q; f32, f64, f16 or bf16.
 * @param dk    Written: dLoss/dK, shape of @p k; f32, f64, f16 or bf16.
 * @param dv    Written: dLoss/dV, shape of @p v; f32, f64, f16 or bf16.
 * @param opt   The options of the forward pass (mask, scale, softcap, ALiBi,
 *              impl, threads, blocks), or NULL for fa_options_default().
 * @return FA_OK or an error status (see fa_last_error()); FA_ERR_IMPL for
 *         FA_IMPL_STANDARD.
 *
 * Every element of dq, dk and dv is written (keys no query sees get 0). The
 * outputs must not overlap each other or the inputs, and each must map
 * distinct indices to distinct elements (FA_ERR_STRIDE; see fa_forward: the
 * address-range test also refuses outputs interleaved in one buffer, such as
 * a packed dqkv). Inputs should be finite:
 * a NaN or Inf in an input gives NaN gradients wherever it is reached (it may
 * reach more elements than in the forward pass), but never a crash.
 */
FA_API fa_status fa_backward(const fa_tensor *q, const fa_tensor *k, const fa_tensor *v,
                      const fa_tensor *o, const fa_tensor *lse, const fa_tensor *dout,
                      fa_tensor *dq, fa_tensor *dk, fa_tensor *dv, const fa_options *opt);

/**
 * @brief Extra outputs of the backward pass (fa_backward_ex): gradients of
 * inputs that live in fa_options rather than in the argument list.
 * Initialize with fa_backward_extra_init(). Versioned like fa_options: later
 * versions only append fields.
 */
typedef struct fa_backward_extra {
    size_t struct_size;  /**< sizeof(fa_backward_extra) of the caller; set by fa_backward_extra_init(). */
    fa_tensor *dsinks;   /**< NULL, or written: dLoss/dsinks `[heads]`, f32 or f64. Needs
                              fa_options::sinks. dsinks_h = -sum_{b,i} e^{sink_h - LSE_{b,h,i}} D_{b,h,i},
                              D = dO . O (docs/semantics.md). */
    int emulate_dtype;   /**< 0 (default): off. FA_BF16 or FA_F16: instead of opt->impl's backward,
                              compute a plain one in that precision as PyTorch's autograd runs
                              FlashAttention's test reference (attention_ref(upcast=False,
                              reorder_ops=True)): every product's output rounded to the dtype
                              after a float32 sum, the softmax in float32 from the rounded scores,
                              each query head's dK, dV rounded before a GQA group's sum —
                              check-grad's baseline for bf16/f16 gradients; dsinks, when asked
                              for, as autograd gives a sink column with no value row (each
                              row's dS = P_sink (0 - D) rounded, summed in float32, rounded).
                              o and lse are not used. (Added in 0.6.) */
} fa_backward_extra;

/** @brief Set every field of @p x to its default (no extra outputs) and
 *  struct_size to @p struct_size (the caller's sizeof(fa_backward_extra)). */
FA_API void fa_backward_extra_init(fa_backward_extra *x, size_t struct_size);

/**
 * @brief fa_backward() with extra outputs: with @p extra NULL (or every
 * output in it NULL) it is fa_backward(). extra->dsinks receives the
 * gradient of the attention sinks (fa_options::sinks); requesting it without
 * sinks is FA_ERR_OPTION. The extra outputs follow the rules of dq, dk, dv
 * (no overlap with any other tensor of the call: FA_ERR_STRIDE).
 */
FA_API fa_status fa_backward_ex(const fa_tensor *q, const fa_tensor *k, const fa_tensor *v,
                                const fa_tensor *o, const fa_tensor *lse, const fa_tensor *dout,
                                fa_tensor *dq, fa_tensor *dk, fa_tensor *dv, const fa_options *opt,
                                const fa_backward_extra *extra);

/** @} */

/**
 * @brief Measure the FMA throughput of an ISA's kernels on this machine.
 *
 * Runs independent FMA chains on full vectors of @p isa on @p threads threads
 * (0: the OpenMP default) for about @p seconds (at least 0.05 s; the loop is
 * repeated until that much time has passed, best of 3), and reports GFLOP/s:
 * the ceiling that benchmarks state their fraction of.
 *
 * @return FA_OK, FA_ERR_ISA when the ISA is unknown, not built or not
 *         supported here, FA_ERR_NULL_ARG, FA_ERR_OPTION.
 */
FA_API fa_status fa_measure_fma_peak(const char *isa, int threads, double seconds, double *gflops);

/** @brief 1 if kernels for @p isa are built in and this CPU runs them, else 0. */
FA_API int fa_isa_supported(const char *isa);

/**
 * @brief 1 if this build, CPU and kernel can run the opt-in AMX path, else 0.
 *
 * With the environment variable FA_AMX=1, the flash forward computes the
 * products of bfloat16 Q, K, V (rows contiguous, d and d_v multiples of 32,
 * no dropout or rotary) on Intel AMX tiles, P carried in three bf16 parts so
 * the result stays float32-class (not the float32 path's bits); everything
 * else, and any problem with Inf or NaN inputs, runs the float32 path. Needs
 * AMX-BF16 and AVX512-BF16, Linux 5.16+ (the tile-data permission) and a
 * compiler that knows the intrinsics (GCC 11+, clang 12+). Values the tiles
 * would not compute to float32's standard (Inf, NaN, a nonzero magnitude below
 * 2^-40 or from 2^40: AMX flushes subnormal products) also send the call to
 * the float32 path, as does a kv head whose packed K and V exceed the
 * packing cap (fa_options::pack_max_bytes, 16 MiB by default: about 32k keys
 * at d = 128). fa_backward called without O and LSE recomputes the forward
 * on the float32 tiled path, never on the tiles (its P must see the scores
 * that LSE was summed from). A caller that uses AMX itself must load its tile
 * configuration again after a call that ran this path (the path releases the
 * tiles of the threads it ran on). The first call of this function (or of a
 * forward with FA_AMX=1) asks Linux for the process-wide permission to use
 * the tile data (arch_prctl), which also enlarges signal frames. Since 0.6.
 */
FA_API int fa_amx_available(void);

/**
 * Why fa_amx_available() is 0 here, in a few words naming the missing piece
 * (the CPU feature, the OS state, the kernel's permission, or this build's
 * compiler); NULL when it is 1. A static string. Like fa_amx_available(), its
 * first call runs the probe, which asks Linux for the tile-data permission.
 * Since 0.6.
 */
FA_API const char *fa_amx_why_not(void);

/**
 * How many forwards in this process have computed on AMX tiles (each counted
 * once, whatever its thread count; the recompute of fa_backward called without
 * O and LSE never runs there and does not count). A caller that sets
 * FA_AMX=1 can read it before and after a call to know whether that call ran
 * on the tiles or was handed over to the float32 path. Since 0.6.
 */
FA_API long fa_amx_calls(void);

#ifdef __cplusplus
}
#endif

#endif /* FLASHATTN_H */
