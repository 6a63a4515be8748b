/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The S3 request engine: one CURL easy handle per connection, reset (which keeps its live
 * connection) and reconfigured for every request, so a parallel stream keeps one TCP
 * connection. Every request is signed with our SigV4 signer (sigv4.c) (a gs:// store with an
 * OAuth 2.0 access token sends it as a bearer token instead) and retried with exponential
 * backoff and jitter on transport errors, 5xx, 429 and RequestTimeout, up to max_attempts per
 * request. A streaming GET is retried only until its first byte was delivered.
 *
 * Secrets: the Authorization header is built here and handed to curl only; the -v trace logs
 * method, bucket/key, query, status and time, never headers. curl's own verbose mode is never on.
 */
#include "s3_creds.h"
#include "s3_curl.h"
#include "s3_int.h"
#include "s3_pool.h"
#include "store/store_int.h"

#include "sys/sys.h"
#include "util/util.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

struct s3_conn {
    struct s3_handle *hd; /* the CURL handle and its connection (s3_pool.h) */
    uint64_t rng;
    bool broken; /* a request ended in a way that may leave the connection unusable */
};

int s3_dbuf_add(struct dbuf *b, const void *data, size_t n)
{
    if (b->len + n > b->max) {
        b->overflow = true;
        return -1;
    }
    if (grow_array(&b->p, &b->cap, b->len + n + 1, 1, 4096) < 0)
        return -1;
    memcpy(b->p + b->len, data, n);
    b->len += n;
    b->p[b->len] = '\0';
    return 0;
}

static size_t read_cb(char *buf, size_t size, size_t n, void *arg)
{
    struct req *r = arg;
    size_t want = size * n, left = r->body_len - r->body_pos;
    size_t k = want < left ? want : left;
    if (k)
        memcpy(buf, (const char *)r->body + r->body_pos, k);
    r->body_pos += k;
    return k;
}

/* libcurl rewinds the body itself when it resends a request on a connection that turned out
 * dead; without this it fails with "rewinding of the data stream failed". */
static int seek_cb(void *arg, curl_off_t off, int origin)
{
    struct req *r = arg;
    if (origin != SEEK_SET || off < 0 || (uint64_t)off > r->body_len)
        return CURL_SEEKFUNC_CANTSEEK;
    r->body_pos = (size_t)off;
    return CURL_SEEKFUNC_OK;
}

/* Acknowledge what has arrived now instead of after the delayed-ACK timer. On a kept-alive
 * connection Linux delays ACKs (40 ms), and a server that writes the response header and a small
 * body in two sends, with Nagle on (Ceph RGW does), holds the body until that ACK comes: every
 * small ranged GET took 44 ms instead of 3. TCP_QUICKACK sends the pending ACK at once; it is not
 * sticky, so it is set again on each batch of received bytes (one setsockopt per recv). */
static void quick_ack(struct req *r)
{
    if (r->sock && *r->sock >= 0) {
        int one = 1;
        (void)setsockopt(*r->sock, IPPROTO_TCP, TCP_QUICKACK, &one, sizeof(one));
    }
}

/* libcurl does not report a connection's socket during a transfer (CURLINFO_ACTIVESOCKET is -1
 * until it ends), so the connection's own socket is recorded when libcurl creates it and
 * forgotten when libcurl closes it. */
static int sock_created(void *arg, curl_socket_t fd, curlsocktype purpose)
{
    (void)purpose;
    /* close-on-exec: a connection parked between operations (s3_pool.c) must not be inherited
     * by a QEMU the same process starts later */
    (void)fcntl(fd, F_SETFD, FD_CLOEXEC);
    *(int *)arg = fd;
    return CURL_SOCKOPT_OK;
}

static int sock_close(void *arg, curl_socket_t fd)
{
    int *p = arg;
    if (*p == fd)
        *p = -1;
    return close(fd);
}

