/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Image decoder: the seek table reader, the per-frame decoder and the parallel driver.
 *
 * The seek table is found from the fixed footer in the last 32 bytes, checked against its own
 * XXH64 and then field by field against the object (frame offsets must tile the object exactly,
 * source ranges ascend without overlap, sizes are bounded by the ranges they describe) before
 * any of it is used. A frame is then decoded whole into a buffer sized from the table (the zstd
 * frame header must agree), its XXH64 compared, and its records parsed with the frame's source
 * range as a fence, so a corrupt frame can never write outside the range it claims.
 */
#include "image_int.h"
#include "sys/sys.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>
/* for ZSTD_d_forceIgnoreChecksum: declared among the experimental names, but a parameter of the
 * stable ZSTD_DCtx_setParameter since zstd 1.4.7 */
#define ZSTD_STATIC_LINKING_ONLY
#include <zstd.h>

#define ULL(x) ((unsigned long long)(x))

struct vmsnap_image {
    uint64_t object_size;
    uint64_t total_size;
    uint64_t populated;
    uint64_t zero_elided;
    uint64_t frame_size;
    uint32_t flags;
    uint32_t n;
    int level;
    struct vmsnap_frame_info *f;
    char *name;
    /* the bytes vmsnap_image_open() read and validated: the object's first 44 and its table */
    uint8_t prefix[VMSNAP_IMAGE_PREFIX_LEN];
    uint8_t *table;
    size_t table_len;
};

static int src_read(const struct vmsnap_source *src, void *buf, size_t len, uint64_t off,
                    struct vmsnap_err *err)
{
    int rc = src->pread(src->arg, buf, len, off, err);
    if (rc < 0 && err && src->name && !strstr(err->msg, src->name))
        vmsnap_err_wrap(err, "%s: ", src->name); /* (a file's reads do not know its name) */
    return rc;
}

/* The footer, the frame header and the checksum of a seek table: *n_out is its frame count. */
static int table_footer(const uint8_t *t, size_t tsize, uint64_t toff, const char *name,
                        uint32_t *n_out, struct vmsnap_err *err)
{
    if (tsize < 8 + SEEK_HDR_LEN + 2 * SEEK_ENTRY_LEN + SEEK_FOOTER_LEN)
        return img_corrupt(err, name, "seek table at byte %llu is too short (%zu bytes)", ULL(toff),
                           tsize);
    const uint8_t *foot = t + tsize - SEEK_FOOTER_LEN;
    const uint64_t foot_off = toff + tsize - SEEK_FOOTER_LEN;
    if (memcmp(foot + 24, SEEK_FOOTER_MAGIC, 8) != 0)
        return img_corrupt(err, name, "seek table footer magic at byte %llu is damaged",
                           ULL(foot_off + 24));
    const uint32_t n = get_le32(foot + 8);
    if (get_le32(foot + 16) != SEEK_TABLE_VERSION || get_le32(foot + 20) != 0)
        return img_corrupt(err, name, "seek table version %u at byte %llu (expected %u)",
                           get_le32(foot + 16), ULL(foot_off + 16), SEEK_TABLE_VERSION);
    if (n < 2 || n > SEEK_MAX_FRAMES)
        return img_corrupt(err, name, "seek table frame count %u at byte %llu out of range", n,
                           ULL(foot_off + 8));
    if ((uint64_t)get_le32(foot + 12) != tsize ||
        (uint64_t)tsize != 8 + SEEK_HDR_LEN + (uint64_t)n * SEEK_ENTRY_LEN + SEEK_FOOTER_LEN)
        return img_corrupt(err, name, "seek table size %u at byte %llu does not match %u frames",
                           get_le32(foot + 12), ULL(foot_off + 12), n);
    if (get_le32(t) != SEEK_SKIP_MAGIC || get_le32(t + 4) != tsize - 8)
        return img_corrupt(err, name, "seek table frame header at byte %llu is damaged", ULL(toff));
    const size_t body = SEEK_HDR_LEN + (size_t)n * SEEK_ENTRY_LEN;
    if (XXH64(t + 8, body, 0) != get_le64(foot))
        return img_corrupt(err, name, "seek table checksum mismatch (table at byte %llu)",
                           ULL(toff));
    *n_out = n;
    return 0;
}

