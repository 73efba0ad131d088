/*
 * test_abi.c — the versioned structs and fa_context.
 *
 *   - A caller compiled against an older, smaller fa_options (the 0.3.0
 *     layout, before pack_max_bytes and context were appended) still works:
 *     the library reads only struct_size bytes, so whatever lies after the
 *     caller's struct is never read (here: bytes that would be a wild
 *     context pointer), and the result is bit-identical to the same options
 *     given in the current layout.
 *   - A zero struct_size (options not initialized by *_default()) is refused
 *     with a message saying how to initialize them, never read as garbage.
 *   - fa_check writes no further than the caller's report->struct_size.
 *   - *_init writes exactly struct_size bytes (zeroed, then the defaults that
 *     fit); a newer caller's larger struct is accepted when the fields this
 *     library does not know are zero and refused when one is set; a
 *     struct_size that is no published layout (a 0.2 caller's `double scale`)
 *     is refused; fa_check writes back struct_size = what it wrote.
 *   - fa_check_abi_size answers by name (fa_abi_struct), 0 when unknown.
 *   - fa_context: every ISA this CPU supports can be pinned; a second call
 *     with the same shapes allocates nothing (the arena is reused) and gives
 *     the same bits; an unknown ISA is FA_ERR_ISA.
 */
#include "test_util.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* fa_options as published in 0.3.0 before pack_max_bytes and context: a
 * prefix of today's struct, field for field. */
typedef struct options_v030 {
    size_t struct_size;
    double scale;
    int causal;
    int64_t window_left, window_right;
    double softcap;
    const fa_tensor *alibi_slopes;
    fa_impl impl;
    int num_threads;
    int block_q, block_k;
    size_t standard_max_bytes;
} options_v030;

/* fa_options as 0.3.0 shipped it (through context, before varlen was appended). */
typedef struct options_v030_final {
    options_v030 head;
    int64_t pack_max_bytes;
    fa_context *context;
} options_v030_final;

/* fa_options with align, before varlen was appended (its sizeof is padded past the int). */
typedef struct options_with_align {
    options_v030_final head;
    int align;
} options_with_align;

/* fa_options with align and varlen, before kvcache was appended. */
typedef struct options_with_varlen {
    options_v030_final head;
    int align;
    const fa_varlen *varlen;
} options_with_varlen;

/* fa_options as 0.4.0 shipped it (through kvcache, before sinks, rotary, dropout, num_splits). */
typedef struct options_v040 {
    options_with_varlen head;
    const fa_kvcache *kvcache;
} options_v040;

/* fa_options as 0.5.0 shipped it (through num_splits, before progress was appended). */
typedef struct options_v050 {
    options_v040 head;
    const fa_tensor *sinks;
    const struct fa_rotary *rotary;
    const struct fa_dropout *dropout;
    int num_splits;
} options_v050;

typedef struct small {
    tu_tensor q, k, v, o, lse;
} small;

static small make_small(uint64_t salt)
{
    small s;
    uint64_t rng = tu_seed() ^ salt;
    s.q = tu_alloc4(FA_F32, 2, 37, 4, 32, 0);
    s.k = tu_alloc4(FA_F32, 2, 53, 2, 32, 0);
    s.v = tu_alloc4(FA_F32, 2, 53, 2, 24, 0);
    s.o = tu_alloc4(FA_F32, 2, 37, 4, 24, 0);
    const int64_t ls[3] = {2, 4, 37};
    s.lse = tu_alloc(FA_F32, 3, ls);
    tu_fill(&s.q, &rng, -1, 1);
    tu_fill(&s.k, &rng, -1, 1);
    tu_fill(&s.v, &rng, -1, 1);
    tu_poison(&s.o);
    tu_poison(&s.lse);
    return s;
}

static void free_small(small *s)
{
    tu_free(&s->q); tu_free(&s->k); tu_free(&s->v); tu_free(&s->o); tu_free(&s->lse);
}

