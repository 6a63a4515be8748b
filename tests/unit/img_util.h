/* SPDX-License-Identifier: Apache-2.0 */
/* Helpers for the image tests: build guest-memory-like sparse files, pack into memory. */
#ifndef VMSNAP_IMG_UTIL_H
#define VMSNAP_IMG_UTIL_H

#include "t.h"
#include "vmsnap/image.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A growable in-memory sink. */
struct membuf_sink {
    uint8_t *data;
    size_t len, cap;
};
void membuf_sink_init(struct membuf_sink *m, struct vmsnap_sink *sink);
void membuf_sink_free(struct membuf_sink *m);

/* One extent the generator writes: offset, length and what kind of bytes. */
enum fill_kind { FILL_RANDOM, FILL_TEXT, FILL_ZERO, FILL_MIXED };
struct gen_extent {
    uint64_t off, len;
    enum fill_kind kind;
};

/* Create `path` of logical `size` holding `n` extents (written in order, holes elsewhere). */
void gen_file(const char *path, uint64_t size, const struct gen_extent *ext, size_t n,
              uint64_t seed);
/* Random layout: up to `max_ext` extents in `size`, page-aligned or not. */
size_t gen_random_layout(uint64_t *rng, uint64_t size, struct gen_extent *ext, size_t max_ext,
                         bool unaligned);

/* Pack `path` into memory with the given threads and frame size. Fails the test on error. */
void pack_to_mem(const char *path, unsigned threads, uint64_t frame_size, bool keep_zero,
                 struct membuf_sink *out, struct vmsnap_image_stats *st);
/* Equal logical size and bytes, comparing only where either file has data (fast on huge
 * sparse files). */
bool sparse_files_equal(const char *a, const char *b);
/* The reference system's reader, written from the documented version-2 layout alone (no
 * frames, no seek table: one zstd stream after byte 12): decodes `obj` into a new file `dst`;
 * false when it fails or finds no sentinel. */
bool ref_read_sparse(const uint8_t *obj, size_t len, const char *dst);
/* Write a buffer to a file. */
void write_file(const char *path, const void *data, size_t len);

#endif
