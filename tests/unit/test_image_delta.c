/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Delta layers (#23): page tables (vmsnap_pages_*), delta encodes (vmsnap_pack_opts.delta_parent,
 * pages_out) and overlay decodes (vmsnap_unpack_opts.overlay).
 *  1. page tables of files with holes, zero pages and a partial last page, against hashes
 *     computed here; 1 and 4 threads; diff counts; 8 bytes per page;
 *  2. the serialised table: round trips, and every field, truncation and trailing bytes refused;
 *  3. on tmpfs and on a disk directory: a parent packed whole, then files changed from it
 *     (pages changed, zeroed, punched, added, the file grown and shrunk), each packed as a delta
 *     over the parent's pages_out and applied with overlay onto the decoded parent, by the
 *     parallel decoder, the sequential one (fed in odd pieces) and frame by frame: bytes and hole
 *     map (SEEK_DATA/SEEK_HOLE) equal the source's; the delta alone decodes, with vmsnap's
 *     decoders and the reference reader, to exactly its changed pages; 1 and 4 threads give the
 *     same bytes; pages_out equals vmsnap_pages_hash_fd; a chain of 8 deltas;
 *  4. refusals (with a base, with keep_zero_pages) and a delta of an unchanged file (no data).
 */
#include "img_util.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <malloc.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>
#include <xxhash.h>
#include <zstd.h>

#define MiB (1ull << 20)
#define PG 4096ull
#define MIN(a, b) ((a) < (b) ? (a) : (b))

static uint64_t rng = 0xde17a5eedull;

/* Under ASan malloc is the sanitizer's and mallinfo2 says nothing. */
#if defined(__SANITIZE_ADDRESS__)
#define ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ASAN 1
#endif
#endif

/* ---- helpers ---- */

static uint64_t ref_hash(const uint8_t *p, size_t len)
{
    for (size_t i = 0; i < len; i++)
        if (p[i]) {
            uint64_t h = XXH3_64bits(p, len);
            return h ? h : 1; /* the rule for a real hash of 0 (no input known to give one) */
        }
    return 0;
}

/* The page table of `path` computed here from its bytes, page by page. */
static struct vmsnap_pages *ref_table(const char *path)
{
    size_t len = 0;
    uint8_t *d = t_read_file(path, &len);
    REQUIRE(d || len == 0);
    struct vmsnap_pages *t = NULL;
    REQUIRE(vmsnap_pages_new(len, &t, NULL) == 0);
    for (uint64_t p = 0; p < t->npages; p++) {
        t->h[p] = ref_hash(d + p * PG, (size_t)(len - p * PG < PG ? len - p * PG : PG));
        t->populated += t->h[p] != 0;
    }
    free(d);
    return t;
}

static struct vmsnap_pages *hash_path(const char *path, unsigned threads)
{
    int fd = open(path, O_RDONLY);
    REQUIRE(fd >= 0);
    struct vmsnap_pages *t = NULL;
    struct vmsnap_err err = {0};
    int rc = vmsnap_pages_hash_fd(fd, path, threads, threads % 2, &t, &err);
    close(fd);
    if (rc < 0)
        fprintf(stderr, "hash %s: %s\n", path, err.msg);
    REQUIRE(rc == 0);
    return t;
}

static bool tables_equal(const struct vmsnap_pages *a, const struct vmsnap_pages *b)
{
    return a->size == b->size && a->npages == b->npages && a->populated == b->populated &&
           (!a->npages || !memcmp(a->h, b->h, a->npages * 8));
}

/* Pack `path` with a parent (NULL: full) into `m`; *pages: its pages_out (NULL: not asked). */
static int pack(const char *path, unsigned threads, uint64_t frame, const struct vmsnap_pages *par,
                struct vmsnap_pages **pages, struct membuf_sink *m, struct vmsnap_image_stats *st,
                struct vmsnap_err *err)
{
    struct vmsnap_sink sink;
    membuf_sink_init(m, &sink);
    int fd = open(path, O_RDONLY);
    REQUIRE(fd >= 0);
    struct vmsnap_pack_opts o = {.threads = threads,
                                 .frame_size = frame,
                                 .keep_cache = true,
                                 .delta_parent = par,
                                 .pages_out = pages};
    int rc = vmsnap_image_pack_fd(fd, path, &sink, &o, st, err);
    close(fd);
    return rc;
}

static void pack_ok(const char *path, unsigned threads, uint64_t frame,
                    const struct vmsnap_pages *par, struct vmsnap_pages **pages,
                    struct membuf_sink *m, struct vmsnap_image_stats *st)
{
    struct vmsnap_err err = {0};
    int rc = pack(path, threads, frame, par, pages, m, st, &err);
    if (rc < 0)
        fprintf(stderr, "pack %s: %s\n", path, err.msg);
    REQUIRE(rc == 0);
}

enum how { BY_UNPACK, BY_SEQ, BY_FRAME };

/* Decode `obj` into `dst` (overlay or not): through vmsnap_image_unpack (parallel, 2 threads),
 * the sequential decoder fed in pieces of `piece` bytes, or frame by frame with one decoder. */