/* Ensure the older options layout is a prefix of the current one (the premise of the test below). */
static void test_old_options_layout_is_a_prefix(void **state)
{
    (void)state;
    assert_int_equal(offsetof(options_v030, standard_max_bytes), offsetof(fa_options, standard_max_bytes));
    assert_int_equal(offsetof(options_v030, block_k), offsetof(fa_options, block_k));
    assert_true(sizeof(options_v030) < sizeof(fa_options));
}

/* Ensure a caller built against the older, smaller fa_options still works after fields were
 * appended, with the bytes after its struct never read (they would be a wild context pointer). */
static void test_older_smaller_options_still_work(void **state)
{
    (void)state;
    small a = make_small(0xab1), b = make_small(0xab1);
    fa_options cur = fa_options_default();
    cur.causal = 1;
    cur.window_left = 9;
    cur.softcap = 7.5;
    cur.num_threads = 2;
    assert_int_equal(fa_forward(&a.q.t, &a.k.t, &a.v.t, &a.o.t, &a.lse.t, &cur), FA_OK);

    unsigned char *buf = malloc(sizeof(fa_options) + 64);
    memset(buf, 0x5a, sizeof(fa_options) + 64); /* after the old struct: garbage */
    options_v030 old;
    memset(&old, 0, sizeof old);
    old.struct_size = sizeof old;
    old.window_left = 9;
    old.window_right = -1;
    old.causal = 1;
    old.softcap = 7.5;
    old.impl = FA_IMPL_FLASH;
    old.num_threads = 2;
    memcpy(buf, &old, sizeof old);
    assert_int_equal(fa_forward(&b.q.t, &b.k.t, &b.v.t, &b.o.t, &b.lse.t, (const fa_options *)(void *)buf), FA_OK);
    assert_memory_equal(a.o.mem, b.o.mem, a.o.bytes);
    assert_memory_equal(a.lse.mem, b.lse.mem, a.lse.bytes);
    free(buf);
    free_small(&a);
    free_small(&b);
}

/* Ensure a caller built against 0.3.0's final fa_options (ending at `context`) still works now that
 * `varlen` is appended: the bytes after its struct are garbage and must not be read as a pointer. */
static void test_options_without_varlen_still_work(void **state)
{
    (void)state;
    assert_int_equal(offsetof(options_v030_final, context), offsetof(fa_options, context));
    assert_true(sizeof(options_v030_final) < sizeof(fa_options));
    small a = make_small(0xab3), b = make_small(0xab3);
    fa_options cur = fa_options_default();
    cur.causal = 1;
    cur.num_threads = 2;
    assert_int_equal(fa_forward(&a.q.t, &a.k.t, &a.v.t, &a.o.t, &a.lse.t, &cur), FA_OK);
    unsigned char *buf = malloc(sizeof(fa_options) + 64);
    memset(buf, 0x5a, sizeof(fa_options) + 64); /* where varlen would be: a wild pointer */
    options_v030_final old;
    memset(&old, 0, sizeof old);
    fa_options_init((fa_options *)(void *)&old, sizeof old);
    old.head.causal = 1;
    old.head.num_threads = 2;
    assert_int_equal(old.head.struct_size, sizeof old);
    assert_int_equal(old.pack_max_bytes, -1);
    memcpy(buf, &old, sizeof old);
    assert_int_equal(fa_forward(&b.q.t, &b.k.t, &b.v.t, &b.o.t, &b.lse.t, (const fa_options *)(void *)buf), FA_OK);
    assert_memory_equal(a.o.mem, b.o.mem, a.o.bytes);
    assert_memory_equal(a.lse.mem, b.lse.mem, a.lse.bytes);
    free(buf);
    free_small(&a);
    free_small(&b);
}

/* fa_forward with `cur`, and again with what a caller built against an older layout sends: the
 * first `size` bytes of `cur` (struct_size = size), garbage (0x5a) after them. The same bits: the
 * library reads no byte past `size`. */
