/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The transfer context (options, store, pool, progress) and what every operation shares: keys,
 * digests in hex, a source over an object's tail, manifest reads, key checks.
 */
#include "xfer_int.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static void fill_defaults(struct vmsnap_xfer_opts *o, const struct vmsnap_xfer_opts *in)
{
    static const struct vmsnap_xfer_opts zero;
    *o = in ? *in : zero;
    if (!o->connections)
        o->connections = VMSNAP_XFER_DEFAULT_CONNECTIONS;
    if (!o->part_size)
        o->part_size = VMSNAP_XFER_DEFAULT_PART_SIZE;
    if (!o->max_memory)
        o->max_memory = VMSNAP_XFER_DEFAULT_MAX_MEMORY;
    if (!o->max_size)
        o->max_size = VMSNAP_IMAGE_DEFAULT_MAX_SIZE;
}

void xfer_progress_add(struct xfer *x, uint64_t bytes, uint64_t total_add)
{
    if (!x->o.progress)
        return;
    pthread_mutex_lock(&x->mu);
    x->done += bytes;
    x->total += total_add;
    x->o.progress(x->o.progress_arg, x->done, x->total > x->done ? x->total : x->done);
    pthread_mutex_unlock(&x->mu);
}

/* A local prefix (ls, gc) is a directory that exists: a mistyped path is not an empty store
 * (S3 cannot tell: a prefix without objects is just empty). */
static int local_prefix_exists(struct xfer *x, const char *url, struct vmsnap_err *err)
{
    if (vmsnap_store_kind(x->st) != VMSNAP_STORE_LOCAL || !*x->key)
        return 0;
    char *dir = vmsnap_store_local_path(x->st, x->key);
    struct stat sb;
    int rc = 0;
    if (!dir)
        rc = vmsnap_err_set(err, ENOMEM, "out of memory");
    else if (stat(dir, &sb) < 0)
        rc = err_sys(err, "%s", url);
    else if (!S_ISDIR(sb.st_mode))
        rc = vmsnap_err_set(err, ENOTDIR,
                            "%s: not a directory of sets (an object: 'vmsnap inspect' or "
                            "'vmsnap pull' it)",
                            url);
    free(dir);
    return rc;
}

/* The store, the options and the URL's key, and the checks every operation makes of them: the
 * options the store takes, no local set or prefix entered through a link, with XFER_KEY a key
 * given, with XFER_PREFIX a local prefix that is a directory. On failure nothing stays open. */
int xfer_open(struct xfer *x, const char *url, const struct vmsnap_xfer_opts *opts, unsigned flags,
              struct vmsnap_err *err)
{
    memset(x, 0, sizeof(*x));
    fill_defaults(&x->o, opts);
    if (x->o.connections > 256)
        return vmsnap_err_set(err, EINVAL, "at most 256 connections");
    int rc = vmsnap_store_open(url, &x->o.store, &x->st, &x->key, err);
    if (rc < 0)
        return rc;
    /* Local store: the directory a URL names (a set's, or the prefix of ls and gc) is not
     * entered through a symbolic link: one planted in a shared store pulled another tenant's
     * set with its manifest as this one, and rm of it emptied the set it points at. The
     * directories above it are the user's path, links included. */
    struct stat lsb;
    char *lp = *x->key ? vmsnap_store_local_path(x->st, x->key) : NULL;
    if (lp && lstat(lp, &lsb) == 0 && S_ISLNK(lsb.st_mode) && stat(lp, &lsb) == 0 &&
        S_ISDIR(lsb.st_mode))
        rc = vmsnap_err_set(err, EINVAL,
                            "%s is a symbolic link to a directory: a set or prefix is not read or "
                            "changed through a link (name the directory itself)",
                            url);
    free(lp);
    if (rc == 0 && vmsnap_store_kind(x->st) == VMSNAP_STORE_S3 &&
        x->o.part_size < VMSNAP_STORE_MIN_PART)
        rc = vmsnap_err_set(err, EINVAL, "part size must be at least 5 MiB for S3");
    if (rc < 0) {
        vmsnap_store_free(x->st);
        free(x->key);
        return rc;
    }
    pthread_mutex_init(&x->mu, NULL);
    pthread_cond_init(&x->cv_dec, NULL);
    x->max_decoding = x->o.threads ? x->o.threads : sys_cpus();
    if ((flags & XFER_KEY) && !*x->key)
        rc = vmsnap_err_set(err, EINVAL, "%s: a key (a path inside the bucket) is needed", url);
    else if (flags & XFER_PREFIX)
        rc = local_prefix_exists(x, url, err);
    if (rc < 0)
        xfer_close(x);
    return rc;
}

