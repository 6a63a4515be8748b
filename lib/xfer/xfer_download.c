/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Download of one object: open it from its tail, cut it into frame groups fetched and decoded
 * on the pool (or streamed through the sequential decoder), verify size and digest.
 *
 * Pull: one suffix-range GET gives the size, footer and seek table (no HEAD); the object is cut
 * into groups of whole frames of about 16 MiB (the first group starts at byte 0, the last ends at
 * the object's end, so together they cover every byte), each fetched by one GET on a pool thread,
 * decoded there (at most `threads` decodes at once, the codec's own buffers being per frame)
 * and pwritten into the sparse temporary file. Groups are hashed in object order as they
 * complete; a group's buffer is released once hashed, so the budget also bounds reordering.
 */
#include "xfer_int.h"

#include "vmsnap/objcache.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#define GROUP_TARGET (16ull << 20)

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
    bool skip = xfer_task_skip(&d->mu, &d->rc, &rc, &e);
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
        if (rc == 0) {
            vmsnap_frame_decoder_set_dst(fd, d->overlay ? d->oname : d->af.path);
            vmsnap_frame_decoder_set_overlay(fd, d->overlay && !d->under);
            vmsnap_frame_decoder_set_under(fd, d->under);
        }
        int wr = rc == 0 && d->fill_fd > 0 ? sys_pwrite_full(d->fill_fd, buf, g->len, g->off) : 0;
        if (wr < 0)
            rc = err_code(&e, -wr, "write the cache entry of %s", d->url);
        else if (rc == 0 && d->fill) /* written out and dropped now: a golden's fill stays
                                      * bounded by the groups in flight (docs/pcache.md) */
            (void)vmsnap_objcache_fill_written(d->fill, g->off, g->len, NULL);
        for (uint32_t i = g->f0; i <= g->f1 && rc == 0; i++) {
            if ((rc = cancel_check(&e)) < 0) /* a group waited for its turn to decode */
                break;
            struct vmsnap_frame_info fi;
            vmsnap_image_frame(d->img, i, &fi);
            if (d->want_frame && i > 0 && i + 1 < vmsnap_image_frame_count(d->img) &&
                !d->want_frame(d->want_arg, &fi)) {
                /* no page of it is wanted (a newer layer has them); its bytes are checked all
                 * the same when they go into a cache entry, which is published only whole */
                if (d->fill_fd > 0 && XXH64(buf + (fi.offset - g->off), fi.csize, 0) != fi.ccheck)
                    rc = vmsnap_err_set(&e, EBADMSG,
                                        "%s: frame %u at byte %llu: compressed bytes checksum "
                                        "mismatch",
                                        d->url, i, (unsigned long long)fi.offset);
                continue;
            }
            rc = vmsnap_image_decode_frame_mem(d->img, i, buf + (fi.offset - g->off), fi.csize,
                                               d->overlay ? d->ofd : d->af.fd, fd, NULL, &e);
        }
        vmsnap_frame_decoder_free(fd);
        dec_leave(d->x);
    }
    if (rc == 0 && !skip)
        xfer_progress_add(d->x, g->len, 0);
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
    xfer_progress_add(d->x, len, 0);
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

void xfer_down_init(struct down *d)
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
 * so a busy pool does not delay it; only for a download whose xfer_down_open runs on the calling
 * thread (a pool thread waiting for another pool task could wait for ever). */
void xfer_down_prefetch(struct down *d)
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

int xfer_down_open(struct down *d, struct vmsnap_store_conn *c, const char *dst,
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
        return vmsnap_err_set(err, EBADMSG, "%s: %llu bytes, the manifest says %llu", d->url,
                              (unsigned long long)d->osize, (unsigned long long)d->mf->object_size);
    if (!d->overlay) {
        if ((rc = sys_atomic_open_tagged(&d->af, dst, 0600, "pull", err)) < 0)
            return rc;
        d->af_open = true;
    }
    int dfd = d->overlay ? d->ofd : d->af.fd;
    xfer_progress_add(d->x, 0, d->osize);
    struct vmsnap_source src = {xfer_tail_pread, &d->tail, d->osize, d->url};
    rc = vmsnap_image_open(&src, d->x->o.max_size, &d->img, err);
    d->tail.c = NULL; /* the pool's threads only read the cached bytes */
    if (rc < 0)
        return rc;
    if (rc == 0 && d->mf && d->mf->table_digest)
        return vmsnap_err_set(err, EBADMSG,
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
            err, EBADMSG,
            "%s: image holds %llu bytes (%llu populated), the manifest says "
            "%llu (%llu)",
            d->url, (unsigned long long)d->stats.total_size, (unsigned long long)d->stats.populated,
            (unsigned long long)d->mf->size, (unsigned long long)d->mf->populated);
    if (!d->under && ftruncate(dfd, (off_t)d->stats.total_size) < 0)
        return err_sys(err, "set size of %s to %llu", dst, (unsigned long long)d->stats.total_size);
    if (d->mf && d->mf->detail && d->mf->table_digest) {
        /* tableSha256 over the very bytes the table was parsed from: every frame is then
         * checked against that table (compressed XXH64, content XXH64, zstd's checksum) */
        char hx[65];
        if ((rc = xfer_table_sha256(d->img, hx, err)) < 0)
            return rc;
        if (strcmp(hx, d->mf->sha256))
            return vmsnap_err_set(err, EBADMSG,
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
int xfer_down_submit(struct down *d, struct vmsnap_err *err)
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

void xfer_down_open_run(struct xtask *t, struct vmsnap_store_conn *c)
{
    struct open_task *ot = (struct open_task *)t;
    struct down *d = ot->d;
    struct vmsnap_err e = {0};
    int rc = xfer_down_open(d, c, ot->dst, &e);
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
int xfer_down_finish(struct down *d, int rc, struct vmsnap_err *err)
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
        rc = vmsnap_err_set(err, ECONNRESET, "%s: received %llu of %llu bytes", d->url,
                            (unsigned long long)d->hashed, (unsigned long long)d->osize);
    if (rc == 0 && d->mf && d->mf->detail && !d->mf->table_digest) {
        unsigned char md[32];
        unsigned mdl = 0;
        char hx[65];
        EVP_DigestFinal_ex(d->sha, md, &mdl);
        xfer_hex32(md, hx);
        if (strcmp(hx, d->mf->sha256))
            rc = vmsnap_err_set(err, EBADMSG,
                                "%s: %s %s does not match the manifest (%s): refusing it", d->url,
                                d->mf->table_digest ? "tableSha256" : "sha256", hx, d->mf->sha256);
    }
    return rc;
}

void xfer_down_free(struct down *d, bool keep)
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
