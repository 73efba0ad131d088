/*
 * config.c — the environment, read once and strictly; the block-size rule.
 */
#include "config.h"

#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "status.h"

#ifdef _OPENMP
#include <omp.h>
#endif

int fa_parse_bytes(const char *s, size_t *bytes)
{
    if (!s || *s < '0' || *s > '9') return -1;
    unsigned long long v = 0;
    const char *c = s;
    for (; *c >= '0' && *c <= '9'; c++) {
        if (v > (ULLONG_MAX - 9) / 10) return -1;
        v = v * 10 + (unsigned long long)(*c - '0');
    }
    unsigned shift = 0;
    if (*c == 'K' || *c == 'k') shift = 10;
    else if (*c == 'M' || *c == 'm') shift = 20;
    else if (*c == 'G' || *c == 'g') shift = 30;
    if (shift) {
        c++;
        if (c[0] == 'i' && c[1] == 'B') c += 2;
    }
    if (*c != '\0') return -1;
    if (shift && v > (SIZE_MAX >> shift)) return -1;
    if (v > SIZE_MAX) return -1;
    *bytes = (size_t)(v << shift);
    return 0;
}

static fa_env env;
static fa_status env_status = FA_OK;
static char env_message[256];
static pthread_once_t env_once = PTHREAD_ONCE_INIT;

/* An integer in lo..FA_BLOCK_MAX; `unset` when the variable is unset or empty. */
static int env_int(const char *name, int lo, int unset, int *out)
{
    const char *s = getenv(name);
    *out = unset;
    if (!s || !*s) return 0;
    char *end;
    long v = strtol(s, &end, 10);
    if (*s < '0' || *s > '9' || *end != '\0' || v < lo || v > FA_BLOCK_MAX) {
        snprintf(env_message, sizeof env_message, "%s=%s: must be an integer in %d..%d", name, s, lo,
                 FA_BLOCK_MAX);
        return -1;
    }
    *out = (int)v;
    return 0;
}

static int env_size(const char *name, size_t *out, int *set)
{
    const char *s = getenv(name);
    *out = 0;
    if (set) *set = 0;
    if (!s || !*s) return 0;
    if (fa_parse_bytes(s, out) != 0) {
        snprintf(env_message, sizeof env_message,
                 "%s=%s: expected a byte count like 65536, 64K, 16M or 1G (binary units)", name, s);
        return -1;
    }
    if (set) *set = 1;
    return 0;
}

/* A switch: unset -> -1, "0" or "1", anything else is an error. */
static int env_switch(const char *name, int *out)
{
    const char *s = getenv(name);
    *out = -1;
    if (!s || !*s) return 0;
    if ((s[0] == '0' || s[0] == '1') && s[1] == '\0') {
        *out = s[0] - '0';
        return 0;
    }
    snprintf(env_message, sizeof env_message, "%s=%s: must be 0 or 1", name, s);
    return -1;
}

static void env_read(void)
{
    if (env_switch("FA_TILE_CUT", &env.tile_cut) || env_switch("FA_BWD_ONE_PASS", &env.bwd_one_pass) ||
        env_switch("FA_AMX", &env.amx) || env_switch("FA_DECODE_TOUCH", &env.decode_touch) ||
        env_int("FA_BLOCK_Q", 1, 0, &env.block_q) || env_int("FA_BLOCK_K", 1, 0, &env.block_k) ||
        env_size("FA_FLASH_SHARED_MAX", &env.pack_max, &env.has_pack_max) ||
        env_size("FA_L1D_BYTES", &env.l1d, NULL) || env_size("FA_L2_BYTES", &env.l2, NULL) ||
        env_int("FA_STRIP_ROWS", 0, -1, &env.strip_rows) || env_int("FA_TASK_CHUNK", 0, 0, &env.task_chunk) ||
        env_int("FA_TAIL_SPLIT", 0, -1, &env.tail_split))
        env_status = FA_ERR_OPTION;
}

const fa_env *fa_env_get(fa_status *status)
{
    pthread_once(&env_once, env_read);
    *status = env_status;
    if (env_status != FA_OK) {
        fa_fail(env_status, "%s", env_message);
        return NULL;
    }
    return &env;
}

int fa_default_threads(void)
{
#ifdef _OPENMP
    /* OMP_NUM_THREADS may ask for more than the library takes (FA_MAX_THREADS: libgomp ends the
     * process when it cannot create a thread); the default is capped like an explicit count */
    const int n = omp_get_max_threads();
    return n > FA_MAX_THREADS ? FA_MAX_THREADS : n;
#else
    return 1;
#endif
}
