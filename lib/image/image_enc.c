/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Image encoder.
 *
 * The source is cut into fixed ranges of `frame_size` bytes. Worker threads take the next range,
 * walk its extents with SEEK_DATA/SEEK_HOLE, pread each extent straight into a content buffer
 * laid out as the decoded stream ({off, len} header then data), drop all-zero pages by compacting
 * the buffer in place (a zero page frees 4 KiB, enough for the 16-byte header of the run after
 * it, so the write pointer never overtakes the read pointer), and compress the buffer as one zstd
 * frame with pinned parameters. The calling thread writes finished frames in range order and
 * builds the seek table. Range boundaries depend only on frame_size, so the output is the same
 * for every thread count.
 *
 * Memory: each worker owns one content buffer (<= frame_size + headers) and a window of
 * threads + 1 compressed frames waits for the writer, so at most about 2 x threads x frame_size.
 * Buffers are anonymous mappings kept across ranges. With a budget (opts->mem, a push's
 * --max-memory) every buffer is charged by its size: a range waits for the budget to take
 * more, unless it is the range the writer waits for next (that one never waits, so the output
 * always moves); a frame's buffer shrinks to the frame once compressed; and while more is
 * charged than the budget allows, buffers are given back after each use instead of kept.
 */
#include "image_int.h"
#include "sys/sys.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>
/* for ZSTD_c_stableInBuffer / ZSTD_c_stableOutBuffer: experimental names of parameters of the
 * stable ZSTD_CCtx_setParameter (since zstd 1.4.5), the buffer modes ZSTD_compress2 itself uses */
#define ZSTD_STATIC_LINKING_ONLY
#include <zstd.h>

enum slot_state { SLOT_FREE, SLOT_BUSY, SLOT_DONE };

/* A buffer kept across ranges: an anonymous mapping (not the C heap, whose per-thread arenas
 * keep what is freed), charged by its usable size to the budget when there is one. With a
 * budget, a trimmed buffer keeps its mapping: the bytes past `cap` are given back to the kernel
 * (MADV_DONTNEED) and uncharged, and a later use that fits in the mapping charges them again
 * without mapping anew, so the pages it kept need no new page faults (a frame buffer is trimmed
 * to its frame after every range). Only bytes below `cap` are ever resident. */
struct ebuf {
    uint8_t *p;
    size_t cap; /* usable bytes, and what is charged */
    size_t map; /* bytes mapped at p (>= cap) */
};

struct slot {
    enum slot_state state;
    int rc;
    struct vmsnap_err err;
    struct ebuf c; /* compressed frame, kept across uses of the slot */
    size_t clen;
    bool has_frame;              /* false for a range without data */
    bool reused;                 /* the frame is the base's */
    struct vmsnap_frame_info bf; /* then: the base's entry (offset in the base object) */
    struct vmsnap_frame_info fi;
    uint64_t zero_elided;
    uint64_t extents;
};

/* The records of one range, built in the worker's buffer. */
struct recs {
    size_t len; /* bytes of records in w->b.p (0: the range has no data) */
    uint64_t populated, extents, zero;
};

/* With a base: what the pre-scan found and decided for one range. */
struct plan {
    uint32_t base_frame; /* the base's frame for this range, index + 1 (0: none) */
    uint32_t run_id;     /* planned run (1, 2, ...; 0: none) */
    bool reuse;          /* take the base's frame */
    uint64_t run_left;   /* base bytes from this frame to the end of its planned run */
    struct recs scan;    /* records found (len only marks data where the base has no frame) */
};

struct enc {
    int fd;
    const char *name;
    uint64_t size;
    uint64_t frame_size;
    uint64_t nranges;
    int level;
    bool elide;
    bool drop_cache;
    const struct vmsnap_image *base;
    struct plan *plan; /* with a base: one per range */
    uint64_t min_run;  /* bytes a reused run and the written bytes before it need at least */

    pthread_mutex_t mu;
    pthread_cond_t cv_work; /* a slot was freed or abort */
    pthread_cond_t cv_done; /* a slot finished */
    uint64_t next;          /* next range to hand out */
    uint64_t written;       /* ranges consumed by the writer */
    unsigned window;
    struct slot *slots;
    bool abort;                        /* set under mu (set_abort); gate_stop reads it without */
    const struct vmsnap_pack_mem *mem; /* budget for the buffers; NULL: none */
};

struct extent {
    uint64_t off;
    uint64_t len;
};

struct worker {
    struct enc *e;
    ZSTD_CCtx *cctx;
    struct ebuf b; /* the records of the range being encoded */
    struct extent *ext;
    size_t next_cap;
    uint64_t cur; /* that range (gate_stop) */
    bool wait;    /* may wait for the budget (not the writer's) */
};

/* With a budget: a range's buffer stops waiting for it when the range is the one the writer
 * waits for (everything held waits for that one, directly or not), or when the encode stops.
 * Called by the waiting thread. */
static bool gate_stop(void *ctx)
{
    const struct worker *w = ctx;
    return __atomic_load_n(&w->e->abort, __ATOMIC_ACQUIRE) ||
           w->cur <= __atomic_load_n(&w->e->written, __ATOMIC_ACQUIRE);
}

#define EBUF_STEP ((size_t)1 << 20)

static size_t ebuf_round(size_t len)
{
    return len ? (len + EBUF_STEP - 1) / EBUF_STEP * EBUF_STEP : 0;
}

