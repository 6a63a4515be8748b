/* SPDX-License-Identifier: Apache-2.0 */
/* Error values and the log callback (see include/vmsnap/common.h). */
#include "util/util.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

/* Copy `n` bytes of `all` into msg; when they do not fit, the middle goes (" ... "): the
 * context at the start and the cause at the end (after a long URL or path) both stay. */
static void fit(char *msg, size_t size, const char *all, size_t n)
{
    const size_t cap = size - 1;
    if (n <= cap) {
        memcpy(msg, all, n);
        msg[n] = '\0';
        return;
    }
    static const char gap[] = " ... ";
    size_t head = cap / 2, tail = cap - head - (sizeof(gap) - 1);
    memcpy(msg, all, head);
    memcpy(msg + head, gap, sizeof(gap) - 1);
    memcpy(msg + head + sizeof(gap) - 1, all + n - tail, tail);
    msg[cap] = '\0';
}

int vmsnap_err_set(struct vmsnap_err *err, int code, const char *fmt, ...)
{
    if (code <= 0)
        code = EIO;
    if (err) {
        char all[8 * VMSNAP_ERR_MSG_MAX];
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(all, sizeof(all), fmt, ap);
        va_end(ap);
        if (n < 0)
            n = 0;
        if ((size_t)n >= sizeof(all))
            n = (int)sizeof(all) - 1;
        fit(err->msg, sizeof(err->msg), all, (size_t)n);
        err->code = code;
    }
    return -code;
}

__attribute__((format(printf, 3, 0))) static int vset(struct vmsnap_err *err, int code,
                                                      const char *fmt, va_list ap)
{
    if (err) {
        char all[8 * VMSNAP_ERR_MSG_MAX];
        int n = vsnprintf(all, sizeof(all), fmt, ap);
        if (n < 0)
            n = 0;
        if ((size_t)n >= sizeof(all))
            n = (int)sizeof(all) - 1;
        snprintf(all + n, sizeof(all) - (size_t)n, ": %s", strerror(code));
        vmsnap_err_set(err, code, "%s", all);
    }
    return code > 0 ? -code : -EIO;
}

int err_code(struct vmsnap_err *err, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = vset(err, code, fmt, ap);
    va_end(ap);
    return rc;
}

int err_sys(struct vmsnap_err *err, const char *fmt, ...)
{
    const int code = errno;
    va_list ap;
    va_start(ap, fmt);
    int rc = vset(err, code, fmt, ap);
    va_end(ap);
    return rc;
}

/* Prefix the message. When the whole does not fit, its middle goes (" ... "): the outermost
 * context stays at the start and the root cause (an errno string, last) at the end. */
int vmsnap_err_wrap(struct vmsnap_err *err, const char *fmt, ...)
{
    if (!err)
        return -EIO;
    if (err->code <= 0)
        err->code = EIO;
    char all[2 * VMSNAP_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    int pl = vsnprintf(all, VMSNAP_ERR_MSG_MAX, fmt, ap);
    va_end(ap);
    if (pl < 0)
        pl = 0;
    if (pl > VMSNAP_ERR_MSG_MAX - 1)
        pl = VMSNAP_ERR_MSG_MAX - 1;
    size_t ol = strnlen(err->msg, sizeof(err->msg) - 1);
    memcpy(all + pl, err->msg, ol);
    fit(err->msg, sizeof(err->msg), all, (size_t)pl + ol);
    return -err->code;
}

void vmsnap_err_clear(struct vmsnap_err *err)
{
    if (err) {
        err->code = 0;
        err->msg[0] = '\0';
    }
}

static vmsnap_log_fn log_fn;
static void *log_arg;
static enum vmsnap_log_level log_max = VMSNAP_LOG_WARN;

void vmsnap_set_log(vmsnap_log_fn fn, void *arg, enum vmsnap_log_level max_level)
{
    log_fn = fn;
    log_arg = arg;
    log_max = max_level;
}

bool vlog_enabled(enum vmsnap_log_level level)
{
    return log_fn && level <= log_max;
}

void vlog(enum vmsnap_log_level level, const char *fmt, ...)
{
    if (!vlog_enabled(level))
        return;
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    log_fn(log_arg, level, buf);
}

const char *vmsnap_version(void)
{
    return VMSNAP_VERSION;
}
