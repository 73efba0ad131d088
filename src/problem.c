/*
 * problem.c — the one validator: arguments and options in, one resolved
 * fa_problem out, for forward, backward, workspace queries and fa_check.
 *
 * Everything a caller can get wrong is caught here with a message naming the
 * argument (fa_last_error()): ranks, dtypes, shapes, strides (negative; the
 * largest reachable offset must fit 64 bits), head dims (1..FA_HEAD_DIM_MAX),
 * options (scale, softcap, window, threads, impl, blocks), ALiBi slopes, and
 * the environment (config.c). Outputs are checked by the entry points with
 * fa_check_output (overlap, zero strides), since only they know which tensors
 * a call writes.
 */
#include "problem.h"

#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "config.h"
#include "context.h"
#include "kernels/kernels.h"
#include "mask.h"
#include "pack.h"
#include "status.h"
#include "tensor.h"

#define DIM(x) ((long long)(x))

/* ------------------------------------------------------------------------ */
/* Versioned options                                                         */
/* ------------------------------------------------------------------------ */

/* The end of fa_options as 0.3.0 first laid it out (through
 * standard_max_bytes, before pack_max_bytes and context were appended): a
 * caller compiled against it sends this size (tests/test_abi.c). */
#define FA_OPTIONS_MIN_SIZE (offsetof(fa_options, standard_max_bytes) + sizeof(size_t))

/* The end of fa_options as 0.3.0 shipped (pack_max_bytes and context appended,
 * before align): a caller compiled against that layout sends this size. */
#define FA_OPTIONS_CONTEXT_SIZE (offsetof(fa_options, context) + sizeof(fa_context *))
/* ... and through align, before varlen was appended. A caller compiled then sends sizeof of
 * that struct, which ends with the int and so is padded to the struct's alignment (104, not
 * 100, on LP64): both are accepted. The padding bytes copied in land on padding again (varlen
 * starts at the padded end). */
#define FA_OPTIONS_ALIGN_SIZE (offsetof(fa_options, align) + sizeof(int))
#define FA_OPTIONS_ALIGN_PADDED_SIZE                                                                 \
    ((FA_OPTIONS_ALIGN_SIZE + _Alignof(fa_options) - 1) / _Alignof(fa_options) * _Alignof(fa_options))
_Static_assert(FA_OPTIONS_ALIGN_PADDED_SIZE <= offsetof(fa_options, varlen),
               "the align-era padding must not reach varlen");
/* ... and through varlen, before kvcache was appended. */
#define FA_OPTIONS_VARLEN_SIZE (offsetof(fa_options, varlen) + sizeof(const fa_varlen *))
/* ... and through kvcache (0.4.0), before sinks, rotary, dropout and num_splits. */
#define FA_OPTIONS_KVCACHE_SIZE (offsetof(fa_options, kvcache) + sizeof(const fa_kvcache *))
/* ... and through num_splits (0.5.0), before progress was appended (the struct's size then,
 * padding included: progress, a pointer, starts where it ended). */
#define FA_OPTIONS_SPLITS_SIZE offsetof(fa_options, progress)

fa_status fa_struct_size_check(const void *in, size_t lib_size, const size_t *known, int n_known,
                               const char *what, const char *init_fn)
{
    const size_t size = *(const size_t *)in;
    for (int x = 0; x < n_known; x++)
        if (size == known[x]) return FA_OK;
    if (size > lib_size && size <= FA_STRUCT_SIZE_MAX) {
        /* a newer caller: accepted when every field this library does not know is zero */
        const unsigned char *tail = (const unsigned char *)in + lib_size;
        for (size_t x = 0; x < size - lib_size; x++)
            if (tail[x])
                return fa_fail(FA_ERR_OPTION, "%s from a newer flashattn: fields this library does not "
                               "know are set (struct_size %zu, this library's is %zu)",
                               what, size, lib_size);
        return FA_OK;
    }
    /* only fa_options existed in 0.2, without struct_size: its first field was `double scale` */
    const int options = strcmp(what, "fa_options") == 0;
    return fa_fail(FA_ERR_OPTION, "%s: struct_size %zu is not the size of any %s layout (this library's "
                   "is %zu); initialize it with %s()%s",
                   what, size, what, lib_size, init_fn,
                   options ? " (a caller built against flashattn 0.2, whose options begin with `double scale`, "
                             "must be rebuilt)" : "");
}

void fa_options_init(fa_options *opt, size_t struct_size)
{
    if (!opt) return;
    memset(opt, 0, struct_size);
    fa_options o;
    memset(&o, 0, sizeof o);
    o.struct_size = struct_size;
    o.window_left = -1;
    o.window_right = -1;
    o.impl = FA_IMPL_FLASH;
    o.pack_max_bytes = -1;
    memcpy(opt, &o, struct_size < sizeof o ? struct_size : sizeof o);
}

fa_options fa_options_default(void)
{
    fa_options o;
    fa_options_init(&o, sizeof o);
    return o;
}

fa_status fa_options_read(const fa_options *in, fa_options *out)
{
    fa_options_init(out, sizeof *out);
    if (!in) return FA_OK;
    static const size_t known[] = {FA_OPTIONS_MIN_SIZE,     FA_OPTIONS_CONTEXT_SIZE, FA_OPTIONS_ALIGN_SIZE,
                                   FA_OPTIONS_ALIGN_PADDED_SIZE, FA_OPTIONS_VARLEN_SIZE, FA_OPTIONS_KVCACHE_SIZE,
                                   FA_OPTIONS_SPLITS_SIZE,   sizeof(fa_options)};
    fa_status st = fa_struct_size_check(in, sizeof *out, known, (int)(sizeof known / sizeof known[0]),
                                        "fa_options", "fa_options_default");
    if (st != FA_OK) return st;
    const size_t n = in->struct_size < sizeof *out ? in->struct_size : sizeof *out;
    memcpy(out, in, n);
    out->struct_size = sizeof *out;
    return FA_OK;
}

/* ------------------------------------------------------------------------ */
/* Tensors                                                                   */
/* ------------------------------------------------------------------------ */

/* dtype, rank, shape >= 0, strides >= 0, element count and the largest
 * reachable offset within int64 (also in bytes), data pointer. */
static fa_status check_tensor(const fa_tensor *t, const char *name, int rank)
{
    if (!t) return fa_fail(FA_ERR_NULL_ARG, "%s: tensor is NULL", name);
    if (fa_dtype_size(t->dtype) == 0)
        return fa_fail(FA_ERR_DTYPE, "%s: invalid dtype %d", name, (int)t->dtype);
    if (t->rank != rank)
        return fa_fail(FA_ERR_SHAPE, "%s: expected rank %d, got rank %d", name, rank, t->rank);
    int64_t n = 1;
    int empty = 0; /* any zero extent: no element, whatever the other extents */
    for (int r = 0; r < rank; r++)
        if (t->shape[r] == 0) empty = 1;
    for (int r = 0; r < rank; r++) {
        if (t->shape[r] < 0)
            return fa_fail(FA_ERR_SHAPE, "%s: dimension %d is negative (%lld)", name, r, DIM(t->shape[r]));
        if (t->stride[r] < 0)
            return fa_fail(FA_ERR_STRIDE, "%s: stride %d is negative (%lld)", name, r, DIM(t->stride[r]));
        if (!empty && n > INT64_MAX / t->shape[r])
            return fa_fail(FA_ERR_SHAPE, "%s: element count overflows 64 bits", name);
        if (!empty) n *= t->shape[r];
    }
    if (empty) n = 0;
    if (!empty) {
        /* the last element's offset, sum (shape - 1) * stride, in elements and in bytes */
        const int64_t esz = (int64_t)fa_dtype_size(t->dtype);
        int64_t last = 0;
        for (int r = 0; r < rank; r++) {
            const int64_t ext = t->shape[r] - 1;
            if (ext > 0 && t->stride[r] > (INT64_MAX / esz - last) / ext)
                return fa_fail(FA_ERR_STRIDE,
                               "%s: the largest offset (dimension %d, stride %lld) overflows the address space",
                               name, r, DIM(t->stride[r]));
            last += ext * t->stride[r];
        }
    }
    if (n > 0 && !t->data) return fa_fail(FA_ERR_NULL_ARG, "%s: data pointer is NULL", name);
    return FA_OK;
}

fa_status fa_check_tensor4(const fa_tensor *t, const char *name, const int64_t *shape,
                           const char *shape_desc)
{
    if (t && t->rank == 4 && shape) {
        for (int r = 0; r < 4; r++)
            if (t->shape[r] != shape[r])
                return fa_fail(FA_ERR_SHAPE, "%s: shape [%lld,%lld,%lld,%lld] should be [%lld,%lld,%lld,%lld] (%s)",
                               name, DIM(t->shape[0]), DIM(t->shape[1]), DIM(t->shape[2]), DIM(t->shape[3]),
                               DIM(shape[0]), DIM(shape[1]), DIM(shape[2]), DIM(shape[3]), shape_desc);
    }
    return check_tensor(t, name, 4);
}

