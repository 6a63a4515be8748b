/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Store front end: URL parsing, configuration from options and the environment, and dispatch to
 * the backend table. Keys are validated here once (no NUL, no empty, "." or ".." components) so
 * the backends can trust them.
 */
#include "store_int.h"

#include "sys/sys.h"

#include "util/util.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

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

/* What a URL names, by its scheme: the one place store URLs are told apart. */
enum url_kind {
    URL_LOCAL,       /* a path, or file://... */
    URL_S3,          /* s3://bucket/key */
    URL_GS,          /* gs://bucket/key */
    URL_UNSUPPORTED, /* another scheme:// */
    URL_MISTYPED,    /* s3:/b/k, s3:b/k, file:/x: a mistyped URL, not a directory named "s3:" */
};

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

static enum url_kind url_kind(const char *url)
{
    if (!strncmp(url, "s3://", 5))
        return URL_S3;
    if (!strncmp(url, "gs://", 5))
        return URL_GS;
    if (!strncmp(url, "file://", 7))
        return URL_LOCAL;
    if (strstr(url, "://"))
        return URL_UNSUPPORTED;
    return scheme_like(url) ? URL_MISTYPED : URL_LOCAL;
}

bool vmsnap_store_url_remote(const char *url)
{
    enum url_kind k = url_kind(url);
    return k == URL_S3 || k == URL_GS || k == URL_UNSUPPORTED;
}

static int open_local(struct vmsnap_store *st, const char *url, char **key, struct vmsnap_err *err)
{
    const char *path = !strncmp(url, "file://", 7) ? url + 7 : url;
    st->kind = VMSNAP_STORE_LOCAL;
    st->ops = &store_local_ops;
    st->root = strdup("/");
    if (path != url && path[0] != '/')
        return vmsnap_err_set(err, EINVAL, "%s: file URLs must be file:///absolute/path", url);
    if (!st->root)
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    return local_key(path, key, err);
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
    switch (url_kind(url)) {
    case URL_S3:
    case URL_GS:
        st->kind = VMSNAP_STORE_S3;
        st->ops = &store_s3_ops;
        rc = s3_config_open(st, url, url[0] == 'g', o, key, err);
        break;
    case URL_UNSUPPORTED:
        rc = vmsnap_err_set(err, EINVAL,
                            "%s: unsupported URL scheme (use a path, file:///abs, s3:// or gs://)",
                            url);
        break;
    case URL_MISTYPED:
        rc = vmsnap_err_set(err, EINVAL,
                            "%s: a mistyped URL? (s3://bucket/key, gs://bucket/key, "
                            "file:///abs); a local path whose first component has a colon is "
                            "written ./%s",
                            url, url);
        break;
    default:
        rc = open_local(st, url, key, err);
        break;
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
    s3_config_fini(&st->s3);
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

static bool same_str(const char *a, const char *b)
{
    return (!a && !b) || (a && b && !strcmp(a, b));
}

bool vmsnap_store_same(const struct vmsnap_store *a, const struct vmsnap_store *b)
{
    const struct s3_config *x = &a->s3, *y = &b->s3;
    return a->kind == b->kind &&
           (a->kind == VMSNAP_STORE_LOCAL ||
            (same_str(x->url_scheme, y->url_scheme) && same_str(x->host, y->host) &&
             x->port == y->port && same_str(x->bucket, y->bucket)));
}

char *vmsnap_store_local_path(const struct vmsnap_store *st, const char *key)
{
    return st->kind == VMSNAP_STORE_LOCAL ? store_local_path(st, key) : NULL;
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

struct vmsnap_store *vmsnap_store_conn_store(const struct vmsnap_store_conn *c)
{
    return c->st;
}

void vmsnap_store_conn_one_attempt(struct vmsnap_store_conn *c, bool on)
{
    c->one_attempt = on;
}

bool vmsnap_store_conn_list_skipped(const struct vmsnap_store_conn *c)
{
    return c->list_skipped;
}

bool vmsnap_store_conn_no_bucket(const struct vmsnap_store_conn *c)
{
    return c->no_bucket;
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

int vmsnap_store_mpu_last_part(struct vmsnap_store_conn *c, const char *key, const char *upload_id,
                               int64_t *last, struct vmsnap_err *err)
{
    *last = -1;
    return c->st->ops->mpu_last_part ? c->st->ops->mpu_last_part(c, key, upload_id, last, err) : 0;
}

int vmsnap_store_list_uploads(struct vmsnap_store_conn *c, const char *prefix,
                              vmsnap_store_upload_fn fn, void *arg, struct vmsnap_err *err)
{
    return c->st->ops->list_uploads(c, prefix, fn, arg, err);
}