static bool decode(const struct membuf_sink *obj, const char *dir, const char *dst, bool overlay,
                   enum how how, size_t piece)
{
    struct vmsnap_err err = {0};
    int rc;
    if (how == BY_UNPACK) {
        char op[600];
        snprintf(op, sizeof(op), "%s/obj", dir);
        write_file(op, obj->data, obj->len);
        struct vmsnap_unpack_opts o = {.threads = 2, .overlay = overlay};
        rc = vmsnap_image_unpack(op, dst, &o, NULL, &err);
    } else {
        int fd = open(dst, O_RDWR | O_CREAT | (overlay ? 0 : O_TRUNC), 0600);
        REQUIRE(fd >= 0);
        if (how == BY_SEQ) {
            struct vmsnap_seqdec *sd = NULL;
            REQUIRE(vmsnap_seqdec_new(fd, 0, "obj", &sd, &err) == 0);
            vmsnap_seqdec_set_overlay(sd, overlay);
            rc = 0;
            for (size_t p = 0; rc == 0 && p < obj->len; p += piece)
                rc = vmsnap_seqdec_feed(sd, obj->data + p,
                                        obj->len - p < piece ? obj->len - p : piece, &err);
            if (rc == 0)
                rc = vmsnap_seqdec_finish(sd, NULL, &err);
            vmsnap_seqdec_free(sd);
        } else {
            struct vmsnap_membuf mb = {obj->data, obj->len};
            struct vmsnap_source src;
            vmsnap_source_mem(&src, &mb, "obj");
            struct vmsnap_image *img = NULL;
            struct vmsnap_frame_decoder *dec = NULL;
            REQUIRE(vmsnap_image_open(&src, 0, &img, &err) == 1);
            REQUIRE(vmsnap_frame_decoder_new(&dec, &err) == 0);
            vmsnap_frame_decoder_set_overlay(dec, overlay);
            struct vmsnap_image_stats st;
            vmsnap_image_get_stats(img, &st);
            rc = ftruncate(fd, (off_t)st.total_size);
            for (uint32_t i = vmsnap_image_frame_count(img); rc == 0 && i-- > 0;) /* any order */
                rc = vmsnap_image_decode_frame_dec(img, i, &src, 0, fd, dec, NULL, &err);
            vmsnap_frame_decoder_free(dec);
            vmsnap_image_free(img);
        }
        close(fd);
    }
    if (rc < 0)
        fprintf(stderr, "decode into %s: %s\n", dst, err.msg);
    return rc == 0;
}

/* True when `path`'s data (SEEK_DATA/SEEK_HOLE) is exactly the pages `want` has not 0. */
static bool holes_match(const char *path, const struct vmsnap_pages *want)
{
    int fd = open(path, O_RDONLY);
    REQUIRE(fd >= 0);
    uint8_t *data = calloc(want->npages + 1, 1);
    REQUIRE(data);
    off_t pos = 0;
    for (;;) {
        off_t d = lseek(fd, pos, SEEK_DATA);
        if (d < 0)
            break;
        off_t h = lseek(fd, d, SEEK_HOLE);
        REQUIRE(h > d);
        for (uint64_t p = (uint64_t)d / PG; p < ((uint64_t)h + PG - 1) / PG && p < want->npages;
             p++)
            data[p] = 1;
        pos = h;
    }
    close(fd);
    bool ok = true;
    for (uint64_t p = 0; p < want->npages && ok; p++)
        if (data[p] != (want->h[p] != 0)) {
            fprintf(stderr, "%s: page %llu is %s, the source's is %s\n", path,
                    (unsigned long long)p, data[p] ? "data" : "a hole",
                    want->h[p] ? "not zero" : "zero");
            ok = false;
        }
    free(data);
    return ok;
}

/* ---- 1. page tables ---- */