/* Byte range [*lo, *hi) a (checked, non-empty) tensor can touch. */
static int byte_range(const fa_tensor *t, uintptr_t *lo, uintptr_t *hi)
{
    if (!t || !t->data || fa_tensor_numel(t) == 0) return 0;
    const uint64_t esz = fa_dtype_size(t->dtype);
    uint64_t last = 0;
    for (int r = 0; r < t->rank; r++) last += (uint64_t)(t->shape[r] - 1) * (uint64_t)t->stride[r];
    *lo = (uintptr_t)t->data;
    *hi = *lo + (uintptr_t)((last + 1) * esz);
    return 1;
}

fa_status fa_check_output(const fa_tensor *out, const char *name, const fa_tensor *const *others,
                          const char *const *other_names, int n_others)
{
    if (!out || fa_tensor_numel(out) == 0) return FA_OK;
    for (int r = 0; r < out->rank; r++)
        if (out->shape[r] > 1 && out->stride[r] == 0)
            return fa_fail(FA_ERR_STRIDE,
                           "%s: stride %d is 0 on a dimension of extent %lld; an output needs one "
                           "element per index", name, r, DIM(out->shape[r]));
    /* Distinct indices must reach distinct elements, or several rows (and
     * threads) write one element: with the dimensions of extent > 1 sorted by
     * stride, each stride must exceed the furthest offset the smaller ones
     * reach. (Sufficient, and necessary for strides that nest; a layout that
     * interleaves two dimensions without collisions is refused too.) */
    int dims[FA_MAX_RANK], nd = 0;
    for (int r = 0; r < out->rank; r++)
        if (out->shape[r] > 1) {
            int x = nd++;
            while (x > 0 && out->stride[dims[x - 1]] > out->stride[r]) { dims[x] = dims[x - 1]; x--; }
            dims[x] = r;
        }
    int64_t reach = 0; /* fits: check_tensor bounded the largest offset */
    for (int x = 0; x < nd; x++) {
        const int r = dims[x];
        if (out->stride[r] <= reach)
            return fa_fail(FA_ERR_STRIDE,
                           "%s: stride %d (%lld) overlaps the smaller dimensions, which reach offset %lld; "
                           "an output needs one element per index",
                           name, r, DIM(out->stride[r]), DIM(reach));
        reach += (out->shape[r] - 1) * out->stride[r];
    }
    uintptr_t a0, a1, b0, b1;
    byte_range(out, &a0, &a1);
    for (int x = 0; x < n_others; x++) {
        if (!others[x] || !byte_range(others[x], &b0, &b1)) continue;
        if (a0 < b1 && b0 < a1)
            return fa_fail(FA_ERR_STRIDE, "%s: overlaps %s in memory; outputs must not share storage "
                           "with the inputs or with each other", name, other_names[x]);
    }
    return FA_OK;
}

/* ------------------------------------------------------------------------ */
/* The resolver                                                              */
/* ------------------------------------------------------------------------ */

/* The derived square block B for head dims d and dv from the L2 rule (see
 * fa_block_sizes in flashattn.h), Br rounded down to `row_block`. */
static void block_rule(int64_t d, int64_t dv, int row_block, int *br, int *bc)
{
    /*
     * The rule. The paper (GPU) takes Bc = M / 4d and Br = min(Bc, d) for an
     * SRAM of M words. On a CPU the fast tier is the per-core L2 (M = L2 /
     * 4 floats), which is large next to d, and what one task keeps hot is
     *     Q_i [Br][d] + K_j^T [d][Bc] + V_j [Bc][dv] + S [Br][Bc] + O_i [Br][dv]
     * floats. Every K/V tile is re-read Sq/Br times, so Br should be as large
     * as the cache allows, not capped at d. We take square blocks B = Br = Bc,
     * the largest multiple of 16 with
     *     B^2 + B (d + dv) + B (d + dv)  <=  (3/4) M
     * (3/4 leaves room for the next tile and the stack), clamped to
     * [16, FA_BLOCK_RULE_MAX = 256], then Br rounded down to the kernel's
     * register-block rows. Measured on a 1 MiB-L2 Zen 5 core at d = 128
     * (docs/performance.md): B = 256 runs ~15% faster than the paper's
     * (Br, Bc) = (128, 512); on a 2 MiB-L2 Xeon, 256 beat the uncapped 416.
     */
    size_t l1, l2, l3, line;
    int src;
    fa_detect_caches(&l1, &l2, &l3, &line, &src);
    const int64_t m_words = (int64_t)(l2 / sizeof(float));
    const int64_t budget = m_words / 4 * 3;
    const int64_t dsum = d + dv; /* d, dv <= FA_HEAD_DIM_MAX: no overflow below */
    int64_t blk = 16;
    while (blk + 16 <= FA_BLOCK_RULE_MAX && (blk + 16) * (blk + 16) + 2 * (blk + 16) * dsum <= budget) blk += 16;
    int64_t b_r = blk;
    int rb = row_block > 0 ? row_block : 1;
    if (b_r >= rb) b_r -= b_r % rb;
    *br = (int)b_r;
    *bc = (int)blk;
}

fa_status fa_resolve_blocks(int64_t d, int64_t dv, const fa_options *opt, const fa_kernels *kern, int *br,
                            int *bc, int *pinned_q, int *pinned_k)
{
    if (opt->block_q < 0 || opt->block_q > FA_BLOCK_MAX)
        return fa_fail(FA_ERR_OPTION, "block_q %d is outside 0..%d", opt->block_q, FA_BLOCK_MAX);
    if (opt->block_k < 0 || opt->block_k > FA_BLOCK_MAX)
        return fa_fail(FA_ERR_OPTION, "block_k %d is outside 0..%d", opt->block_k, FA_BLOCK_MAX);
    fa_status st;
    const fa_env *env = fa_env_get(&st);
    if (!env) return st;
    *pinned_q = *pinned_k = 0;
    block_rule(d, dv, kern->row_block, br, bc);
    /* FA_BLOCK_Q/K stand in for the L2 rule (what `info` prints to reproduce a machine's bits),
     * so the passes that derive their own blocks from the rule's — the backward's cap at
     * FA_BWD_BLOCK_MAX, decoding's key block, the even split of seqlen_q — still derive them;
     * opt->block_q/k (--block-q/-k) fix every pass's blocks as given */
    if (env->block_q) *br = env->block_q;
    if (env->block_k) *bc = env->block_k;
    if (opt->block_q) { *br = opt->block_q; *pinned_q = 1; }
    if (opt->block_k) { *bc = opt->block_k; *pinned_k = 1; }
    return FA_OK;
}

int fa_tile_cut_test = -1;
int fa_strip_test = -1;
int fa_task_chunk_test = -1;
int fa_tail_split_test = -1;
_Atomic long fa_tile_cut_stats[3];
int fa_bwd_one_pass_test = -1;
int fa_amx_test = -1;
int fa_decode_touch_test = -1;
_Atomic long fa_count_addr_blocks, fa_count_touched, fa_count_asked, fa_count_ask_bad;
int fa_count_test;
_Atomic long fa_count_rows, fa_count_packed, fa_count_overlap_units;

static const char *nm(const char *name, const char *fallback) { return name && *name ? name : fallback; }

/* ------------------------------------------------------------------------ */
/* Varlen                                                                    */
/* ------------------------------------------------------------------------ */

void fa_varlen_init(fa_varlen *vl, size_t struct_size)
{
    if (!vl) return;
    memset(vl, 0, struct_size);
    fa_varlen v;
    memset(&v, 0, sizeof v);
    v.struct_size = struct_size;
    memcpy(vl, &v, struct_size < sizeof v ? struct_size : sizeof v);
}

fa_varlen fa_varlen_default(void)
{
    fa_varlen v;
    fa_varlen_init(&v, sizeof v);
    return v;
}

/* The rank-4 view [1][t0][t1][t2] of a rank-3 tensor (the varlen layouts). */
static fa_tensor batch1_view(const fa_tensor *t)
{
    fa_tensor v = *t;
    v.rank = 4;
    for (int r = 3; r >= 1; r--) {
        v.shape[r] = t->shape[r - 1];
        v.stride[r] = t->stride[r - 1];
    }
    v.shape[0] = 1;
    v.stride[0] = 0;
    return v;
}

/* The rank-3 view [1][heads][total_q] of a varlen LSE [heads][total_q]. */
static fa_tensor lse_view(const fa_tensor *t)
{
    fa_tensor v = *t;
    v.rank = 3;
    v.shape[2] = t->shape[1];
    v.stride[2] = t->stride[1];
    v.shape[1] = t->shape[0];
    v.stride[1] = t->stride[0];
    v.shape[0] = 1;
    v.stride[0] = 0;
    v.shape[3] = v.stride[3] = 0;
    return v;
}

/* "name: " when the caller named the array (e.g. its file), else "". */
#define VL_WHO(n) (n) ? (n) : "", (n) ? ": " : ""

