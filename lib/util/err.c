/* SPDX-License-Identifier: Apache-2.0 */
/* Error values and the log callback (see include/vmsnap/common.h). */
#include "util/util.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

int vmsnap_err_set(struct vmsnap_err *err, int code, const char *fmt, ...)
{
    if (code <= 0)
        code = EIO;
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
        va_end(ap);
        err->code = code;
    }
    return -code;
}

int vmsnap_err_wrap(struct vmsnap_err *err, const char *fmt, ...)
{
    if (!err)
        return -EIO;
    if (err->code <= 0)
        err->code = EIO;
    char prefix[VMSNAP_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof(prefix), fmt, ap);
    va_end(ap);
    char old[VMSNAP_ERR_MSG_MAX];
    memcpy(old, err->msg, sizeof(old));
    old[sizeof(old) - 1] = '\0';
    size_t pl = strnlen(prefix, sizeof(err->msg) - 1);
    memcpy(err->msg, prefix, pl);
    size_t ol = strnlen(old, sizeof(err->msg) - 1 - pl);
    memcpy(err->msg + pl, old, ol);
    err->msg[pl + ol] = '\0';
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
