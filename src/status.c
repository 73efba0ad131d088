/*
 * status.c — the thread-local error message and the names of status codes.
 */
#include "status.h"

#include <stdarg.h>
#include <stdio.h>

static _Thread_local char fa_errbuf[512];

fa_status fa_fail(fa_status status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(fa_errbuf, sizeof fa_errbuf, fmt, ap);
    va_end(ap);
    return status;
}

void fa_clear_error(void) { fa_errbuf[0] = '\0'; }

const char *fa_last_error(void) { return fa_errbuf; }

const char *fa_status_string(fa_status status)
{
    static const char *const names[FA_STATUS_COUNT] = {
        [FA_OK] = "ok",
        [FA_ERR_NULL_ARG] = "null argument",
        [FA_ERR_DTYPE] = "unsupported dtype",
        [FA_ERR_SHAPE] = "inconsistent or invalid shape",
        [FA_ERR_HEADS] = "heads is not a multiple of heads_k",
        [FA_ERR_STRIDE] = "invalid stride",
        [FA_ERR_OPTION] = "option out of range",
        [FA_ERR_ALIBI] = "invalid ALiBi slopes",
        [FA_ERR_IMPL] = "unknown implementation",
        [FA_ERR_NOMEM] = "out of memory",
        [FA_ERR_TOO_LARGE] = "exceeds the memory cap",
        [FA_ERR_ISA] = "instruction set unavailable",
        [FA_ERR_IO] = "I/O error",
        [FA_ERR_FORMAT] = "malformed file",
        [FA_ERR_NONFINITE] = "non-finite value",
        [FA_ERR_INDEX] = "invalid index array",
    };
    if ((int)status < 0 || status >= FA_STATUS_COUNT) return "unknown status";
    return names[status];
}