static size_t write_cb(char *buf, size_t size, size_t n, void *arg)
{
    struct req *r = arg;
    size_t len = size * n;
    quick_ack(r);
    if (r->status == 0)
        r->status = -1; /* set by the header callback; guard against its absence */
    if (r->status < 200 || r->status >= 300) {
        s3_dbuf_add(&r->errbody, buf, len); /* truncated silently at the cap */
        return len;
    }
    if (r->dst) {
        if (r->got + len > r->range_len) {
            r->cb_err = -EIO;
            return 0;
        }
        memcpy(r->dst + r->got, buf, len);
    } else if (r->resp) {
        if (s3_dbuf_add(r->resp, buf, len) < 0) {
            r->cb_err = -EFBIG;
            return 0;
        }
    } else if (r->stream_fn) {
        int rc = r->stream_fn(r->stream_arg, buf, len, r->cb_errp);
        r->delivered = true;
        if (rc < 0) {
            r->cb_err = rc;
            return 0;
        }
    }
    r->got += len;
    return len;
}

static size_t header_cb(char *buf, size_t size, size_t n, void *arg)
{
    struct req *r = arg;
    size_t len = size * n;
    if (len <= 2) { /* the blank line ending the header block: the body may be held back */
        quick_ack(r);
        return len;
    }
    if (len >= 5 && !strncmp(buf, "HTTP/", 5)) {
        /* status line of a (possibly intermediate) response */
        const char *sp = memchr(buf, ' ', len);
        if (sp && (size_t)(sp - buf) + 4 <= len)
            r->status = strtol(sp + 1, NULL, 10);
        r->etag[0] = '\0';
        r->have_length = false;
        r->have_range = false;
        return len;
    }
    const char *colon = memchr(buf, ':', len);
    if (!colon)
        return len;
    size_t nl = (size_t)(colon - buf);
    const char *v = colon + 1, *e = buf + len;
    while (v < e && (*v == ' ' || *v == '\t'))
        v++;
    while (e > v && (e[-1] == '\r' || e[-1] == '\n' || e[-1] == ' '))
        e--;
    size_t vl = (size_t)(e - v);
    if (nl == 4 && !strncasecmp(buf, "etag", 4) && vl < sizeof(r->etag)) {
        memcpy(r->etag, v, vl);
        r->etag[vl] = '\0';
    } else if (nl == 14 && !strncasecmp(buf, "content-length", 14)) {
        char tmp[24];
        if (vl > 0 && vl < sizeof(tmp)) {
            memcpy(tmp, v, vl);
            tmp[vl] = '\0';
            char *end;
            unsigned long long x = strtoull(tmp, &end, 10);
            if (!*end) {
                r->content_length = x;
                r->have_length = true;
            }
        }
    } else if (nl == 13 && !strncasecmp(buf, "content-range", 13)) {
        char tmp[80];
        unsigned long long a, b, t;
        char tail;
        if (vl < sizeof(tmp)) {
            memcpy(tmp, v, vl);
            tmp[vl] = '\0';
            if (sscanf(tmp, "bytes %llu-%llu/%llu%c", &a, &b, &t, &tail) == 3 && a <= b && b < t) {
                r->cr_first = a;
                r->cr_last = b;
                r->cr_total = t;
                r->have_range = true;
            }
        }
    }
    return len;
}

static uint64_t rng_next(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 0x2545F4914F6CDD1DULL;
}

static int cmp_q(const void *a, const void *b)
{
    const char *const *x = a, *const *y = b;
    int c = strcmp(x[0], y[0]);
    return c ? c : strcmp(x[1], y[1]);
}

