/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Store front end: URL parsing, configuration from options and the environment, and dispatch to
 * the backend table. Keys are validated here once (no NUL, no empty, "." or ".." components) so
 * the backends can trust them.
 */
#include "store_int.h"

#include "sys/sys.h"

#include "util/util.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

bool store_host_is_ip(const char *host)
{
    unsigned char buf[16];
    if (!strcasecmp(host, "localhost"))
        return true;
    if (inet_pton(AF_INET, host, buf) == 1 || inet_pton(AF_INET6, host, buf) == 1)
        return true;
    return false;
}

static char *xstrndup(const char *s, size_t n)
{
    char *p = malloc(n + 1);
    if (p) {
        memcpy(p, s, n);
        p[n] = '\0';
    }
    return p;
}

/* Keys: '/'-separated components, none empty, "." or "..". "" is the store root. */
static bool key_ok(const char *key)
{
    if (!*key)
        return true;
    const char *p = key;
    for (;;) {
        const char *e = strchr(p, '/');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if (n == 0 || (n == 1 && p[0] == '.') || (n == 2 && p[0] == '.' && p[1] == '.'))
            return false;
        if (!e)
            return true;
        p = e + 1;
    }
}

/* A local path as a key relative to "/" (sys_lexical_path: "." dropped, ".." pops). */
static int local_key(const char *path, char **key, struct vmsnap_err *err)
{
    char buf[PATH_MAX];
    int rc = sys_lexical_path(path, buf, sizeof(buf));
    if (rc < 0)
        return err_code(err, -rc, "%s", path);
    *key = strdup(buf + 1);
    return *key ? 0 : vmsnap_err_set(err, ENOMEM, "out of memory");
}

static int dupset(char **dst, const char *src, struct vmsnap_err *err)
{
    *dst = src ? strdup(src) : NULL;
    if (src && !*dst)
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    return 0;
}

static const char *env(const char *name)
{
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

/* "http[s]://host[:port][/]" into the config. */
static int parse_endpoint(struct s3_config *c, const char *ep, struct vmsnap_err *err)
{
    const char *p;
    if (!strncasecmp(ep, "https://", 8)) {
        c->scheme = strdup("https");
        p = ep + 8;
    } else if (!strncasecmp(ep, "http://", 7)) {
        c->scheme = strdup("http");
        p = ep + 7;
    } else {
        return vmsnap_err_set(err, EINVAL, "endpoint '%s': expected http://HOST[:PORT] or https://",
                              ep);
    }
    /* user:password@ is not echoed back (it may be a secret) and not taken: credentials come
     * from the environment, and curl would read such a host as credentials for another one */
    if (memchr(p, '@', strcspn(p, "/")))
        return vmsnap_err_set(err, EINVAL,
                              "endpoint: credentials in the URL (USER[:PASSWORD]@) are not "
                              "supported; give keys in AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY");
    const char *hs = p, *he;
    const bool v6 = *p == '[';
    if (v6) {
        he = strchr(p, ']');
        if (!he)
            return vmsnap_err_set(err, EINVAL, "endpoint '%s': unterminated [IPv6]", ep);
        hs = p + 1;
        p = he + 1;
    } else {
        he = p + strcspn(p, ":/");
        p = he;
    }
    if (he == hs)
        return vmsnap_err_set(err, EINVAL, "endpoint '%s': no host", ep);
    for (const char *q = hs; q < he; q++)
        if (!isalnum((unsigned char)*q) && !strchr(v6 ? ":." : ".-_", *q))
            return vmsnap_err_set(err, EINVAL, "endpoint '%s': bad character in the host name", ep);
    c->host = xstrndup(hs, (size_t)(he - hs));
    if (*p == ':') {
        char *end;
        unsigned long port = strtoul(p + 1, &end, 10);
        if (end == p + 1 || port == 0 || port > 65535 || (*end && strcmp(end, "/")))
            return vmsnap_err_set(err, EINVAL, "endpoint '%s': bad port", ep);
        c->port = (unsigned)port;
    } else if (*p && strcmp(p, "/")) {
        return vmsnap_err_set(err, EINVAL, "endpoint '%s': a path is not supported", ep);
    }
    if (!c->scheme || !c->host)
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    return 0;
}

static bool bucket_ok(const char *b)
{
    size_t n = strlen(b);
    if (n < 3 || n > 63)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!((b[i] >= 'a' && b[i] <= 'z') || (b[i] >= '0' && b[i] <= '9') || b[i] == '-' ||
              b[i] == '.' || b[i] == '_'))
            return false;
    return true;
}