/* One prefix-sum array: [batch + 1], from 0, never decreasing, never past `total`. */
static fa_status check_cu_seqlens(const int32_t *cu, int64_t batch, int64_t total, const char *arr,
                                  const char *fname, const char *tname, int64_t *max_len)
{
    if (!cu) return fa_fail(FA_ERR_NULL_ARG, "varlen: %s is NULL", arr);
    *max_len = 0;
    if (cu[0] != 0)
        return fa_fail(FA_ERR_INDEX, "%s%s%s[0] = %d: the prefix sums must start at 0", VL_WHO(fname), arr, cu[0]);
    for (int64_t b = 1; b <= batch; b++) {
        if (cu[b] < cu[b - 1])
            return fa_fail(FA_ERR_INDEX, "%s%s%s[%lld] = %d is less than %s[%lld] = %d: the prefix sums must not "
                           "decrease", VL_WHO(fname), arr, DIM(b), cu[b], arr, DIM(b - 1), cu[b - 1]);
        if (cu[b] > total)
            return fa_fail(FA_ERR_INDEX, "%s%s%s[%lld] = %d is past the end of %s (%lld rows)", VL_WHO(fname), arr,
                           DIM(b), cu[b], tname, DIM(total));
        if (cu[b] - cu[b - 1] > *max_len) *max_len = cu[b] - cu[b - 1];
    }
    return FA_OK;
}

/*
 * Varlen arguments: check the packed rank-3 (rank-2 LSE) tensors' ranks and
 * the shapes that depend on them, then replace them by rank-4 (rank-3) views
 * [1][total][heads][width] so that the checks that follow, and the
 * implementations, see one tensor batch.
 */
static fa_status varlen_views(const fa_varlen *vl, const char *qn, const char *kn, const char *vn,
                              const char *on, const char *ln, const fa_tensor **q, const fa_tensor **k,
                              const fa_tensor **v, const fa_tensor **o, const fa_tensor **lse,
                              fa_tensor views[5])
{
    static const size_t known[] = {sizeof(fa_varlen)};
    fa_status st = fa_struct_size_check(vl, sizeof *vl, known, 1, "fa_varlen", "fa_varlen_init");
    if (st != FA_OK) return st;
    if ((st = check_tensor(*q, qn, 3)) != FA_OK) return st;
    if ((st = check_tensor(*k, kn, 3)) != FA_OK) return st;
    if ((st = check_tensor(*v, vn, 3)) != FA_OK) return st;
    const fa_tensor *Q = *q, *V = *v;
    if (*o) {
        const fa_tensor *O = *o;
        if (O->rank == 3 && (O->shape[0] != Q->shape[0] || O->shape[1] != Q->shape[1] || O->shape[2] != V->shape[2]))
            return fa_fail(FA_ERR_SHAPE, "%s: shape [%lld,%lld,%lld] should be [%lld,%lld,%lld] "
                           "(varlen: [total_q, heads, d_v]: total_q and heads of %s, d_v of %s)",
                           on, DIM(O->shape[0]), DIM(O->shape[1]), DIM(O->shape[2]),
                           DIM(Q->shape[0]), DIM(Q->shape[1]), DIM(V->shape[2]), qn, vn);
        if ((st = check_tensor(O, on, 3)) != FA_OK) return st;
        views[3] = batch1_view(O);
        *o = &views[3];
    }
    if (*lse) {
        const fa_tensor *L = *lse;
        if ((st = check_tensor(L, ln, 2)) != FA_OK) return st;
        if (L->shape[0] != Q->shape[1] || L->shape[1] != Q->shape[0])
            return fa_fail(FA_ERR_SHAPE, "%s: shape [%lld,%lld] should be [heads=%lld, total_q=%lld] (varlen)",
                           ln, DIM(L->shape[0]), DIM(L->shape[1]), DIM(Q->shape[1]), DIM(Q->shape[0]));
        views[4] = lse_view(L);
        *lse = &views[4];
    }
    views[0] = batch1_view(*q);
    views[1] = batch1_view(*k);
    views[2] = batch1_view(*v);
    *q = &views[0];
    *k = &views[1];
    *v = &views[2];
    return FA_OK;
}

/* The sequences of a varlen batch, checked against the packed tensors
 * (p->seqlen_q/k still hold total_q/k): fills p's geometry and maxima. */
static fa_status varlen_geometry(const fa_varlen *vl, fa_problem *p)
{
    if (vl->batch < 0 || vl->batch > INT32_MAX)
        return fa_fail(FA_ERR_OPTION, "varlen: batch must be in 0..%d (got %lld)", INT32_MAX, DIM(vl->batch));
    int64_t max_q, max_k;
    fa_status st;
    if ((st = check_cu_seqlens(vl->cu_seqlens_q, vl->batch, p->seqlen_q, "cu_seqlens_q", vl->cu_seqlens_q_name,
                               "q (total_q)", &max_q)) != FA_OK)
        return st;
    if ((st = check_cu_seqlens(vl->cu_seqlens_k, vl->batch, p->seqlen_k, "cu_seqlens_k", vl->cu_seqlens_k_name,
                               "k (total_k)", &max_k)) != FA_OK)
        return st;
    if (vl->seqused_k) {
        max_k = 0;
        for (int64_t b = 0; b < vl->batch; b++) {
            const int64_t n = (int64_t)vl->cu_seqlens_k[b + 1] - vl->cu_seqlens_k[b];
            const int32_t u = vl->seqused_k[b];
            if (u < 0 || u > n)
                return fa_fail(FA_ERR_INDEX, "%s%sseqused_k[%lld] = %d is outside 0..%lld, the keys of sequence %lld "
                               "(cu_seqlens_k[%lld] - cu_seqlens_k[%lld])", VL_WHO(vl->seqused_k_name), DIM(b), u,
                               DIM(n), DIM(b), DIM(b + 1), DIM(b));
            if (u > max_k) max_k = u;
        }
    }
    /* Implementations size and index per (sequence, head, row of the longest
     * sequence): batch x heads x max_len x (d + dv) must fit in 64 bits, as it
     * does for a uniform batch, whose tensors hold that many elements. */
    const int64_t heads = p->heads > p->heads_k ? p->heads : p->heads_k;
    const int64_t max_len = max_q > max_k ? max_q : max_k;
    if (vl->batch > 0 && max_len > 0 &&
        (heads > INT64_MAX / vl->batch || max_len > INT64_MAX / (vl->batch * heads) ||
         p->d + p->dv > INT64_MAX / (vl->batch * heads * max_len)))
        return fa_fail(FA_ERR_SHAPE, "varlen: batch %lld x heads %lld x the longest sequence %lld x (d + d_v) %lld "
                       "overflows 64 bits", DIM(vl->batch), DIM(heads), DIM(max_len), DIM(p->d + p->dv));
    p->batch = vl->batch;
    p->seqlen_q = max_q;
    p->seqlen_k = max_k;
    p->cu_seqlens_q = vl->cu_seqlens_q;
    p->cu_seqlens_k = vl->cu_seqlens_k;
    p->seqused_k = vl->seqused_k;
    return FA_OK;
}

/* ------------------------------------------------------------------------ */
/* KV cache                                                                  */
/* ------------------------------------------------------------------------ */

void fa_kvcache_init(fa_kvcache *kv, size_t struct_size)
{
    if (!kv) return;
    memset(kv, 0, struct_size);
    fa_kvcache c;
    memset(&c, 0, sizeof c);
    c.struct_size = struct_size;
    memcpy(kv, &c, struct_size < sizeof c ? struct_size : sizeof c);
}

fa_kvcache fa_kvcache_default(void)
{
    fa_kvcache c;
    fa_kvcache_init(&c, sizeof c);
    return c;
}

/* An appended cache row: its physical row (cache_row), sequence and row in the sequence. */
typedef struct append_row {
    int64_t phys, b, r;
} append_row;

/* By physical row, then sequence, then row (a total order: qsort's result is unique). */
static int append_row_cmp(const void *x, const void *y)
{
    const append_row *a = x, *b = y;
    if (a->phys != b->phys) return a->phys < b->phys ? -1 : 1;
    if (a->b != b->b) return a->b < b->b ? -1 : 1;
    return (a->r > b->r) - (a->r < b->r);
}

/* The first of the n rows sorted by append_row_cmp whose phys is >= phys (NULL: none). */
static const append_row *append_lower_bound(const append_row *a, size_t n, int64_t phys)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        const size_t mid = lo + (hi - lo) / 2;
        if (a[mid].phys < phys) lo = mid + 1;
        else hi = mid;
    }
    return lo < n ? &a[lo] : NULL;
}

/* The row of all the caches' rows (page * page_size + row, or cache * seqlen_cache + row) that
 * holds sequence b's logical key row r. */
