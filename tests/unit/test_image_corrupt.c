/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Corrupt input through the CLI: objects truncated at every frame boundary and at random
 * points, random bytes flipped, forged extents (out of range, overlapping, descending, negative,
 * no sentinel, data after it, totalSize over the cap), forged seek tables with valid checksums.
 * Every case must exit 1 with a message, and leave nothing at (or beside) the destination.
 */
#include "img_util.h"
#include "image/image_int.h"
#include "util/util.h"

#include <dirent.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>
#include <zstd.h>

#define MiB (1ull << 20)

static const char *bin;
static int cases;

/* Nothing named like the destination, or its temporary, may remain in the directory. */
static bool dest_clean(void)
{
    DIR *d = opendir(t_tmpdir());
    REQUIRE(d != NULL);
    bool clean = true;
    struct dirent *de;
    while ((de = readdir(d)))
        if (strstr(de->d_name, "dst"))
            clean = false;
    closedir(d);
    return clean;
}

/* Run unpack on `bad` (a file, or through stdin); it must fail cleanly. */
static void expect_reject(const char *what, const uint8_t *data, size_t len, bool via_stdin,
                          const char *extra, const char *want_msg)
{
    const char *bad = t_path("bad");
    const char *dst = t_path("dst");
    const char *errf = t_path("stderr");
    write_file(bad, data, len);
    int rc = via_stdin ? t_sh("'%s' unpack -f %s - '%s' < '%s' 2>'%s'", bin, extra, dst, bad, errf)
                       : t_sh("'%s' unpack -f %s '%s' '%s' 2>'%s'", bin, extra, bad, dst, errf);
    size_t el = 0;
    uint8_t *msg = t_read_file(errf, &el);
    cases++;
    CHECKF(rc == 6, "%s: exit %d, want 6, corrupt (%.*s)", what, rc, (int)el,
           msg ? (char *)msg : "");
    CHECKF(el > 0, "%s: no error message", what);
    if (msg && el > 0 && want_msg)
        CHECKF(memmem(msg, el, want_msg, strlen(want_msg)) != NULL, "%s: message lacks '%s': %.*s",
               what, want_msg, (int)el, (char *)msg);
    CHECKF(dest_clean(), "%s: something was left at the destination", what);
    unlink(dst);
    free(msg);
    unlink(bad);
}

static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* A reference-style single-stream object from raw content words and bytes. */
static size_t forge(uint8_t *out, size_t cap, const uint8_t *content, size_t clen)
{
    memcpy(out, "ATESPRSE\x02\x00\x00\x00", 12);
    size_t n = ZSTD_compress(out + 12, cap - 12, content, clen, 1);
    REQUIRE(!ZSTD_isError(n));
    return n + 12;
}

struct forged {
    const char *what, *msg;
    int64_t words[12];
    int nwords;
    const char *extra;
};

