/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The snapshot image codec: a sparse file (a guest RAM image, a disk image) encoded as the
 * reference system's sparse-extent stream, version 2 ("ATESPRSE", u32 2, zstd frames holding
 * totalSize, {off, len, data}* records and a -1 sentinel), cut into independent zstd frames per
 * source range, with a seek table in a trailing zstd skippable frame. Byte layouts: docs/FORMAT.md.
 *
 * Encoding runs `threads` workers that each take the next source range, find its extents with
 * SEEK_DATA/SEEK_HOLE, elide all-zero 4 KiB pages and compress; the calling thread writes frames
 * in order to a sink. Decoding with a seek table runs workers over frames in parallel and pwrites
 * extents into a sparse destination; without one it streams sequentially.
 *
 * Thread safety: every call is independent; a struct vmsnap_image may be shared by decoder
 * threads once opened (it is read-only after vmsnap_image_open()).
 */
#ifndef VMSNAP_IMAGE_H
#define VMSNAP_IMAGE_H

#include "vmsnap/common.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define VMSNAP_IMAGE_DEFAULT_FRAME_SIZE (64ull << 20)
#define VMSNAP_IMAGE_MIN_FRAME_SIZE (1ull << 20)
#define VMSNAP_IMAGE_MAX_FRAME_SIZE (1ull << 30)
#define VMSNAP_IMAGE_DEFAULT_MAX_SIZE (64ull << 40) /* 64 TiB cap on a decoded totalSize */
#define VMSNAP_IMAGE_PAGE 4096u
#define VMSNAP_IMAGE_DEFAULT_MIN_RUN (5ull << 20) /* S3's smallest part */
#define VMSNAP_PAGE_SIZE 4096u

/* ---- page tables: per-page content hashes, what a delta layer is computed against ---- */

/* Per-page content hashes of a file: one 64-bit XXH3 (libxxhash's XXH3_64bits, seed 0) per
 * 4 KiB page at absolute offsets (the last page may be partial: hashed over its bytes), 0 for a
 * hole or an all-zero page (a real hash that comes out 0 is replaced by 1). Memory: 8 bytes per
 * page (2 MiB per GiB of logical size) plus this struct. */
struct vmsnap_pages {
    uint64_t size;      /* logical size of the file */
    uint64_t npages;    /* ceil(size / 4096) */
    uint64_t populated; /* pages whose hash is not 0 */
    uint64_t *h;        /* npages hashes */
};
/* A table for a file of `size` bytes, every page 0 (a hole). Free with vmsnap_pages_free. */
VMSNAP_API int vmsnap_pages_new(uint64_t size, struct vmsnap_pages **out, struct vmsnap_err *err);
/* Hash every page of the regular file open at `fd` (SEEK_DATA/SEEK_HOLE to skip holes, `threads`
 * workers, 0 = CPUs; the file's clean page cache is dropped after reading unless keep_cache, as
 * the encoder does). `name` names the file in errors. A file whose size or modification time
 * changes while it is read is refused (EAGAIN). */
VMSNAP_API int vmsnap_pages_hash_fd(int fd, const char *name, unsigned threads, bool keep_cache,
                                    struct vmsnap_pages **out, struct vmsnap_err *err);
VMSNAP_API void vmsnap_pages_free(struct vmsnap_pages *p);
/* How many pages a delta of `cur` over `parent` stores: pages whose hashes differ (pages beyond
 * parent's end count as differing when not 0); of those, how many are 0 in cur (*holes, may be
 * NULL). */
VMSNAP_API uint64_t vmsnap_pages_diff(const struct vmsnap_pages *parent,
                                      const struct vmsnap_pages *cur, uint64_t *holes);
/* The serialised table (a layer's "pages" object, stored beside its image; docs/FORMAT.md,
 * "Layers"): a 48-byte header (magic "VMSNPAGE", version, page size, size, npages, populated, an
 * XXH64 of the hashes) followed by the hashes, the whole compressed as one zstd frame. encode
 * allocates *buf (free() it). decode validates every field (untrusted bytes from a store:
 * `where` names the object in errors; max_size caps `size`, 0 = 64 TiB) and refuses anything
 * inconsistent with EBADMSG and a message naming the field (EFBIG past max_size); its memory is
 * the table itself. */