static int64_t cache_row(const fa_kvcache *kv, int64_t rows, int64_t b, int64_t r)
{
    if (kv->block_table) return (int64_t)kv->block_table[b * kv->max_pages + r / rows] * rows + r % rows;
    return (kv->cache_batch_idx ? kv->cache_batch_idx[b] : b) * rows + r;
}

/*
 * The KV cache's arguments, checked against the caches k, v (p holds q's
 * geometry and p->seqlen_k = the caches' row count): fills p's cache
 * geometry (fa_problem_seq reads it) and the longest key count.
 */
static fa_status kvcache_geometry(const fa_kvcache *kv_in, const fa_tensor *k, const fa_tensor *v, const char *kn,
                                  const char *vn, fa_problem *p)
{
    /* the layout before k_new_name / v_new_name (0.5) is read into a full one, those at NULL */
    static const size_t known[] = {sizeof(fa_kvcache), offsetof(fa_kvcache, k_new_name)};
    fa_status st = fa_struct_size_check(kv_in, sizeof *kv_in, known, 2, "fa_kvcache", "fa_kvcache_init");
    if (st != FA_OK) return st;
    fa_kvcache kl;
    fa_kvcache_init(&kl, sizeof kl);
    memcpy(&kl, kv_in, kv_in->struct_size < sizeof kl ? kv_in->struct_size : sizeof kl);
    const fa_kvcache *kv = &kl;
    const char *knn = kv->k_new_name ? kv->k_new_name : "k_new", *vnn = kv->v_new_name ? kv->v_new_name : "v_new";
    const int64_t B = p->batch, rows = k->shape[1]; /* rows of a cache, or of a page */
    if (!kv->cache_seqlens) return fa_fail(FA_ERR_NULL_ARG, "kvcache: cache_seqlens is NULL");
    if (kv->block_table && (kv->cache_batch_idx || kv->cache_leftpad)) {
        const char *other = kv->cache_batch_idx ? "cache_batch_idx" : "cache_leftpad";
        const char *oname = kv->cache_batch_idx ? kv->cache_batch_idx_name : kv->cache_leftpad_name;
        return fa_fail(FA_ERR_OPTION, "kvcache: block_table%s%s%s (paged) cannot be combined with %s%s%s%s",
                       kv->block_table_name ? " (" : "", kv->block_table_name ? kv->block_table_name : "",
                       kv->block_table_name ? ")" : "", other, oname ? " (" : "", oname ? oname : "", oname ? ")" : "");
    }
    if (kv->block_table && (kv->max_pages < 1 || kv->max_pages > INT32_MAX))
        return fa_fail(FA_ERR_OPTION, "kvcache: max_pages must be in 1..%d with a block_table (got %lld)", INT32_MAX,
                       DIM(kv->max_pages));
    if (kv->block_table && rows < 1)
        return fa_fail(FA_ERR_SHAPE, "%s: pages of %lld rows: page_size must be >= 1", kn, DIM(rows));
    int64_t sn = 0;
    if (!kv->k_new != !kv->v_new)
        return fa_fail(FA_ERR_NULL_ARG, "kvcache: k_new and v_new go together (%s is NULL)", kv->k_new ? "v_new" : "k_new");
    if (kv->k_new) {
        const fa_tensor *kw = kv->k_new, *vw = kv->v_new;
        const int64_t ks[4] = {B, kw->rank == 4 ? kw->shape[1] : 0, p->heads_k, p->d};
        if ((st = fa_check_tensor4(kw, knn, ks, "[batch, seqlen_new, heads_k, d]")) != FA_OK) return st;
        sn = kw->shape[1];
        const int64_t vs[4] = {B, sn, p->heads_k, p->dv};
        if ((st = fa_check_tensor4(vw, vnn, vs, "[batch, seqlen_new of k_new, heads_k, d_v]")) != FA_OK) return st;
        if (kw->dtype != k->dtype || vw->dtype != v->dtype)
            return fa_fail(FA_ERR_DTYPE, "%s: k_new/v_new must have the caches' dtypes (%s %s, caches %s %s)",
                           kw->dtype != k->dtype ? knn : vnn, fa_dtype_name(kw->dtype), fa_dtype_name(vw->dtype),
                           fa_dtype_name(k->dtype), fa_dtype_name(v->dtype));
    }
    const int64_t capacity = kv->block_table ? kv->max_pages * rows : rows;
    const int64_t pages = k->shape[0];
    if (!kv->block_table && !kv->cache_batch_idx && pages < B)
        return fa_fail(FA_ERR_SHAPE, "%s: the cache holds %lld sequences, q has batch %lld (give cache_batch_idx)",
                       kn, DIM(pages), DIM(B));
    int64_t max_k = 0;
    for (int64_t b = 0; b < B; b++) {
        const int64_t n = kv->cache_seqlens[b];
        const int64_t pad = kv->cache_leftpad ? kv->cache_leftpad[b] : 0;
        if (n < 0)
            return fa_fail(FA_ERR_INDEX, "%s%scache_seqlens[%lld] = %lld is negative", VL_WHO(kv->cache_seqlens_name),
                           DIM(b), DIM(n));
        if (n + sn > capacity)
            return fa_fail(FA_ERR_INDEX, "%s%scache_seqlens[%lld] + seqlen_new = %lld + %lld is past the cache (%s %lld rows)",
                           VL_WHO(kv->cache_seqlens_name), DIM(b), DIM(n), DIM(sn),
                           kv->block_table ? "max_pages * page_size =" : "seqlen_cache =", DIM(capacity));
        if (pad < 0 || pad > n)
            return fa_fail(FA_ERR_INDEX, "%s%scache_leftpad[%lld] = %lld is outside 0..cache_seqlens[%lld] = %lld",
                           VL_WHO(kv->cache_leftpad_name), DIM(b), DIM(pad), DIM(b), DIM(n));
        if (kv->cache_batch_idx && (kv->cache_batch_idx[b] < 0 || kv->cache_batch_idx[b] >= pages))
            return fa_fail(FA_ERR_INDEX, "%s%scache_batch_idx[%lld] = %d is outside 0..%lld (the caches' batch)",
                           VL_WHO(kv->cache_batch_idx_name), DIM(b), kv->cache_batch_idx[b], DIM(pages - 1));
        if (kv->block_table) {
            const int64_t used = (n + sn + rows - 1) / rows; /* pages holding rows 0 .. n + sn - 1 */
            for (int64_t x = 0; x < used; x++) {
                const int32_t pg = kv->block_table[b * kv->max_pages + x];
                if (pg < 0 || pg >= pages)
                    return fa_fail(FA_ERR_INDEX, "%s%sblock_table[%lld][%lld] = %d is outside the pages 0..%lld",
                                   VL_WHO(kv->block_table_name), DIM(b), DIM(x), pg, DIM(pages - 1));
            }
        }
        if (n - pad + sn > max_k) max_k = n - pad + sn;
    }
    /* Without block_table or cache_batch_idx sequence b appends to and reads cache b alone,
     * its appended rows after the ones it reads: nothing to check. */
    if (sn > 0 && (kv->block_table || kv->cache_batch_idx)) {
        /* the append writes each cache row once: no two sequences may write one row. The
         * appended rows (B x seqlen_new of them, not the whole cache or page pool) sorted by
         * physical row; a group of equal rows is a conflict, and the one reported is the
         * first the append would meet (sequence, then row, ascending) */
        const size_t na = fa_mul_sat((size_t)B, (size_t)sn);
        append_row *ap = fa_malloc(fa_mul_sat(na > 0 ? na : 1, sizeof *ap));
        if (!ap) return fa_fail(FA_ERR_NOMEM, "kvcache: out of memory");
        size_t x = 0;
        for (int64_t b = 0; b < B; b++)
            for (int64_t r = kv->cache_seqlens[b]; r < kv->cache_seqlens[b] + sn; r++, x++) {
                ap[x].phys = cache_row(kv, rows, b, r);
                ap[x].b = b;
                ap[x].r = r;
            }
        qsort(ap, na, sizeof *ap, append_row_cmp);
        /* in a group of one row's writers (sorted by sequence, then row: the append's own
         * order) the first writes it and the second is a conflict; the conflict reported is
         * the one the append would meet first */
        const append_row *hit = NULL, *first = NULL;
        for (size_t g = 0; g < na;) {
            size_t e = g + 1;
            while (e < na && ap[e].phys == ap[g].phys) e++;
            if (e - g > 1 && (!hit || ap[g + 1].b < hit->b || (ap[g + 1].b == hit->b && ap[g + 1].r < hit->r))) {
                hit = &ap[g + 1];
                first = &ap[g];
            }
            g = e;
        }
        if (hit) {
            const char *nm = kv->block_table ? kv->block_table_name : kv->cache_batch_idx_name;
            st = fa_fail(FA_ERR_INDEX, "%s%ssequences %lld and %lld would both append into one cache row "
                         "(%s %lld, row %lld): check %s", nm ? nm : "kvcache", ": ",
                         DIM(first->b), DIM(hit->b), kv->block_table ? "page" : "cache", DIM(hit->phys / rows),
                         DIM(hit->phys % rows), kv->block_table ? "block_table" : "cache_batch_idx");
        }
        /* ... and none into a row that a sequence reads (its own included: a page listed twice):
         * the append happens before attention, so the reader would see the new key where its
         * cache row was (fa_check gives each sequence its old cache and its own new keys) */
        for (int64_t b = 0; b < B && st == FA_OK; b++) {
            const int64_t pad = kv->cache_leftpad ? kv->cache_leftpad[b] : 0;
            /* the rows it reads in runs of consecutive physical rows (a page, or its cache),
             * each looked up once: the first appended row at or after the run's start */
            for (int64_t r = pad; r < kv->cache_seqlens[b];) {
                const int64_t r1 = kv->block_table && (r / rows + 1) * rows < kv->cache_seqlens[b]
                                       ? (r / rows + 1) * rows : kv->cache_seqlens[b];
                const int64_t ph0 = cache_row(kv, rows, b, r);
                const append_row *w = append_lower_bound(ap, na, ph0);
                if (w && w->phys < ph0 + (r1 - r)) { /* w: the row's first writer */
                    const int64_t rr = r + (w->phys - ph0);
                    const char *nm = kv->block_table ? kv->block_table_name : kv->cache_batch_idx_name;
                    st = fa_fail(FA_ERR_INDEX, "%s: sequence %lld would append into the cache row that sequence %lld "
                                 "reads as its key %lld (%s %lld, row %lld): check %s", nm ? nm : "kvcache", DIM(w->b),
                                 DIM(b), DIM(rr - pad), kv->block_table ? "page" : "cache", DIM(w->phys / rows),
                                 DIM(w->phys % rows), kv->block_table ? "block_table" : "cache_batch_idx");
                    break;
                }
                r = r1;
            }
        }
        fa_free(ap);
        if (st != FA_OK) return st;
    }
    p->seqlen_k = max_k;
    p->cache_seqlens = kv->cache_seqlens;
    p->cache_batch_idx = kv->cache_batch_idx;
    p->cache_leftpad = kv->cache_leftpad;
    p->block_table = kv->block_table;
    p->max_pages = kv->block_table ? kv->max_pages : 0;
    p->page_size = kv->block_table ? rows : 0;
    p->seqlen_new = sn;
    if (kv->k_new) {
        p->k_new = *kv->k_new;
        p->v_new = *kv->v_new;
    }
    p->k_new_name = kv->k_new_name;
    p->v_new_name = kv->v_new_name;
    return FA_OK;
}

