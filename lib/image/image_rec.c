/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The extent-record parser shared by the parallel and the sequential decoders. It is fed
 * decompressed bytes in pieces of any size, validates every word before acting on it, and
 * pwrites extent data straight from the caller's buffer.
 */
#include "image_int.h"
#include "sys/sys.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void rec_init(struct rec_parser *rp, enum rec_state start, int fd, const char *name,
              uint64_t max_size)
{
    memset(rp, 0, sizeof(*rp));
    rp->state = start;
    rp->fd = fd;
    rp->name = name;
    rp->max_size = max_size;
    rp->hi = UINT64_MAX;
    rp->span_lo = UINT64_MAX;
}

int img_corrupt(struct vmsnap_err *err, const char *name, const char *fmt, ...)
{
    char what[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    return vmsnap_err_set(err, EBADMSG, "%s: corrupt image: %s", name, what);
}

/* A record-level error: the reason plus where in the decoded stream it was met. */
__attribute__((format(printf, 3, 4))) static int bad(struct rec_parser *rp, struct vmsnap_err *err,
                                                     const char *fmt, ...)
{
    char what[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    return img_corrupt(err, rp->name, "%s (%s, decoded byte %llu)", what,
                       rp->where[0] ? rp->where : "stream", (unsigned long long)rp->pos);
}

#define ULL(x) ((unsigned long long)(x))

static int word(struct rec_parser *rp, uint64_t v, struct vmsnap_err *err)
{
    int64_t sv = (int64_t)v;
    switch (rp->state) {
    case REC_TOTAL:
        if (sv < 0)
            return bad(rp, err, "negative totalSize %lld", (long long)sv);
        if (rp->table_total && v != rp->max_size)
            return bad(rp, err, "totalSize %llu disagrees with the seek table (%llu)", ULL(v),
                       ULL(rp->max_size));
        if (v > rp->max_size) /* a policy, not damage */
            return vmsnap_err_set(err, EFBIG,
                                  "%s: totalSize %llu exceeds the cap of %llu bytes (--max-size; "
                                  "raise it for a larger image)",
                                  rp->name, ULL(v), ULL(rp->max_size));
        rp->total = v;
        rp->have_total = true;
        if (rp->truncate_on_total && rp->fd >= 0 && ftruncate(rp->fd, (off_t)v) < 0)
            return err_sys(err, "%s: set destination size to %llu", rp->name,
                           (unsigned long long)v);
        rp->state = REC_OFF;
        return 0;
    case REC_OFF:
        if (sv == -1) {
            if (!rp->allow_sentinel)
                return bad(rp, err, "end-of-extents sentinel inside a data frame");
            rp->state = REC_DONE;
            return 0;
        }
        if (sv < 0)
            return bad(rp, err, "negative extent offset %lld", (long long)sv);
        if (v < rp->next_min)
            return bad(rp, err,
                       "extent at %llu overlaps or precedes the previous one (ends at %llu)",
                       ULL(v), ULL(rp->next_min));
        if (v < rp->lo)
            return bad(rp, err, "extent at %llu lies before its frame's range (starts at %llu)",
                       ULL(v), ULL(rp->lo));
        if (!rp->have_total || v > rp->total)
            return bad(rp, err, "extent at %llu lies beyond totalSize %llu", ULL(v),
                       ULL(rp->total));
        rp->off = v;
        rp->state = REC_LEN;
        return 0;
    case REC_LEN:
        if (sv < 0)
            return bad(rp, err, "negative extent length %lld at offset %llu", (long long)sv,
                       ULL(rp->off));
        if (v > rp->total - rp->off)
            return bad(rp, err, "extent at %llu with length %llu runs past totalSize %llu",
                       ULL(rp->off), ULL(v), ULL(rp->total));
        if (rp->off + v > rp->hi)
            return bad(rp, err, "extent ending at %llu runs past its frame's range (ends at %llu)",
                       ULL(rp->off + v), ULL(rp->hi));
        rp->data_off = rp->off;
        rp->data_left = v;
        rp->next_min = rp->off + v;
        rp->extents++;
        rp->populated += v;
        rp->span_lo = VMSNAP_MIN(rp->span_lo, rp->off);
        rp->span_hi = VMSNAP_MAX(rp->span_hi, rp->off + v);
        rp->state = v ? REC_DATA : REC_OFF;
        return 0;
    default:
        return bad(rp, err, "internal parser state %d", (int)rp->state);
    }
}

int img_punch(int fd, uint64_t off, uint64_t len, uint64_t punch_len, const char *dst,
              struct vmsnap_err *err)
{
    if (fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)off, (off_t)punch_len) ==
        0)
        return 0;
    if (errno != EOPNOTSUPP && errno != ENOSYS)
        return err_sys(err, "%s: punch a hole of %llu bytes at offset %llu", dst, ULL(punch_len),
                       ULL(off));
    static const uint8_t zeros[64 << 10]; /* a filesystem that cannot punch: zeros written */
    for (uint64_t done = 0; done < len;) {
        const size_t n = (size_t)VMSNAP_MIN((uint64_t)sizeof(zeros), len - done);
        int rc = sys_pwrite_full(fd, zeros, n, off + done);
        if (rc < 0)
            return err_code(err, -rc, "%s: write %zu bytes at offset %llu", dst, n,
                            ULL(off + done));
        done += n;
    }
    return 0;
}

