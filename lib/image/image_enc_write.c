/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The ordered writer: it takes the workers' slots in range order, writes each frame (or has the
 * sink copy the base's), builds the seek table as frames go out, and with a base shapes the runs
 * of reused frames (a reused frame is demoted to a compressed one where its run would be too
 * short). Also the frames around the data: header, info frame, totalSize, sentinel, seek table.
 */
#include "image_int.h"
#include "sys/sys.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

/* Set the abort flag (under e->mu) and wake whatever waits for it. */
void img_set_abort(struct enc *e)
{
    __atomic_store_n(&e->abort, true, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&e->cv_work);
    if (e->mem)
        e->mem->kick(e->mem->arg);
}

int img_table_add(struct table *t, const struct vmsnap_frame_info *fi, struct vmsnap_err *err)
{
    if (grow_array(&t->f, &t->cap, t->n + 1, sizeof(*t->f), 64) < 0)
        return vmsnap_err_set(err, ENOMEM, "out of memory (seek table)");
    t->f[t->n++] = *fi;
    return 0;
}

int img_emit(struct out *o, const void *buf, size_t len, struct vmsnap_err *err)
{
    int rc = o->sink->write(o->sink->arg, buf, len, err);
    if (rc < 0)
        return rc;
    o->pos += len;
    return 0;
}

/* A frame holding one 8-byte word (the totalSize header or the -1 sentinel). */
int img_emit_word_frame(struct out *o, ZSTD_CCtx *cctx, int level, uint64_t word, uint64_t src_pos,
                        struct table *t, struct vmsnap_err *err)
{
    uint8_t w[8];
    put_le64(w, word);
    uint8_t c[128];
    size_t clen = 0;
    uint64_t sum = XXH64(w, sizeof(w), 0);
    _Static_assert(sizeof(c) >= ZSTD_COMPRESSBOUND(sizeof(w)) + 4, "word frame buffer");
    int rc = img_compress_frame(NULL, cctx, level, w, sizeof(w), sum, c, &clen, err);
    if (rc < 0)
        return rc;
    struct vmsnap_frame_info fi = {.offset = o->pos,
                                   .csize = clen,
                                   .dsize = 8,
                                   .src_start = src_pos,
                                   .src_end = src_pos,
                                   .populated = 0,
                                   .checksum = sum,
                                   .ccheck = XXH64(c, clen, 0)};
    rc = img_emit(o, c, clen, err);
    if (rc < 0)
        return rc;
    return img_table_add(t, &fi, err);
}

/* The info skippable frame right after the file header: announces the seek table. */
int img_emit_info_frame(struct out *o, uint64_t frame_size, struct vmsnap_err *err)
{
    uint8_t b[8 + INFO_CONTENT_LEN];
    put_le32(b, INFO_SKIP_MAGIC);
    put_le32(b + 4, INFO_CONTENT_LEN);
    memcpy(b + 8, INFO_MAGIC, 8);
    put_le32(b + 16, INFO_VERSION);
    put_le32(b + 20, INFO_FLAG_SEEK_TABLE);
    put_le64(b + 24, frame_size);
    return img_emit(o, b, sizeof(b), err);
}