static void test_tables(void)
{
    /* pages: 0 random, 1 hole, 2 zeros written, 3 text, 4 hole, 5 random with a zero tail,
     * 6 partial (100 bytes) */
    const char *f = t_path("pt");
    struct gen_extent ext[] = {{0, PG, FILL_RANDOM},
                               {2 * PG, PG, FILL_ZERO},
                               {3 * PG, PG, FILL_TEXT},
                               {5 * PG, 1000, FILL_RANDOM},
                               {6 * PG, 100, FILL_TEXT}};
    gen_file(f, 6 * PG + 100, ext, 5, 1);
    struct vmsnap_pages *ref = ref_table(f);
    struct vmsnap_pages *t1 = hash_path(f, 1), *t4 = hash_path(f, 4);
    CHECK(t1->size == 6 * PG + 100 && t1->npages == 7 && t1->populated == 4);
    CHECK(t1->h[1] == 0 && t1->h[2] == 0 && t1->h[4] == 0);
    CHECK(t1->h[0] && t1->h[3] && t1->h[5] && t1->h[6]);
    CHECK(t1->h[0] != t1->h[3] && t1->h[5] != t1->h[6]);
    CHECKF(tables_equal(t1, ref), "hashes differ from XXH3 of each page computed here");
    CHECK(tables_equal(t4, ref));

    /* a large sparse file: extents across the pass's 64 MiB chunks and at its end */
    const char *g = t_path("big");
    struct gen_extent big[] = {{64 * MiB - 3 * PG, 6 * PG, FILL_MIXED},
                               {100 * MiB + 17, 5000, FILL_RANDOM},
                               {130 * MiB - 100, 100, FILL_TEXT}};
    gen_file(g, 130 * MiB, big, 3, 2);
    struct vmsnap_pages *b1 = hash_path(g, 1), *b4 = hash_path(g, 4);
    struct vmsnap_pages *bref = ref_table(g);
    CHECK(tables_equal(b1, bref) && tables_equal(b4, bref));
    CHECK(bref->populated == 3 + 3); /* MIXED: 3 of 6 pages not zero; 2 + 1 pages */

    /* diff: hashes that differ, pages past the parent's end when not 0, and the holes among */
    struct vmsnap_pages *pa = NULL, *cu = NULL;
    REQUIRE(vmsnap_pages_new(4 * PG, &pa, NULL) == 0 && vmsnap_pages_new(6 * PG, &cu, NULL) == 0);
    const uint64_t ph[] = {5, 6, 0, 8}, ch[] = {5, 0, 0, 9, 0, 3};
    memcpy(pa->h, ph, sizeof(ph));
    memcpy(cu->h, ch, sizeof(ch));
    uint64_t holes = 99;
    CHECK(vmsnap_pages_diff(pa, cu, &holes) == 3 && holes == 1); /* pages 1 (hole), 3, 5 */
    CHECK(vmsnap_pages_diff(cu, cu, &holes) == 0 && holes == 0);
    CHECK(vmsnap_pages_diff(NULL, cu, NULL) == 3);

    /* not a regular file */
    struct vmsnap_pages *none = NULL;
    struct vmsnap_err err = {0};
    int dfd = open(t_tmpdir(), O_RDONLY | O_DIRECTORY);
    CHECK(vmsnap_pages_hash_fd(dfd, "a directory", 1, true, &none, &err) == -EINVAL && !none);
    CHECK(strstr(err.msg, "a directory") != NULL);
    close(dfd);

    /* memory: 8 bytes per page (a 4 GiB sparse file: 1M pages, 8 MiB), the table mapped at
     * once (calloc: untouched hole pages cost nothing resident) */
    CHECK(sizeof(*t1->h) == 8);
#ifndef ASAN
    const char *h4 = t_path("huge");
    struct gen_extent one[] = {{3 * (1ull << 30), PG, FILL_RANDOM}};
    gen_file(h4, 4ull << 30, one, 1, 3);
    struct mallinfo2 m0 = mallinfo2();
    struct vmsnap_pages *ht = hash_path(h4, 2);
    struct mallinfo2 m1 = mallinfo2();
    const size_t grew = (m1.hblkhd + m1.uordblks) - (m0.hblkhd + m0.uordblks);
    CHECKF(grew >= ht->npages * 8 && grew <= ht->npages * 8 + 64 * 1024,
           "table of %llu pages takes %zu bytes", (unsigned long long)ht->npages, grew);
    vmsnap_pages_free(ht);
    unlink(h4);
#endif
    vmsnap_pages_free(pa);
    vmsnap_pages_free(cu);
    vmsnap_pages_free(b1);
    vmsnap_pages_free(b4);
    vmsnap_pages_free(bref);
    vmsnap_pages_free(t1);
    vmsnap_pages_free(t4);
    vmsnap_pages_free(ref);
}

/* ---- 2. the serialised table ---- */

/* Decompress an encoded table. */
static uint8_t *unz(const void *buf, size_t len, size_t *out_len)
{
    unsigned long long n = ZSTD_getFrameContentSize(buf, len);
    REQUIRE(n != ZSTD_CONTENTSIZE_ERROR && n != ZSTD_CONTENTSIZE_UNKNOWN);
    uint8_t *c = malloc(n + 1);
    REQUIRE(c && ZSTD_decompress(c, n, buf, len) == n);
    *out_len = (size_t)n;
    return c;
}

/* Compress `content` as the encoder frames it (content size given unless `no_size`). */
static void *rez(const uint8_t *content, size_t n, bool no_size, size_t *len)
{
    size_t cap = ZSTD_compressBound(n) + 64;
    uint8_t *o = malloc(cap);
    REQUIRE(o);
    ZSTD_CCtx *cc = ZSTD_createCCtx();
    ZSTD_CCtx_setParameter(cc, ZSTD_c_contentSizeFlag, !no_size);
    ZSTD_CCtx_setParameter(cc, ZSTD_c_checksumFlag, 1);
    ZSTD_outBuffer ob = {o, cap, 0};
    ZSTD_inBuffer ib = {content, n, 0};
    REQUIRE(ZSTD_compressStream2(cc, &ob, &ib, ZSTD_e_end) == 0);
    ZSTD_freeCCtx(cc);
    *len = ob.pos;
    return o;
}

static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* The content `c` (n bytes) must be refused with `code`, its message holding `what`. */
static void refused(const uint8_t *c, size_t n, int code, const char *what, const char *label)
{
    size_t zl;
    void *z = rez(c, n, false, &zl);
    struct vmsnap_pages *t = NULL;
    struct vmsnap_err err = {0};
    int rc = vmsnap_pages_decode(z, zl, "s3://b/pages", 0, &t, &err);
    CHECKF(rc == -code && !t && strstr(err.msg, what) && strstr(err.msg, "s3://b/pages"),
           "%s: rc %d, message '%s' (wanted '%s')", label, rc, err.msg, what);
    vmsnap_pages_free(t);
    free(z);
}