int xfer_conn(struct xfer *x, struct vmsnap_err *err)
{
    return vmsnap_store_conn_new(x->st, &x->ctl, err);
}

int xfer_start_pool(struct xfer *x, struct vmsnap_err *err)
{
    int rc = xpool_init(&x->pool, x->st, x->o.connections, x->o.max_memory, x->o.budget, err);
    x->pool_started = rc == 0;
    return rc;
}

void xfer_close(struct xfer *x)
{
    vmsnap_store_conn_free(x->ctl);
    if (x->pool_started)
        xpool_fini(&x->pool);
    pthread_mutex_destroy(&x->mu);
    pthread_cond_destroy(&x->cv_dec);
    vmsnap_store_free(x->st);
    free(x->base_key);
    free(x->key);
}

/* A pool task of a job (an upload's part, a download's group) about to start: it is skipped when
 * the job failed already (*job_rc, read under `mu`) or after a cancel (queued work does not go
 * out then: *rc and *e say so). */
bool xfer_task_skip(pthread_mutex_t *mu, const int *job_rc, int *rc, struct vmsnap_err *e)
{
    pthread_mutex_lock(mu);
    bool skip = *job_rc != 0;
    pthread_mutex_unlock(mu);
    if (!skip && (*rc = cancel_check(e)) < 0)
        skip = true;
    return skip;
}

/* The tableSha256 of an opened image with a seek table, in hex: SHA-256 of its first bytes and
 * its seek table, the very bytes the table was parsed from (the manifest's "tableSha256"). */
int xfer_table_sha256(const struct vmsnap_image *img, char hex[65], struct vmsnap_err *err)
{
    const void *pre, *tab;
    size_t pl, tl;
    vmsnap_image_raw(img, &pre, &pl, &tab, &tl);
    unsigned char md[32];
    unsigned mdl = 0;
    EVP_MD_CTX *sha = EVP_MD_CTX_new();
    bool ok = sha && EVP_DigestInit_ex(sha, EVP_sha256(), NULL) && EVP_DigestUpdate(sha, pre, pl) &&
              EVP_DigestUpdate(sha, tab, tl) && EVP_DigestFinal_ex(sha, md, &mdl);
    EVP_MD_CTX_free(sha);
    if (!ok)
        return vmsnap_err_set(err, ENOMEM, "sha256 context");
    xfer_hex32(md, hex);
    return 0;
}

/* The key of a set file's object: "<prefix>/<name>.zstd" (malloc'd; NULL when out of memory). */
char *xfer_object_key(const char *prefix, const char *name)
{
    size_t n = strlen(prefix) + strlen(name) + sizeof(OBJECT_SUFFIX) + 1;
    char *k = malloc(n);
    if (k)
        snprintf(k, n, "%s%s%s" OBJECT_SUFFIX, prefix, *prefix ? "/" : "", name);
    return k;
}

/* Delete `key` in one attempt: no back-off between the caller's check (a listing) and the
 * DELETE. */
int xfer_delete_once(struct vmsnap_store_conn *c, const char *key, struct vmsnap_err *err)
{
    vmsnap_store_conn_one_attempt(c, true);
    int rc = vmsnap_store_delete(c, key, err);
    vmsnap_store_conn_one_attempt(c, false);
    return rc;
}

