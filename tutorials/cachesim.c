/*
 * cachesim.c — set-associative LRU L1 + L2 model (see cachesim.h for the rules).
 *
 * Each set is a small array of line tags kept in recency order, most recent
 * first: a hit moves its tag to the front, a miss drops the last tag (the least
 * recently used line) and puts the new one in front. With 8-16 ways a linear
 * scan is faster than anything clever, and it is obviously LRU. cachegrind
 * keeps its sets the same way.
 */
#include "cachesim.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One cache level: sets x ways tags, most recently used first in each set. */
typedef struct level {
    cachesim_level geo;
    uint64_t nsets;
    int line_shift;      /* log2(line_bytes) */
    uint64_t *tag;       /* [nsets][ways]: line number + 1; 0 = empty way */
    uint8_t *dirty;      /* [nsets][ways]: written since it was loaded */
    cachesim_stats st;
} level;

struct cachesim {
    cachesim_config cfg;
    level l1, l2;
    int has_l2;
};

static int is_pow2(uint64_t x) { return x && !(x & (x - 1)); }

static int log2u(uint64_t x)
{
    int s = 0;
    while ((1ull << s) < x) s++;
    return s;
}

cachesim_config cachesim_config_teaching(void)
{
    cachesim_config c;
    memset(&c, 0, sizeof c);
    c.l1 = (cachesim_level){32 * 1024, 8, 64};
    c.l2 = (cachesim_level){256 * 1024, 8, 64};
    snprintf(c.name, sizeof c.name, "teaching");
    return c;
}

static int check_level(const cachesim_level *g, const char *which, const char **err)
{
    static char msg[160];
    if (g->ways <= 0 || g->line_bytes <= 0 || !is_pow2((uint64_t)g->line_bytes)) {
        snprintf(msg, sizeof msg, "%s: ways must be > 0 and the line size a power of two", which);
        *err = msg;
        return -1;
    }
    uint64_t per_set = (uint64_t)g->ways * (uint64_t)g->line_bytes;
    if (g->size_bytes == 0 || g->size_bytes % per_set != 0 || !is_pow2(g->size_bytes / per_set)) {
        snprintf(msg, sizeof msg,
                 "%s: size %zu / (%d ways x %d-byte lines) must be a power-of-two number of sets",
                 which, g->size_bytes, g->ways, g->line_bytes);
        *err = msg;
        return -1;
    }
    return 0;
}

int cachesim_config_check(const cachesim_config *cfg, const char **err)
{
    if (check_level(&cfg->l1, "L1", err)) return -1;
    if (cfg->l2.size_bytes && check_level(&cfg->l2, "L2", err)) return -1;
    return 0;
}

/* "48K,12,64" -> level; returns the rest of the string after it, or NULL. */
static const char *parse_level(const char *s, cachesim_level *g)
{
    char *end;
    unsigned long long size = strtoull(s, &end, 10);
    if (end == s) return NULL;
    if (*end == 'K' || *end == 'k') { size <<= 10; end++; }
    else if (*end == 'M' || *end == 'm') { size <<= 20; end++; }
    if (*end != ',') return NULL;
    s = end + 1;
    long ways = strtol(s, &end, 10);
    if (end == s || *end != ',') return NULL;
    s = end + 1;
    long line = strtol(s, &end, 10);
    if (end == s) return NULL;
    g->size_bytes = (size_t)size;
    g->ways = (int)ways;
    g->line_bytes = (int)line;
    return end;
}

int cachesim_config_parse(const char *spec, cachesim_config *cfg, const char **err)
{
    if (strcmp(spec, "teaching") == 0) {
        *cfg = cachesim_config_teaching();
        return 0;
    }
    cachesim_config c;
    memset(&c, 0, sizeof c);
    const char *rest = parse_level(spec, &c.l1);
    if (rest && *rest == ':') rest = parse_level(rest + 1, &c.l2);
    if (!rest || *rest) {
        *err = "geometry must be \"teaching\" or L1SIZE,WAYS,LINE[:L2SIZE,WAYS,LINE] (e.g. 48K,12,64:1M,16,64)";
        return -1;
    }
    if (cachesim_config_check(&c, err)) return -1;
    snprintf(c.name, sizeof c.name, "custom");
    *cfg = c;
    return 0;
}