VMSNAP_API int vmsnap_pages_encode(const struct vmsnap_pages *p, void **buf, size_t *len,
                                   struct vmsnap_err *err);
VMSNAP_API int vmsnap_pages_decode(const void *buf, size_t len, const char *where,
                                   uint64_t max_size, struct vmsnap_pages **out,
                                   struct vmsnap_err *err);

/* Progress: `done` of `total` bytes (source bytes on pack, object bytes on unpack). Called from
 * one thread at a time. */
typedef void (*vmsnap_progress_fn)(void *arg, uint64_t done, uint64_t total);

/* Bytes at the start of every vmsnap image: header (12) and info frame (32). */
#define VMSNAP_IMAGE_PREFIX_LEN 44u

/* Where an encoder writes its object, in order. `write` gets whole frames (or the 12-byte header,
 * or the info frame, or the whole seek table in one call, last) and must consume all of `len`;
 * returns >= 0 or -errno with `err` filled. `copy`, used only when the pack has a `base`, says
 * that the next frame of the object is the base's frame `f` unchanged (f->offset and f->csize
 * locate its bytes in the base object, f->ccheck is their XXH64); it may be NULL otherwise. */
struct vmsnap_frame_info;
struct vmsnap_sink {
    int (*write)(void *arg, const void *buf, size_t len, struct vmsnap_err *err);
    void *arg;
    int (*copy)(void *arg, const struct vmsnap_frame_info *f, struct vmsnap_err *err);
};

/* True when the `len` bytes at buf are exactly a vmsnap seek table frame (footer included), as
 * the encoder hands it to a sink in its last write. */
VMSNAP_API bool vmsnap_image_is_seek_table(const void *buf, size_t len);

/* What an object's first `len` bytes say it is, by its magic: a vmsnap image (or the reference
 * format's sparse-extent image: the same magic; needs 8 bytes), another zstd stream (a zstd or
 * skippable frame: a plain-zstd snapshot; needs 4), or neither. */
enum vmsnap_image_magic {
    VMSNAP_IMAGE_MAGIC_NONE = 0,
    VMSNAP_IMAGE_MAGIC_IMAGE = 1,
    VMSNAP_IMAGE_MAGIC_ZSTD = 2,
};
VMSNAP_API enum vmsnap_image_magic vmsnap_image_sniff(const void *buf, size_t len);

/* Random-access input: `size` bytes, read with `pread` (must return exactly `len` bytes or
 * -errno with `err` filled). May be called from several threads at once. */
struct vmsnap_source {
    int (*pread)(void *arg, void *buf, size_t len, uint64_t off, struct vmsnap_err *err);
    void *arg;
    uint64_t size;
    const char *name; /* for error messages ("s3://b/k", "/path") */
};

struct vmsnap_image; /* an opened image with a seek table (below) */

/* A byte budget the encoder's buffers are charged to (vmsnap_pack_opts.mem): a caller that
 * bounds its own buffers too (a push: --max-memory) shares one budget with the encoder.
 * acquire() charges `bytes`, blocking while the budget is spent and something is held, unless
 * `wait` is false or stop(ctx) is true; the encoder's stop is true for the range its output
 * waits for next, and once it stops (that range never waits, so the output always moves; the
 * budget can be passed by what that range takes). kick() wakes the waiting acquires to ask
 * stop() again. over() says more is charged than the budget allows: the encoder then gives
 * back the buffers it would keep for the next range. */
struct vmsnap_pack_mem {
    void (*acquire)(void *arg, uint64_t bytes, bool wait, bool (*stop)(void *ctx), void *ctx);
    void (*release)(void *arg, uint64_t bytes);
    bool (*over)(void *arg);
    void (*kick)(void *arg);
    void *arg;
    /* charge `bytes` only if that needs no wait and nothing waits; true when charged (NULL: a
     * buffer that grows is always given back and acquired anew) */
    bool (*try_acquire)(void *arg, uint64_t bytes);
};