static int open_s3(struct vmsnap_store *st, const char *url, bool gs,
                   const struct vmsnap_store_opts *o, char **key, struct vmsnap_err *err)
{
    struct s3_config *c = &st->s3;
    const char *rest = url + 5;
    const char *slash = strchr(rest, '/');
    size_t blen = slash ? (size_t)(slash - rest) : strlen(rest);
    c->bucket = xstrndup(rest, blen);
    if (!c->bucket)
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    if (!bucket_ok(c->bucket))
        return vmsnap_err_set(err, EINVAL, "%s: bad bucket name '%s'", url, c->bucket);
    const char *k = slash ? slash + 1 : "";
    size_t klen = strlen(k);
    while (klen > 0 && k[klen - 1] == '/')
        klen--;
    *key = xstrndup(k, klen);
    if (!*key)
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    c->url_scheme = gs ? "gs" : "s3";

    const char *ep =
        o->endpoint ? o->endpoint : (gs ? env("VMSNAP_GS_ENDPOINT") : env("AWS_ENDPOINT_URL"));
    const char *region = o->region ? o->region : env("AWS_REGION");
    if (!region)
        region = env("AWS_DEFAULT_REGION");
    if (!region)
        region = gs ? "auto" : "us-east-1";
    if (dupset(&c->region, region, err) < 0)
        return -ENOMEM;
    char defep[256];
    if (!ep) {
        if (gs)
            snprintf(defep, sizeof(defep), "https://storage.googleapis.com");
        else
            snprintf(defep, sizeof(defep), "https://s3.%s.amazonaws.com", region);
        ep = defep;
    }
    int rc = parse_endpoint(c, ep, err);
    if (rc < 0)
        return rc;
    const char *ps = env("AWS_S3_USE_PATH_STYLE");
    c->path_style = o->path_style || (ps && !strcasecmp(ps, "true")) || store_host_is_ip(c->host) ||
                    strchr(c->bucket, '.') != NULL;
    c->insecure_tls = o->insecure_tls;
    /* an explicit --retries wins over the environment's default (it lost to it) */
    c->max_attempts = o->max_attempts ? o->max_attempts : 6;
    const char *att = env("VMSNAP_S3_ATTEMPTS");
    if (!o->max_attempts && att && atoi(att) > 0)
        c->max_attempts = (unsigned)atoi(att);
    c->backoff_ms = o->backoff_ms ? o->backoff_ms : 200;

    const char *ak = gs ? env("GS_ACCESS_KEY_ID") : NULL;
    const char *sk = gs ? env("GS_SECRET_ACCESS_KEY") : NULL;
    if (!ak || !sk) {
        ak = env("AWS_ACCESS_KEY_ID");
        sk = env("AWS_SECRET_ACCESS_KEY");
    }
    if (!ak || !sk)
        return vmsnap_err_set(err, EACCES,
                              "%s: no credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY",
                              url);
    if (dupset(&c->access_key, ak, err) < 0 || dupset(&c->secret_key, sk, err) < 0 ||
        dupset(&c->session_token, gs ? NULL : env("AWS_SESSION_TOKEN"), err) < 0)
        return -ENOMEM;
    return s3_global_init(err);
}

/* Does `s` start with a scheme a store URL could have and a colon ("s3:", "File:")? Other
 * colons are a path's (snap-2026-01-01T10:00, vm1:mem). */
static bool scheme_like(const char *s)
{
    static const char *const schemes[] = {"s3:", "gs:", "file:", "http:", "https:"};
    for (size_t i = 0; i < sizeof(schemes) / sizeof(schemes[0]); i++)
        if (!strncasecmp(s, schemes[i], strlen(schemes[i])))
            return true;
    return false;
}