/* The table header `h` into `img`, checked against the footer's count `n` and the object. */
static int table_header(struct vmsnap_image *img, const uint8_t *h, uint32_t n, uint64_t toff,
                        uint64_t max_size, const char *name, uint64_t *frames_start,
                        struct vmsnap_err *err)
{
    img->flags = get_le32(h + 4);
    img->level = (int)get_le32(h + 60);
    img->total_size = get_le64(h + 8);
    img->populated = get_le64(h + 16);
    img->zero_elided = get_le64(h + 24);
    img->frame_size = get_le64(h + 32);
    *frames_start = get_le64(h + 40);
    const uint64_t frames_end = get_le64(h + 48);
    img->n = n;
    if (get_le32(h) != SEEK_TABLE_VERSION || get_le32(h + 56) != n)
        return img_corrupt(err, name, "seek table header at byte %llu disagrees with its footer",
                           ULL(toff));
    if ((int64_t)img->total_size < 0)
        return img_corrupt(err, name, "negative totalSize %lld", (long long)img->total_size);
    if (img->total_size > max_size) { /* a policy, not damage: the image may be fine */
        vmsnap_err_set(err, EFBIG,
                       "%s: totalSize %llu exceeds the cap of %llu bytes (--max-size; raise it "
                       "for a larger image)",
                       name, ULL(img->total_size), ULL(max_size));
        return -EBADMSG; /* (err says EFBIG; the parser has always returned -EBADMSG here) */
    }
    if (*frames_start != IMG_HEADER_LEN + 8 + INFO_CONTENT_LEN || frames_end != toff)
        return img_corrupt(err, name,
                           "seek table frame span [%llu, %llu) does not match the object",
                           ULL(*frames_start), ULL(frames_end));
    return 0;
}

/* Entry `i` (at object offset `eoff`) of a frame starting at `off`, before the frames' end `toff`;
 * `prev_end`: where the previous data frame's source range ends. */
static int table_entry(struct vmsnap_image *img, const uint8_t *e, uint32_t i, uint64_t off,
                       uint64_t toff, uint64_t eoff, uint64_t prev_end, const char *name,
                       struct vmsnap_err *err)
{
    struct vmsnap_frame_info *fi = &img->f[i];
    fi->offset = off;
    fi->csize = get_le64(e);
    fi->dsize = get_le64(e + 8);
    fi->src_start = get_le64(e + 16);
    fi->src_end = get_le64(e + 24);
    fi->populated = get_le64(e + 32);
    fi->checksum = get_le64(e + 40);
    fi->ccheck = get_le64(e + 48);
    if (fi->csize == 0 || fi->csize > toff - off)
        return img_corrupt(err, name,
                           "frame %u: compressed size %llu (entry at byte %llu) runs past the "
                           "frames' end at %llu",
                           i, ULL(fi->csize), ULL(eoff), ULL(toff));
    /* a frame no encoder could have made that large: pull allocates csize bytes for it */
    if (fi->csize > ZSTD_compressBound(fi->dsize) + 1024)
        return img_corrupt(err, name,
                           "frame %u (entry at byte %llu): compressed size %llu exceeds the bound "
                           "for %llu decoded bytes",
                           i, ULL(eoff), ULL(fi->csize), ULL(fi->dsize));
    if (i == 0 || i == img->n - 1) {
        uint64_t at = i == 0 ? 0 : img->total_size;
        if (fi->dsize != 8 || fi->src_start != at || fi->src_end != at || fi->populated)
            return img_corrupt(err, name, "frame %u (entry at byte %llu): bad %s frame", i,
                               ULL(eoff), i == 0 ? "totalSize" : "sentinel");
        return 0;
    }
    const uint64_t span = fi->src_end - fi->src_start;
    if (fi->src_start >= fi->src_end || fi->src_end > img->total_size || fi->src_start < prev_end ||
        span > VMSNAP_IMAGE_MAX_FRAME_SIZE || fi->populated > span ||
        fi->dsize < fi->populated + REC_HDR_LEN || (fi->dsize - fi->populated) % REC_HDR_LEN ||
        fi->dsize > img_max_dsize(span))
        return img_corrupt(err, name,
                           "frame %u (entry at byte %llu): inconsistent range [%llu, %llu), %llu "
                           "data bytes, %llu decoded bytes",
                           i, ULL(eoff), ULL(fi->src_start), ULL(fi->src_end), ULL(fi->populated),
                           ULL(fi->dsize));
    return 0;
}