static void expect_older_layout_works(size_t size, fa_options cur, uint64_t salt)
{
    small a = make_small(salt), b = make_small(salt);
    assert_int_equal(fa_forward(&a.q.t, &a.k.t, &a.v.t, &a.o.t, &a.lse.t, &cur), FA_OK);
    unsigned char *buf = malloc(sizeof(fa_options) + 64);
    memset(buf, 0x5a, sizeof(fa_options) + 64);
    fa_options_init((fa_options *)(void *)buf, size);
    assert_int_equal(((fa_options *)(void *)buf)->struct_size, size);
    memcpy(buf + sizeof(size_t), (const unsigned char *)&cur + sizeof(size_t), size - sizeof(size_t));
    assert_int_equal(fa_forward(&b.q.t, &b.k.t, &b.v.t, &b.o.t, &b.lse.t, (const fa_options *)(void *)buf), FA_OK);
    assert_memory_equal(a.o.mem, b.o.mem, a.o.bytes);
    free(buf);
    free_small(&a);
    free_small(&b);
}

/* Ensure a caller whose fa_options end at `align` (before `varlen` was appended) still works with
 * the size it really sends, sizeof of that struct (padded past the int), and that its align is
 * read: top-left alignment with Sq != Sk gives other bits than the default (checked first). */
static void test_options_ending_at_align_still_work(void **state)
{
    (void)state;
    assert_int_equal(offsetof(options_with_align, align), offsetof(fa_options, align));
    assert_true(sizeof(options_with_align) > offsetof(options_with_align, align) + sizeof(int));
    assert_true(sizeof(options_with_align) <= offsetof(fa_options, varlen));
    fa_options cur = fa_options_default(), plain = fa_options_default();
    cur.causal = plain.causal = 1;
    cur.align = FA_ALIGN_TOP_LEFT;
    small a = make_small(0xab8), b = make_small(0xab8);
    assert_int_equal(fa_forward(&a.q.t, &a.k.t, &a.v.t, &a.o.t, &a.lse.t, &cur), FA_OK);
    assert_int_equal(fa_forward(&b.q.t, &b.k.t, &b.v.t, &b.o.t, &b.lse.t, &plain), FA_OK);
    assert_true(memcmp(a.o.mem, b.o.mem, a.o.bytes) != 0);
    free_small(&a);
    free_small(&b);
    expect_older_layout_works(sizeof(options_with_align), cur, 0xab8);
}

/* Ensure a caller whose fa_options end at `varlen` (before `kvcache` was appended) still works:
 * the bytes where kvcache would be are garbage and must not be read. */
static void test_options_without_kvcache_still_work(void **state)
{
    (void)state;
    assert_int_equal(offsetof(options_with_varlen, varlen), offsetof(fa_options, varlen));
    assert_true(sizeof(options_with_varlen) < sizeof(fa_options));
    fa_options cur = fa_options_default();
    cur.causal = 1;
    expect_older_layout_works(sizeof(options_with_varlen), cur, 0xab4);
}

/* Ensure a caller built against 0.4.0 (fa_options ending at `kvcache`) still works: the bytes
 * where sinks, rotary, dropout and num_splits would be are garbage and must not be read. */
static void test_options_v040_still_work(void **state)
{
    (void)state;
    assert_int_equal(offsetof(options_v040, kvcache), offsetof(fa_options, kvcache));
    assert_true(sizeof(options_v040) < sizeof(fa_options));
    fa_options cur = fa_options_default();
    cur.window_left = 3;
    expect_older_layout_works(sizeof(options_v040), cur, 0xab5);
}

/* Ensure a caller built against 0.5.0 (fa_options ending at `num_splits`) still works: the
 * bytes where progress and progress_arg would be are garbage (a wild function pointer) and
 * must not be read, let alone called. */
static void test_options_v050_still_work(void **state)
{
    (void)state;
    assert_int_equal(offsetof(options_v050, num_splits), offsetof(fa_options, num_splits));
    assert_int_equal(sizeof(options_v050), offsetof(fa_options, progress));
    fa_options cur = fa_options_default();
    cur.causal = 1;
    expect_older_layout_works(sizeof(options_v050), cur, 0xab7);
}