int vmsnap_store_open(const char *url, const struct vmsnap_store_opts *opts,
                      struct vmsnap_store **out, char **key, struct vmsnap_err *err)
{
    static const struct vmsnap_store_opts defaults;
    const struct vmsnap_store_opts *o = opts ? opts : &defaults;
    *out = NULL;
    *key = NULL;
    if (!url || !*url)
        return vmsnap_err_set(err, EINVAL, "empty URL");
    struct vmsnap_store *st = calloc(1, sizeof(*st));
    if (!st)
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    int rc;
    if (!strncmp(url, "s3://", 5) || !strncmp(url, "gs://", 5)) {
        st->kind = VMSNAP_STORE_S3;
        st->ops = &store_s3_ops;
        rc = open_s3(st, url, url[0] == 'g', o, key, err);
    } else if (strstr(url, "://") && strncmp(url, "file://", 7)) {
        rc = vmsnap_err_set(err, EINVAL,
                            "%s: unsupported URL scheme (use a path, file:///abs, s3:// or gs://)",
                            url);
    } else if (scheme_like(url) && strncmp(url, "file://", 7)) {
        /* s3:/b/k, s3:b/k, file:/x: a mistyped URL, not a directory named "s3:" */
        rc = vmsnap_err_set(err, EINVAL,
                            "%s: a mistyped URL? (s3://bucket/key, gs://bucket/key, "
                            "file:///abs); a local path whose first component has a colon is "
                            "written ./%s",
                            url, url);
    } else {
        const char *path = !strncmp(url, "file://", 7) ? url + 7 : url;
        st->kind = VMSNAP_STORE_LOCAL;
        st->ops = &store_local_ops;
        st->root = strdup("/");
        if (path != url && path[0] != '/')
            rc = vmsnap_err_set(err, EINVAL, "%s: file URLs must be file:///absolute/path", url);
        else if (!st->root)
            rc = vmsnap_err_set(err, ENOMEM, "out of memory");
        else
            rc = local_key(path, key, err);
    }
    if (rc == 0 && !key_ok(*key))
        rc = vmsnap_err_set(err, EINVAL, "%s: bad key (empty, '.' or '..' component)", url);
    if (rc < 0) {
        free(*key);
        *key = NULL;
        vmsnap_store_free(st);
        return rc;
    }
    *out = st;
    return 0;
}

void vmsnap_store_free(struct vmsnap_store *st)
{
    if (!st)
        return;
    struct s3_config *c = &st->s3;
    free(c->scheme);
    free(c->host);
    free(c->bucket);
    free(c->region);
    free(c->access_key);
    if (c->secret_key) {
        explicit_bzero(c->secret_key, strlen(c->secret_key));
        free(c->secret_key);
    }
    free(c->session_token);
    free(st->root);
    free(st);
}

enum vmsnap_store_kind vmsnap_store_kind(const struct vmsnap_store *st)
{
    return st->kind;
}

const char *vmsnap_store_url(const struct vmsnap_store *st, const char *key, char *buf, size_t len)
{
    if (st->kind == VMSNAP_STORE_S3)
        snprintf(buf, len, "%s://%s/%s", st->s3.url_scheme, st->s3.bucket, key);
    else
        snprintf(buf, len, "/%s", key);
    return buf;
}

char *store_local_path(const struct vmsnap_store *st, const char *key)
{
    size_t n = strlen(st->root) + strlen(key) + 2;
    char *p = malloc(n);
    if (p)
        snprintf(p, n, "%s%s%s", st->root, st->root[strlen(st->root) - 1] == '/' ? "" : "/", key);
    return p;
}

void vmsnap_store_global_cleanup(void)
{
    s3_global_cleanup();
}

int vmsnap_store_conn_new(struct vmsnap_store *st, struct vmsnap_store_conn **out,
                          struct vmsnap_err *err)
{
    struct vmsnap_store_conn *c = calloc(1, sizeof(*c));
    if (!c)
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    c->st = st;
    int rc = st->ops->conn_new ? st->ops->conn_new(st, c, err) : 0;
    if (rc < 0) {
        free(c);
        return rc;
    }
    *out = c;
    return 0;
}

void vmsnap_store_conn_free(struct vmsnap_store_conn *c)
{
    if (!c)
        return;
    if (c->st->ops->conn_free)
        c->st->ops->conn_free(c);
    free(c);
}

#define CHECK_KEY(k)                                                                               \
    do {                                                                                           \
        if (!(k) || !key_ok(k))                                                                    \
            return vmsnap_err_set(err, EINVAL, "bad object key '%s'", (k) ? (k) : "(null)");       \
    } while (0)

int vmsnap_store_put(struct vmsnap_store_conn *c, const char *key, const void *buf, size_t len,
                     struct vmsnap_err *err)
{
    CHECK_KEY(key);
    return c->st->ops->put(c, key, buf, len, err);
}

int vmsnap_store_mpu_create(struct vmsnap_store_conn *c, const char *key, char **upload_id,
                            struct vmsnap_err *err)
{
    CHECK_KEY(key);
    return c->st->ops->mpu_create(c, key, upload_id, err);
}