int img_table_parse(const uint8_t *t, size_t tsize, uint64_t toff, uint64_t max_size,
                    const char *name, struct vmsnap_image **out, struct vmsnap_err *err)
{
    *out = NULL;
    uint32_t n = 0;
    int rc = table_footer(t, tsize, toff, name, &n, err);
    if (rc < 0)
        return rc;
    struct vmsnap_image *img = calloc(1, sizeof(*img));
    if (!img)
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    img->f = calloc(n, sizeof(*img->f));
    img->name = strdup(name);
    if (!img->f || !img->name) {
        rc = vmsnap_err_set(err, ENOMEM, "out of memory");
        goto fail;
    }
    img->object_size = toff + tsize;
    const uint8_t *h = t + 8;
    uint64_t frames_start = 0;
    if ((rc = table_header(img, h, n, toff, max_size, name, &frames_start, err)) < 0)
        goto fail;
    uint64_t off = frames_start, prev_end = 0, pop = 0;
    for (uint32_t i = 0; i < n; i++) {
        const uint8_t *e = h + SEEK_HDR_LEN + (size_t)i * SEEK_ENTRY_LEN;
        const uint64_t eoff = toff + 8 + SEEK_HDR_LEN + (uint64_t)i * SEEK_ENTRY_LEN;
        if ((rc = table_entry(img, e, i, off, toff, eoff, prev_end, name, err)) < 0)
            goto fail;
        off += img->f[i].csize;
        if (i > 0 && i < n - 1) {
            prev_end = img->f[i].src_end;
            pop += img->f[i].populated;
        }
    }
    if (off != toff || pop != img->populated) {
        rc = img_corrupt(err, name,
                         "seek table frames do not add up (end %llu vs %llu, data %llu vs %llu)",
                         ULL(off), ULL(toff), ULL(pop), ULL(img->populated));
        goto fail;
    }
    *out = img;
    return 0;
fail:
    vmsnap_image_free(img);
    return rc;
}

int vmsnap_image_open(const struct vmsnap_source *src, uint64_t max_size, struct vmsnap_image **out,
                      struct vmsnap_err *err)
{
    *out = NULL;
    const char *name = src->name ? src->name : "image";
    if (!max_size)
        max_size = VMSNAP_IMAGE_DEFAULT_MAX_SIZE;
    const uint64_t size = src->size;
    const uint64_t min_len = IMG_HEADER_LEN + 8 + INFO_CONTENT_LEN + 8 + SEEK_HDR_LEN +
                             2 * SEEK_ENTRY_LEN + SEEK_FOOTER_LEN;
    if (size < min_len)
        return 0;
    uint8_t head[IMG_HEADER_LEN + 8 + INFO_CONTENT_LEN];
    int rc = src_read(src, head, sizeof(head), 0, err);
    if (rc < 0)
        return rc;
    if (memcmp(head, IMG_MAGIC, IMG_MAGIC_LEN) != 0)
        return 0;
    uint8_t foot[SEEK_FOOTER_LEN];
    if ((rc = src_read(src, foot, sizeof(foot), size - SEEK_FOOTER_LEN, err)) < 0)
        return rc;
    if (memcmp(foot + 24, SEEK_FOOTER_MAGIC, 8) != 0)
        return 0; /* no table: the sequential decoder handles (and judges) the rest */

    /* From here on the object claims a seek table: any inconsistency is corruption. */
    if (get_le32(head + 8) != IMG_VERSION)
        return img_corrupt(err, name, "unsupported format version %u at byte 8 (expected 2)",
                           get_le32(head + 8));
    if (!img_info_valid(head + IMG_HEADER_LEN))
        return img_corrupt(err, name, "info frame at byte %d is missing or damaged",
                           IMG_HEADER_LEN);
    const uint32_t tsize = get_le32(foot + 12);
    if (tsize > size - IMG_HEADER_LEN || tsize < SEEK_FOOTER_LEN)
        return img_corrupt(err, name, "seek table size %u at byte %llu is larger than the object",
                           tsize, ULL(size - SEEK_FOOTER_LEN + 12));
    if ((uint64_t)tsize >
        8 + SEEK_HDR_LEN + (uint64_t)SEEK_MAX_FRAMES * SEEK_ENTRY_LEN + SEEK_FOOTER_LEN)
        return img_corrupt(err, name, "seek table size %u at byte %llu is out of range", tsize,
                           ULL(size - SEEK_FOOTER_LEN + 12));
    uint8_t *t = malloc(tsize);
    if (!t)
        return vmsnap_err_set(err, ENOMEM, "out of memory (seek table of %u bytes)", tsize);
    rc = src_read(src, t, tsize, size - tsize, err);
    if (rc >= 0)
        rc = img_table_parse(t, tsize, size - tsize, max_size, name, out, err);
    if (rc >= 0 && (*out)->frame_size != get_le64(head + IMG_HEADER_LEN + 24)) {
        vmsnap_image_free(*out);
        *out = NULL;
        rc = img_corrupt(err, name, "info frame at byte %d disagrees with the seek table",
                         IMG_HEADER_LEN);
    }
    if (rc < 0) {
        free(t);
        return rc;
    }
    _Static_assert(sizeof(head) == VMSNAP_IMAGE_PREFIX_LEN, "prefix length");
    memcpy((*out)->prefix, head, sizeof(head));
    (*out)->table = t; /* kept: what the table digest of a manifest is checked against */
    (*out)->table_len = tsize;
    return 1;
}