struct vmsnap_pack_opts {
    unsigned threads;     /* 0: online CPUs */
    uint64_t frame_size;  /* source range per frame; 0: 64 MiB; multiple of 4 KiB */
    int level;            /* zstd level; 0: 1 */
    bool keep_zero_pages; /* encode all-zero pages instead of treating them as holes */
    bool keep_cache;      /* do not drop the source's clean page cache after reading */
    bool fsync;           /* vmsnap_image_pack: fsync DST (and its directory) before it appears */
    vmsnap_progress_fn progress;
    void *progress_arg;
    /* A previous image of the same file (its seek table, vmsnap_image_open). A pre-scan builds
     * and hashes every range's records without compressing them; a range whose records hash
     * (XXH64, with equal source range, size and populated bytes) to the base's frame for the
     * same range is unchanged. Runs of unchanged frames (see base_min_run) are not compressed:
     * the sink's `copy` gets each base frame instead. Used only when the frame sizes match and
     * the sink has `copy`, the frame sizes and zstd levels match (frames of another zstd
     * version are the same content, possibly other bytes). Costs a second read of the
     * source. */
    const struct vmsnap_image *base;
    /* With a base: every run of reused frames (adjacent in the base) the sink gets holds at
     * least this many bytes, and is preceded by at least this many written bytes since the
     * previous run (or by none): the encoder compresses shorter runs, and the head of a run
     * that follows too few bytes, itself. So a sink can make every run and every stretch of
     * written bytes a multipart part. 0: 5 MiB (S3's smallest part). */
    uint64_t base_min_run;
    /* A budget for the encoder's buffers (the ranges' records, their frames until written).
     * NULL: none, about 2 x threads x frame_size at most. */
    const struct vmsnap_pack_mem *mem;
    /* Delta layer: encode only the pages of the source whose hash (computed by the encoder from
     * the bytes it reads) differs from `delta_parent`'s for the same page; a page that is a hole
     * or all zero in the source but not 0 in the parent is stored as an explicit all-zero page
     * record (so "became a hole" is in the stream); unchanged pages are left out. Frames, ranges
     * and records as for a full image (the output is still a valid sparse-extent v2 stream
     * with a seek table, byte-identical for any thread count; its seek table's flags say
     * "delta"). Records are whole pages (extents are read rounded out to 4 KiB pages). Not with
     * `base` (EINVAL) nor keep_zero_pages. Apply it with vmsnap_unpack_opts.overlay onto the
     * file its parent decoded to. */
    const struct vmsnap_pages *delta_parent;
    /* When not NULL: the page table of the source as encoded (computed during the encode from
     * the bytes read, for full and delta encodes alike; so no second pass), allocated by the
     * encoder, freed by the caller with vmsnap_pages_free. Set only when the pack succeeds. */
    struct vmsnap_pages **pages_out;
};

struct vmsnap_image_stats {
    uint64_t total_size;  /* logical size of the file */
    uint64_t populated;   /* bytes stored in extents */
    uint64_t zero_elided; /* allocated bytes skipped as all-zero pages (pack only) */
    uint64_t extents;     /* extent records */
    uint64_t frames;      /* zstd frames holding records (data frames) */
    uint64_t frame_size;  /* source range per frame (0 when the object has no seek table) */
    uint64_t object_size; /* encoded bytes */
    bool has_seek_table;
    bool plain_zstd;       /* input was a plain zstd stream of a whole file */
    uint64_t reused;       /* pack with a base: data frames taken from the base */
    uint64_t reused_bytes; /* their compressed bytes */
    int level;             /* zstd level the seek table records (0: no table) */
    bool delta;            /* a delta layer (pack with delta_parent; a table flag on decode) */
    uint64_t unchanged;    /* pack with delta_parent: pages left out as unchanged */
    uint64_t zero_pages;   /* pack with delta_parent: pages stored as explicit all-zero records */
};

