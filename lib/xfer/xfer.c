/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Push and pull of snapshot files and sets (see include/vmsnap/xfer.h).
 *
 * Push: the codec runs in a producer thread and writes its object in order into a sink that
 * hashes its head and seek table (the manifest's tableSha256) and cuts it into parts; a full part
 * is handed whole to the worker pool, whose threads each own one store connection. A full buffer is
 * flushed only when more bytes arrive, so an object of at most one part is a single PutObject.
 * Parts are part_size bytes (doubled every 2,500 parts to stay under S3's 10,000) and every part
 * buffer is taken from the pool's byte budget before it is allocated: when uploads fall behind the
 * encoder blocks, memory does not grow. Sets run up to two producers (files in parallel), the
 * largest files first, sharing one pool (connections are reused across files).
 *
 * Pull: one suffix-range GET gives the size, footer and seek table (no HEAD); the object is cut
 * into groups of whole frames of about 16 MiB (the first group starts at byte 0, the last ends at
 * the object's end, so together they cover every byte), each fetched by one GET on a pool thread,
 * decoded there (at most `threads` decodes at once, the codec's own buffers being per frame)
 * and pwritten into the sparse temporary file. Groups are hashed in object order as they
 * complete; a group's buffer is released once hashed, so the budget also bounds reordering.
 */
#include "sys/crypto_dl.h"
#include "manifest_int.h"
#include "store/store_int.h"
#include "xfer_int.h"

#include "sys/sys.h"
#include "vmsnap/xfer.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#define GROUP_TARGET (16ull << 20)
#define PART_DOUBLING 2500u
#define MAX_PRODUCERS 2u

struct xfer {
    struct vmsnap_store *st;
    char *base_key;           /* opts.base as a key in st (NULL: none) */
    atomic_uint base_used;    /* files pushed with their base */
    atomic_bool base_why_set; /* base_why holds why a file's base was not used */
    char base_why[320];
    struct xpool pool;
    struct vmsnap_xfer_opts o;
    pthread_mutex_t mu;
    pthread_cond_t cv_dec;
    unsigned decoding, max_decoding;
    uint64_t done, total;
};

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

static void progress_add(struct xfer *x, uint64_t bytes, uint64_t total_add)
{
    if (!x->o.progress)
        return;
    pthread_mutex_lock(&x->mu);
    x->done += bytes;
    x->total += total_add;
    x->o.progress(x->o.progress_arg, x->done, x->total > x->done ? x->total : x->done);
    pthread_mutex_unlock(&x->mu);
}

static int xfer_init(struct xfer *x, const char *url, const struct vmsnap_xfer_opts *opts,
                     char **key, struct vmsnap_err *err)
{
    memset(x, 0, sizeof(*x));
    fill_defaults(&x->o, opts);
    if (x->o.connections > 256)
        return vmsnap_err_set(err, EINVAL, "at most 256 connections");
    int rc = vmsnap_store_open(url, &x->o.store, &x->st, key, err);
    if (rc < 0)
        return rc;
    /* Local store: the directory a URL names (a set's, or the prefix of ls and gc) is not
     * entered through a symbolic link: one planted in a shared store pulled another tenant's
     * set with its manifest as this one, and rm of it emptied the set it points at. The
     * directories above it are the user's path, links included. */
    struct stat lsb;
    char *lp = x->st->kind == VMSNAP_STORE_LOCAL && **key ? store_local_path(x->st, *key) : NULL;
    if (lp && lstat(lp, &lsb) == 0 && S_ISLNK(lsb.st_mode) && stat(lp, &lsb) == 0 &&
        S_ISDIR(lsb.st_mode))
        rc = vmsnap_err_set(err, EINVAL,
                            "%s is a symbolic link to a directory: a set or prefix is not read or "
                            "changed through a link (name the directory itself)",
                            url);
    free(lp);
    if (rc < 0) {
        vmsnap_store_free(x->st);
        free(*key);
        *key = NULL;
        return rc;
    }
    if (x->st->kind == VMSNAP_STORE_S3 && x->o.part_size < VMSNAP_STORE_MIN_PART) {
        vmsnap_store_free(x->st);
        free(*key);
        *key = NULL;
        return vmsnap_err_set(err, EINVAL, "part size must be at least 5 MiB for S3");
    }
    pthread_mutex_init(&x->mu, NULL);
    pthread_cond_init(&x->cv_dec, NULL);
    x->max_decoding = x->o.threads ? x->o.threads : sys_cpus();
    return 0;
}

static int xfer_start_pool(struct xfer *x, struct vmsnap_err *err)
{
    return xpool_init(&x->pool, x->st, x->o.connections, x->o.max_memory, err);
}

static void xfer_fini(struct xfer *x, bool pool_started)
{
    if (pool_started)
        xpool_fini(&x->pool);
    pthread_mutex_destroy(&x->mu);
    pthread_cond_destroy(&x->cv_dec);
    vmsnap_store_free(x->st);
    free(x->base_key);
}

static char *join_key(const char *prefix, const char *name)
{
    size_t n = strlen(prefix) + strlen(name) + 2;
    char *k = malloc(n);
    if (k)
        snprintf(k, n, "%s%s%s", prefix, *prefix ? "/" : "", name);
    return k;
}

static void hex32(const unsigned char *md, char out[65])
{
    static const char d[] = "0123456789abcdef";
    for (int i = 0; i < 32; i++) {
        out[2 * i] = d[md[i] >> 4];
        out[2 * i + 1] = d[md[i] & 15];
    }
    out[64] = '\0';
}

/* A source over an object for opening it (vmsnap_image_open) with ranged GETs: the first read
 * that ends at the object's end (the footer) fetches the last TAIL_READ bytes at once, so the
 * seek table read next is served from memory; an object no larger than that is fetched whole by
 * its first read, and a pull then decodes its frame group from that copy too. One GET instead of
 * three for a small file of a set, two instead of three for a large one. */
/* A store URL for messages and listings: a local key is a path (PATH_MAX), an S3 one at most
 * 1024 bytes after the bucket (1200 cut long local paths short, also in `ls` output) */
#define URL_BUF (PATH_MAX + 64)
#define TAIL_READ (64u << 10)
#define PRE_READ 64u /* covers the image header and info frame (44 bytes) */
struct tail_src {
    struct vmsnap_store_conn *c;
    const char *key;
    uint64_t size;
    uint8_t *buf; /* bytes [boff, boff + blen) of the object, or NULL */
    uint64_t boff;
    size_t blen;
    const uint8_t *pre; /* bytes [0, plen) of the object, or NULL */
    size_t plen;
};

static int tail_pread(void *arg, void *buf, size_t len, uint64_t off, struct vmsnap_err *err)
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

/* ---------------------------------------------------------------------------------------- */
/* Push                                                                                      */

struct up {
    struct xfer *x;
    struct vmsnap_store_conn *ctl;
    const char *key;
    char *upload_id;
    struct vmsnap_store_part *parts;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    unsigned inflight;
    int rc;
    struct vmsnap_err err;
    uint8_t *cur;
    size_t cur_len, cur_cap;
    uint64_t off;
    uint32_t nparts;
    EVP_MD_CTX *sha; /* tableSha256: the first 44 bytes, then the seek table */
    uint8_t prefix[VMSNAP_IMAGE_PREFIX_LEN]; /* those first bytes */
    bool table_seen;
    uint64_t total;
    /* with a base object: frames reused from it, not yet placed (a run of adjacent frames) */
    const char *base_key;
    const char *base_etag;
    struct vmsnap_frame_info *run;
    size_t run_n, run_cap;
    uint64_t run_bytes;
    uint64_t copied;  /* bytes the store copied from the base (server-side) */
    uint64_t fetched; /* reused bytes that had to be fetched (runs under 5 MiB) */
    uint8_t *carry;   /* part_extra() bytes carried from a full part buffer to the next */
    bool copy_failed; /* a copy part failed: the push may go again without the base */
};

/* One part for the pool: `len` bytes from `buf`, or, when buf is NULL, a copy of `len` bytes at
 * `src_off` of the base object. */
struct part_task {
    struct xtask t;
    struct up *u;
    uint8_t *buf;
    size_t len, cap;
    uint32_t num;
    uint64_t off;
    uint64_t src_off;
};

static size_t part_cap(const struct up *u, uint32_t num)
{
    unsigned shift = (num - 1) / PART_DOUBLING;
    return (size_t)(u->x->o.part_size << (shift > 3 ? 3 : shift));
}

static void up_fail(struct up *u, int rc, const struct vmsnap_err *e)
{
    pthread_mutex_lock(&u->mu);
    if (u->rc == 0) {
        u->rc = rc;
        if (e)
            u->err = *e;
        else
            vmsnap_err_set(&u->err, -rc, "upload failed");
    }
    pthread_mutex_unlock(&u->mu);
}

static void part_run(struct xtask *t, struct vmsnap_store_conn *c)
{
    struct part_task *pt = (struct part_task *)t;
    struct up *u = pt->u;
    const bool copy = pt->buf == NULL;
    struct vmsnap_err e = {0};
    int rc = 0;
    pthread_mutex_lock(&u->mu);
    bool skip = u->rc != 0;
    pthread_mutex_unlock(&u->mu);
    if (!skip && (rc = cancel_check(&e)) < 0)
        skip = true; /* queued parts do not go out after a cancel */
    if (!skip && !copy)
        rc = vmsnap_store_mpu_part(c, u->key, u->upload_id, pt->num, pt->off, pt->buf, pt->len,
                                   &u->parts[pt->num - 1], &e);
    else if (!skip)
        rc = vmsnap_store_mpu_part_copy(c, u->key, u->upload_id, pt->num, pt->off, u->base_key,
                                        u->base_etag, pt->src_off, pt->len, &u->parts[pt->num - 1],
                                        &e);
    if (!copy) {
        xpool_buf_free(&u->x->pool, pt->buf);
        xpool_mem_release(&u->x->pool, pt->cap);
    }
    if (rc < 0) {
        if (copy && rc != -ECANCELED) {
            pthread_mutex_lock(&u->mu);
            u->copy_failed = true;
            pthread_mutex_unlock(&u->mu);
        }
        up_fail(u, rc, &e);
    } else if (!skip) {
        progress_add(u->x, pt->len, 0);
    }
    pthread_mutex_lock(&u->mu);
    u->inflight--;
    pthread_cond_broadcast(&u->cv);
    pthread_mutex_unlock(&u->mu);
    free(pt);
}

static int start_part(struct up *u, struct vmsnap_err *err)
{
    if (!u->upload_id) {
        u->parts = calloc(VMSNAP_STORE_MAX_PARTS, sizeof(*u->parts));
        if (!u->parts)
            return vmsnap_err_set(err, ENOMEM, "out of memory");
        /* not cut short by a cancel: an upload created unbeknownst to us would be left */
        cancel_hold();
        int rc = vmsnap_store_mpu_create(u->ctl, u->key, &u->upload_id, err);
        cancel_release();
        if (rc < 0)
            return rc;
    }
    if (u->nparts >= VMSNAP_STORE_MAX_PARTS)
        return vmsnap_err_set(err, EFBIG, "%s: object needs more than %u parts", u->key,
                              VMSNAP_STORE_MAX_PARTS);
    return 0;
}

/* Queue the next part on the pool: `len` bytes of `buf` (owned by the task from here on), or
 * with buf NULL a copy of `len` bytes at `src_off` of the base object. */
static int submit_part(struct up *u, uint8_t *buf, size_t len, size_t cap, uint64_t src_off,
                       struct vmsnap_err *err)
{
    int rc = start_part(u, err);
    if (rc < 0)
        return rc;
    struct part_task *pt = calloc(1, sizeof(*pt));
    if (!pt)
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    pt->t.run = part_run;
    pt->u = u;
    pt->buf = buf;
    pt->len = len;
    pt->cap = cap;
    pt->src_off = src_off;
    pt->num = ++u->nparts;
    pt->off = u->off;
    u->off += len;
    pthread_mutex_lock(&u->mu);
    u->inflight++;
    pthread_mutex_unlock(&u->mu);
    xpool_submit(&u->x->pool, &pt->t);
    return 0;
}

static int flush_part(struct up *u, struct vmsnap_err *err)
{
    int rc = submit_part(u, u->cur, u->cur_len, u->cur_cap, 0, err);
    if (rc < 0)
        return rc;
    xpool_fill(&u->x->pool, -(int64_t)u->cur_cap);
    u->cur = NULL;
    u->cur_len = u->cur_cap = 0;
    return 0;
}

/* With a base, a part buffer holds 5 MiB more than the part size and a full one keeps its last
 * 5 MiB for the next part: so the bytes buffered when a run of reused frames begins are either
 * the whole stretch since the previous run (at least 5 MiB or none: the encoder sees to that)
 * or at least 5 MiB, and can always be sent as a part of their own. */
static size_t part_extra(const struct up *u)
{
    return u->base_key ? (size_t)VMSNAP_STORE_MIN_PART : 0;
}

static int new_part_buffer(struct up *u, uint32_t num, struct vmsnap_err *err)
{
    size_t cap = part_cap(u, num) + part_extra(u);
    xpool_mem_acquire(&u->x->pool, cap);
    u->cur = xpool_buf_alloc(&u->x->pool, cap);
    if (!u->cur) {
        xpool_mem_release(&u->x->pool, cap);
        return vmsnap_err_set(err, ENOMEM, "out of memory (part buffer of %zu bytes)", cap);
    }
    u->cur_cap = cap;
    u->cur_len = 0;
    xpool_fill(&u->x->pool, (int64_t)cap);
    return 0;
}

/* Append object bytes to the current part buffer, flushing full parts. */
static int append_bytes(struct up *u, const void *buf, size_t len, struct vmsnap_err *err)
{
    const uint8_t *p = buf;
    while (len > 0) {
        if (u->cur && u->cur_len == u->cur_cap) {
            /* Keep the last part_extra() bytes for the next part: copy them aside, hand the
             * full buffer to the pool first (its memory is released when it is uploaded), only
             * then take the next buffer from the budget: asking for it while still holding the
             * full one could wait forever on a budget that fits one buffer. */
            size_t keep = part_extra(u);
            if (keep && !u->carry && !(u->carry = malloc(keep)))
                return vmsnap_err_set(err, ENOMEM, "out of memory");
            if (keep)
                memcpy(u->carry, u->cur + u->cur_cap - keep, keep);
            u->cur_len -= keep;
            int rc = flush_part(u, err);
            if (rc == 0 && keep && (rc = new_part_buffer(u, u->nparts + 1, err)) == 0) {
                memcpy(u->cur, u->carry, keep);
                u->cur_len = keep;
            }
            if (rc < 0)
                return rc;
        }
        if (!u->cur) {
            int rc = new_part_buffer(u, u->nparts + 1, err);
            if (rc < 0)
                return rc;
        }
        size_t k = VMSNAP_MIN(len, u->cur_cap - u->cur_len);
        memcpy(u->cur + u->cur_len, p, k);
        u->cur_len += k;
        p += k;
        len -= k;
    }
    return 0;
}

/* Fetch the reused frames run[i0, i1) from the base and append them as new bytes, checking each
 * against the XXH64 of its compressed bytes in the base's seek table. */
static int fetch_frames(struct up *u, size_t i0, size_t i1, struct vmsnap_err *err)
{
    uint8_t *b = NULL;
    size_t cap = 0;
    int rc = 0;
    for (size_t i = i0; i < i1 && rc == 0; i++) {
        const struct vmsnap_frame_info *f = &u->run[i];
        if (f->csize > cap) {
            free(b);
            cap = (size_t)f->csize;
            if (!(b = malloc(cap)))
                return vmsnap_err_set(err, ENOMEM, "out of memory");
        }
        rc = vmsnap_store_get(u->ctl, u->base_key, f->offset, (size_t)f->csize, b, err);
        if (rc == 0 && XXH64(b, (size_t)f->csize, 0) != f->ccheck)
            rc = vmsnap_err_set(err, ESTALE,
                                "%s: the base object changed while pushing (frame at "
                                "byte %llu)",
                                u->base_key, (unsigned long long)f->offset);
        if (rc == 0)
            rc = append_bytes(u, b, (size_t)f->csize, err);
        if (rc == 0)
            u->fetched += f->csize;
    }
    free(b);
    return rc;
}

/* Place the pending run of reused frames. Every part but the last must hold at least 5 MiB: a
 * run shorter than that is fetched and sent as bytes; the part buffered before a run is first
 * topped up to 5 MiB with the run's leading frames; the rest becomes copy parts of about the
 * part size, which the store executes without the bytes passing through here. */
static int place_run(struct up *u, struct vmsnap_err *err)
{
    const uint64_t min = VMSNAP_STORE_MIN_PART;
    size_t i = 0, n = u->run_n;
    uint64_t left = u->run_bytes;
    u->run_n = 0;
    u->run_bytes = 0;
    if (left < min)
        return fetch_frames(u, 0, n, err);
    uint64_t have = u->cur ? u->cur_len : 0;
    if (have > 0 && have < min) {
        size_t j = 0;
        uint64_t got = 0;
        while (j < n && have + got < min)
            got += u->run[j++].csize;
        if (left - got < min)
            return fetch_frames(u, 0, n, err);
        int rc = fetch_frames(u, 0, j, err);
        if (rc < 0)
            return rc;
        i = j;
        left -= got;
    }
    if (u->cur && u->cur_len > 0) {
        int rc = flush_part(u, err);
        if (rc < 0)
            return rc;
    }
    uint64_t src = u->run[i].offset;
    while (left > 0) {
        uint64_t piece = part_cap(u, u->nparts + 1);
        if (left <= piece || left - piece < min)
            piece = left;
        int rc = submit_part(u, NULL, (size_t)piece, 0, src, err);
        if (rc < 0)
            return rc;
        u->copied += piece;
        src += piece;
        left -= piece;
    }
    return 0;
}

static int up_check(struct up *u, struct vmsnap_err *err)
{
    pthread_mutex_lock(&u->mu);
    int urc = u->rc;
    if (urc && err)
        *err = u->err;
    pthread_mutex_unlock(&u->mu);
    return urc;
}

static int sink_write(void *arg, const void *buf, size_t len, struct vmsnap_err *err)
{
    struct up *u = arg;
    int rc = up_check(u, err);
    if (rc)
        return rc;
    if (u->run_n && (rc = place_run(u, err)) < 0)
        return rc;
    if (u->total < VMSNAP_IMAGE_PREFIX_LEN) {
        size_t n = VMSNAP_MIN(len, VMSNAP_IMAGE_PREFIX_LEN - u->total);
        EVP_DigestUpdate(u->sha, buf, n);
        memcpy(u->prefix + u->total, buf, n);
    }
    if (vmsnap_image_is_seek_table(buf, len)) {
        EVP_DigestUpdate(u->sha, buf, len);
        u->table_seen = true;
    }
    u->total += len;
    return append_bytes(u, buf, len, err);
}

/* A frame reused from the base: queued into the pending run (adjacent frames merge). */
static int sink_copy(void *arg, const struct vmsnap_frame_info *f, struct vmsnap_err *err)
{
    struct up *u = arg;
    int rc = up_check(u, err);
    if (rc)
        return rc;
    if (u->run_n) {
        const struct vmsnap_frame_info *l = &u->run[u->run_n - 1];
        if (l->offset + l->csize != f->offset && (rc = place_run(u, err)) < 0)
            return rc;
    }
    if (u->run_n == u->run_cap) {
        size_t cap = u->run_cap ? u->run_cap * 2 : 64;
        struct vmsnap_frame_info *r = realloc(u->run, cap * sizeof(*r));
        if (!r)
            return vmsnap_err_set(err, ENOMEM, "out of memory");
        u->run = r;
        u->run_cap = cap;
    }
    u->run[u->run_n++] = *f;
    u->run_bytes += f->csize;
    u->total += f->csize;
    return 0;
}

static void up_wait(struct up *u)
{
    pthread_mutex_lock(&u->mu);
    while (u->inflight)
        pthread_cond_wait(&u->cv, &u->mu);
    pthread_mutex_unlock(&u->mu);
}

struct leftover_ctx {
    const char *exact; /* abort uploads of this key only; NULL: every upload listed */
    const char *under; /* or: of this key and the keys under it ("K/..."), not "K1/..." */
    const char *in;    /* and only of keys directly in this prefix ("P/name", not "P/sub/x") */
    char *live_dir;    /* gc: the directory push_running_at last looked at, and its answer */
    bool live;
    struct vmsnap_store_conn *c;
    unsigned n;
    const struct vmsnap_gc_opts *gc; /* gc: its selection and report; NULL: abort every one */
    int64_t now;
    unsigned kept, unknown, failed, pushes, objects;
    struct vmsnap_err first; /* the first refused abort or delete (gc fails with it), its key */
    char first_key[URL_BUF];
};

/* `key` is `under` itself or under "under/" ("K1/x" is not under "K"); under NULL or "": any. */
static bool key_under(const char *under, const char *key)
{
    if (!under || !*under)
        return true;
    size_t ul = strlen(under);
    return !strncmp(key, under, ul) && (!key[ul] || key[ul] == '/' || under[ul - 1] == '/');
}

static int64_t age_of(const struct leftover_ctx *l, int64_t started)
{
    return started < 0 ? -1 : l->now >= started ? l->now - started : 0;
}

/* Tell gc's caller about an upload or mark (`key`), by its URL: a key alone named neither the
 * bucket nor, for the local store, the absolute path. */
static void gc_report(const struct leftover_ctx *l, enum vmsnap_gc_kind kind, const char *key,
                      int64_t age, bool act)
{
    const struct vmsnap_gc_opts *g = l->gc;
    char u[URL_BUF];
    if (g && g->report)
        g->report(g->report_arg, kind, vmsnap_store_url(l->c->st, key, u, sizeof(u)), age, act);
}

static bool old_enough(const struct vmsnap_gc_opts *g, int64_t age)
{
    return !g || g->older_than <= 0 || (age >= 0 && age >= g->older_than);
}

static void gc_failed(struct leftover_ctx *l, const char *key, const struct vmsnap_err *e)
{
    if (!l->failed++) {
        l->first = *e;
        snprintf(l->first_key, sizeof(l->first_key), "%s", key);
    }
}

/* When the upload was last active: its newest part's time where the store tells (S3 gives only
 * when an upload began, and a long push may still be adding parts), else `started`. -ENOENT: it
 * is gone (finished or aborted meanwhile). */
static int upload_last(struct vmsnap_store_conn *c, const char *key, const char *id,
                       int64_t started, int64_t *last, struct vmsnap_err *err)
{
    *last = started;
    if (started < 0 || !c->st->ops->mpu_last_part)
        return 0;
    int64_t part = -1;
    int rc = c->st->ops->mpu_last_part(c, key, id, &part, err);
    if (rc == 0 && part > started)
        *last = part;
    return rc;
}

static bool push_running_at(struct leftover_ctx *l, const char *key);

static int abort_leftover(void *arg, const char *key, const char *id, int64_t started)
{
    struct leftover_ctx *l = arg;
    if (l->exact && strcmp(l->exact, key))
        return 0;
    if (!key_under(l->under, key))
        return 0;
    if (l->in && (strncmp(key, l->in, strlen(l->in)) || strchr(key + strlen(l->in), '/')))
        return 0; /* a set below this one: its pushes' uploads are theirs */
    const struct vmsnap_gc_opts *g = l->gc;
    int64_t age = age_of(l, started);
    bool go = old_enough(g, age);
    if (go && g && g->older_than > 0) { /* old by its start: and by its last part? */
        int64_t last;
        struct vmsnap_err e = {0};
        int rc = upload_last(l->c, key, id, started, &last, &e);
        if (rc == -ENOENT)
            return 0;
        if (rc < 0) {
            vlog(VMSNAP_LOG_WARN, "cannot list the parts of the unfinished upload of %s: %s", key,
                 e.msg);
            gc_failed(l, key, &e);
            return 0;
        }
        age = age_of(l, last);
        go = old_enough(g, age);
        /* idle but a running set push's: it keeps the uploads of the names of the set it
         * replaces open until its last file is uploaded (they are completed together) */
        if (go && push_running_at(l, key))
            go = false;
    }
    gc_report(l, VMSNAP_GC_UPLOAD, key, age, go);
    if (!go) {
        l->kept++;
        l->unknown += age < 0;
        return 0;
    }
    if (g && g->dry_run) {
        l->n++;
        return 0;
    }
    struct vmsnap_err e = {0};
    if (vmsnap_store_mpu_abort(l->c, key, id, &e) == 0) {
        l->n++;
        vlog(VMSNAP_LOG_INFO, "aborted unfinished upload of %s", key);
    } else {
        vlog(VMSNAP_LOG_WARN, "cannot abort unfinished upload of %s: %s", key, e.msg);
        gc_failed(l, key, &e);
    }
    return 0;
}

/* Open the base object `bkey` for a push: its ETag (guarding copies) and seek table. Returns 1
 * with *img set, 0 when it cannot serve as a base (missing, no seek table: logged), < 0 on
 * memory errors. */
__attribute__((format(printf, 3, 4))) static void base_unused(struct xfer *x, const char *bkey,
                                                              const char *fmt, ...)
{
    char why[sizeof(x->base_why)];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    vlog(VMSNAP_LOG_INFO, "base %s not used: %s", bkey, why);
    if (!atomic_exchange(&x->base_why_set, true))
        memcpy(x->base_why, why, sizeof(why));
}

static int open_base(struct xfer *x, struct vmsnap_store_conn *ctl, const char *bkey,
                     char etag[VMSNAP_STORE_ETAG_MAX], struct vmsnap_image **img,
                     struct vmsnap_err *err)
{
    *img = NULL;
    uint64_t size = 0;
    struct vmsnap_err e = {0};
    int rc = vmsnap_store_head_etag(ctl, bkey, &size, etag, &e);
    if (rc == 0 && !etag[0])
        rc = vmsnap_err_set(&e, EPROTO, "%s: no ETag", bkey);
    struct tail_src ts = {ctl, bkey, size, NULL, 0, 0, NULL, 0};
    struct vmsnap_source src = {tail_pread, &ts, size, bkey};
    if (rc == 0)
        rc = vmsnap_image_open(&src, 0, img, &e);
    free(ts.buf);
    if (rc == -ENOMEM)
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    if (rc <= 0) {
        base_unused(x, bkey, "%s", rc == 0 ? "no seek table" : e.msg);
        return 0;
    }
    struct vmsnap_image_stats bs;
    vmsnap_image_get_stats(*img, &bs);
    uint64_t fs = x->o.frame_size ? x->o.frame_size : VMSNAP_IMAGE_DEFAULT_FRAME_SIZE;
    int level = x->o.level ? x->o.level : 1;
    if (bs.frame_size != fs || bs.level != level) {
        base_unused(x, bkey, "frame size %llu and level %d, this push %llu and %d",
                    (unsigned long long)bs.frame_size, bs.level, (unsigned long long)fs, level);
        vmsnap_image_free(*img);
        *img = NULL;
        return 0;
    }
    return 1;
}

/* The encoder's buffers are charged to the pool's budget (--max-memory covers them too). */
static void enc_acquire(void *arg, uint64_t bytes, bool wait, bool (*stop)(void *ctx), void *ctx)
{
    xpool_enc_acquire(arg, bytes, wait, stop, ctx);
}

static bool enc_try_acquire(void *arg, uint64_t bytes)
{
    return xpool_enc_try_acquire(arg, bytes);
}

static void enc_release(void *arg, uint64_t bytes)
{
    xpool_enc_release(arg, bytes);
}

static bool enc_over(void *arg)
{
    return xpool_over(arg);
}

static void enc_kick(void *arg)
{
    xpool_kick(arg);
}

/* An object stored as a multipart upload not completed yet: a set push over an existing set
 * completes those of that set's names only once every file is uploaded, right before its
 * commit, so that a push failing before (a cancel, a store gone) has overwritten none of the
 * set's objects and can put its manifest back. */
struct deferred {
    char *upload_id; /* NULL: nothing pending */
    struct vmsnap_store_part *parts;
    uint32_t nparts;
};

/* Push the open regular file `fd` to `key`, reusing the frames of `base` (NULL: none) that did
 * not change. Fills the manifest entry (sizes, digest). With `def`, the object is left as a
 * multipart upload for the caller to complete (one part when it is small). */
static int push_fd_once(struct xfer *x, struct vmsnap_store_conn *ctl, int fd, const char *path,
                        const char *key, const char *base_key, struct vmsnap_image *base,
                        const char *base_etag, struct mf_file *mf, bool *copy_failed,
                        struct deferred *def, struct vmsnap_err *err)
{
    struct up u = {.x = x, .ctl = ctl, .key = key, .base_key = base_key, .base_etag = base_etag};
    pthread_mutex_init(&u.mu, NULL);
    pthread_cond_init(&u.cv, NULL);
    u.sha = EVP_MD_CTX_new();
    if (!u.sha || !EVP_DigestInit_ex(u.sha, EVP_sha256(), NULL)) {
        EVP_MD_CTX_free(u.sha);
        return vmsnap_err_set(err, ENOMEM, "sha256 context");
    }
    struct vmsnap_sink sink = {sink_write, &u, base ? sink_copy : NULL};
    const struct vmsnap_pack_mem mem = {.acquire = enc_acquire,
                                        .try_acquire = enc_try_acquire,
                                        .release = enc_release,
                                        .over = enc_over,
                                        .kick = enc_kick,
                                        .arg = &x->pool};
    struct vmsnap_pack_opts po = {.threads = x->o.threads,
                                  .frame_size = x->o.frame_size,
                                  .level = x->o.level,
                                  .base = base,
                                  .mem = &mem};
    struct vmsnap_image_stats stats = {0};
    struct vmsnap_err perr = {0};
    int rc = vmsnap_image_pack_fd(fd, path, &sink, &po, &stats, &perr);
    struct vmsnap_err ferr = {0};
    if (rc == 0 && u.run_n) /* the encoder always ends with written frames; be safe */
        rc = place_run(&u, &ferr);
    if (rc == 0) {
        /* the last bytes: a single PUT if no part was flushed, else the last part + complete */
        if (!u.upload_id && !def) {
            rc = vmsnap_store_put(ctl, key, u.cur ? (const void *)u.cur : "", u.cur_len, &ferr);
            if (rc == 0)
                progress_add(x, u.cur_len, 0);
        } else if (u.cur_len > 0) {
            rc = flush_part(&u, &ferr);
        }
    }
    up_wait(&u);
    if (rc == 0 && u.rc == 0 && def && !u.upload_id) /* the encoder always writes bytes */
        rc = vmsnap_err_set(&ferr, EIO, "%s: nothing to store", path);
    bool handed = false;
    if (rc == 0 && u.rc == 0 && def) {
        /* left for the caller: the upload is its now (not aborted, not swept below) */
        handed = true;
        def->upload_id = u.upload_id;
        /* the list is sized for S3's 10,000 parts (~1 MB): kept for long, only what is used */
        struct vmsnap_store_part *pp = realloc(u.parts, (u.nparts ? u.nparts : 1) * sizeof(*pp));
        def->parts = pp ? pp : u.parts;
        def->nparts = u.nparts;
        u.upload_id = NULL;
        u.parts = NULL;
    }
    /* the completion is not cut short by a cancel: asked for, it runs to its answer */
    if (rc == 0 && u.rc == 0 && u.upload_id && (rc = cancel_check(&ferr)) == 0) {
        cancel_hold();
        rc = vmsnap_store_mpu_complete(ctl, key, u.upload_id, u.parts, u.nparts, &ferr);
        cancel_release();
        if (rc == -ENOENT) /* NoSuchUpload, or RGW's NoSuchKey: aborted or removed meanwhile */
            vmsnap_err_wrap(&ferr,
                            "the upload was aborted or removed while it completed (another push "
                            "to the same place at the same time?); NOT stored there: ");
    }
    if (u.rc < 0) { /* a part failed: that is the cause, whatever the encoder said */
        rc = u.rc;
        if (err)
            *err = u.err;
    } else if (rc < 0) {
        if (err)
            *err = ferr.code ? ferr : perr;
    }
    if (rc < 0 && u.upload_id) {
        struct vmsnap_err ae = {0};
        if (vmsnap_store_mpu_abort(ctl, key, u.upload_id, &ae) < 0)
            vlog(VMSNAP_LOG_WARN, "cannot abort the upload of %s (run 'vmsnap gc'): %s", key,
                 ae.msg);
    }
    if (u.upload_id) {
        /* CreateMultipartUpload is not idempotent: when an answer is lost and the request
         * retried, the server holds an upload nobody will finish. Sweep this key's uploads (ours
         * is complete or aborted by now, so it is not listed). */
        struct leftover_ctx l = {.exact = key, .c = ctl};
        struct vmsnap_err le = {0};
        cancel_hold();
        if (vmsnap_store_list_uploads(ctl, key, abort_leftover, &l, &le) < 0)
            vlog(VMSNAP_LOG_WARN, "cannot list unfinished uploads of %s (run 'vmsnap gc'): %s", key,
                 le.msg);
        cancel_release();
    }
    if (u.cur) {
        xpool_fill(&x->pool, -(int64_t)u.cur_cap);
        xpool_buf_free(&x->pool, u.cur);
        xpool_mem_release(&x->pool, u.cur_cap);
    }
    unsigned char md[32];
    unsigned mdl = 0;
    EVP_DigestFinal_ex(u.sha, md, &mdl);
    EVP_MD_CTX_free(u.sha);
    if (rc == 0 && u.total != stats.object_size && stats.object_size)
        rc = vmsnap_err_set(err, EIO, "%s: encoder reported %llu bytes but wrote %llu", path,
                            (unsigned long long)stats.object_size, (unsigned long long)u.total);
    if (rc == 0 && !u.table_seen)
        rc = vmsnap_err_set(err, EIO, "%s: the encoder wrote no seek table", path);
    if (rc < 0 && handed) { /* not the caller's after all (it may push the file again) */
        struct vmsnap_err ae = {0};
        if (vmsnap_store_mpu_abort(ctl, key, def->upload_id, &ae) < 0)
            vlog(VMSNAP_LOG_WARN, "cannot abort the upload of %s (run 'vmsnap gc'): %s", key,
                 ae.msg);
        free(def->upload_id);
        free(def->parts);
        *def = (struct deferred){0};
    }
    if (rc == 0 && mf) {
        mf->detail = true;
        mf->size = stats.total_size;
        mf->populated = stats.populated;
        mf->object_size = u.total;
        mf->table_digest = true;
        mf->copied = u.copied;
        hex32(md, mf->sha256);
        _Static_assert(sizeof(mf->prefix) == VMSNAP_IMAGE_PREFIX_LEN, "prefix length");
        memcpy(mf->prefix, u.prefix, sizeof(mf->prefix));
        mf->have_prefix = u.total >= VMSNAP_IMAGE_PREFIX_LEN;
    }
    if (rc == 0 && base)
        vlog(VMSNAP_LOG_INFO,
             "%s: %llu of %llu frames reused from the base: %llu bytes copied by the store, %llu "
             "fetched",
             key, (unsigned long long)stats.reused, (unsigned long long)stats.frames,
             (unsigned long long)u.copied, (unsigned long long)u.fetched);
    *copy_failed = u.copy_failed;
    free(u.carry);
    free(u.run);
    free(u.upload_id);
    free(u.parts);
    pthread_mutex_destroy(&u.mu);
    pthread_cond_destroy(&u.cv);
    return rc;
}

/* Push `fd` to `key`, with the object at `base_key` (NULL: none) as its base when it can be one.
 * If the base changes or vanishes during the push, the file is pushed again without it. */
static int push_fd(struct xfer *x, struct vmsnap_store_conn *ctl, int fd, const char *path,
                   const char *key, const char *base_key, struct mf_file *mf, struct deferred *def,
                   struct vmsnap_err *err)
{
    struct stat sb;
    if (fstat(fd, &sb) == 0)
        progress_add(x, 0, (uint64_t)sb.st_blocks * 512 / 2);
    struct vmsnap_image *base = NULL;
    char etag[VMSNAP_STORE_ETAG_MAX] = "";
    if (base_key) {
        int rc = open_base(x, ctl, base_key, etag, &base, err);
        if (rc < 0)
            return rc;
        if (base)
            atomic_fetch_add(&x->base_used, 1);
    }
    bool copy_failed = false;
    int rc = push_fd_once(x, ctl, fd, path, key, base ? base_key : NULL, base, etag, mf,
                          &copy_failed, def, err);
    /* The base changed or went away (412, 404, a fetched frame that differs), the store could
     * not copy, or the runs needed too many parts: go again without it. */
    /* would fail again, or was cancelled */
    bool full = rc == -ENOSPC || rc == -EDQUOT || rc == -EROFS || rc == -ECANCELED;
    if (base && rc < 0 && !full &&
        (copy_failed || rc == -ESTALE || rc == -ENOENT || rc == -EFBIG)) {
        vlog(VMSNAP_LOG_WARN, "%s: the push with base %s failed (%s); pushing it whole", path,
             base_key, err ? err->msg : "");
        vmsnap_err_clear(err);
        rc = push_fd_once(x, ctl, fd, path, key, NULL, NULL, NULL, mf, &copy_failed, def, err);
    }
    vmsnap_image_free(base);
    return rc;
}

/* The push marks found at a prefix when a push began (key and time): a killed push's, there
 * before this one, are not "another push meanwhile" to its restore. */
struct prior_marks {
    char **keys;
    int64_t *mtimes;
    size_t n, cap;
    size_t lpn; /* the length of the listed prefix ("P/"): marks directly in it count */
};

static void prior_marks_fini(struct prior_marks *p)
{
    for (size_t i = 0; i < p->n; i++)
        free(p->keys[i]);
    free(p->keys);
    free(p->mtimes);
    memset(p, 0, sizeof(*p));
}

/* A mark there before this push, unchanged since, and older than gc's default --older-than: a
 * killed push's. A younger one may be a push running now (started just before this one: its
 * mark changes only when it names what it replaces), so it still counts. */
#define PRIOR_MARK_DEAD_SECONDS 3600

static bool prior_mark(const struct prior_marks *p, const char *key, int64_t mtime)
{
    int64_t now = (int64_t)time(NULL);
    for (size_t i = 0; p && i < p->n; i++)
        if (!strcmp(p->keys[i], key) && p->mtimes[i] == mtime && mtime >= 0 &&
            now - mtime >= PRIOR_MARK_DEAD_SECONDS)
            return true;
    return false;
}

struct set_push {
    struct xfer *x;
    const char *dir;
    const char *prefix;
    char push_id[33];
    char *mark_key;        /* the push mark (manifest_int.h), once it may be stored */
    struct mf_file *files; /* sorted by name (manifest order) */
    size_t *order;         /* largest first */
    size_t n, next;
    char **replaces; /* names of the set this push replaces that it does not have */
    size_t nr;
    /* The set this push replaces, as it was stored (NULL: none, or unreadable), and which of
     * this push's files have its names: until one of those is stored over (`overwrote`), a
     * failed push can put that set back whole. */
    char *old_raw;
    size_t old_raw_len;
    bool *in_old;
    struct mf_file *old_files; /* per file in_old: the old set's entry for that name */
    struct prior_marks prior;  /* the marks there when this push began */
    struct deferred *def;      /* per file: the upload of a file in_old, completed last */
    bool overwrote;            /* a completion of those was asked for */
    pthread_mutex_t mu;
    int rc;
    struct vmsnap_err err;
};

static void *producer(void *arg)
{
    struct set_push *s = arg;
    struct vmsnap_store_conn *ctl = NULL;
    struct vmsnap_err e = {0};
    int rc = vmsnap_store_conn_new(s->x->st, &ctl, &e);
    for (;;) {
        pthread_mutex_lock(&s->mu);
        if (rc < 0 && s->rc == 0) {
            s->rc = rc;
            s->err = e;
        }
        if (s->rc || s->next >= s->n) {
            pthread_mutex_unlock(&s->mu);
            break;
        }
        size_t i = s->order[s->next++];
        pthread_mutex_unlock(&s->mu);
        struct mf_file *f = &s->files[i];
        char path[4352], obj[300];
        snprintf(path, sizeof(path), "%s/%s", s->dir, f->name);
        snprintf(obj, sizeof(obj), "%s.zstd", f->name);
        char *key = join_key(s->prefix, obj);
        char *bkey = s->x->base_key ? join_key(s->x->base_key, obj) : NULL;
        int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (!key || (s->x->base_key && !bkey))
            rc = vmsnap_err_set(&e, ENOMEM, "out of memory");
        else if (fd < 0)
            rc = err_sys(&e, "open %s", path);
        else
            rc = push_fd(s->x, ctl, fd, path, key, bkey, f,
                         s->in_old && s->in_old[i] ? &s->def[i] : NULL, &e);
        if (rc < 0)
            vmsnap_err_wrap(&e, "push %s: ", f->name);
        if (fd >= 0)
            close(fd);
        free(key);
        free(bkey);
    }
    vmsnap_store_conn_free(ctl);
    return NULL;
}

static int cmp_name(const void *a, const void *b)
{
    return strcmp(((const struct mf_file *)a)->name, ((const struct mf_file *)b)->name);
}

/* qsort_r comparators over indices into an array of manifest entries (the argument) */
static int cmp_size_desc(const void *a, const void *b, void *files)
{
    const struct mf_file *f = files;
    uint64_t x = f[*(const size_t *)a].size, y = f[*(const size_t *)b].size;
    return x < y ? 1 : x > y ? -1 : 0;
}

static int cmp_objsize_desc(const void *a, const void *b, void *files)
{
    const struct mf_file *f = files;
    size_t i = *(const size_t *)a, j = *(const size_t *)b;
    uint64_t x = f[i].object_size, y = f[j].object_size;
    return x < y ? 1 : x > y ? -1 : i < j ? -1 : i > j; /* ties: manifest order */
}

/* The regular files of a snapshot-set directory, sorted by name; sizes hold st_size. */
static int scan_set(const char *dir, struct mf_file **out, size_t *n, struct vmsnap_err *err)
{
    *out = NULL;
    *n = 0;
    DIR *d = opendir(dir);
    if (!d)
        return err_sys(err, "open directory %s", dir);
    size_t cap = 0;
    struct mf_file *v = NULL;
    int rc = 0;
    struct dirent *de;
    while (rc == 0 && (de = readdir(d))) {
        const char *name = de->d_name;
        if (!strcmp(name, ".") || !strcmp(name, ".."))
            continue;
        if (name[0] == '.') { /* hidden: vmsnap's own marks (".vmsnap-*"), or a user's */
            if (strncmp(name, ".vmsnap-", 8))
                vlog(VMSNAP_LOG_WARN, "skipping %s/%s: hidden files are not part of a set", dir,
                     name);
            continue;
        }
        /* anything but a regular file is refused: a set pushed without a file it holds (it
         * was skipped with a warning, which -q hides, and the push reported success) is a lost
         * snapshot. Symlinks are not followed (the file is opened O_NOFOLLOW): a push run as
         * root must not carry off what a link in a directory points to. */
        struct stat sb;
        if (fstatat(dirfd(d), name, &sb, AT_SYMLINK_NOFOLLOW) < 0) {
            rc = err_sys(err, "stat %s/%s", dir, name);
            break;
        }
        if (!S_ISREG(sb.st_mode)) {
            rc = vmsnap_err_set(err, EINVAL,
                                "%s/%s: %s: a snapshot set is the regular files of one directory "
                                "(hidden names are skipped); move it out of the way",
                                dir, name,
                                S_ISDIR(sb.st_mode)   ? "a directory"
                                : S_ISLNK(sb.st_mode) ? "a symlink (not followed)"
                                                      : "not a regular file");
            break;
        }
        if (!manifest_name_ok(name, strlen(name))) {
            rc = vmsnap_err_set(err, EINVAL, "%s/%s: this name cannot be part of a snapshot set",
                                dir, name);
            break;
        }
        if (*n >= VMSNAP_XFER_MAX_FILES) {
            rc = vmsnap_err_set(err, EINVAL, "%s: more than %u files", dir, VMSNAP_XFER_MAX_FILES);
            break;
        }
        if (*n == cap) {
            cap = cap ? cap * 2 : 16;
            struct mf_file *nv = realloc(v, cap * sizeof(*v));
            if (!nv) {
                rc = vmsnap_err_set(err, ENOMEM, "out of memory");
                break;
            }
            v = nv;
        }
        memset(&v[*n], 0, sizeof(v[*n]));
        v[*n].name = strdup(name);
        v[*n].size = (uint64_t)sb.st_size;
        if (!v[*n].name) {
            rc = vmsnap_err_set(err, ENOMEM, "out of memory");
            break;
        }
        (*n)++;
    }
    closedir(d);
    if (rc == 0 && *n == 0)
        rc = vmsnap_err_set(err, ENOENT, "%s: no regular files to push", dir);
    if (rc < 0) {
        struct manifest m = {v, *n, 0, ""};
        manifest_fini(&m);
        *n = 0;
        return rc;
    }
    qsort(v, *n, sizeof(*v), cmp_name);
    *out = v;
    return 0;
}

static int read_manifest_raw(struct vmsnap_store_conn *c, const char *mkey, const char *murl,
                             uint64_t max_size, struct manifest *m, char **raw, size_t *raw_len,
                             struct vmsnap_err *err);
static int read_manifest_x(struct vmsnap_store_conn *c, const char *mkey, const char *murl,
                           uint64_t max_size, struct manifest *m, char **raw, size_t *raw_len,
                           bool *unusable, struct vmsnap_err *err);

static int read_manifest(struct vmsnap_store_conn *c, const char *mkey, const char *murl,
                         uint64_t max_size, struct manifest *m, struct vmsnap_err *err)
{
    return read_manifest_raw(c, mkey, murl, max_size, m, NULL, NULL, err);
}

/*
 * Is what the store holds this push's set? Two pushes to one prefix at the same time (a split
 * brain: two nodes suspending one sandbox) write the same keys; the manifest of one can end up
 * over objects of the other, and both would report success. Each manifest carries its push's id,
 * so: before the commit every object's tableSha256 (its first bytes, which the push keeps, and
 * its seek table, read back with one GET of its tail) must be what we stored (else nothing is
 * committed over another push's objects); after it, the manifest read back must be ours and the
 * objects still ours. Each round runs in parallel on the pool's connections: one round trip for
 * most sets. A push that fails either reports that the snapshot is not stored.
 */
struct check {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    size_t left;
    int rc;
    struct vmsnap_err err;
};

struct check_task {
    struct xtask t;
    struct check *k;
    struct xfer *x;
    char *key;
    const struct mf_file *f; /* NULL: the manifest */
    const char *push_id;
};

static int new_push_id(char out[33], struct vmsnap_err *err)
{
    uint8_t id[16];
    if (getrandom(id, sizeof(id), 0) != (ssize_t)sizeof(id))
        return vmsnap_err_set(err, EIO, "getrandom: %s", strerror(errno));
    for (size_t i = 0; i < sizeof(id); i++)
        snprintf(out + 2 * i, 3, "%02x", id[i]);
    return 0;
}

static int check_object(struct xfer *x, struct vmsnap_store_conn *c, const char *key,
                        const struct mf_file *f, struct vmsnap_err *err)
{
    char url[URL_BUF];
    vmsnap_store_url(x->st, key, url, sizeof(url));
    struct tail_src t = {.c = c, .key = key};
    t.buf = malloc(TAIL_READ);
    if (!t.buf)
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    size_t got = 0;
    int rc = vmsnap_store_get_tail(c, key, TAIL_READ, t.buf, &got, &t.size, err);
    if (rc == 0 && t.size != f->object_size)
        rc = vmsnap_err_set(err, ESTALE, "%s holds %llu bytes, this push stored %llu", url,
                            (unsigned long long)t.size, (unsigned long long)f->object_size);
    struct vmsnap_image *img = NULL;
    if (rc == 0) {
        t.boff = t.size - got;
        t.blen = got;
        if (f->have_prefix) {
            t.pre = f->prefix;
            t.plen = sizeof(f->prefix);
        }
        struct vmsnap_source src = {tail_pread, &t, t.size, url};
        rc = vmsnap_image_open(&src, x->o.max_size, &img, err);
        if (rc == 0)
            rc = vmsnap_err_set(err, ESTALE, "%s has no seek table", url);
    }
    if (rc > 0) {
        const void *pre, *tab;
        size_t pl, tl;
        vmsnap_image_raw(img, &pre, &pl, &tab, &tl);
        unsigned char md[32];
        unsigned mdl = 0;
        char hx[65];
        EVP_MD_CTX *sha = EVP_MD_CTX_new();
        if (!sha || !EVP_DigestInit_ex(sha, EVP_sha256(), NULL) ||
            !EVP_DigestUpdate(sha, pre, pl) || !EVP_DigestUpdate(sha, tab, tl) ||
            !EVP_DigestFinal_ex(sha, md, &mdl))
            rc = vmsnap_err_set(err, ENOMEM, "sha256 context");
        else {
            hex32(md, hx);
            rc = strcmp(hx, f->sha256)
                     ? vmsnap_err_set(err, ESTALE, "%s is not the object this push stored", url)
                     : 0;
        }
        EVP_MD_CTX_free(sha);
    }
    vmsnap_image_free(img);
    free(t.buf);
    return rc;
}

static void check_run(struct xtask *xt, struct vmsnap_store_conn *c)
{
    struct check_task *t = (struct check_task *)xt;
    struct vmsnap_err e = {0};
    int rc;
    cancel_hold(); /* a few small GETs; after the commit, what the push reports rests on them */
    if (t->f) {
        rc = check_object(t->x, c, t->key, t->f, &e);
    } else {
        char murl[URL_BUF];
        vmsnap_store_url(t->x->st, t->key, murl, sizeof(murl));
        struct manifest m;
        rc = read_manifest(c, t->key, murl, t->x->o.max_size, &m, &e);
        if (rc == 0) {
            if (strcmp(m.push_id, t->push_id))
                rc = vmsnap_err_set(&e, ESTALE, "%s is from another push (%s)", murl,
                                    m.push_id[0] ? m.push_id : "without a push id");
            manifest_fini(&m);
        }
    }
    pthread_mutex_lock(&t->k->mu);
    if (rc < 0 && t->k->rc == 0) {
        t->k->rc = rc;
        t->k->err = e;
    }
    if (--t->k->left == 0)
        pthread_cond_signal(&t->k->cv);
    pthread_mutex_unlock(&t->k->mu);
    free(t->key);
    free(t);
    cancel_release();
}

static int check_committed(struct xfer *x, const char *prefix, const char *mkey,
                           const struct manifest *m, const char *url, bool committed,
                           struct vmsnap_err *err)
{
    struct check k = {.left = 0};
    pthread_mutex_init(&k.mu, NULL);
    pthread_cond_init(&k.cv, NULL);
    int rc = 0;
    for (size_t i = 0; i < m->n + (committed ? 1 : 0) && rc == 0; i++) {
        struct check_task *t = calloc(1, sizeof(*t));
        char obj[300];
        if (i < m->n)
            snprintf(obj, sizeof(obj), "%s.zstd", m->files[i].name);
        if (t)
            t->key = i < m->n ? join_key(prefix, obj) : strdup(mkey);
        if (!t || !t->key) {
            free(t);
            rc = vmsnap_err_set(err, ENOMEM, "out of memory");
            break;
        }
        t->t.run = check_run;
        t->k = &k;
        t->x = x;
        t->f = i < m->n ? &m->files[i] : NULL;
        t->push_id = m->push_id;
        pthread_mutex_lock(&k.mu);
        k.left++;
        pthread_mutex_unlock(&k.mu);
        xpool_submit(&x->pool, &t->t);
    }
    pthread_mutex_lock(&k.mu);
    while (k.left)
        pthread_cond_wait(&k.cv, &k.mu);
    pthread_mutex_unlock(&k.mu);
    pthread_mutex_destroy(&k.mu);
    pthread_cond_destroy(&k.cv);
    if (rc == 0 && k.rc < 0 && k.rc != -ESTALE && k.rc != -ENOENT)
        rc = vmsnap_err_set(err, -k.rc,
                            "%s: cannot read the set back to check it %s: %s; this snapshot is "
                            "NOT known to be stored there",
                            url, committed ? "after the commit" : "before the commit", k.err.msg);
    else if (rc == 0 && k.rc < 0)
        rc = vmsnap_err_set(err, EBUSY,
                            "%s: another push to the same place ran at the same time: %s, %s; "
                            "this snapshot is NOT stored there",
                            url,
                            committed ? "after this one committed" : "before this one could commit",
                            k.err.msg);
    return rc;
}

static bool mark_name(const char *base, char id[33])
{
    size_t pl = strlen(PUSH_MARK_PREFIX);
    if (strlen(base) != pl + 32 + strlen(PUSH_MARK_SUFFIX) || strncmp(base, PUSH_MARK_PREFIX, pl) ||
        strcmp(base + pl + 32, PUSH_MARK_SUFFIX))
        return false;
    for (size_t i = 0; i < 32; i++) {
        char ch = base[pl + i];
        if (!((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f')))
            return false;
        id[i] = ch;
    }
    id[32] = '\0';
    return true;
}

/* The last component of a key. */
static const char *key_base(const char *key)
{
    const char *sl = strrchr(key, '/');
    return sl ? sl + 1 : key;
}

/* Is another push at `lp` ("P/"): its manifest there, or a push mark other than `own`? (One
 * listing; < 0 when it cannot tell.) A failed push's clean-up asks before each delete: the
 * objects of its names may be a racing push's now, and that push stores its mark before any
 * object and its manifest before removing the mark. */
struct busy_ctx {
    const char *lp, *mkey, *own;
    const struct prior_marks *prior;
    bool busy;
};

static int see_busy(void *arg, const char *key, uint64_t size, int64_t mtime)
{
    (void)size;
    struct busy_ctx *b = arg;
    char id[33];
    if (strchr(key + strlen(b->lp), '/'))
        return 0; /* below the set */
    if ((b->mkey && !strcmp(key, b->mkey)) ||
        (mark_name(key_base(key), id) && (!b->own || strcmp(key, b->own)) &&
         !prior_mark(b->prior, key, mtime)))
        b->busy = true;
    return b->busy ? -ECANCELED : 0;
}

static int prefix_busy_but(struct vmsnap_store_conn *c, const char *lp, const char *mkey,
                           const char *own, const struct prior_marks *prior)
{
    struct busy_ctx b = {lp, mkey, own, prior, false};
    int rc = vmsnap_store_list(c, lp, see_busy, &b, NULL);
    return b.busy ? 1 : rc < 0 ? rc : 0;
}

static int prefix_busy(struct vmsnap_store_conn *c, const char *lp, const char *mkey,
                       const char *own)
{
    return prefix_busy_but(c, lp, mkey, own, NULL);
}

static int see_prior(void *arg, const char *key, uint64_t size, int64_t mtime)
{
    (void)size;
    struct prior_marks *p = arg;
    char id[33];
    if (strchr(key + p->lpn, '/') || !mark_name(key_base(key), id))
        return 0;
    if (p->n == p->cap) {
        size_t nc = p->cap ? 2 * p->cap : 8;
        char **k = realloc(p->keys, nc * sizeof(*k));
        if (k)
            p->keys = k;
        int64_t *m = k ? realloc(p->mtimes, nc * sizeof(*m)) : NULL;
        if (m)
            p->mtimes = m;
        if (!k || !m)
            return -ENOMEM;
        p->cap = nc;
    }
    if (!(p->keys[p->n] = strdup(key)))
        return -ENOMEM;
    p->mtimes[p->n++] = mtime;
    return 0;
}

/* 1 when `key` exists, 0 when it does not, < 0 on an error (one GET of its last byte). */
static int key_exists(struct vmsnap_store_conn *c, const char *key, struct vmsnap_err *err)
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

/* Delete the object of the set file `name` under `prefix` in one attempt (no back-off between
 * the caller's check that no other push is there and the DELETE). A missing one is fine; any
 * other failure is logged ("cannot remove NAME.zstd[what]") and returned. */
static int delete_set_object(struct vmsnap_store_conn *ctl, const char *prefix, const char *name,
                             const char *url, const char *what)
{
    char obj[300];
    snprintf(obj, sizeof(obj), "%s.zstd", name);
    char *k = join_key(prefix, obj);
    struct vmsnap_err e = {0};
    ctl->one_attempt = true;
    int drc = k ? vmsnap_store_delete(ctl, k, &e) : vmsnap_err_set(&e, ENOMEM, "out of memory");
    ctl->one_attempt = false;
    free(k);
    if (drc < 0 && drc != -ENOENT) {
        vlog(VMSNAP_LOG_WARN, "%s: cannot remove %s%s: %s", url, obj, what, e.msg);
        return drc;
    }
    return drc == -ENOENT ? 1 : 0;
}

/* A failed push's mark at the end of its clean-up: removed when everything it names went
 * (`left` false), else it stays, and says so, for gc. */
static void end_mark(struct vmsnap_store_conn *ctl, const struct set_push *s, const char *url,
                     bool left)
{
    if (left)
        vlog(VMSNAP_LOG_WARN, "%s: this push's mark stays for 'vmsnap gc' to finish", url);
    else if (s->mark_key && vmsnap_store_delete(ctl, s->mark_key, NULL) < 0)
        vlog(VMSNAP_LOG_WARN, "%s: cannot remove this push's mark (gc will)", url);
}

/* A failed push removes what it stored, unless another push committed a set there meanwhile
 * (the objects may be that push's now). Clean-up: runs after a cancel too. */
static void remove_pushed(struct vmsnap_store_conn *ctl, const char *prefix, const char *mkey,
                          const struct set_push *s)
{
    cancel_hold();
    char url[URL_BUF];
    vmsnap_store_url(ctl->st, prefix, url, sizeof(url));
    char *lp = join_key(prefix, "");
    /* Every object of the set's names, written by this push or not: what it did not replace yet
     * belongs to the set it un-committed (dead, and left unlisted it kept a full store full and
     * the next push failed the same way), or is an object the push would have replaced; and the
     * objects of that set's other names (its mark's "replaces"), dead as well. Objects of any
     * other name are left alone; so is everything once another push shows up there (its mark or
     * its manifest), checked before each delete, each in one attempt (no back-off between check
     * and delete). */
    bool left = !lp;
    for (size_t i = 0; i < s->n + s->nr && !left; i++) {
        int busy = prefix_busy(ctl, lp, mkey, s->mark_key);
        if (busy != 0) {
            vlog(VMSNAP_LOG_WARN, "%s: %s: leaving the objects this push stored in place", url,
                 busy > 0 ? "another push is or was there meanwhile"
                          : "cannot tell whether another push is there");
            left = true;
            break;
        }
        if (delete_set_object(ctl, prefix, i < s->n ? s->files[i].name : s->replaces[i - s->n], url,
                              "") < 0)
            left = true;
        if (i == 0)
            sys_failpoint("push-cleanup-deleted"); /* after its first delete */
    }
    /* the mark last, and only when every object went: while it stays, gc knows the objects may
     * be left */
    end_mark(ctl, s, url, left);
    if (!left && lp)
        vmsnap_store_tidy(ctl, lp);
    free(lp);
    cancel_release();
}

/* The completion (or abort) of one deferred upload, on a pool connection. */
struct def_task {
    struct xtask t;
    struct set_push *s;
    size_t i;
    bool abort;
    int rc;
    bool old_intact; /* failed, and the old set's object is still at the key */
    struct vmsnap_err err;
    pthread_mutex_t *mu;
    pthread_cond_t *cv;
    unsigned *left;
};

static void def_run(struct xtask *xt, struct vmsnap_store_conn *c)
{
    struct def_task *t = (struct def_task *)xt;
    cancel_hold(); /* per thread: once asked for, a completion runs to its answer */
    static atomic_flag stopped_once = ATOMIC_FLAG_INIT;
    if (!t->abort && !atomic_flag_test_and_set(&stopped_once))
        sys_failpoint("push-completion"); /* the first completion: a test's Ctrl-C here */
    struct deferred *d = &t->s->def[t->i];
    const struct mf_file *mine = &t->s->files[t->i], *old = &t->s->old_files[t->i];
    char obj[300];
    snprintf(obj, sizeof(obj), "%s.zstd", mine->name);
    char *k = join_key(t->s->prefix, obj);
    int rc = k ? 0 : vmsnap_err_set(&t->err, ENOMEM, "out of memory");
    if (rc == 0 && !t->abort)
        rc = vmsnap_store_mpu_complete(c, k, d->upload_id, d->parts, d->nparts, &t->err);
    bool dead = false;               /* the upload can no longer complete */
    if (k && (t->abort || rc < 0)) { /* first, so that it cannot complete later */
        struct vmsnap_err ae = {0};
        int arc = vmsnap_store_mpu_abort(c, k, d->upload_id, &ae);
        dead = arc == 0 || arc == -ENOENT;
        if (!dead)
            vlog(VMSNAP_LOG_WARN, "cannot abort the upload of %s (run 'vmsnap gc'): %s", k, ae.msg);
    }
    /* the same content as the old set's object (an unchanged file): the key holds the old
     * object whatever happened */
    bool same = old->detail && old->table_digest && mine->object_size == old->object_size &&
                !strcmp(mine->sha256, old->sha256);
    if (k && !t->abort && rc < 0) {
        /* A failed completion (no such upload: aborted meanwhile, or completed by an attempt
         * whose answer was lost; RGW's 500 "already in progress" for an aborted one; a store
         * gone) is judged, once the upload is dead, by what the key holds: this push's object
         * (its tableSha256) means completed; the old set's object (or, for an old entry without
         * a table digest, any other object: this completion was this push's only write there)
         * means not stored over; anything else, or an upload that may still complete, stored
         * over. */
        struct vmsnap_err ce = {0};
        int mrc = check_object(t->s->x, c, k, mine, &ce);
        if (mrc == 0) {
            vmsnap_err_clear(&t->err);
            rc = 0;
        } else if (dead && old->detail && old->table_digest) {
            t->old_intact = check_object(t->s->x, c, k, old, &ce) == 0;
        } else if (dead) {
            t->old_intact = mrc == -ESTALE;
        }
        if (rc == -ENOENT)
            vmsnap_err_wrap(&t->err,
                            "the upload was aborted or removed while it completed (another push "
                            "to the same place at the same time?); NOT stored there: ");
        if (rc < 0)
            vmsnap_err_wrap(&t->err, "push %s: ", mine->name);
    }
    if (same && rc == 0)
        t->old_intact = true;
    if (k) { /* a retried CreateMultipartUpload may have left another upload of this key */
        struct leftover_ctx l = {.exact = k, .c = c};
        (void)vmsnap_store_list_uploads(c, k, abort_leftover, &l, NULL);
    }
    free(k);
    free(d->upload_id);
    free(d->parts);
    d->upload_id = NULL;
    d->parts = NULL;
    t->rc = rc;
    cancel_release();
    pthread_mutex_lock(t->mu);
    --*t->left;
    pthread_cond_signal(t->cv);
    pthread_mutex_unlock(t->mu);
}

/* Complete the uploads a set push left pending (in parallel on the pool; from the first request
 * on, the set it replaces is being overwritten), or abort them all (`abort`: the push failed).
 * Not cut short by a cancel once started. Returns the first failure. */
static int finish_deferred(struct set_push *s, bool abort, struct vmsnap_err *err)
{
    if (!s->def)
        return 0;
    size_t n = 0;
    for (size_t i = 0; i < s->n; i++)
        n += s->def[i].upload_id != NULL;
    if (n == 0)
        return 0;
    if (!abort)
        sys_failpoint("push-completing");
    int rc = abort ? 0 : cancel_check(err);
    if (rc < 0)
        abort = true;
    struct def_task *ts = calloc(n, sizeof(*ts));
    if (!ts)
        return rc < 0 ? rc : vmsnap_err_set(err, ENOMEM, "out of memory");
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
    unsigned left = (unsigned)n;
    if (!abort)
        s->overwrote = true;
    cancel_hold();
    for (size_t i = 0, j = 0; i < s->n; i++) {
        if (!s->def[i].upload_id)
            continue;
        ts[j] =
            (struct def_task){.s = s, .i = i, .abort = abort, .mu = &mu, .cv = &cv, .left = &left};
        ts[j].t.run = def_run;
        xpool_submit(&s->x->pool, &ts[j].t);
        j++;
    }
    pthread_mutex_lock(&mu);
    while (left)
        pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
    cancel_release();
    size_t intact = 0;
    for (size_t j = 0; j < n; j++) {
        intact += ts[j].old_intact;
        if (ts[j].rc < 0 && rc == 0) {
            rc = ts[j].rc;
            if (err)
                *err = ts[j].err;
        }
    }
    /* every key still holds the old set's object (its completion failed, or stored the same
     * content): none was stored over, the old set is whole and can be put back */
    if (!abort && rc < 0 && intact == n)
        s->overwrote = false;
    free(ts);
    pthread_mutex_destroy(&mu);
    pthread_cond_destroy(&cv);
    return rc;
}

/* A push that fails after its un-commit, before it stored over any object of the set it
 * replaces (a cancel, a store gone, a file that cannot be read), removes what it stored under
 * names that set does not have, each after a listing that shows no other push there (as
 * remove_pushed does), then, after one more such listing, puts that set's manifest back byte
 * for byte: the set is visible again, whole. Not when another push is there meanwhile (its mark,
 * or a manifest): that one owns the prefix. True when the set is back. Runs after a cancel too.
 * What remains is one request's window between the last listing and the PUT. */
static bool restore_old(struct vmsnap_store_conn *ctl, const char *prefix, const char *mkey,
                        const struct set_push *s)
{
    if (!s->old_raw || !s->in_old || s->overwrote)
        return false;
    cancel_hold();
    char url[URL_BUF];
    vmsnap_store_url(ctl->st, prefix, url, sizeof(url));
    char *lp = join_key(prefix, "");
    bool ok = lp != NULL, back = false, left = false;
    struct vmsnap_err e = {0};
    /* a failed delete stops the deletes, not the restore: the mark names what is left, the
     * manifest put back does not, so gc removes exactly that */
    for (size_t i = 0; ok && !left && i < s->n; i++) {
        if (s->in_old[i])
            continue;
        if (prefix_busy_but(ctl, lp, mkey, s->mark_key, &s->prior) != 0) {
            ok = false;
            break;
        }
        if (delete_set_object(ctl, prefix, s->files[i].name, url, "") < 0)
            left = true;
    }
    /* a few tries, each right after a listing (no back-off between listing and PUT): one
     * transient failure must not turn into the loss of the set */
    for (unsigned a = 0; ok && !back && a < 4; a++) {
        if (a)
            sys_sleep_ms(250u << a);
        if (prefix_busy_but(ctl, lp, mkey, s->mark_key, &s->prior) != 0)
            break;
        vmsnap_err_clear(&e);
        ctl->one_attempt = true;
        back = vmsnap_store_put(ctl, mkey, s->old_raw, s->old_raw_len, &e) == 0;
        ctl->one_attempt = false;
        if (!back)
            vlog(VMSNAP_LOG_WARN, "%s: cannot put back the set this push was replacing: %s", url,
                 e.msg);
    }
    if (back) {
        vlog(VMSNAP_LOG_WARN, "%s: the set this push was replacing is in place again", url);
        end_mark(ctl, s, url, left);
    }
    free(lp);
    cancel_release();
    return back;
}

/* 1 when the manifest at `mkey` is push `id`'s, 0 when it is not (or gone), < 0 when it cannot
 * be read. */
static int manifest_is(struct xfer *x, struct vmsnap_store_conn *c, const char *mkey,
                       const char *id)
{
    char murl[URL_BUF];
    vmsnap_store_url(x->st, mkey, murl, sizeof(murl));
    struct manifest m = {0};
    struct vmsnap_err e = {0};
    int rc = read_manifest(c, mkey, murl, x->o.max_size, &m, &e);
    if (rc == 0)
        rc = !strcmp(m.push_id, id);
    manifest_fini(&m);
    return rc == -ENOENT ? 0 : rc;
}

/* After its commit, a push removes the objects of the set it replaced that it did not
 * overwrite (names that set had and this one has not): nothing lists them any more. Each delete
 * follows a listing that shows no other push's mark and a read of the manifest that shows this
 * push's (a push that started since, or finished whole since, owns the prefix: those names may
 * be its objects now). True when none of them is left. */
static bool remove_replaced(struct vmsnap_store_conn *ctl, const char *prefix, const char *mkey,
                            const struct set_push *s, const char *url)
{
    char *lp = join_key(prefix, "");
    size_t gone = 0, removed = 0;
    for (size_t i = 0; lp && i < s->nr; i++) {
        if (prefix_busy(ctl, lp, NULL, s->mark_key) != 0 ||
            manifest_is(s->x, ctl, mkey, s->push_id) != 1)
            break;
        int drc = delete_set_object(ctl, prefix, s->replaces[i], url, " of the replaced set");
        if (drc < 0)
            break;
        gone++;
        removed += drc == 0;
    }
    free(lp);
    if (gone < s->nr)
        vlog(VMSNAP_LOG_WARN,
             "%s: %zu object%s of the replaced set that this push does not have stay for "
             "'vmsnap gc' (this push's mark names them)",
             url, s->nr - gone, s->nr - gone == 1 ? "" : "s");
    else if (s->nr)
        vlog(VMSNAP_LOG_INFO,
             "%s: removed %zu object%s of the replaced set that this push does not have", url,
             removed, removed == 1 ? "" : "s");
    return gone == s->nr;
}

/* The set a push replaces, read on the pool while the push stores its mark (one round trip
 * saved on every set push). */
struct old_set {
    struct xtask t;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    struct xfer *x;
    const char *mkey;
    int rc;
    struct manifest m;
    char *raw; /* its bytes, to store again when this push fails before replacing any object */
    size_t raw_len;
    const char *key;           /* the set's own key (its prefix) */
    bool obj_exists;           /* an object is stored at it */
    bool unusable;             /* its manifest was read but is no manifest vmsnap can use */
    struct prior_marks *prior; /* filled with the push marks there (a listing) */
    struct vmsnap_err err;
};

static void old_set_run(struct xtask *xt, struct vmsnap_store_conn *c)
{
    struct old_set *o = (struct old_set *)xt;
    char murl[URL_BUF];
    vmsnap_store_url(o->x->st, o->mkey, murl, sizeof(murl));
    bool unusable = false;
    /* without --max-size: that cap is a policy for what is pulled, not damage, and a set taken
     * for unusable is un-committed before the upload, its manifest not kept */
    int rc = read_manifest_x(c, o->mkey, murl, UINT64_MAX, &o->m, &o->raw, &o->raw_len, &unusable,
                             &o->err);
    /* an object stored at the set's own key (S3; on the local store a file there is no
     * directory): pull of the URL would take the set and hide it */
    int obj = rc == -ENOENT && o->x->st->kind == VMSNAP_STORE_S3 && *o->key
                  ? key_exists(c, o->key, NULL)
                  : 0;
    /* the marks there now (a killed push's): not "another push meanwhile" to a restore. Not
     * listed, none are ignored. */
    char *lp = rc == 0 ? join_key(o->key, "") : NULL;
    if (lp) {
        o->prior->lpn = strlen(lp);
        if (vmsnap_store_list(c, lp, see_prior, o->prior, NULL) < 0)
            prior_marks_fini(o->prior);
        free(lp);
    }
    pthread_mutex_lock(&o->mu);
    o->rc = rc;
    o->obj_exists = obj > 0;
    o->unusable = unusable;
    o->done = true;
    pthread_cond_signal(&o->cv);
    pthread_mutex_unlock(&o->mu);
}

/* The names of the set `o` read (the one this push replaces) that `s` does not have, into
 * s->replaces. A set that cannot be read leaves them unknown (a warning): the push goes on. */
static int find_replaced(struct set_push *s, struct old_set *o, struct vmsnap_err *err)
{
    pthread_mutex_lock(&o->mu);
    while (!o->done)
        pthread_cond_wait(&o->cv, &o->mu);
    pthread_mutex_unlock(&o->mu);
    if (o->rc == -ENOENT)
        return 0;
    if (o->rc == -ECANCELED)
        return vmsnap_err_set(err, ECANCELED, "%s", o->err.msg);
    if (o->rc < 0 && !o->unusable)
        /* the store did not answer: whatever is there is not replaced blind (its manifest,
         * deleted unread, could not be put back if this push failed) */
        return vmsnap_err_set(err, -o->rc,
                              "cannot read what is at the destination, which this push would "
                              "replace: %s (nothing was changed there)",
                              o->err.msg);
    if (o->rc < 0) {
        vlog(VMSNAP_LOG_WARN,
             "%s (replacing it; objects of names this push does not have may stay there)",
             o->err.msg);
        return 0;
    }
    s->replaces = calloc(o->m.n ? o->m.n : 1, sizeof(*s->replaces));
    s->in_old = calloc(s->n ? s->n : 1, sizeof(*s->in_old));
    s->def = calloc(s->n ? s->n : 1, sizeof(*s->def));
    s->old_files = calloc(s->n ? s->n : 1, sizeof(*s->old_files));
    int rc = s->replaces && s->in_old && s->def && s->old_files
                 ? 0
                 : vmsnap_err_set(err, ENOMEM, "out of memory");
    for (size_t i = 0; rc == 0 && i < o->m.n; i++) {
        struct mf_file key = {.name = o->m.files[i].name};
        struct mf_file *hit = bsearch(&key, s->files, s->n, sizeof(*s->files), cmp_name);
        if (hit) {
            size_t j = (size_t)(hit - s->files);
            s->in_old[j] = true;
            s->old_files[j] = o->m.files[i]; /* its digest, to tell the old object there */
            s->old_files[j].name = s->files[j].name;
            continue;
        }
        if (!(s->replaces[s->nr] = strdup(o->m.files[i].name)))
            rc = vmsnap_err_set(err, ENOMEM, "out of memory");
        else
            s->nr++;
    }
    if (rc == 0) {
        s->old_raw = o->raw;
        s->old_raw_len = o->raw_len;
        o->raw = NULL;
    }
    return rc;
}

/* Can `key` be stored? S3 takes keys of at most 1024 bytes; the local store, names of at most
 * NAME_MAX bytes in paths of less than PATH_MAX (less what its temporary names add). */
static int key_fits(const struct xfer *x, const char *key, struct vmsnap_err *err)
{
    char u[URL_BUF];
    vmsnap_store_url(x->st, key, u, sizeof(u));
    if (x->st->kind == VMSNAP_STORE_S3) {
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

/* Before a set push changes anything (it un-commits the set it replaces): every file opens and
 * every key fits, so the usual local failures leave the old set in place. */
static int set_ready(const struct xfer *x, const struct set_push *s, struct vmsnap_err *err)
{
    int dfd = open(s->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0)
        return err_sys(err, "open directory %s", s->dir);
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < s->n; i++) {
        const char *name = s->files[i].name;
        int fd = openat(dfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (fd < 0) {
            rc = err_sys(err, "open %s/%s", s->dir, name);
            break;
        }
        /* the read-back before the commit holds the set's objects to --max-size as a pull
         * does: a larger file failed there, after the set it replaced was stored over */
        struct stat sb;
        if (fstat(fd, &sb) == 0 && (uint64_t)sb.st_size > x->o.max_size)
            rc = vmsnap_err_set(err, EFBIG,
                                "%s/%s is %llu bytes, over the cap of %llu (--max-size; raise it "
                                "for a larger image)",
                                s->dir, name, (unsigned long long)sb.st_size,
                                (unsigned long long)x->o.max_size);
        close(fd);
        if (rc < 0)
            break;
        char obj[300];
        snprintf(obj, sizeof(obj), "%s.zstd", name);
        char *k = join_key(s->prefix, obj);
        rc = k ? key_fits(x, k, err) : vmsnap_err_set(err, ENOMEM, "out of memory");
        free(k);
    }
    close(dfd);
    if (rc == 0) {
        char mname[64];
        snprintf(mname, sizeof(mname), PUSH_MARK_PREFIX "%s" PUSH_MARK_SUFFIX, s->push_id);
        char *k = join_key(s->prefix, mname);
        rc = k ? key_fits(x, k, err) : vmsnap_err_set(err, ENOMEM, "out of memory");
        free(k);
    }
    return rc;
}

/* Store the push mark (again, with what it replaces, once that is known). */
static int put_mark(struct vmsnap_store_conn *ctl, const struct set_push *s, int64_t started,
                    const char *url, struct vmsnap_err *err)
{
    char *mark = push_mark_build(s->push_id, started, s->files, s->n, s->replaces, s->nr);
    int rc = mark ? cancel_check(err) : vmsnap_err_set(err, ENOMEM, "out of memory");
    if (rc == 0 && (rc = vmsnap_store_put(ctl, s->mark_key, mark, strlen(mark), err)) < 0)
        vmsnap_err_wrap(err, "store the push mark %s/%s: ", url, key_base(s->mark_key));
    free(mark);
    return rc;
}

/* 1 when the manifest at `mkey` is, byte for byte, the one this push read when it started
 * (the set it replaces), 0 when it is another or gone, < 0 when it cannot be read. */
static int manifest_same(struct xfer *x, struct vmsnap_store_conn *c, const char *mkey,
                         const struct set_push *s, struct vmsnap_err *err)
{
    char murl[URL_BUF];
    vmsnap_store_url(x->st, mkey, murl, sizeof(murl));
    struct manifest m = {0};
    char *raw = NULL;
    size_t len = 0;
    int rc = read_manifest_raw(c, mkey, murl, UINT64_MAX, &m, &raw, &len, err); /* as read */
    manifest_fini(&m);
    if (rc == 0)
        rc = len == s->old_raw_len && !memcmp(raw, s->old_raw, len);
    free(raw);
    if (rc == -ENOENT) {
        vmsnap_err_clear(err);
        return 0;
    }
    return rc;
}

/* Are this push's held uploads (the old set's names) all still there? One listing of the
 * prefix's uploads. Another push starting at the prefix aborts the unfinished uploads it finds
 * there: un-committing over uploads that are gone left neither set (the completions fail, and a
 * restore gives way to that push's mark). 1: all there, 0: one is gone, < 0: cannot tell. */
struct held_ctx {
    const struct set_push *s;
    bool *seen;
};

static int see_held(void *arg, const char *key, const char *id, int64_t started)
{
    (void)key;
    (void)started;
    struct held_ctx *h = arg;
    for (size_t i = 0; i < h->s->n; i++)
        if (h->s->def[i].upload_id && !strcmp(h->s->def[i].upload_id, id))
            h->seen[i] = true;
    return 0;
}

static int held_intact(struct vmsnap_store_conn *ctl, const char *prefix, const struct set_push *s,
                       struct vmsnap_err *err)
{
    if (!s->def)
        return 1;
    char *lp = join_key(prefix, "");
    bool *seen = calloc(s->n ? s->n : 1, sizeof(*seen));
    struct held_ctx h = {s, seen};
    int rc = lp && seen ? vmsnap_store_list_uploads(ctl, lp, see_held, &h, err)
                        : vmsnap_err_set(err, ENOMEM, "out of memory");
    for (size_t i = 0; rc == 0 && i < s->n; i++)
        if (s->def[i].upload_id && !seen[i])
            rc = vmsnap_err_set(err, EBUSY,
                                "the upload of %s.zstd was aborted meanwhile (another push to the "
                                "same place?): the set there is left as it was; this snapshot is "
                                "NOT stored there",
                                s->files[i].name);
    free(seen);
    free(lp);
    return rc == 0 ? 1 : rc == -EBUSY ? 0 : rc;
}

/* A push over a set that fails before its un-commit: that set is still committed and none of
 * its objects was stored over (the caller aborted the deferred uploads). What this push stored
 * under names that set does not have goes, each after a check that the set there is still that
 * one and no other push is there; then the mark. Otherwise both stay for gc (a mark beside a
 * committed set: gc removes only what that set does not name). Runs after a cancel too. */
static void remove_new_names(struct xfer *x, struct vmsnap_store_conn *ctl, const char *prefix,
                             const char *mkey, const struct set_push *s)
{
    cancel_hold();
    char url[URL_BUF];
    vmsnap_store_url(ctl->st, prefix, url, sizeof(url));
    char *lp = join_key(prefix, "");
    bool left = !lp;
    for (size_t i = 0; i < s->n && !left; i++) {
        if (s->in_old[i])
            continue;
        if (prefix_busy_but(ctl, lp, NULL, s->mark_key, &s->prior) != 0 ||
            manifest_same(x, ctl, mkey, s, NULL) != 1) {
            left = true;
            break;
        }
        if (delete_set_object(ctl, prefix, s->files[i].name, url, "") < 0)
            left = true;
    }
    end_mark(ctl, s, url, left);
    free(lp);
    cancel_release();
}

/* After a failure: a set this push read and has not un-committed yet stays, and what this push
 * stored under new names goes; else the set it replaces back (restore_old) or what it stored
 * goes (no set there, or one un-committed unread: a corrupt manifest). */
static void push_failed(struct xfer *x, struct vmsnap_store_conn *ctl, const char *prefix,
                        const char *mkey, const struct set_push *s, bool uncommitted)
{
    if (!uncommitted && s->in_old)
        remove_new_names(x, ctl, prefix, mkey, s);
    else if (!restore_old(ctl, prefix, mkey, s))
        remove_pushed(ctl, prefix, mkey, s);
}

static int push_set(struct xfer *x, struct vmsnap_store_conn *ctl, const char *dir,
                    const char *prefix, const char *url, struct vmsnap_xfer_stats *stats,
                    struct vmsnap_err *err)
{
    struct set_push s = {.x = x, .dir = dir, .prefix = prefix};
    int rc = scan_set(dir, &s.files, &s.n, err);
    if (rc < 0)
        return rc;
    char *mkey = join_key(prefix, VMSNAP_XFER_MANIFEST);
    s.order = calloc(s.n, sizeof(*s.order));
    char *json = NULL;
    if (!mkey || !s.order) {
        rc = vmsnap_err_set(err, ENOMEM, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < s.n; i++)
        s.order[i] = i;
    qsort_r(s.order, s.n, sizeof(*s.order), cmp_size_desc, s.files);
    if ((rc = new_push_id(s.push_id, err)) < 0 || (rc = set_ready(x, &s, err)) < 0)
        goto out;

    /* the mark before anything changes: a push killed from here on leaves it for gc (not once
     * cancelled: nothing happens then). Meanwhile the pool reads the set being replaced; when
     * that has names this push has not, the mark is stored again naming them, before the
     * un-commit makes them dead. */
    struct old_set old = {.x = x, .mkey = mkey, .key = prefix, .prior = &s.prior};
    old.t.run = old_set_run;
    pthread_mutex_init(&old.mu, NULL);
    pthread_cond_init(&old.cv, NULL);
    xpool_submit(&x->pool, &old.t);
    char mname[64];
    snprintf(mname, sizeof(mname), PUSH_MARK_PREFIX "%s" PUSH_MARK_SUFFIX, s.push_id);
    int64_t mark_time = (int64_t)time(NULL);
    s.mark_key = join_key(prefix, mname);
    rc = s.mark_key ? put_mark(ctl, &s, mark_time, url, err)
                    : vmsnap_err_set(err, ENOMEM, "out of memory");
    if (rc == 0)
        sys_failpoint("push-marked");
    struct vmsnap_err oe = {0};
    int orc = find_replaced(&s, &old, &oe);
    manifest_fini(&old.m);
    free(old.raw);
    pthread_mutex_destroy(&old.mu);
    pthread_cond_destroy(&old.cv);
    if (rc == 0 && orc < 0) {
        rc = orc;
        if (err)
            *err = oe;
    }
    if (rc == 0 && old.obj_exists)
        rc = vmsnap_err_set(err, EEXIST,
                            "%s holds a single object: a set pushed there would hide it (pull "
                            "takes the set); remove it first ('vmsnap rm %s') or push elsewhere",
                            url, url);
    bool had_old = old.rc != -ENOENT; /* a set was there (or it could not be told) */
    if (rc == 0 && s.nr)
        rc = put_mark(ctl, &s, mark_time, url, err);
    if (rc < 0) {
        /* nothing changed: the mark goes, whether its PUT was answered, lost after it was
         * stored, or cut short by a cancel (a DELETE runs through one) */
        if (s.mark_key && vmsnap_store_delete(ctl, s.mark_key, NULL) < 0)
            vlog(VMSNAP_LOG_WARN, "%s: cannot remove this push's mark (gc will)", url);
        goto out;
    }
    /* A set this push read stays committed while the push uploads: the objects of its names are
     * stored as uploads held open (deferred), so nothing of that set changes until the push
     * un-commits it, right before it completes them. A push failing before then (a store gone
     * mid-upload, a kill) leaves that set whole; the un-commit used to come first, and such a
     * failure left the set invisible, its manifest only in the dead push's memory, and gc then
     * deleted its objects. A set whose manifest is corrupt is un-committed here (nothing
     * to protect); a push that found no set un-commits nothing: a manifest there now is a set
     * another push committed meanwhile (deleted, then its objects by the clean-up). Then the
     * leftovers of killed pushes are cleared (not cut short). */
    const bool late = s.in_old != NULL;
    bool uncommitted = false;
    if ((rc = cancel_check(err)) < 0 ||
        (had_old && !late && (rc = vmsnap_store_delete(ctl, mkey, err)) < 0)) {
        /* A DELETE that failed may still have been carried out (its answer lost): when the set
         * this push replaces is gone, its objects are dead, as after a failure past the
         * un-commit; when that cannot be told, the mark (which names them) stays for gc. */
        int ex = rc == -ECANCELED || !had_old ? 1 : key_exists(ctl, mkey, NULL);
        if (ex == 0 && !restore_old(ctl, prefix, mkey, &s))
            remove_pushed(ctl, prefix, mkey, &s);
        else if (ex < 0)
            vlog(VMSNAP_LOG_WARN,
                 "%s: cannot tell whether the set there is still committed: "
                 "this push's mark stays for 'vmsnap gc'",
                 url);
        else if (vmsnap_store_delete(ctl, s.mark_key, NULL) < 0)
            vlog(VMSNAP_LOG_WARN, "%s: cannot remove this push's mark (gc will)", url);
        goto out;
    }
    uncommitted = had_old && !late;
    char *lp = join_key(prefix, "");
    if (!lp) {
        rc = vmsnap_err_set(err, ENOMEM, "out of memory");
        goto out;
    }
    struct leftover_ctx l = {.c = ctl, .in = lp};
    cancel_hold();
    rc = vmsnap_store_list_uploads(ctl, lp, abort_leftover, &l, err);
    cancel_release();
    free(lp);
    if (rc < 0) {
        push_failed(x, ctl, prefix, mkey, &s, uncommitted);
        goto out;
    }

    pthread_mutex_init(&s.mu, NULL);
    unsigned np = (unsigned)VMSNAP_MIN(s.n, (size_t)MAX_PRODUCERS);
    pthread_t tids[MAX_PRODUCERS];
    unsigned started = 0;
    for (; started < np; started++)
        if (pthread_create(&tids[started], NULL, producer, &s) != 0)
            break;
    if (started == 0)
        producer(&s);
    for (unsigned i = 0; i < started; i++)
        pthread_join(tids[i], NULL);
    pthread_mutex_destroy(&s.mu);
    if (s.rc < 0) {
        rc = s.rc;
        if (err)
            *err = s.err;
        /* no manifest: the set is incomplete; the old one stays or comes back, or remove what
         * this push stored (best effort) */
        finish_deferred(&s, true, NULL);
        push_failed(x, ctl, prefix, mkey, &s, uncommitted);
        goto out;
    }
    struct manifest m = {s.files, s.n, 2, ""};
    memcpy(m.push_id, s.push_id, sizeof(m.push_id));
    if (!(json = manifest_build(&m)))
        rc = vmsnap_err_set(err, ENOMEM, "out of memory");
    if (rc == 0 && late) {
        /* the un-commit, now that every object is uploaded: only of the set this push read (a
         * manifest another push committed since is that push's set, not this one's to delete),
         * and not once cancelled (the set stays) */
        int same = 0, held = 1;
        sys_failpoint("push-uncommitting");
        if ((rc = cancel_check(err)) == 0 && (held = held_intact(ctl, prefix, &s, err)) <= 0) {
            rc = held < 0 ? held : -EBUSY;
            vmsnap_err_wrap(err, "%s: ", url);
        } else if (rc == 0 && (same = manifest_same(x, ctl, mkey, &s, err)) == 0)
            rc = vmsnap_err_set(err, EBUSY,
                                "%s: another push to the same place ran at the same time: the "
                                "set there is no longer the one this push replaces; this "
                                "snapshot is NOT stored there",
                                url);
        else if (rc == 0 && same < 0)
            rc = same;
        if (rc == 0) {
            /* one attempt: no back-off between the check and the DELETE */
            ctl->one_attempt = true;
            rc = vmsnap_store_delete(ctl, mkey, err);
            ctl->one_attempt = false;
        }
        if (rc < 0 && same == 1) {
            /* carried out with its answer lost? as for the early un-commit above */
            int ex = rc == -ECANCELED ? 1 : key_exists(ctl, mkey, NULL);
            finish_deferred(&s, true, NULL);
            if (ex < 0)
                vlog(VMSNAP_LOG_WARN,
                     "%s: cannot tell whether the set there is still committed: "
                     "this push's mark stays for 'vmsnap gc'",
                     url);
            else
                push_failed(x, ctl, prefix, mkey, &s, ex == 0);
            goto out;
        }
        if (rc < 0) {
            finish_deferred(&s, true, NULL);
            push_failed(x, ctl, prefix, mkey, &s, false);
            goto out;
        }
        uncommitted = true;
    }
    if (rc < 0)
        finish_deferred(&s, true, NULL);
    else if ((rc = finish_deferred(&s, false, err)) < 0)
        finish_deferred(&s, true, NULL); /* those not completed */
    if (rc < 0) {
        push_failed(x, ctl, prefix, mkey, &s, uncommitted);
        goto out;
    }
    /* objects first (a push racing this one may have replaced some: then nothing is
     * committed over them), then the commit, then all of it again */
    if ((rc = check_committed(x, prefix, mkey, &m, url, false, err)) < 0)
        goto out;
    /* the commit: not after a cancel, unless the old set's objects are already stored over (then
     * only the commit keeps a set there); once asked for, it runs to its answer and is checked */
    if (s.overwrote && cancel_pending())
        vlog(VMSNAP_LOG_WARN,
             "%s: interrupted after the set there was stored over: committing this push's set "
             "(the only way to leave one there)",
             url);
    if (!s.overwrote && (rc = cancel_check(err)) < 0) {
        push_failed(x, ctl, prefix, mkey, &s, uncommitted);
        goto out;
    }
    cancel_hold();
    rc = vmsnap_store_put(ctl, mkey, json, strlen(json), err);
    if (rc < 0 && manifest_is(x, ctl, mkey, s.push_id) == 1) {
        /* the PUT was carried out and its answer lost (every retry too): committed */
        vlog(VMSNAP_LOG_WARN,
             "%s: the commit's answer was lost, but the manifest there is this "
             "push's (%s)",
             url, err ? err->msg : "");
        vmsnap_err_clear(err);
        rc = 0;
    }
    if (rc < 0) {
        vmsnap_err_wrap(err, "commit %s/%s: ", url, VMSNAP_XFER_MANIFEST);
        /* not committed (a full store, a refused write): the objects are nobody's (or the old
         * set is back when none of its objects was stored over). When the answer was lost after
         * the manifest was stored, it exists and they stay. */
        push_failed(x, ctl, prefix, mkey, &s, uncommitted);
    } else {
        rc = check_committed(x, prefix, mkey, &m, url, true, err);
        /* committed and checked: the replaced set's other objects go, then the mark has done
         * its work (one left behind is gc's: the manifest names its push, the mark what it
         * replaced) */
        if (rc == 0)
            sys_failpoint("push-committed");
        if (rc == 0 && remove_replaced(ctl, prefix, mkey, &s, url) &&
            vmsnap_store_delete(ctl, s.mark_key, NULL) < 0)
            vlog(VMSNAP_LOG_WARN, "%s: cannot remove the push mark %s (gc will)", url, s.mark_key);
    }
    cancel_release();
    if (rc < 0)
        goto out;
    if (stats) {
        stats->files = s.n;
        for (size_t i = 0; i < s.n; i++) {
            stats->logical += s.files[i].size;
            stats->populated += s.files[i].populated;
            stats->object_bytes += s.files[i].object_size;
            stats->copied_bytes += s.files[i].copied;
        }
    }
out:
    free(json);
    free(mkey);
    free(s.mark_key);
    free(s.order);
    for (size_t i = 0; i < s.nr; i++)
        free(s.replaces[i]);
    free(s.replaces);
    free(s.old_raw);
    free(s.in_old);
    free(s.old_files);
    prior_marks_fini(&s.prior);
    free(s.def); /* every upload in it was completed or aborted */
    struct manifest m2 = {s.files, s.n, 0, ""};
    manifest_fini(&m2);
    return rc;
}

static bool same_str(const char *a, const char *b)
{
    return (!a && !b) || (a && b && !strcmp(a, b));
}

/* Resolve the base URL to a key of the push's own store (copies work only inside one store). */
static int base_key_in(struct xfer *x, const char *base, struct vmsnap_err *err)
{
    bool remote = strstr(base, "://") && strncmp(base, "file://", 7);
    if (remote != (x->st->kind == VMSNAP_STORE_S3))
        return vmsnap_err_set(err, EINVAL,
                              "base %s is not in the store being pushed to (copies stay inside "
                              "one bucket)",
                              base);
    struct vmsnap_store *bst = NULL;
    char *bkey = NULL;
    int rc = vmsnap_store_open(base, &x->o.store, &bst, &bkey, err);
    if (rc < 0) {
        vmsnap_err_wrap(err, "base: ");
        return rc;
    }
    const struct s3_config *a = &x->st->s3, *b = &bst->s3;
    bool same = bst->kind == x->st->kind &&
                (bst->kind == VMSNAP_STORE_LOCAL ||
                 (same_str(a->url_scheme, b->url_scheme) && same_str(a->host, b->host) &&
                  a->port == b->port && same_str(a->bucket, b->bucket)));
    if (!same)
        rc = vmsnap_err_set(err, EINVAL,
                            "base %s is not in the store being pushed to (copies stay inside one "
                            "bucket)",
                            base);
    else if (!*bkey)
        rc = vmsnap_err_set(err, EINVAL, "base %s: a key (a path inside the bucket) is needed",
                            base);
    vmsnap_store_free(bst);
    if (rc < 0)
        free(bkey);
    else
        x->base_key = bkey;
    return rc;
}

/* Is `key` of a local store the file or directory at `path`, or (`within`) inside that
 * directory? (push FILE FILE replaced the file with its own object; a set pushed into itself or
 * pulled into its own directory mixed files and objects.) */
static bool local_same(const struct xfer *x, const char *key, const char *path, bool within)
{
    struct stat a, b;
    char p[PATH_MAX];
    if (x->st->kind != VMSNAP_STORE_LOCAL || stat(path, &b) < 0 ||
        snprintf(p, sizeof(p), "/%s", key) >= (int)sizeof(p))
        return false;
    for (;;) {
        if (stat(p, &a) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino)
            return true;
        char *sl = strrchr(p, '/');
        if (!within || !sl || sl == p)
            return false;
        *sl = '\0';
    }
}

int vmsnap_xfer_check_dest(const char *url, bool set, const struct vmsnap_xfer_opts *opts,
                           struct vmsnap_err *err)
{
    struct xfer x;
    char *key = NULL;
    int rc = xfer_init(&x, url, opts, &key, err); /* the options and URL, as a push takes them */
    if (rc < 0)
        return rc;
    char p[PATH_MAX];
    if (!*key) {
        rc = vmsnap_err_set(err, EINVAL, "%s: a key (a path inside the bucket) is needed", url);
    } else if (x.st->kind == VMSNAP_STORE_LOCAL &&
               snprintf(p, sizeof(p), "/%s", key) < (int)sizeof(p)) {
        struct stat sb;
        char *sl;
        while (lstat(p, &sb) < 0 && (sl = strrchr(p, '/')) && sl != p)
            *sl = '\0';
        bool found = stat(p, &sb) == 0;
        if (!found)
            rc = vmsnap_err_set(err, ENOENT, "%s: %s is a symlink to nothing", url, p);
        else if (!S_ISDIR(sb.st_mode) && (set || strcmp(p + 1, key)))
            rc = vmsnap_err_set(err, ENOTDIR, "%s: %s is not a directory", url, p);
        else if (S_ISDIR(sb.st_mode) && access(p, W_OK | X_OK) < 0)
            rc = err_sys(err, "%s: cannot write in %s", url, p);
    }
    free(key);
    xfer_fini(&x, false);
    return rc;
}

/* No file is pushed inside a committed set (KEY's parent holds a manifest): it would replace
 * one of its objects or its manifest (a set was destroyed so). A set below a set is another
 * matter: its objects are in its own directory. */
static int not_inside_set(struct vmsnap_store_conn *ctl, const char *key, const char *url,
                          const char *what, struct vmsnap_err *err)
{
    const char *slash = strrchr(key, '/');
    char *parent = strndup(key, slash ? (size_t)(slash - key) : 0);
    char *pm = parent ? join_key(parent, VMSNAP_XFER_MANIFEST) : NULL;
    int rc = pm ? key_exists(ctl, pm, err) : vmsnap_err_set(err, ENOMEM, "out of memory");
    if (rc > 0) {
        const char *us = strrchr(url, '/');
        rc = vmsnap_err_set(err, EEXIST,
                            "%s is inside the snapshot set %.*s (it has a %s): %s pushed there "
                            "would replace or join its objects; push elsewhere",
                            url, us ? (int)(us - url) : 1, us ? url : ".", VMSNAP_XFER_MANIFEST,
                            what);
    }
    free(pm);
    free(parent);
    return rc < 0 ? rc : 0;
}

int vmsnap_xfer_push(const char *path, const char *url, const struct vmsnap_xfer_opts *opts,
                     struct vmsnap_xfer_stats *stats, struct vmsnap_err *err)
{
    if (stats)
        memset(stats, 0, sizeof(*stats));
    struct stat sb;
    if (stat(path, &sb) < 0)
        return err_sys(err, "%s", path);
    if (!S_ISREG(sb.st_mode) && !S_ISDIR(sb.st_mode))
        return vmsnap_err_set(err, EINVAL, "%s: not a regular file or a directory", path);
    struct xfer x;
    char *key = NULL;
    int rc = xfer_init(&x, url, opts, &key, err);
    if (rc < 0)
        return rc;
    struct vmsnap_store_conn *ctl = NULL;
    bool pool = false;
    if (!*key) {
        rc = vmsnap_err_set(err, EINVAL, "%s: a key (a path inside the bucket) is needed", url);
        goto out;
    }
    /* what would fail late is refused before anything changes (a push over a set un-commits it
     * first) */
    struct vmsnap_pack_opts cpo = {.frame_size = x.o.frame_size, .level = x.o.level};
    if ((rc = vmsnap_image_check_pack_opts(&cpo, err)) < 0)
        goto out;
    if (x.o.part_size > VMSNAP_STORE_MAX_PART) {
        rc = vmsnap_err_set(err, EINVAL, "part size %llu: at most 5 GiB (S3's largest part)",
                            (unsigned long long)x.o.part_size);
        goto out;
    }
    if (local_same(&x, key, path, S_ISDIR(sb.st_mode))) {
        rc = vmsnap_err_set(err, EINVAL, "push %s to %s: the destination is the %s being pushed",
                            path, url, S_ISDIR(sb.st_mode) ? "directory (or inside it)" : "file");
        goto out;
    }
    if (x.o.base && (rc = base_key_in(&x, x.o.base, err)) < 0)
        goto out;
    if ((rc = vmsnap_store_conn_new(x.st, &ctl, err)) < 0 || (rc = xfer_start_pool(&x, err)) < 0)
        goto out;
    pool = true;
    if (S_ISDIR(sb.st_mode)) {
        rc = push_set(&x, ctl, path, key, url, stats, err); /* (a set below a set is fine) */
    } else {
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
            rc = err_sys(err, "open %s", path);
            goto out;
        }
        /* a set under KEY/ would shadow this object: pull KEY prefers the set */
        char *mk = join_key(key, VMSNAP_XFER_MANIFEST);
        rc = mk ? key_exists(ctl, mk, err) : vmsnap_err_set(err, ENOMEM, "out of memory");
        free(mk);
        if (rc > 0)
            rc = vmsnap_err_set(err, EEXIST,
                                "%s holds a snapshot set (%s/%s): a file pushed there would be "
                                "hidden by it; remove the set first ('vmsnap rm %s') or push "
                                "elsewhere",
                                url, url, VMSNAP_XFER_MANIFEST, url);
        const char *slash = strrchr(key, '/');
        if (rc == 0 && !strcmp(slash ? slash + 1 : key, VMSNAP_XFER_MANIFEST))
            rc = vmsnap_err_set(err, EINVAL,
                                "%s: %s is the name of a snapshot set's manifest, not one for an "
                                "object",
                                url, VMSNAP_XFER_MANIFEST);
        if (rc == 0)
            rc = not_inside_set(ctl, key, url, "a file", err);
        struct leftover_ctx l = {.exact = key, .c = ctl};
        if (rc == 0)
            rc = vmsnap_store_list_uploads(ctl, key, abort_leftover, &l, err);
        struct mf_file mf = {0};
        if (rc == 0)
            rc = push_fd(&x, ctl, fd, path, key, x.base_key, &mf, NULL, err);
        close(fd);
        if (rc == 0 && stats) {
            stats->files = 1;
            stats->logical = mf.size;
            stats->populated = mf.populated;
            stats->object_bytes = mf.object_size;
            stats->copied_bytes = mf.copied;
        }
    }
    if (rc < 0 && err && !strstr(err->msg, url))
        vmsnap_err_wrap(err, "push %s to %s: ", path, url);
    if (rc == 0 && x.base_key && !atomic_load(&x.base_used)) /* a typo costs the whole saving */
        vlog(x.o.base_implicit ? VMSNAP_LOG_INFO : VMSNAP_LOG_WARN,
             "base %s was not used (%s): every frame was compressed and uploaded", x.o.base,
             atomic_load(&x.base_why_set) ? x.base_why : "no file had one");
out:
    vmsnap_store_conn_free(ctl);
    xfer_fini(&x, pool);
    free(key);
    return rc;
}

/* ---------------------------------------------------------------------------------------- */
/* Pull                                                                                      */

struct grp {
    uint64_t off, len;
    uint32_t f0, f1; /* frames [f0, f1] */
    uint8_t *buf;
    bool done;
};

struct down {
    struct xfer *x;
    char *key;
    char url[URL_BUF];
    const struct mf_file *mf; /* expected (NULL for a single object) */
    struct sys_atomic_file af;
    bool af_open;
    uint64_t osize;
    struct vmsnap_image *img;
    struct grp *g;
    uint32_t ng, next_hash;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    unsigned pending;
    int rc;
    struct vmsnap_err err;
    EVP_MD_CTX *sha;
    uint64_t hashed;
    struct tail_src tail; /* the object's last bytes, read while opening it */
    int start_rc;         /* what opening/dispatching returned (a set's pull finishes every file) */
    struct vmsnap_err open_err; /* the error of an open that ran on a pool thread */
    bool inited, opened, sequential;
    uint8_t *pre; /* the object's first PRE_READ bytes, fetched beside its tail */
    int pre_rc;
    bool pre_submitted, pre_done;
    struct vmsnap_image_stats stats;
    struct vmsnap_seqdec *seq;
};

struct grp_task {
    struct xtask t;
    struct down *d;
    uint32_t gi;
};

static void down_fail(struct down *d, int rc, const struct vmsnap_err *e)
{
    if (d->rc == 0) {
        d->rc = rc;
        d->err = *e;
    }
}

static void dec_enter(struct xfer *x)
{
    pthread_mutex_lock(&x->mu);
    while (x->decoding >= x->max_decoding)
        pthread_cond_wait(&x->cv_dec, &x->mu);
    x->decoding++;
    pthread_mutex_unlock(&x->mu);
}

static void dec_leave(struct xfer *x)
{
    pthread_mutex_lock(&x->mu);
    x->decoding--;
    pthread_cond_signal(&x->cv_dec);
    pthread_mutex_unlock(&x->mu);
}

static void grp_run(struct xtask *t, struct vmsnap_store_conn *c)
{
    struct grp_task *gt = (struct grp_task *)t;
    struct down *d = gt->d;
    struct grp *g = &d->g[gt->gi];
    struct vmsnap_err e = {0};
    int rc = 0;
    pthread_mutex_lock(&d->mu);
    bool skip = d->rc != 0;
    pthread_mutex_unlock(&d->mu);
    if (!skip && (rc = cancel_check(&e)) < 0)
        skip = true;
    uint8_t *buf = skip ? NULL : xpool_buf_alloc(&d->x->pool, g->len ? g->len : 1);
    if (!skip && !buf)
        rc = vmsnap_err_set(&e, ENOMEM, "out of memory (%llu-byte group)",
                            (unsigned long long)g->len);
    struct tail_src *tl = &d->tail;
    if (buf && rc == 0 && tl->buf && g->off >= tl->boff && g->len <= tl->blen &&
        g->off - tl->boff <= tl->blen - g->len) {
        /* a group inside the bytes read when opening (a small object, read whole): at most one
         * group (they are >= 16 MiB but for the last), so the copy is no longer needed */
        memcpy(buf, tl->buf + (g->off - tl->boff), g->len);
        free(tl->buf);
        tl->buf = NULL;
    } else if (buf && rc == 0)
        rc = vmsnap_store_get(c, d->key, g->off, g->len, buf, &e);
    if (buf && rc == 0) {
        /* decode straight from the fetched group: no copy, small per-call buffers */
        struct vmsnap_frame_decoder *fd = NULL;
        dec_enter(d->x);
        rc = vmsnap_frame_decoder_new(&fd, &e);
        if (rc == 0)
            vmsnap_frame_decoder_set_dst(fd, d->af.path);
        for (uint32_t i = g->f0; i <= g->f1 && rc == 0; i++) {
            if ((rc = cancel_check(&e)) < 0) /* a group waited for its turn to decode */
                break;
            struct vmsnap_frame_info fi;
            vmsnap_image_frame(d->img, i, &fi);
            rc = vmsnap_image_decode_frame_mem(d->img, i, buf + (fi.offset - g->off), fi.csize,
                                               d->af.fd, fd, NULL, &e);
        }
        vmsnap_frame_decoder_free(fd);
        dec_leave(d->x);
    }
    if (rc == 0 && !skip)
        progress_add(d->x, g->len, 0);
    pthread_mutex_lock(&d->mu);
    if (rc < 0)
        down_fail(d, rc, &e);
    g->buf = buf;
    g->done = true;
    /* hash every group that is now next in object order, then let its memory go */
    while (d->next_hash < d->ng && d->g[d->next_hash].done) {
        struct grp *h = &d->g[d->next_hash];
        if (d->rc == 0 && h->buf) {
            /* a whole-object sha256 (older manifests); tableSha256 was checked at the start */
            if (d->mf && d->mf->detail && !d->mf->table_digest)
                EVP_DigestUpdate(d->sha, h->buf, h->len);
            d->hashed += h->len;
        }
        xpool_buf_free(&d->x->pool, h->buf);
        h->buf = NULL;
        xpool_mem_release(&d->x->pool, h->len);
        d->next_hash++;
    }
    d->pending--;
    pthread_cond_broadcast(&d->cv);
    pthread_mutex_unlock(&d->mu); /* `d` may be gone from here on */
    free(gt);
}

static int seq_feed(void *arg, const void *buf, size_t len, struct vmsnap_err *err)
{
    struct down *d = arg;
    if (d->mf && d->mf->detail && !d->mf->table_digest)
        EVP_DigestUpdate(d->sha, buf, len);
    d->hashed += len;
    progress_add(d->x, len, 0);
    return vmsnap_seqdec_feed(d->seq, buf, len, err);
}

static void seq_run(struct xtask *t, struct vmsnap_store_conn *c)
{
    struct grp_task *gt = (struct grp_task *)t;
    struct down *d = gt->d;
    struct vmsnap_err e = {0};
    int rc = vmsnap_seqdec_new(d->af.fd, d->x->o.max_size, d->url, &d->seq, &e);
    if (rc == 0)
        vmsnap_seqdec_set_dst(d->seq, d->af.path);
    if (rc == 0)
        rc = vmsnap_store_get_stream(c, d->key, seq_feed, d, &e);
    if (rc == 0)
        rc = vmsnap_seqdec_finish(d->seq, &d->stats, &e);
    vmsnap_seqdec_free(d->seq);
    d->seq = NULL;
    pthread_mutex_lock(&d->mu);
    if (rc < 0)
        down_fail(d, rc, &e);
    d->pending--;
    pthread_cond_broadcast(&d->cv);
    pthread_mutex_unlock(&d->mu);
    free(gt);
}

/* Cut the object into groups of whole frames covering [0, osize). */
static int make_groups(struct down *d, struct vmsnap_err *err)
{
    uint32_t n = vmsnap_image_frame_count(d->img);
    if (n == 0)
        return vmsnap_err_set(err, EINVAL, "%s: image without frames", d->url);
    d->g = calloc(n, sizeof(*d->g));
    if (!d->g)
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    uint64_t start = 0, prev_end = 0;
    uint32_t f0 = 0;
    for (uint32_t i = 0; i < n; i++) {
        struct vmsnap_frame_info fi;
        vmsnap_image_frame(d->img, i, &fi);
        if ((i > 0 && fi.offset != prev_end) || fi.offset + fi.csize > d->osize)
            return vmsnap_err_set(err, EINVAL, "%s: frame %u at byte %llu is not contiguous",
                                  d->url, i, (unsigned long long)fi.offset);
        prev_end = fi.offset + fi.csize;
        if (prev_end - start >= GROUP_TARGET || i == n - 1) {
            struct grp *g = &d->g[d->ng++];
            g->off = start;
            g->len = (i == n - 1 ? d->osize : prev_end) - start;
            g->f0 = f0;
            g->f1 = i;
            start = prev_end;
            f0 = i + 1;
        }
    }
    return 0;
}

static void down_init(struct down *d)
{
    pthread_mutex_init(&d->mu, NULL);
    pthread_cond_init(&d->cv, NULL);
    d->inited = true;
}

/* Open `key` for pulling into a temporary file beside `dst`, on connection `c`: one GET of its
 * last TAIL_READ bytes (size, footer and seek table; a small object whole), its first bytes when
 * larger, the checks against the manifest, the frame groups. Nothing is dispatched yet. Runs on
 * the caller's thread or on a pool thread (a set's files open in parallel). */
struct pre_task {
    struct xtask t;
    struct down *d;
};

static void pre_run(struct xtask *t, struct vmsnap_store_conn *c)
{
    struct down *d = ((struct pre_task *)t)->d;
    struct vmsnap_err e = {0};
    int rc = vmsnap_store_get(c, d->key, 0, PRE_READ, d->pre, &e);
    pthread_mutex_lock(&d->mu);
    d->pre_rc = rc;
    d->pre_done = true;
    pthread_cond_broadcast(&d->cv);
    pthread_mutex_unlock(&d->mu);
    free(t);
}

/* A large object's first bytes are read right after its tail; fetched on a pool connection
 * meanwhile, they cost no round trip of their own. Submitted before any other task of the pull,
 * so a busy pool does not delay it; only for a download whose down_open runs on the calling
 * thread (a pool thread waiting for another pool task could wait for ever). */
static void down_prefetch(struct down *d)
{
    struct pre_task *pt = NULL;
    if (!d->mf || !d->mf->detail || d->mf->object_size <= TAIL_READ ||
        !(d->pre = malloc(PRE_READ)) || !(pt = calloc(1, sizeof(*pt))))
        return;
    pt->t.run = pre_run;
    pt->d = d;
    d->pre_submitted = true;
    xpool_submit(&d->x->pool, &pt->t);
}

static int down_open(struct down *d, struct vmsnap_store_conn *c, const char *dst,
                     struct vmsnap_err *err)
{
    d->sha = EVP_MD_CTX_new();
    if (!d->sha || !EVP_DigestInit_ex(d->sha, EVP_sha256(), NULL))
        return vmsnap_err_set(err, ENOMEM, "sha256 context");
    vmsnap_store_url(d->x->st, d->key, d->url, sizeof(d->url));
    uint8_t *tb = malloc(TAIL_READ);
    if (!tb)
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    size_t got = 0;
    int rc = vmsnap_store_get_tail(c, d->key, TAIL_READ, tb, &got, &d->osize, err);
    if (d->pre_submitted) {
        pthread_mutex_lock(&d->mu);
        while (!d->pre_done)
            pthread_cond_wait(&d->cv, &d->mu);
        pthread_mutex_unlock(&d->mu);
    }
    if (rc < 0 || got == 0) {
        free(tb);
        tb = NULL;
    } else if (got < TAIL_READ) {
        uint8_t *t2 = realloc(tb, got); /* a small object, kept until its group is decoded */
        tb = t2 ? t2 : tb;
    }
    d->tail = (struct tail_src){c, d->key, d->osize, tb, d->osize - got, got, NULL, 0};
    if (d->pre_submitted && d->pre_rc == 0 && d->osize >= PRE_READ) { /* else: read as usual */
        d->tail.pre = d->pre;
        d->tail.plen = PRE_READ;
    }
    if (rc == -ENOENT && d->mf)
        return vmsnap_err_set(err, ENOENT, "the manifest lists '%s' but %s is missing", d->mf->name,
                              d->url);
    if (rc < 0)
        return rc;
    if (d->mf && d->mf->detail && d->mf->object_size != d->osize)
        return vmsnap_err_set(err, EINVAL, "%s: %llu bytes, the manifest says %llu", d->url,
                              (unsigned long long)d->osize, (unsigned long long)d->mf->object_size);
    if ((rc = sys_atomic_open_tagged(&d->af, dst, 0600, "pull", err)) < 0)
        return rc;
    d->af_open = true;
    progress_add(d->x, 0, d->osize);
    struct vmsnap_source src = {tail_pread, &d->tail, d->osize, d->url};
    rc = vmsnap_image_open(&src, d->x->o.max_size, &d->img, err);
    d->tail.c = NULL; /* the pool's threads only read the cached bytes */
    if (rc < 0)
        return rc;
    if (rc == 0 && d->mf && d->mf->table_digest)
        return vmsnap_err_set(err, EINVAL,
                              "%s: the manifest has a seek-table digest but the object has no "
                              "seek table: refusing it",
                              d->url);
    if (rc == 0) { /* no seek table: one streaming GET through the sequential decoder */
        d->sequential = true;
        free(d->tail.buf);
        d->tail.buf = NULL;
        return 0;
    }
    vmsnap_image_get_stats(d->img, &d->stats);
    if (d->mf && d->mf->detail &&
        (d->stats.total_size != d->mf->size || d->stats.populated != d->mf->populated))
        return vmsnap_err_set(
            err, EINVAL,
            "%s: image holds %llu bytes (%llu populated), the manifest says "
            "%llu (%llu)",
            d->url, (unsigned long long)d->stats.total_size, (unsigned long long)d->stats.populated,
            (unsigned long long)d->mf->size, (unsigned long long)d->mf->populated);
    if (ftruncate(d->af.fd, (off_t)d->stats.total_size) < 0)
        return err_sys(err, "set size of %s to %llu", dst, (unsigned long long)d->stats.total_size);
    if (d->mf && d->mf->detail && d->mf->table_digest) {
        /* tableSha256 over the very bytes the table was parsed from: every frame is then
         * checked against that table (compressed XXH64, content XXH64, zstd's checksum) */
        const void *pre, *tab;
        size_t pl, tl;
        vmsnap_image_raw(d->img, &pre, &pl, &tab, &tl);
        unsigned char md[32];
        unsigned mdl = 0;
        char hx[65];
        EVP_DigestUpdate(d->sha, pre, pl);
        EVP_DigestUpdate(d->sha, tab, tl);
        EVP_DigestFinal_ex(d->sha, md, &mdl);
        hex32(md, hx);
        if (!pre || strcmp(hx, d->mf->sha256))
            return vmsnap_err_set(err, EINVAL,
                                  "%s: tableSha256 %s does not match the manifest (%s): refusing "
                                  "it",
                                  d->url, hx, d->mf->sha256);
    }
    if ((rc = make_groups(d, err)) < 0)
        return rc;
    /* keep the bytes read when opening only if a group will be served from them (the last) */
    const struct grp *lg = &d->g[d->ng - 1];
    if (d->tail.buf && !(lg->off >= d->tail.boff && lg->len <= d->tail.blen &&
                         lg->off - d->tail.boff <= d->tail.blen - lg->len)) {
        free(d->tail.buf);
        d->tail.buf = NULL;
    }
    return 0;
}

/* Dispatch an opened download's tasks to the pool (blocks while the memory budget is spent). */
static int down_submit(struct down *d, struct vmsnap_err *err)
{
    if (d->sequential) {
        struct grp_task *t = calloc(1, sizeof(*t));
        if (!t)
            return vmsnap_err_set(err, ENOMEM, "out of memory");
        t->t.run = seq_run;
        t->d = d;
        pthread_mutex_lock(&d->mu);
        d->pending = 1;
        pthread_mutex_unlock(&d->mu);
        xpool_submit(&d->x->pool, &t->t);
        return 0;
    }
    for (uint32_t i = 0; i < d->ng; i++) {
        pthread_mutex_lock(&d->mu);
        bool failed = d->rc != 0;
        pthread_mutex_unlock(&d->mu);
        if (failed)
            break;
        struct grp_task *t = calloc(1, sizeof(*t));
        if (!t)
            return vmsnap_err_set(err, ENOMEM, "out of memory");
        t->t.run = grp_run;
        t->d = d;
        t->gi = i;
        xpool_mem_acquire(&d->x->pool, d->g[i].len);
        pthread_mutex_lock(&d->mu);
        d->pending++;
        pthread_mutex_unlock(&d->mu);
        xpool_submit(&d->x->pool, &t->t);
    }
    return 0;
}

/* A set's file opened on a pool thread (down_open), reported back through d->opened. */
struct open_task {
    struct xtask t;
    struct down *d;
    char dst[4352];
};

static void open_run(struct xtask *t, struct vmsnap_store_conn *c)
{
    struct open_task *ot = (struct open_task *)t;
    struct down *d = ot->d;
    struct vmsnap_err e = {0};
    int rc = down_open(d, c, ot->dst, &e);
    pthread_mutex_lock(&d->mu);
    d->start_rc = rc;
    if (rc < 0)
        d->open_err = e;
    d->opened = true;
    pthread_cond_broadcast(&d->cv);
    pthread_mutex_unlock(&d->mu); /* `d` may be gone from here on */
    free(ot);
}

/* Wait for a download's tasks; verify size and digest. */
static int down_finish(struct down *d, int rc, struct vmsnap_err *err)
{
    pthread_mutex_lock(&d->mu);
    while (d->pending || (d->pre_submitted && !d->pre_done)) /* a prefetch never waited for */
        pthread_cond_wait(&d->cv, &d->mu);
    pthread_mutex_unlock(&d->mu);
    /* groups never dispatched (an error stopped the loop) still hold no memory */
    if (rc == 0 && d->rc < 0) {
        rc = d->rc;
        if (err)
            *err = d->err;
    }
    if (rc == 0 && d->hashed != d->osize)
        rc = vmsnap_err_set(err, EIO, "%s: received %llu of %llu bytes", d->url,
                            (unsigned long long)d->hashed, (unsigned long long)d->osize);
    if (rc == 0 && d->mf && d->mf->detail && !d->mf->table_digest) {
        unsigned char md[32];
        unsigned mdl = 0;
        char hx[65];
        EVP_DigestFinal_ex(d->sha, md, &mdl);
        hex32(md, hx);
        if (strcmp(hx, d->mf->sha256))
            rc = vmsnap_err_set(err, EINVAL,
                                "%s: %s %s does not match the manifest (%s): refusing it", d->url,
                                d->mf->table_digest ? "tableSha256" : "sha256", hx, d->mf->sha256);
    }
    return rc;
}

static void down_free(struct down *d, bool keep)
{
    if (d->af_open && !keep)
        sys_atomic_abort(&d->af);
    vmsnap_image_free(d->img);
    free(d->tail.buf);
    free(d->pre);
    free(d->g);
    EVP_MD_CTX_free(d->sha);
    free(d->key);
    if (d->inited) {
        pthread_mutex_destroy(&d->mu);
        pthread_cond_destroy(&d->cv);
    }
}

struct any_ctx {
    unsigned n;
};

static int count_any(void *arg, const char *key, uint64_t size, int64_t mtime)
{
    (void)key;
    (void)size;
    (void)mtime;
    ((struct any_ctx *)arg)->n++;
    return -ECANCELED; /* one is enough */
}

/* ... and, when `raw` is not NULL, its bytes (the caller frees them). */
static int read_manifest_raw(struct vmsnap_store_conn *c, const char *mkey, const char *murl,
                             uint64_t max_size, struct manifest *m, char **raw, size_t *raw_len,
                             struct vmsnap_err *err)
{
    return read_manifest_x(c, mkey, murl, max_size, m, raw, raw_len, NULL, err);
}

/* read_manifest_raw(), and *unusable (when not NULL): the store answered with bytes that are
 * not a manifest vmsnap can use (too large, or not one), rather than failing to answer. */
static int read_manifest_x(struct vmsnap_store_conn *c, const char *mkey, const char *murl,
                           uint64_t max_size, struct manifest *m, char **raw, size_t *raw_len,
                           bool *unusable, struct vmsnap_err *err)
{
    if (unusable)
        *unusable = false;
    /* one GET of its last TAIL_READ bytes (the whole of any usual manifest) gives its size too */
    char *buf = malloc(TAIL_READ + 1);
    if (!buf)
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    size_t got;
    uint64_t size;
    int rc = vmsnap_store_get_tail(c, mkey, TAIL_READ, buf, &got, &size, err);
    if (rc == 0 && size > VMSNAP_XFER_MANIFEST_MAX) {
        rc = vmsnap_err_set(err, EFBIG, "%s: manifest of %llu bytes is too large", murl,
                            (unsigned long long)size);
        if (unusable)
            *unusable = true;
    }
    const bool two_gets = rc == 0 && got < size;
    if (two_gets) {
        /* larger than TAIL_READ: read it whole in one more GET rather than splicing the front
         * onto the tail, so a manifest replaced between the two requests cannot be half one
         * version and half the other (a longer replacement arrives truncated and fails to parse) */
        free(buf);
        buf = malloc(size + 1);
        if (!buf)
            rc = vmsnap_err_set(err, ENOMEM, "out of memory");
        else
            rc = vmsnap_store_get(c, mkey, 0, size, buf, err);
    }
    /* read in two GETs, a manifest replaced in between arrives cut (its parse fails): that is
     * not damage to replace, but another push's set (taken for corrupt, it was un-committed) */
    if (rc == 0 && (rc = manifest_parse(buf, size, murl, max_size, m, err)) < 0 && unusable)
        *unusable = rc != -ENOMEM && !two_gets;
    if (rc == 0 && raw) {
        *raw = buf;
        *raw_len = (size_t)size;
        return 0;
    }
    free(buf);
    return rc;
}

/* Links `.vmsnap-old.PID.N` that a pull killed during its publish left in `dir`, and the
 * temporaries `.vmsnap-pull.PID.XXXXXX` of a pull killed while it wrote (the process is gone):
 * they hold a replaced file's blocks, or a whole downloaded file. */
static void drop_stale_links(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *de;
    while ((de = readdir(d))) {
        long pid = 0;
        unsigned long seq = 0;
        char tail = 0;
        char rnd[8];
        bool ours =
            sscanf(de->d_name, ".vmsnap-old.%ld.%lu%c", &pid, &seq, &tail) == 2 ||
            (sscanf(de->d_name, ".vmsnap-pull.%ld.%6[A-Za-z0-9]%c", &pid, rnd, &tail) == 2 &&
             strlen(rnd) == 6);
        if (!ours || pid <= 0 || pid == (long)getpid() || kill((pid_t)pid, 0) == 0 ||
            errno != ESRCH)
            continue;
        /* ours only (a regular file of this user), and for a pull's temporary, not locked: the
         * pid of a pull in another PID namespace sharing this directory looks dead from here */
        struct stat sb;
        if (fstatat(dirfd(d), de->d_name, &sb, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISREG(sb.st_mode) ||
            sb.st_uid != geteuid())
            continue;
        if (!strncmp(de->d_name, ".vmsnap-pull.", 13)) {
            int fd = openat(dirfd(d), de->d_name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
            bool free_ = fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) == 0;
            if (fd >= 0)
                close(fd);
            if (!free_)
                continue;
        }
        unlinkat(dirfd(d), de->d_name, 0);
    }
    closedir(d);
}

/* Rename every pulled file of a set into `dir`, all or nothing as far as the filesystem lets it:
 * what can fail is tried for every file before the first rename (a directory in a file's place,
 * each file's fsync and close, where a delayed write error shows; a hard link keeping each file
 * the set replaces), so a failure leaves the directory as it was rather than half one set and
 * half another; a rename failing half way (EIO, a quota, a directory block on a full disk) puts
 * back what the earlier ones replaced. Then one fsync of the directory. */
static int publish_set(struct xfer *x, const char *dir, struct down *ds, size_t n,
                       struct vmsnap_xfer_stats *stats, struct vmsnap_err *err)
{
    static atomic_ulong link_seq;     /* unique names for pulls running at once in one process */
    sys_failpoint("pull-publishing"); /* every file downloaded, none in place: a test's kill */
    struct pub {
        char *path; /* the destination (the commit frees the atomic file's copy) */
        char *old;  /* a link to the file it replaces, or NULL */
        bool there; /* a file was there */
    } *p = calloc(n, sizeof(*p));
    if (!p)
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        const char *path = ds[i].af.path;
        struct stat db;
        p[i].there = lstat(path, &db) == 0;
        if (!(p[i].path = strdup(path)))
            rc = vmsnap_err_set(err, ENOMEM, "out of memory");
        else if (p[i].there && S_ISDIR(db.st_mode))
            rc = vmsnap_err_set(err, EISDIR, "%s is a directory: cannot put the set's file there",
                                path);
        else if (!x->o.no_fsync && fsync(ds[i].af.fd) < 0)
            rc = err_sys(err, "fsync %s", path);
        else
            rc = sys_atomic_close(&ds[i].af, err);
        if (rc < 0 || !p[i].there)
            continue;
        if (asprintf(&p[i].old, "%s/.vmsnap-old.%ld.%lu", dir, (long)getpid(),
                     atomic_fetch_add(&link_seq, 1)) < 0) {
            p[i].old = NULL;
            rc = vmsnap_err_set(err, ENOMEM, "out of memory");
            continue;
        }
        unlink(p[i].old); /* left by a killed pull that had this pid */
        if (link(path, p[i].old) < 0) {
            int e = errno;
            free(p[i].old);
            p[i].old = NULL;
            /* a filesystem without hard links, or no room for one more name: published without
             * a way back (as before there was one) */
            if (e != EPERM && e != ENOTSUP && e != EMLINK && e != ENOSPC && e != EDQUOT)
                rc = err_code(err, e, "link %s (kept until the set is in place)", path);
        }
    }
    size_t done = 0; /* commits tried; the last one tried failed when rc < 0 */
    for (; done < n && rc == 0; done++) {
        rc = sys_atomic_commit(&ds[done].af, false, err);
        ds[done].af_open = false;
    }
    if (rc < 0 && done > 1) { /* put back what the commits before the failed one replaced */
        bool mixed = false;
        for (size_t j = 0; j + 1 < done; j++) {
            if (p[j].old ? rename(p[j].old, p[j].path) < 0 : p[j].there || unlink(p[j].path) < 0)
                mixed = true;
        }
        if (mixed)
            vmsnap_err_wrap(err, "%s may now hold files of two sets: ", dir);
    }
    for (size_t j = 0; j < n; j++) {
        if (p[j].old)
            unlink(p[j].old);
        free(p[j].old);
        free(p[j].path);
    }
    free(p);
    if (rc == 0 && !x->o.no_fsync) {
        int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd < 0 || fsync(dfd) < 0)
            rc = err_sys(err,
                         "fsync directory %s (the set is in place, but may not survive a "
                         "crash)",
                         dir);
        if (dfd >= 0)
            close(dfd);
    }
    for (size_t j = 0; rc == 0 && stats && j < n; j++) {
        stats->files++;
        stats->logical += ds[j].stats.total_size;
        stats->populated += ds[j].stats.populated;
        stats->object_bytes += ds[j].osize;
    }
    return rc;
}

static int pull_set(struct xfer *x, struct vmsnap_store_conn *ctl, const char *prefix,
                    const struct manifest *m, const char *dir, struct vmsnap_xfer_stats *stats,
                    struct vmsnap_err *err)
{
    bool created = false;
    struct stat sb;
    if (stat(dir, &sb) == 0) {
        if (!S_ISDIR(sb.st_mode))
            return vmsnap_err_set(err, ENOTDIR, "%s exists and is not a directory", dir);
        drop_stale_links(dir); /* a killed pull's room back before this one needs it */
    } else if (errno == ENOENT) {
        if (mkdir(dir, 0700) < 0)
            return err_sys(err, "mkdir %s", dir);
        created = true;
    } else {
        return err_sys(err, "%s", dir);
    }
    /* Fail before downloading anything when the set cannot fit (the manifest gives every
     * file's populated bytes; the decoder writes those and leaves holes) */
    uint64_t need = 0;
    bool known = true;
    for (size_t i = 0; i < m->n; i++) {
        known = known && m->files[i].detail;
        need += m->files[i].populated + 4096;
    }
    struct statvfs vs;
    if (known && statvfs(dir, &vs) == 0 && need > (uint64_t)vs.f_bavail * vs.f_frsize) {
        if (created)
            rmdir(dir);
        return vmsnap_err_set(err, ENOSPC,
                              "%s: no space for the set: it needs %llu MiB, %llu MiB are free", dir,
                              (unsigned long long)(need >> 20),
                              (unsigned long long)(((uint64_t)vs.f_bavail * vs.f_frsize) >> 20));
    }
    /* an inode per file, for its temporary (f_files 0: the filesystem has no fixed count) */
    if (statvfs(dir, &vs) == 0 && vs.f_files > 0 && (uint64_t)vs.f_favail < (uint64_t)m->n) {
        if (created)
            rmdir(dir);
        return vmsnap_err_set(err, ENOSPC,
                              "%s: no inodes for the set: its %zu files need %zu, %llu are free",
                              dir, m->n, m->n, (unsigned long long)vs.f_favail);
    }
    /* every file's temporary stays open until the set is published: a set of more files than
     * the soft descriptor limit (often 1024) needs it raised, within the hard limit, for the
     * temporaries, every pool connection (a socket and curl's own descriptors: up to 4 each),
     * stdio and the libraries' own */
    struct rlimit rl;
    const rlim_t want = (rlim_t)m->n + 4 * (rlim_t)(x->pool.n + 1) + 64;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && want > rl.rlim_cur) {
        if (rl.rlim_max != RLIM_INFINITY && want > rl.rlim_max) {
            if (created)
                rmdir(dir);
            return vmsnap_err_set(err, EMFILE,
                                  "a set of %zu files needs %llu open files; the hard limit is "
                                  "%llu (ulimit -Hn)",
                                  m->n, (unsigned long long)want, (unsigned long long)rl.rlim_max);
        }
        rl.rlim_cur = want;
        (void)setrlimit(RLIMIT_NOFILE, &rl);
    }
    struct down *ds = calloc(m->n ? m->n : 1, sizeof(*ds));
    if (!ds) {
        if (created)
            rmdir(dir);
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    }
    int rc = 0;
    /* Largest object first, opened here on `ctl` and dispatched at once; the others are opened
     * in parallel on the pool's connections meanwhile (one or two GETs each) and dispatched as
     * they come in, so a set costs about two round trips before its largest file streams,
     * however many files it has. */
    size_t *order = calloc(m->n ? m->n : 1, sizeof(*order));
    if (!order)
        rc = vmsnap_err_set(err, ENOMEM, "out of memory");
    for (size_t i = 0; order && i < m->n; i++)
        order[i] = i;
    if (order)
        qsort_r(order, m->n, sizeof(*order), cmp_objsize_desc, m->files);
    char path0[4352] = "";
    /* at most one open per pool thread ahead of the dispatch: the bytes read when opening
     * (up to TAIL_READ per file) stay bounded for a set of many files */
    size_t ahead = x->pool.n ? x->pool.n : 1, started = 0;
    for (size_t k = 0; k < m->n && order; k++) {
        while (rc == 0 && started < m->n && started <= k + ahead) {
            size_t i = order[started];
            struct down *d = &ds[i];
            d->mf = &m->files[i];
            char obj[300];
            snprintf(obj, sizeof(obj), "%s.zstd", m->files[i].name);
            d->key = join_key(prefix, obj);
            struct open_task *ot = started ? calloc(1, sizeof(*ot)) : NULL;
            if (!d->key || (started && !ot)) {
                free(ot);
                free(d->key);
                d->key = NULL;
                rc = vmsnap_err_set(err, ENOMEM, "out of memory");
                break;
            }
            down_init(d);
            d->x = x; /* marks it started: finished and freed below */
            if (started++ == 0) {
                snprintf(path0, sizeof(path0), "%s/%s", dir, m->files[i].name);
                down_prefetch(d);
                continue;
            }
            snprintf(ot->dst, sizeof(ot->dst), "%s/%s", dir, m->files[i].name);
            ot->t.run = open_run;
            ot->d = d;
            xpool_submit(&x->pool, &ot->t);
        }
        struct down *d = &ds[order[k]];
        if (!d->x)
            break;
        int r;
        if (k == 0) {
            r = rc == 0 ? down_open(d, ctl, path0, err) : -ECANCELED;
            d->opened = true;
        } else {
            pthread_mutex_lock(&d->mu);
            while (!d->opened)
                pthread_cond_wait(&d->cv, &d->mu);
            r = d->start_rc;
            pthread_mutex_unlock(&d->mu);
            if (r < 0 && rc == 0 && err)
                *err = d->open_err;
        }
        if (r == 0 && rc == 0)
            r = down_submit(d, err);
        else if (r == 0)
            r = -ECANCELED; /* opened, but an earlier file failed: not dispatched */
        d->start_rc = r;
        if (r < 0 && rc == 0)
            rc = r;
    }
    free(order);
    for (size_t i = 0; i < m->n; i++) {
        if (!ds[i].x)
            continue;
        struct vmsnap_err e = {0};
        int r = down_finish(&ds[i], ds[i].start_rc, &e);
        if (r < 0 && rc == 0) {
            rc = r;
            if (err)
                *err = e;
        }
    }
    /* all verified: publish every file (all were started when rc is 0) */
    if (rc == 0)
        rc = publish_set(x, dir, ds, m->n, stats, err);
    for (size_t i = 0; i < m->n; i++)
        if (ds[i].x)
            down_free(&ds[i], false);
    free(ds);
    if (rc < 0 && created)
        rmdir(dir);
    return rc;
}

int vmsnap_xfer_pull(const char *url, const char *path, const struct vmsnap_xfer_opts *opts,
                     struct vmsnap_xfer_stats *stats, struct vmsnap_err *err)
{
    if (stats)
        memset(stats, 0, sizeof(*stats));
    struct xfer x;
    char *key = NULL;
    int rc = xfer_init(&x, url, opts, &key, err);
    if (rc < 0)
        return rc;
    struct vmsnap_store_conn *ctl = NULL;
    bool pool = false;
    char *mkey = join_key(key, VMSNAP_XFER_MANIFEST);
    char murl[URL_BUF];
    struct manifest m = {0};
    if (!mkey) {
        rc = vmsnap_err_set(err, ENOMEM, "out of memory");
        goto out;
    }
    vmsnap_store_url(x.st, mkey, murl, sizeof(murl));
    if (local_same(&x, key, path, false)) {
        rc =
            vmsnap_err_set(err, EINVAL, "the destination %s is where the snapshot is stored", path);
        goto out;
    }
    if ((rc = vmsnap_store_conn_new(x.st, &ctl, err)) < 0)
        goto out;
    rc = read_manifest(ctl, mkey, murl, x.o.max_size, &m, err);
    if (rc == 0) {
        if ((rc = xfer_start_pool(&x, err)) < 0)
            goto out;
        pool = true;
        rc = pull_set(&x, ctl, key, &m, path, stats, err);
        goto out;
    }
    if (rc != -ENOENT || !*key)
        goto out;
    if (x.o.set_only) {
        uint64_t osz;
        bool object = vmsnap_store_head(ctl, key, &osz, NULL) == 0;
        rc = vmsnap_err_set(err, ENOENT, "%s: no snapshot set there (no %s)%s", url,
                            VMSNAP_XFER_MANIFEST,
                            object ? ": it is a single object, and a set is needed" : "");
        goto out;
    }
    /* no manifest: a single object, or an incomplete set */
    uint64_t size;
    struct vmsnap_err herr = {0};
    rc = vmsnap_store_head(ctl, key, &size, &herr);
    if (rc == -ENOENT) {
        struct any_ctx any = {0};
        char *lp = join_key(key, "");
        int lrc = lp ? vmsnap_store_list(ctl, lp, count_any, &any, err) : -ENOMEM;
        free(lp);
        if (lrc < 0 && lrc != -ECANCELED) {
            rc = lrc;
            goto out;
        }
        if (any.n)
            rc = vmsnap_err_set(err, ENOENT, "incomplete snapshot: no manifest at %s", murl);
        else
            rc = vmsnap_err_set(err, ENOENT, "%s: no such object or snapshot set", url);
        goto out;
    }
    if (rc < 0) {
        if (err)
            *err = herr;
        goto out;
    }
    if ((rc = xfer_start_pool(&x, err)) < 0)
        goto out;
    pool = true;
    struct down d = {.x = &x, .key = strdup(key)};
    if (!d.key) {
        rc = vmsnap_err_set(err, ENOMEM, "out of memory");
        goto out;
    }
    down_init(&d);
    { /* a killed pull's temporaries beside the destination: their room back first */
        char pdir[4352];
        snprintf(pdir, sizeof(pdir), "%s", path);
        char *sl = strrchr(pdir, '/');
        if (sl)
            sl[sl == pdir] = '\0';
        drop_stale_links(sl ? pdir : ".");
    }
    rc = down_open(&d, ctl, path, err);
    if (rc == 0)
        rc = down_submit(&d, err);
    rc = down_finish(&d, rc, err);
    if (rc == 0)
        rc = sys_atomic_commit(&d.af, !x.o.no_fsync, err);
    if (rc == 0) {
        d.af_open = false;
        if (stats) {
            stats->files = 1;
            stats->logical = d.stats.total_size;
            stats->populated = d.stats.populated;
            stats->object_bytes = d.osize;
        }
    }
    d.af_open = d.af_open && rc < 0;
    down_free(&d, false);
out:
    if (rc < 0 && err && !strstr(err->msg, "incomplete snapshot") &&
        strncmp(err->msg, url, strlen(url)))
        vmsnap_err_wrap(err, "pull %s: ", url);
    manifest_fini(&m);
    free(mkey);
    vmsnap_store_conn_free(ctl);
    xfer_fini(&x, pool);
    free(key);
    return rc;
}

/* ---------------------------------------------------------------------------------------- */
/* ls, rm, gc                                                                                */

struct keys {
    char **v;
    size_t n, cap;
    const char *suffix; /* keep keys ending with this ("" = all) */
    const char *direct; /* keep only keys directly under this prefix (NULL = any depth) */
    bool whole_name;    /* the suffix is a whole last component */
};

static int collect(void *arg, const char *key, uint64_t size, int64_t mtime)
{
    (void)size;
    (void)mtime;
    struct keys *k = arg;
    size_t kl = strlen(key), sl = strlen(k->suffix);
    if (kl < sl || strcmp(key + kl - sl, k->suffix))
        return 0;
    if (k->whole_name && kl > sl && key[kl - sl - 1] != '/')
        return 0; /* "xmanifest.json" is not a manifest */
    if (k->direct && strchr(key + strlen(k->direct), '/'))
        return 0;
    if (k->n >= 1000000)
        return -E2BIG;
    if (k->n == k->cap) {
        size_t cap = k->cap ? k->cap * 2 : 16;
        char **nv = realloc(k->v, cap * sizeof(*nv));
        if (!nv)
            return -ENOMEM;
        k->v = nv;
        k->cap = cap;
    }
    k->v[k->n] = strdup(key);
    if (!k->v[k->n])
        return -ENOMEM;
    k->n++;
    return 0;
}

static void keys_free(struct keys *k)
{
    for (size_t i = 0; i < k->n; i++)
        free(k->v[i]);
    free(k->v);
}

/* A local prefix (ls, gc) is a directory that exists: a mistyped path is not an empty store
 * (S3 cannot tell: a prefix without objects is just empty). */
static int local_prefix_exists(struct xfer *x, const char *url, const char *key,
                               struct vmsnap_err *err)
{
    if (x->st->kind != VMSNAP_STORE_LOCAL || !*key)
        return 0;
    char *dir = store_local_path(x->st, key);
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

int vmsnap_xfer_list(const char *url, const struct vmsnap_xfer_opts *opts, vmsnap_xfer_list_fn fn,
                     void *arg, struct vmsnap_err *err)
{
    struct xfer x;
    char *key = NULL;
    int rc = xfer_init(&x, url, opts, &key, err);
    if (rc < 0)
        return rc;
    struct vmsnap_store_conn *c = NULL;
    struct keys k = {.suffix = VMSNAP_XFER_MANIFEST, .whole_name = true};
    char *lp = join_key(key, "");
    if (!lp)
        rc = vmsnap_err_set(err, ENOMEM, "out of memory");
    if (rc == 0)
        rc = local_prefix_exists(&x, url, key, err);
    if (rc == 0)
        rc = vmsnap_store_conn_new(x.st, &c, err);
    if (rc == 0) {
        rc = vmsnap_store_list(c, lp, collect, &k, err);
        if (rc < 0 && (!err || !err->code))
            rc = err_code(err, -rc, "list %s", url);
    }
    for (size_t i = 0; i < k.n && rc == 0; i++) {
        char murl[URL_BUF], surl[URL_BUF];
        vmsnap_store_url(x.st, k.v[i], murl, sizeof(murl));
        snprintf(surl, sizeof(surl), "%.*s", (int)(strlen(murl) - strlen(VMSNAP_XFER_MANIFEST) - 1),
                 murl);
        if (x.st->kind == VMSNAP_STORE_LOCAL && !strncmp(surl, "//", 2))
            memmove(surl, surl + 1, strlen(surl));
        struct manifest m = {0};
        struct vmsnap_err me = {0};
        struct vmsnap_xfer_set set = {.url = surl};
        if (read_manifest(c, k.v[i], murl, x.o.max_size, &m, &me) == 0) {
            set.valid = true;
            set.files = m.n;
            for (size_t j = 0; j < m.n; j++) {
                set.logical += m.files[j].size;
                set.object_bytes += m.files[j].object_size;
            }
        } else {
            vlog(VMSNAP_LOG_WARN, "%s", me.msg);
        }
        manifest_fini(&m);
        rc = fn(arg, &set);
    }
    if (rc == 0 && c->list_skipped)
        rc = vmsnap_err_set(err, EACCES,
                            "%s: some directories under it could not be read (skipped: see the "
                            "warnings above); the list is incomplete",
                            url);
    keys_free(&k);
    free(lp);
    vmsnap_store_conn_free(c);
    xfer_fini(&x, false);
    free(key);
    return rc;
}

/*
 * gc of push marks (manifest_int.h): keys "[P/]vmsnap-push-<32 hex>.json" under the prefix.
 * A push may be running at a prefix, or start there while gc works, writing objects of the very
 * names an old mark lists. So gc removes anything only from a prefix that is quiet: nothing under
 * it written for `older_than` (the store's own times, every key), no upload there active for that
 * long, every mark readable; and just before deleting it lists the prefix again and leaves it
 * alone if anything changed (a push starting meanwhile writes its mark first).
 */
struct mark_keys {
    struct keys k;
    const char *under;
};

static size_t dir_len(const char *key)
{
    const char *sl = strrchr(key, '/');
    return sl ? (size_t)(sl - key) : 0;
}

static int collect_mark(void *arg, const char *key, uint64_t size, int64_t mtime)
{
    struct mark_keys *mk = arg;
    char id[33];
    if (!mark_name(key_base(key), id) || !key_under(mk->under, key))
        return 0;
    return collect(&mk->k, key, size, mtime);
}

/* Directory first (so that one prefix's marks are adjacent), then name. */
static int cmp_by_dir(const void *a, const void *b)
{
    const char *x = *(char *const *)a, *y = *(char *const *)b;
    size_t dx = dir_len(x), dy = dir_len(y);
    int c = memcmp(x, y, VMSNAP_MIN(dx, dy));
    if (c)
        return c;
    if (dx != dy)
        return dx < dy ? -1 : 1;
    return strcmp(x + dx, y + dy);
}

/* A push mark, read whole (capped like a manifest) and parsed. */
static int read_mark(struct vmsnap_store_conn *c, const char *key, const char *murl,
                     struct push_mark *pm, struct vmsnap_err *err)
{
    char id[33];
    if (!mark_name(key_base(key), id))
        return vmsnap_err_set(err, EINVAL, "%s: not a push mark name", murl);
    char *buf = malloc(TAIL_READ);
    if (!buf)
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    size_t got = 0;
    uint64_t size = 0;
    int rc = vmsnap_store_get_tail(c, key, TAIL_READ, buf, &got, &size, err);
    if (rc == 0 && size > VMSNAP_XFER_MANIFEST_MAX)
        rc = vmsnap_err_set(err, EFBIG, "%s: push mark of %llu bytes is too large", murl,
                            (unsigned long long)size);
    if (rc == 0 && got < size) { /* whole, in one GET (as read_manifest) */
        free(buf);
        buf = malloc(size);
        if (!buf)
            rc = vmsnap_err_set(err, ENOMEM, "out of memory");
        else
            rc = vmsnap_store_get(c, key, 0, size, buf, err);
        got = (size_t)size;
    }
    if (rc == 0)
        rc = push_mark_parse(buf, got, murl, id, pm, err);
    free(buf);
    return rc;
}

/* The objects gc would delete at a prefix, as its first listing saw them. */
struct cand {
    char *key;
    uint64_t size;
    int64_t mtime;
    bool present; /* in the first listing */
};

/* What a listing of a prefix saw: the newest write, and a fingerprint of every key but the
 * candidates (which are checked one by one), enough to tell that nothing changed between two
 * listings. */
struct prefix_seen {
    uint64_t keys, sum;
    int64_t newest; /* the newest write under it (-1: none seen) */
    bool unknown;   /* a key whose time the store did not give */
    struct cand *cands;
    size_t ncands;
    bool record;  /* first listing: note the candidates; else compare with what it noted */
    bool changed; /* a candidate differs from the first listing */
};

static int see_key(void *arg, const char *key, uint64_t size, int64_t mtime)
{
    struct prefix_seen *p = arg;
    if (mtime < 0)
        p->unknown = true;
    else if (mtime > p->newest)
        p->newest = mtime;
    for (size_t i = 0; i < p->ncands; i++) {
        struct cand *c = &p->cands[i];
        if (strcmp(c->key, key))
            continue;
        if (p->record)
            *c = (struct cand){c->key, size, mtime, true};
        else if (!c->present || c->size != size || c->mtime != mtime)
            p->changed = true; /* written since: a push's now */
        return 0;
    }
    p->keys++;
    uint64_t v[2] = {size, (uint64_t)mtime};
    p->sum += XXH64(key, strlen(key), XXH64(v, sizeof(v), 0));
    return 0;
}

struct prefix_uploads {
    struct vmsnap_store_conn *c;
    int64_t newest; /* the latest activity of an upload under the prefix (-1: none) */
    bool unknown;
    struct vmsnap_err err; /* why the listing stopped */
};

static int see_upload(void *arg, const char *key, const char *id, int64_t started)
{
    struct prefix_uploads *u = arg;
    int64_t last;
    int rc = upload_last(u->c, key, id, started, &last, &u->err);
    if (rc < 0 && rc != -ENOENT)
        return rc;
    u->unknown |= started < 0;
    if (last > u->newest)
        u->newest = last;
    return 0;
}

struct live_ctx {
    size_t dl;      /* the length of the directory looked at */
    bool mark;      /* a push mark directly in it */
    int64_t newest; /* the newest key's time under it (-1: none) */
    bool unknown;
};

/* Only what is directly in the directory: a set pushed below it is another push's. */
static int see_live_key(void *arg, const char *key, uint64_t size, int64_t mtime)
{
    struct live_ctx *v = arg;
    (void)size;
    char id[33];
    if (dir_len(key) != v->dl)
        return 0;
    if (mark_name(key_base(key), id))
        v->mark = true;
    v->unknown |= mtime < 0;
    if (mtime > v->newest)
        v->newest = mtime;
    return 0;
}

struct live_uploads {
    struct prefix_uploads up;
    size_t dl;
};

static int see_live_upload(void *arg, const char *key, const char *id, int64_t started)
{
    struct live_uploads *u = arg;
    return dir_len(key) == u->dl ? see_upload(&u->up, key, id, started) : 0;
}

/* Is a set push running at the directory of `key`? Its mark is there, and something under that
 * directory (a key written, an upload's part) is younger than --older-than, or its age cannot be
 * told: gc then leaves that directory's uploads as it leaves the marks of a prefix that is not
 * quiet. */
static bool push_running_at(struct leftover_ctx *l, const char *key)
{
    size_t dl = dir_len(key);
    /* uploads come listed by key: a directory's are asked about once */
    if (l->live_dir && strlen(l->live_dir) == dl && !strncmp(l->live_dir, key, dl))
        return l->live;
    char *dir = strndup(key, dl);
    char *lp = dir ? join_key(dir, "") : NULL;
    if (!lp) {
        free(dir);
        return true;
    }
    struct live_ctx v = {.dl = dl, .newest = -1};
    struct live_uploads lu = {.up = {.c = l->c, .newest = -1}, .dl = dl};
    bool running = true;
    if (vmsnap_store_list(l->c, lp, see_live_key, &v, NULL) == 0) {
        running = v.mark;
        if (running && vmsnap_store_list_uploads(l->c, lp, see_live_upload, &lu, NULL) == 0) {
            int64_t newest = VMSNAP_MAX(v.newest, lu.up.newest);
            running =
                v.unknown || lu.up.unknown || newest < 0 || !old_enough(l->gc, age_of(l, newest));
        }
    }
    free(lp);
    free(l->live_dir);
    l->live_dir = dir;
    l->live = running;
    return running;
}

/* Keep every mark of a prefix (reported as kept). */
static void keep_marks(struct leftover_ctx *l, char **keys, size_t n, int64_t age)
{
    for (size_t i = 0; i < n; i++) {
        gc_report(l, VMSNAP_GC_PUSH, keys[i], age, false);
        l->kept++;
    }
}

/* The marks of one prefix `dir` (the part of their keys before the name). */
static void clean_marks_in(struct xfer *x, struct vmsnap_store_conn *c, struct leftover_ctx *l,
                           char **keys, size_t n, const char *dir)
{
    const struct vmsnap_gc_opts *g = l->gc;
    struct push_mark *pm = calloc(n, sizeof(*pm));
    struct manifest m = {0};
    struct cand *cands = NULL;
    size_t nc = 0;
    char *mkey = join_key(dir, VMSNAP_XFER_MANIFEST);
    char *lp = join_key(dir, "");
    char durl[URL_BUF];
    vmsnap_store_url(x->st, dir, durl, sizeof(durl));
    struct vmsnap_err e = {0};
    if (!pm || !mkey || !lp) {
        vmsnap_err_set(&e, ENOMEM, "out of memory");
        gc_failed(l, keys[0], &e);
        goto out;
    }
    /* every mark, whole: one that cannot be read could be a running push's */
    size_t names = 0;
    for (size_t i = 0; i < n; i++) {
        char murl[URL_BUF];
        vmsnap_store_url(x->st, keys[i], murl, sizeof(murl));
        int rc = read_mark(c, keys[i], murl, &pm[i], &e);
        if (rc == -ENOENT) { /* gone meanwhile: a push just finished here */
            keep_marks(l, keys, n, 0);
            goto out;
        }
        if (rc < 0) {
            vlog(VMSNAP_LOG_WARN, "%s (nothing under %s removed)", e.msg, durl);
            gc_failed(l, keys[i], &e);
            keep_marks(l, keys, n, -1);
            goto out;
        }
        names += pm[i].n;
    }
    char murl[URL_BUF];
    vmsnap_store_url(x->st, mkey, murl, sizeof(murl));
    int mrc = read_manifest(c, mkey, murl, x->o.max_size, &m, &e);
    if (mrc < 0 && mrc != -ENOENT) {
        /* which objects are the set's is not known: leave them all */
        vlog(VMSNAP_LOG_WARN, "%s (the push marks beside it are left in place)", e.msg);
        gc_failed(l, mkey, &e);
        keep_marks(l, keys, n, -1);
        goto out;
    }
    /* the candidates: objects named by a mark, not by the manifest (once each) */
    cands = calloc(names ? names : 1, sizeof(*cands));
    if (!cands) {
        vmsnap_err_set(&e, ENOMEM, "out of memory");
        gc_failed(l, keys[0], &e);
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        /* a mark of the committed set's own push: its files are that set's; what it replaced
         * and did not remove yet (killed right after its commit) is not */
        bool own = mrc == 0 && !strcmp(m.push_id, pm[i].push_id);
        for (size_t j = own ? pm[i].nfiles : 0; j < pm[i].n; j++) {
            bool keep = false;
            for (size_t f = 0; mrc == 0 && f < m.n && !keep; f++)
                keep = !strcmp(m.files[f].name, pm[i].names[j]);
            char obj[300];
            snprintf(obj, sizeof(obj), "%s.zstd", pm[i].names[j]);
            char *k = keep ? NULL : join_key(dir, obj);
            for (size_t q = 0; k && q < nc; q++)
                if (!strcmp(cands[q].key, k))
                    free(k), k = NULL;
            if (k)
                cands[nc++].key = k;
        }
    }
    /* quiet: no key written and no upload active for older_than */
    struct prefix_seen seen = {.newest = -1, .cands = cands, .ncands = nc, .record = true};
    struct prefix_uploads up = {.c = c, .newest = -1};
    int rc = vmsnap_store_list(c, lp, see_key, &seen, &e);
    if (rc == 0 && (rc = vmsnap_store_list_uploads(c, lp, see_upload, &up, &e)) < 0 && !e.code)
        e = up.err; /* stopped by see_upload */
    if (rc < 0) {
        vlog(VMSNAP_LOG_WARN, "cannot list %s: %s (nothing there removed)", durl, e.msg);
        gc_failed(l, keys[0], &e);
        keep_marks(l, keys, n, -1);
        goto out;
    }
    int64_t newest = VMSNAP_MAX(seen.newest, up.newest);
    int64_t age = newest < 0 ? -1 : age_of(l, newest);
    if (g->older_than > 0 && (seen.unknown || up.unknown || !old_enough(g, age))) {
        keep_marks(l, keys, n, age);
        if (seen.unknown || up.unknown)
            l->unknown += (unsigned)n;
        goto out;
    }
    if (g->dry_run) {
        for (size_t i = 0; i < n; i++)
            gc_report(l, VMSNAP_GC_PUSH, keys[i], age, true);
        l->pushes += (unsigned)n;
        for (size_t q = 0; q < nc; q++)
            l->objects += cands[q].present;
        goto out;
    }
    sys_failpoint("gc-before-delete");
    /* Each delete right after a listing that shows the prefix as the first one did (a push
     * started since wrote its mark, and whatever it stored is newer), in one attempt: no
     * back-off between the check and the delete. Then the marks. */
    unsigned done = 0;
    for (size_t q = 0; q <= nc; q++) {
        if (q < nc && !cands[q].present)
            continue;
        struct prefix_seen again = {.newest = -1, .cands = cands, .ncands = nc};
        rc = vmsnap_store_list(c, lp, see_key, &again, &e);
        if (rc < 0 || again.keys != seen.keys || again.sum != seen.sum || again.changed) {
            if (rc < 0)
                gc_failed(l, keys[0], &e);
            else
                vlog(VMSNAP_LOG_WARN,
                     "%s changed while gc looked at it (a push?): left for the next run", durl);
            keep_marks(l, keys, n, age);
            goto counted;
        }
        if (q == nc)
            break;
        c->one_attempt = true;
        rc = vmsnap_store_delete(c, cands[q].key, &e);
        c->one_attempt = false;
        if (rc < 0 && rc != -ENOENT) {
            vlog(VMSNAP_LOG_WARN, "cannot delete %s: %s (the marks stay for the next run)",
                 cands[q].key, e.msg);
            gc_failed(l, cands[q].key, &e);
            keep_marks(l, keys, n, age);
            goto counted;
        }
        cands[q].present = false; /* gone now: the next listing must not show it */
        done++;
    }
    for (size_t i = 0; i < n; i++) {
        rc = vmsnap_store_delete(c, keys[i], &e);
        if (rc < 0 && rc != -ENOENT) {
            gc_failed(l, keys[i], &e);
            l->kept++;
            continue;
        }
        vlog(VMSNAP_LOG_INFO, "removed the push mark %s", keys[i]);
        gc_report(l, VMSNAP_GC_PUSH, keys[i], age, true);
        l->pushes++;
    }
    if (mrc == -ENOENT)
        vmsnap_store_tidy(c, lp);
counted:
    l->objects += done;
out:
    for (size_t i = 0; pm && i < n; i++)
        push_mark_fini(&pm[i]);
    for (size_t q = 0; q < nc; q++)
        free(cands[q].key);
    free(cands);
    free(pm);
    free(mkey);
    free(lp);
    manifest_fini(&m);
}

static int clean_marks(struct xfer *x, struct vmsnap_store_conn *c, struct leftover_ctx *l,
                       const char *prefix, struct vmsnap_err *err)
{
    struct mark_keys mk = {.k = {.suffix = ""}, .under = prefix};
    /* every key that starts with `prefix`, then key_under */
    int rc = vmsnap_store_list(c, prefix, collect_mark, &mk, err);
    if (rc < 0 && (!err || !err->code))
        rc = err_code(err, -rc, "list %s", prefix);
    if (rc == 0 && mk.k.n)
        qsort(mk.k.v, mk.k.n, sizeof(*mk.k.v), cmp_by_dir);
    for (size_t i = 0; rc == 0 && i < mk.k.n;) {
        size_t dl = dir_len(mk.k.v[i]);
        size_t j = i + 1;
        while (j < mk.k.n && dir_len(mk.k.v[j]) == dl && !strncmp(mk.k.v[j], mk.k.v[i], dl))
            j++;
        char *dir = strndup(mk.k.v[i], dl);
        if (!dir) {
            rc = vmsnap_err_set(err, ENOMEM, "out of memory");
            break;
        }
        clean_marks_in(x, c, l, mk.k.v + i, j - i, dir);
        free(dir);
        i = j;
    }
    keys_free(&mk.k);
    return rc;
}

int vmsnap_xfer_gc(const char *url, const struct vmsnap_gc_opts *g,
                   const struct vmsnap_xfer_opts *opts, struct vmsnap_gc_result *res,
                   struct vmsnap_err *err)
{
    static const struct vmsnap_gc_opts all;
    struct xfer x;
    char *key = NULL;
    if (res)
        *res = (struct vmsnap_gc_result){0};
    int rc = xfer_init(&x, url, opts, &key, err);
    if (rc < 0)
        return rc;
    struct vmsnap_store_conn *c = NULL;
    struct leftover_ctx l = {.under = key, .gc = g ? g : &all, .now = (int64_t)time(NULL)};
    rc = local_prefix_exists(&x, url, key, err);
    if (rc == 0)
        rc = vmsnap_store_conn_new(x.st, &c, err);
    l.c = c;
    if (rc == 0)
        rc = vmsnap_store_list_uploads(c, key, abort_leftover, &l, err);
    unsigned up_failed = l.failed;
    if (rc == 0)
        rc = clean_marks(&x, c, &l, key, err);
    if (rc == 0 && up_failed)
        rc = vmsnap_err_set(err, l.first.code ? l.first.code : EIO,
                            "could not abort %u of %u unfinished upload%s under %s (%s: %s)",
                            up_failed, up_failed + l.n, up_failed + l.n == 1 ? "" : "s", url,
                            l.first_key, l.first.msg);
    else if (rc == 0 && l.failed)
        rc = vmsnap_err_set(err, l.first.code ? l.first.code : EIO,
                            "%u of the things killed pushes left under %s could not be removed "
                            "(%s: %s)",
                            l.failed, url, l.first_key, l.first.msg);
    else if (rc == 0 && c->list_skipped)
        rc = vmsnap_err_set(err, EACCES,
                            "some directories under %s could not be read (skipped: see the "
                            "warnings above); what killed pushes left there stays",
                            url);
    if (res)
        *res = (struct vmsnap_gc_result){.aborted = l.n,
                                         .pushes = l.pushes,
                                         .objects = l.objects,
                                         .kept = l.kept,
                                         .unknown_age = l.unknown,
                                         .failed = l.failed};
    free(l.live_dir);
    vmsnap_store_conn_free(c);
    xfer_fini(&x, false);
    free(key);
    return rc;
}

/* The first bytes of object `key` begin a snapshot image: 1 (vmsnap's or the reference's
 * sparse-extent magic; with `zstd_too`, also a zstd or skippable frame: a plain-zstd snapshot),
 * 0 when they do not, -errno when they cannot be read. */
static int snapshot_magic(struct vmsnap_store_conn *c, const char *key, uint64_t size,
                          bool zstd_too, struct vmsnap_err *err)
{
    uint8_t h[8];
    size_t n = (size_t)VMSNAP_MIN(size, (uint64_t)sizeof(h));
    if (n < 4)
        return 0;
    int rc = vmsnap_store_get(c, key, 0, n, h, err);
    if (rc < 0)
        return rc;
    if (n == 8 && !memcmp(h, "ATESPRSE", 8))
        return 1;
    uint32_t m = (uint32_t)h[0] | (uint32_t)h[1] << 8 | (uint32_t)h[2] << 16 | (uint32_t)h[3] << 24;
    return zstd_too && (m == 0xFD2FB528u || (m & 0xFFFFFFF0u) == 0x184D2A50u);
}

int vmsnap_xfer_remove(const char *url, bool force, const struct vmsnap_xfer_opts *opts,
                       struct vmsnap_rm_result *res, struct vmsnap_err *err)
{
    struct vmsnap_rm_result r0 = {0};
    if (!res)
        res = &r0;
    *res = r0;
    struct xfer x;
    char *key = NULL;
    int rc = xfer_init(&x, url, opts, &key, err);
    if (rc < 0)
        return rc;
    struct vmsnap_store_conn *c = NULL;
    char *mkey = join_key(key, VMSNAP_XFER_MANIFEST);
    char *lp = join_key(key, "");
    struct manifest m = {0};
    struct keys k = {.suffix = ".zstd"};
    struct vmsnap_err kept_err = {0};
    char murl[URL_BUF];
    if (!*key) {
        rc = vmsnap_err_set(err, EINVAL, "%s: refusing to remove a whole bucket or root", url);
        goto out;
    }
    if (!mkey || !lp) {
        rc = vmsnap_err_set(err, ENOMEM, "out of memory");
        goto out;
    }
    vmsnap_store_url(x.st, mkey, murl, sizeof(murl));
    if ((rc = vmsnap_store_conn_new(x.st, &c, err)) < 0)
        goto out;
    struct vmsnap_err me = {0};
    bool unusable = false;
    int mrc = read_manifest_x(c, mkey, murl, x.o.max_size, &m, NULL, NULL, &unusable, &me);
    if (mrc == -ENOENT && strstr(me.msg, "no such bucket")) { /* a HEAD's 404 cannot tell */
        rc = mrc;
        if (err)
            *err = me;
        goto out;
    }
    if (mrc == -ENOENT) {
        uint64_t size;
        rc = vmsnap_store_head(c, key, &size, err);
        const char *slash = rc == 0 ? strrchr(key, '/') : NULL;
        if (slash) {
            /* an object that a committed set beside it names: removing it alone breaks that
             * set (an object the set does not name, an older single-object snapshot, may go;
             * a manifest that cannot be read cannot tell, so it is kept) */
            char pm[URL_BUF], pu[URL_BUF] = "";
            int w =
                snprintf(pm, sizeof(pm), "%.*s/%s", (int)(slash - key), key, VMSNAP_XFER_MANIFEST);
            struct manifest pmf = {0};
            struct vmsnap_err pe = {0};
            int prc = -ENAMETOOLONG;
            if (w > 0 && (size_t)w < sizeof(pm)) {
                vmsnap_store_url(x.st, pm, pu, sizeof(pu));
                prc = read_manifest(c, pm, pu, x.o.max_size, &pmf, &pe);
            }
            const char *obj = slash + 1;
            size_t ol = strlen(obj);
            bool named = prc < 0 && prc != -ENOENT;
            for (size_t i = 0; i < pmf.n && !named; i++)
                named = ol == strlen(pmf.files[i].name) + 5 &&
                        !strncmp(obj, pmf.files[i].name, ol - 5) && !strcmp(obj + ol - 5, ".zstd");
            manifest_fini(&pmf);
            if (named) {
                rc = vmsnap_err_set(err, EBUSY,
                                    "%s belongs to the snapshot set whose manifest is %s%s%s: "
                                    "removing it alone would break that set; remove the set "
                                    "(its URL) instead",
                                    url, pu, prc < 0 ? ", which cannot be read: " : "",
                                    prc < 0 ? pe.msg : "");
                goto out;
            }
        }
        if (rc == 0) { /* a single object: a snapshot's only (rm is not a general delete) */
            rc = snapshot_magic(c, key, size, true, err);
            if (rc == 0)
                rc = vmsnap_err_set(err, EINVAL,
                                    "%s: not a snapshot (no vmsnap, reference or zstd magic at "
                                    "byte 0): not removed",
                                    url);
            else if (rc > 0 && (rc = vmsnap_store_delete(c, key, err)) == 0)
                res->object = true;
            goto out;
        }
        if (rc != -ENOENT)
            goto out;
        if (!force) {
            rc = vmsnap_err_set(err, ENOENT,
                                "%s: no snapshot set here (no %s); --force deletes the *.zstd "
                                "objects under it",
                                url, VMSNAP_XFER_MANIFEST);
            goto out;
        }
        rc = 0;
    } else if (mrc < 0 && !force) {
        rc = mrc;
        if (err)
            *err = me;
        /* --force is for a manifest that is not one (corrupt); a store that did not answer
         * is not helped by it */
        vmsnap_err_wrap(err, unusable ? "cannot read the manifest (--force deletes anyway): "
                                      : "cannot read the manifest: ");
        goto out;
    } else {
        /* the manifest first: from here on the set is no longer visible */
        if ((rc = vmsnap_store_delete(c, mkey, err)) < 0)
            goto out;
        res->set = true;
    }
    for (size_t i = 0; i < m.n && rc == 0; i++) {
        char obj[300];
        snprintf(obj, sizeof(obj), "%s.zstd", m.files[i].name);
        char *ok = join_key(key, obj);
        uint64_t osize;
        /* counted only when there (deleting a missing object succeeds) */
        rc = ok ? vmsnap_store_head(c, ok, &osize, err)
                : vmsnap_err_set(err, ENOMEM, "out of memory");
        if (rc == -ENOENT) {
            rc = 0;
        } else if (rc == 0 && (rc = vmsnap_store_delete(c, ok, err)) == 0) {
            char kurl[URL_BUF];
            vlog(VMSNAP_LOG_INFO, "removed %s", vmsnap_store_url(x.st, ok, kurl, sizeof(kurl)));
            res->objects++;
        }
        free(ok);
    }
    if (rc == 0 && force) {
        /* the set's objects are vmsnap images: anything else named *.zstd here (a plain zstd
         * backup, a file of the user's) is not the set's, and stays */
        k.direct = lp;
        rc = vmsnap_store_list(c, lp, collect, &k, err);
        for (size_t i = 0; i < k.n && rc == 0; i++) {
            uint64_t size;
            rc = vmsnap_store_head(c, k.v[i], &size, err);
            if (rc == -ENOENT) {
                rc = 0; /* deleted above (a manifest's) or meanwhile */
                continue;
            }
            if (rc == 0)
                rc = snapshot_magic(c, k.v[i], size, false, err);
            if (rc == -ENOENT) { /* gone between the HEAD and the GET */
                rc = 0;
                continue;
            }
            char kurl[URL_BUF];
            vmsnap_store_url(x.st, k.v[i], kurl, sizeof(kurl));
            if (rc == 0) {
                vlog(VMSNAP_LOG_INFO, "kept %s: not a vmsnap image", kurl);
                if (!res->kept++) { /* (a URL past the field is cut) */
                    size_t kl = strnlen(kurl, sizeof(res->kept_key) - 1);
                    memcpy(res->kept_key, kurl, kl);
                    res->kept_key[kl] = 0;
                }
            } else if (rc > 0 && (rc = vmsnap_store_delete(c, k.v[i], err)) == 0) {
                vlog(VMSNAP_LOG_INFO, "removed %s", kurl);
                res->objects++;
            }
        }
    }
    if (rc == 0) {
        /* this set's uploads only: a push to a set below it is not this set's */
        struct leftover_ctx l = {.c = c, .in = lp};
        rc = vmsnap_store_list_uploads(c, lp, abort_leftover, &l, err);
        res->uploads = l.n;
    }
    if (rc == 0) {
        /* the marks of pushes that did not finish here, and the objects they name (the set
         * is gone anyway; without them nothing would ever find those objects again) */
        struct mark_keys mk = {.k = {.suffix = "", .direct = lp}, .under = key};
        rc = vmsnap_store_list(c, lp, collect_mark, &mk, err);
        for (size_t i = 0; i < mk.k.n && rc == 0; i++) {
            struct push_mark pm;
            char kurl[URL_BUF];
            vmsnap_store_url(x.st, mk.k.v[i], kurl, sizeof(kurl));
            struct vmsnap_err ke = {0};
            int krc = read_mark(c, mk.k.v[i], kurl, &pm, &ke);
            if (krc == -ENOENT)
                continue; /* removed meanwhile (a gc) */
            if (krc < 0 && !force) {
                /* it names objects that nothing else finds again: kept with them, and said */
                if (!res->marks_kept++)
                    kept_err = ke;
                continue;
            }
            if (krc == 0) {
                for (size_t j = 0; j < pm.n && rc == 0; j++) {
                    char obj[300];
                    snprintf(obj, sizeof(obj), "%s.zstd", pm.names[j]);
                    char *ok = join_key(key, obj);
                    rc = ok ? vmsnap_store_delete(c, ok, err)
                            : vmsnap_err_set(err, ENOMEM, "out of memory");
                    if (rc == -ENOENT)
                        rc = 0;
                    free(ok);
                }
                push_mark_fini(&pm);
            }
            if (rc == 0 && (rc = vmsnap_store_delete(c, mk.k.v[i], err)) == 0)
                res->pushes++;
        }
        keys_free(&mk.k);
    }
    if (rc == 0 && res->marks_kept) {
        rc = vmsnap_err_set(err, kept_err.code ? kept_err.code : EINVAL,
                            "%s: %s%u push mark%s kept, which cannot be read (first: %s); the "
                            "objects a mark names would be lost to gc without it: repair or "
                            "inspect it, or 'rm --force' deletes it and every vmsnap image here",
                            url, res->set ? "set removed, but " : "", res->marks_kept,
                            res->marks_kept == 1 ? "" : "s", kept_err.msg);
        goto out;
    }
    if (rc == 0 && !res->set && !res->objects && !res->uploads && !res->pushes && !res->kept &&
        x.st->kind == VMSNAP_STORE_LOCAL) {
        /* an empty directory a failed push left: removing it is what rm --force is for */
        char *dir = store_local_path(x.st, key);
        struct stat sb;
        if (dir && lstat(dir, &sb) == 0 && S_ISDIR(sb.st_mode)) {
            vmsnap_store_tidy(c, lp);
            res->empty_dir = lstat(dir, &sb) < 0;
        }
        free(dir);
    }
    if (rc == 0 && !res->set && !res->objects && !res->uploads && !res->pushes && !res->empty_dir)
        rc = res->kept ? vmsnap_err_set(err, EINVAL,
                                        "%s: nothing removed: no %s, and the *.zstd objects here "
                                        "(%u) are not vmsnap images (first: %s)",
                                        url, VMSNAP_XFER_MANIFEST, res->kept, res->kept_key)
                       : vmsnap_err_set(err, ENOENT,
                                        "%s: nothing to remove (no %s, no object, no unfinished "
                                        "upload or push here)",
                                        url, VMSNAP_XFER_MANIFEST);
    if (rc == 0)
        vmsnap_store_tidy(c, lp);
out:
    if (rc < 0 && err && !strstr(err->msg, url))
        vmsnap_err_wrap(err, "rm %s: ", url);
    keys_free(&k);
    manifest_fini(&m);
    free(mkey);
    free(lp);
    vmsnap_store_conn_free(c);
    xfer_fini(&x, false);
    free(key);
    return rc;
}