void vmsnap_image_free(struct vmsnap_image *img)
{
    if (!img)
        return;
    free(img->f);
    free(img->name);
    free(img->table);
    free(img);
}

void vmsnap_image_raw(const struct vmsnap_image *img, const void **prefix, size_t *prefix_len,
                      const void **table, size_t *table_len)
{
    *prefix = img->table ? img->prefix : NULL;
    *prefix_len = img->table ? sizeof(img->prefix) : 0;
    *table = img->table;
    *table_len = img->table_len;
}

void vmsnap_image_get_stats(const struct vmsnap_image *img, struct vmsnap_image_stats *st)
{
    memset(st, 0, sizeof(*st));
    st->total_size = img->total_size;
    st->populated = img->populated;
    st->level = img->level;
    st->zero_elided = img->zero_elided;
    st->frames = img->n >= 2 ? img->n - 2 : 0;
    st->frame_size = img->frame_size;
    st->object_size = img->object_size;
    st->has_seek_table = true;
    st->delta = (img->flags & SEEK_FLAG_DELTA) != 0;
}

uint32_t vmsnap_image_frame_count(const struct vmsnap_image *img)
{
    return img->n;
}

void vmsnap_image_frame(const struct vmsnap_image *img, uint32_t i, struct vmsnap_frame_info *info)
{
    *info = img->f[i];
}

/* What one decoding thread reuses across frames: the decompression context, a buffer for
 * compressed bytes read from a source, and the ring the frame is decoded into. A frame is decoded
 * with zstd's bufferless API (ZSTD_decompressContinue), block by block straight into the ring,
 * and its records are parsed and written from the ring: ZSTD_decompressStream would decode each
 * block into a buffer of its own and copy it out, one more pass over every decoded byte (6% of
 * unpack's CPU). The ring is what zstd's own streaming buffer would be (the window, two blocks and
 * zstd's margin: 1.25 MiB at the pack's level 1) plus DEC_FEED_MIN: memory per thread stays at
 * about the window plus 0.5 MiB whatever the frame size. Decoded bytes go to the checksum and the
 * parser DEC_FEED_MIN at a time, while they are still in the CPU's cache: the pwrite copying
 * them into the page cache costs less than from 2 MiB pieces (unpack -j1: 5% less CPU in
 * `perf` profiles, 128-512 KiB alike within the noise). */
#define DEC_FEED_MIN (256u << 10)   /* decoded bytes handed to the record parser at a time */
#define DEC_WINDOW_MAX (1ull << 27) /* the windows zstd's streaming decoder accepts by default */

struct vmsnap_frame_decoder {
    const char *dst_name;          /* for write errors; NULL: "destination" */
    bool overlay;                  /* vmsnap_unpack_opts.overlay */
    struct vmsnap_pagemask *under; /* vmsnap_unpack_opts.under */
    uint8_t pg[IMG_PAGE];          /* overlay: a page split between two pieces of output */
    ZSTD_DCtx *dctx;
    XXH64_state_t *xxh;
    uint8_t *ring;
    size_t ring_cap;
    uint8_t *c;
    size_t ccap;
};

int vmsnap_frame_decoder_new(struct vmsnap_frame_decoder **out, struct vmsnap_err *err)
{
    struct vmsnap_frame_decoder *d = calloc(1, sizeof(*d));
    if (d) {
        d->dctx = ZSTD_createDCtx();
        d->xxh = XXH64_createState();
    }
    if (!d || !d->dctx || !d->xxh) {
        vmsnap_frame_decoder_free(d);
        return vmsnap_err_set(err, ENOMEM, "out of memory (frame decoder)");
    }
    /* Each frame's content is checked against the seek table's XXH64 (and its bytes against the
     * table's ccheck before zstd sees them): zstd's own checksum is the low half of that same
     * hash, so zstd skips hashing every byte a second time and the frame's checksum field is
     * compared with the table's hash instead. A libzstd that refuses the parameter just checks
     * it too. */
    (void)ZSTD_DCtx_setParameter(d->dctx, ZSTD_d_forceIgnoreChecksum, ZSTD_d_ignoreChecksum);
    *out = d;
    return 0;
}