static void test_serialised(void)
{
    const char *f = t_path("ser");
    struct gen_extent ext[] = {{PG, 3 * PG, FILL_MIXED}, {10 * PG, 10, FILL_TEXT}};
    gen_file(f, 10 * PG + 10, ext, 2, 4);
    struct vmsnap_pages *t = hash_path(f, 2), *e0 = NULL, *back = NULL;
    REQUIRE(vmsnap_pages_new(0, &e0, NULL) == 0);
    struct vmsnap_err err = {0};
    void *buf = NULL;
    size_t len = 0;
    /* round trips: a table, and that of an empty file */
    for (int k = 0; k < 2; k++) {
        const struct vmsnap_pages *src = k ? e0 : t;
        REQUIRE(vmsnap_pages_encode(src, &buf, &len, &err) == 0);
        CHECKF(vmsnap_pages_decode(buf, len, "x", 0, &back, &err) == 0, "%s", err.msg);
        CHECK(back && tables_equal(back, src));
        vmsnap_pages_free(back);
        back = NULL;
        if (k == 0)
            break;
    }
    size_t n;
    uint8_t *c = unz(buf, len, &n);
    REQUIRE(n == 48 + 8 * t->npages && !memcmp(c, "VMSNPAGE", 8));
    uint8_t *m = malloc(n + 16);
    REQUIRE(m);
#define MUT(stmt, code, what)                                                                      \
    do {                                                                                           \
        memcpy(m, c, n);                                                                           \
        size_t mn = n;                                                                             \
        stmt;                                                                                      \
        refused(m, mn, code, what, #stmt);                                                         \
    } while (0)
    MUT(m[3] ^= 1, EBADMSG, "magic");
    MUT(m[8] = 2, EBADMSG, "version 2");
    MUT(m[13] = 0x20, EBADMSG, "page size");
    MUT(put64(m + 16, t->size + PG), EBADMSG, "pages at byte 24");
    MUT(put64(m + 16, t->size - 11), EBADMSG, "pages at byte 24");
    MUT(put64(m + 16, UINT64_MAX), EBADMSG, "negative");
    MUT(put64(m + 24, t->npages + 1), EBADMSG, "pages at byte 24");
    MUT(put64(m + 32, t->populated + 1), EBADMSG, "populated says");
    MUT(put64(m + 32, t->npages + 1), EBADMSG, "populated pages at byte 32");
    MUT(m[40] ^= 1, EBADMSG, "checksum");
    MUT(m[48 + 8 * 1 + 3] ^= 0x10, EBADMSG, "checksum"); /* a hash */
    MUT(mn -= 8, EBADMSG, "content size");               /* the last hash missing */
    MUT((put64(m + n, 0), mn += 8), EBADMSG, "content size");
    MUT(mn = 40, EBADMSG, "shorter than the header");
    /* a hash made 0 with the checksum fixed: the populated count gives it away */
    MUT((put64(m + 48 + 8, 0), put64(m + 40, XXH64(m + 48, n - 48, 0))), EBADMSG, "populated says");
    /* a size cap given by the caller */
    CHECK(vmsnap_pages_decode(buf, len, "x", t->size - 1, &back, &err) == -EFBIG && !back);
    CHECK(vmsnap_pages_decode(buf, len, "x", t->size, &back, &err) == 0);
    vmsnap_pages_free(back);
    back = NULL;

    /* the frame: every truncation, trailing bytes, no content size, not zstd, flipped bytes */
    for (size_t k = 0; k < len; k++) {
        int rc = vmsnap_pages_decode(buf, k, "x", 0, &back, &err);
        CHECKF(rc == -EBADMSG && !back, "truncated to %zu of %zu bytes: rc %d", k, len, rc);
    }
    uint8_t *z = malloc(len + 4);
    REQUIRE(z);
    memcpy(z, buf, len);
    memcpy(z + len, "junk", 4);
    CHECK(vmsnap_pages_decode(z, len + 4, "x", 0, &back, &err) == -EBADMSG &&
          strstr(err.msg, "after the zstd frame"));
    for (size_t k = 0; k < len; k++) {
        memcpy(z, buf, len);
        z[k] ^= 0x41;
        int rc = vmsnap_pages_decode(z, len, "x", 0, &back, &err);
        CHECKF(rc == -EBADMSG || (rc == 0 && tables_equal(back, t)),
               "byte %zu flipped: rc %d, a different table accepted", k, rc);
        vmsnap_pages_free(back);
        back = NULL;
    }
    size_t nl;
    void *ns = rez(c, n, true, &nl);
    CHECK(vmsnap_pages_decode(ns, nl, "x", 0, &back, &err) == -EBADMSG &&
          strstr(err.msg, "without a content size"));
    CHECK(vmsnap_pages_decode("VMSNPAGE", 8, "x", 0, &back, &err) == -EBADMSG &&
          strstr(err.msg, "not a zstd frame"));
    /* encode refuses a table that does not add up */
    t->populated++;
    void *b2 = NULL;
    size_t l2 = 0;
    CHECK(vmsnap_pages_encode(t, &b2, &l2, &err) == -EINVAL && !b2);
    t->populated--;
    t->npages++;
    CHECK(vmsnap_pages_encode(t, &b2, &l2, &err) == -EINVAL && !b2);
    t->npages--;
#undef MUT
    free(ns);
    free(z);
    free(m);
    free(c);
    free(buf);
    vmsnap_pages_free(e0);
    vmsnap_pages_free(t);
}

/* ---- 3. deltas ---- */

static void copy_file(const char *from, const char *to)
{
    REQUIRE(t_sh("cp --sparse=always '%s' '%s'", from, to) == 0);
}

static void write_at(const char *path, uint64_t off, uint64_t len, enum fill_kind k)
{
    int fd = open(path, O_WRONLY);
    REQUIRE(fd >= 0);
    uint8_t *b = malloc(len);
    REQUIRE(b);
    for (uint64_t i = 0; i < len; i++)
        b[i] = k == FILL_ZERO ? 0 : (uint8_t)(t_rand(&rng) | 1);
    REQUIRE(pwrite(fd, b, len, (off_t)off) == (ssize_t)len);
    free(b);
    close(fd);
}

static void punch_at(const char *path, uint64_t off, uint64_t len)
{
    int fd = open(path, O_WRONLY);
    REQUIRE(fd >= 0 &&
            fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)off, (off_t)len) == 0);
    close(fd);
}