/* What kvcache_rows walks the appended cache rows for. */
enum kv_walk { KV_COUNT, KV_APPEND, KV_SAVE, KV_RESTORE };

/*
 * Walk the cache rows the append writes — per sequence b, kv head, K then V,
 * rows k_new_from .. + seqlen_new, element by element — and count their bytes
 * (KV_COUNT), write k_new/v_new into them (KV_APPEND), or copy them to buf
 * (KV_SAVE) or back from it (KV_RESTORE), buf packing the same elements in
 * that order. Returns the bytes walked.
 */
static size_t kvcache_rows(const fa_problem *p, enum kv_walk what, char *buf)
{
    size_t at = 0;
    for (int64_t b = 0; b < p->batch; b++) {
        const fa_seq s = fa_problem_seq(p, b);
        for (int64_t hk = 0; hk < p->heads_k; hk++)
            for (int vside = 0; vside < 2; vside++) {
                fa_rows dst = fa_rows_kv(p, &s, hk, vside);
                dst.tail = NULL; /* the cache itself */
                const fa_rows src = what == KV_APPEND ? fa_rows_at(vside ? &p->v_new : &p->k_new, b, 0, hk) : dst;
                for (int64_t t = 0; t < p->seqlen_new; t++) {
                    int64_t so = 0, dof;
                    const fa_tensor *dt = fa_rows_src(&dst, s.k_new_from + t, &dof);
                    const fa_tensor *st = what == KV_APPEND ? fa_rows_src(&src, t, &so) : dt;
                    const size_t esz = fa_dtype_size(dt->dtype);
                    if (what == KV_COUNT) {
                        at += (size_t)dst.width * esz;
                        continue;
                    }
                    for (int64_t c = 0; c < dst.width; c++, at += esz) { /* same dtype: copy the bits */
                        char *cell = (char *)dt->data + (size_t)(dof + c * dt->stride[3]) * esz;
                        if (what == KV_APPEND) memcpy(cell, (const char *)st->data + (size_t)(so + c * st->stride[3]) * esz, esz);
                        else if (what == KV_SAVE) memcpy(buf + at, cell, esz);
                        else memcpy(cell, buf + at, esz);
                    }
                }
            }
    }
    return at;
}

fa_status fa_kvcache_append(fa_problem *p, void **undo)
{
    if (undo) *undo = NULL;
    if (!p->cache_seqlens || !p->k_new.data) return FA_OK;
    const size_t bytes = undo ? kvcache_rows(p, KV_COUNT, NULL) : 0;
    if (bytes > 0) { /* the rows about to be overwritten, so that a later failure can put them back */
        char *save = fa_malloc(bytes);
        if (!save)
            return fa_fail(FA_ERR_NOMEM, "kvcache: could not allocate %zu bytes to keep the cache rows the append "
                           "overwrites (nothing appended)", bytes);
        kvcache_rows(p, KV_SAVE, save);
        *undo = save;
    }
    kvcache_rows(p, KV_APPEND, NULL);
    /* from now on the new keys are read where they were written */
    memset(&p->k_new, 0, sizeof p->k_new);
    memset(&p->v_new, 0, sizeof p->v_new);
    return FA_OK;
}

void fa_kvcache_restore(const fa_problem *p, void *undo)
{
    if (undo) kvcache_rows(p, KV_RESTORE, undo);
    fa_free(undo);
}

fa_status fa_check_rows_tensor(const fa_problem *p, const fa_tensor *t, const char *name, int kside,
                               int64_t width, const char *desc, fa_tensor *view)
{
    const fa_tensor *like = kside ? &p->k : &p->q; /* the resolved rank-4 (view of the) input */
    if (!p->cu_seqlens_q) {
        const int64_t shape[4] = {like->shape[0], like->shape[1], like->shape[2], width};
        fa_status st = fa_check_tensor4(t, name, shape, desc);
        if (st == FA_OK) *view = *t;
        return st;
    }
    if (t && t->rank == 3 && (t->shape[0] != like->shape[1] || t->shape[1] != like->shape[2] || t->shape[2] != width))
        return fa_fail(FA_ERR_SHAPE, "%s: shape [%lld,%lld,%lld] should be [%lld,%lld,%lld] (varlen: %s)", name,
                       DIM(t->shape[0]), DIM(t->shape[1]), DIM(t->shape[2]), DIM(like->shape[1]),
                       DIM(like->shape[2]), DIM(width), desc);
    fa_status st = check_tensor(t, name, 3);
    if (st != FA_OK) return st;
    *view = batch1_view(t);
    return FA_OK;
}

/* Mark the rows [S] of tensor batch 0 that some sequence owns (varlen). */
static unsigned char *owned_rows(const fa_problem *p, int kside, int64_t S)
{
    unsigned char *own = fa_calloc((size_t)(S > 0 ? S : 1));
    if (!own) return NULL;
    for (int64_t b = 0; b < p->batch; b++) {
        const fa_seq s = fa_problem_seq(p, b);
        const int64_t r0 = kside ? s.k_start : s.q_start, n = kside ? s.k_len : s.q_len;
        memset(own + r0, 1, (size_t)n);
    }
    return own;
}

fa_status fa_fill_unowned_rows(const fa_problem *p, const fa_tensor *t, int kside, double value)
{
    if (!p->cu_seqlens_q || !t || !t->data) return FA_OK;
    const int64_t S = t->shape[1];
    unsigned char *own = owned_rows(p, kside, S);
    if (!own) return fa_fail(FA_ERR_NOMEM, "varlen: out of memory");
    for (int64_t i = 0; i < S; i++)
        if (!own[i])
            for (int64_t h = 0; h < t->shape[2]; h++)
                for (int64_t c = 0; c < t->shape[3]; c++) fa_store_f64(t, fa_off4(t, 0, i, h, c), value);
    fa_free(own);
    return FA_OK;
}

fa_status fa_fill_unowned_lse(const fa_problem *p, const fa_tensor *lse, double value)
{
    if (!p->cu_seqlens_q || !lse || !lse->data) return FA_OK;
    const int64_t S = lse->shape[2];
    unsigned char *own = owned_rows(p, 0, S);
    if (!own) return fa_fail(FA_ERR_NOMEM, "varlen: out of memory");
    for (int64_t i = 0; i < S; i++)
        if (!own[i])
            for (int64_t h = 0; h < lse->shape[1]; h++)
                fa_store_f64(lse, h * lse->stride[1] + i * lse->stride[2], value);
    fa_free(own);
    return FA_OK;
}

