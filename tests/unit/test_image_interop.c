/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Interop with the reference system's sparse-extent format, version 2:
 *  - a minimal reader written with plain libzstd streaming, knowing only the documented
 *    layout (no frames, no seek table), decodes vmsnap's multi-frame output (ref_read_sparse in
 *    img_util.c, shared with test_image_delta.c);
 *  - vmsnap decodes single-stream objects built the way the reference writer builds them;
 *  - vmsnap decodes plain zstd objects of a whole file, leaving all-zero 64 KiB blocks as holes.
 */
#include "img_util.h"

#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#define MiB (1ull << 20)

static int64_t rd64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return (int64_t)v;
}

/* Build an object the way the reference writer does: SEEK_DATA/SEEK_HOLE walk, one zstd stream
 * at the fastest level, no content size, no skippable frames. */
static void reference_write(const char *src, const char *dst, bool two_frames)
{
    int fd = open(src, O_RDONLY);
    REQUIRE(fd >= 0);
    off_t size = lseek(fd, 0, SEEK_END);
    size_t cap = (size_t)size + 1024 * 1024, len = 0;
    uint8_t *content = malloc(cap);
    REQUIRE(content != NULL);
#define PUT64(v)                                                                                   \
    do {                                                                                           \
        uint64_t _v = (uint64_t)(v);                                                               \
        for (int _i = 0; _i < 8; _i++)                                                             \
            content[len++] = (uint8_t)(_v >> (8 * _i));                                            \
    } while (0)
    PUT64(size);
    off_t pos = 0;
    for (;;) {
        off_t d = lseek(fd, pos, SEEK_DATA);
        if (d < 0)
            break;
        off_t h = lseek(fd, d, SEEK_HOLE);
        PUT64(d);
        PUT64(h - d);
        REQUIRE(pread(fd, content + len, (size_t)(h - d), d) == h - d);
        len += (size_t)(h - d);
        pos = h;
    }
    PUT64(-1);
    close(fd);
    size_t ocap = ZSTD_compressBound(len) + 64;
    uint8_t *o = malloc(ocap);
    memcpy(o, "ATESPRSE\x02\x00\x00\x00", 12);
    size_t olen = 12;
    ZSTD_CCtx *cc = ZSTD_createCCtx();
    ZSTD_CCtx_setParameter(cc, ZSTD_c_compressionLevel, 1);
    /* Stream it in pieces, without a pledged size, as a streaming writer does; optionally end
     * the frame in the middle of a record so a second frame continues it. */
    size_t cut = two_frames ? len / 2 + 3 : len;
    size_t in_pos = 0;
    for (int part = 0; part < (two_frames ? 2 : 1); part++) {
        size_t end = part == 0 ? cut : len;
        while (in_pos < end) {
            size_t n = end - in_pos < 100000 ? end - in_pos : 100000;
            ZSTD_inBuffer in = {content + in_pos, n, 0};
            ZSTD_EndDirective mode = in_pos + n == end ? ZSTD_e_end : ZSTD_e_continue;
            size_t r;
            do {
                ZSTD_outBuffer out = {o + olen, ocap - olen, 0};
                r = ZSTD_compressStream2(cc, &out, &in, mode);
                REQUIRE(!ZSTD_isError(r));
                olen += out.pos;
            } while (mode == ZSTD_e_end ? r != 0 : in.pos < in.size);
            in_pos += n;
        }
    }
    ZSTD_freeCCtx(cc);
    write_file(dst, o, olen);
    free(o);
    free(content);
}

static bool unpack(const char *src, const char *dst, struct vmsnap_image_stats *st)
{
    struct vmsnap_err err = {0};
    int rc = vmsnap_image_unpack(src, dst, NULL, st, &err);
    if (rc < 0)
        fprintf(stderr, "unpack %s: %s\n", src, err.msg);
    return rc == 0;
}