/* Ensure a negative num_splits is refused with a message naming it. */
static void test_negative_num_splits_is_refused(void **state)
{
    (void)state;
    small s = make_small(0xab6);
    fa_options opt = fa_options_default();
    opt.num_splits = -1;
    assert_int_equal(fa_forward(&s.q.t, &s.k.t, &s.v.t, &s.o.t, NULL, &opt), FA_ERR_OPTION);
    assert_non_null(strstr(fa_last_error(), "num_splits"));
    free_small(&s);
}

/* Ensure options with struct_size 0 (not initialized by fa_options_default) are refused. */
static void test_uninitialized_struct_size_is_refused(void **state)
{
    (void)state;
    small s = make_small(0xab2);
    fa_options opt;
    memset(&opt, 0, sizeof opt);
    assert_int_equal(fa_forward(&s.q.t, &s.k.t, &s.v.t, &s.o.t, NULL, &opt), FA_ERR_OPTION);
    assert_non_null(strstr(fa_last_error(), "fa_options_default"));
    fa_check_report r;
    memset(&r, 0, sizeof r);
    assert_int_equal(fa_check(&s.q.t, &s.k.t, &s.v.t, &s.o.t, NULL, NULL, NULL, &r), FA_ERR_OPTION);
    assert_non_null(strstr(fa_last_error(), "fa_check_report_init"));
    fa_check_options co;
    memset(&co, 0, sizeof co);
    r = fa_check_report_init();
    assert_int_equal(fa_check(&s.q.t, &s.k.t, &s.v.t, &s.o.t, NULL, NULL, &co, &r), FA_ERR_OPTION);
    free_small(&s);
}

/* Ensure fa_check writes its report and not one byte past the caller's struct_size. */
static void test_check_writes_only_the_callers_report(void **state)
{
    (void)state;
    small s = make_small(0xab3);
    assert_int_equal(fa_forward(&s.q.t, &s.k.t, &s.v.t, &s.o.t, &s.lse.t, NULL), FA_OK);
    unsigned char *buf = malloc(sizeof(fa_check_report) + 64);
    memset(buf, 0xcc, sizeof(fa_check_report) + 64);
    fa_check_report init = fa_check_report_init();
    memcpy(buf, &init, sizeof init);
    fa_check_report *r = (fa_check_report *)(void *)buf;
    assert_int_equal(fa_check(&s.q.t, &s.k.t, &s.v.t, &s.o.t, &s.lse.t, NULL, NULL, r), FA_OK);
    assert_int_equal(r->pass, 1);
    assert_int_equal(r->struct_size, sizeof(fa_check_report));
    for (size_t x = sizeof(fa_check_report); x < sizeof(fa_check_report) + 64; x++) assert_int_equal(buf[x], 0xcc);
    char text[64];
    assert_true(fa_check_report_format(r, text, sizeof text) > 0);
    fa_check_report_free(r);
    assert_int_equal(r->struct_size, sizeof(fa_check_report)); /* kept, so the report can be reused */
    free(buf);
    free_small(&s);
}

/* Ensure *_init writes exactly the caller's struct_size bytes: zero (padding included) then
 * the defaults that fit, never a byte past a smaller (older) caller's struct. */
