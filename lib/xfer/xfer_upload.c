/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Upload of one object: the codec's sink cut into parts on the pool, frames reused from a base
 * object as server-side copies, the final PUT or completion, and the push of one open file.
 *
 * Push: the codec runs in a producer thread and writes its object in order into a sink that
 * hashes its head and seek table (the manifest's tableSha256) and cuts it into parts; a full part
 * is handed whole to the worker pool, whose threads each own one store connection. A full buffer is
 * flushed only when more bytes arrive, so an object of at most one part is a single PutObject.
 * Parts are part_size bytes (doubled every 2,500 parts to stay under S3's 10,000) and every part
 * buffer is taken from the pool's byte budget before it is allocated: when uploads fall behind the
 * encoder blocks, memory does not grow. Sets run up to two producers (files in parallel), the
 * largest files first, sharing one pool (connections are reused across files).
 */
#include "xfer_int.h"

#include "vmsnap/objcache.h"

#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <xxhash.h>

#define PART_DOUBLING 2500u

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
    /* write-through (mf_file.tee): the object's bytes also go into this node-cache fill, its
     * write-out started every TEE_WINDOW bytes (vmsnap_objcache_fill_written) */
    struct mf_file *tee_mf;
    uint64_t tee_kicked;
};

#define TEE_WINDOW (32ull << 20)

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
    bool skip = xfer_task_skip(&u->mu, &u->rc, &rc, &e);
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
        xfer_progress_add(u->x, pt->len, 0);
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

/* The object's next `len` bytes into the write-through fill. A failure (the cache's disk full)
 * only ends the write-through: the push goes on, its caller drops the fill. */
static void tee_write(struct up *u, const void *buf, size_t len)
{
    struct mf_file *mf = u->tee_mf;
    int fd = vmsnap_objcache_fill_fd(mf->tee);
    struct vmsnap_err e = {0};
    int rc = sys_pwrite_full(fd, buf, len, u->total);
    if (rc < 0)
        vmsnap_err_set(&e, -rc, "write: %s", strerror(-rc));
    if (rc == 0 && u->total + len - u->tee_kicked >= TEE_WINDOW) {
        rc = vmsnap_objcache_fill_written(mf->tee, u->tee_kicked, u->total + len - u->tee_kicked,
                                          &e);
        u->tee_kicked = u->total + len;
    }
    if (rc < 0) {
        vlog(VMSNAP_LOG_WARN, "%s: not kept in the node's cache: %s", u->key, e.msg);
        mf->tee_bad = true;
        u->tee_mf = NULL;
    }
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
    if (u->tee_mf)
        tee_write(u, buf, len);
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
    if (u->tee_mf) { /* its bytes are not ours to write: no write-through */
        u->tee_mf->tee_bad = true;
        u->tee_mf = NULL;
    }
    if (grow_array(&u->run, &u->run_cap, u->run_n + 1, sizeof(*u->run), 64) < 0)
        return vmsnap_err_set(err, ENOMEM, "out of memory");
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
    struct vmsnap_source src = {xfer_tail_pread, &ts, size, bkey};
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

/* Encode `fd` into the upload (the parts go out on the pool) and send its last bytes: a single
 * PUT if no part was flushed (and the caller takes no upload), else the last part. */
static int up_pack(struct up *u, int fd, const char *path, struct vmsnap_image *base,
                   const struct deferred *def, struct mf_file *mf, struct vmsnap_image_stats *stats,
                   struct vmsnap_err *perr, struct vmsnap_err *ferr)
{
    struct xfer *x = u->x;
    struct vmsnap_sink sink = {sink_write, u, base ? sink_copy : NULL};
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
                                  .mem = &mem,
                                  .delta_parent = mf ? mf->delta_parent : NULL,
                                  .pages_out = mf && mf->want_pages ? &mf->pages_out : NULL};
    int rc = vmsnap_image_pack_fd(fd, path, &sink, &po, stats, perr);
    if (rc == 0 && u->run_n) /* the encoder always ends with written frames; be safe */
        rc = place_run(u, ferr);
    if (rc == 0) {
        /* the last bytes: a single PUT if no part was flushed, else the last part + complete */
        if (!u->upload_id && !def) {
            rc = vmsnap_store_put(u->ctl, u->key, u->cur ? (const void *)u->cur : "", u->cur_len,
                                  ferr);
            if (rc == 0)
                xfer_progress_add(x, u->cur_len, 0);
        } else if (u->cur_len > 0) {
            rc = flush_part(u, ferr);
        }
    }
    return rc;
}

/* The upload left for the caller to complete: its now (not aborted, not swept here). */
static void up_hand_over(struct up *u, struct deferred *def)
{
    def->upload_id = u->upload_id;
    /* the list is sized for S3's 10,000 parts (~1 MB): kept for long, only what is used */
    struct vmsnap_store_part *pp = realloc(u->parts, (u->nparts ? u->nparts : 1) * sizeof(*pp));
    def->parts = pp ? pp : u->parts;
    def->nparts = u->nparts;
    u->upload_id = NULL;
    u->parts = NULL;
}

/* The completion is not cut short by a cancel: asked for, it runs to its answer. */
static int up_complete(struct up *u, struct vmsnap_err *ferr)
{
    int rc = cancel_check(ferr);
    if (rc < 0)
        return rc;
    cancel_hold();
    rc = vmsnap_store_mpu_complete(u->ctl, u->key, u->upload_id, u->parts, u->nparts, ferr);
    cancel_release();
    if (rc == -ENOENT) /* NoSuchUpload, or RGW's NoSuchKey: aborted or removed meanwhile */
        vmsnap_err_wrap(ferr, "the upload was aborted or removed while it completed (another push "
                              "to the same place at the same time?); NOT stored there: ");
    return rc;
}

static void abort_upload(struct vmsnap_store_conn *ctl, const char *key, const char *upload_id)
{
    struct vmsnap_err ae = {0};
    if (vmsnap_store_mpu_abort(ctl, key, upload_id, &ae) < 0)
        vlog(VMSNAP_LOG_WARN, "cannot abort the upload of %s (run 'vmsnap gc'): %s", key, ae.msg);
}

/* After the upload (`rc`: how it went): a failed one aborted, this key's leftover uploads swept,
 * the part buffer given back. */
static void up_settle(struct up *u, int rc)
{
    struct xfer *x = u->x;
    if (rc < 0 && u->upload_id)
        abort_upload(u->ctl, u->key, u->upload_id);
    if (u->upload_id) {
        /* CreateMultipartUpload is not idempotent: when an answer is lost and the request
         * retried, the server holds an upload nobody will finish. Sweep this key's uploads (ours
         * is complete or aborted by now, so it is not listed). */
        struct leftover_ctx l = {.exact = u->key, .c = u->ctl};
        struct vmsnap_err le = {0};
        cancel_hold();
        if (vmsnap_store_list_uploads(u->ctl, u->key, xfer_abort_leftover, &l, &le) < 0)
            vlog(VMSNAP_LOG_WARN, "cannot list unfinished uploads of %s (run 'vmsnap gc'): %s",
                 u->key, le.msg);
        cancel_release();
    }
    if (u->cur) {
        xpool_fill(&x->pool, -(int64_t)u->cur_cap);
        xpool_buf_free(&x->pool, u->cur);
        xpool_mem_release(&x->pool, u->cur_cap);
    }
}

/* The manifest entry of the stored object: sizes, digest, its first bytes. */
static void up_entry(const struct up *u, const struct vmsnap_image_stats *stats,
                     const unsigned char md[32], struct mf_file *mf)
{
    mf->detail = true;
    mf->size = stats->total_size;
    mf->populated = stats->populated;
    mf->object_size = u->total;
    mf->table_digest = true;
    mf->copied = u->copied;
    xfer_hex32(md, mf->sha256);
    _Static_assert(sizeof(mf->prefix) == VMSNAP_IMAGE_PREFIX_LEN, "prefix length");
    memcpy(mf->prefix, u->prefix, sizeof(mf->prefix));
    mf->have_prefix = u->total >= VMSNAP_IMAGE_PREFIX_LEN;
}

/* Push the open regular file `fd` to `key`, reusing the frames of `base` (NULL: none) that did
 * not change. Fills the manifest entry (sizes, digest). With `def`, the object is left as a
 * multipart upload for the caller to complete (one part when it is small). */
static int push_fd_once(struct xfer *x, struct vmsnap_store_conn *ctl, int fd, const char *path,
                        const char *key, const char *base_key, struct vmsnap_image *base,
                        const char *base_etag, struct mf_file *mf, bool *copy_failed,
                        struct deferred *def, struct vmsnap_err *err)
{
    struct up u = {.x = x, .ctl = ctl, .key = key, .base_key = base_key, .base_etag = base_etag};
    if (mf && mf->tee && !mf->tee_bad)
        u.tee_mf = mf;
    pthread_mutex_init(&u.mu, NULL);
    pthread_cond_init(&u.cv, NULL);
    u.sha = EVP_MD_CTX_new();
    if (!u.sha || !EVP_DigestInit_ex(u.sha, EVP_sha256(), NULL)) {
        EVP_MD_CTX_free(u.sha);
        return vmsnap_err_set(err, ENOMEM, "sha256 context");
    }
    struct vmsnap_image_stats stats = {0};
    struct vmsnap_err perr = {0}, ferr = {0};
    int rc = up_pack(&u, fd, path, base, def, mf, &stats, &perr, &ferr);
    up_wait(&u);
    if (rc == 0 && u.rc == 0 && def && !u.upload_id) /* the encoder always writes bytes */
        rc = vmsnap_err_set(&ferr, EIO, "%s: nothing to store", path);
    bool handed = rc == 0 && u.rc == 0 && def;
    if (handed)
        up_hand_over(&u, def);
    if (rc == 0 && u.rc == 0 && u.upload_id)
        rc = up_complete(&u, &ferr);
    if (u.rc < 0) { /* a part failed: that is the cause, whatever the encoder said */
        rc = u.rc;
        if (err)
            *err = u.err;
    } else if (rc < 0) {
        if (err)
            *err = ferr.code ? ferr : perr;
    }
    up_settle(&u, rc);
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
        abort_upload(ctl, key, def->upload_id);
        free(def->upload_id);
        free(def->parts);
        *def = (struct deferred){0};
    }
    if (rc == 0 && mf)
        up_entry(&u, &stats, md, mf);
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
int xfer_push_fd(struct xfer *x, struct vmsnap_store_conn *ctl, int fd, const char *path,
                 const char *key, const char *base_key, struct mf_file *mf, struct deferred *def,
                 struct vmsnap_err *err)
{
    struct stat sb;
    if (fstat(fd, &sb) == 0)
        xfer_progress_add(x, 0, (uint64_t)sb.st_blocks * 512 / 2);
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