static void resize(const char *path, uint64_t size)
{
    REQUIRE(truncate(path, (off_t)size) == 0);
}

static uint64_t file_size(const char *path)
{
    struct stat sb;
    REQUIRE(stat(path, &sb) == 0);
    return (uint64_t)sb.st_size;
}

/* A random change of `path` (of its pages: `kind` 0 changed, 1 zeroed, 2 punched, 3 added in
 * holes, 4 grown, 5 shrunk), a few places. */
static void mutate(const char *path, int kind)
{
    uint64_t size = file_size(path);
    for (int i = 0; i < 4; i++) {
        uint64_t off = t_rand(&rng) % (size / PG) * PG, len = (1 + t_rand(&rng) % 40) * PG;
        len = off + len > size ? size - off : len;
        switch (kind) {
        case 0:
            write_at(path, off, len, FILL_RANDOM);
            break;
        case 1:
            write_at(path, off, len, FILL_ZERO);
            break;
        case 2:
            punch_at(path, off, len);
            break;
        case 3: { /* a hole filled: SEEK_HOLE finds one */
            int fd = open(path, O_RDONLY);
            off_t h = lseek(fd, (off_t)off, SEEK_HOLE);
            close(fd);
            if (h >= 0 && (uint64_t)h < size)
                write_at(path, (uint64_t)h, MIN(len, size - (uint64_t)h), FILL_RANDOM);
            break;
        }
        }
    }
    if (kind == 4) { /* grown past a partial page, data at the new end */
        resize(path, size + 3 * MiB + 777);
        write_at(path, size + 2 * MiB, MiB + 777, FILL_RANDOM);
    }
    if (kind == 5) /* shrunk mid-page */
        resize(path, size - size / 3 - 1234);
}

/* The delta of `cur` over `par` alone: stored pages hold cur's bytes, the rest zeros. */
static bool standalone_ok(const char *dir, const struct membuf_sink *obj, const char *cur,
                          const struct vmsnap_pages *par, const struct vmsnap_pages *ct)
{
    char out[600];
    snprintf(out, sizeof(out), "%s/alone", dir);
    size_t len;
    uint8_t *want = t_read_file(cur, &len);
    REQUIRE(want || !len);
    for (uint64_t p = 0; p < ct->npages; p++)
        if (ct->h[p] == (p < par->npages ? par->h[p] : 0))
            memset(want + p * PG, 0, (size_t)MIN(PG, len - p * PG));
    bool ok = true;
    for (int how = 0; how < 4 && ok; how++) {
        if (how == 3)
            ok = ref_read_sparse(obj->data, obj->len, out);
        else
            ok = decode(obj, dir, out, false, (enum how)how, 4096 + 77);
        size_t gl;
        uint8_t *got = t_read_file(out, &gl);
        ok = ok && gl == len && (!len || !memcmp(got, want, len));
        if (!ok)
            fprintf(stderr, "standalone decode %d of the delta of %s is wrong\n", how, cur);
        free(got);
    }
    free(want);
    return ok;
}

/* Pack `cur` as a delta over table `par` (threads 1 and 4: the same bytes), check its pages_out,
 * counts, standalone decodes; apply it with overlay onto `dst` by `how`; check `dst`. */