static void test_init_writes_only_the_callers_size(void **state)
{
    (void)state;
    unsigned char buf[sizeof(fa_options) + 64];
    memset(buf, 0x5a, sizeof buf);
    fa_options_init((fa_options *)(void *)buf, sizeof(options_v030));
    options_v030 old;
    memcpy(&old, buf, sizeof old);
    assert_int_equal(old.struct_size, sizeof(options_v030));
    assert_int_equal(old.window_left, -1);
    assert_int_equal(old.impl, FA_IMPL_FLASH);
    assert_true(old.scale == 0.0 && old.causal == 0 && old.alibi_slopes == NULL);
    for (size_t x = sizeof(options_v030); x < sizeof buf; x++) assert_int_equal(buf[x], 0x5a);
    /* padding zeroed too: the struct equals the one built from a zeroed buffer */
    unsigned char ref[sizeof(fa_options) + 64];
    memset(ref, 0, sizeof ref);
    fa_options_init((fa_options *)(void *)ref, sizeof(options_v030));
    assert_memory_equal(buf, ref, sizeof(options_v030));
    /* a newer caller's larger struct: all of it set, the unknown tail zero */
    memset(buf, 0x5a, sizeof buf);
    fa_options_init((fa_options *)(void *)buf, sizeof(fa_options) + 32);
    for (size_t x = sizeof(fa_options); x < sizeof(fa_options) + 32; x++) assert_int_equal(buf[x], 0);
    for (size_t x = sizeof(fa_options) + 32; x < sizeof buf; x++) assert_int_equal(buf[x], 0x5a);
    unsigned char cbuf[sizeof(fa_check_options) + 64];
    memset(cbuf, 0x5a, sizeof cbuf);
    fa_check_options_init((fa_check_options *)(void *)cbuf, 16);
    for (size_t x = 16; x < sizeof cbuf; x++) assert_int_equal(cbuf[x], 0x5a);
}

/* Ensure a newer caller's larger options are accepted when the fields this library does not
 * know are zero (same bits as the current layout), refused when any of them is set. */
static void test_newer_larger_options_need_a_zero_tail(void **state)
{
    (void)state;
    small a = make_small(0xab5), b = make_small(0xab5);
    fa_options cur = fa_options_default();
    cur.causal = 1;
    cur.num_threads = 2;
    assert_int_equal(fa_forward(&a.q.t, &a.k.t, &a.v.t, &a.o.t, &a.lse.t, &cur), FA_OK);

    const size_t big = sizeof(fa_options) + 40;
    unsigned char *buf = malloc(big);
    memset(buf, 0, big);
    fa_options_init((fa_options *)(void *)buf, big);
    fa_options *nw = (fa_options *)(void *)buf;
    nw->causal = 1;
    nw->num_threads = 2;
    assert_int_equal(nw->struct_size, big);
    assert_int_equal(fa_forward(&b.q.t, &b.k.t, &b.v.t, &b.o.t, &b.lse.t, nw), FA_OK);
    assert_memory_equal(a.o.mem, b.o.mem, a.o.bytes);
    buf[big - 3] = 1; /* a field of the newer version is set */
    tu_poison(&b.o);
    assert_int_equal(fa_forward(&b.q.t, &b.k.t, &b.v.t, &b.o.t, &b.lse.t, nw), FA_ERR_OPTION);
    assert_non_null(strstr(fa_last_error(), "newer flashattn"));

    /* the same for fa_check_options */
    const size_t cbig = sizeof(fa_check_options) + 24;
    unsigned char *cbuf = malloc(cbig);
    memset(cbuf, 0, cbig);
    fa_check_options_init((fa_check_options *)(void *)cbuf, cbig);
    fa_check_report r = fa_check_report_init();
    assert_int_equal(fa_check(&a.q.t, &a.k.t, &a.v.t, &a.o.t, NULL, &cur, (fa_check_options *)(void *)cbuf, &r),
                     FA_OK);
    assert_int_equal(r.pass, 1);
    fa_check_report_free(&r);
    cbuf[cbig - 1] = 7;
    r = fa_check_report_init();
    assert_int_equal(fa_check(&a.q.t, &a.k.t, &a.v.t, &a.o.t, NULL, &cur, (fa_check_options *)(void *)cbuf, &r),
                     FA_ERR_OPTION);
    assert_non_null(strstr(fa_last_error(), "newer flashattn"));
    fa_check_report_free(&r);
    free(cbuf);
    free(buf);
    free_small(&a);
    free_small(&b);
}