void xfer_guarded_backoff(unsigned *delay_ms)
{
    if (!*delay_ms)
        *delay_ms = 200;
    for (unsigned left = *delay_ms; left > 0 && !cancel_pending();) {
        unsigned k = left < 100 ? left : 100; /* a cancel is seen within 0.1 s */
        sys_sleep_ms(k);
        left -= k;
    }
    *delay_ms *= 2;
}

char *xfer_join_key(const char *prefix, const char *name)
{
    size_t n = strlen(prefix) + strlen(name) + 2;
    char *k = malloc(n);
    if (k)
        snprintf(k, n, "%s%s%s", prefix, *prefix ? "/" : "", name);
    return k;
}

void xfer_hex32(const unsigned char *md, char out[65])
{
    static const char d[] = "0123456789abcdef";
    for (int i = 0; i < 32; i++) {
        out[2 * i] = d[md[i] >> 4];
        out[2 * i + 1] = d[md[i] & 15];
    }
    out[64] = '\0';
}

int xfer_tail_pread(void *arg, void *buf, size_t len, uint64_t off, struct vmsnap_err *err)
{
    struct tail_src *t = arg;
    if (!t->buf && len > 0 && t->size > 0 && (t->size <= TAIL_READ || off + len == t->size)) {
        size_t n = t->size < TAIL_READ ? (size_t)t->size : TAIL_READ;
        uint8_t *b = malloc(n);
        if (!b)
            return vmsnap_err_set(err, ENOMEM, "out of memory");
        int rc = vmsnap_store_get(t->c, t->key, t->size - n, n, b, err);
        if (rc < 0) {
            free(b);
            return rc;
        }
        t->buf = b;
        t->boff = t->size - n;
        t->blen = n;
    }
    if (t->buf && off >= t->boff && len <= t->blen && off - t->boff <= t->blen - len) {
        memcpy(buf, t->buf + (off - t->boff), len);
        return 0;
    }
    if (t->pre && len <= t->plen && off <= t->plen - len) {
        memcpy(buf, t->pre + off, len);
        return 0;
    }
    return vmsnap_store_get(t->c, t->key, off, len, buf, err);
}

/* The last component of a key. */
const char *xfer_key_base(const char *key)
{
    const char *sl = strrchr(key, '/');
    return sl ? sl + 1 : key;
}

/* 1 when `key` exists, 0 when it does not, < 0 on an error (one GET of its last byte). */
int xfer_key_exists(struct vmsnap_store_conn *c, const char *key, struct vmsnap_err *err)
{
    char probe[1];
    size_t got = 0;
    uint64_t size = 0;
    int rc = vmsnap_store_get_tail(c, key, sizeof(probe), probe, &got, &size, err);
    if (rc == -ENOENT) {
        vmsnap_err_clear(err);
        return 0;
    }
    return rc < 0 ? rc : 1;
}

/* Can `key` be stored? S3 takes keys of at most 1024 bytes; the local store, names of at most
 * NAME_MAX bytes in paths of less than PATH_MAX (less what its temporary names add). */
int xfer_key_fits(const struct xfer *x, const char *key, struct vmsnap_err *err)
{
    char u[URL_BUF];
    vmsnap_store_url(x->st, key, u, sizeof(u));
    if (vmsnap_store_kind(x->st) == VMSNAP_STORE_S3) {
        if (strlen(key) > 1024)
            return vmsnap_err_set(err, ENAMETOOLONG, "%s: key of %zu bytes, S3 takes at most 1024",
                                  u, strlen(key));
        return 0;
    }
    if (strlen(u) + 32 >= PATH_MAX)
        return vmsnap_err_set(err, ENAMETOOLONG, "%s: path too long for the local store", u);
    for (const char *p = u; *p;) {
        size_t n = strcspn(p, "/");
        /* the last name also gets its upload's temporary beside it, `.<name>.mpu-XXXXXX` */
        size_t room = p[n] ? NAME_MAX : NAME_MAX - 12;
        if (n > room)
            return vmsnap_err_set(err, ENAMETOOLONG, "%s: a name longer than %zu bytes", u, room);
        p += n + (p[n] == '/');
    }
    return 0;
}

