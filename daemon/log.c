/* SPDX-License-Identifier: Apache-2.0 */
/* Structured logs: one JSON object per line on stderr (journald keeps them as they are), with
 * the request id, or the operation id of the thread's cancellation scope for the library's own
 * lines (the library logs from its worker threads too; they run under the operation's scope).
 * One write(2) per line: lines from several threads never interleave. */
#include "daemon.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int max_level = VMSNAP_LOG_INFO;
static const char *const level_names[] = {"error", "warn", "info", "debug"};

void d_log_init(int level)
{
    max_level = level;
}

static void emit(json_object *o)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    json_object_object_add(o, "ts", d_seconds((double)ts.tv_sec + ts.tv_nsec / 1e9));
    size_t n;
    const char *s = json_object_to_json_string_length(
        o, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE, &n);
    char line[8192];
    if (n >= sizeof(line) - 1)
        n = sizeof(line) - 2;
    memcpy(line, s, n);
    line[n++] = '\n';
    if (write(STDERR_FILENO, line, n) < 0)
        n = 0;
}

__attribute__((format(printf, 4, 0))) static void
vemit(enum vmsnap_log_level level, const char *id, const char *kind, const char *fmt, va_list ap)
{
    if ((int)level > max_level)
        return;
    char msg[2048];
    vsnprintf(msg, sizeof(msg), fmt, ap);
    json_object *o = json_object_new_object();
    json_object_object_add(o, "level", json_object_new_string(level_names[level]));
    if (kind)
        json_object_object_add(o, "source", json_object_new_string(kind));
    if (id)
        json_object_object_add(o, "request_id", json_object_new_string(id));
    json_object_object_add(o, "msg", json_object_new_string(msg));
    emit(o);
    json_object_put(o);
}

void d_log(enum vmsnap_log_level level, const char *req_id, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vemit(level, req_id, NULL, fmt, ap);
    va_end(ap);
}

__attribute__((format(printf, 3, 4))) static void lib_line(enum vmsnap_log_level level,
                                                           const char *id, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vemit(level, id, "lib", fmt, ap);
    va_end(ap);
}

void d_log_lib(void *arg, enum vmsnap_log_level level, const char *msg)
{
    (void)arg;
    lib_line(level, vmsnap_scope_arg(), "%s", msg);
}

void d_log_access(const struct d_request *rq, unsigned status, double seconds)
{
    if (max_level < VMSNAP_LOG_INFO)
        return;
    json_object *o = json_object_new_object();
    json_object_object_add(o, "level", json_object_new_string("info"));
    json_object_object_add(o, "request_id", json_object_new_string(rq->id));
    json_object_object_add(o, "method", json_object_new_string(rq->method));
    json_object_object_add(o, "path", json_object_new_string(rq->path));
    json_object_object_add(o, "status", json_object_new_int((int)status));
    json_object_object_add(o, "seconds", d_seconds(seconds));
    emit(o);
    json_object_put(o);
}