void vmsnap_frame_decoder_set_dst(struct vmsnap_frame_decoder *d, const char *dst_name)
{
    d->dst_name = dst_name;
}

void vmsnap_frame_decoder_set_overlay(struct vmsnap_frame_decoder *d, bool overlay)
{
    d->overlay = overlay;
}

void vmsnap_frame_decoder_set_under(struct vmsnap_frame_decoder *d, struct vmsnap_pagemask *under)
{
    d->under = under;
}

void vmsnap_frame_decoder_free(struct vmsnap_frame_decoder *d)
{
    if (!d)
        return;
    ZSTD_freeDCtx(d->dctx);
    XXH64_freeState(d->xxh);
    free(d->ring);
    free(d->c);
    free(d);
}

/* Hand the decoded bytes [*fed, upto) of the ring to the checksum and the record parser. */
static int ring_feed(struct vmsnap_frame_decoder *dec, struct rec_parser *rp, size_t *fed,
                     size_t upto, struct vmsnap_err *err)
{
    if (upto == *fed)
        return 0;
    XXH64_update(dec->xxh, dec->ring + *fed, upto - *fed);
    int rc = rec_feed(rp, dec->ring + *fed, upto - *fed, err);
    *fed = upto;
    return rc;
}

/* Decode frame `i` (its `fi->csize` bytes at `c`, already checked against the table) into the
 * decoder's ring, feeding the parser as it goes; *produced counts the decoded bytes. Blocks are
 * decoded where zstd's streaming decoder would put them in its own buffer: in sequence, back
 * to the ring's start when a whole block no longer fits before its end. zstd then reads the
 * older part of the window from the end of the ring (one previous segment, its "extDict"), and
 * the ring's size (ZSTD_decodingBufferSize_min: the window, two blocks and a margin) keeps that
 * part intact while the next lap is written, literals zstd parks past the block included.
 * Decoded bytes are fed before they can be overwritten: at DEC_FEED_MIN, before each wrap and
 * at the frame's end. A frame that fits is decoded whole and never wrapped. */
static int ring_decode(const struct vmsnap_image *img, uint32_t i, const uint8_t *c,
                       struct vmsnap_frame_decoder *dec, struct rec_parser *rp, uint64_t *produced,
                       struct vmsnap_err *err)
{
    const struct vmsnap_frame_info *fi = &img->f[i];
    ZSTD_frameHeader fh;
    size_t r = ZSTD_getFrameHeader(&fh, c, fi->csize);
    if (r != 0 || fh.frameType != ZSTD_frame)
        return img_corrupt(err, img->name, "frame %u at byte %llu: zstd: %s", i, ULL(fi->offset),
                           ZSTD_isError(r) ? ZSTD_getErrorName(r) : "bad frame header");
    if (fh.windowSize > DEC_WINDOW_MAX)
        return img_corrupt(err, img->name, "frame %u at byte %llu: zstd window of %llu bytes", i,
                           ULL(fi->offset), ULL(fh.windowSize));
    /* the whole frame when it fits in what zstd's own buffer would be, plus DEC_FEED_MIN */
    size_t cap = ZSTD_decodingBufferSize_min(fh.windowSize, fi->dsize);
    if (ZSTD_isError(cap))
        return img_corrupt(err, img->name, "frame %u at byte %llu: zstd: %s", i, ULL(fi->offset),
                           ZSTD_getErrorName(cap));
    if (cap < fi->dsize)
        cap = (size_t)VMSNAP_MIN((uint64_t)cap + DEC_FEED_MIN, fi->dsize);
    if (cap > dec->ring_cap) {
        free(dec->ring);
        dec->ring = malloc(cap);
        dec->ring_cap = dec->ring ? cap : 0;
        if (!dec->ring)
            return vmsnap_err_set(err, ENOMEM, "out of memory (%zu bytes decoding frame %u)", cap,
                                  i);
    }
    if (ZSTD_isError(r = ZSTD_decompressBegin(dec->dctx)))
        return vmsnap_err_set(err, EIO, "zstd: %s", ZSTD_getErrorName(r));
    XXH64_reset(dec->xxh, 0);
    const size_t block = fh.blockSizeMax;
    const bool ring = cap < fi->dsize; /* else the frame is decoded whole, never wrapped */
    size_t in = 0, pos = 0, fed = 0;
    int rc = 0;
    for (size_t need; rc == 0 && (need = ZSTD_nextSrcSizeToDecompress(dec->dctx)) != 0;) {
        if (need > fi->csize - in)
            return img_corrupt(err, img->name, "frame %u at byte %llu: truncated zstd frame", i,
                               ULL(fi->offset));
        if (ring && cap - pos < block) { /* wrap: what the ring holds goes out first */
            if ((rc = ring_feed(dec, rp, &fed, pos, err)) < 0)
                break;
            pos = fed = 0;
        }
        size_t got = ZSTD_decompressContinue(dec->dctx, dec->ring + pos, cap - pos, c + in, need);
        if (ZSTD_isError(got))
            return img_corrupt(err, img->name, "frame %u at byte %llu: zstd: %s", i,
                               ULL(fi->offset), ZSTD_getErrorName(got));
        in += need;
        pos += got;
        *produced += got;
        if (*produced > fi->dsize)
            return img_corrupt(err, img->name,
                               "frame %u at byte %llu decodes to more than %llu bytes", i,
                               ULL(fi->offset), ULL(fi->dsize));
        if (pos - fed >= DEC_FEED_MIN)
            rc = ring_feed(dec, rp, &fed, pos, err);
    }
    if (rc == 0)
        rc = ring_feed(dec, rp, &fed, pos, err);
    if (rc == 0 && in != fi->csize)
        return img_corrupt(err, img->name,
                           "frame %u at byte %llu: %llu bytes after the end of its zstd frame", i,
                           ULL(fi->offset), ULL(fi->csize - in));
    return rc;
}