/* Overlay: `n` bytes of a record at `off`, written, or punched when `zero` (whole pages; the
 * file's partial last page is punched up to its page's end). */
static int ov_out(const struct rec_parser *rp, const uint8_t *buf, uint64_t off, size_t n,
                  bool zero, struct vmsnap_err *err)
{
    const char *dst = rp->dst_name ? rp->dst_name : "destination";
    if (zero)
        return img_punch(rp->fd, off, n, (n + IMG_PAGE - 1) / IMG_PAGE * IMG_PAGE, dst, err);
    int rc = sys_pwrite_full(rp->fd, buf, n, off);
    if (rc < 0)
        return err_code(err, -rc, "%s: write %zu bytes at offset %llu", dst, n, ULL(off));
    return 0;
}

/* Overlay: how many bytes of the record at `off` (ending at `rec_end`) make its next page when
 * that page is one the overlay punches if all zero (a whole aligned page, or the file's partial
 * last page); 0 when it is not (an unaligned head, a tail that ends inside a page). */
static uint64_t ov_page(const struct rec_parser *rp, uint64_t off, uint64_t rec_end)
{
    if (off % IMG_PAGE)
        return 0;
    const uint64_t pl = VMSNAP_MIN((uint64_t)IMG_PAGE, rec_end - off);
    return pl == IMG_PAGE || off + pl == rp->total ? pl : 0;
}

/* Overlay decoding of `n` bytes of the record being read (at rp->data_off): pages are punched
 * when all zero, written otherwise, in runs of one kind; a page split between two pieces of
 * input is gathered in rp->pg first. */
static int overlay_write(struct rec_parser *rp, const uint8_t *buf, size_t n,
                         struct vmsnap_err *err)
{
    const uint64_t rec_end = rp->data_off + rp->data_left;
    uint64_t off = rp->data_off;
    int rc = 0;
    while (rc == 0 && n > 0) {
        size_t k;
        uint64_t pl;
        if (rp->pg_fill) { /* the rest of a gathered page */
            k = VMSNAP_MIN(n, (size_t)(rp->pg_len - rp->pg_fill));
            memcpy(rp->pg + rp->pg_fill, buf, k);
            rp->pg_fill += (unsigned)k;
            if (rp->pg_fill == rp->pg_len) {
                rc = ov_out(rp, rp->pg, rp->pg_off, rp->pg_len, img_all_zero(rp->pg, rp->pg_len),
                            err);
                rp->pg_fill = 0;
            }
        } else if (!(pl = ov_page(rp, off, rec_end))) { /* up to the next page, written */
            k = (size_t)VMSNAP_MIN((uint64_t)n,
                                   VMSNAP_MIN(rec_end, (off / IMG_PAGE + 1) * IMG_PAGE) - off);
            rc = ov_out(rp, buf, off, k, false, err);
        } else if (n < pl) { /* a page split between pieces: gathered */
            k = n;
            memcpy(rp->pg, buf, k);
            rp->pg_off = off;
            rp->pg_len = (unsigned)pl;
            rp->pg_fill = (unsigned)k;
        } else { /* a run of whole pages of one kind */
            const bool z = img_all_zero(buf, (size_t)pl);
            k = (size_t)pl;
            while (k < n && (pl = ov_page(rp, off + k, rec_end)) && n - k >= pl &&
                   img_all_zero(buf + k, (size_t)pl) == z)
                k += (size_t)pl;
            rc = ov_out(rp, buf, off, k, z, err);
        }
        off += k;
        buf += k;
        n -= k;
    }
    return rc;
}