/* Attention sinks (fa_options::sinks): float32/float64 [heads], finite, within
 * the float32 range (the LSE is stored as float32 by the CLI and flash). */
static fa_status resolve_sinks(const fa_tensor *t, fa_problem *p)
{
    if (t->dtype != FA_F32 && t->dtype != FA_F64)
        return fa_fail(FA_ERR_DTYPE, "sinks: dtype must be f32 or f64 (got %s)", fa_dtype_name(t->dtype));
    if (t->rank != 1 || t->shape[0] != p->heads)
        return fa_fail(FA_ERR_SHAPE, "sinks: shape must be [heads=%lld] (got rank %d, first extent %lld)",
                       DIM(p->heads), t->rank, DIM(t->rank >= 1 ? t->shape[0] : 0));
    if (t->stride[0] < 0) return fa_fail(FA_ERR_STRIDE, "sinks: negative stride");
    if (!t->data) return fa_fail(FA_ERR_NULL_ARG, "sinks: data pointer is NULL");
    for (int64_t h = 0; h < p->heads; h++) {
        const double x = fa_load_f64(t, h * t->stride[0]);
        if (!isfinite(x) || fabs(x) > FA_SCALE_MAX)
            return fa_fail(FA_ERR_NONFINITE, "sinks: element [%lld] is %.17g, %s; sinks must be finite and "
                           "within the float32 range (|sink| <= %.9g)", DIM(h), x,
                           isfinite(x) ? "outside the float32 range" : "not finite", FA_SCALE_MAX);
    }
    p->sinks = *t;
    return FA_OK;
}

void fa_dropout_init(fa_dropout *d, size_t struct_size)
{
    if (!d) return;
    memset(d, 0, struct_size);
    fa_dropout x;
    memset(&x, 0, sizeof x);
    x.struct_size = struct_size;
    memcpy(d, &x, struct_size < sizeof x ? struct_size : sizeof x);
}

fa_dropout fa_dropout_default(void)
{
    fa_dropout d;
    fa_dropout_init(&d, sizeof d);
    return d;
}

/* Dropout (fa_options::dropout): p in [0, 1), a 0/1 keep-mask of shape
 * [batch][heads][seqlen_q][seqlen_k] (varlen: the longest lengths), every
 * byte of it checked once here (input-sized work, no allocation). */
static fa_status resolve_dropout(const fa_dropout *in, fa_problem *p)
{
    static const size_t known[] = {sizeof(fa_dropout)};
    fa_status st = fa_struct_size_check(in, sizeof *in, known, 1, "fa_dropout", "fa_dropout_init");
    if (st != FA_OK) return st;
    fa_dropout d;
    fa_dropout_init(&d, sizeof d);
    memcpy(&d, in, in->struct_size < sizeof d ? in->struct_size : sizeof d);
    const char *mn = nm(d.keep_mask_name, "dropout keep_mask");
    if (p->cache_seqlens)
        return fa_fail(FA_ERR_OPTION, "dropout cannot be combined with a KV cache (an inference path, as in "
                       "FlashAttention's flash_attn_with_kvcache)");
    if (!(d.p >= 0.0 && d.p < 1.0))
        return fa_fail(FA_ERR_OPTION, "dropout p must be in [0, 1) (got %g)", d.p);
    if (!d.keep_mask) return fa_fail(FA_ERR_NULL_ARG, "%s: the keep-mask is NULL (dropout needs one)", mn);
    const int64_t want[4] = {p->batch, p->heads, p->seqlen_q, p->seqlen_k};
    for (int r = 0; r < 4; r++)
        if (d.keep_shape[r] != want[r])
            return fa_fail(FA_ERR_SHAPE, "%s: shape [%lld,%lld,%lld,%lld] should be [batch=%lld, heads=%lld, "
                           "seqlen_q=%lld, seqlen_k=%lld]%s", mn, DIM(d.keep_shape[0]), DIM(d.keep_shape[1]),
                           DIM(d.keep_shape[2]), DIM(d.keep_shape[3]), DIM(want[0]), DIM(want[1]), DIM(want[2]),
                           DIM(want[3]), p->cu_seqlens_q ? " (varlen: the longest sequence's lengths)" : "");
    int64_t stride[4];
    const int zero = !d.keep_stride[0] && !d.keep_stride[1] && !d.keep_stride[2] && !d.keep_stride[3];
    int64_t reach = 0;
    for (int r = 3; r >= 0; r--) {
        stride[r] = zero ? (r == 3 ? 1 : stride[r + 1] * (want[r + 1] > 0 ? want[r + 1] : 1)) : d.keep_stride[r];
        if (stride[r] < 0) return fa_fail(FA_ERR_STRIDE, "%s: negative stride", mn);
        int64_t t;
        if (want[r] > 0 && (__builtin_mul_overflow(want[r] - 1, stride[r], &t) ||
                            __builtin_add_overflow(reach, t, &reach)))
            return fa_fail(FA_ERR_STRIDE, "%s: the largest offset overflows 64 bits", mn);
    }
    for (int64_t b = 0; b < want[0]; b++)
        for (int64_t h = 0; h < want[1]; h++)
            for (int64_t i = 0; i < want[2]; i++) {
                const uint8_t *row = d.keep_mask + b * stride[0] + h * stride[1] + i * stride[2];
                for (int64_t j = 0; j < want[3]; j++)
                    if (row[j * stride[3]] > 1)
                        return fa_fail(FA_ERR_INDEX, "%s: element [%lld,%lld,%lld,%lld] is %u; a keep-mask holds "
                                       "0 (drop) or 1 (keep)", mn, DIM(b), DIM(h), DIM(i), DIM(j),
                                       (unsigned)row[j * stride[3]]);
            }
    p->keep = d.keep_mask;
    memcpy(p->keep_stride, stride, sizeof stride);
    p->keep_scale = 1.0 / (1.0 - d.p);
    return FA_OK;
}

void fa_rotary_init(fa_rotary *r, size_t struct_size)
{
    if (!r) return;
    memset(r, 0, struct_size);
    fa_rotary x;
    memset(&x, 0, sizeof x);
    x.struct_size = struct_size;
    memcpy(r, &x, struct_size < sizeof x ? struct_size : sizeof x);
}

fa_rotary fa_rotary_default(void)
{
    fa_rotary r;
    fa_rotary_init(&r, sizeof r);
    return r;
}

/* Rotary (fa_options::rotary): FlashAttention's flash_attn_with_kvcache rule, so a KV
 * cache with new keys is required; cos/sin [seqlen_ro][rotary_dim/2] f32/f64 finite,
 * rotary_dim <= d, seqlen_ro past the largest position. per_row: queries at their own
 * positions (causal or windowed). */
static fa_status resolve_rotary(const fa_rotary *in, int per_row, fa_problem *p)
{
    /* the layout before cos_name / sin_name (0.5) too: r below starts from the defaults */
    static const size_t known[] = {sizeof(fa_rotary), offsetof(fa_rotary, cos_name)};
    fa_status st = fa_struct_size_check(in, sizeof *in, known, 2, "fa_rotary", "fa_rotary_init");
    if (st != FA_OK) return st;
    fa_rotary r;
    fa_rotary_init(&r, sizeof r);
    memcpy(&r, in, in->struct_size < sizeof r ? in->struct_size : sizeof r);
    if (!p->cache_seqlens || !p->k_new.data)
        return fa_fail(FA_ERR_OPTION, "rotary needs a KV cache with new keys (fa_kvcache k_new/v_new), as "
                       "FlashAttention's flash_attn_with_kvcache: q and k_new are rotated at cache positions");
    if (!r.cos || !r.sin) return fa_fail(FA_ERR_NULL_ARG, "rotary: cos and sin are both required");
    const fa_tensor *t[2] = {r.cos, r.sin};
    const char *tn[2] = {r.cos_name ? r.cos_name : "rotary cos", r.sin_name ? r.sin_name : "rotary sin"};
    for (int x = 0; x < 2; x++) {
        if (t[x]->dtype != FA_F32 && t[x]->dtype != FA_F64)
            return fa_fail(FA_ERR_DTYPE, "%s: dtype must be f32 or f64 (got %s)", tn[x], fa_dtype_name(t[x]->dtype));
        if (t[x]->rank != 2)
            return fa_fail(FA_ERR_SHAPE, "%s: rank %d should be 2 [seqlen_ro, rotary_dim / 2]", tn[x], t[x]->rank);
        if (t[x]->stride[0] < 0 || t[x]->stride[1] < 0) return fa_fail(FA_ERR_STRIDE, "%s: negative stride", tn[x]);
        if (!t[x]->data) return fa_fail(FA_ERR_NULL_ARG, "%s: data pointer is NULL", tn[x]);
    }
    if (r.sin->shape[0] != r.cos->shape[0] || r.sin->shape[1] != r.cos->shape[1])
        return fa_fail(FA_ERR_SHAPE, "%s: shape [%lld,%lld] differs from %s [%lld,%lld]; rotary cos and sin must have "
                       "the same shape", tn[1], DIM(r.sin->shape[0]), DIM(r.sin->shape[1]), tn[0], DIM(r.cos->shape[0]),
                       DIM(r.cos->shape[1]));
    const int64_t rd = 2 * r.cos->shape[1], seqlen_ro = r.cos->shape[0];
    if (rd < 2 || rd > p->d)
        return fa_fail(FA_ERR_SHAPE, "%s: rotary_dim = 2 x %lld = %lld must be in 2..d = %lld (cos/sin are "
                       "[seqlen_ro, rotary_dim / 2])", tn[0], DIM(r.cos->shape[1]), DIM(rd), DIM(p->d));
    int64_t need = 0; /* the largest position + 1 */
    int64_t at = 0;
    for (int64_t b = 0; b < p->batch; b++) {
        const int64_t last = (int64_t)p->cache_seqlens[b] +
                             (p->seqlen_new > (per_row ? p->seqlen_q : 1) ? p->seqlen_new : (per_row ? p->seqlen_q : 1));
        if (last > need) { need = last; at = b; }
    }
    if (seqlen_ro < need)
        return fa_fail(FA_ERR_SHAPE, "%s: cos/sin have %lld positions, but sequence %lld needs position %lld "
                       "(cache_seqlens[%lld] = %d, seqlen_new %lld, seqlen_q %lld%s)", tn[0], DIM(seqlen_ro), DIM(at),
                       DIM(need - 1), DIM(at), p->cache_seqlens[at], DIM(p->seqlen_new), DIM(p->seqlen_q),
                       per_row ? ", queries at their own positions (causal or windowed)" : "");
    for (int x = 0; x < 2; x++)
        for (int64_t i = 0; i < seqlen_ro; i++)
            for (int64_t c = 0; c < rd / 2; c++)
                if (!isfinite(fa_load_f64(t[x], i * t[x]->stride[0] + c * t[x]->stride[1])))
                    return fa_fail(FA_ERR_NONFINITE, "%s: element [%lld,%lld] is not finite", tn[x], DIM(i), DIM(c));
    p->rot_cos = *r.cos;
    p->rot_sin = *r.sin;
    p->rot_dim = rd;
    p->rot_interleaved = r.interleaved != 0;
    p->rot_q_per_row = per_row;
    return FA_OK;
}