static void forged_extents(void)
{
    /* Each record's data is 8 bytes of 'x' (written after the len word). */
    static const struct forged cases_[] = {
        {"extent beyond totalSize", "beyond totalSize", {4096, 5000, 8, -1}, 4, ""},
        {"extent running past totalSize", "runs past totalSize", {4096, 4090, 8, -1}, 4, ""},
        {"overlapping extents", "overlaps", {8192, 0, 8, 4, 8, -1}, 6, ""},
        {"descending extents", "overlaps or precedes", {8192, 100, 8, 50, 8, -1}, 6, ""},
        {"negative length", "negative extent length", {8192, 0, -8, -1}, 4, ""},
        {"negative offset", "negative extent offset", {8192, -5, 8, -1}, 4, ""},
        {"negative totalSize", "negative totalSize", {-4096, 0, 8, -1}, 4, ""},
        {"missing sentinel", "sentinel", {8192, 0, 8}, 3, ""},
        {"totalSize over the cap", "exceeds the cap", {2 << 20, 0, 8, -1}, 4, "--max-size 1M"},
    };
    for (size_t c = 0; c < sizeof(cases_) / sizeof(cases_[0]); c++) {
        const struct forged *f = &cases_[c];
        uint8_t content[256];
        size_t cl = 0;
        for (int i = 0; i < f->nwords; i++) {
            put64(content + cl, (uint64_t)f->words[i]);
            cl += 8;
            /* after a len word (odd positions >= 2), 8 data bytes when len is positive */
            if (i >= 2 && i % 2 == 0 && f->words[i] > 0) {
                memset(content + cl, 'x', 8);
                cl += 8;
            }
        }
        uint8_t obj[1024];
        size_t ol = forge(obj, sizeof(obj), content, cl);
        expect_reject(f->what, obj, ol, false, f->extra, f->msg);
        expect_reject(f->what, obj, ol, true, f->extra, f->msg);
    }
    /* Data after the sentinel. */
    uint8_t content[64];
    put64(content, 8192);
    put64(content + 8, (uint64_t)-1);
    put64(content + 16, 77);
    uint8_t obj[256];
    size_t ol = forge(obj, sizeof(obj), content, 24);
    expect_reject("data after the sentinel", obj, ol, false, "", "after the end-of-extents");
    /* Wrong version, bad magic. */
    uint8_t v1[64];
    memcpy(v1, obj, ol);
    v1[8] = 1;
    expect_reject("version 1", v1, ol, false, "", "version 1");
    memcpy(v1, "GARBAGE!", 8);
    expect_reject("bad magic", v1, ol, false, "", "bad magic");
    expect_reject("bad magic, 4 bytes", v1, 4, false, "", "bad magic");
    expect_reject("3 bytes", (const uint8_t *)"\x28\xb5\x2f", 3, true, "", "too short");
    /* (a 0-byte input is an empty file's plain zstd: test_image_interop.c) */
}

/* Rewrite entry `i` of the seek table with `mutate`, recompute the table checksum. */
static void forge_table_msg(const uint8_t *obj, size_t len, uint32_t entry, int field,
                            uint64_t value, const char *what, const char *want_file,
                            const char *want_stdin)
{
    uint8_t *o = malloc(len);
    memcpy(o, obj, len);
    uint32_t tsize = get_le32(o + len - SEEK_FOOTER_LEN + 12);
    uint8_t *h = o + len - tsize + 8;
    uint32_t n = get_le32(h + 56);
    REQUIRE(entry < n);
    put64(h + SEEK_HDR_LEN + entry * SEEK_ENTRY_LEN + field * 8, value);
    put64(o + len - SEEK_FOOTER_LEN, XXH64(h, SEEK_HDR_LEN + (size_t)n * SEEK_ENTRY_LEN, 0));
    expect_reject(what, o, len, false, "", want_file);
    /* the sequential decoder (stdin) meets the table last and must refuse the same forgery */
    char w2[200];
    snprintf(w2, sizeof(w2), "%s (through stdin)", what);
    expect_reject(w2, o, len, true, "", want_stdin);
    free(o);
}

static void forge_table(const uint8_t *obj, size_t len, uint32_t entry, int field, uint64_t value,
                        const char *what)
{
    forge_table_msg(obj, len, entry, field, value, what, "corrupt image", "corrupt image");
}