static void delta_step(const char *dir, const char *cur, struct vmsnap_pages **par, const char *dst,
                       enum how how, uint64_t frame, const char *label)
{
    struct membuf_sink d1, d4;
    struct vmsnap_image_stats s1, s4;
    struct vmsnap_pages *ct = NULL, *ct4 = NULL;
    pack_ok(cur, 1, frame, *par, &ct, &d1, &s1);
    pack_ok(cur, 4, frame, *par, &ct4, &d4, &s4);
    CHECKF(d1.len == d4.len && !memcmp(d1.data, d4.data, d1.len), "%s: -j1 and -j4 differ", label);
    struct vmsnap_pages *hf = hash_path(cur, 2);
    CHECKF(tables_equal(ct, hf) && tables_equal(ct4, hf), "%s: pages_out != hash_fd", label);
    uint64_t holes = 0, diff = vmsnap_pages_diff(*par, ct, &holes);
    CHECKF(s1.delta && s1.unchanged + diff == ct->npages && s1.zero_pages == holes,
           "%s: %llu unchanged + %llu stored of %llu pages, %llu zero records (diff: %llu holes)",
           label, (unsigned long long)s1.unchanged, (unsigned long long)diff,
           (unsigned long long)ct->npages, (unsigned long long)s1.zero_pages,
           (unsigned long long)holes);
    CHECKF(s1.populated <= diff * PG && s1.populated + PG > diff * PG, "%s: %llu data bytes", label,
           (unsigned long long)s1.populated);
    CHECKF(standalone_ok(dir, &d1, cur, *par, ct), "%s", label);
    CHECKF(decode(&d1, dir, dst, true, how, 1000 + 3), "%s: overlay", label);
    CHECKF(t_files_equal(cur, dst), "%s: overlay result differs from the source", label);
    CHECKF(holes_match(dst, hf), "%s: hole map", label);
    vmsnap_pages_free(*par);
    *par = ct;
    vmsnap_pages_free(ct4);
    vmsnap_pages_free(hf);
    membuf_sink_free(&d1);
    membuf_sink_free(&d4);
}

/* A parent file of about 13 MiB: extents of every kind, a partial last page. */
static void make_parent(const char *path, uint64_t seed)
{
    struct gen_extent ext[9];
    uint64_t r = seed;
    size_t n = gen_random_layout(&r, 13 * MiB, ext, 8, false);
    ext[n++] = (struct gen_extent){13 * MiB + 100, 300, FILL_RANDOM};
    gen_file(path, 13 * MiB + 400, ext, n, seed);
}

static void test_deltas(const char *dir)
{
    char par[600], cur[600], dst[600], alt[600];
    snprintf(par, sizeof(par), "%s/parent", dir);
    snprintf(cur, sizeof(cur), "%s/cur", dir);
    snprintf(dst, sizeof(dst), "%s/dst", dir);
    snprintf(alt, sizeof(alt), "%s/alt", dir);
    static const char *names[] = {"changed", "zeroed", "punched", "added", "grown", "shrunk"};
    for (int kind = 0; kind < 6; kind++) {
        make_parent(par, 100 + (uint64_t)kind);
        const uint64_t frame = kind % 2 ? MiB : 4 * MiB; /* 4 MiB: past the decoder's ring */
        struct membuf_sink base;
        struct vmsnap_image_stats bs;
        struct vmsnap_pages *pt = NULL;
        pack_ok(par, 2, frame, NULL, &pt, &base, &bs);
        struct vmsnap_pages *hp = hash_path(par, 1);
        CHECKF(tables_equal(pt, hp) && !bs.delta, "pages_out of a full pack != hash_fd");
        /* the full layer: overlay onto an empty file = without overlay */
        write_file(dst, "", 0);
        CHECK(decode(&base, dir, dst, true, (enum how)(kind % 3), 65536));
        CHECK(decode(&base, dir, alt, false, BY_UNPACK, 0));
        CHECK(t_files_equal(dst, alt) && t_files_equal(par, dst) && holes_match(dst, hp));
        copy_file(par, cur);
        mutate(cur, kind);
        char label[200];
        snprintf(label, sizeof(label), "%s (%s)", names[kind], dir);
        delta_step(dir, cur, &pt, dst, (enum how)(kind % 3), frame, label);
        vmsnap_pages_free(pt);
        vmsnap_pages_free(hp);
        membuf_sink_free(&base);
    }

    /* a chain of 8 deltas, each over the last, applied in turn onto one file */
    make_parent(par, 7);
    struct membuf_sink base;
    struct vmsnap_image_stats bs;
    struct vmsnap_pages *pt = NULL;
    pack_ok(par, 2, MiB, NULL, &pt, &base, &bs);
    write_file(dst, "", 0);
    CHECK(decode(&base, dir, dst, true, BY_UNPACK, 0));
    copy_file(par, cur);
    for (int i = 0; i < 8; i++) {
        mutate(cur, (int)(t_rand(&rng) % 6));
        mutate(cur, i % 4);
        char label[200];
        snprintf(label, sizeof(label), "chain depth %d (%s)", i + 1, dir);
        delta_step(dir, cur, &pt, dst, (enum how)(i % 3), MiB, label);
    }
    vmsnap_pages_free(pt);
    membuf_sink_free(&base);
}

/* Decode `obj` newest-first into the open `fd` under `mask`: through decode_parallel (2
 * threads) or frame by frame with one decoder (frames in reverse order). */