/* `image_interop --read OBJ DST`: the reference reader alone, over an object file (the
 * integration tests check what `vmsnap export` writes with it). */
static int read_main(const char *obj, const char *dst)
{
    int fd = open(obj, O_RDONLY);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) < 0) {
        perror(obj);
        return 1;
    }
    uint8_t *b = malloc((size_t)sb.st_size + 1);
    bool ok = b && read(fd, b, (size_t)sb.st_size) == sb.st_size &&
              ref_read_sparse(b, (size_t)sb.st_size, dst);
    close(fd);
    free(b);
    return ok ? 0 : 1;
}

int main(int argc, char **argv)
{
    if (argc == 4 && !strcmp(argv[1], "--read"))
        return read_main(argv[2], argv[3]);
    char *src = strdup(t_path("src"));
    char *obj = strdup(t_path("obj"));
    char *out = strdup(t_path("out"));
    uint64_t rng = 77;

    /* 1. The reference reader decodes vmsnap output (many frames, info frame, seek table). */
    for (int i = 0; i < 6; i++) {
        uint64_t size = 1 + t_rand(&rng) % (20 * MiB);
        struct gen_extent ext[30];
        size_t n = gen_random_layout(&rng, size, ext, 30, i % 2);
        gen_file(src, size, ext, n, t_rand(&rng));
        struct membuf_sink m;
        struct vmsnap_image_stats st;
        pack_to_mem(src, 2, MiB, false, &m, &st);
        CHECKF(st.frames > 1 || size < 2 * MiB, "case %d: expected several frames", i);
        CHECKF(ref_read_sparse(m.data, m.len, out), "case %d: reference reader failed", i);
        CHECKF(t_files_equal(src, out), "case %d: reference reader output differs", i);
        /* every zstd frame carries its content checksum (the encoder appends it itself), and a
         * reader that checks it (libzstd does, by default) fails when one is wrong */
        size_t p = 12, data_frames = 0, last_sum = 0;
        while (p < m.len) {
            size_t fl = ZSTD_findFrameCompressedSize(m.data + p, m.len - p);
            REQUIRE(!ZSTD_isError(fl));
            uint32_t magic = (uint32_t)rd64(m.data + p) & 0xffffffffu;
            if ((magic & 0xfffffff0u) != 0x184D2A50u) {
                CHECKF(m.data[p + 4] & 0x04, "case %d: frame at byte %zu has no checksum", i, p);
                data_frames++;
                last_sum = p + fl - 1;
            }
            p += fl;
        }
        CHECKF(data_frames >= 2, "case %d: %zu data frames", i, data_frames);
        m.data[last_sum] ^= 1;
        CHECKF(!ref_read_sparse(m.data, m.len, out), "case %d: a wrong checksum went unnoticed", i);
        membuf_sink_free(&m);
    }

    /* 2. vmsnap decodes reference-writer objects (one frame; and a stream cut into two frames
     *    mid-record), sparse, with zero pages kept as the reference writer keeps them. */
    {
        struct gen_extent ext[] = {{MiB, 3 * MiB, FILL_MIXED},
                                   {6 * MiB + 10, 5000, FILL_RANDOM},
                                   {9 * MiB, MiB, FILL_TEXT}};
        gen_file(src, 11 * MiB + 3, ext, 3, 9);
        for (int two = 0; two < 2; two++) {
            reference_write(src, obj, two);
            struct vmsnap_image_stats st;
            CHECKF(unpack(obj, out, &st), "reference object (two frames: %d)", two);
            CHECKF(t_files_equal(src, out), "reference object decoded wrong (two frames: %d)", two);
            CHECKF(!st.has_seek_table && !st.plain_zstd, "reference object misdetected");
            CHECKF(t_allocated(out) <= 6 * MiB, "reference object output not sparse (%llu)",
                   (unsigned long long)t_allocated(out));
        }
        /* through stdin with the CLI too */
        CHECK(t_sh("'%s' -q unpack -f - '%s' < '%s'", getenv("VMSNAP_BIN"), out, obj) == 0);
        CHECK(t_files_equal(src, out));

        /* skippable frames of others, with the magics vmsnap uses too (0x184D2A5E is also
         * zstd's seekable format's): the reference reader skips them all, and so does vmsnap
         * (it took them for its own info frame and seek table and refused the object) */
        reference_write(src, obj, false);
        size_t olen;
        uint8_t *o = t_read_file(obj, &olen);
        REQUIRE(o && olen > 12);
        uint8_t *b = calloc(1, olen + 256);
        REQUIRE(b);
        size_t bl = 12;
        memcpy(b, o, 12);
        const uint32_t skips[][2] = {{0x184D2A5Du, 23}, /* where an info frame goes */
                                     {0x184D2A5Eu, 9},
                                     {0x184D2A5Du, 16},
                                     {0x184D2A5Eu, 77}};
        for (int k = 0; k < 4; k++) {
            if (k == 1) { /* the data frames after the first, the others at the end */
                memcpy(b + bl, o + 12, olen - 12);
                bl += olen - 12;
            }
            for (int j = 0; j < 4; j++)
                b[bl + j] = (uint8_t)(skips[k][0] >> (8 * j));
            for (int j = 0; j < 4; j++)
                b[bl + 4 + j] = (uint8_t)(skips[k][1] >> (8 * j));
            bl += 8 + skips[k][1]; /* content: zeros */
        }
        write_file(obj, b, bl);
        struct vmsnap_image_stats st;
        CHECKF(unpack(obj, out, &st), "reference object with others' skippable frames refused");
        CHECK(t_files_equal(src, out));
        CHECK(t_sh("'%s' -q unpack -f - '%s' < '%s'", getenv("VMSNAP_BIN"), out, obj) == 0);
        CHECK(t_files_equal(src, out));
        /* another writer's skippable frame of an info frame's size (24 bytes) and magic
         * (0x184D2A5D) right after the header, holding anything but "VMSNINFO": not vmsnap's
         * info frame (which is told by that signature), skipped as every zstd reader skips it
         * (it was refused as a damaged info frame) */
        for (int fill = 0; fill < 2; fill++) {
            memcpy(b, o, 12);
            const uint8_t head[8] = {0x5d, 0x2a, 0x4d, 0x18, 24, 0, 0, 0};
            memcpy(b + 12, head, 8);
            memset(b + 20, fill ? 'V' : 0, 24); /* "VVVV...": close to, not, the signature */
            memcpy(b + 44, o + 12, olen - 12);
            write_file(obj, b, olen + 32);
            CHECKF(unpack(obj, out, &st),
                   "reference object with another writer's 24-byte 0x184D2A5D frame refused");
            CHECK(t_files_equal(src, out));
            CHECKF(!st.has_seek_table && !st.plain_zstd, "misdetected");
            CHECKF(t_sh("'%s' -q unpack -f - '%s' < '%s'", getenv("VMSNAP_BIN"), out, obj) == 0,
                   "the same through stdin refused");
            CHECK(t_files_equal(src, out));
        }
        free(b);
        free(o);
    }

    /* 3. Plain zstd of a whole file (libzstd one-shot, and the zstd CLI): decoded sparse. */
    {
        struct gen_extent ext[] = {{0, 300000, FILL_TEXT}, {4 * MiB, 70000, FILL_RANDOM}};
        gen_file(src, 8 * MiB + 1, ext, 2, 10);
        size_t len;
        uint8_t *raw = t_read_file(src, &len);
        REQUIRE(raw && len == 8 * MiB + 1);
        size_t cap = ZSTD_compressBound(len);
        uint8_t *z = malloc(cap);
        size_t zl = ZSTD_compress(z, cap, raw, len, 3);
        REQUIRE(!ZSTD_isError(zl));
        write_file(obj, z, zl);
        struct vmsnap_image_stats st;
        CHECK(unpack(obj, out, &st));
        CHECK(st.plain_zstd && st.total_size == len);
        CHECK(t_files_equal(src, out));
        CHECKF(t_allocated(out) <= 600 * 1024, "plain zstd output not sparse: %llu bytes",
               (unsigned long long)t_allocated(out));
        free(z);
        free(raw);
        /* sizes that end a frame exactly at a 64 KiB output block (the decoder reported such a
         * stream truncated: nearly every memory or disk image), an empty file, and several
         * frames back to back (pzstd's output), one ending at a block boundary */
        const uint64_t sizes[] = {0, 64 * 1024, 8 * MiB, 3 * 64 * 1024 + 5};
        for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
            struct gen_extent e1[] = {{0, sizes[k] / 2, FILL_RANDOM}};
            gen_file(src, sizes[k], e1, sizes[k] ? 1 : 0, 11);
            raw = t_read_file(src, &len);
            REQUIRE(raw || len == 0);
            size_t first = k == 3 ? 2 * 64 * 1024 : len; /* the last: two frames */
            cap = ZSTD_compressBound(len) + 64;
            z = malloc(cap);
            REQUIRE(z);
            zl = ZSTD_compress(z, cap, raw, first, 1);
            REQUIRE(!ZSTD_isError(zl));
            if (first < len) {
                size_t z2 = ZSTD_compress(z + zl, cap - zl, raw + first, len - first, 1);
                REQUIRE(!ZSTD_isError(z2));
                zl += z2;
            }
            write_file(obj, z, zl);
            CHECKF(unpack(obj, out, &st), "plain zstd of %llu bytes", (unsigned long long)len);
            CHECK(t_files_equal(src, out));
            CHECK(t_sh("'%s' -q unpack -f - '%s' < '%s'", getenv("VMSNAP_BIN"), out, obj) == 0);
            CHECK(t_files_equal(src, out));
            free(z);
            free(raw);
        }
        /* a 0-byte object: the plain zstd of an empty file as older writers store it
         * (klauspost/compress 1.15 without zero frames writes no frame at all), an empty file
         * to the reference reader (a zstd stream decoder): an empty file here too, from a file
         * and from stdin, over an existing destination (it was refused as "empty input") */
        write_file(obj, "", 0);
        write_file(out, "old", 3);
        CHECKF(unpack(obj, out, &st), "a 0-byte object refused");
        struct stat sb;
        CHECKF(stat(out, &sb) == 0 && sb.st_size == 0,
               "a 0-byte object did not give an empty file");
        CHECK(st.plain_zstd && st.total_size == 0 && st.populated == 0 && st.object_size == 0);
        write_file(out, "old", 3);
        CHECKF(t_sh("'%s' -q unpack -f - '%s' < '%s'", getenv("VMSNAP_BIN"), out, obj) == 0,
               "a 0-byte stdin refused");
        CHECKF(stat(out, &sb) == 0 && sb.st_size == 0, "a 0-byte stdin did not give an empty file");
        struct vmsnap_err ierr = {0};
        CHECKF(vmsnap_image_inspect(obj, true, 1, 0, &st, &ierr) == 0, "inspect of 0 bytes: %s",
               ierr.msg);
        CHECK(st.plain_zstd && st.total_size == 0 && st.frames == 0);
        if (t_sh("command -v zstd >/dev/null") != 0)
            t_skip("zstd CLI not installed (scripts/deps.sh installs it)");
        CHECK(t_sh("zstd -q -T0 -f '%s' -o '%s'", src, obj) == 0);
        CHECK(unpack(obj, out, &st));
        CHECK(t_files_equal(src, out));
        CHECK(t_sh("'%s' -q unpack -f - '%s' < '%s'", getenv("VMSNAP_BIN"), out, obj) == 0);
        CHECK(t_files_equal(src, out));
    }
    free(src);
    free(obj);
    free(out);
    return t_done();
}