/* Build the URL path (encoded) and the canonical query. */
static int build_target(const struct s3_config *cfg, const struct req *r, char *path, size_t plen,
                        char *query, size_t qlen)
{
    char enc[3 * 1024 + 1];
    if (strlen(r->key) > 1024 || sigv4_uri_encode(r->key, true, enc, sizeof(enc)) < 0)
        return -ENAMETOOLONG;
    int n;
    if (cfg->path_style)
        n = snprintf(path, plen, "/%s%s%s", cfg->bucket, *r->key ? "/" : "", enc);
    else
        n = snprintf(path, plen, "/%s", enc);
    if (n < 0 || (size_t)n >= plen)
        return -ENAMETOOLONG;
    /* encode, then sort by encoded name and value */
    enum { MAXQ = 8 };
    if (r->nq > MAXQ)
        return -EINVAL;
    char encq[MAXQ][2][3 * 1024 + 1];
    const char *pairs[MAXQ][2];
    for (size_t i = 0; i < r->nq; i++) {
        if (strlen(r->q[i].name) > 1024 || strlen(r->q[i].value) > 1024 ||
            sigv4_uri_encode(r->q[i].name, false, encq[i][0], sizeof(encq[i][0])) < 0 ||
            sigv4_uri_encode(r->q[i].value, false, encq[i][1], sizeof(encq[i][1])) < 0)
            return -ENAMETOOLONG;
        pairs[i][0] = encq[i][0];
        pairs[i][1] = encq[i][1];
    }
    qsort(pairs, r->nq, sizeof(pairs[0]), cmp_q);
    size_t o = 0;
    query[0] = '\0';
    for (size_t i = 0; i < r->nq; i++) {
        n = snprintf(query + o, qlen - o, "%s%s=%s", i ? "&" : "", pairs[i][0], pairs[i][1]);
        if (n < 0 || (size_t)n >= qlen - o)
            return -ENAMETOOLONG;
        o += (size_t)n;
    }
    return 0;
}

static void host_header(const struct s3_config *cfg, char *out, size_t len)
{
    bool v6 = strchr(cfg->host, ':') != NULL;
    char hostpart[300];
    snprintf(hostpart, sizeof(hostpart), "%s%s%s%s%s", cfg->path_style ? "" : cfg->bucket,
             cfg->path_style ? "" : ".", v6 ? "[" : "", cfg->host, v6 ? "]" : "");
    if (cfg->port)
        snprintf(out, len, "%s:%u", hostpart, cfg->port);
    else
        snprintf(out, len, "%s", hostpart);
}

static bool retryable_curl(CURLcode c)
{
    switch (c) {
    case CURLE_COULDNT_CONNECT:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_SEND_ERROR:
    case CURLE_SEND_FAIL_REWIND:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
        return true;
    default:
        return false;
    }
}

static int curl_errno(CURLcode c)
{
    switch (c) {
    case CURLE_COULDNT_CONNECT:
        return ECONNREFUSED;
    case CURLE_OPERATION_TIMEDOUT:
        return ETIMEDOUT;
    case CURLE_COULDNT_RESOLVE_HOST:
        return EHOSTUNREACH;
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CACERT_BADFILE:
        return EPROTO;
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
        return ECONNRESET; /* the connection broke: not a local I/O error (EIO) */
    default:
        return EIO;
    }
}

/* Map a non-2xx answer to -errno with a message naming the bucket and key. */
static int http_error(const struct s3_config *cfg, struct req *r, struct vmsnap_err *err)
{
    char code[128] = "", msg[256] = "";
    struct xml_span body = {r->errbody.p ? r->errbody.p : "", r->errbody.len};
    xml_child_text(body, "Code", code, sizeof(code));
    xml_child_text(body, "Message", msg, sizeof(msg));
    char where[1200];
    snprintf(where, sizeof(where), "%s://%s/%s", cfg->url_scheme, cfg->bucket, r->key);
    const char *detail = code[0] ? code : "no error code";
    if (r->status == 403 || r->status == 401)
        return vmsnap_err_set(err, EACCES,
                              "%s %s: access denied to bucket '%s' (HTTP %ld %s): check the "
                              "credentials and the bucket's permissions",
                              r->method, where, cfg->bucket, r->status, detail);
    if (r->status == 404) {
        r->no_bucket = !strcmp(code, "NoSuchBucket");
        if (r->no_bucket)
            return vmsnap_err_set(err, ENOENT, "%s %s: no such bucket '%s'", r->method, where,
                                  cfg->bucket);
        if (!strcmp(code, "NoSuchUpload"))
            return vmsnap_err_set(err, ENOENT,
                                  "%s %s: no such multipart upload (aborted meanwhile: by "
                                  "'vmsnap gc', or by another push to the same place)",
                                  r->method, where);
        return vmsnap_err_set(err, ENOENT, "%s %s: no such object", r->method, where);
    }
    if (r->status == 416) /* shorter than its own table or the manifest says */
        return vmsnap_err_set(err, EBADMSG, "%s %s: range %llu+%llu outside the object", r->method,
                              where, (unsigned long long)r->range_off,
                              (unsigned long long)r->range_len);
    if (r->status == 400 && !strcmp(code, "EntityTooSmall"))
        return vmsnap_err_set(err, EINVAL, "%s %s: part too small (%s)", r->method, where, detail);
    /* 5xx and throttling: retryable (EAGAIN); any other answer is the store's refusal (EREMOTEIO),
     * not a local I/O error */
    return vmsnap_err_set(err, r->status >= 500 || r->status == 429 ? EAGAIN : EREMOTEIO,
                          "%s %s: HTTP %ld %s%s%s", r->method, where, r->status, detail,
                          msg[0] ? ": " : "", msg);
}