int vmsnap_image_decode_frame_mem(const struct vmsnap_image *img, uint32_t i, const void *frame,
                                  size_t len, int dst_fd, struct vmsnap_frame_decoder *dec,
                                  uint64_t *extents, struct vmsnap_err *err)
{
    if (i >= img->n)
        return vmsnap_err_set(err, EINVAL, "%s: no frame %u (image has %u)", img->name, i, img->n);
    const struct vmsnap_frame_info *fi = &img->f[i];
    const uint8_t *c = frame;
    if (len != fi->csize)
        return vmsnap_err_set(err, EINVAL, "%s: frame %u is %llu bytes, %zu given", img->name, i,
                              ULL(fi->csize), len);
    if (XXH64(c, fi->csize, 0) != fi->ccheck)
        return img_corrupt(err, img->name,
                           "frame %u at byte %llu: compressed bytes checksum mismatch", i,
                           ULL(fi->offset));
    unsigned long long fcs = ZSTD_getFrameContentSize(c, fi->csize);
    size_t fsz = ZSTD_findFrameCompressedSize(c, fi->csize);
    if (fcs != fi->dsize || ZSTD_isError(fsz) || fsz != fi->csize)
        return img_corrupt(err, img->name,
                           "frame %u at byte %llu: zstd frame header disagrees with the seek table "
                           "(content size %llu vs %llu)",
                           i, ULL(fi->offset), fcs, ULL(fi->dsize));

    struct rec_parser rp;
    const bool header = i == 0, trailer = i == img->n - 1;
    rec_init(&rp, header ? REC_TOTAL : REC_OFF, dst_fd, img->name, img->total_size);
    rp.table_total = true;
    rp.dst_name = dec->dst_name;
    rp.overlay = dec->overlay;
    rp.under = dec->under;
    rp.pg = dec->pg;
    snprintf(rp.where, sizeof(rp.where), "frame %u at byte %llu", i, ULL(fi->offset));
    rp.total = img->total_size;
    rp.have_total = true;
    rp.allow_sentinel = trailer;
    rp.lo = fi->src_start;
    rp.hi = fi->src_end;

    uint64_t produced = 0;
    int rc = ring_decode(img, i, c, dec, &rp, &produced, err);
    if (rc < 0)
        return rc;
    if (produced != fi->dsize)
        return img_corrupt(err, img->name,
                           "frame %u at byte %llu: decoded %llu bytes (table: %llu)", i,
                           ULL(fi->offset), ULL(produced), ULL(fi->dsize));
    if (XXH64_digest(dec->xxh) != fi->checksum)
        return img_corrupt(err, img->name, "frame %u at byte %llu: checksum mismatch", i,
                           ULL(fi->offset));
    /* zstd's own checksum field (skipped by zstd above) must be the same hash's low half, as
     * every zstd reader (and the sequential decoder) checks it */
    if ((c[4] & 0x04) && (fi->csize < 4 || get_le32(c + fi->csize - 4) != (uint32_t)fi->checksum))
        return img_corrupt(err, img->name, "frame %u at byte %llu: zstd checksum mismatch", i,
                           ULL(fi->offset));
    if (header && rp.total != img->total_size)
        return img_corrupt(err, img->name,
                           "totalSize %llu in frame 0 disagrees with the seek table (%llu)",
                           ULL(rp.total), ULL(img->total_size));
    if (!rec_at_boundary(&rp) || (trailer && rp.state != REC_DONE) ||
        (!header && !trailer && rp.populated != fi->populated))
        return img_corrupt(err, img->name,
                           "frame %u at byte %llu ends inside a record or holds %llu data bytes "
                           "(table: %llu)",
                           i, ULL(fi->offset), ULL(rp.populated), ULL(fi->populated));
    if (extents)
        *extents += rp.extents;
    return 0;
}