int vmsnap_pagemask_new(uint64_t size, struct vmsnap_pagemask **out, struct vmsnap_err *err)
{
    *out = NULL;
    struct vmsnap_pagemask *m = calloc(1, sizeof(*m));
    uint64_t np = (size + IMG_PAGE - 1) / IMG_PAGE;
    if (m && !(m->bits = calloc(np / 64 + 1, sizeof(uint64_t)))) {
        free(m);
        m = NULL;
    }
    if (!m)
        return vmsnap_err_set(err, ENOMEM, "out of memory (a page mask of %llu pages)", ULL(np));
    m->npages = np;
    *out = m;
    return 0;
}

void vmsnap_pagemask_free(struct vmsnap_pagemask *m)
{
    if (m)
        free(m->bits);
    free(m);
}

static int under_flush(const struct rec_parser *rp, const uint8_t *buf, size_t n, uint64_t off,
                       struct vmsnap_err *err)
{
    int rc = n ? sys_pwrite_full(rp->fd, buf, n, off) : 0;
    if (rc < 0)
        return err_code(err, -rc, "%s: write %zu bytes at offset %llu",
                        rp->dst_name ? rp->dst_name : "destination", n, ULL(off));
    return 0;
}

/* Newest-first (rp->under): `n` bytes of the record being read, at rp->data_off. A page that a
 * newer layer holds (its bit set), or that lies past the newest layer's end (the mask's pages),
 * is skipped; the rest is written, an all-zero whole page left a hole (the destination starts
 * empty), and every page covered whole (or up to the file's end) marked. A whole page whose
 * bytes arrive in two pieces of input (the decoder's output comes in pieces of about 256 KiB, and a
 * record's data starts after its 16 header bytes, so a long record has one such page per piece) is
 * gathered in rp->pg first and then treated as whole: written unmarked, an older layer would
 * write its own version over it. A page only partly covered (a full image's unaligned extent:
 * it is the oldest layer) is written unmarked. The frames of one layer cover disjoint pages,
 * so a bit is set by one thread; the words are shared, hence the atomics. Pages to write are
 * gathered into runs: one pwrite per run (per page, a 260 MiB chain took 63,000 writes). */
static bool under_page(struct vmsnap_pagemask *m, uint64_t pg, const uint8_t *buf, size_t k,
                       bool whole)
{
    const uint64_t bit = 1ull << (pg % 64);
    if (__atomic_load_n(&m->bits[pg / 64], __ATOMIC_RELAXED) & bit)
        return false; /* a newer layer's */
    if (whole)
        __atomic_fetch_or(&m->bits[pg / 64], bit, __ATOMIC_RELAXED);
    return !(whole && img_all_zero(buf, k));
}

