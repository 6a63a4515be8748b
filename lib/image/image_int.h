/* SPDX-License-Identifier: Apache-2.0 */
/* The image module's private header: the layout constants of the image format (docs/FORMAT.md
 * is the prose version), the seek-table parser and the incremental extent-record parser. */
#ifndef VMSNAP_IMAGE_INT_H
#define VMSNAP_IMAGE_INT_H

#include "util/util.h"
#include "vmsnap/image.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <zstd.h>

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
#define SEEK_FLAG_DELTA 2u /* a delta layer (pack with delta_parent): apply with overlay */
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

#define IMG_PAGE VMSNAP_PAGE_SIZE

/* True when `len` bytes at p are all zero: 64 bytes per step, stop at the first non-zero word. */
static inline bool img_all_zero(const uint8_t *p, size_t len)
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

/* ---- page tables (image_pages.c) ---- */

/* The page-table hash of the `len` bytes of one page (len <= 4096) that are not all zero (the
 * caller checked): XXH3_64bits, 0 remapped to 1. */
uint64_t img_page_hash_nz(const uint8_t *p, size_t len);
/* The hash of page `pidx` of the file at `fd` (of `size` bytes) read whole with pread: for a
 * page that an extent covers only in part (a filesystem whose blocks are smaller than a page). */
int img_page_hash_fd(int fd, const char *name, uint64_t size, uint64_t pidx, uint64_t *h,
                     struct vmsnap_err *err);
/* A table's hash of page `p`: 0 past its end. */
static inline uint64_t img_pages_at(const struct vmsnap_pages *t, uint64_t p)
{
    return p < t->npages ? t->h[p] : 0;
}
/* Check that a caller's table is consistent (npages matches size, hashes present). */
int img_pages_check(const struct vmsnap_pages *t, const char *what, struct vmsnap_err *err);

/* Fill `err` with EBADMSG and "<name>: corrupt image: <formatted reason>"; returns -EBADMSG.
 * The one formatter for every corrupt-input error of the codec. */
int img_corrupt(struct vmsnap_err *err, const char *name, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Parse and validate a seek table (the whole skippable frame, `tsize` bytes found at object
 * offset `toff`). On success *out is a new image. */
struct vmsnap_image;
int img_table_parse(const uint8_t *t, size_t tsize, uint64_t toff, uint64_t max_size,
                    const char *name, struct vmsnap_image **out, struct vmsnap_err *err);

/* The descriptor of a source made by vmsnap_source_fd (image_io.c), or -1 for any other. */
int img_source_fd(const struct vmsnap_source *src);

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
    bool overlay; /* punch all-zero aligned pages of records instead of writing them */
    struct vmsnap_pagemask *under; /* newest-first: skip pages set, set pages covered */
    uint8_t *pg;      /* overlay: a page whose bytes arrive in several pieces (IMG_PAGE bytes) */
    unsigned pg_fill; /* bytes of it gathered */
    unsigned pg_len;  /* its length (IMG_PAGE, or less for the file's partial last page) */
    uint64_t pg_off;  /* its offset */
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
/* Overlay: make [off, off + len) of `fd` a hole (punching `punch_len` >= len bytes: a file's
 * partial last page is punched whole, past the end of the file, so that it is freed), or write
 * `len` zeros where the filesystem cannot punch. `dst` names the file in errors. */
int img_punch(int fd, uint64_t off, uint64_t len, uint64_t punch_len, const char *dst,
              struct vmsnap_err *err);

/* ---- the encoder (image_enc*.c; the design is in image_enc.c) ---- */

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
    uint64_t unchanged, zero_pages;
};