static bool decode_under(const struct membuf_sink *obj, int fd, struct vmsnap_pagemask *mask,
                         bool by_frame)
{
    struct vmsnap_err err = {0};
    struct vmsnap_membuf mb = {obj->data, obj->len};
    struct vmsnap_source src;
    vmsnap_source_mem(&src, &mb, "obj");
    struct vmsnap_image *img = NULL;
    REQUIRE(vmsnap_image_open(&src, 0, &img, &err) == 1);
    int rc = 0;
    if (!by_frame) {
        struct vmsnap_unpack_opts o = {.threads = 2, .under = mask};
        rc = vmsnap_image_decode_parallel(img, &src, fd, &o, NULL, &err);
    } else {
        struct vmsnap_frame_decoder *dec = NULL;
        REQUIRE(vmsnap_frame_decoder_new(&dec, &err) == 0);
        vmsnap_frame_decoder_set_under(dec, mask);
        for (uint32_t i = vmsnap_image_frame_count(img); rc == 0 && i-- > 0;)
            rc = vmsnap_image_decode_frame_dec(img, i, &src, 0, fd, dec, NULL, &err);
        vmsnap_frame_decoder_free(dec);
    }
    /* as a pull does after each layer: the pages past its end were holes in the file as it
     * left it, so no older layer gives them (a file shrunk, then grown again) */
    struct vmsnap_image_stats st;
    vmsnap_image_get_stats(img, &st);
    for (uint64_t p = (st.total_size + PG - 1) / PG; p < mask->npages; p++)
        mask->bits[p / 64] |= 1ull << (p % 64);
    vmsnap_image_free(img);
    if (rc < 0)
        fprintf(stderr, "decode under a mask: %s\n", err.msg);
    return rc == 0;
}

/* A chain of a full layer and 8 deltas (pages changed, zeroed, punched, added, the file grown
 * and shrunk) applied newest layer first under a page mask gives what applying it oldest first
 * gives: the same bytes, the same holes, the last layer's size. With `long_runs`, every delta
 * also rewrites 3 MiB in one run, in 4 MiB frames: its records outlast the decoder's 256 KiB
 * pieces of output, so whole pages arrive split in two (a split page once went unmarked, and
 * the older layer's copy of it was written over the newer one). */
static void test_newest_first(const char *dir, bool long_runs)
{
    const uint64_t frame = long_runs ? 4 * MiB : MiB;
    char par[600], cur[600], dst[600];
    snprintf(par, sizeof(par), "%s/nf-parent", dir);
    snprintf(cur, sizeof(cur), "%s/nf-cur", dir);
    snprintf(dst, sizeof(dst), "%s/nf-dst", dir);
    make_parent(par, 21);
    struct membuf_sink layers[9];
    struct vmsnap_image_stats st;
    struct vmsnap_pages *pt = NULL, *ct = NULL;
    pack_ok(par, 2, frame, NULL, &pt, &layers[0], &st);
    copy_file(par, cur);
    for (int i = 1; i < 9; i++) {
        mutate(cur, i % 6);
        mutate(cur, (int)(t_rand(&rng) % 6));
        if (long_runs && file_size(cur) > 4 * MiB)
            write_at(cur, t_rand(&rng) % (file_size(cur) / MiB - 3) * MiB, 3 * MiB, FILL_RANDOM);
        pack_ok(cur, 2, frame, pt, &ct, &layers[i], &st);
        vmsnap_pages_free(pt);
        pt = ct;
        ct = NULL;
    }
    struct vmsnap_pages *want = hash_path(cur, 1);
    for (int by_frame = 0; by_frame < 2; by_frame++) {
        struct vmsnap_pagemask *mask = NULL;
        struct vmsnap_err err = {0};
        REQUIRE(vmsnap_pagemask_new(file_size(cur), &mask, &err) == 0);
        int fd = open(dst, O_RDWR | O_CREAT | O_TRUNC, 0600);
        REQUIRE(fd >= 0);
        bool ok = true;
        for (int i = 8; ok && i >= 0; i--)
            ok = decode_under(&layers[i], fd, mask, by_frame);
        CHECKF(ok, "newest first (%s): a layer failed", by_frame ? "by frame" : "parallel");
        REQUIRE(ftruncate(fd, (off_t)file_size(cur)) == 0);
        close(fd);
        CHECKF(t_files_equal(cur, dst), "newest first (%s, %s%s): bytes differ", dir,
               by_frame ? "by frame" : "parallel", long_runs ? ", long runs" : "");
        CHECKF(holes_match(dst, want), "newest first (%s, %s): hole map", dir,
               by_frame ? "by frame" : "parallel");
        vmsnap_pagemask_free(mask);
    }
    for (int i = 0; i < 9; i++)
        membuf_sink_free(&layers[i]);
    vmsnap_pages_free(pt);
    vmsnap_pages_free(want);
}

/* ---- 4. refusals, unchanged files ---- */

/* A sink's copy of a base frame: its bytes from the base object (pack with a base). */
static const struct membuf_sink *copy_from;
static int copy_frame(void *arg, const struct vmsnap_frame_info *f, struct vmsnap_err *err)
{
    struct membuf_sink *m = arg;
    REQUIRE(f->offset + f->csize <= copy_from->len);
    size_t need = m->len + (size_t)f->csize;
    if (need > m->cap) {
        m->data = realloc(m->data, need * 2);
        REQUIRE(m->data);
        m->cap = need * 2;
    }
    (void)err;
    memcpy(m->data + m->len, copy_from->data + f->offset, (size_t)f->csize);
    m->len += (size_t)f->csize;
    return 0;
}