int main(void)
{
    bin = getenv("VMSNAP_BIN");
    if (!bin)
        t_skip("VMSNAP_BIN not set (run under ctest)");
    uint64_t rng = 4242;
    char *src = strdup(t_path("src"));
    char *obj = strdup(t_path("obj"));

    for (int o = 0; o < 3; o++) {
        uint64_t size = 3 * MiB + t_rand(&rng) % (6 * MiB);
        struct gen_extent ext[12];
        size_t n = gen_random_layout(&rng, size, ext, 12, o == 1);
        gen_file(src, size, ext, n, t_rand(&rng));
        REQUIRE(t_sh("'%s' -q pack -f --frame-size 1M '%s' '%s'", bin, src, obj) == 0);
        size_t len;
        uint8_t *data = t_read_file(obj, &len);
        REQUIRE(data != NULL);
        int fd = open(obj, O_RDONLY);
        struct vmsnap_source s;
        vmsnap_source_fd(&s, fd, len, obj);
        struct vmsnap_image *img = NULL;
        struct vmsnap_err err = {0};
        REQUIRE(vmsnap_image_open(&s, 0, &img, &err) == 1);
        close(fd);

        /* Cut at every frame boundary, inside the header, and at random points. */
        uint32_t nf = vmsnap_image_frame_count(img);
        for (uint32_t i = 0; i < nf; i++) {
            struct vmsnap_frame_info fi;
            vmsnap_image_frame(img, i, &fi);
            char what[64];
            snprintf(what, sizeof(what), "object %d cut at frame %u (byte %llu)", o, i,
                     (unsigned long long)fi.offset);
            expect_reject(what, data, fi.offset, false, "", "truncated");
            expect_reject(what, data, fi.offset, true, "", "truncated");
            if (i == nf - 1) {
                snprintf(what, sizeof(what), "object %d cut before the seek table", o);
                expect_reject(what, data, fi.offset + fi.csize, false, "", "seek table");
            }
        }
        for (size_t cut = 1; cut < 40; cut += 7)
            expect_reject("cut in the header", data, cut, false, "", NULL);
        for (int r = 0; r < 25; r++) {
            size_t cut = 1 + t_rand(&rng) % (len - 1);
            char what[64];
            snprintf(what, sizeof(what), "object %d cut at byte %zu", o, cut);
            expect_reject(what, data, cut, r % 2, "", NULL);
        }
        /* Flip bytes: random positions, plus every byte of the table's last 40 and the head. */
        uint8_t *m = malloc(len);
        for (int r = 0; r < 70; r++) {
            size_t pos = r < 20 ? (r < 10 ? (size_t)r * 4 : len - 1 - (size_t)(r - 10) * 4)
                                : t_rand(&rng) % len;
            memcpy(m, data, len);
            m[pos] ^= (uint8_t)(1 + t_rand(&rng) % 255);
            char what[64];
            snprintf(what, sizeof(what), "object %d byte %zu flipped", o, pos);
            expect_reject(what, m, len, r % 3 == 0, "", "corrupt image");
        }
        /* the info frame's magic turned into another skippable magic (0x5D -> 0x5C, 0x5E):
         * still vmsnap's by its content, so damage, not someone else's frame to skip (which
         * also skipped the seek table unchecked), through a pipe as from the file */
        for (int x = 1; x <= 3; x += 2) {
            memcpy(m, data, len);
            m[12] ^= (uint8_t)x;
            char what[64];
            snprintf(what, sizeof(what), "object %d info magic ^ %d", o, x);
            expect_reject(what, m, len, true, "", "corrupt image");
            expect_reject(what, m, len, false, "", "corrupt image");
        }
        free(m);

        /* Forged seek tables that carry valid checksums. */
        /* the data frame with the most data, so a 4 KiB range cannot hold its records */
        struct vmsnap_frame_info f1 = {0};
        uint32_t big = 1;
        for (uint32_t i = 1; i + 1 < nf; i++) {
            struct vmsnap_frame_info fi;
            vmsnap_image_frame(img, i, &fi);
            if (fi.populated > f1.populated) {
                f1 = fi;
                big = i;
            }
        }
        REQUIRE(f1.populated > 8192);
        forge_table(data, len, big, 3, f1.src_start + 4096, "frame range shrunk under its records");
        forge_table(data, len, big, 2, f1.src_end - 4096, "frame range moved past its records");
        forge_table(data, len, big, 0, f1.csize + 1, "compressed size off by one");
        forge_table(data, len, big, 1, f1.dsize + 16, "decoded size off by a record");
        forge_table(data, len, big, 4, f1.populated - 1, "populated bytes off by one");
        forge_table(data, len, big, 5, f1.checksum ^ 1, "content checksum changed");
        /* the frame's zstd checksum field wrong, its compressed XXH64 in the table made to
         * match: zstd readers refuse it, so must unpack (which leaves that check to itself) */
        {
            uint8_t *z = malloc(len);
            REQUIRE(z != NULL);
            memcpy(z, data, len);
            z[f1.offset + f1.csize - 1] ^= 0x40;
            forge_table(z, len, big, 6, XXH64(z + f1.offset, f1.csize, 0),
                        "zstd checksum field wrong");
            free(z);
        }
        /* 64 KiB of padding after the sentinel frame's bytes, its compressed size grown to
         * match: every offset stays consistent, but no encoder makes an 8-byte frame that large
         * (a pull would allocate the declared size before it could tell) */
        {
            struct vmsnap_frame_info fs;
            vmsnap_image_frame(img, nf - 1, &fs);
            const size_t pad = 64 * 1024, at = (size_t)(fs.offset + fs.csize);
            uint8_t *p = calloc(1, len + pad);
            REQUIRE(p != NULL);
            memcpy(p, data, at);
            memcpy(p + at + pad, data + at, len - at);
            uint32_t tsize = get_le32(p + len + pad - SEEK_FOOTER_LEN + 12);
            uint8_t *h = p + len + pad - tsize + 8;
            uint32_t nt = get_le32(h + 56);
            put64(h + SEEK_HDR_LEN + (nf - 1) * SEEK_ENTRY_LEN, fs.csize + pad);
            put64(h + 48, get_le64(h + 48) + pad); /* the frames' end */
            put64(p + len + pad - SEEK_FOOTER_LEN,
                  XXH64(h, SEEK_HDR_LEN + (size_t)nt * SEEK_ENTRY_LEN, 0));
            expect_reject("a frame padded past any compressed size", p, len + pad, false, "",
                          "exceeds the bound");
            free(p);
        }
        vmsnap_image_free(img);
        free(data);
    }
    /* A table whose totalSize is smaller than frame 0's, over a tail that is a hole (no frame
     * past it): damage, not the --max-size policy it was reported as ("raise it") */
    {
        struct gen_extent ext[] = {{0, 8192, FILL_RANDOM}};
        gen_file(src, 16 * MiB, ext, 1, 98);
        REQUIRE(t_sh("'%s' -q pack -f --frame-size 1M '%s' '%s'", bin, src, obj) == 0);
        size_t len;
        uint8_t *o = t_read_file(obj, &len);
        REQUIRE(o != NULL);
        uint32_t tsize = get_le32(o + len - SEEK_FOOTER_LEN + 12);
        uint8_t *h = o + len - tsize + 8;
        uint32_t nt = get_le32(h + 56);
        put64(h + 8, 8 * MiB);
        put64(h + SEEK_HDR_LEN + (nt - 1) * SEEK_ENTRY_LEN + 16, 8 * MiB); /* the sentinel's */
        put64(h + SEEK_HDR_LEN + (nt - 1) * SEEK_ENTRY_LEN + 24, 8 * MiB); /* place */
        put64(o + len - SEEK_FOOTER_LEN, XXH64(h, SEEK_HDR_LEN + (size_t)nt * SEEK_ENTRY_LEN, 0));
        expect_reject("table totalSize under frame 0's", o, len, false, "",
                      "totalSize 16777216 disagrees with the seek table");
        free(o);
    }
    /* A table whose ranges are self-consistent but that fences records out: data at both ends
     * of the first 1 MiB range, the range's end pulled in by 4 KiB. */
    {
        struct gen_extent ext[] = {{0, 8192, FILL_RANDOM}, {MiB - 8192, 8192, FILL_RANDOM}};
        gen_file(src, 2 * MiB, ext, 2, 99);
        REQUIRE(t_sh("'%s' -q pack -f --frame-size 1M '%s' '%s'", bin, src, obj) == 0);
        size_t len;
        uint8_t *data = t_read_file(obj, &len);
        REQUIRE(data != NULL);
        forge_table_msg(data, len, 1, 3, MiB - 4096, "record outside its frame's range",
                        "past its frame's range", "outside its source range");
        free(data);
    }
    forged_extents();
    fprintf(stderr, "%d corrupt objects rejected\n", cases);
    free(src);
    free(obj);
    return t_done();
}