fa_status fa_resolve(fa_purpose purpose, const fa_tensor *q, const fa_tensor *k, const fa_tensor *v,
                     const fa_tensor *o, const fa_tensor *lse, const fa_options *opt_in,
                     const fa_names *names, fa_problem *p)
{
    const fa_names none = {NULL, NULL, NULL, NULL, NULL};
    if (!names) names = &none;
    const char *qn = nm(names->q, "q"), *kn = nm(names->k, "k"), *vn = nm(names->v, "v");
    const char *on = nm(names->o, "o"), *ln = nm(names->lse, "lse");
    fa_options opt;
    fa_status st = fa_options_read(opt_in, &opt);
    if (st != FA_OK) return st;
    if (opt.num_splits < 0)
        return fa_fail(FA_ERR_OPTION, "num_splits must be >= 0 (0 = heuristic, 1 = none; got %d)", opt.num_splits);
    fa_tensor views[5]; /* varlen: rank-4 views of q, k, v, o and the rank-3 view of lse */
    if (opt.varlen && (st = varlen_views(opt.varlen, qn, kn, vn, on, ln, &q, &k, &v, &o, &lse, views)) != FA_OK)
        return st;
    if ((st = check_tensor(q, qn, 4)) != FA_OK) return st;
    if ((st = check_tensor(k, kn, 4)) != FA_OK) return st;
    if ((st = check_tensor(v, vn, 4)) != FA_OK) return st;

    memset(p, 0, sizeof *p);
    p->batch = q->shape[0];
    p->seqlen_q = q->shape[1];
    p->heads = q->shape[2];
    p->d = q->shape[3];
    p->seqlen_k = k->shape[1];
    p->heads_k = k->shape[2];
    p->dv = v->shape[3];

    if (p->d < 1 || p->d > FA_HEAD_DIM_MAX)
        return fa_fail(FA_ERR_SHAPE, "%s: head dim d must be in 1..%d (got %lld)", qn, FA_HEAD_DIM_MAX, DIM(p->d));
    if (p->dv < 1 || p->dv > FA_HEAD_DIM_MAX)
        return fa_fail(FA_ERR_SHAPE, "%s: head dim d_v must be in 1..%d (got %lld)", vn, FA_HEAD_DIM_MAX, DIM(p->dv));
    if (p->heads < 1) return fa_fail(FA_ERR_SHAPE, "%s: heads must be >= 1 (got %lld)", qn, DIM(p->heads));
    if (p->heads_k < 1) return fa_fail(FA_ERR_SHAPE, "%s: heads_k must be >= 1 (got %lld)", kn, DIM(p->heads_k));
    if (k->shape[0] != p->batch && !opt.kvcache) /* (a cache has batch_cache rows, or pages) */
        return fa_fail(FA_ERR_SHAPE, "%s: batch %lld does not match %s batch %lld", kn, DIM(k->shape[0]), qn, DIM(p->batch));
    if (k->shape[3] != p->d)
        return fa_fail(FA_ERR_SHAPE, "%s: head dim %lld does not match %s head dim %lld", kn, DIM(k->shape[3]), qn, DIM(p->d));
    if (v->shape[0] != k->shape[0])
        return fa_fail(FA_ERR_SHAPE, "%s: batch %lld does not match %s batch %lld", vn, DIM(v->shape[0]), kn,
                       DIM(k->shape[0]));
    if (v->shape[1] != p->seqlen_k)
        return fa_fail(FA_ERR_SHAPE, "%s: seqlen %lld does not match %s seqlen %lld", vn, DIM(v->shape[1]), kn, DIM(p->seqlen_k));
    if (v->shape[2] != p->heads_k)
        return fa_fail(FA_ERR_SHAPE, "%s: heads %lld does not match %s heads %lld", vn, DIM(v->shape[2]), kn, DIM(p->heads_k));
    if (p->heads % p->heads_k != 0)
        return fa_fail(FA_ERR_HEADS, "%s: heads (%lld) is not a multiple of %s heads (%lld)", qn, DIM(p->heads), kn, DIM(p->heads_k));
    if (o) {
        const int64_t os[4] = {p->batch, p->seqlen_q, p->heads, p->dv};
        if (o->rank == 4 &&
            (o->shape[0] != os[0] || o->shape[1] != os[1] || o->shape[2] != os[2] || o->shape[3] != os[3]))
            return fa_fail(FA_ERR_SHAPE, "%s: shape [%lld,%lld,%lld,%lld] should be [%lld,%lld,%lld,%lld] "
                           "(batch and seqlen_q of %s, heads of %s, d_v of %s)",
                           on, DIM(o->shape[0]), DIM(o->shape[1]), DIM(o->shape[2]), DIM(o->shape[3]),
                           DIM(os[0]), DIM(os[1]), DIM(os[2]), DIM(os[3]), qn, qn, vn);
        if ((st = check_tensor(o, on, 4)) != FA_OK) return st;
    }
    if (lse) {
        if ((st = check_tensor(lse, ln, 3)) != FA_OK) return st;
        if (lse->dtype != FA_F32 && lse->dtype != FA_F64)
            return fa_fail(FA_ERR_DTYPE, "%s: dtype must be f32 or f64 (got %s)", ln, fa_dtype_name(lse->dtype));
        if (lse->shape[0] != p->batch || lse->shape[1] != p->heads || lse->shape[2] != p->seqlen_q)
            return fa_fail(FA_ERR_SHAPE, "%s: shape [%lld,%lld,%lld] should be [batch=%lld, heads=%lld, seqlen_q=%lld]",
                           ln, DIM(lse->shape[0]), DIM(lse->shape[1]), DIM(lse->shape[2]),
                           DIM(p->batch), DIM(p->heads), DIM(p->seqlen_q));
    }
    /* the sequences (p->batch, seqlen_q/k become the count and the longest) */
    if (opt.varlen && (st = varlen_geometry(opt.varlen, p)) != FA_OK) return st;
    if (opt.varlen && opt.kvcache)
        return fa_fail(FA_ERR_OPTION, "varlen and kvcache cannot be combined");
    if (opt.kvcache && (st = kvcache_geometry(opt.kvcache, k, v, kn, vn, p)) != FA_OK) return st;

    /* options */
    /* The ranges (docs/semantics.md): flash and standard compute in float32, so a
     * parameter whose float32 image is 0 or inf, or whose product overflows
     * float32, would give a silently wrong or non-finite result there. Every
     * path (the float64 reference and fa_check included) refuses them, so that
     * check and run agree on what is accepted. */
    if (!isfinite(opt.scale)) return fa_fail(FA_ERR_OPTION, "scale must be finite (got %g)", opt.scale);
    /* (A |scale| below FLT_MIN is carried as a float32 subnormal or 0: the score
     * error is then at most FLT_MAX * 2^-150 ~ 2.4e-7 absolute, and the softmax
     * is as right as float32 makes it; it is accepted.) */
    if (!(fabs(opt.scale) <= FA_SCALE_MAX))
        return fa_fail(FA_ERR_OPTION, "scale %g is outside the float32 range: |scale| must be <= %g",
                       opt.scale, FA_SCALE_MAX);
    p->scale = opt.scale != 0.0 ? opt.scale : 1.0 / sqrt((double)p->d);
    if (!isfinite(opt.softcap) || opt.softcap < 0.0)
        return fa_fail(FA_ERR_OPTION, "softcap must be >= 0 and finite (got %g)", opt.softcap);
    if (opt.softcap != 0.0 && !(opt.softcap >= FA_SOFTCAP_MIN && opt.softcap <= FA_SOFTCAP_MAX))
        return fa_fail(FA_ERR_OPTION, "softcap %g is outside the float32 range: it must be 0 (off) or in [%g, %g]",
                       opt.softcap, FA_SOFTCAP_MIN, FA_SOFTCAP_MAX);
    p->softcap = opt.softcap;
    if (opt.align != FA_ALIGN_BOTTOM_RIGHT && opt.align != FA_ALIGN_TOP_LEFT)
        return fa_fail(FA_ERR_OPTION, "align must be FA_ALIGN_BOTTOM_RIGHT (0) or FA_ALIGN_TOP_LEFT (1) (got %d)",
                       opt.align);
    p->top_left = opt.align == FA_ALIGN_TOP_LEFT;
    p->num_splits = opt.num_splits;
    p->progress = opt.progress;
    p->progress_arg = opt.progress_arg;
    p->window_left = opt.window_left < 0 ? -1 : opt.window_left;
    p->window_right = opt.window_right < 0 ? -1 : opt.window_right;
    if (opt.causal) p->window_right = 0;
    /* A window as wide as both sequences hides nothing: make it unbounded, so
     * the band arithmetic (i + Sk - Sq +- window) can never overflow. */
    if (p->window_left > p->seqlen_q + p->seqlen_k) p->window_left = -1;
    if (p->window_right > p->seqlen_q + p->seqlen_k) p->window_right = -1;

    if (opt.alibi_slopes) {
        const fa_tensor *a = opt.alibi_slopes;
        if (a->dtype != FA_F32 && a->dtype != FA_F64)
            return fa_fail(FA_ERR_ALIBI, "alibi slopes: dtype must be f32 or f64 (got %s)", fa_dtype_name(a->dtype));
        if (a->rank == 1) {
            if (a->shape[0] != p->heads)
                return fa_fail(FA_ERR_ALIBI, "alibi slopes: shape [%lld] should be [heads=%lld] or [batch, heads]",
                               DIM(a->shape[0]), DIM(p->heads));
        } else if (a->rank == 2) {
            if (a->shape[0] != p->batch || a->shape[1] != p->heads)
                return fa_fail(FA_ERR_ALIBI, "alibi slopes: shape [%lld,%lld] should be [batch=%lld, heads=%lld]",
                               DIM(a->shape[0]), DIM(a->shape[1]), DIM(p->batch), DIM(p->heads));
        } else {
            return fa_fail(FA_ERR_ALIBI, "alibi slopes: rank %d should be 1 [heads] or 2 [batch, heads]", a->rank);
        }
        for (int r = 0; r < a->rank; r++)
            if (a->stride[r] < 0) return fa_fail(FA_ERR_ALIBI, "alibi slopes: negative stride");
        if (!a->data) return fa_fail(FA_ERR_ALIBI, "alibi slopes: data pointer is NULL");
        p->alibi = *a;
        const int64_t max_dist = (p->seqlen_q > p->seqlen_k ? p->seqlen_q : p->seqlen_k) - 1;
        for (int64_t b = 0; b < (a->rank == 2 ? p->batch : 1); b++)
            for (int64_t h = 0; h < p->heads; h++)
            {
                const double slope = fa_alibi_slope(p, b, h);
                if (!isfinite(slope))
                    return fa_fail(FA_ERR_ALIBI, "alibi slopes: non-finite slope at head %lld", DIM(h));
                /* the largest bias is |slope| x the largest distance |i + Sk - Sq - j| */
                if (fabs(slope) * (double)max_dist > FA_ALIBI_BIAS_MAX)
                    return fa_fail(FA_ERR_ALIBI, "alibi slopes: slope %g at head %lld times the largest distance "
                                   "%lld exceeds %g (float32 range): |slope| must be <= %g here",
                                   slope, DIM(h), DIM(max_dist), FA_ALIBI_BIAS_MAX,
                                   FA_ALIBI_BIAS_MAX / (double)(max_dist > 0 ? max_dist : 1));
            }
    }

    if (opt.sinks && (st = resolve_sinks(opt.sinks, p)) != FA_OK) return st;
    if (opt.dropout && (st = resolve_dropout(opt.dropout, p)) != FA_OK) return st;
    if (opt.rotary) {
        /* FlashAttention's rule for the query positions: causal or local, where a window
         * side counts when it is below the cache's row capacity (wider ones it treats as
         * unbounded) */
        const int64_t cap = p->block_table ? p->max_pages * p->page_size : k->shape[1];
        const int per_row = opt.causal || (opt.window_left >= 0 && opt.window_left < cap) ||
                            (opt.window_right >= 0 && opt.window_right < cap);
        if ((st = resolve_rotary(opt.rotary, per_row, p)) != FA_OK) return st;
    }

    p->q = *q;
    p->k = *k;
    p->v = *v;
    if (o) p->o = *o;
    if (lse) p->lse = *lse;
    if (purpose == FA_PURPOSE_CHECK) { /* impl, threads, blocks: the checker's own */
        p->impl = FA_IMPL_REFERENCE;
        p->num_threads = fa_default_threads();
        return FA_OK;
    }

    if ((int)opt.impl < 0 || opt.impl >= FA_IMPL_COUNT)
        return fa_fail(FA_ERR_IMPL, "unknown implementation %d", (int)opt.impl);
    p->impl = opt.impl;
    p->context = opt.context;
    if (opt.num_threads < 0 || opt.num_threads > FA_MAX_THREADS)
        return fa_fail(FA_ERR_OPTION, "num_threads must be in [0, %d] (got %d)", FA_MAX_THREADS, opt.num_threads);
    const int ctx_threads = opt.context ? fa_context_threads_(opt.context) : 0;
    p->num_threads = opt.num_threads > 0 ? opt.num_threads : ctx_threads > 0 ? ctx_threads : fa_default_threads();
    p->standard_max_bytes = opt.standard_max_bytes ? opt.standard_max_bytes : FA_STANDARD_DEFAULT_MAX_BYTES;
    if (p->impl == FA_IMPL_STANDARD && (p->seqlen_k > INT_MAX || p->seqlen_q > INT_MAX))
        return fa_fail(FA_ERR_TOO_LARGE, "standard: seqlen_q %lld, seqlen_k %lld: above %d rows or keys "
                       "(its kernels index with int); use the flash path",
                       DIM(p->seqlen_q), DIM(p->seqlen_k), INT_MAX);

    /* the environment, the kernel table, blocks, packing cap */
    const fa_env *env = fa_env_get(&st);
    if (!env) return st;
    p->kern = opt.context ? fa_context_kernels_(opt.context) : fa_kernels_get(&st);
    if (!p->kern) return st;
    if ((st = fa_resolve_blocks(p->d, p->dv, &opt, p->kern, &p->block_q, &p->block_k, &p->blocks_pinned_q,
                                &p->blocks_pinned_k)) != FA_OK)
        return st;
    p->tile_cut = fa_tile_cut_test >= 0 ? fa_tile_cut_test : env->tile_cut != 0;
    p->strip_rows = fa_strip_test >= 0 ? fa_strip_test : env->strip_rows;
    p->task_chunk = fa_task_chunk_test >= 0 ? fa_task_chunk_test : env->task_chunk;
    p->tail_split = fa_tail_split_test >= 0 ? fa_tail_split_test
                    : env->tail_split >= 0  ? env->tail_split
                                            : FA_TAIL_SPLIT_DEFAULT;
    p->bwd_one_pass = fa_bwd_one_pass_test >= 0 ? fa_bwd_one_pass_test : env->bwd_one_pass;
    p->amx = fa_amx_test >= 0 ? fa_amx_test : env->amx == 1;
    p->decode_touch = fa_decode_touch_test >= 0 ? fa_decode_touch_test
                      : env->decode_touch >= 0  ? env->decode_touch
                                                : fa_cpu_is_amd();
    if (opt.pack_max_bytes >= 0) p->pack_max_bytes = (size_t)opt.pack_max_bytes;
    else p->pack_max_bytes = env->has_pack_max ? env->pack_max : FA_PACK_DEFAULT_MAX_BYTES;
    return FA_OK;
}