static void test_edges(void)
{
    const char *f = t_path("edge");
    make_parent(f, 55);
    struct membuf_sink m;
    struct vmsnap_image_stats st;
    struct vmsnap_pages *pt = NULL, *again = NULL;
    pack_ok(f, 2, MiB, NULL, &pt, &m, &st);
    CHECK(st.frames > 3);

    /* unchanged: no data records; the object is header, sentinel and table */
    struct membuf_sink d;
    pack_ok(f, 2, MiB, pt, &again, &d, &st);
    CHECKF(st.frames == 0 && st.populated == 0 && st.extents == 0 && st.unchanged == pt->npages,
           "a delta of an unchanged file stores %llu frames, %llu bytes",
           (unsigned long long)st.frames, (unsigned long long)st.populated);
    CHECK(tables_equal(pt, again));
    char obj[600], out[600];
    snprintf(obj, sizeof(obj), "%s", t_path("edge.obj"));
    snprintf(out, sizeof(out), "%s", t_path("edge.out"));
    write_file(obj, d.data, d.len);
    struct vmsnap_err err = {0};
    CHECK(vmsnap_image_inspect(obj, true, 1, 0, &st, &err) == 0 && st.delta && st.frames == 0);
    /* overlay of it onto the file's copy leaves the copy as it is */
    copy_file(f, out);
    struct vmsnap_unpack_opts uo = {.overlay = true};
    CHECK(vmsnap_image_unpack(obj, out, &uo, NULL, &err) == 0 && t_files_equal(f, out));
    membuf_sink_free(&d);

    /* refused: with a base, with keep_zero_pages, with a table that does not add up */
    struct vmsnap_membuf mb = {m.data, m.len};
    struct vmsnap_source src;
    vmsnap_source_mem(&src, &mb, "base");
    struct vmsnap_image *img = NULL;
    REQUIRE(vmsnap_image_open(&src, 0, &img, &err) == 1);
    struct vmsnap_sink sink;
    membuf_sink_init(&d, &sink);
    int fd = open(f, O_RDONLY);
    struct vmsnap_pack_opts o = {.frame_size = MiB, .delta_parent = pt, .base = img};
    CHECK(vmsnap_image_pack_fd(fd, f, &sink, &o, NULL, &err) == -EINVAL && d.len == 0 &&
          strstr(err.msg, "base"));
    o.base = NULL;
    o.keep_zero_pages = true;
    CHECK(vmsnap_image_pack_fd(fd, f, &sink, &o, NULL, &err) == -EINVAL && d.len == 0 &&
          strstr(err.msg, "keep_zero_pages"));
    o.keep_zero_pages = false;
    pt->npages--;
    CHECK(vmsnap_image_pack_fd(fd, f, &sink, &o, NULL, &err) == -EINVAL && d.len == 0);
    pt->npages++;
    /* pages_out of a pack with a base (frames copied from it: hashed by the pre-scan) */
    struct vmsnap_pages *wb = NULL;
    copy_from = &m;
    sink.copy = copy_frame;
    o = (struct vmsnap_pack_opts){
        .frame_size = MiB, .base = img, .base_min_run = 1, .pages_out = &wb};
    CHECK(vmsnap_image_pack_fd(fd, f, &sink, &o, &st, &err) == 0 && st.reused > 0 && wb &&
          tables_equal(wb, pt));
    CHECK(d.len == m.len && !memcmp(d.data, m.data, m.len));
    vmsnap_pages_free(wb);
    sink.copy = NULL;
    /* pages_out of a full pack that keeps zero pages */
    struct vmsnap_pages *kz = NULL;
    o = (struct vmsnap_pack_opts){.frame_size = MiB, .keep_zero_pages = true, .pages_out = &kz};
    CHECK(vmsnap_image_pack_fd(fd, f, &sink, &o, NULL, &err) == 0 && kz && tables_equal(kz, pt));
    close(fd);
    vmsnap_pages_free(kz);
    vmsnap_image_free(img);
    membuf_sink_free(&d);
    membuf_sink_free(&m);
    vmsnap_pages_free(pt);
    vmsnap_pages_free(again);
}

/* A directory on `base` for the delta tests; NULL when none (or when it is not `want_tmpfs`). */
static char *dir_on(const char *base, bool want_tmpfs)
{
    struct statfs sf;
    if (!base || statfs(base, &sf) < 0 || (sf.f_type == TMPFS_MAGIC) != want_tmpfs)
        return NULL;
    char *d = malloc(strlen(base) + 32);
    REQUIRE(d);
    sprintf(d, "%s/vmsnap-delta.XXXXXX", base);
    if (!mkdtemp(d)) {
        free(d);
        return NULL;
    }
    return d;
}

int main(void)
{
    test_tables();
    test_serialised();
    test_edges();
    char *shm = dir_on("/dev/shm", true);
    char *disk = dir_on(t_tmpdir(), false);
    if (!disk)
        disk = dir_on(getenv("VMSNAP_BUILD"), false);
    if (!disk)
        disk = dir_on("/var/tmp", false);
    const char *dirs[] = {shm, disk};
    for (int i = 0; i < 2; i++) {
        if (!dirs[i])
            continue;
        fprintf(stderr, "deltas in %s\n", dirs[i]);
        test_deltas(dirs[i]);
        {
            test_newest_first(dirs[i], false);
            test_newest_first(dirs[i], true);
        }
        t_sh("rm -rf '%s'", dirs[i]);
    }
    free(shm);
    free(disk);
    if (!shm || !disk) {
        if (t_failures)
            return t_done();
        t_skip("deltas not tested on %s: no such directory here",
               !shm ? "tmpfs (/dev/shm)" : "a disk filesystem (TMPDIR, the build dir, /var/tmp)");
    }
    return t_done();
}