/* Encode the regular file open at `src_fd` into `sink`. The output is byte-identical for any
 * thread count. Memory: about 2 x threads x frame_size at most, or what opts->mem allows plus
 * about three frames. */
VMSNAP_API int vmsnap_image_pack_fd(int src_fd, const char *src_name,
                                    const struct vmsnap_sink *sink,
                                    const struct vmsnap_pack_opts *opts,
                                    struct vmsnap_image_stats *stats, struct vmsnap_err *err);

/* Are the frame size and level of `opts` ones the encoder takes? (A caller about to change
 * something first, as a push over a set un-commits it, asks before.) */
VMSNAP_API int vmsnap_image_check_pack_opts(const struct vmsnap_pack_opts *opts,
                                            struct vmsnap_err *err);

/* Encode file `src` to file `dst` ("-" = stdout). A file destination is written under a temporary
 * name in its directory (mode 0600) and renamed on success; on failure nothing is left there. */
VMSNAP_API int vmsnap_image_pack(const char *src, const char *dst,
                                 const struct vmsnap_pack_opts *opts,
                                 struct vmsnap_image_stats *stats, struct vmsnap_err *err);

struct vmsnap_unpack_opts {
    unsigned threads;  /* 0: online CPUs */
    uint64_t max_size; /* cap on totalSize; 0: 64 TiB */
    bool fsync;        /* fsync the destination before renaming it into place */
    vmsnap_progress_fn progress;
    void *progress_arg;
    const char *dst_name; /* decode_parallel: names the destination in write errors */
    /* Apply a layer onto a destination that already holds the file as its parent left it: the
     * destination is not assumed empty; it is ftruncated to the layer's totalSize, every record
     * is written, except that each 4 KiB-aligned page of a record that is all zero is punched
     * (fallocate PUNCH_HOLE|KEEP_SIZE; a partial last page of the file too; written as zeros
     * where the filesystem cannot punch). A full layer applied onto an empty file gives the
     * same bytes as without. vmsnap_image_unpack then writes `dst` in place (created when
     * missing), not under a temporary name: a failure leaves it part applied. */
    bool overlay;
    /* apply a chain newest layer first (faster than oldest first: every page is written once,
     * by the newest layer that has it): pages set in `under` are left as they are, every page a
     * record of this layer covers whole is added to it (written, or left a hole when all zero:
     * the destination starts empty). The file's size is not set (the newest layer's is the
     * caller's ftruncate). Not with overlay. */
    struct vmsnap_pagemask *under;
    /* decode_parallel: when set, data frames it returns false for are skipped (never read):
     * a chain applied newest first whose newer layers hold every page a frame could give */
    bool (*want_frame)(void *arg, const struct vmsnap_frame_info *fi);
    void *want_arg;
};

/* Decode file `src` ("-" = stdin, sequential) into a new sparse file `dst` (mode 0600), written
 * under a temporary name and renamed only on success; an existing `dst` is replaced only then.
 * Accepts vmsnap objects, reference single-stream objects and plain zstd streams. */
VMSNAP_API int vmsnap_image_unpack(const char *src, const char *dst,
                                   const struct vmsnap_unpack_opts *opts,
                                   struct vmsnap_image_stats *stats, struct vmsnap_err *err);

/* An opened image with a seek table (read-only after open). */
struct vmsnap_image;

struct vmsnap_frame_info {
    uint64_t offset;    /* byte offset of the frame in the object */
    uint64_t csize;     /* compressed bytes */
    uint64_t dsize;     /* decompressed bytes */
    uint64_t src_start; /* source range covered [src_start, src_end) */
    uint64_t src_end;
    uint64_t populated; /* data bytes in its records */
    uint64_t checksum;  /* XXH64 of the decompressed content */
    uint64_t ccheck;    /* XXH64 of the compressed frame bytes */
};