static int under_write(struct rec_parser *rp, const uint8_t *buf, size_t n, struct vmsnap_err *err)
{
    struct vmsnap_pagemask *m = rp->under;
    const uint64_t rec_end = rp->data_off + rp->data_left;
    uint64_t off = rp->data_off;
    const uint8_t *run = buf;
    uint64_t run_off = off;
    size_t run_len = 0;
    int rc = 0;
    while (rc == 0 && n > 0) {
        size_t k;
        if (rp->pg_fill) { /* the rest of a gathered page: then it is whole */
            k = VMSNAP_MIN(n, (size_t)(rp->pg_len - rp->pg_fill));
            memcpy(rp->pg + rp->pg_fill, buf, k);
            rp->pg_fill += (unsigned)k;
            if (rp->pg_fill == rp->pg_len) {
                rp->pg_fill = 0;
                if (under_page(m, rp->pg_off / IMG_PAGE, rp->pg, rp->pg_len, true))
                    rc = under_flush(rp, rp->pg, rp->pg_len, rp->pg_off, err);
            }
            off += k;
            buf += k;
            n -= k;
            run = buf;
            run_off = off;
            continue;
        }
        const uint64_t pg = off / IMG_PAGE;
        if (pg >= m->npages)
            break;                                     /* past the newest layer's end: dropped */
        const uint64_t pl = ov_page(rp, off, rec_end); /* a whole page (or the file's last) */
        k = (size_t)VMSNAP_MIN((uint64_t)n, (pg + 1) * IMG_PAGE - off);
        bool write;
        if (pl && n < pl) { /* its bytes continue in the next piece: gathered */
            if (run_len && (rc = under_flush(rp, run, run_len, run_off, err)) < 0)
                break;
            run_len = 0;
            memcpy(rp->pg, buf, n);
            rp->pg_off = off;
            rp->pg_len = (unsigned)pl;
            rp->pg_fill = (unsigned)n;
            off += n;
            buf += n;
            n = 0;
            continue;
        }
        write = under_page(m, pg, buf, k, pl != 0);
        if (write && run_len == 0) {
            run = buf;
            run_off = off;
        }
        if (write)
            run_len += k;
        else if (run_len) {
            rc = under_flush(rp, run, run_len, run_off, err);
            run_len = 0;
        }
        off += k;
        buf += k;
        n -= k;
    }
    if (rc == 0)
        rc = under_flush(rp, run, run_len, run_off, err);
    return rc;
}

int rec_feed(struct rec_parser *rp, const uint8_t *buf, size_t len, struct vmsnap_err *err)
{
    while (len > 0) {
        if (rp->state == REC_DATA) {
            size_t n = (size_t)VMSNAP_MIN((uint64_t)len, rp->data_left);
            if (rp->fd >= 0 && rp->under) {
                int rc = under_write(rp, buf, n, err);
                if (rc < 0)
                    return rc;
            } else if (rp->fd >= 0 && rp->overlay) {
                int rc = overlay_write(rp, buf, n, err);
                if (rc < 0)
                    return rc;
            } else if (rp->fd >= 0) {
                int rc = sys_pwrite_full(rp->fd, buf, n, rp->data_off);
                if (rc < 0)
                    return err_code(err, -rc, "%s: write %zu bytes at offset %llu",
                                    rp->dst_name ? rp->dst_name : "destination", n,
                                    (unsigned long long)rp->data_off);
            }
            rp->data_off += n;
            rp->data_left -= n;
            rp->pos += n;
            buf += n;
            len -= n;
            if (rp->data_left == 0)
                rp->state = REC_OFF;
            continue;
        }
        if (rp->state == REC_DONE)
            return bad(rp, err, "%zu bytes of data after the end-of-extents sentinel", len);
        size_t n = VMSNAP_MIN(len, (size_t)8 - rp->fill);
        memcpy(rp->word + rp->fill, buf, n);
        rp->fill += (unsigned)n;
        buf += n;
        len -= n;
        if (rp->fill == 8) {
            rp->fill = 0;
            int rc = word(rp, get_le64(rp->word), err);
            rp->pos += 8;
            if (rc < 0)
                return rc;
        }
    }
    return 0;
}

bool rec_at_boundary(const struct rec_parser *rp)
{
    return rp->fill == 0 && (rp->state == REC_OFF || rp->state == REC_DONE);
}