static unsigned env_uint(const char *name, unsigned def)
{
    const char *v = getenv(name);
    if (v && *v) {
        long x = strtol(v, NULL, 10);
        if (x > 0)
            return (unsigned)x;
    }
    return def;
}

/* A cancel (vmsnap_cancel) aborts a request in flight and stops its retries, unless it is a
 * DELETE (an abort of a multipart upload, a removal) or its thread holds the cancel off
 * (cancel_hold: the clean-up of a failed transfer, a push past its commit): those still run. */
static bool req_abortable(const struct req *r)
{
    return strcmp(r->method, "DELETE") != 0;
}

static int abort_cb(void *arg, curl_off_t dlt, curl_off_t dln, curl_off_t ult, curl_off_t uln)
{
    (void)dlt, (void)dln;
    if (ult > 0 && uln >= ult)
        return 0; /* the body is sent: the server may have stored it; its answer says */
    return req_abortable(arg) && cancel_pending();
}

/* Where a request goes: its path and query (both signed), its Host and the whole URL. */
struct target {
    char path[4200], query[8400], host[400], url[16384];
};

static int attempt_target(const struct s3_config *cfg, const struct req *r, struct target *t,
                          struct vmsnap_err *err)
{
    int rc = build_target(cfg, r, t->path, sizeof(t->path), t->query, sizeof(t->query));
    if (rc < 0)
        return vmsnap_err_set(err, -rc, "%s://%s/%s: key or query too long", cfg->url_scheme,
                              cfg->bucket, r->key);
    host_header(cfg, t->host, sizeof(t->host));
    int un = snprintf(t->url, sizeof(t->url), "%s://%s%s%s%s", cfg->scheme, t->host, t->path,
                      t->query[0] ? "?" : "", t->query);
    if (un < 0 || (size_t)un >= sizeof(t->url))
        return vmsnap_err_set(err, ENAMETOOLONG, "%s://%s/%s: URL too long", cfg->url_scheme,
                              cfg->bucket, r->key);
    return 0;
}

/* The headers every request carries after its authorization: Expect (none), Range, the body's
 * Content-Type. */
static struct curl_slist *common_headers(struct curl_slist *hl, const struct req *r)
{
    char line[128];
    hl = curl_slist_append(hl, "Expect:");
    if (r->range_len && r->suffix) {
        snprintf(line, sizeof(line), "Range: bytes=-%llu", (unsigned long long)r->range_len);
        hl = curl_slist_append(hl, line);
    } else if (r->range_len) {
        snprintf(line, sizeof(line), "Range: bytes=%llu-%llu", (unsigned long long)r->range_off,
                 (unsigned long long)(r->range_off + r->range_len - 1));
        hl = curl_slist_append(hl, line);
    }
    if (r->has_body)
        hl = curl_slist_append(hl, "Content-Type: application/octet-stream");
    return hl;
}

/* A gs:// request with an OAuth 2.0 access token: "Authorization: Bearer", nothing signed, no
 * x-amz-date / x-amz-content-sha256; the extra x-amz-* headers under the XML API's own x-goog-*
 * names (Cloud Storage takes x-amz-* only with HMAC keys). *out for the caller to free. */