static void format_size(size_t b, char *buf, size_t len)
{
    if (b % (1u << 20) == 0) snprintf(buf, len, "%zuM", b >> 20);
    else if (b % 1024 == 0) snprintf(buf, len, "%zuK", b >> 10);
    else snprintf(buf, len, "%zu", b);
}

void cachesim_config_format(const cachesim_config *cfg, char *buf, size_t len)
{
    char a[32], b[32];
    format_size(cfg->l1.size_bytes, a, sizeof a);
    if (!cfg->l2.size_bytes) {
        snprintf(buf, len, "%s,%d,%d", a, cfg->l1.ways, cfg->l1.line_bytes);
        return;
    }
    format_size(cfg->l2.size_bytes, b, sizeof b);
    snprintf(buf, len, "%s,%d,%d:%s,%d,%d", a, cfg->l1.ways, cfg->l1.line_bytes,
             b, cfg->l2.ways, cfg->l2.line_bytes);
}

static int level_init(level *L, const cachesim_level *g)
{
    memset(L, 0, sizeof *L);
    L->geo = *g;
    L->nsets = g->size_bytes / ((uint64_t)g->ways * (uint64_t)g->line_bytes);
    L->line_shift = log2u((uint64_t)g->line_bytes);
    size_t n = (size_t)L->nsets * (size_t)g->ways;
    L->tag = calloc(n, sizeof *L->tag);
    L->dirty = calloc(n, sizeof *L->dirty);
    return (L->tag && L->dirty) ? 0 : -1;
}

static void level_clear(level *L)
{
    size_t n = (size_t)L->nsets * (size_t)L->geo.ways;
    memset(L->tag, 0, n * sizeof *L->tag);
    memset(L->dirty, 0, n);
    memset(&L->st, 0, sizeof L->st);
}

cachesim *cachesim_create(const cachesim_config *cfg)
{
    const char *err;
    if (cachesim_config_check(cfg, &err)) return NULL;
    cachesim *cs = calloc(1, sizeof *cs);
    if (!cs) return NULL;
    cs->cfg = *cfg;
    cs->has_l2 = cfg->l2.size_bytes != 0;
    if (level_init(&cs->l1, &cfg->l1) || (cs->has_l2 && level_init(&cs->l2, &cfg->l2))) {
        cachesim_free(cs);
        return NULL;
    }
    return cs;
}

void cachesim_free(cachesim *cs)
{
    if (!cs) return;
    free(cs->l1.tag); free(cs->l1.dirty);
    free(cs->l2.tag); free(cs->l2.dirty);
    free(cs);
}

void cachesim_reset(cachesim *cs)
{
    level_clear(&cs->l1);
    if (cs->has_l2) level_clear(&cs->l2);
}

/*
 * Look up line number `line` in L. Returns 1 on a hit. On a miss the line is
 * installed (write-allocate) and, if a dirty line had to leave, *victim gets
 * its line number + 1 (else 0).
 */
static int level_lookup(level *L, uint64_t line, int is_write, uint64_t *victim)
{
    int ways = L->geo.ways;
    uint64_t set = line & (L->nsets - 1);
    uint64_t *t = L->tag + set * (uint64_t)ways;     /* [ways], MRU first */
    uint8_t *dt = L->dirty + set * (uint64_t)ways;   /* [ways] */
    uint64_t key = line + 1;
    *victim = 0;
    for (int w = 0; w < ways; w++) {
        if (t[w] == key) {
            uint8_t dirty = dt[w] | (uint8_t)is_write;
            memmove(t + 1, t, (size_t)w * sizeof *t);   /* shift the younger ones down */
            memmove(dt + 1, dt, (size_t)w);
            t[0] = key;
            dt[0] = dirty;
            return 1;
        }
    }
    if (t[ways - 1] && dt[ways - 1]) *victim = t[ways - 1];
    memmove(t + 1, t, (size_t)(ways - 1) * sizeof *t);  /* LRU way falls off the end */
    memmove(dt + 1, dt, (size_t)(ways - 1));
    t[0] = key;
    dt[0] = (uint8_t)is_write;
    return 0;
}

