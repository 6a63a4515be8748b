/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Round trips over sparse files: the decoded file equals the source byte for byte and is sparse
 * (allocated blocks about the populated size); -j1 and -j8 produce identical objects; the
 * parallel and the sequential decoders (fed in random pieces) agree.
 */
#include "img_util.h"

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MiB (1ull << 20)

static uint64_t rng = 0x5eed1234abcdull;

/* Decode `obj` with the sequential decoder, feeding random piece sizes, into `dst`. */
static void seq_decode(const struct membuf_sink *obj, const char *dst,
                       struct vmsnap_image_stats *st)
{
    int fd = open(dst, O_CREAT | O_TRUNC | O_RDWR, 0600);
    REQUIRE(fd >= 0);
    struct vmsnap_seqdec *sd = NULL;
    struct vmsnap_err err = {0};
    REQUIRE(vmsnap_seqdec_new(fd, 0, "mem", &sd, &err) == 0);
    size_t pos = 0;
    int rc = 0;
    while (pos < obj->len && rc == 0) {
        size_t n = 1 + t_rand(&rng) % (t_rand(&rng) % 2 ? 7 : 200000);
        if (n > obj->len - pos)
            n = obj->len - pos;
        rc = vmsnap_seqdec_feed(sd, obj->data + pos, n, &err);
        pos += n;
    }
    if (rc == 0)
        rc = vmsnap_seqdec_finish(sd, st, &err);
    CHECKF(rc == 0, "sequential decode: %s", err.msg);
    vmsnap_seqdec_free(sd);
    close(fd);
}

static void roundtrip(const char *label, const char *src, uint64_t frame_size, bool keep_zero)
{
    struct membuf_sink a, b;
    struct vmsnap_image_stats sa, sb;
    pack_to_mem(src, 1, frame_size, keep_zero, &a, &sa);
    pack_to_mem(src, 8, frame_size, keep_zero, &b, &sb);
    CHECKF(a.len == b.len && memcmp(a.data, b.data, a.len) == 0,
           "%s: -j1 and -j8 objects differ (%zu vs %zu bytes)", label, a.len, b.len);
    CHECKF(sa.object_size == a.len, "%s: object_size %llu vs %zu bytes", label,
           (unsigned long long)sa.object_size, a.len);

    const char *obj = t_path("obj");
    const char *out = t_path("out");
    write_file(obj, a.data, a.len);
    struct vmsnap_unpack_opts uo = {.threads = 3};
    struct vmsnap_err err = {0};
    struct vmsnap_image_stats su;
    int rc = vmsnap_image_unpack(obj, out, &uo, &su, &err);
    CHECKF(rc == 0, "%s: unpack: %s", label, err.msg);
    CHECKF(su.has_seek_table, "%s: unpack did not find the seek table", label);
    CHECKF(sparse_files_equal(src, out), "%s: decoded file differs from the source", label);
    struct stat st;
    REQUIRE(stat(out, &st) == 0);
    CHECKF((st.st_mode & 0777) == 0600, "%s: output mode %o, want 0600", label, st.st_mode & 0777);
    /* Sparse: allocation about the populated bytes (block rounding and extent-tree blocks). */
    uint64_t alloc = t_allocated(out);
    uint64_t slack = 64 * 1024 + sa.extents * 8192;
    CHECKF(alloc <= sa.populated + slack,
           "%s: output allocates %llu bytes for %llu populated (not sparse)", label,
           (unsigned long long)alloc, (unsigned long long)sa.populated);
    CHECKF(su.populated == sa.populated && su.total_size == sa.total_size,
           "%s: stats disagree between pack and unpack", label);

    const char *out2 = t_path("out-seq");
    struct vmsnap_image_stats ss;
    seq_decode(&a, out2, &ss);
    CHECKF(sparse_files_equal(src, out2), "%s: sequential decode differs from the source", label);
    CHECKF(ss.has_seek_table && ss.populated == sa.populated,
           "%s: sequential decode did not verify the seek table", label);
    unlink(obj);
    unlink(out);
    unlink(out2);
    membuf_sink_free(&a);
    membuf_sink_free(&b);
}

/* Matches reaching back almost a whole zstd window, in frames far larger than the decoder's
 * ring (about the window plus 256 KiB, image_dec.c): after each wrap zstd reads the older part
 * of the window from the previous lap at the ring's end, so a ring too small, or bytes fed after
 * they were overwritten, show here. The data is a random block repeated at a period just under
 * the window (1 MiB at level 1; at level 3, 1.5 MiB of a 2 MiB window), so most bytes are such
 * matches. */
