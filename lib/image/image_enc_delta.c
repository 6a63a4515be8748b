/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The range encoder of a delta layer (vmsnap_pack_opts.delta_parent): a range's records hold
 * only the pages whose hash differs from the parent table's for the same page.
 *
 * A range is walked page by page in order. The pages of the source's data extents (rounded out
 * to whole pages, so a page is read whole even where an extent covers it in part) are read 1 MiB
 * at a time into the tail of the worker's buffer and hashed into e->ph; the pages of its holes
 * hash to 0 without a read. A page is stored when its hash differs from the parent's: its bytes
 * (zeros for a page that is a hole or all zero in the source but has data in the parent: "became
 * a hole") are appended to the run of stored pages being built at the head of the buffer; a
 * page left out breaks the run, and a run is one record. So records are whole pages (the file's
 * partial last page is whole up to the file's end), which the overlay decoder writes or punches
 * page by page. The buffer is sized before anything is read: the extents' pages, the pages of
 * the holes where the parent has data, and a record header per stored page at most.
 */
#include "image_int.h"
#include "sys/sys.h"

#include <errno.h>
#include <fcntl.h>

#define DELTA_READ ((size_t)1 << 20)
#define ULL(x) ((unsigned long long)(x))

struct dbuild {
    const struct enc *e;
    struct recs *r;
    uint8_t *out; /* the records */
    size_t o;     /* where the next byte goes */
    size_t hdr;   /* the open run's header */
    uint64_t run_end;
    bool in_run;
    uint64_t stored; /* pages */
};

static uint64_t page_len(const struct enc *e, uint64_t p)
{
    return VMSNAP_MIN((uint64_t)IMG_PAGE, e->size - p * IMG_PAGE);
}

static void close_run(struct dbuild *d)
{
    if (!d->in_run)
        return;
    const uint64_t start = get_le64(d->out + d->hdr);
    put_le64(d->out + d->hdr + 8, d->run_end - start);
    d->in_run = false;
    d->r->extents++;
}

/* Store the page at `off` (`len` bytes at `data`; NULL: zeros), extending the open run when it
 * ends there. */
static void store(struct dbuild *d, uint64_t off, const uint8_t *data, size_t len)
{
    if (!d->in_run || d->run_end != off) {
        close_run(d);
        d->hdr = d->o;
        put_le64(d->out + d->o, off);
        d->o += REC_HDR_LEN;
        d->in_run = true;
    }
    if (data)
        memcpy(d->out + d->o, data, len);
    else
        memset(d->out + d->o, 0, len);
    d->o += len;
    d->run_end = off + len;
    d->r->populated += len;
    d->stored++;
}

/* The pages of the source's hole [a, b) (`a` is page-aligned, or the file's end after its
 * partial last page): stored as zeros where the parent has data. */
static void hole_pages(struct dbuild *d, uint64_t a, uint64_t b)
{
    const struct vmsnap_pages *pt = d->e->parent;
    const uint64_t last = VMSNAP_MIN((b + IMG_PAGE - 1) / IMG_PAGE, pt->npages);
    for (uint64_t p = (a + IMG_PAGE - 1) / IMG_PAGE; p < last; p++)
        if (pt->h[p]) {
            store(d, p * IMG_PAGE, NULL, (size_t)page_len(d->e, p));
            d->r->zero_pages++;
        }
}

/* Bytes of the hole [a, b) that hole_pages may store. */
static uint64_t hole_bound(const struct enc *e, uint64_t a, uint64_t b)
{
    const uint64_t last = VMSNAP_MIN((b + IMG_PAGE - 1) / IMG_PAGE, e->parent->npages);
    uint64_t n = 0;
    for (uint64_t p = (a + IMG_PAGE - 1) / IMG_PAGE; p < last; p++)
        if (e->parent->h[p])
            n += page_len(e, p);
    return n;
}

/* The pages of the source's data [a, b) (whole pages), read through `rd`. */
static int data_pages(struct dbuild *d, uint64_t a, uint64_t b, uint8_t *rd, struct vmsnap_err *err)
{
    const struct enc *e = d->e;
    for (uint64_t o = a; o < b; o += DELTA_READ) {
        const size_t len = (size_t)VMSNAP_MIN((uint64_t)DELTA_READ, b - o);
        ssize_t got = sys_pread_full(e->fd, rd, len, o);
        if (got < 0)
            return err_code(err, (int)-got, "%s: read %zu bytes at offset %llu", e->name, len,
                            ULL(o));
        if ((size_t)got != len)
            return vmsnap_err_set(err, EIO,
                                  "%s: file shrank while reading (offset %llu): is it in use?",
                                  e->name, ULL(o + (uint64_t)got));
        for (size_t k = 0; k < len; k += IMG_PAGE) {
            const size_t pl = VMSNAP_MIN((size_t)IMG_PAGE, len - k);
            const uint64_t p = (o + k) / IMG_PAGE;
            const bool z = img_all_zero(rd + k, pl);
            const uint64_t h = z ? 0 : img_page_hash_nz(rd + k, pl);
            e->ph[p] = h;
            if (h != img_pages_at(e->parent, p)) {
                store(d, o + k, rd + k, pl);
                d->r->zero_pages += z;
            } else if (z) {
                d->r->zero += pl; /* allocated, all zero, left out */
            }
        }
    }
    return 0;
}

/* The extents found in w->ext[0, n), rounded out to whole pages inside [start, end) and merged:
 * how many are left. */
static size_t round_extents(struct worker *w, size_t n, uint64_t end)
{
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        const uint64_t a = w->ext[i].off / IMG_PAGE * IMG_PAGE;
        const uint64_t b =
            VMSNAP_MIN((w->ext[i].off + w->ext[i].len + IMG_PAGE - 1) / IMG_PAGE * IMG_PAGE, end);
        if (m && a <= w->ext[m - 1].off + w->ext[m - 1].len) {
            w->ext[m - 1].len =
                VMSNAP_MAX(w->ext[m - 1].off + w->ext[m - 1].len, b) - w->ext[m - 1].off;
        } else {
            w->ext[m].off = a;
            w->ext[m].len = b - a;
            m++;
        }
    }
    return m;
}

int img_build_delta(struct worker *w, uint64_t idx, struct recs *r, struct vmsnap_err *err)
{
    struct enc *e = w->e;
    const uint64_t start = idx * e->frame_size;
    const uint64_t end = VMSNAP_MIN(start + e->frame_size, e->size);
    *r = (struct recs){0};
    size_t n = 0;
    int rc = img_find_extents(w, start, end, &n, err);
    if (rc < 0)
        return rc;
    n = round_extents(w, n, end);

    /* what may be stored, and the read buffer after it */
    uint64_t bound = 0, pos = start, longest = 0;
    for (size_t i = 0; i < n; i++) {
        bound += hole_bound(e, pos, w->ext[i].off) + w->ext[i].len;
        longest = VMSNAP_MAX(longest, w->ext[i].len);
        pos = w->ext[i].off + w->ext[i].len;
    }
    bound += hole_bound(e, pos, end);
    const uint64_t npages = (end - start + IMG_PAGE - 1) / IMG_PAGE;
    if (bound) {
        const size_t need = (size_t)(bound + REC_HDR_LEN * (bound / IMG_PAGE + 2));
        const size_t at = (need + 63) / 64 * 64;
        rc = img_ebuf_reserve(e, &w->b, at + VMSNAP_MIN((size_t)longest, DELTA_READ), w, err);
        if (rc < 0)
            return rc;
        struct dbuild d = {.e = e, .r = r, .out = w->b.p};
        pos = start;
        for (size_t i = 0; rc == 0 && i < n; i++) {
            hole_pages(&d, pos, w->ext[i].off);
            pos = w->ext[i].off + w->ext[i].len;
            rc = data_pages(&d, w->ext[i].off, pos, w->b.p + at, err);
        }
        if (rc < 0)
            return rc;
        hole_pages(&d, pos, end);
        close_run(&d);
        r->len = d.o;
        r->unchanged = npages - d.stored;
    } else {
        r->unchanged = npages;
    }
    if (e->drop_cache && n)
        (void)posix_fadvise(e->fd, (off_t)start, (off_t)(end - start), POSIX_FADV_DONTNEED);
    return 0;
}
