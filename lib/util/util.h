/* SPDX-License-Identifier: Apache-2.0 */
/* Private helpers shared by all modules: logging, sizes, checked arithmetic. */
#ifndef VMSNAP_UTIL_H
#define VMSNAP_UTIL_H

#include "vmsnap/common.h"

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* vmsnap_err_set() for a failed system call: the message is the formatted text followed by
 * ": " and strerror(code); returns -code (EIO when code <= 0). err_sys() takes the code from
 * errno as it is on entry. Write `return err_sys(err, "open %s", path)`. */
int err_code(struct vmsnap_err *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int err_sys(struct vmsnap_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Make room for `need` elements of `elem` bytes in the array *arr of capacity *cap: doubles
 * (starting at `first`), checking for overflow. 0, or -ENOMEM with *arr and *cap unchanged. */
int grow_array(void *arr, size_t *cap, size_t need, size_t elem, size_t first);

/* CLOCK_MONOTONIC in seconds (step timings, deadlines, back-offs). */
double mono_now(void);

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
/* pthread_create() for the library's worker threads: the new thread runs under the calling
 * thread's cancellation scope (vmsnap_scope_enter). Returns 0 or a positive errno, as
 * pthread_create. */
int thread_start(pthread_t *t, void *(*fn)(void *), void *arg);

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

#endif