int img_emit_seek_table(struct out *o, const struct table *t, const struct vmsnap_image_stats *st,
                        uint64_t frame_size, uint64_t frames_start, int level, uint32_t flags,
                        struct vmsnap_err *err)
{
    size_t body = SEEK_HDR_LEN + t->n * SEEK_ENTRY_LEN;
    size_t total = 8 + body + SEEK_FOOTER_LEN;
    uint8_t *b = calloc(1, total);
    if (!b)
        return vmsnap_err_set(err, ENOMEM, "out of memory (seek table)");
    put_le32(b, SEEK_SKIP_MAGIC);
    put_le32(b + 4, (uint32_t)(total - 8));
    uint8_t *h = b + 8;
    put_le32(h + 0, SEEK_TABLE_VERSION);
    put_le32(h + 4, flags);
    put_le64(h + 8, st->total_size);
    put_le64(h + 16, st->populated);
    put_le64(h + 24, st->zero_elided);
    put_le64(h + 32, frame_size);
    put_le64(h + 40, frames_start);
    put_le64(h + 48, o->pos);
    put_le32(h + 56, (uint32_t)t->n);
    put_le32(h + 60, (uint32_t)level);
    for (size_t i = 0; i < t->n; i++) {
        uint8_t *en = h + SEEK_HDR_LEN + i * SEEK_ENTRY_LEN;
        put_le64(en + 0, t->f[i].csize);
        put_le64(en + 8, t->f[i].dsize);
        put_le64(en + 16, t->f[i].src_start);
        put_le64(en + 24, t->f[i].src_end);
        put_le64(en + 32, t->f[i].populated);
        put_le64(en + 40, t->f[i].checksum);
        put_le64(en + 48, t->f[i].ccheck);
    }
    uint8_t *ft = h + body;
    put_le64(ft + 0, XXH64(h, body, 0));
    put_le32(ft + 8, (uint32_t)t->n);
    put_le32(ft + 12, (uint32_t)total);
    put_le32(ft + 16, SEEK_TABLE_VERSION);
    put_le32(ft + 20, 0);
    memcpy(ft + 24, SEEK_FOOTER_MAGIC, 8);
    int rc = img_emit(o, b, total, err);
    free(b);
    return rc;
}

/* Compress a range the workers left to the base after all (the writer shapes runs): rebuild its
 * records with the writer's own worker state and compress them into the slot. */
static int demote(struct worker *wk, uint64_t idx, struct slot *sl, struct vmsnap_err *err)
{
    struct enc *e = wk->e;
    struct recs r;
    int rc = img_build_records(wk, idx, false, &r, err);
    if (rc == 0 && (r.len != sl->bf.dsize || XXH64(wk->b.p, r.len, 0) != sl->bf.checksum))
        rc = vmsnap_err_set(err, EIO, "%s: changed while being read (offset %llu): is it in use?",
                            e->name, (unsigned long long)(idx * e->frame_size));
    if (rc == 0) /* the writer's: never waits for the budget */
        rc = img_compress_into(e, wk->cctx, wk->b.p, r.len, sl->bf.checksum, &sl->c, &sl->clen, wk,
                               err);
    img_ebuf_settle(e, &wk->b);
    if (rc < 0)
        return rc;
    uint64_t off = sl->fi.offset;
    sl->reused = false;
    sl->fi.offset = off;
    sl->fi.csize = sl->clen;
    sl->fi.ccheck = XXH64(sl->c.p, sl->clen, 0);
    return 0;
}

/* With a base: the writer's view of the runs of reused frames. */
struct runs {
    uint64_t seg;           /* bytes written since the last reused frame (or the start) */
    uint64_t run_left;      /* base bytes left in the run being copied */
    uint64_t prev_base_end; /* where the previous reused frame ends in the base object */
    uint32_t prev_run;      /* its planned run */
    bool copying, prev_reused;
};

/* Wait until the slot of the next range is done (or no worker runs). */
static int wait_slot(struct enc *e, struct slot *sl, unsigned started, struct vmsnap_err *err)
{
    pthread_mutex_lock(&e->mu);
    while (sl->state != SLOT_DONE && started > 0)
        pthread_cond_wait(&e->cv_done, &e->mu);
    pthread_mutex_unlock(&e->mu);
    if (sl->state != SLOT_DONE)
        return vmsnap_err_set(err, EAGAIN, "no encoder thread running");
    return 0;
}