static int bearer_headers(const struct s3_cred *cr, const struct req *r, const struct target *t,
                          struct curl_slist **out, struct vmsnap_err *err)
{
    char line[4096];
    struct curl_slist *hl = NULL;
    snprintf(line, sizeof(line), "Host: %s", t->host);
    hl = curl_slist_append(hl, line);
    for (size_t i = 0; i < r->nxh && i < REQ_MAX_XH; i++) {
        const char *n = r->xh[i].name;
        bool amz = !strncmp(n, "x-amz-", 6);
        snprintf(line, sizeof(line), "%s%s: %s", amz ? "x-goog-" : "", amz ? n + 6 : n,
                 r->xh[i].value);
        hl = curl_slist_append(hl, line);
    }
    char *auth = NULL;
    const bool made = asprintf(&auth, "Authorization: Bearer %s", cr->token) >= 0;
    if (made) {
        hl = curl_slist_append(hl, auth);
        explicit_bzero(auth, strlen(auth));
        free(auth);
    }
    hl = common_headers(hl, r);
    if (!hl || !made) {
        curl_slist_free_all(hl);
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    }
    *out = hl;
    return 0;
}

/* The request's headers, signed (SigV4): *out for the caller to free. */
static int signed_headers(const struct s3_config *cfg, const struct s3_cred *cr,
                          const struct req *r, const struct target *t, struct curl_slist **out,
                          struct vmsnap_err *err)
{
    char phash[65];
    if (r->has_body && r->body_len > SIGN_BODY_MAX)
        snprintf(phash, sizeof(phash), "UNSIGNED-PAYLOAD");
    else
        sigv4_sha256_hex(r->has_body ? r->body : "", r->has_body ? r->body_len : 0, phash);
    char amzdate[20];
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(amzdate, sizeof(amzdate), "%Y%m%dT%H%M%SZ", &tm);

    struct sigv4_header sh[4 + REQ_MAX_XH] = {
        {"host", t->host}, {"x-amz-content-sha256", phash}, {"x-amz-date", amzdate}};
    size_t nsh = 3;
    if (cr->token)
        sh[nsh++] = (struct sigv4_header){"x-amz-security-token", cr->token};
    for (size_t i = 0; i < r->nxh && i < REQ_MAX_XH; i++)
        sh[nsh++] = r->xh[i];
    char auth[1024];
    struct sigv4_input in = {r->method, t->path,        t->query,      sh,
                             nsh,       phash,          amzdate,       cfg->region,
                             "s3",      cr->access_key, cr->secret_key};
    int rc = sigv4_authorization(&in, auth, sizeof(auth));
    if (rc < 0)
        return vmsnap_err_set(err, -rc, "signing request for %s://%s/%s failed", cfg->url_scheme,
                              cfg->bucket, r->key);

    struct curl_slist *hl = NULL;
    char line[4096]; /* an x-amz-copy-source of a 1024-byte key encodes to ~3.1 KB */
    snprintf(line, sizeof(line), "Host: %s", t->host);
    hl = curl_slist_append(hl, line);
    snprintf(line, sizeof(line), "x-amz-content-sha256: %s", phash);
    hl = curl_slist_append(hl, line);
    snprintf(line, sizeof(line), "x-amz-date: %s", amzdate);
    hl = curl_slist_append(hl, line);
    if (cr->token && strlen(cr->token) < sizeof(line) - 32) {
        snprintf(line, sizeof(line), "x-amz-security-token: %s", cr->token);
        hl = curl_slist_append(hl, line);
    }
    for (size_t i = 0; i < r->nxh && i < REQ_MAX_XH; i++) {
        snprintf(line, sizeof(line), "%s: %s", r->xh[i].name, r->xh[i].value);
        hl = curl_slist_append(hl, line);
    }
    snprintf(line, sizeof(line), "Authorization: %s", auth);
    hl = curl_slist_append(hl, line);
    explicit_bzero(line, sizeof(line));
    explicit_bzero(auth, sizeof(auth));
    hl = common_headers(hl, r);
    if (!hl)
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    *out = hl;
    return 0;
}