/* A dirty line leaves L1: mark L2's copy dirty (no LRU update), or write it to memory. */
static void l2_absorb_writeback(cachesim *cs, uint64_t key)
{
    cs->l1.st.writebacks++;
    if (!cs->has_l2) return;
    level *L = &cs->l2;
    uint64_t set = (key - 1) & (L->nsets - 1);
    uint64_t *t = L->tag + set * (uint64_t)L->geo.ways;
    for (int w = 0; w < L->geo.ways; w++) {
        if (t[w] == key) {
            L->dirty[set * (uint64_t)L->geo.ways + (uint64_t)w] = 1;
            return;
        }
    }
    L->st.writebacks++;    /* not in L2 (it is not inclusive): straight to memory */
}

/* One line-sized lookup through the hierarchy; returns 1 if L1 missed, and sets *l2miss. */
static int touch_line(cachesim *cs, uint64_t addr_line1, int is_write, int *l2miss)
{
    uint64_t victim;
    *l2miss = 0;
    if (level_lookup(&cs->l1, addr_line1, is_write, &victim)) return 0;
    cs->l1.st.fills++;
    if (victim) l2_absorb_writeback(cs, victim);
    if (cs->has_l2) {
        /* L2 holds lines of its own size; convert the L1 line number to bytes and back. */
        uint64_t byte = addr_line1 << cs->l1.line_shift;
        uint64_t v2;
        if (!level_lookup(&cs->l2, byte >> cs->l2.line_shift, 0, &v2)) {
            *l2miss = 1;
            cs->l2.st.fills++;
            if (v2) cs->l2.st.writebacks++;
        }
    }
    return 1;
}

void cachesim_access(cachesim *cs, const void *addr, size_t bytes, int is_write)
{
    if (bytes == 0) bytes = 1;
    uint64_t a = (uint64_t)(uintptr_t)addr;
    uint64_t first = a >> cs->l1.line_shift;
    uint64_t last = (a + bytes - 1) >> cs->l1.line_shift;
    int miss1 = 0, l2_accessed = 0, miss2 = 0;
    for (uint64_t line = first; line <= last; line++) {
        int m2;
        if (touch_line(cs, line, is_write, &m2)) {
            miss1 = 1;
            l2_accessed = 1;
            miss2 |= m2;
        }
    }
    /* cachegrind's rule: one access, and at most one miss, however many lines it spans. */
    if (is_write) { cs->l1.st.writes++; cs->l1.st.write_misses += (uint64_t)miss1; }
    else          { cs->l1.st.reads++;  cs->l1.st.read_misses += (uint64_t)miss1; }
    if (cs->has_l2 && l2_accessed) {
        if (is_write) { cs->l2.st.writes++; cs->l2.st.write_misses += (uint64_t)miss2; }
        else          { cs->l2.st.reads++;  cs->l2.st.read_misses += (uint64_t)miss2; }
    }
}

void cachesim_get_stats(const cachesim *cs, int level_no, cachesim_stats *st)
{
    if (level_no == 2 && !cs->has_l2) { memset(st, 0, sizeof *st); return; }
    *st = level_no == 2 ? cs->l2.st : cs->l1.st;
}

uint64_t cachesim_misses(const cachesim *cs, int level_no)
{
    cachesim_stats s;
    cachesim_get_stats(cs, level_no, &s);
    return s.read_misses + s.write_misses;
}

uint64_t cachesim_accesses(const cachesim *cs, int level_no)
{
    cachesim_stats s;
    cachesim_get_stats(cs, level_no, &s);
    return s.reads + s.writes;
}

uint64_t cachesim_traffic_bytes(const cachesim *cs, int level_no)
{
    cachesim_stats s;
    cachesim_get_stats(cs, level_no, &s);
    const cachesim_level *g = level_no == 2 ? &cs->cfg.l2 : &cs->cfg.l1;
    return (s.fills + s.writebacks) * (uint64_t)g->line_bytes;
}

const cachesim_config *cachesim_get_config(const cachesim *cs) { return &cs->cfg; }