/* A reused frame of range `i`: copied as the base's, or compressed here after all. */
static int shape_run(struct worker *wk, struct runs *r, uint64_t i, struct slot *sl,
                     struct vmsnap_err *err)
{
    const struct enc *e = wk->e;
    int rc = 0;
    if (!sl->reused) {
        r->copying = r->prev_reused = false;
        return 0;
    }
    /* A run must reach the sink with at least min_run bytes, after at least min_run
     * written bytes (or none) since the previous run: compress its head here when
     * the bytes before it are fewer, all of it when too little would be left. */
    if (!(r->prev_reused && sl->bf.offset == r->prev_base_end &&
          e->plan[i].run_id == r->prev_run)) {
        r->run_left = e->plan[i].run_left; /* a planned run starts */
        r->copying = false;
    }
    r->prev_run = e->plan[i].run_id;
    if (!r->copying && ((r->seg > 0 && r->seg < e->min_run) || r->run_left < e->min_run))
        rc = demote(wk, i, sl, err);
    else
        r->copying = true;
    r->run_left -= VMSNAP_MIN(r->run_left, sl->bf.csize);
    r->prev_reused = true;
    r->prev_base_end = sl->bf.offset + sl->bf.csize;
    return rc;
}

/* Range `i`'s frame to the sink (the base's copied, or the slot's written) and into the table. */
static int put_frame(struct worker *wk, struct runs *r, uint64_t i, struct slot *sl, struct out *o,
                     struct table *t, struct vmsnap_image_stats *s, struct vmsnap_err *err)
{
    sl->fi.offset = o->pos;
    int rc = shape_run(wk, r, i, sl, err);
    if (rc < 0) {
        /* demote failed */
    } else if (sl->reused) {
        rc = o->sink->copy(o->sink->arg, &sl->bf, err);
        o->pos += sl->fi.csize;
        r->seg = 0;
        s->reused++;
        s->reused_bytes += sl->fi.csize;
    } else {
        rc = img_emit(o, sl->c.p, sl->clen, err);
        r->seg += sl->clen;
    }
    if (rc == 0)
        rc = img_table_add(t, &sl->fi, err);
    s->populated += sl->fi.populated;
    s->frames++;
    return rc;
}

/* The slot back to the workers, the range counted as written (and on failure, the stop). */
static void release_slot(struct enc *e, struct slot *sl, int rc)
{
    pthread_mutex_lock(&e->mu);
    sl->state = SLOT_FREE;
    __atomic_store_n(&e->written, e->written + 1, __ATOMIC_RELEASE);
    if (rc < 0)
        img_set_abort(e);
    pthread_cond_broadcast(&e->cv_work);
    if (e->mem) /* the range now waited for may be waiting for the budget: not any more */
        e->mem->kick(e->mem->arg);
    pthread_mutex_unlock(&e->mu);
}

int img_write_ranges(struct worker *wk, unsigned started, struct out *o, struct table *t,
                     struct vmsnap_image_stats *s, const struct vmsnap_pack_opts *opts,
                     struct vmsnap_err *err)
{
    struct enc *e = wk->e;
    struct runs r = {.seg = o->pos};
    int rc = 0;
    for (uint64_t i = 0; rc == 0 && i < e->nranges; i++) {
        if ((rc = cancel_check(err)) < 0)
            break;
        struct slot *sl = &e->slots[i % e->window];
        if ((rc = wait_slot(e, sl, started, err)) < 0)
            break;
        if (sl->rc < 0) {
            if (err)
                *err = sl->err;
            rc = sl->rc;
        } else if (sl->has_frame) {
            rc = put_frame(wk, &r, i, sl, o, t, s, err);
        }
        img_ebuf_settle(e, &sl->c);
        s->zero_elided += sl->zero_elided;
        s->extents += sl->extents;
        s->unchanged += sl->unchanged;
        s->zero_pages += sl->zero_pages;
        release_slot(e, sl, rc);
        if (rc == 0 && opts->progress)
            opts->progress(opts->progress_arg, VMSNAP_MIN((i + 1) * e->frame_size, e->size),
                           e->size);
    }
    return rc;
}
