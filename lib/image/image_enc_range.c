/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The range encoder: a worker thread takes the next range, finds its extents, builds its
 * records (zero pages elided, compacted in place) and compresses them into a slot that the
 * ordered writer (image_enc_write.c) takes in range order. See image_enc.c for the design.
 */
#include "image_int.h"
#include "sys/sys.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

/* pages_out of a full encode: the hash of the block [b, bend) of an extent, read at `data` (z: it
 * is all zero). A whole page (or the file's partial last page) is hashed from the buffer; a page
 * an extent covers only in part is read again whole. */
static int hash_block(const struct enc *e, const uint8_t *data, uint64_t b, uint64_t bend, bool z,
                      struct vmsnap_err *err)
{
    const uint64_t p = b / IMG_PAGE;
    if (b % IMG_PAGE == 0 && (bend - b == IMG_PAGE || bend == e->size)) {
        e->ph[p] = z ? 0 : img_page_hash_nz(data, (size_t)(bend - b));
        return 0;
    }
    return img_page_hash_fd(e->fd, e->name, e->size, p, &e->ph[p], err);
}

/* pages_out with zero pages kept: every block of the extent [d, d + len) read at `data`. */
static int hash_extent(const struct enc *e, const uint8_t *data, uint64_t d, uint64_t len,
                       struct vmsnap_err *err)
{
    for (uint64_t b = d; b < d + len;) {
        const uint64_t bend = VMSNAP_MIN((b / IMG_PAGE + 1) * IMG_PAGE, d + len);
        int rc =
            hash_block(e, data + (b - d), b, bend, img_all_zero(data + (b - d), bend - b), err);
        if (rc < 0)
            return rc;
        b = bend;
    }
    return 0;
}

/* Write the record {off, len} at *o, its data moved from `from` (never before *o + 16: an
 * elided page freed at least the header's room), and advance *o past it. */
static void put_record(uint8_t *buf, size_t *o, uint64_t off, size_t from, uint64_t len)
{
    put_le64(buf + *o, off);
    put_le64(buf + *o + 8, len);
    if (from != *o + REC_HDR_LEN)
        memmove(buf + *o + REC_HDR_LEN, buf + from, len);
    *o += REC_HDR_LEN + len;
}

/* Find the data extents of [start, end). */
int img_find_extents(struct worker *w, uint64_t start, uint64_t end, size_t *n_out,
                     struct vmsnap_err *err)
{
    struct enc *e = w->e;
    size_t n = 0;
    uint64_t pos = start;
    while (pos < end) {
        off_t d = lseek(e->fd, (off_t)pos, SEEK_DATA);
        if (d < 0) {
            if (errno == ENXIO)
                break;
            return err_sys(err, "%s: SEEK_DATA at offset %llu", e->name, (unsigned long long)pos);
        }
        if ((uint64_t)d >= end)
            break;
        off_t h = lseek(e->fd, d, SEEK_HOLE);
        if (h < 0)
            return err_sys(err, "%s: SEEK_HOLE at offset %lld", e->name, (long long)d);
        uint64_t hend = VMSNAP_MIN((uint64_t)h, end);
        if (hend <= (uint64_t)d)
            break;
        if (grow_array(&w->ext, &w->next_cap, n + 1, sizeof(*w->ext), 64) < 0)
            return vmsnap_err_set(err, ENOMEM, "out of memory (extent list)");
        w->ext[n].off = (uint64_t)d;
        w->ext[n].len = hend - (uint64_t)d;
        n++;
        pos = hend;
    }
    *n_out = n;
    return 0;
}

/*
 * Build the records of range `idx` in w->b.p. For each extent we reserve a header, read the data
 * behind it, then (when eliding) rewrite it as runs of non-zero blocks. Blocks are aligned to
 * absolute 4 KiB source pages, so the edges of an unaligned extent are partial blocks. Drops the
 * range's clean page cache afterwards when `drop` (and the encoder drops cache at all).
 */
int img_build_records(struct worker *w, uint64_t idx, bool drop, struct recs *r,
                      struct vmsnap_err *err)
{
    struct enc *e = w->e;
    if (e->parent) /* a delta layer (no base, so `drop` is always true) */
        return img_build_delta(w, idx, r, err);
    uint64_t start = idx * e->frame_size;
    uint64_t end = VMSNAP_MIN(start + e->frame_size, e->size);
    *r = (struct recs){0};
    size_t n = 0;
    int rc = img_find_extents(w, start, end, &n, err);
    if (rc < 0)
        return rc;

    uint64_t need = 0;
    for (size_t i = 0; i < n; i++)
        need += REC_HDR_LEN + w->ext[i].len;
    if (need == 0)
        return 0;
    rc = img_ebuf_reserve(e, &w->b, need, w, err);
    if (rc < 0)
        return rc;