/* The connection's handle set up for one attempt of `r` (reset first: nothing of the request
 * before stays), and the request's per-attempt state cleared. */
static void setup_handle(struct s3_conn *sc, const struct s3_config *cfg, struct req *r,
                         const char *url, struct curl_slist *hl)
{
    CURL *h = sc->hd->h;
    curl_easy_reset(h);
    if (sc->hd->share)
        curl_easy_setopt(h, CURLOPT_SHARE, sc->hd->share);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hl);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(h, CURLOPT_SOCKOPTFUNCTION, sock_created);
    curl_easy_setopt(h, CURLOPT_SOCKOPTDATA, &sc->hd->fd);
    curl_easy_setopt(h, CURLOPT_CLOSESOCKETFUNCTION, sock_close);
    curl_easy_setopt(h, CURLOPT_CLOSESOCKETDATA, &sc->hd->fd);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS,
                     (long)env_uint("VMSNAP_S3_CONNECT_TIMEOUT_MS", 10000));
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, (long)env_uint("VMSNAP_S3_STALL_SECONDS", 30));
    const struct s3_tls tls = {cfg->ca_file, cfg->ca_path, cfg->insecure_tls};
    s3_curl_common(h, &tls); /* TLS trust and the User-Agent */
    curl_easy_setopt(h, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_1_1);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, write_cb);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, r);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, header_cb);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, r);
    curl_easy_setopt(h, CURLOPT_BUFFERSIZE, 256L * 1024);
    curl_easy_setopt(h, CURLOPT_UPLOAD_BUFFERSIZE, 1024L * 1024);
    if (!strcmp(r->method, "HEAD")) {
        curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
    } else if (r->has_body || !strcmp(r->method, "POST")) {
        curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
        curl_easy_setopt(h, CURLOPT_READFUNCTION, read_cb);
        curl_easy_setopt(h, CURLOPT_READDATA, r);
        curl_easy_setopt(h, CURLOPT_SEEKFUNCTION, seek_cb);
        curl_easy_setopt(h, CURLOPT_SEEKDATA, r);
        curl_easy_setopt(h, CURLOPT_INFILESIZE_LARGE, (curl_off_t)r->body_len);
        curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, r->method);
    } else if (strcmp(r->method, "GET")) {
        curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, r->method);
    }

    r->sock = &sc->hd->fd;
    r->body_pos = 0;
    r->got = 0;
    r->status = 0;
    r->cb_err = 0;
    r->etag[0] = '\0';
    r->have_length = false;
    r->have_range = false;
    r->no_bucket = false;
    r->errbody.len = 0;
    if (r->resp)
        r->resp->len = 0;
    curl_easy_setopt(h, CURLOPT_NOPROGRESS, req_abortable(r) ? 0L : 1L);
    curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, abort_cb);
    curl_easy_setopt(h, CURLOPT_XFERINFODATA, r);
}

/* What an attempt's answer means: 0 for a 2xx, 1 for "retry", <0 for a final error (err
 * filled). */