/* Read frame i from `src` into the decoder's buffer, then decode it. */
static int decode_frame(const struct vmsnap_image *img, uint32_t i, const struct vmsnap_source *src,
                        uint64_t base, int dst_fd, struct vmsnap_frame_decoder *dec,
                        uint64_t *extents, struct vmsnap_err *err)
{
    if (i >= img->n)
        return vmsnap_err_set(err, EINVAL, "%s: no frame %u (image has %u)", img->name, i, img->n);
    const struct vmsnap_frame_info *fi = &img->f[i];
    if (fi->offset < base)
        return vmsnap_err_set(err, EINVAL, "%s: frame %u lies before the buffer", img->name, i);
    if (fi->csize > dec->ccap) {
        free(dec->c);
        dec->c = malloc(fi->csize);
        dec->ccap = dec->c ? fi->csize : 0;
        if (!dec->c)
            return vmsnap_err_set(err, ENOMEM, "out of memory reading frame %u", i);
    }
    int rc = src_read(src, dec->c, fi->csize, fi->offset - base, err);
    if (rc < 0)
        return rc;
    return vmsnap_image_decode_frame_mem(img, i, dec->c, fi->csize, dst_fd, dec, extents, err);
}

int vmsnap_image_decode_frame(const struct vmsnap_image *img, uint32_t i,
                              const struct vmsnap_source *src, uint64_t base, int dst_fd,
                              uint64_t *extents, struct vmsnap_err *err)
{
    struct vmsnap_frame_decoder *dec = NULL;
    int rc = vmsnap_frame_decoder_new(&dec, err);
    if (rc == 0)
        rc = decode_frame(img, i, src, base, dst_fd, dec, extents, err);
    vmsnap_frame_decoder_free(dec);
    return rc;
}

int vmsnap_image_decode_frame_dec(const struct vmsnap_image *img, uint32_t i,
                                  const struct vmsnap_source *src, uint64_t base, int dst_fd,
                                  struct vmsnap_frame_decoder *dec, uint64_t *extents,
                                  struct vmsnap_err *err)
{
    return decode_frame(img, i, src, base, dst_fd, dec, extents, err);
}

struct pdec {
    const struct vmsnap_image *img;
    const struct vmsnap_source *src;
    const uint8_t *map; /* the source file mapped whole (see map_source), or NULL */
    int fd;
    pthread_mutex_t mu;
    uint32_t next;
    bool failed;
    int rc;
    struct vmsnap_err err;
    uint64_t extents;
    uint64_t done_bytes;
    const struct vmsnap_unpack_opts *opts;
};

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22 /* Linux 5.14 */
#endif

/* A source that is a file (vmsnap_source_fd) is mapped whole, and each frame is decoded from the
 * mapping: reading it with pread copied every compressed byte from the page cache into the
 * decoder's buffer, which cost more CPU than the faults of a mapping (a 206 MiB object on tmpfs:
 * 0.20 s for pread and a hash over the bytes, 0.08 s for the same from a mapping). NULL when the
 * source is not a file, or cannot be mapped: frames are then read. */
static const uint8_t *map_source(const struct vmsnap_image *img, const struct vmsnap_source *src)
{
    const int fd = img_source_fd(src);
    if (fd < 0 || img->object_size != src->size || src->size == 0 || src->size > SIZE_MAX)
        return NULL;
    void *m = mmap(NULL, (size_t)src->size, PROT_READ, MAP_SHARED, fd, 0);
    return m == MAP_FAILED ? NULL : m;
}

/* Frame i from the mapping: its pages faulted in first with MADV_POPULATE_READ, which fails
 * (EFAULT) where the file no longer has them, so that a file truncated under the decoder is an
 * error and not a SIGBUS. When that fails (or the kernel has no MADV_POPULATE_READ), the frame
 * is read with pread instead, whose error names what happened. */
