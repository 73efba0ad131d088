/*
 * cpuinfo.c — cache geometry the flash path plans its blocks for.
 *
 * Sources, in order: glibc's sysconf(_SC_LEVEL*_CACHE_*) (which reads CPUID
 * on x86; for the L3, sysfs first), then Linux sysfs
 * (/sys/devices/system/cpu/cpu0/cache/index*), then
 * fallback defaults (32 KiB L1d, 1 MiB L2, 64-byte lines) that suit most
 * laptops and servers of the last decade. The result is computed once, under
 * pthread_once (concurrent first calls are safe). FA_L1D_BYTES / FA_L2_BYTES
 * override it (for experiments and teaching; parsed strictly by config.c — a
 * malformed value is reported by the calls that plan blocks, and ignored here).
 */
#include "config.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

static size_t sysfs_cache(int want_level, const char *want_type, size_t *line)
{
    for (int idx = 0; idx < 8; idx++) {
        char path[128], buf[64];
        int level = 0;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/level", idx);
        FILE *f = fopen(path, "r");
        if (!f) break;
        if (fscanf(f, "%d", &level) != 1) level = 0;
        fclose(f);
        if (level != want_level) continue;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/type", idx);
        f = fopen(path, "r");
        if (!f) continue;
        if (!fgets(buf, sizeof buf, f)) buf[0] = '\0';
        fclose(f);
        if (strncmp(buf, want_type, strlen(want_type)) != 0 && strncmp(buf, "Unified", 7) != 0)
            continue;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", idx);
        f = fopen(path, "r");
        if (!f) continue;
        unsigned long v = 0;
        char unit = 0;
        int n = fscanf(f, "%lu%c", &v, &unit);
        fclose(f);
        if (n < 1) continue;
        size_t bytes = v;
        if (n == 2 && (unit == 'K' || unit == 'k')) bytes = v * 1024;
        if (n == 2 && (unit == 'M' || unit == 'm')) bytes = v * 1024 * 1024;
        if (n == 2 && (unit == 'G' || unit == 'g')) bytes = v * 1024 * 1024 * 1024;
        if (line) {
            snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/coherency_line_size", idx);
            f = fopen(path, "r");
            if (f) {
                unsigned long l = 0;
                if (fscanf(f, "%lu", &l) == 1 && l > 0) *line = l;
                fclose(f);
            }
        }
        return bytes;
    }
    return 0;
}

static size_t c1, c2, c3, cl;
static int src;
static pthread_once_t caches_once = PTHREAD_ONCE_INIT;

static void detect(void)
{
    {
        long a = -1, b = -1, c = -1, d = -1;
#ifdef _SC_LEVEL1_DCACHE_SIZE
        a = sysconf(_SC_LEVEL1_DCACHE_SIZE);
        b = sysconf(_SC_LEVEL2_CACHE_SIZE);
        c = sysconf(_SC_LEVEL3_CACHE_SIZE);
        d = sysconf(_SC_LEVEL1_DCACHE_LINESIZE);
#endif
        if (a > 0 && b > 0) {
            c1 = (size_t)a;
            c2 = (size_t)b;
            /* The L3 from sysfs where it has one: glibc's figure comes from CPUID's
             * cache leaves, which a hypervisor can fill oddly (an AMD EPYC guest whose
             * kernel and lscpu say 32 MiB read 320 MiB through sysconf). Only `info`
             * and bench's cold-cache read use the L3; the blocks follow L2. */
            const size_t s3 = sysfs_cache(3, "Unified", NULL);
            c3 = s3 ? s3 : c > 0 ? (size_t)c : 0;
            cl = d > 0 ? (size_t)d : 64;
            src = 1;
        } else {
            size_t ln = 64;
            c1 = sysfs_cache(1, "Data", &ln);
            c2 = sysfs_cache(2, "Unified", NULL);
            c3 = sysfs_cache(3, "Unified", NULL);
            cl = ln;
            src = (c1 && c2) ? 1 : 0;
        }
        if (!c1) c1 = 32 * 1024;
        if (!c2) c2 = 1024 * 1024;
        if (!cl) cl = 64;
        fa_status st;
        const fa_env *e = fa_env_get(&st);
        if (e && e->l1d) { c1 = e->l1d; src = 3; }
        if (e && e->l2) { c2 = e->l2; src = 3; }
    }
}

static int amd = -1;

static void detect_vendor(void)
{
    amd = 0;
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, b, c, d;
    if (!__get_cpuid(0, &a, &b, &c, &d)) return;
    /* the 12-byte vendor string is EBX, EDX, ECX */
    char v[13];
    memcpy(v, &b, 4);
    memcpy(v + 4, &d, 4);
    memcpy(v + 8, &c, 4);
    v[12] = '\0';
    amd = strcmp(v, "AuthenticAMD") == 0;
#endif
}

static pthread_once_t vendor_once = PTHREAD_ONCE_INIT;

int fa_cpu_is_amd(void) /* CPUID once: in a virtual machine each one traps to the hypervisor */
{
    pthread_once(&vendor_once, detect_vendor);
    return amd;
}

void fa_detect_caches(size_t *l1d, size_t *l2, size_t *l3, size_t *line, int *source)
{
    pthread_once(&caches_once, detect);
    *l1d = c1;
    *l2 = c2;
    *l3 = c3;
    *line = cl;
    *source = src;
}
