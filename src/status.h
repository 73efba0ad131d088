/*
 * status.h — errors as values: the thread-local message behind fa_last_error().
 *
 * The lowest layer of the library: everything may call it, it calls nothing.
 */
#ifndef FA_STATUS_H
#define FA_STATUS_H

#include "flashattn.h"

/* Record a message for fa_last_error() and return `status`. printf-style. */
fa_status fa_fail(fa_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Clear the thread's last error message. */
void fa_clear_error(void);

#endif /* FA_STATUS_H */