/* Read and validate the seek table at the end of `src`. Returns 1 and sets *out when the object
 * has one, 0 (with *out NULL) when it has none (a sequential stream or plain zstd), -errno on an
 * I/O error or a corrupt table. `max_size` caps totalSize (0: 64 TiB). Free with
 * vmsnap_image_free(). */
VMSNAP_API int vmsnap_image_open(const struct vmsnap_source *src, uint64_t max_size,
                                 struct vmsnap_image **out, struct vmsnap_err *err);
VMSNAP_API void vmsnap_image_free(struct vmsnap_image *img);

/* The bytes vmsnap_image_open() read and validated: the object's first VMSNAP_IMAGE_PREFIX_LEN
 * bytes and its whole seek table frame (footer included); what a manifest's tableSha256 is
 * computed over. */
VMSNAP_API void vmsnap_image_raw(const struct vmsnap_image *img, const void **prefix,
                                 size_t *prefix_len, const void **table, size_t *table_len);

/* Whole-image fields from the table. `frames` counts every frame, header and trailer included. */
VMSNAP_API void vmsnap_image_get_stats(const struct vmsnap_image *img,
                                       struct vmsnap_image_stats *stats);
VMSNAP_API uint32_t vmsnap_image_frame_count(const struct vmsnap_image *img);
VMSNAP_API void vmsnap_image_frame(const struct vmsnap_image *img, uint32_t i,
                                   struct vmsnap_frame_info *info);

/* Decode frame `i`, reading its bytes from `src` at `info.offset - base` (so a caller holding a
 * buffer of frames starting at object offset `base` passes a source over that buffer). Extents
 * are pwritten to `dst_fd` (-1: only verify). Checks the zstd checksum, the table's XXH64 and
 * sizes, and that every record lies inside the frame's source range. Thread-safe. Adds the
 * frame's extents and data bytes to *extents and *populated when not NULL. */
VMSNAP_API int vmsnap_image_decode_frame(const struct vmsnap_image *img, uint32_t i,
                                         const struct vmsnap_source *src, uint64_t base, int dst_fd,
                                         uint64_t *extents, struct vmsnap_err *err);

/* A reusable per-thread frame decoder (a zstd context and a ring of about the zstd window plus
 * 0.5 MiB: 1.5 MiB at level 1). Not thread-safe: one per decoding thread. */
struct vmsnap_frame_decoder;
VMSNAP_API int vmsnap_frame_decoder_new(struct vmsnap_frame_decoder **out, struct vmsnap_err *err);
VMSNAP_API void vmsnap_frame_decoder_free(struct vmsnap_frame_decoder *dec);
/* Name the destination in the decoder's write errors ("<dst_name>: write N bytes at offset O:
 * <reason>"); the string is not copied. Without it they say "destination". */
VMSNAP_API void vmsnap_frame_decoder_set_dst(struct vmsnap_frame_decoder *dec,
                                             const char *dst_name);
/* A bitmap of a file's 4 KiB pages (vmsnap_unpack_opts.under), safe to update from the
 * threads decoding the frames of one layer. */
struct vmsnap_pagemask {
    uint64_t npages;
    uint64_t *bits;
};
VMSNAP_API int vmsnap_pagemask_new(uint64_t size, struct vmsnap_pagemask **out,
                                   struct vmsnap_err *err);
VMSNAP_API void vmsnap_pagemask_free(struct vmsnap_pagemask *m);
/* Newest-first decoding (vmsnap_unpack_opts.under) for the frames this decoder decodes next
 * (NULL: off). */
VMSNAP_API void vmsnap_frame_decoder_set_under(struct vmsnap_frame_decoder *dec,
                                               struct vmsnap_pagemask *under);
/* Overlay decoding (vmsnap_unpack_opts.overlay) for the frames this decoder decodes next. */
VMSNAP_API void vmsnap_frame_decoder_set_overlay(struct vmsnap_frame_decoder *dec, bool overlay);