/* The records of one range, built in the worker's buffer. */
struct recs {
    size_t len; /* bytes of records in w->b.p (0: the range has no data) */
    uint64_t populated, extents, zero;
    uint64_t unchanged, zero_pages; /* delta: pages left out, pages stored as zero records */
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
    bool abort; /* set under mu (img_set_abort); gate_stop reads it without */
    const struct vmsnap_pack_mem *mem; /* budget for the buffers; NULL: none */
    const struct vmsnap_pages *parent; /* delta layer: the parent's table (NULL: full image) */
    uint64_t *ph; /* the source's page hashes being computed (pages_out, or delta); NULL: none */
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

/* Growable array of frame entries for the seek table. */
struct table {
    struct vmsnap_frame_info *f;
    size_t n, cap;
};

struct out {
    const struct vmsnap_sink *sink;
    uint64_t pos;
};

/* Buffers (image_enc_buf.c). Make `b` hold at least `len` bytes (what it held is lost), charged
 * to the budget for worker `gw` (NULL: never waits); keep only `keep` bytes (0: unmap); after a
 * use, give it back when more is charged than the budget allows. */
int img_ebuf_reserve(const struct enc *e, struct ebuf *b, size_t len, struct worker *gw,
                     struct vmsnap_err *err);
void img_ebuf_trim(const struct enc *e, struct ebuf *b, size_t keep);
void img_ebuf_settle(const struct enc *e, struct ebuf *b);

/* One zstd frame (image_enc_zstd.c): compress `len` bytes at `src` into `out` as a frame with
 * the content checksum `checksum` (the XXH64 of src); stepped at high levels, where a cancel or
 * e->abort (e may be NULL) stops it. img_compress_into does it into a slot buffer. */
int img_compress_frame(const struct enc *e, ZSTD_CCtx *cctx, int level, const uint8_t *src,
                       size_t len, uint64_t checksum, uint8_t *out, size_t *out_len,
                       struct vmsnap_err *err);
int img_compress_into(const struct enc *e, ZSTD_CCtx *cctx, const uint8_t *src, size_t len,
                      uint64_t checksum, struct ebuf *c, size_t *out_len, struct worker *gw,
                      struct vmsnap_err *err);

/* The range encoder (image_enc_range.c): the data extents of [start, end) into w->ext; the
 * records of range `idx` into w->b (its page cache dropped after when `drop`); the worker
 * thread's loop. */
int img_find_extents(struct worker *w, uint64_t start, uint64_t end, size_t *n_out,
                     struct vmsnap_err *err);
int img_build_records(struct worker *w, uint64_t idx, bool drop, struct recs *r,
                      struct vmsnap_err *err);
void *img_worker_main(void *arg);

/* The delta range encoder (image_enc_delta.c): the records of range `idx` of a delta layer into
 * w->b (pages whose hash differs from e->parent's; e->ph filled), the range's page cache dropped
 * after. */
int img_build_delta(struct worker *w, uint64_t idx, struct recs *r, struct vmsnap_err *err);

/* The base pre-scan (image_enc_scan.c): fills e->plan (which ranges reuse the base's frame). */
int img_prescan(struct enc *e, struct worker *ws, unsigned threads, struct vmsnap_err *err);

/* The ordered writer (image_enc_write.c). */
void img_set_abort(struct enc *e);
int img_table_add(struct table *t, const struct vmsnap_frame_info *fi, struct vmsnap_err *err);
int img_emit(struct out *o, const void *buf, size_t len, struct vmsnap_err *err);
int img_emit_word_frame(struct out *o, ZSTD_CCtx *cctx, int level, uint64_t word, uint64_t src_pos,
                        struct table *t, struct vmsnap_err *err);
int img_emit_info_frame(struct out *o, uint64_t frame_size, struct vmsnap_err *err);
int img_emit_seek_table(struct out *o, const struct table *t, const struct vmsnap_image_stats *st,
                        uint64_t frame_size, uint64_t frames_start, int level, uint32_t flags,
                        struct vmsnap_err *err);
/* Take the ranges' slots in order (`started` workers fill them; `wk` is the writer's own worker
 * state, for demoted frames), send each frame to o->sink, add it to `t` and count it in `s`.
 * Returns 0 when every range is out, or the first failure (the caller stops the workers). */
int img_write_ranges(struct worker *wk, unsigned started, struct out *o, struct table *t,
                     struct vmsnap_image_stats *s, const struct vmsnap_pack_opts *opts,
                     struct vmsnap_err *err);

#endif
