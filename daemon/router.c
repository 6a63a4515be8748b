/* SPDX-License-Identifier: Apache-2.0 */
/* The route table: method + path pattern -> handler. A pattern's "{x}" matches one non-empty
 * segment, percent-decoded (a decoded '/' or NUL is refused); nothing else is a wildcard. An
 * unknown path is 404, a known path with another method 405 (with the methods it takes in the
 * message). Pure: no I/O of its own, driven by http.c and by the fuzz target. */
#include "daemon.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef void (*handler_fn)(struct d_request *rq, struct d_response *rs);

static const struct route {
    const char *method, *pattern;
    handler_fn fn;
} routes[] = {
    {"GET", "/healthz", r_healthz},
    {"GET", "/readyz", r_readyz},
    {"GET", "/metrics", r_metrics},
    {"GET", "/v1/version", r_version},
    {"GET", "/v1/operations", r_ops_list},
    {"GET", "/v1/operations/{id}", r_op_get},
    {"DELETE", "/v1/operations/{id}", r_op_cancel},
    {"POST", "/v1/disks/create", r_disk_create},
    {"POST", "/v1/disks/clone", r_disk_clone},
    {"GET", "/v1/disks/info", r_disk_info},
    {"POST", "/v1/sets/push", r_set_push},
    {"POST", "/v1/sets/pull", r_set_pull},
    {"GET", "/v1/sets", r_set_list},
    {"POST", "/v1/sets/remove", r_set_remove},
    {"POST", "/v1/sets/gc", r_set_gc},
    {"POST", "/v1/sets/export", r_set_export},
    {"GET", "/v1/pcache/stat", r_pcache_stat},
    {"POST", "/v1/pcache/evict", r_pcache_evict},
    {"GET", "/v1/objcache", r_objcache_stat},
    {"POST", "/v1/objcache/trim", r_objcache_trim},
    {"GET", "/v1/vms", r_vm_list},
    {"POST", "/v1/vms", r_vm_run},
    {"GET", "/v1/vms/{name}", r_vm_info},
    {"POST", "/v1/vms/{name}/{action}", r_vm_action},
};
#define N_ROUTES (sizeof(routes) / sizeof(routes[0]))

const char *d_route_pattern(size_t i, const char **method)
{
    if (i >= N_ROUTES)
        return NULL;
    *method = routes[i].method;
    return routes[i].pattern;
}

json_object *d_obj(void)
{
    json_object *o = json_object_new_object();
    json_object_object_add(o, "schema", json_object_new_int(1));
    return o;
}

json_object *d_seconds(double s)
{
    char b[32];
    snprintf(b, sizeof(b), "%.3f", s);
    return json_object_new_double_s(atof(b), b);
}

void d_error(struct d_response *rs, int rc, const struct vmsnap_err *err, bool cancelled)
{
    int e = rc < 0 ? -rc : rc;
    int code = d_exit_code(rc, cancelled);
    json_object_put(rs->body);
    free(rs->text);
    rs->text = NULL;
    rs->status = d_http_status(code, e);
    rs->body = d_obj();
    json_object *o = json_object_new_object();
    json_object_object_add(o, "code", json_object_new_int(code));
    json_object_object_add(o, "class", json_object_new_string(d_class_name(code, e)));
    json_object_object_add(o, "message",
                           json_object_new_string(err && err->msg[0] ? err->msg : "failed"));
    const char *en = e && e != D_EUSAGE ? strerrorname_np(e) : NULL;
    json_object_object_add(o, "errno", en ? json_object_new_string(en) : NULL);
    json_object_object_add(rs->body, "error", o);
}

void d_error_msg(struct d_response *rs, int rc, const char *fmt, ...)
{
    struct vmsnap_err e = {0};
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e.msg, sizeof(e.msg), fmt, ap);
    va_end(ap);
    d_error(rs, rc, &e, false);
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* Does `path` match `pat`? Parameters go to rq->params, decoded into rq->pbuf. */
static bool match(const char *pat, const char *path, struct d_request *rq)
{
    size_t used = 0;
    rq->n_params = 0;
    while (*pat && *path) {
        if (pat[0] == '{') {
            const char *pe = strchr(pat, '}');
            const char *se = strchrnul(path, '/');
            if (!pe || se == path || rq->n_params >= 4)
                return false;
            char *dst = rq->pbuf + used;
            size_t n = 0;
            for (const char *p = path; p < se; p++) {
                int c = (unsigned char)*p;
                if (c == '%') {
                    int hi = p + 2 < se ? hexval(p[1]) : -1, lo = hi >= 0 ? hexval(p[2]) : -1;
                    if (lo < 0)
                        return false;
                    c = hi * 16 + lo;
                    p += 2;
                }
                if (c == 0 || c == '/' || used + n + 1 >= sizeof(rq->pbuf))
                    return false;
                dst[n++] = (char)c;
            }
            dst[n] = '\0';
            used += n + 1;
            rq->params[rq->n_params++] = dst;
            pat = pe + 1;
            path = se;
            continue;
        }
        if (*pat != *path)
            return false;
        pat++;
        path++;
    }
    return !*pat && !*path;
}

void d_route(struct d_request *rq, struct d_response *rs)
{
    char allowed[64] = "";
    for (size_t i = 0; i < N_ROUTES; i++) {
        if (!match(routes[i].pattern, rq->path, rq))
            continue;
        if (!strcmp(routes[i].method, rq->method)) {
            rs->status = 200;
            routes[i].fn(rq, rs);
            return;
        }
        size_t n = strlen(allowed);
        snprintf(allowed + n, sizeof(allowed) - n, "%s%s", n ? ", " : "", routes[i].method);
    }
    rq->n_params = 0;
    if (allowed[0]) {
        d_error_msg(rs, -D_EUSAGE, "%s %s: method not allowed (%s)", rq->method, rq->path, allowed);
        rs->status = 405;
        return;
    }
    d_error_msg(rs, -ENOENT, "%s: no such path", rq->path);
}

const char *d_query(const struct d_request *rq, const char *key, char *buf, size_t len)
{
    size_t kl = strlen(key);
    for (const char *p = rq->query; p && *p;) {
        const char *amp = strchrnul(p, '&');
        if (!strncmp(p, key, kl) && (p[kl] == '=' || p + kl == amp)) {
            const char *v = p[kl] == '=' ? p + kl + 1 : amp;
            size_t n = 0;
            for (; v < amp && n + 1 < len; v++) {
                int c = (unsigned char)*v;
                if (c == '%' && v + 2 < amp + 0 + 1 && hexval(v[1]) >= 0 && hexval(v[2]) >= 0) {
                    c = hexval(v[1]) * 16 + hexval(v[2]);
                    v += 2;
                } else if (c == '+') {
                    c = ' ';
                }
                if (c == 0)
                    return NULL;
                buf[n++] = (char)c;
            }
            buf[n] = '\0';
            return buf;
        }
        p = *amp ? amp + 1 : amp;
    }
    return NULL;
}