/* Read a small object whole (a manifest, a push mark: `what` in errors). One GET of its last
 * TAIL_READ bytes (the whole of any usual one) gives its size too; one larger than that (at most
 * VMSNAP_XFER_MANIFEST_MAX: else -EFBIG and *too_large) is read whole in one more GET rather than
 * splicing the front onto the tail, so an object replaced between the two requests cannot be half
 * one version and half the other (a longer replacement arrives truncated and fails to parse);
 * *two_gets then. On success *buf (malloc'd, one byte to spare) holds its *len bytes. */
int xfer_read_small(struct vmsnap_store_conn *c, const char *key, const char *url, const char *what,
                    char **buf, size_t *len, bool *too_large, bool *two_gets,
                    struct vmsnap_err *err)
{
    *too_large = *two_gets = false;
    char *b = malloc(TAIL_READ + 1);
    if (!b)
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    size_t got;
    uint64_t size;
    int rc = vmsnap_store_get_tail(c, key, TAIL_READ, b, &got, &size, err);
    if (rc == 0 && size > VMSNAP_XFER_MANIFEST_MAX) {
        rc = vmsnap_err_set(err, EFBIG, "%s: %s of %llu bytes is too large", url, what,
                            (unsigned long long)size);
        *too_large = true;
    }
    if (rc == 0 && got < size) {
        *two_gets = true;
        free(b);
        b = malloc(size + 1);
        if (!b)
            rc = vmsnap_err_set(err, ENOMEM, "out of memory");
        else
            rc = vmsnap_store_get(c, key, 0, size, b, err);
    }
    if (rc < 0) {
        free(b);
        return rc;
    }
    *buf = b;
    *len = (size_t)size;
    return 0;
}

/* Read and parse the manifest `mkey` (`murl` in errors); when `raw` is not NULL, its bytes too
 * (the caller frees them); and *unusable (when not NULL): the store answered with bytes that are
 * not a manifest vmsnap can use (too large, or not one), rather than failing to answer. */
int xfer_read_manifest_x(struct vmsnap_store_conn *c, const char *mkey, const char *murl,
                         uint64_t max_size, struct manifest *m, char **raw, size_t *raw_len,
                         bool *unusable, struct vmsnap_err *err)
{
    char *buf = NULL;
    size_t len = 0;
    bool too_large, two_gets;
    int rc = xfer_read_small(c, mkey, murl, "manifest", &buf, &len, &too_large, &two_gets, err);
    if (unusable)
        *unusable = too_large;
    /* read in two GETs, a manifest replaced in between arrives cut (its parse fails): that is
     * not damage to replace, but another push's set (taken for corrupt, it was un-committed) */
    if (rc == 0 && (rc = manifest_parse(buf, len, murl, max_size, m, err)) < 0 && unusable)
        *unusable = rc != -ENOMEM && !two_gets;
    if (rc == 0 && raw) {
        *raw = buf;
        *raw_len = len;
        return 0;
    }
    free(buf);
    return rc;
}

int xfer_read_manifest(struct vmsnap_store_conn *c, const char *mkey, const char *murl,
                       uint64_t max_size, struct manifest *m, struct vmsnap_err *err)
{
    return xfer_read_manifest_x(c, mkey, murl, max_size, m, NULL, NULL, NULL, err);
}

int xfer_sha256_hex(const void *buf, size_t len, char hex[65], struct vmsnap_err *err)
{
    EVP_MD_CTX *c = EVP_MD_CTX_new();
    unsigned char md[32];
    unsigned mdl = 0;
    bool ok = c && EVP_DigestInit_ex(c, EVP_sha256(), NULL) && EVP_DigestUpdate(c, buf, len) &&
              EVP_DigestFinal_ex(c, md, &mdl);
    EVP_MD_CTX_free(c);
    if (!ok)
        return vmsnap_err_set(err, ENOMEM, "sha256");
    xfer_hex32(md, hex);
    return 0;
}
