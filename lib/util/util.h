/* SPDX-License-Identifier: Apache-2.0 */
/* Private helpers shared by all modules: logging, sizes, checked arithmetic. */
#ifndef VMSNAP_UTIL_H
#define VMSNAP_UTIL_H

#include "vmsnap/common.h"

#include <stdbool.h>
#include <stdint.h>

/* Log through the user's callback (no-op when none is installed or the level is filtered). */
void vlog(enum vmsnap_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
bool vlog_enabled(enum vmsnap_log_level level);

/* 0, or -ECANCELED with "interrupted (SIGINT)" in err once vmsnap_cancel() was called (and
 * this thread holds no cancel_hold()). */
int cancel_check(struct vmsnap_err *err);
bool cancel_pending(void);
/* Between these, this thread's work is not cancelled: the clean-up of a failed or cancelled
 * transfer (its requests must still run), and a push past its commit. Nested. */
void cancel_hold(void);
void cancel_release(void);

#define VMSNAP_MIN(a, b) ((a) < (b) ? (a) : (b))
#define VMSNAP_MAX(a, b) ((a) > (b) ? (a) : (b))

/* Little-endian loads and stores (the formats are little-endian on every host). */
static inline void put_le32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static inline void put_le64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint32_t get_le32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}
static inline uint64_t get_le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

/* Format a byte count as "1.50 GiB" into buf; returns buf. */
const char *vmsnap_fmt_bytes(char *buf, size_t len, uint64_t bytes);

#endif