static int attempt_outcome(const struct s3_config *cfg, struct req *r, CURLcode cc,
                           struct vmsnap_err *err)
{
    if (cc == CURLE_ABORTED_BY_CALLBACK && cancel_check(err) < 0)
        return -ECANCELED;
    if (r->cb_err) {
        if (r->cb_err == -EFBIG)
            return vmsnap_err_set(err, EFBIG, "%s %s/%s: answer larger than %u bytes", r->method,
                                  cfg->bucket, r->key, RESP_CAP);
        if (r->dst && r->status == 200)
            return vmsnap_err_set(err, EPROTO,
                                  "GET %s://%s/%s: the server ignored the Range header (HTTP 200 "
                                  "with more than the %llu bytes asked for); vmsnap needs a store "
                                  "that serves byte ranges%s",
                                  cfg->url_scheme, cfg->bucket, r->key,
                                  (unsigned long long)r->range_len,
                                  r->suffix ? ", including suffix ranges (bytes=-N)" : "");
        if (r->dst)
            return vmsnap_err_set(err, EIO, "GET %s://%s/%s: more bytes than the %llu requested",
                                  cfg->url_scheme, cfg->bucket, r->key,
                                  (unsigned long long)r->range_len);
        return r->cb_err; /* stream_fn filled err */
    }
    if (cc != CURLE_OK) {
        /* where it went, when the connection is what failed (a wrong AWS_ENDPOINT_URL, a host
         * down: the URL alone does not say) */
        char where[480] = "";
        if (cc == CURLE_COULDNT_CONNECT || cc == CURLE_COULDNT_RESOLVE_HOST ||
            cc == CURLE_SSL_CONNECT_ERROR || cc == CURLE_OPERATION_TIMEDOUT ||
            cc == CURLE_PEER_FAILED_VERIFICATION) {
            char hp[300];
            host_header(cfg, hp, sizeof(hp));
            snprintf(where, sizeof(where), " (endpoint %s://%s)", cfg->scheme, hp);
        }
        if (r->stream_fn && r->delivered)
            return vmsnap_err_set(err, curl_errno(cc), "GET %s://%s/%s: %s%s (after data)",
                                  cfg->url_scheme, cfg->bucket, r->key, curl_easy_strerror(cc),
                                  where);
        if (cc == CURLE_PEER_FAILED_VERIFICATION)
            snprintf(where + strlen(where), sizeof(where) - strlen(where),
                     ": its certificate is not trusted (give its CA with --ca-bundle FILE or "
                     "AWS_CA_BUNDLE)");
        int ec =
            vmsnap_err_set(err, curl_errno(cc), "%s %s://%s/%s: %s%s", r->method, cfg->url_scheme,
                           cfg->bucket, r->key, curl_easy_strerror(cc), where);
        return retryable_curl(cc) ? 1 : ec;
    }
    if (r->status >= 200 && r->status < 300) {
        /* CompleteMultipartUpload may answer 200 with an <Error> body */
        if (r->resp && r->resp->p && strstr(r->resp->p, "<Error>")) {
            r->errbody.len = 0;
            s3_dbuf_add(&r->errbody, r->resp->p, r->resp->len);
            r->status = 500;
            http_error(cfg, r, err);
            return 1;
        }
        return 0;
    }
    char code[64] = "";
    struct xml_span body = {r->errbody.p ? r->errbody.p : "", r->errbody.len};
    xml_child_text(body, "Code", code, sizeof(code));
    if (r->status >= 500 || r->status == 429 || !strcmp(code, "RequestTimeout") ||
        !strcmp(code, "SlowDown")) {
        if (r->stream_fn && r->delivered)
            return http_error(cfg, r, err);
        http_error(cfg, r, err);
        return 1;
    }
    return http_error(cfg, r, err);
}