static void long_matches(const char *src, int level, uint64_t period)
{
    const uint64_t size = 40 * MiB + 12345;
    uint8_t *block = malloc(period), *buf = malloc(size);
    REQUIRE(block && buf);
    for (uint64_t i = 0; i < period; i++)
        block[i] = (uint8_t)t_rand(&rng);
    for (uint64_t i = 0; i < size; i++)
        buf[i] = block[i % period];
    write_file(src, buf, size);
    const char *obj = t_path("lm-obj"), *out = t_path("lm-out");
    struct vmsnap_pack_opts po = {.threads = 2, .frame_size = 16 * MiB, .level = level};
    struct vmsnap_image_stats st;
    struct vmsnap_err err = {0};
    unlink(obj);
    REQUIRE(vmsnap_image_pack(src, obj, &po, &st, &err) == 0);
    CHECKF(st.object_size < size / 4, "level %d: the repeats were not found (%llu bytes)", level,
           (unsigned long long)st.object_size);
    struct vmsnap_unpack_opts uo = {.threads = 2};
    int rc = vmsnap_image_unpack(obj, out, &uo, NULL, &err);
    CHECKF(rc == 0, "level %d, long matches: unpack: %s", level, err.msg);
    CHECKF(rc != 0 || t_files_equal(src, out), "level %d, long matches: decoded bytes differ",
           level);
    unlink(obj);
    unlink(out);
    free(block);
    free(buf);
}

int main(void)
{
    char *src = strdup(t_path("src"));

    /* Empty file. */
    gen_file(src, 0, NULL, 0, 1);
    roundtrip("empty", src, 0, false);

    /* Size not a multiple of 4 KiB, fully written. */
    struct gen_extent e1[] = {{0, 12345, FILL_TEXT}};
    gen_file(src, 12345, e1, 1, 2);
    roundtrip("unaligned-size", src, 0, false);

    /* Holes at start and end, data in the middle. */
    struct gen_extent e2[] = {{3 * MiB, 2 * MiB + 100, FILL_RANDOM}};
    gen_file(src, 9 * MiB + 7, e2, 1, 3);
    roundtrip("holes-at-edges", src, 0, false);

    /* Extents crossing frame boundaries (1 MiB frames), zero pages inside extents. */
    struct gen_extent e3[] = {{MiB / 2, 2 * MiB, FILL_MIXED},
                              {3 * MiB - 4096, 8192, FILL_RANDOM},
                              {5 * MiB + 100, MiB, FILL_TEXT},
                              {7 * MiB, MiB, FILL_ZERO}};
    gen_file(src, 8 * MiB + 5, e3, 4, 4);
    roundtrip("crossing-frames", src, MiB, false);
    roundtrip("crossing-frames-keep-zero", src, MiB, true);

    /* Zero pages are holes in the output: an all-zero allocated extent costs nothing. */
    {
        struct gen_extent ez[] = {{0, 4 * MiB, FILL_ZERO}, {5 * MiB, 4096, FILL_RANDOM}};
        gen_file(src, 6 * MiB, ez, 2, 5);
        struct membuf_sink m;
        struct vmsnap_image_stats st;
        pack_to_mem(src, 2, 0, false, &m, &st);
        CHECKF(st.populated == 4096 && st.zero_elided == 4 * MiB,
               "zero elision: populated %llu, elided %llu", (unsigned long long)st.populated,
               (unsigned long long)st.zero_elided);
        membuf_sink_free(&m);
        pack_to_mem(src, 2, 0, true, &m, &st);
        CHECKF(st.populated == 4 * MiB + 4096 && st.zero_elided == 0,
               "--keep-zero-pages: populated %llu", (unsigned long long)st.populated);
        membuf_sink_free(&m);
    }

    long_matches(src, 1, MiB - 4096 - 100);
    long_matches(src, 3, 3 * MiB / 2 - 100);

    /* Randomised layouts. */
    for (int i = 0; i < 14; i++) {
        uint64_t size = 1 + t_rand(&rng) % (24 * MiB);
        struct gen_extent ext[40];
        size_t n = gen_random_layout(&rng, size, ext, 1 + t_rand(&rng) % 40, i % 2);
        gen_file(src, size, ext, n, t_rand(&rng));
        char label[64];
        snprintf(label, sizeof(label), "random-%d", i);
        uint64_t fs = (i % 3 == 0) ? 0 : MiB * (1 + t_rand(&rng) % 3);
        roundtrip(label, src, fs, i % 5 == 4);
    }

    /* A 1 TiB logical file with a few MiB of data. */
    {
        const uint64_t TiB = 1ull << 40;
        struct gen_extent eb[] = {{0, MiB, FILL_TEXT},
                                  {TiB / 2 + 12345, 2 * MiB, FILL_RANDOM},
                                  {TiB - MiB, MiB, FILL_MIXED}};
        int fd = open(src, O_CREAT | O_TRUNC | O_WRONLY, 0600);
        REQUIRE(fd >= 0);
        int trc = ftruncate(fd, (off_t)TiB);
        close(fd);
        if (trc != 0)
            t_skip("the test filesystem cannot hold a 1 TiB sparse file");
        gen_file(src, TiB, eb, 3, 6);
        roundtrip("1TiB-sparse", src, 0, false);
    }
    free(src);
    return t_done();
}