static void ebuf_trim(const struct enc *e, struct ebuf *b, size_t keep);

/* Make `b` hold at least `len` bytes (what it held is lost). With a budget, a buffer that can
 * be charged more at once (nothing waits) grows in place; otherwise it is given back first
 * (nothing waits holding it) and the new one charged before it is mapped: for worker `gw` that
 * waits while the budget is spent (see gate_stop); NULL: never waits. */
static int ebuf_reserve(const struct enc *e, struct ebuf *b, size_t len, struct worker *gw,
                        struct vmsnap_err *err)
{
    if (len <= b->cap)
        return 0;
    size_t cap = ebuf_round(len);
    void *np;
    if (e->mem && b->p && e->mem->try_acquire && e->mem->try_acquire(e->mem->arg, cap - b->cap)) {
        np = cap <= b->map ? b->p : mremap(b->p, b->map, cap, MREMAP_MAYMOVE);
        if (np == MAP_FAILED) {
            e->mem->release(e->mem->arg, cap - b->cap);
            ebuf_trim(e, b, 0);
        } else {
            b->p = np;
            b->map = VMSNAP_MAX(b->map, cap);
            b->cap = cap;
            return 0;
        }
    }
    if (e->mem) {
        ebuf_trim(e, b, 0);
        e->mem->acquire(e->mem->arg, cap, gw && gw->wait, gate_stop, gw);
        np = mmap(NULL, cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (np == MAP_FAILED)
            e->mem->release(e->mem->arg, cap);
    } else {
        np = b->p ? mremap(b->p, b->map, cap, MREMAP_MAYMOVE)
                  : mmap(NULL, cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    }
    if (np == MAP_FAILED)
        return vmsnap_err_set(err, ENOMEM, "out of memory (%zu bytes for a range)", cap);
    b->p = np;
    b->cap = b->map = cap;
    return 0;
}

/* Keep only the first `keep` bytes of `b` (whole steps; 0: unmap it) and uncharge the rest.
 * The mapping stays (see struct ebuf); the bytes past the kept ones go back to the kernel. */
static void ebuf_trim(const struct enc *e, struct ebuf *b, size_t keep)
{
    size_t cap = ebuf_round(keep);
    if (cap >= b->cap)
        return;
    if (cap == 0) {
        munmap(b->p, b->map);
        b->p = NULL;
        b->map = 0;
    } else if (madvise(b->p + cap, b->map - cap, MADV_DONTNEED) < 0) {
        return; /* (cannot fail on a private anonymous mapping of ours) */
    }
    if (e->mem)
        e->mem->release(e->mem->arg, b->cap - cap);
    b->cap = cap;
}

/* After a use: kept for the next range, unless more is charged than the budget allows or
 * another range waits for it. */
static void ebuf_settle(const struct enc *e, struct ebuf *b)
{
    if (e->mem && e->mem->over(e->mem->arg))
        ebuf_trim(e, b, 0);
}

/* Set the abort flag (under e->mu) and wake whatever waits for it. */
static void set_abort(struct enc *e)
{
    __atomic_store_n(&e->abort, true, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&e->cv_work);
    if (e->mem)
        e->mem->kick(e->mem->arg);
}

/* True when `len` bytes at p are all zero: 64 bytes per step, stop at the first non-zero word. */
static bool all_zero(const uint8_t *p, size_t len)
{
    size_t i = 0;
    for (; i + 64 <= len; i += 64) {
        uint64_t w[8];
        memcpy(w, p + i, 64);
        if (w[0] | w[1] | w[2] | w[3] | w[4] | w[5] | w[6] | w[7])
            return false;
    }
    for (; i < len; i++)
        if (p[i])
            return false;
    return true;
}

/* The pinned parameters: the level, the content-size flag, no zstd threads, and for
 * levels up to 1 a 1 MiB window (zstd's own default there is 512 KiB; from level 2 it is 1 MiB
 * or more). The larger window made the 2 GiB bench image 0.17% smaller, smaller than zstd -1 -T0
 * of the whole file, at no measurable speed cost; a streaming decoder needs only that much
 * memory. zstd still shrinks the window for smaller frames. */
#define LOW_LEVEL_WINDOW_LOG 20

int vmsnap_image_check_pack_opts(const struct vmsnap_pack_opts *opts, struct vmsnap_err *err)
{
    uint64_t fs = opts->frame_size ? opts->frame_size : VMSNAP_IMAGE_DEFAULT_FRAME_SIZE;
    int level = opts->level ? opts->level : 1;
    if (fs % VMSNAP_IMAGE_PAGE || fs < VMSNAP_IMAGE_MIN_FRAME_SIZE ||
        fs > VMSNAP_IMAGE_MAX_FRAME_SIZE)
        return vmsnap_err_set(
            err, EINVAL, "frame size %llu: must be a multiple of 4 KiB between 1 MiB and 1 GiB",
            (unsigned long long)fs);
    if (level < ZSTD_minCLevel() || level > ZSTD_maxCLevel())
        return vmsnap_err_set(err, EINVAL, "zstd level %d out of range [%d, %d]", level,
                              ZSTD_minCLevel(), ZSTD_maxCLevel());
    return 0;
}

static int set_cparams(ZSTD_CCtx *cctx, int level)
{
    size_t r = ZSTD_CCtx_reset(cctx, ZSTD_reset_session_and_parameters);
    if (!ZSTD_isError(r))
        r = ZSTD_CCtx_setParameter(cctx, ZSTD_c_compressionLevel, level);
    if (!ZSTD_isError(r) && level <= 1)
        r = ZSTD_CCtx_setParameter(cctx, ZSTD_c_windowLog, LOW_LEVEL_WINDOW_LOG);
    if (!ZSTD_isError(r)) /* compress_frame appends the checksum itself */
        r = ZSTD_CCtx_setParameter(cctx, ZSTD_c_checksumFlag, 0);
    if (!ZSTD_isError(r))
        r = ZSTD_CCtx_setParameter(cctx, ZSTD_c_contentSizeFlag, 1);
    if (!ZSTD_isError(r))
        r = ZSTD_CCtx_setParameter(cctx, ZSTD_c_nbWorkers, 0);
    return ZSTD_isError(r) ? -EINVAL : 0;
}

/* The buffer compress_frame needs for `len` bytes. */
static size_t frame_bound(size_t len)
{
    return ZSTD_compressBound(len) + 4;
}

/* The `n`-byte zstd frame at `out` gets the checksum flag and `checksum`'s low 32 bits. */
static int finish_frame(uint8_t *out, size_t n, uint64_t checksum, size_t *out_len,
                        struct vmsnap_err *err)
{
    if (n < 6 || get_le32(out) != ZSTD_MAGICNUMBER || out[4] & 0x04)
        return vmsnap_err_set(err, EIO, "zstd compress: unexpected frame header");
    out[4] |= 0x04;
    put_le32(out + n, (uint32_t)checksum);
    *out_len = n + 4;
    return 0;
}

/* At --level STEPPED_LEVEL and above a frame is compressed in COMPRESS_STEP pieces, so that the
 * encode stops between pieces when it is cancelled or aborted (a 64 MiB frame at --level 19 takes
 * half a minute; Ctrl-C waited for it, then the pack exited 0). Below, where a frame takes a
 * fraction of a second, ZSTD_compress2 takes it whole. */
#define COMPRESS_STEP ((size_t)4 << 20)
#define STEPPED_LEVEL 10

/* Compress `len` bytes into `out` (frame_bound(len) bytes) as a frame carrying
 * zstd's content checksum. `checksum` is the caller's XXH64 of `src` (seed 0), which is what zstd
 * would hash: zstd compresses without its own pass over the data, and the frame gets the checksum
 * flag (bit 2 of the frame header descriptor, right after the magic) and the hash's low 32 bits
 * after its last block, byte for byte the frame zstd itself would write. Stepped (see above),
 * the input goes to zstd in pieces of one stable buffer whose size grows, its size pledged up
 * front, and a cancel or the encoder's abort (`e`, NULL: none) stops it between pieces. zstd
 * before 1.5.4 refuses a stable buffer that grows ("Source buffer is wrong"): there every frame
 * is compressed whole. The stepped frame is the bytes ZSTD_compress2 makes with zstd 1.5.4 to
 * 1.5.6 (checked at levels 1-19); from 1.5.7 its block pre-splitter may cut the blocks of a
 * streamed frame differently, so high-level output can differ by zstd version (as FORMAT.md
 * allows: identical for a given libzstd, for any thread count). */
static int compress_frame(const struct enc *e, ZSTD_CCtx *cctx, int level, const uint8_t *src,
                          size_t len, uint64_t checksum, uint8_t *out, size_t *out_len,
                          struct vmsnap_err *err)
{
    size_t r = 0;
    if (set_cparams(cctx, level) < 0)
        return vmsnap_err_set(err, EINVAL, "zstd: cannot set level %d", level);
    if (level < STEPPED_LEVEL || len <= COMPRESS_STEP || ZSTD_versionNumber() < 10504) {
        r = ZSTD_compress2(cctx, out, frame_bound(len) - 4, src, len);
        if (ZSTD_isError(r))
            return vmsnap_err_set(err, EIO, "zstd compress: %s", ZSTD_getErrorName(r));
        return finish_frame(out, r, checksum, out_len, err);
    }
    if (ZSTD_isError(r = ZSTD_CCtx_setParameter(cctx, ZSTD_c_stableInBuffer, 1)) ||
        ZSTD_isError(r = ZSTD_CCtx_setParameter(cctx, ZSTD_c_stableOutBuffer, 1)) ||
        ZSTD_isError(r = ZSTD_CCtx_setPledgedSrcSize(cctx, len)))
        return vmsnap_err_set(err, EINVAL, "zstd: cannot set stepped compression: %s",
                              ZSTD_getErrorName(r));
    ZSTD_outBuffer ob = {out, frame_bound(len) - 4, 0};
    ZSTD_inBuffer ib = {src, 0, 0};
    for (;;) {
        ib.size = len - ib.size > COMPRESS_STEP ? ib.size + COMPRESS_STEP : len;
        const bool last = ib.size == len;
        r = ZSTD_compressStream2(cctx, &ob, &ib, last ? ZSTD_e_end : ZSTD_e_continue);
        if (ZSTD_isError(r))
            return vmsnap_err_set(err, EIO, "zstd compress: %s", ZSTD_getErrorName(r));
        if (last && r == 0)
            break;
        if (last) /* the bound leaves room for the whole frame: never reached */
            return vmsnap_err_set(err, EIO, "zstd compress: frame larger than its bound");
        if (cancel_pending() || (e && __atomic_load_n(&e->abort, __ATOMIC_ACQUIRE))) {
            int rc = cancel_check(err);
            return rc < 0 ? rc : vmsnap_err_set(err, ECANCELED, "encode stopped");
        }
    }
    return finish_frame(out, ob.pos, checksum, out_len, err);
}

/* Compress the records `len` bytes at `src` into slot buffer `c` (grown as needed, charged
 * for worker `gw`, see ebuf_reserve); with a budget, `c` then shrinks to the frame. */
static int compress_into(const struct enc *e, ZSTD_CCtx *cctx, const uint8_t *src, size_t len,
                         uint64_t checksum, struct ebuf *c, size_t *out_len, struct worker *gw,
                         struct vmsnap_err *err)
{
    int rc = ebuf_reserve(e, c, frame_bound(len), gw, err);
    if (rc == 0)
        rc = compress_frame(e, cctx, e->level, src, len, checksum, c->p, out_len, err);
    if (rc == 0 && e->mem)
        ebuf_trim(e, c, *out_len);
    return rc;
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
static int find_extents(struct worker *w, uint64_t start, uint64_t end, size_t *n_out,
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
static int build_records(struct worker *w, uint64_t idx, bool drop, struct recs *r,
                         struct vmsnap_err *err)
{
    struct enc *e = w->e;
    uint64_t start = idx * e->frame_size;
    uint64_t end = VMSNAP_MIN(start + e->frame_size, e->size);
    *r = (struct recs){0};
    size_t n = 0;
    int rc = find_extents(w, start, end, &n, err);
    if (rc < 0)
        return rc;

    uint64_t need = 0;
    for (size_t i = 0; i < n; i++)
        need += REC_HDR_LEN + w->ext[i].len;
    if (need == 0)
        return 0;
    rc = ebuf_reserve(e, &w->b, need, w, err);
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
            const bool z = !at_end && all_zero(w->b.p + p + (b - d), bend - b);
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

/* True when the records just built for range `idx` are the base's frame for that range. */
static bool same_as_base(const struct enc *e, uint64_t idx, const struct recs *r, uint64_t sum,
                         struct vmsnap_frame_info *bf)
{
    if (!e->plan || !e->plan[idx].base_frame)
        return false;
    uint64_t start = idx * e->frame_size;
    uint64_t end = VMSNAP_MIN(start + e->frame_size, e->size);
    vmsnap_image_frame(e->base, e->plan[idx].base_frame - 1, bf);
    return bf->src_start == start && bf->src_end == end && bf->dsize == r->len &&
           bf->populated == r->populated && bf->checksum == sum;
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
    int rc = build_records(w, idx, true, &r, &s->err);
    if (rc < 0)
        return rc;
    s->zero_elided = r.zero;
    s->extents = r.extents;
    if (r.len == 0)
        return 0; /* all zero: no frame */
    s->has_frame = true;
    s->fi.checksum = XXH64(w->b.p, r.len, 0);
    rc = compress_into(e, w->cctx, w->b.p, r.len, s->fi.checksum, &s->c, &s->clen, w, &s->err);
    ebuf_settle(e, &w->b);
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

/* Pre-scan with a base: every range's records are built and hashed (not compressed) to find the
 * frames that did not change. Runs over ranges in parallel; results in e->same. */
struct scan {
    struct enc *e;
    struct worker *w;
    pthread_mutex_t *mu;
    uint64_t *next;
    int *rc;
    struct vmsnap_err *err;
};

static void *scan_main(void *arg)
{
    struct scan *sc = arg;
    struct enc *e = sc->e;
    for (;;) {
        pthread_mutex_lock(sc->mu);
        uint64_t idx = *sc->next;
        bool stop = *sc->rc < 0 || idx >= e->nranges;
        if (!stop)
            (*sc->next)++;
        pthread_mutex_unlock(sc->mu);
        if (stop)
            break;
        struct recs r = {0};
        struct vmsnap_err er = {0};
        sc->w->cur = idx;
        int rc = cancel_check(&er);
        if (rc < 0) {
            /* cancelled: reported below */
        } else if (!e->plan[idx].base_frame) {
            /* nothing to compare with; note only whether the range has data (it breaks a run) */
            uint64_t start = idx * e->frame_size;
            size_t n = 0;
            rc = find_extents(sc->w, start, VMSNAP_MIN(start + e->frame_size, e->size), &n, &er);
            e->plan[idx].scan.len = n > 0;
        } else {
            rc = build_records(sc->w, idx, false, &r, &er);
        }
        struct vmsnap_frame_info bf;
        if (rc == 0 && r.len) {
            e->plan[idx].reuse = same_as_base(e, idx, &r, XXH64(sc->w->b.p, r.len, 0), &bf);
            e->plan[idx].scan = r;
        }
        ebuf_settle(e, &sc->w->b);
        if (rc < 0) {
            pthread_mutex_lock(sc->mu);
            if (*sc->rc == 0) {
                *sc->rc = rc;
                if (sc->err)
                    *sc->err = er;
            }
            pthread_mutex_unlock(sc->mu);
        }
    }
    if (e->mem) /* another scan may wait for the budget: nothing kept idle */
        ebuf_trim(e, &sc->w->b, 0);
    return NULL;
}

/* Find the unchanged frames, then keep only runs of them (adjacent in the base object too) whose
 * compressed bytes add up to at least min_run: shorter runs are compressed again. */
static int prescan(struct enc *e, struct worker *ws, unsigned threads, struct vmsnap_err *err)
{
    const uint64_t min_run = e->min_run;
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    uint64_t next = 0;
    int rc = 0;
    struct scan *sc = calloc(threads, sizeof(*sc));
    pthread_t *tid = calloc(threads, sizeof(*tid));
    if (!sc || !tid) {
        free(sc);
        free(tid);
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    }
    bool *up = calloc(threads, sizeof(*up));
    for (unsigned i = 0; i < threads; i++) {
        sc[i] = (struct scan){e, &ws[i], &mu, &next, &rc, err};
        if (i > 0 && up)
            up[i] = pthread_create(&tid[i], NULL, scan_main, &sc[i]) == 0;
    }
    scan_main(&sc[0]);
    for (unsigned i = 1; up && i < threads; i++)
        if (up[i])
            pthread_join(tid[i], NULL);
    free(up);
    free(sc);
    free(tid);
    if (rc < 0)
        return rc;
    /* Runs: reusable ranges whose base frames follow each other in the base object. A range
     * without data in either file is invisible in both objects and does not break a run; one with
     * data that is not reusable does. */
    uint64_t i = 0;
    uint32_t run_id = 0;
    while (i < e->nranges) {
        if (!e->plan[i].reuse) {
            i++;
            continue;
        }
        uint64_t j = i, last = i, bytes = 0;
        for (; j < e->nranges; j++) {
            if (!e->plan[j].reuse) {
                if (e->plan[j].scan.len)
                    break;
                continue;
            }
            if (j != i && e->plan[j].base_frame != e->plan[last].base_frame + 1)
                break;
            struct vmsnap_frame_info bf;
            vmsnap_image_frame(e->base, e->plan[j].base_frame - 1, &bf);
            bytes += bf.csize;
            last = j;
        }
        uint64_t left = bytes;
        run_id++;
        for (uint64_t k = i; k <= last; k++) {
            if (!e->plan[k].reuse)
                continue;
            e->plan[k].run_id = run_id;
            struct vmsnap_frame_info bf;
            vmsnap_image_frame(e->base, e->plan[k].base_frame - 1, &bf);
            e->plan[k].reuse = bytes >= min_run;
            e->plan[k].run_left = left;
            left -= bf.csize;
        }
        i = last + 1;
    }
    return 0;
}

static void *worker_main(void *arg)
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
        ebuf_trim(e, &w->b, 0);
    return NULL;
}

/* Growable array of frame entries for the seek table. */
struct table {
    struct vmsnap_frame_info *f;
    size_t n, cap;
};

static int table_add(struct table *t, const struct vmsnap_frame_info *fi, struct vmsnap_err *err)
{
    if (grow_array(&t->f, &t->cap, t->n + 1, sizeof(*t->f), 64) < 0)
        return vmsnap_err_set(err, ENOMEM, "out of memory (seek table)");
    t->f[t->n++] = *fi;
    return 0;
}

struct out {
    const struct vmsnap_sink *sink;
    uint64_t pos;
};

static int emit(struct out *o, const void *buf, size_t len, struct vmsnap_err *err)
{
    int rc = o->sink->write(o->sink->arg, buf, len, err);
    if (rc < 0)
        return rc;
    o->pos += len;
    return 0;
}

/* A frame holding one 8-byte word (the totalSize header or the -1 sentinel). */
static int emit_word_frame(struct out *o, ZSTD_CCtx *cctx, int level, uint64_t word,
                           uint64_t src_pos, struct table *t, struct vmsnap_err *err)
{
    uint8_t w[8];
    put_le64(w, word);
    uint8_t c[128];
    size_t clen = 0;
    uint64_t sum = XXH64(w, sizeof(w), 0);
    _Static_assert(sizeof(c) >= ZSTD_COMPRESSBOUND(sizeof(w)) + 4, "word frame buffer");
    int rc = compress_frame(NULL, cctx, level, w, sizeof(w), sum, c, &clen, err);
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
    rc = emit(o, c, clen, err);
    if (rc < 0)
        return rc;
    return table_add(t, &fi, err);
}

/* The info skippable frame right after the file header: announces the seek table. */
static int emit_info_frame(struct out *o, uint64_t frame_size, struct vmsnap_err *err)
{
    uint8_t b[8 + INFO_CONTENT_LEN];
    put_le32(b, INFO_SKIP_MAGIC);
    put_le32(b + 4, INFO_CONTENT_LEN);
    memcpy(b + 8, INFO_MAGIC, 8);
    put_le32(b + 16, INFO_VERSION);
    put_le32(b + 20, INFO_FLAG_SEEK_TABLE);
    put_le64(b + 24, frame_size);
    return emit(o, b, sizeof(b), err);
}

static int emit_seek_table(struct out *o, const struct table *t,
                           const struct vmsnap_image_stats *st, uint64_t frame_size,
                           uint64_t frames_start, int level, bool elided, struct vmsnap_err *err)
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
    put_le32(h + 4, elided ? SEEK_FLAG_ZERO_ELIDED : 0);
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
    int rc = emit(o, b, total, err);
    free(b);
    return rc;
}

/* Compress a range the workers left to the base after all (the writer shapes runs): rebuild its
 * records with the writer's own worker state and compress them into the slot. */
static int demote(struct worker *wk, uint64_t idx, struct slot *sl, struct vmsnap_err *err)
{
    struct enc *e = wk->e;
    struct recs r;
    int rc = build_records(wk, idx, false, &r, err);
    if (rc == 0 && (r.len != sl->bf.dsize || XXH64(wk->b.p, r.len, 0) != sl->bf.checksum))
        rc = vmsnap_err_set(err, EIO, "%s: changed while being read (offset %llu): is it in use?",
                            e->name, (unsigned long long)(idx * e->frame_size));
    if (rc == 0) /* the writer's: never waits for the budget */
        rc =
            compress_into(e, wk->cctx, wk->b.p, r.len, sl->bf.checksum, &sl->c, &sl->clen, wk, err);
    ebuf_settle(e, &wk->b);
    if (rc < 0)
        return rc;
    uint64_t off = sl->fi.offset;
    sl->reused = false;
    sl->fi.offset = off;
    sl->fi.csize = sl->clen;
    sl->fi.ccheck = XXH64(sl->c.p, sl->clen, 0);
    return 0;
}

int vmsnap_image_pack_fd(int src_fd, const char *src_name, const struct vmsnap_sink *sink,
                         const struct vmsnap_pack_opts *opts, struct vmsnap_image_stats *stats,
                         struct vmsnap_err *err)
{
    static const struct vmsnap_pack_opts defaults;
    if (!opts)
        opts = &defaults;
    const char *name = src_name ? src_name : "source";
    struct stat st;
    if (fstat(src_fd, &st) < 0)
        return err_sys(err, "stat %s", name);
    if (!S_ISREG(st.st_mode))
        return vmsnap_err_set(err, EINVAL, "%s: not a regular file", name);
    char probe;
    if (st.st_size == 0 && pread(src_fd, &probe, 1, 0) == 1) /* packed as empty, exit 0 */
        return vmsnap_err_set(err, EINVAL,
                              "%s reports a size of 0 but has data (a /proc or /sys file?): the "
                              "encoder reads a file by its size; copy it to a file first",
                              name);

    struct enc e = {
        .fd = src_fd,
        .name = name,
        .size = (uint64_t)st.st_size,
        .frame_size = opts->frame_size ? opts->frame_size : VMSNAP_IMAGE_DEFAULT_FRAME_SIZE,
        .level = opts->level ? opts->level : 1,
        .elide = !opts->keep_zero_pages,
        .drop_cache = !opts->keep_cache,
        .mem = opts->mem,
    };
    int crc = vmsnap_image_check_pack_opts(opts, err);
    if (crc < 0)
        return crc;
    e.nranges = (e.size + e.frame_size - 1) / e.frame_size;
    if (e.nranges + 2 > SEEK_MAX_FRAMES)
        return vmsnap_err_set(err, EFBIG,
                              "%s: %llu bytes makes too many frames at frame size %llu; use a "
                              "larger --frame-size",
                              name, (unsigned long long)e.size, (unsigned long long)e.frame_size);
    unsigned threads = opts->threads ? opts->threads : sys_cpus();
    if (threads > 256)
        threads = 256;
    if ((uint64_t)threads > e.nranges)
        threads = e.nranges ? (unsigned)e.nranges : 1;
    e.window = threads + 1;
    if (opts->base && sink->copy) {
        struct vmsnap_image_stats bs;
        vmsnap_image_get_stats(opts->base, &bs);
        if (bs.frame_size == e.frame_size && bs.level == e.level && e.nranges > 0) {
            e.base = opts->base;
            e.plan = calloc(e.nranges, sizeof(*e.plan));
            e.min_run = opts->base_min_run ? opts->base_min_run : VMSNAP_IMAGE_DEFAULT_MIN_RUN;
            if (!e.plan)
                return vmsnap_err_set(err, ENOMEM, "out of memory");
            uint32_t nb = vmsnap_image_frame_count(e.base);
            for (uint32_t i = 0; i < nb; i++) {
                struct vmsnap_frame_info bf;
                vmsnap_image_frame(e.base, i, &bf);
                if (bf.src_end > bf.src_start && bf.src_start % e.frame_size == 0 &&
                    bf.src_start / e.frame_size < e.nranges)
                    e.plan[bf.src_start / e.frame_size].base_frame = i + 1;
            }
        }
    }

    struct vmsnap_image_stats s = {
        .total_size = e.size, .frame_size = e.frame_size, .has_seek_table = true};
    struct table t = {0};
    struct out o = {.sink = sink, .pos = 0};
    struct worker *ws = calloc(threads, sizeof(*ws));
    pthread_t *tids = calloc(threads, sizeof(*tids));
    e.slots = calloc(e.window, sizeof(*e.slots));
    ZSTD_CCtx *cctx = ZSTD_createCCtx();
    unsigned started = 0;
    int rc = 0;
    if (!ws || !tids || !e.slots || !cctx) {
        rc = vmsnap_err_set(err, ENOMEM, "out of memory");
        goto out;
    }
    pthread_mutex_init(&e.mu, NULL);
    pthread_cond_init(&e.cv_work, NULL);
    pthread_cond_init(&e.cv_done, NULL);

    /* The pre-scan first: it writes nothing, so the sink holds no part being filled while its
     * threads wait for a shared budget (with two files at once, the other file's writer waited
     * for that part, and the part for this file's pre-scan: a deadlock found by review). */
    for (unsigned i = 0; i < threads; i++)
        ws[i] = (struct worker){.e = &e, .wait = true};
    if (e.base && (rc = prescan(&e, ws, threads, err)) < 0)
        goto out_sync;

    /* Header, info frame and the totalSize frame go out before any worker starts. */
    uint8_t hdr[IMG_HEADER_LEN];
    memcpy(hdr, IMG_MAGIC, IMG_MAGIC_LEN);
    put_le32(hdr + 8, IMG_VERSION);
    if ((rc = emit(&o, hdr, sizeof(hdr), err)) < 0 ||
        (rc = emit_info_frame(&o, e.frame_size, err)) < 0)
        goto out_sync;
    const uint64_t frames_start = o.pos;
    if ((rc = emit_word_frame(&o, cctx, e.level, e.size, 0, &t, err)) < 0)
        goto out_sync;

    for (; started < threads; started++) {
        ws[started].cctx = ZSTD_createCCtx();
        if (!ws[started].cctx ||
            pthread_create(&tids[started], NULL, worker_main, &ws[started]) != 0) {
            ZSTD_freeCCtx(ws[started].cctx);
            rc = vmsnap_err_set(err, EAGAIN, "cannot start encoder thread %u", started);
            break;
        }
    }

    /* The ordered writer. With a base it also shapes the runs of reused frames (see below). */
    struct worker wk = {.e = &e, .cctx = cctx};
    uint64_t seg = o.pos, run_left = 0, prev_base_end = 0;
    uint32_t prev_run = 0;
    bool copying = false, prev_reused = false;
    for (uint64_t i = 0; rc == 0 && i < e.nranges; i++) {
        if ((rc = cancel_check(err)) < 0)
            break;
        struct slot *sl = &e.slots[i % e.window];
        pthread_mutex_lock(&e.mu);
        while (sl->state != SLOT_DONE && started > 0)
            pthread_cond_wait(&e.cv_done, &e.mu);
        pthread_mutex_unlock(&e.mu);
        if (sl->state != SLOT_DONE) {
            rc = vmsnap_err_set(err, EAGAIN, "no encoder thread running");
            break;
        }
        if (sl->rc < 0) {
            if (err)
                *err = sl->err;
            rc = sl->rc;
        } else if (sl->has_frame) {
            sl->fi.offset = o.pos;
            if (sl->reused) {
                /* A run must reach the sink with at least min_run bytes, after at least min_run
                 * written bytes (or none) since the previous run: compress its head here when
                 * the bytes before it are fewer, all of it when too little would be left. */
                if (!(prev_reused && sl->bf.offset == prev_base_end &&
                      e.plan[i].run_id == prev_run)) {
                    run_left = e.plan[i].run_left; /* a planned run starts */
                    copying = false;
                }
                prev_run = e.plan[i].run_id;
                if (!copying && ((seg > 0 && seg < e.min_run) || run_left < e.min_run))
                    rc = demote(&wk, i, sl, err);
                else
                    copying = true;
                run_left -= VMSNAP_MIN(run_left, sl->bf.csize);
                prev_reused = true;
                prev_base_end = sl->bf.offset + sl->bf.csize;
            } else {
                copying = prev_reused = false;
            }
            if (rc < 0) {
                /* demote failed */
            } else if (sl->reused) {
                rc = sink->copy(sink->arg, &sl->bf, err);
                o.pos += sl->fi.csize;
                seg = 0;
                s.reused++;
                s.reused_bytes += sl->fi.csize;
            } else {
                rc = emit(&o, sl->c.p, sl->clen, err);
                seg += sl->clen;
            }
            if (rc == 0)
                rc = table_add(&t, &sl->fi, err);
            s.populated += sl->fi.populated;
            s.frames++;
        }
        ebuf_settle(&e, &sl->c);
        s.zero_elided += sl->zero_elided;
        s.extents += sl->extents;
        pthread_mutex_lock(&e.mu);
        sl->state = SLOT_FREE;
        __atomic_store_n(&e.written, e.written + 1, __ATOMIC_RELEASE);
        if (rc < 0)
            set_abort(&e);
        pthread_cond_broadcast(&e.cv_work);
        if (e.mem) /* the range now waited for may be waiting for the budget: not any more */
            e.mem->kick(e.mem->arg);
        pthread_mutex_unlock(&e.mu);
        if (rc == 0 && opts->progress)
            opts->progress(opts->progress_arg, VMSNAP_MIN((i + 1) * e.frame_size, e.size), e.size);
    }
    pthread_mutex_lock(&e.mu);
    set_abort(&e);
    pthread_mutex_unlock(&e.mu);
    for (unsigned i = 0; i < started; i++) {
        pthread_join(tids[i], NULL);
        ZSTD_freeCCtx(ws[i].cctx);
    }
    for (unsigned i = 0; i < e.window; i++)
        ebuf_trim(&e, &e.slots[i].c, 0);
    ebuf_trim(&e, &wk.b, 0);
    free(wk.ext);
    if (rc < 0)
        goto out_sync;
    /* A file written while it was read is encoded as it never was (ranges of different
     * moments; a shrunk file's lost tail read as holes): refused before the object is whole. */
    struct stat after;
    if (fstat(src_fd, &after) < 0 || after.st_size != st.st_size ||
        after.st_mtim.tv_sec != st.st_mtim.tv_sec || after.st_mtim.tv_nsec != st.st_mtim.tv_nsec) {
        rc = vmsnap_err_set(err, EAGAIN,
                            "%s changed while being read (size or modification time): encode it "
                            "again when nothing writes to it",
                            name);
        goto out_sync;
    }

    if ((rc = emit_word_frame(&o, cctx, e.level, UINT64_MAX, e.size, &t, err)) < 0)
        goto out_sync;
    rc = emit_seek_table(&o, &t, &s, e.frame_size, frames_start, e.level, e.elide, err);
    s.object_size = o.pos;
out_sync:
    for (unsigned i = 0; ws && i < threads; i++) {
        ebuf_trim(&e, &ws[i].b, 0);
        free(ws[i].ext);
    }
    pthread_cond_destroy(&e.cv_done);
    pthread_cond_destroy(&e.cv_work);
    pthread_mutex_destroy(&e.mu);
out:
    ZSTD_freeCCtx(cctx);
    free(e.plan);
    free(e.slots);
    free(tids);
    free(ws);
    free(t.f);
    if (rc == 0 && stats)
        *stats = s;
    return rc < 0 ? rc : 0;
}

bool vmsnap_image_is_seek_table(const void *buf, size_t len)
{
    const uint8_t *p = buf;
    if (len < 8 + SEEK_HDR_LEN + SEEK_FOOTER_LEN)
        return false;
    uint32_t magic =
        (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    uint32_t size =
        (uint32_t)p[4] | (uint32_t)p[5] << 8 | (uint32_t)p[6] << 16 | (uint32_t)p[7] << 24;
    return magic == SEEK_SKIP_MAGIC && (uint64_t)size + 8 == len &&
           !memcmp(p + len - 8, SEEK_FOOTER_MAGIC, 8);
}

/* Write to a pipe without blocking on a stalled reader: wait for room in 0.2 s steps (a cancel
 * is seen there) and write at most what fits. */
static int pipe_write_full(int fd, const uint8_t *p, size_t len)
{
    while (len > 0) {
        struct pollfd pfd = {.fd = fd, .events = POLLOUT};
        int pr = poll(&pfd, 1, 200);
        if (vmsnap_cancelled())
            return -ECANCELED;
        if (pr < 0 && errno != EINTR)
            return -errno;
        if (pr <= 0)
            continue;
        int used = 0, cap = fcntl(fd, F_GETPIPE_SZ);
        if (ioctl(fd, FIONREAD, &used) < 0 || cap <= used)
            used = cap = 0;
        size_t n = VMSNAP_MIN(len, cap > used ? (size_t)(cap - used) : (size_t)PIPE_BUF);
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno != EINTR && errno != EAGAIN)
            return -errno;
        if (w > 0) {
            p += w;
            len -= (size_t)w;
        }
    }
    return 0;
}

static int fd_sink_write(void *arg, const void *buf, size_t len, struct vmsnap_err *err)
{
    const struct sys_atomic_file *af = arg;
    struct stat sb;
    int rc = !af->path && fstat(af->fd, &sb) == 0 && S_ISFIFO(sb.st_mode)
                 ? pipe_write_full(af->fd, buf, len)
                 : sys_write_full(af->fd, buf, len);
    if (rc == -ECANCELED)
        return cancel_check(err);
    if (rc < 0)
        return err_code(err, -rc, "write %s", af->path ? af->path : "stdout");
    return 0;
}

int vmsnap_image_pack(const char *src, const char *dst, const struct vmsnap_pack_opts *opts,
                      struct vmsnap_image_stats *stats, struct vmsnap_err *err)
{
    /* O_NONBLOCK: a FIFO given as the source must not block the open (where no signal stops
     * it); the encoder refuses anything but a regular file */
    int fd = open(src, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return err_sys(err, "open %s", src);
    (void)fcntl(fd, F_SETFL, 0);
    struct stat sst;
    if (fstat(fd, &sst) < 0 || !S_ISREG(sst.st_mode)) {
        close(fd);
        return vmsnap_err_set(err, EINVAL, "%s: not a regular file (pack reads a file)", src);
    }
    struct sys_atomic_file af = {.fd = STDOUT_FILENO};
    bool to_stdout = strcmp(dst, "-") == 0;
    int rc = 0;
    struct stat so, si;
    bool self = to_stdout ? fstat(STDOUT_FILENO, &so) == 0 && fstat(fd, &si) == 0 &&
                                so.st_dev == si.st_dev && so.st_ino == si.st_ino
                          : sys_same_file(fd, dst);
    if (self) { /* pack X X, or pack X - >> X */
        close(fd);
        return vmsnap_err_set(err, EINVAL, "%s: the destination is the source",
                              to_stdout ? "stdout" : dst);
    }
    if (!to_stdout && (rc = sys_atomic_open(&af, dst, 0600, err)) < 0) {
        close(fd);
        return rc;
    }
    struct vmsnap_sink sink = {.write = fd_sink_write, .arg = &af};
    rc = vmsnap_image_pack_fd(fd, src, &sink, opts, stats, err);
    close(fd);
    if (to_stdout)
        return rc;
    if (rc < 0) {
        sys_atomic_abort(&af);
        return rc;
    }
    return sys_atomic_commit(&af, opts && opts->fsync, err);
}
