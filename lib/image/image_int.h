/* SPDX-License-Identifier: Apache-2.0 */
/* The image module's private header: the layout constants of the image format (docs/FORMAT.md
 * is the prose version), the seek-table parser and the incremental extent-record parser. */
#ifndef VMSNAP_IMAGE_INT_H
#define VMSNAP_IMAGE_INT_H

#include "util/util.h"
#include "vmsnap/image.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#define IMG_MAGIC "ATESPRSE"
#define IMG_MAGIC_LEN 8
#define IMG_VERSION 2u
#define IMG_HEADER_LEN 12 /* magic + u32 version */

#define ZSTD_FRAME_MAGIC 0xFD2FB528u
#define ZSTD_SKIP_MAGIC_MIN 0x184D2A50u
#define ZSTD_SKIP_MAGIC_MASK 0xFFFFFFF0u

/* An info skippable frame right after the header announces the seek table, so a sequential
 * reader can tell a vmsnap object that lost its table (truncated) from a reference stream.
 * Content: "VMSNINFO", u32 version, u32 flags, u64 frame size. */
#define INFO_SKIP_MAGIC 0x184D2A5Du
#define INFO_MAGIC "VMSNINFO"
#define INFO_VERSION 1u
#define INFO_FLAG_SEEK_TABLE 1u
#define INFO_CONTENT_LEN 24

/* The seek table lives in a skippable frame with this magic. */
#define SEEK_SKIP_MAGIC 0x184D2A5Eu
#define SEEK_TABLE_VERSION 1u
#define SEEK_HDR_LEN 64
#define SEEK_ENTRY_LEN 56
#define SEEK_FOOTER_LEN 32
#define SEEK_FOOTER_MAGIC "VMSNSEEK"
#define SEEK_FLAG_ZERO_ELIDED 1u
/* Frames in one image at most (1 TiB logical at 1 MiB per frame, plus header and trailer). */
#define SEEK_MAX_FRAMES (1u << 20)

/* Bytes of an extent record header (off i64, len i64) and of the totalSize / sentinel words. */
#define REC_HDR_LEN 16
#define REC_WORD_LEN 8

/* The upper bound on a data frame's decompressed size for a given source span: every byte plus
 * a record header per 512 bytes (no filesystem reports extents finer than that) and two more. */
static inline uint64_t img_max_dsize(uint64_t span)
{
    return span + REC_HDR_LEN * (span / 512 + 2);
}

/* True when the 8 + INFO_CONTENT_LEN bytes at p are a well-formed info frame. */
static inline bool img_info_valid(const uint8_t *p)
{
    for (int i = 0; i < 8; i++)
        if (p[8 + i] != (uint8_t)INFO_MAGIC[i])
            return false;
    uint32_t magic = 0, len = 0, ver = 0, flags = 0;
    for (int i = 3; i >= 0; i--) {
        magic = (magic << 8) | p[i];
        len = (len << 8) | p[4 + i];
        ver = (ver << 8) | p[16 + i];
        flags = (flags << 8) | p[20 + i];
    }
    return magic == INFO_SKIP_MAGIC && len == INFO_CONTENT_LEN && ver == INFO_VERSION &&
           flags == INFO_FLAG_SEEK_TABLE;
}

/* Fill `err` with EBADMSG and "<name>: corrupt image: <formatted reason>"; returns -EBADMSG.
 * The one formatter for every corrupt-input error of the codec. */
int img_corrupt(struct vmsnap_err *err, const char *name, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Parse and validate a seek table (the whole skippable frame, `tsize` bytes found at object
 * offset `toff`). On success *out is a new image. */
struct vmsnap_image;
int img_table_parse(const uint8_t *t, size_t tsize, uint64_t toff, uint64_t max_size,
                    const char *name, struct vmsnap_image **out, struct vmsnap_err *err);

/* ---- the incremental extent-record parser (image_rec.c) ---- */

enum rec_state { REC_TOTAL, REC_OFF, REC_LEN, REC_DATA, REC_DONE };

struct rec_parser {
    enum rec_state state;
    uint8_t word[8];
    unsigned fill;
    uint64_t off;
    uint64_t data_off, data_left;
    uint64_t total;
    bool have_total;
    bool table_total;       /* max_size is the seek table's totalSize: another one is damage */
    bool truncate_on_total; /* ftruncate fd to totalSize when it is read */
    bool allow_sentinel;
    uint64_t max_size;
    uint64_t next_min; /* extents must start at or after this */
    uint64_t lo, hi;   /* the frame's source range */
    uint64_t pos;      /* decoded bytes consumed, for messages */
    uint64_t extents, populated;
    uint64_t span_lo, span_hi; /* extents seen since span_lo was set to UINT64_MAX: lowest start, */
                               /* highest end (the sequential decoder resets them per frame) */
    int fd;                    /* destination, -1 to discard */
    const char *name;
    const char *dst_name;
    char where[96]; /* "frame 3 at object offset 1234" */
};

void rec_init(struct rec_parser *rp, enum rec_state start, int fd, const char *name,
              uint64_t max_size);
int rec_feed(struct rec_parser *rp, const uint8_t *buf, size_t len, struct vmsnap_err *err);
/* True when the parser sits between records (a frame may end here). */
bool rec_at_boundary(const struct rec_parser *rp);

#endif