/* vmsnap_image_decode_frame() with the caller's decoder (its destination name and overlay mode
 * apply; no decoder is made per call). */
VMSNAP_API int vmsnap_image_decode_frame_dec(const struct vmsnap_image *img, uint32_t i,
                                             const struct vmsnap_source *src, uint64_t base,
                                             int dst_fd, struct vmsnap_frame_decoder *dec,
                                             uint64_t *extents, struct vmsnap_err *err);

/* Decode frame `i` from the `len` bytes at `frame` (exactly the frame, as the caller fetched it:
 * no copy is made), with the same checks as vmsnap_image_decode_frame(). The frame is decoded
 * through `dec`'s ring, so memory does not grow with the frame size. */
VMSNAP_API int vmsnap_image_decode_frame_mem(const struct vmsnap_image *img, uint32_t i,
                                             const void *frame, size_t len, int dst_fd,
                                             struct vmsnap_frame_decoder *dec, uint64_t *extents,
                                             struct vmsnap_err *err);

/* Decode a whole image with a seek table into `dst_fd` using `threads` workers (0: CPUs). The
 * caller has sized nothing: this sets the file size (ftruncate) and writes only extents. */
VMSNAP_API int vmsnap_image_decode_parallel(const struct vmsnap_image *img,
                                            const struct vmsnap_source *src, int dst_fd,
                                            const struct vmsnap_unpack_opts *opts,
                                            struct vmsnap_image_stats *stats,
                                            struct vmsnap_err *err);

/* Sequential decoder, fed by the caller (a pipe, a streaming GET). Handles vmsnap and reference
 * sparse-extent objects (skippable frames are skipped) and plain zstd of a whole file (all-zero
 * 64 KiB blocks are left as holes). `dst_fd` must be a regular file open for writing (-1 = verify
 * only); the decoder sets its size. */
struct vmsnap_seqdec;
VMSNAP_API int vmsnap_seqdec_new(int dst_fd, uint64_t max_size, const char *src_name,
                                 struct vmsnap_seqdec **out, struct vmsnap_err *err);
VMSNAP_API int vmsnap_seqdec_feed(struct vmsnap_seqdec *dec, const void *buf, size_t len,
                                  struct vmsnap_err *err);
/* End of input: fails if the stream is incomplete (no sentinel, truncated frame). */
VMSNAP_API int vmsnap_seqdec_finish(struct vmsnap_seqdec *dec, struct vmsnap_image_stats *stats,
                                    struct vmsnap_err *err);
VMSNAP_API void vmsnap_seqdec_free(struct vmsnap_seqdec *dec);
/* As vmsnap_frame_decoder_set_dst(), for the sequential decoder; call before feeding. */
VMSNAP_API void vmsnap_seqdec_set_dst(struct vmsnap_seqdec *dec, const char *dst_name);
/* Overlay decoding (vmsnap_unpack_opts.overlay; a plain zstd stream's all-zero 64 KiB blocks are
 * punched too); call before feeding. */
VMSNAP_API void vmsnap_seqdec_set_overlay(struct vmsnap_seqdec *dec, bool overlay);

/* Decode everything and check every checksum without writing. Fills `stats` (from the table when
 * there is one, else from the stream). `verify`=false reads only the table when there is one.
 * `max_size` caps totalSize as for unpack (0: 64 TiB). */
VMSNAP_API int vmsnap_image_inspect(const char *src, bool verify, unsigned threads,
                                    uint64_t max_size, struct vmsnap_image_stats *stats,
                                    struct vmsnap_err *err);

/* A source over a regular file descriptor (not owned). */
VMSNAP_API void vmsnap_source_fd(struct vmsnap_source *src, int fd, uint64_t size,
                                 const char *name);
/* A source over a memory buffer (not owned). */
struct vmsnap_membuf {
    const uint8_t *data;
    size_t len;
};
VMSNAP_API void vmsnap_source_mem(struct vmsnap_source *src, struct vmsnap_membuf *mb,
                                  const char *name);

#ifdef __cplusplus
}
#endif
#endif