int vmsnap_store_mpu_part(struct vmsnap_store_conn *c, const char *key, const char *upload_id,
                          uint32_t number, uint64_t offset, const void *buf, size_t len,
                          struct vmsnap_store_part *out, struct vmsnap_err *err)
{
    CHECK_KEY(key);
    if (number < 1 || number > VMSNAP_STORE_MAX_PARTS)
        return vmsnap_err_set(err, EINVAL, "part number %u out of range", number);
    return c->st->ops->mpu_part(c, key, upload_id, number, offset, buf, len, out, err);
}

int vmsnap_store_mpu_complete(struct vmsnap_store_conn *c, const char *key, const char *upload_id,
                              const struct vmsnap_store_part *parts, uint32_t nparts,
                              struct vmsnap_err *err)
{
    CHECK_KEY(key);
    return c->st->ops->mpu_complete(c, key, upload_id, parts, nparts, err);
}

int vmsnap_store_mpu_abort(struct vmsnap_store_conn *c, const char *key, const char *upload_id,
                           struct vmsnap_err *err)
{
    CHECK_KEY(key);
    return c->st->ops->mpu_abort(c, key, upload_id, err);
}

int vmsnap_store_get(struct vmsnap_store_conn *c, const char *key, uint64_t off, size_t len,
                     void *buf, struct vmsnap_err *err)
{
    CHECK_KEY(key);
    if (len == 0)
        return 0;
    return c->st->ops->get(c, key, off, len, buf, err);
}

int vmsnap_store_get_tail(struct vmsnap_store_conn *c, const char *key, size_t len, void *buf,
                          size_t *got, uint64_t *size, struct vmsnap_err *err)
{
    CHECK_KEY(key);
    *got = 0;
    *size = 0;
    if (len == 0)
        return vmsnap_err_set(err, EINVAL, "get_tail: zero length");
    return c->st->ops->get_tail(c, key, len, buf, got, size, err);
}

int vmsnap_store_get_stream(struct vmsnap_store_conn *c, const char *key, vmsnap_store_data_fn fn,
                            void *arg, struct vmsnap_err *err)
{
    CHECK_KEY(key);
    return c->st->ops->get_stream(c, key, fn, arg, err);
}

int vmsnap_store_head(struct vmsnap_store_conn *c, const char *key, uint64_t *size,
                      struct vmsnap_err *err)
{
    CHECK_KEY(key);
    return c->st->ops->head(c, key, size, NULL, err);
}

int vmsnap_store_head_etag(struct vmsnap_store_conn *c, const char *key, uint64_t *size,
                           char etag[VMSNAP_STORE_ETAG_MAX], struct vmsnap_err *err)
{
    CHECK_KEY(key);
    return c->st->ops->head(c, key, size, etag, err);
}

int vmsnap_store_mpu_part_copy(struct vmsnap_store_conn *c, const char *key, const char *upload_id,
                               uint32_t number, uint64_t offset, const char *src_key,
                               const char *src_etag, uint64_t src_off, uint64_t len,
                               struct vmsnap_store_part *out, struct vmsnap_err *err)
{
    CHECK_KEY(key);
    CHECK_KEY(src_key);
    if (number < 1 || number > VMSNAP_STORE_MAX_PARTS)
        return vmsnap_err_set(err, EINVAL, "part number %u out of range", number);
    if (len == 0 || len > VMSNAP_STORE_MAX_PART)
        return vmsnap_err_set(err, EINVAL, "copy of %llu bytes: not a valid part size",
                              (unsigned long long)len);
    return c->st->ops->mpu_part_copy(c, key, upload_id, number, offset, src_key, src_etag, src_off,
                                     len, out, err);
}

int vmsnap_store_delete(struct vmsnap_store_conn *c, const char *key, struct vmsnap_err *err)
{
    CHECK_KEY(key);
    return c->st->ops->del(c, key, err);
}

void vmsnap_store_tidy(struct vmsnap_store_conn *c, const char *prefix)
{
    if (c->st->ops->tidy && prefix && *prefix)
        c->st->ops->tidy(c, prefix);
}

int vmsnap_store_list(struct vmsnap_store_conn *c, const char *prefix, vmsnap_store_list_fn fn,
                      void *arg, struct vmsnap_err *err)
{
    return c->st->ops->list(c, prefix, fn, arg, err);
}

int vmsnap_store_list_uploads(struct vmsnap_store_conn *c, const char *prefix,
                              vmsnap_store_upload_fn fn, void *arg, struct vmsnap_err *err)
{
    return c->st->ops->list_uploads(c, prefix, fn, arg, err);
}
