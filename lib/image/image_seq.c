/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The sequential decoder: for stdin, streaming GETs and objects without a seek table.
 *
 * It is push-driven (the caller feeds bytes) and tracks zstd frame boundaries itself, so that
 * vmsnap's skippable frames are not just skipped but checked: the info frame after the header
 * announces a seek table, and a seek table met in the stream is validated against the frames
 * actually decoded (sizes, XXH64s, records inside each frame's source range, data bytes). An object
 * that announced a table and ends without one was truncated. Objects without the "ATESPRSE" magic
 * are plain zstd of a whole file; their output is written in 64 KiB blocks, all-zero blocks left as
 * holes.
 */
#include "image_int.h"
#include "sys/sys.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>
#include <zstd.h>

#define ULL(x) ((unsigned long long)(x))
#define PLAIN_BLOCK (64u << 10)
#define OUT_CAP (1u << 20)

enum mode { M_HEAD, M_SPARSE, M_PLAIN };
enum fstate { F_MAGIC, F_ZSTD, F_SKIPHDR, F_SKIP, F_CAPTURE, F_END };

struct seen_frame {
    uint64_t csize, dsize, xxh, cxxh;
    uint64_t populated;        /* data bytes of the records in it */
    uint64_t span_lo, span_hi; /* its extents' lowest start and highest end (lo > hi: none) */
    bool boundary;             /* it ended between records */
    bool sentinel;             /* the end-of-extents sentinel was in it */
};

struct vmsnap_seqdec {
    int fd;
    const char *dst_name; /* for write errors; NULL: "destination" */
    bool overlay;         /* vmsnap_unpack_opts.overlay */
    uint8_t *pg;          /* overlay: a page split between two pieces of output */
    uint64_t max_size;
    char *name;
    enum mode mode;
    uint8_t head[IMG_HEADER_LEN];
    unsigned head_fill;
    uint64_t in_off; /* object bytes consumed */
    ZSTD_DCtx *dctx;
    uint8_t *out;

    /* sparse mode */
    enum fstate fs;
    uint8_t fhdr[8];
    unsigned fhdr_fill;
    uint64_t frame_start;
    uint32_t skip_magic;
    uint64_t skip_left;
    uint8_t *cap_buf;
    size_t cap_len, cap_size;
    bool expect_table, table_seen, any_frame;
    uint64_t info_frame_size;
    struct vmsnap_image_stats table_st; /* the seek table's whole-image fields, once seen */
    XXH64_state_t *xxh;                 /* of the current frame's decoded content */
    XXH64_state_t *cxxh;                /* of the current frame's compressed bytes */
    uint64_t frame_dsize;
    uint64_t frame_pop0; /* rp.populated when the current frame began */
    enum rec_state state_before_frame;
    struct seen_frame *seen;
    size_t n_seen, seen_cap;
    struct rec_parser rp;

    /* plain mode */
    uint8_t *blk;
    size_t blk_fill;
    uint64_t plain_pos;
    uint64_t plain_data;   /* bytes in blocks that are not all zero (written) */
    uint64_t plain_frames; /* zstd frames ended that held data */
    bool plain_frame_data; /* the current frame gave data */
    bool plain_open;
};

int vmsnap_seqdec_new(int dst_fd, uint64_t max_size, const char *src_name,
                      struct vmsnap_seqdec **out, struct vmsnap_err *err)
{
    struct vmsnap_seqdec *sd = calloc(1, sizeof(*sd));
    if (!sd)
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    sd->fd = dst_fd;
    sd->max_size = max_size ? max_size : VMSNAP_IMAGE_DEFAULT_MAX_SIZE;
    sd->name = strdup(src_name ? src_name : "stream");
    sd->dctx = ZSTD_createDCtx();
    sd->out = malloc(OUT_CAP);
    sd->xxh = XXH64_createState();
    sd->cxxh = XXH64_createState();
    sd->pg = malloc(IMG_PAGE);
    if (!sd->name || !sd->dctx || !sd->out || !sd->xxh || !sd->cxxh || !sd->pg) {
        vmsnap_seqdec_free(sd);
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    }
    *out = sd;
    return 0;
}

void vmsnap_seqdec_set_dst(struct vmsnap_seqdec *sd, const char *dst_name)
{
    sd->dst_name = dst_name;
}

void vmsnap_seqdec_set_overlay(struct vmsnap_seqdec *sd, bool overlay)
{
    sd->overlay = overlay;
}

void vmsnap_seqdec_free(struct vmsnap_seqdec *sd)
{
    if (!sd)
        return;
    free(sd->pg);
    ZSTD_freeDCtx(sd->dctx);
    XXH64_freeState(sd->xxh);
    XXH64_freeState(sd->cxxh);
    free(sd->out);
    free(sd->cap_buf);
    free(sd->seen);
    free(sd->blk);
    free(sd->name);
    free(sd);
}

/* ---- plain zstd ---- */

static int plain_flush(struct vmsnap_seqdec *sd, struct vmsnap_err *err)
{
    bool zero = true;
    for (size_t i = 0; i < sd->blk_fill && zero; i++)
        zero = sd->blk[i] == 0;
    if (!zero)
        sd->plain_data += sd->blk_fill;
    if (!zero && sd->fd >= 0) {
        int rc = sys_pwrite_full(sd->fd, sd->blk, sd->blk_fill, sd->plain_pos);
        if (rc < 0)
            return err_code(err, -rc, "%s: write at offset %llu",
                            sd->dst_name ? sd->dst_name : "destination", ULL(sd->plain_pos));
    } else if (zero && sd->overlay && sd->fd >= 0 && sd->blk_fill) {
        /* over what the destination held: the hole made (the last block's page whole: the file
         * ends there) */
        int rc = img_punch(sd->fd, sd->plain_pos, sd->blk_fill,
                           (sd->blk_fill + IMG_PAGE - 1) / IMG_PAGE * IMG_PAGE,
                           sd->dst_name ? sd->dst_name : "destination", err);
        if (rc < 0)
            return rc;
    }
    sd->plain_pos += sd->blk_fill;
    sd->blk_fill = 0;
    if (sd->plain_pos > sd->max_size) /* a policy, not damage */
        return vmsnap_err_set(err, EFBIG,
                              "%s: decoded size passes the cap of %llu bytes (--max-size; raise "
                              "it for a larger image)",
                              sd->name, ULL(sd->max_size));
    return 0;
}

static int plain_feed(struct vmsnap_seqdec *sd, const uint8_t *buf, size_t len,
                      struct vmsnap_err *err)
{
    ZSTD_inBuffer in = {buf, len, 0};
    for (;;) {
        ZSTD_outBuffer out = {sd->blk, PLAIN_BLOCK, sd->blk_fill};
        size_t ret = ZSTD_decompressStream(sd->dctx, &out, &in);
        if (ZSTD_isError(ret))
            return img_corrupt(err, sd->name, "zstd: %s (near byte %llu)", ZSTD_getErrorName(ret),
                               ULL(sd->in_off + in.pos));
        /* a frame ended (each call after one starts the next); skippable frames, which zstd
         * also ends with 0, and empty ones are not counted: frames holding data */
        if (out.pos > sd->blk_fill)
            sd->plain_frame_data = true;
        sd->blk_fill = out.pos;
        if (ret == 0 && sd->plain_frame_data) {
            sd->plain_frames++;
            sd->plain_frame_data = false;
        }
        sd->plain_open = ret != 0;
        bool full = sd->blk_fill == PLAIN_BLOCK;
        if (full) {
            int rc = plain_flush(sd, err);
            if (rc < 0)
                return rc;
        }
        /* done with this input once it is consumed and zstd has nothing more to give: the frame
         * ended (called again, zstd would start reading the next frame's header and report a
         * frame open), or the block had room left */
        if (in.pos == in.size && (ret == 0 || !full))
            break;
    }
    sd->in_off += len;
    return 0;
}

/* ---- sparse-extent streams ---- */

static int add_seen(struct vmsnap_seqdec *sd, struct vmsnap_err *err)
{
    if (sd->n_seen == SEEK_MAX_FRAMES)
        return img_corrupt(err, sd->name, "more than %u frames", SEEK_MAX_FRAMES);
    if (grow_array(&sd->seen, &sd->seen_cap, sd->n_seen + 1, sizeof(*sd->seen), 64) < 0)
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    sd->seen[sd->n_seen++] = (struct seen_frame){.csize = sd->in_off - sd->frame_start,
                                                 .dsize = sd->frame_dsize,
                                                 .xxh = XXH64_digest(sd->xxh),
                                                 .cxxh = XXH64_digest(sd->cxxh),
                                                 .populated = sd->rp.populated - sd->frame_pop0,
                                                 .span_lo = sd->rp.span_lo,
                                                 .span_hi = sd->rp.span_hi,
                                                 .boundary = rec_at_boundary(&sd->rp),
                                                 .sentinel = sd->rp.state == REC_DONE &&
                                                             sd->state_before_frame != REC_DONE};
    return 0;
}

/* Decode zstd input of the current frame; returns bytes consumed, stops at the frame's end. */
static int zstd_part(struct vmsnap_seqdec *sd, const uint8_t *buf, size_t len, size_t *used,
                     struct vmsnap_err *err)
{
    ZSTD_inBuffer in = {buf, len, 0};
    for (;;) {
        ZSTD_outBuffer out = {sd->out, OUT_CAP, 0};
        size_t ret = ZSTD_decompressStream(sd->dctx, &out, &in);
        if (ZSTD_isError(ret))
            return img_corrupt(err, sd->name, "zstd frame at byte %llu: %s (near byte %llu)",
                               ULL(sd->frame_start), ZSTD_getErrorName(ret),
                               ULL(sd->in_off + in.pos));
        if (out.pos) {
            XXH64_update(sd->xxh, sd->out, out.pos);
            sd->frame_dsize += out.pos;
            snprintf(sd->rp.where, sizeof(sd->rp.where), "zstd frame at byte %llu",
                     ULL(sd->frame_start));
            int rc = rec_feed(&sd->rp, sd->out, out.pos, err);
            if (rc < 0)
                return rc;
        }
        if (ret == 0) { /* frame complete and flushed */
            XXH64_update(sd->cxxh, buf, in.pos);
            sd->in_off += in.pos;
            *used = in.pos;
            int rc = add_seen(sd, err);
            sd->fs = F_MAGIC;
            return rc;
        }
        if (in.pos == in.size && out.pos < out.size)
            break;
    }
    XXH64_update(sd->cxxh, buf, in.pos);
    sd->in_off += in.pos;
    *used = in.pos;
    return 0;
}

static int check_table(struct vmsnap_seqdec *sd, struct vmsnap_err *err)
{
    struct vmsnap_image *img = NULL;
    int rc = img_table_parse(sd->cap_buf, sd->cap_len, sd->frame_start, sd->max_size, sd->name,
                             &img, err);
    if (rc < 0)
        return rc;
    struct vmsnap_image_stats st;
    vmsnap_image_get_stats(img, &st);
    sd->table_st = st;
    uint32_t n = vmsnap_image_frame_count(img);
    if (n != sd->n_seen || st.total_size != sd->rp.total || st.populated != sd->rp.populated ||
        st.frame_size != sd->info_frame_size) {
        rc = img_corrupt(
            err, sd->name,
            "seek table at byte %llu disagrees with the stream (%u vs %zu frames, size %llu "
            "vs %llu, data %llu vs %llu)",
            ULL(sd->frame_start), n, sd->n_seen, ULL(st.total_size), ULL(sd->rp.total),
            ULL(st.populated), ULL(sd->rp.populated));
    }
    for (uint32_t i = 0; rc == 0 && i < n; i++) {
        struct vmsnap_frame_info fi;
        vmsnap_image_frame(img, i, &fi);
        const struct seen_frame *f = &sd->seen[i];
        const bool trailer = i == n - 1, middle = i > 0 && !trailer;
        if (fi.csize != f->csize || fi.dsize != f->dsize || fi.checksum != f->xxh ||
            fi.ccheck != f->cxxh)
            rc = img_corrupt(err, sd->name,
                             "frame %u at byte %llu does not match its seek table entry", i,
                             ULL(fi.offset));
        /* what the file decoder checks frame by frame (image_dec.c), checked here once the
         * table is known: records whole in their frame, inside its source range, the data
         * bytes the table gives it, the sentinel in the last frame only */
        else if (!f->boundary)
            rc = img_corrupt(err, sd->name, "frame %u at byte %llu ends inside a record", i,
                             ULL(fi.offset));
        else if (f->sentinel != trailer)
            rc = img_corrupt(err, sd->name,
                             "frame %u at byte %llu %s the end-of-extents sentinel (the seek "
                             "table's last frame is %u)",
                             i, ULL(fi.offset), f->sentinel ? "holds" : "lacks", n - 1);
        else if (middle && f->populated != fi.populated)
            rc = img_corrupt(err, sd->name,
                             "frame %u at byte %llu holds %llu data bytes (seek table: %llu)", i,
                             ULL(fi.offset), ULL(f->populated), ULL(fi.populated));
        else if (f->span_lo <= f->span_hi && (f->span_lo < fi.src_start || f->span_hi > fi.src_end))
            rc = img_corrupt(err, sd->name,
                             "frame %u at byte %llu holds extents from %llu to %llu, outside its "
                             "source range [%llu, %llu) in the seek table",
                             i, ULL(fi.offset), ULL(f->span_lo), ULL(f->span_hi), ULL(fi.src_start),
                             ULL(fi.src_end));
    }
    vmsnap_image_free(img);
    sd->table_seen = true;
    return rc;
}

/* A skippable frame read whole: vmsnap's info frame, its seek table, or someone else's.
 * vmsnap's are told by their content (the info frame's "VMSNINFO" first, the table's footer
 * "VMSNSEEK" last) or, for the table, by its place (a seek-table magic in an object with an info
 * frame): a damaged one of them is an error, as the file decoder finds it; any other is skipped,
 * as the reference reader skips every one (0x184D2A5E is also zstd's seekable format's magic).
 * An info frame's magic and size right after the header without the signature is another
 * writer's frame (it was refused as a damaged info frame): skipped; an object of vmsnap's whose
 * signature was damaged still has its seek table, which is then refused as without an info
 * frame. */
static int end_capture(struct vmsnap_seqdec *sd, struct vmsnap_err *err)
{
    const bool info_sig = sd->cap_len >= 8 && !memcmp(sd->cap_buf, INFO_MAGIC, 8);
    const bool seek_sig =
        sd->cap_len >= 8 && !memcmp(sd->cap_buf + sd->cap_len - 8, SEEK_FOOTER_MAGIC, 8);
    if (info_sig) {
        uint8_t whole[8 + INFO_CONTENT_LEN];
        put_le32(whole, sd->skip_magic);
        put_le32(whole + 4, (uint32_t)sd->cap_len);
        memcpy(whole + 8, sd->cap_buf, VMSNAP_MIN(sd->cap_len, (size_t)INFO_CONTENT_LEN));
        if (sd->frame_start != IMG_HEADER_LEN || sd->cap_len != INFO_CONTENT_LEN ||
            !img_info_valid(whole))
            return img_corrupt(err, sd->name, "damaged info frame at byte %llu",
                               ULL(sd->frame_start));
        sd->expect_table = true;
        sd->info_frame_size = get_le64(sd->cap_buf + 16);
        sd->fs = F_MAGIC;
        return 0;
    }
    if (!seek_sig && !(sd->skip_magic == SEEK_SKIP_MAGIC && sd->expect_table)) {
        sd->fs = F_MAGIC; /* someone else's: skipped */
        return 0;
    }
    if (!sd->expect_table || sd->skip_magic != SEEK_SKIP_MAGIC)
        return img_corrupt(err, sd->name, "seek table at byte %llu %s", ULL(sd->frame_start),
                           sd->expect_table
                               ? "under another frame magic"
                               : "in an object whose info frame is missing or damaged");
    /* The seek table: it must come after the sentinel and end the object. */
    if (sd->rp.state != REC_DONE)
        return img_corrupt(err, sd->name,
                           "seek table at byte %llu before the end-of-extents sentinel",
                           ULL(sd->frame_start));
    uint8_t *full = malloc(sd->cap_len + 8);
    if (!full)
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    put_le32(full, SEEK_SKIP_MAGIC);
    put_le32(full + 4, (uint32_t)sd->cap_len);
    memcpy(full + 8, sd->cap_buf, sd->cap_len);
    free(sd->cap_buf);
    sd->cap_buf = full;
    sd->cap_len += 8;
    int rc = check_table(sd, err);
    sd->fs = F_END;
    return rc;
}

static int sparse_feed(struct vmsnap_seqdec *sd, const uint8_t *buf, size_t len,
                       struct vmsnap_err *err)
{
    while (len > 0) {
        size_t n;
        int rc;
        switch (sd->fs) {
        case F_END:
            return img_corrupt(err, sd->name, "%zu bytes after the seek table at byte %llu", len,
                               ULL(sd->in_off));
        case F_MAGIC:
        case F_SKIPHDR: {
            unsigned want = sd->fs == F_MAGIC ? 4 : 8;
            n = VMSNAP_MIN(len, (size_t)(want - sd->fhdr_fill));
            memcpy(sd->fhdr + sd->fhdr_fill, buf, n);
            sd->fhdr_fill += (unsigned)n;
            sd->in_off += n;
            buf += n;
            len -= n;
            if (sd->fhdr_fill < want)
                break;
            if (sd->fs == F_MAGIC) {
                sd->frame_start = sd->in_off - 4;
                uint32_t m = get_le32(sd->fhdr);
                if (m == ZSTD_FRAME_MAGIC) {
                    sd->fs = F_ZSTD;
                    sd->fhdr_fill = 0;
                    sd->frame_dsize = 0;
                    sd->frame_pop0 = sd->rp.populated;
                    sd->state_before_frame = sd->rp.state;
                    sd->rp.span_lo = UINT64_MAX;
                    sd->rp.span_hi = 0;
                    sd->any_frame = true;
                    XXH64_reset(sd->xxh, 0);
                    XXH64_reset(sd->cxxh, 0);
                    /* hand the magic to zstd; the byte count was already taken */
                    sd->in_off -= 4;
                    size_t used;
                    rc = zstd_part(sd, sd->fhdr, 4, &used, err);
                    if (rc < 0)
                        return rc;
                } else if ((m & ZSTD_SKIP_MAGIC_MASK) == ZSTD_SKIP_MAGIC_MIN) {
                    sd->fs = F_SKIPHDR;
                } else {
                    return img_corrupt(err, sd->name, "unknown frame magic 0x%08x at byte %llu", m,
                                       ULL(sd->frame_start));
                }
                break;
            }
            sd->skip_magic = get_le32(sd->fhdr);
            sd->skip_left = get_le32(sd->fhdr + 4);
            sd->fhdr_fill = 0;
            /* A skippable frame that can be vmsnap's own is read whole and told by its content
             * (end_capture); a larger one is skipped, as the reference reader skips every one,
             * unless it stands where the seek table of an object with an info frame must. */
            uint64_t lim =
                8 + SEEK_HDR_LEN + (uint64_t)SEEK_MAX_FRAMES * SEEK_ENTRY_LEN + SEEK_FOOTER_LEN;
            if (sd->skip_left > lim && sd->skip_magic == SEEK_SKIP_MAGIC && sd->expect_table)
                return img_corrupt(err, sd->name,
                                   "vmsnap skippable frame at byte %llu too large (%llu)",
                                   ULL(sd->frame_start), ULL(sd->skip_left));
            if (sd->skip_left <= lim) {
                free(sd->cap_buf);
                sd->cap_buf = malloc(sd->skip_left ? sd->skip_left : 1);
                if (!sd->cap_buf)
                    return vmsnap_err_set(err, ENOMEM, "out of memory");
                sd->cap_len = 0;
                sd->cap_size = sd->skip_left;
                sd->fs = F_CAPTURE;
                if (sd->skip_left == 0 && (rc = end_capture(sd, err)) < 0)
                    return rc;
            } else {
                sd->fs = sd->skip_left ? F_SKIP : F_MAGIC;
            }
            break;
        }
        case F_SKIP:
            n = (size_t)VMSNAP_MIN((uint64_t)len, sd->skip_left);
            sd->skip_left -= n;
            sd->in_off += n;
            buf += n;
            len -= n;
            if (!sd->skip_left)
                sd->fs = F_MAGIC;
            break;
        case F_CAPTURE:
            n = (size_t)VMSNAP_MIN((uint64_t)len, sd->cap_size - sd->cap_len);
            memcpy(sd->cap_buf + sd->cap_len, buf, n);
            sd->cap_len += n;
            sd->in_off += n;
            buf += n;
            len -= n;
            if (sd->cap_len == sd->cap_size && (rc = end_capture(sd, err)) < 0)
                return rc;
            break;
        case F_ZSTD:
            rc = zstd_part(sd, buf, len, &n, err);
            if (rc < 0)
                return rc;
            buf += n;
            len -= n;
            break;
        }
    }
    return 0;
}

static int start_mode(struct vmsnap_seqdec *sd, struct vmsnap_err *err)
{
    if (memcmp(sd->head, IMG_MAGIC, IMG_MAGIC_LEN) == 0) {
        uint32_t v = get_le32(sd->head + 8);
        if (v != IMG_VERSION)
            return img_corrupt(err, sd->name,
                               "unsupported sparse-extent format version %u at byte 8 (this "
                               "reader supports version 2)",
                               v);
        sd->mode = M_SPARSE;
        sd->in_off = IMG_HEADER_LEN;
        sd->fs = F_MAGIC;
        rec_init(&sd->rp, REC_TOTAL, sd->fd, sd->name, sd->max_size);
        sd->rp.dst_name = sd->dst_name;
        sd->rp.overlay = sd->overlay;
        sd->rp.pg = sd->pg;
        sd->rp.truncate_on_total = true;
        sd->rp.allow_sentinel = true;
        return 0;
    }
    sd->mode = M_PLAIN;
    sd->blk = malloc(PLAIN_BLOCK);
    if (!sd->blk)
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    unsigned n = sd->head_fill;
    sd->head_fill = 0;
    return plain_feed(sd, sd->head, n, err);
}

static bool is_zstd_magic(const uint8_t *p)
{
    uint32_t m = get_le32(p);
    return m == ZSTD_FRAME_MAGIC || (m & ZSTD_SKIP_MAGIC_MASK) == ZSTD_SKIP_MAGIC_MIN;
}

int vmsnap_seqdec_feed(struct vmsnap_seqdec *sd, const void *data, size_t len,
                       struct vmsnap_err *err)
{
    const uint8_t *buf = data;
    int crc = cancel_check(err);
    if (crc < 0)
        return crc;
    if (sd->mode == M_HEAD) {
        size_t n = VMSNAP_MIN(len, (size_t)(IMG_HEADER_LEN - sd->head_fill));
        memcpy(sd->head + sd->head_fill, buf, n);
        sd->head_fill += (unsigned)n;
        buf += n;
        len -= n;
        if (sd->head_fill >= 4 && is_zstd_magic(sd->head)) {
            int rc = start_mode(sd, err);
            if (rc < 0)
                return rc;
        } else if (sd->head_fill >= 4 && memcmp(sd->head, IMG_MAGIC, 4) != 0) {
            return img_corrupt(err, sd->name,
                               "not a vmsnap image or zstd stream (bad magic at byte 0)");
        } else if (sd->head_fill == IMG_HEADER_LEN) {
            if (memcmp(sd->head, IMG_MAGIC, IMG_MAGIC_LEN) != 0)
                return img_corrupt(err, sd->name,
                                   "not a vmsnap image or zstd stream (bad magic at byte 0)");
            int rc = start_mode(sd, err);
            if (rc < 0)
                return rc;
        }
        if (sd->mode == M_HEAD)
            return 0;
    }
    if (!len)
        return 0;
    return sd->mode == M_PLAIN ? plain_feed(sd, buf, len, err) : sparse_feed(sd, buf, len, err);
}

int vmsnap_seqdec_finish(struct vmsnap_seqdec *sd, struct vmsnap_image_stats *stats,
                         struct vmsnap_err *err)
{
    int rc;
    struct vmsnap_image_stats st = {0};
    switch (sd->mode) {
    case M_HEAD:
        if (sd->head_fill == 0) {
            /* 0 bytes: the plain zstd of an empty file as older writers store it
             * (klauspost/compress without zero frames writes no frame at all), which the
             * reference reader, a zstd stream decoder, takes for an empty file */
            sd->mode = M_PLAIN;
            return vmsnap_seqdec_finish(sd, stats, err);
        }
        if (sd->head_fill >= 4 && is_zstd_magic(sd->head)) {
            if ((rc = start_mode(sd, err)) < 0)
                return rc;
            return vmsnap_seqdec_finish(sd, stats, err);
        }
        return img_corrupt(err, sd->name, "truncated: %u bytes, too short for a header",
                           sd->head_fill);
    case M_PLAIN:
        if (sd->plain_open)
            return img_corrupt(err, sd->name,
                               "truncated: zstd stream ends inside a frame at byte %llu",
                               ULL(sd->in_off));
        if ((rc = plain_flush(sd, err)) < 0)
            return rc;
        if (sd->fd >= 0 && ftruncate(sd->fd, (off_t)sd->plain_pos) < 0)
            return err_sys(err, "%s: set destination size", sd->name);
        st.total_size = sd->plain_pos;
        st.populated = sd->plain_data; /* what unpack writes: the blocks that are not all zero */
        st.frames = sd->plain_frames;
        st.plain_zstd = true;
        break;
    case M_SPARSE:
        if (sd->fs == F_ZSTD)
            return img_corrupt(err, sd->name,
                               "truncated: object ends at byte %llu inside the zstd frame "
                               "starting at byte %llu",
                               ULL(sd->in_off), ULL(sd->frame_start));
        if (sd->fs == F_SKIP || sd->fs == F_CAPTURE || sd->fs == F_SKIPHDR || sd->fhdr_fill)
            return img_corrupt(err, sd->name, "truncated: object ends at byte %llu inside a frame",
                               ULL(sd->in_off));
        if (sd->rp.state != REC_DONE)
            return img_corrupt(err, sd->name,
                               "truncated: object ends at byte %llu before the "
                               "end-of-extents sentinel",
                               ULL(sd->in_off));
        if (sd->expect_table && !sd->table_seen)
            return img_corrupt(err, sd->name,
                               "truncated: the seek table announced at byte 12 is missing "
                               "(object ends at byte %llu)",
                               ULL(sd->in_off));
        st.total_size = sd->rp.total;
        st.populated = sd->rp.populated;
        st.extents = sd->rp.extents;
        if (sd->table_seen) /* as the table counts them: its data frames */
            st.frames = sd->n_seen >= 2 ? sd->n_seen - 2 : 0;
        else /* the frames holding records */
            for (size_t i = 0; i < sd->n_seen; i++)
                st.frames += sd->seen[i].span_lo <= sd->seen[i].span_hi;
        st.has_seek_table = sd->table_seen;
        if (sd->table_seen) { /* what only the table records (a file's inspect reads it too) */
            st.zero_elided = sd->table_st.zero_elided;
            st.frame_size = sd->table_st.frame_size;
            st.level = sd->table_st.level;
            st.delta = sd->table_st.delta;
        }
        break;
    }
    st.object_size = sd->in_off;
    if (stats)
        *stats = st;
    return 0;
}