/* fa_options as 0.2 laid it out: no struct_size, `double scale` first. */
typedef struct options_v02 {
    double scale;
    int causal;
    int64_t window_left, window_right;
    double softcap;
    const fa_tensor *alibi_slopes;
    fa_impl impl;
    int num_threads;
} options_v02;

/* Ensure a struct_size that is no published layout is refused with a clear message: a size
 * between two layouts, a 0.2-compiled caller (its `double scale` read as struct_size), and
 * a garbage check options / report size. */
static void test_garbage_struct_size_is_refused(void **state)
{
    (void)state;
    small s = make_small(0xab6);
    unsigned char buf[sizeof(fa_options) + 64];
    memset(buf, 0, sizeof buf);
    fa_options_init((fa_options *)(void *)buf, sizeof(options_v030) + 4);
    assert_int_equal(fa_forward(&s.q.t, &s.k.t, &s.v.t, &s.o.t, NULL, (fa_options *)(void *)buf), FA_ERR_OPTION);
    assert_non_null(strstr(fa_last_error(), "not the size of any fa_options"));
    const double scales[] = {0.125, 1.0, 0.088388347648318};
    for (int x = 0; x < 3; x++) {
        options_v02 old;
        memset(&old, 0, sizeof old);
        old.scale = scales[x];
        old.window_left = old.window_right = -1;
        memset(buf, 0, sizeof buf);
        memcpy(buf, &old, sizeof old);
        assert_int_equal(fa_forward(&s.q.t, &s.k.t, &s.v.t, &s.o.t, NULL, (fa_options *)(void *)buf),
                         FA_ERR_OPTION);
        assert_non_null(strstr(fa_last_error(), "0.2"));
    }
    fa_check_options co = fa_check_options_default();
    co.struct_size = offsetof(fa_check_options, qkv_format) + 4; /* between the 0.3 layout and 0.4's */
    fa_check_report r = fa_check_report_init();
    assert_int_equal(fa_check(&s.q.t, &s.k.t, &s.v.t, &s.q.t, NULL, NULL, &co, &r), FA_ERR_OPTION);
    assert_non_null(strstr(fa_last_error(), "fa_check_options"));
    co.struct_size = offsetof(fa_check_options, qkv_format); /* 0.3's layout, before the low-precision fields */
    assert_int_equal(fa_check(&s.q.t, &s.k.t, &s.v.t, &s.o.t, NULL, NULL, &co, &r), FA_OK);
    fa_check_report_free(&r);
    r.struct_size = (size_t)1 << 40;
    assert_int_equal(fa_check(&s.q.t, &s.k.t, &s.v.t, &s.q.t, NULL, NULL, NULL, &r), FA_ERR_OPTION);
    assert_non_null(strstr(fa_last_error(), "fa_check_report"));
    free_small(&s);
}

/* Ensure a newer caller's larger report gets the library's part written and struct_size set
 * to what was written, min(caller's, library's); its tail is left alone. */
static void test_check_writes_back_the_size_it_wrote(void **state)
{
    (void)state;
    small s = make_small(0xab7);
    assert_int_equal(fa_forward(&s.q.t, &s.k.t, &s.v.t, &s.o.t, &s.lse.t, NULL), FA_OK);
    const size_t big = sizeof(fa_check_report) + 48;
    unsigned char *buf = malloc(big);
    memset(buf, 0xcc, big);
    fa_check_report init = fa_check_report_init();
    init.struct_size = big;
    memcpy(buf, &init, sizeof init);
    fa_check_report *r = (fa_check_report *)(void *)buf;
    assert_int_equal(fa_check(&s.q.t, &s.k.t, &s.v.t, &s.o.t, &s.lse.t, NULL, NULL, r), FA_OK);
    assert_int_equal(r->pass, 1);
    assert_int_equal(r->struct_size, sizeof(fa_check_report));
    for (size_t x = sizeof(fa_check_report); x < big; x++) assert_int_equal(buf[x], 0xcc);
    fa_check_report_free(r);
    free(buf);
    free_small(&s);
}

