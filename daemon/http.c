/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The HTTP side, through libmicrohttpd: one thread per connection (at most max_connections),
 * the daemon's own listening unix socket (MHD_OPTION_LISTEN_SOCKET), headers within the
 * per-connection memory limit (MHD answers 431/413 beyond it), bodies up to body_max (413
 * beyond, the rest read and dropped). The path is passed to the router as sent (percent escapes
 * kept: the router decodes a parameter once, so an escaped '/' cannot split one). Every answer
 * carries X-Request-Id, and one JSON access line goes to the log.
 */
#include "daemon.h"

#include <errno.h>
#include <fcntl.h>
#include <microhttpd.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct conn {
    char *body;
    size_t len;
    bool too_big;
    char *query; /* rebuilt from MHD's (not unescaped) arguments */
    size_t qlen;
    double t0;
    char id[D_REQ_ID_LEN];
};

struct d_http {
    struct MHD_Daemon *mhd;
    struct d_ctx *ctx;
    size_t body_max;
    atomic_uint in_flight;
};

static double mono(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void req_id(char out[D_REQ_ID_LEN])
{
    static _Thread_local uint64_t state;
    if (!state) {
        int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
        if (fd < 0 || read(fd, &state, sizeof(state)) != (ssize_t)sizeof(state))
            state = (uint64_t)(mono() * 1e9) ^ (uint64_t)getpid();
        if (fd >= 0)
            close(fd);
        state |= 1;
    }
    state ^= state >> 12; /* xorshift64* */
    state ^= state << 25;
    state ^= state >> 27;
    snprintf(out, D_REQ_ID_LEN, "%016llx", (unsigned long long)(state * 0x2545F4914F6CDD1Dull));
}

static size_t no_unescape(void *cls, struct MHD_Connection *c, char *s)
{
    (void)cls;
    (void)c;
    return strlen(s);
}

static enum MHD_Result add_arg(void *cls, enum MHD_ValueKind kind, const char *key,
                               const char *value)
{
    (void)kind;
    struct conn *cn = cls;
    size_t need = strlen(key) + (value ? strlen(value) + 1 : 0) + 2;
    if (cn->qlen + need > 8192)
        return MHD_NO;
    char *q = realloc(cn->query, cn->qlen + need);
    if (!q)
        return MHD_NO;
    cn->query = q;
    cn->qlen += (size_t)sprintf(q + cn->qlen, "%s%s%s%s", cn->qlen ? "&" : "", key,
                                value ? "=" : "", value ? value : "");
    return MHD_YES;
}

static enum MHD_Result respond(struct MHD_Connection *mc, struct d_request *rq,
                               struct d_response *rs)
{
    char *text = rs->text;
    size_t n;
    if (!text) {
        if (!rs->body)
            rs->body = d_obj();
        if (rs->status >= 400)
            json_object_object_add(rs->body, "request_id", json_object_new_string(rq->id));
        const char *s = json_object_to_json_string_length(
            rs->body, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE, &n);
        text = malloc(n + 2);
        if (text) {
            memcpy(text, s, n);
            text[n++] = '\n';
            text[n] = '\0';
        }
        rs->content_type = "application/json";
    } else {
        rs->text = NULL;
        n = strlen(text);
    }
    if (!text)
        return MHD_NO;
    struct MHD_Response *r = MHD_create_response_from_buffer(n, text, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(text);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", rs->content_type);
    MHD_add_response_header(r, "X-Request-Id", rq->id);
    MHD_add_response_header(r, "Cache-Control", "no-store");
    if (rs->retry_after) {
        char ra[16];
        snprintf(ra, sizeof(ra), "%u", rs->retry_after);
        MHD_add_response_header(r, "Retry-After", ra);
    }
    enum MHD_Result ret = MHD_queue_response(mc, rs->status, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *mc, const char *url,
                              const char *method, const char *version, const char *upload,
                              size_t *upload_size, void **con_cls)
{
    (void)version;
    struct d_http *h = cls;
    struct conn *cn = *con_cls;
    if (!cn) {
        cn = calloc(1, sizeof(*cn));
        if (!cn)
            return MHD_NO;
        cn->t0 = mono();
        req_id(cn->id);
        atomic_fetch_add(&h->in_flight, 1);
        *con_cls = cn;
        return MHD_YES;
    }
    if (*upload_size) {
        if (!cn->too_big && cn->len + *upload_size <= h->body_max) {
            char *b = realloc(cn->body, cn->len + *upload_size + 1);
            if (!b)
                return MHD_NO;
            memcpy(b + cn->len, upload, *upload_size);
            cn->body = b;
            cn->len += *upload_size;
        } else {
            cn->too_big = true; /* read on and drop: the answer is 413 */
        }
        *upload_size = 0;
        return MHD_YES;
    }
    struct d_request rq = {
        .method = method, .path = url, .body = cn->body, .body_len = cn->len, .ctx = h->ctx};
    memcpy(rq.id, cn->id, sizeof(rq.id));
    struct d_response rs = {.status = 200};
    if (MHD_get_connection_values(mc, MHD_GET_ARGUMENT_KIND, add_arg, cn) < 0 ||
        (cn->query && strlen(cn->query) != cn->qlen)) {
        d_error_msg(&rs, -D_EUSAGE, "query string: more than 8 KiB");
    } else if (cn->too_big) {
        d_error_msg(&rs, -D_EUSAGE, "request body: more than %zu bytes (body_max)", h->body_max);
        rs.status = 413;
    } else {
        rq.query = cn->query;
        d_route(&rq, &rs);
    }
    d_metrics_request(d_ctx_metrics(h->ctx), rs.status);
    d_log_access(&rq, rs.status, mono() - cn->t0);
    enum MHD_Result ret = respond(mc, &rq, &rs);
    json_object_put(rs.body);
    free(rs.text);
    return ret;
}

static void completed(void *cls, struct MHD_Connection *mc, void **con_cls,
                      enum MHD_RequestTerminationCode toe)
{
    (void)mc;
    (void)toe;
    struct d_http *h = cls;
    struct conn *cn = *con_cls;
    if (!cn)
        return;
    free(cn->body);
    free(cn->query);
    free(cn);
    *con_cls = NULL;
    atomic_fetch_sub(&h->in_flight, 1);
}

struct d_http *d_http_start(struct d_ctx *ctx, int listen_fd, struct vmsnap_err *err)
{
    const struct d_config *cfg = d_ctx_config(ctx);
    struct d_http *h = calloc(1, sizeof(*h));
    if (!h) {
        vmsnap_err_set(err, ENOMEM, "out of memory");
        return NULL;
    }
    h->ctx = ctx;
    h->body_max = cfg->body_max;
    h->mhd = MHD_start_daemon(
        MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ITC |
            MHD_USE_POLL,
        0, NULL, NULL, handle, h, MHD_OPTION_LISTEN_SOCKET, listen_fd,
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, cfg->header_mem, MHD_OPTION_CONNECTION_LIMIT,
        cfg->max_connections, MHD_OPTION_CONNECTION_TIMEOUT, 60u, MHD_OPTION_NOTIFY_COMPLETED,
        completed, h, MHD_OPTION_UNESCAPE_CALLBACK, no_unescape, NULL, MHD_OPTION_END);
    if (!h->mhd) {
        vmsnap_err_set(err, EIO, "libmicrohttpd: could not start on the socket");
        free(h);
        return NULL;
    }
    return h;
}

/* Stop accepting; let the requests in progress end (at most `timeout` seconds). */
void d_http_quiesce(struct d_http *h, double timeout)
{
    int fd = MHD_quiesce_daemon(h->mhd);
    if (fd >= 0)
        close(fd);
    double end = mono() + timeout;
    while (atomic_load(&h->in_flight) > 0 && mono() < end) {
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

void d_http_stop(struct d_http *h)
{
    if (!h)
        return;
    MHD_stop_daemon(h->mhd);
    free(h);
}