static int decode_mapped(const struct pdec *p, uint32_t i, struct vmsnap_frame_decoder *dec,
                         uint64_t *extents, struct vmsnap_err *err)
{
    const struct vmsnap_frame_info *fi = &p->img->f[i];
    const uint64_t a = fi->offset / IMG_PAGE * IMG_PAGE;
    void *pages = (void *)(uintptr_t)(p->map + a);
    const size_t len = (size_t)(fi->offset + fi->csize - a);
    if (madvise(pages, len, MADV_POPULATE_READ) < 0)
        return decode_frame(p->img, i, p->src, 0, p->fd, dec, extents, err);
    int rc = vmsnap_image_decode_frame_mem(p->img, i, p->map + fi->offset, (size_t)fi->csize, p->fd,
                                           dec, extents, err);
    /* unmapped from this process again (the page cache keeps them; a page shared with the next
     * frame is faulted in again by whoever decodes it): the process maps only frames in flight */
    (void)madvise(pages, len, MADV_DONTNEED);
    return rc;
}

static void *pdec_main(void *arg)
{
    struct pdec *p = arg;
    struct vmsnap_err err = {0};
    struct vmsnap_frame_decoder *dec = NULL;
    if (vmsnap_frame_decoder_new(&dec, &err) < 0) {
        pthread_mutex_lock(&p->mu);
        if (!p->failed) {
            p->failed = true;
            p->rc = -ENOMEM;
            p->err = err;
        }
        pthread_mutex_unlock(&p->mu);
        return NULL;
    }
    vmsnap_frame_decoder_set_dst(dec, p->opts ? p->opts->dst_name : NULL);
    vmsnap_frame_decoder_set_overlay(dec, p->opts && p->opts->overlay);
    vmsnap_frame_decoder_set_under(dec, p->opts ? p->opts->under : NULL);
    for (;;) {
        pthread_mutex_lock(&p->mu);
        if (p->failed || p->next >= p->img->n) {
            pthread_mutex_unlock(&p->mu);
            break;
        }
        uint32_t i = p->next++;
        pthread_mutex_unlock(&p->mu);
        uint64_t ext = 0;
        int rc = cancel_check(&err);
        const bool data = i > 0 && i + 1 < p->img->n; /* header and sentinel always */
        const bool skip =
            data && p->opts->want_frame && !p->opts->want_frame(p->opts->want_arg, &p->img->f[i]);
        if (rc == 0 && !skip)
            rc = p->map ? decode_mapped(p, i, dec, &ext, &err)
                        : decode_frame(p->img, i, p->src, 0, p->fd, dec, &ext, &err);
        pthread_mutex_lock(&p->mu);
        if (rc < 0 && !p->failed) {
            p->failed = true;
            p->rc = rc;
            p->err = err;
        }
        p->extents += ext;
        p->done_bytes += p->img->f[i].csize;
        if (!p->failed && p->opts->progress)
            p->opts->progress(p->opts->progress_arg, p->done_bytes, p->img->object_size);
        pthread_mutex_unlock(&p->mu);
    }
    vmsnap_frame_decoder_free(dec);
    return NULL;
}

int vmsnap_image_decode_parallel(const struct vmsnap_image *img, const struct vmsnap_source *src,
                                 int dst_fd, const struct vmsnap_unpack_opts *opts,
                                 struct vmsnap_image_stats *stats, struct vmsnap_err *err)
{
    static const struct vmsnap_unpack_opts defaults;
    if (!opts)
        opts = &defaults;
    if (dst_fd >= 0 && !opts->under && ftruncate(dst_fd, (off_t)img->total_size) < 0)
        return err_sys(err, "%s: set its size to %llu (the image's logical size)",
                       opts->dst_name ? opts->dst_name : "destination", ULL(img->total_size));
    unsigned threads = opts->threads ? opts->threads : sys_cpus();
    if (threads > 256)
        threads = 256;
    if (threads > img->n)
        threads = img->n;
    struct pdec p = {
        .img = img, .src = src, .map = map_source(img, src), .fd = dst_fd, .opts = opts};
    pthread_mutex_init(&p.mu, NULL);
    pthread_t *tids = calloc(threads, sizeof(*tids));
    unsigned started = 0;
    if (tids) {
        for (; started < threads; started++)
            if (thread_start(&tids[started], pdec_main, &p) != 0)
                break;
    }
    if (started == 0)
        pdec_main(&p); /* no threads to be had: decode on this one */
    for (unsigned i = 0; i < started; i++)
        pthread_join(tids[i], NULL);
    free(tids);
    pthread_mutex_destroy(&p.mu);
    if (p.map)
        munmap((void *)(uintptr_t)p.map, (size_t)src->size);
    if (p.failed) {
        if (err)
            *err = p.err;
        return p.rc;
    }
    if (stats) {
        vmsnap_image_get_stats(img, stats);
        stats->extents = p.extents;
    }
    return 0;
}