    size_t o = 0; /* write position in w->b.p */
    uint64_t populated = 0, extents = 0, zero = 0;
    for (size_t i = 0; i < n; i++) {
        const uint64_t d = w->ext[i].off, len = w->ext[i].len;
        const size_t p = o + REC_HDR_LEN; /* where this extent's data is read to */
        ssize_t got = sys_pread_full(e->fd, w->b.p + p, len, d);
        if (got < 0)
            return err_code(err, (int)-got, "%s: read %llu bytes at offset %llu", e->name,
                            (unsigned long long)len, (unsigned long long)d);
        if ((uint64_t)got != len)
            return vmsnap_err_set(err, EIO,
                                  "%s: file shrank while reading (offset %llu): is it in use?",
                                  e->name, (unsigned long long)(d + (uint64_t)got));
        if (!e->elide) {
            if (e->ph && (rc = hash_extent(e, w->b.p + p, d, len, err)) < 0)
                return rc;
            put_record(w->b.p, &o, d, p, len);
            populated += len;
            extents++;
            continue;
        }
        /* Walk blocks; each run of non-zero blocks becomes a record, compacted to o. */
        uint64_t run_start = d;
        bool in_run = false;
        for (uint64_t b = d;;) {
            const bool at_end = b == d + len;
            const uint64_t bend =
                at_end ? b : VMSNAP_MIN((b / VMSNAP_IMAGE_PAGE + 1) * VMSNAP_IMAGE_PAGE, d + len);
            const bool z = !at_end && img_all_zero(w->b.p + p + (b - d), bend - b);
            if (!at_end && e->ph && (rc = hash_block(e, w->b.p + p + (b - d), b, bend, z, err)) < 0)
                return rc;
            if (in_run && (z || at_end)) {
                put_record(w->b.p, &o, run_start, p + (run_start - d), b - run_start);
                populated += b - run_start;
                extents++;
                in_run = false;
            }
            if (at_end)
                break;
            if (z) {
                zero += bend - b;
            } else if (!in_run) {
                run_start = b;
                in_run = true;
            }
            b = bend;
        }
    }
    if (drop && e->drop_cache)
        (void)posix_fadvise(e->fd, (off_t)start, (off_t)(end - start), POSIX_FADV_DONTNEED);
    *r = (struct recs){.len = o, .populated = populated, .extents = extents, .zero = zero};
    return 0;
}

/* Encode range `idx` into `s`: its records, then either the base's frame (unchanged, and part
 * of a run the pre-scan chose to reuse) or a newly compressed frame. */
static int encode_range(struct worker *w, uint64_t idx, struct slot *s)
{
    struct enc *e = w->e;
    if (e->plan && e->plan[idx].reuse) {
        /* the pre-scan found this range unchanged and part of a run worth reusing: not read
         * again (the writer rebuilds and checks it if it has to compress it after all) */
        uint64_t start = idx * e->frame_size;
        vmsnap_image_frame(e->base, e->plan[idx].base_frame - 1, &s->bf);
        s->has_frame = s->reused = true;
        s->fi = s->bf;
        s->zero_elided = e->plan[idx].scan.zero;
        s->extents = e->plan[idx].scan.extents;
        if (e->drop_cache)
            (void)posix_fadvise(e->fd, (off_t)start,
                                (off_t)(VMSNAP_MIN(start + e->frame_size, e->size) - start),
                                POSIX_FADV_DONTNEED);
        return 0;
    }
    struct recs r;
    int rc = img_build_records(w, idx, true, &r, &s->err);
    if (rc < 0)
        return rc;
    s->zero_elided = r.zero;
    s->extents = r.extents;
    s->unchanged = r.unchanged;
    s->zero_pages = r.zero_pages;
    if (r.len == 0)
        return 0; /* all zero: no frame */
    s->has_frame = true;
    s->fi.checksum = XXH64(w->b.p, r.len, 0);
    rc = img_compress_into(e, w->cctx, w->b.p, r.len, s->fi.checksum, &s->c, &s->clen, w, &s->err);
    img_ebuf_settle(e, &w->b);
    if (rc < 0)
        return rc;
    uint64_t start = idx * e->frame_size;
    s->fi.csize = s->clen;
    s->fi.dsize = r.len;
    s->fi.src_start = start;
    s->fi.src_end = VMSNAP_MIN(start + e->frame_size, e->size);
    s->fi.populated = r.populated;
    s->fi.ccheck = XXH64(s->c.p, s->clen, 0);
    return 0;
}

void *img_worker_main(void *arg)
{
    struct worker *w = arg;
    struct enc *e = w->e;
    pthread_mutex_lock(&e->mu);
    for (;;) {
        while (!e->abort && e->next < e->nranges && e->next >= e->written + e->window)
            pthread_cond_wait(&e->cv_work, &e->mu);
        if (e->abort || e->next >= e->nranges)
            break;
        uint64_t idx = e->next++;
        struct slot *s = &e->slots[idx % e->window];
        *s = (struct slot){.state = SLOT_BUSY, .c = s->c};
        w->cur = idx;
        pthread_mutex_unlock(&e->mu);

        s->rc = encode_range(w, idx, s);

        pthread_mutex_lock(&e->mu);
        s->state = SLOT_DONE;
        pthread_cond_broadcast(&e->cv_done);
    }
    pthread_mutex_unlock(&e->mu);
    if (e->mem) /* a range still encoding may wait for the budget: nothing kept idle */
        img_ebuf_trim(e, &w->b, 0);
    return NULL;
}