/* Ensure fa_check_abi_size answers by name, and 0 for an unknown struct. */
static void test_abi_sizes_by_name(void **state)
{
    (void)state;
    assert_int_equal(fa_check_abi_size(FA_ABI_TENSOR), sizeof(fa_tensor));
    assert_int_equal(fa_check_abi_size(FA_ABI_OPTIONS), sizeof(fa_options));
    assert_int_equal(fa_check_abi_size(FA_ABI_CHECK_OPTIONS), sizeof(fa_check_options));
    assert_int_equal(fa_check_abi_size(FA_ABI_CHECK_REPORT), sizeof(fa_check_report));
    assert_int_equal(fa_check_abi_size(FA_ABI_VARLEN), sizeof(fa_varlen));
    assert_int_equal(fa_varlen_default().struct_size, sizeof(fa_varlen));
    assert_int_equal(fa_check_abi_size(FA_ABI_KVCACHE), sizeof(fa_kvcache));
    assert_int_equal(fa_kvcache_default().struct_size, sizeof(fa_kvcache));
    assert_int_equal(fa_check_abi_size(FA_ABI_BACKWARD_EXTRA), sizeof(fa_backward_extra));
    assert_int_equal(fa_check_abi_size(FA_ABI_STRUCT_COUNT), 0);
    assert_int_equal(fa_check_abi_size(-1), 0);
    assert_int_equal(fa_options_default().struct_size, sizeof(fa_options));
    assert_int_equal(fa_check_options_default().struct_size, sizeof(fa_check_options));
}

/* The L3 that sysfs gives for cpu0 (0 when it gives none). */
static size_t sysfs_l3(void)
{
    for (int idx = 0; idx < 8; idx++) {
        char path[128], unit = 0;
        int level = 0;
        unsigned long v = 0;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/level", idx);
        FILE *f = fopen(path, "r");
        if (!f) return 0;
        const int got = fscanf(f, "%d", &level);
        fclose(f);
        if (got != 1 || level != 3) continue;
        char type[32] = "";
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/type", idx);
        f = fopen(path, "r");
        if (!f) return 0;
        const int typed = fscanf(f, "%31s", type);
        fclose(f);
        if (typed != 1 || strcmp(type, "Unified") != 0) continue;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", idx);
        f = fopen(path, "r");
        if (!f) return 0;
        const int n = fscanf(f, "%lu%c", &v, &unit);
        fclose(f);
        if (n < 1) return 0;
        return n == 2 && (unit == 'K' || unit == 'k')   ? v << 10
               : n == 2 && (unit == 'M' || unit == 'm') ? v << 20
               : n == 2 && (unit == 'G' || unit == 'g') ? v << 30
                                                        : v;
    }
    return 0;
}

/* Ensure fa_cpu_info's L3 is the kernel's (sysfs) wherever the kernel gives one: glibc's
 * sysconf read 320 MiB on an AMD EPYC guest whose sysfs and lscpu said 32 MiB. */
static void test_cpu_info_l3_is_the_kernels(void **state)
{
    (void)state;
    const size_t want = sysfs_l3();
    if (!want) skip();
    fa_cpu_info info;
    assert_int_equal(fa_get_cpu_info(&info), FA_OK);
    assert_int_equal(info.l3_bytes, want);
}

/* Ensure a context pins each supported ISA, reuses its arena (no allocation on the second
 * same-shaped call), and gives the same bits as the first call; forward and backward. */