/* One attempt. Returns 0 for a 2xx, 1 for "retry", <0 for a final error (err filled). */
static int attempt(struct vmsnap_store_conn *c, struct req *r, struct vmsnap_err *err)
{
    const struct s3_config *cfg = &c->st->s3;
    struct s3_conn *sc = c->impl;
    struct target t;
    struct curl_slist *hl = NULL;
    struct s3_cred *cr = NULL;
    int rc = attempt_target(cfg, r, &t, err);
    if (rc == 0)
        rc = s3_creds_get(cfg->creds, &cr, err); /* refreshed here when due */
    if (rc == 0 && cr->bearer)
        rc = bearer_headers(cr, r, &t, &hl, err);
    else if (rc == 0)
        rc = signed_headers(cfg, cr, r, &t, &hl, err);
    s3_cred_put(cr);
    if (rc < 0)
        return rc;
    setup_handle(sc, cfg, r, t.url, hl);
    double t0 = mono_now();
    CURLcode cc = curl_easy_perform(sc->hd->h);
    curl_slist_free_all(hl);
    long status = 0, connects = 0;
    curl_easy_getinfo(sc->hd->h, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_getinfo(sc->hd->h, CURLINFO_NUM_CONNECTS, &connects);
    s3_pool_count(connects > 0 ? (uint64_t)connects : 0);
    if (cc != CURLE_OK)
        sc->broken = true; /* libcurl closes a failed connection; park nothing doubtful */
    if (status)
        r->status = status;
    vlog(VMSNAP_LOG_DEBUG, "s3: %s %s/%s%s%s -> %ld%s%s (%.3f s)", r->method, cfg->bucket, r->key,
         t.query[0] ? "?" : "", t.query, r->status, cc ? " curl: " : "",
         cc ? curl_easy_strerror(cc) : "", mono_now() - t0);
    return attempt_outcome(cfg, r, cc, err);
}

int s3_perform(struct vmsnap_store_conn *c, struct req *r, struct vmsnap_err *err)
{
    struct vmsnap_err own = {0};
    if (!err) /* the retry lines still say why */
        err = &own;
    const struct s3_config *cfg = &c->st->s3;
    struct s3_conn *sc = c->impl;
    r->errbody.max = ERRBODY_CAP;
    r->cb_errp = err;
    unsigned delay = cfg->backoff_ms;
    int rc = 0;
    for (unsigned a = 1;; a++) {
        rc = attempt(c, r, err);
        if (rc <= 0)
            break;
        if (req_abortable(r) && (rc = cancel_check(err)) < 0)
            break;
        if (a >= (c->one_attempt ? 1 : cfg->max_attempts)) {
            vmsnap_err_wrap(err, "gave up after %u attempts: ", a);
            rc = -err_code_or(err, EIO); /* 5xx to the end stays EAGAIN: retryable later */
            break;
        }
        /* full jitter in [delay/2, delay] */
        unsigned j = delay / 2 + (unsigned)(rng_next(&sc->rng) % (delay / 2 + 1));
        vlog(VMSNAP_LOG_INFO, "s3: retry %u/%u of %s %s/%s in %u ms (%s)", a, cfg->max_attempts - 1,
             r->method, cfg->bucket, r->key, j, err->msg);
        for (unsigned left = j; left > 0 && !(req_abortable(r) && cancel_pending());) {
            unsigned k = left < 100 ? left : 100; /* a cancel is seen within 0.1 s */
            sys_sleep_ms(k);
            left -= k;
        }
        if (req_abortable(r) && (rc = cancel_check(err)) < 0)
            break;
        delay = delay * 2 > BACKOFF_CAP_MS ? BACKOFF_CAP_MS : delay * 2;
    }
    free(r->errbody.p);
    r->errbody.p = NULL;
    c->no_bucket = r->no_bucket;
    if (rc == 0)
        vmsnap_err_clear(err);
    return rc;
}

/* Where a connection of this store goes, and how: a parked handle is only handed to a store
 * connection of the same origin (s3_pool.c). */
static void conn_origin(const struct s3_config *cfg, char *out, size_t len)
{
    snprintf(out, len, "%s://%s:%u/%s|%d|%d|%s|%s", cfg->scheme, cfg->host, cfg->port,
             cfg->path_style ? "" : cfg->bucket, cfg->path_style, cfg->insecure_tls,
             cfg->ca_file ? cfg->ca_file : "", cfg->ca_path ? cfg->ca_path : "");
}

int s3_conn_new(struct vmsnap_store *st, struct vmsnap_store_conn *c, struct vmsnap_err *err)
{
    struct s3_conn *sc = calloc(1, sizeof(*sc));
    if (!sc)
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    char origin[sizeof(sc->hd->origin)];
    conn_origin(&st->s3, origin, sizeof(origin));
    int rc = s3_handle_get(origin, &sc->hd, err);
    if (rc < 0) {
        free(sc);
        return rc;
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    sc->rng = ((uint64_t)ts.tv_nsec << 20) ^ (uint64_t)(uintptr_t)sc ^ (uint64_t)getpid() ^ 1;
    c->impl = sc;
    return 0;
}

void s3_conn_free(struct vmsnap_store_conn *c)
{
    struct s3_conn *sc = c->impl;
    if (sc) {
        s3_handle_put(sc->hd, !sc->broken);
        free(sc);
    }
}