static void test_context_reuses_its_arena_for_every_isa(void **state)
{
    (void)state;
    static const char *const isas[] = {"scalar", "avx2", "avx512", "neon"};
    fa_cpu_info info;
    assert_int_equal(fa_get_cpu_info(&info), FA_OK);
    int ran = 0;
    for (int x = 0; x < 4; x++) {
        if (!fa_isa_supported(isas[x])) continue;
        fa_context *ctx = NULL;
        assert_int_equal(fa_context_create(&ctx, isas[x], 2), FA_OK);
        assert_string_equal(fa_context_isa(ctx), isas[x]);
        small a = make_small(0xab4), b = make_small(0xab4), c = make_small(0xab4);
        fa_options opt = fa_options_default();
        opt.context = ctx;
        opt.causal = 1;
        assert_int_equal(fa_forward(&a.q.t, &a.k.t, &a.v.t, &a.o.t, &a.lse.t, &opt), FA_OK);
        assert_true(fa_context_arena_bytes(ctx) > 0);
        fa_alloc_stats st;
        fa_alloc_stats_reset();
        assert_int_equal(fa_forward(&b.q.t, &b.k.t, &b.v.t, &b.o.t, &b.lse.t, &opt), FA_OK);
        fa_alloc_stats_get(&st);
        if (st.total_allocs != 0)
            fail_msg("%s: the second call with a context allocated %zu times", isas[x], st.total_allocs);
        assert_memory_equal(a.o.mem, b.o.mem, a.o.bytes);
        /* the same ISA without a context (when it is the dispatched one): the same bits */
        if (strcmp(isas[x], info.isa) == 0) {
            opt.context = NULL;
            assert_int_equal(fa_forward(&c.q.t, &c.k.t, &c.v.t, &c.o.t, &c.lse.t, &opt), FA_OK);
            assert_memory_equal(a.o.mem, c.o.mem, a.o.bytes);
            opt.context = ctx;
        }
        /* backward through the context: the second call allocates nothing either */
        tu_tensor dq = tu_alloc4(FA_F32, 2, 37, 4, 32, 0), dk = tu_alloc4(FA_F32, 2, 53, 2, 32, 0);
        tu_tensor dv = tu_alloc4(FA_F32, 2, 53, 2, 24, 0);
        assert_int_equal(fa_backward(&a.q.t, &a.k.t, &a.v.t, NULL, NULL, &a.o.t, &dq.t, &dk.t, &dv.t, &opt), FA_OK);
        fa_alloc_stats_reset();
        assert_int_equal(fa_backward(&a.q.t, &a.k.t, &a.v.t, NULL, NULL, &a.o.t, &dq.t, &dk.t, &dv.t, &opt), FA_OK);
        fa_alloc_stats_get(&st);
        if (st.total_allocs != 0)
            fail_msg("%s: the second backward with a context allocated %zu times", isas[x], st.total_allocs);
        tu_free(&dq); tu_free(&dk); tu_free(&dv);
        free_small(&a); free_small(&b); free_small(&c);
        fa_context_destroy(ctx);
        ran++;
    }
    assert_true(ran >= 1);
    fa_context *ctx = (fa_context *)1;
    assert_int_equal(fa_context_create(&ctx, "mmx", 0), FA_ERR_ISA);
    assert_null(ctx);
    assert_non_null(strstr(fa_last_error(), "mmx"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_old_options_layout_is_a_prefix),
        cmocka_unit_test(test_older_smaller_options_still_work),
        cmocka_unit_test(test_options_without_varlen_still_work),
        cmocka_unit_test(test_options_ending_at_align_still_work),
        cmocka_unit_test(test_options_without_kvcache_still_work),
        cmocka_unit_test(test_options_v040_still_work),
        cmocka_unit_test(test_options_v050_still_work),
        cmocka_unit_test(test_negative_num_splits_is_refused),
        cmocka_unit_test(test_uninitialized_struct_size_is_refused),
        cmocka_unit_test(test_check_writes_only_the_callers_report),
        cmocka_unit_test(test_init_writes_only_the_callers_size),
        cmocka_unit_test(test_newer_larger_options_need_a_zero_tail),
        cmocka_unit_test(test_garbage_struct_size_is_refused),
        cmocka_unit_test(test_check_writes_back_the_size_it_wrote),
        cmocka_unit_test(test_abi_sizes_by_name),
        cmocka_unit_test(test_context_reuses_its_arena_for_every_isa),
        cmocka_unit_test(test_cpu_info_l3_is_the_kernels),
    };
    tu_seed();
    return cmocka_run_group_tests_name("abi", tests, NULL, NULL);
}
