/* SPDX-License-Identifier: Apache-2.0 */
#include "img_util.h"

#include <fcntl.h>
#include <string.h>
#include <unistd.h>
#include <zstd.h>

static int mem_write(void *arg, const void *buf, size_t len, struct vmsnap_err *err)
{
    (void)err;
    struct membuf_sink *m = arg;
    if (m->len + len > m->cap) {
        size_t cap = m->cap ? m->cap : 4096;
        while (cap < m->len + len)
            cap *= 2;
        uint8_t *d = realloc(m->data, cap);
        REQUIRE(d != NULL);
        m->data = d;
        m->cap = cap;
    }
    memcpy(m->data + m->len, buf, len);
    m->len += len;
    return 0;
}

void membuf_sink_init(struct membuf_sink *m, struct vmsnap_sink *sink)
{
    memset(m, 0, sizeof(*m));
    sink->write = mem_write;
    sink->arg = m;
}

void membuf_sink_free(struct membuf_sink *m)
{
    free(m->data);
    memset(m, 0, sizeof(*m));
}

static void fill(uint8_t *p, size_t len, enum fill_kind kind, uint64_t *rng)
{
    static const char text[] = "the quick brown fox jumps over the lazy dog; guest kernel page "
                               "cache line 0123456789 ";
    switch (kind) {
    case FILL_ZERO:
        memset(p, 0, len);
        break;
    case FILL_TEXT:
        for (size_t i = 0; i < len; i++)
            p[i] = (uint8_t)text[(i + (*rng & 0xff)) % (sizeof(text) - 1)];
        break;
    case FILL_RANDOM:
        for (size_t i = 0; i < len; i += 8) {
            uint64_t v = t_rand(rng);
            memcpy(p + i, &v, len - i < 8 ? len - i : 8);
        }
        break;
    case FILL_MIXED:
        /* pages alternating: random, zero, text, zero... */
        for (size_t i = 0; i < len; i += 4096) {
            size_t n = len - i < 4096 ? len - i : 4096;
            enum fill_kind k = ((i / 4096) % 4 == 1 || (i / 4096) % 4 == 3)
                                   ? FILL_ZERO
                                   : ((i / 4096) % 4 == 0 ? FILL_RANDOM : FILL_TEXT);
            fill(p + i, n, k, rng);
        }
        break;
    }
}

void gen_file(const char *path, uint64_t size, const struct gen_extent *ext, size_t n,
              uint64_t seed)
{
    int fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0600);
    REQUIRE(fd >= 0);
    REQUIRE(ftruncate(fd, (off_t)size) == 0);
    uint64_t rng = seed;
    for (size_t i = 0; i < n; i++) {
        uint8_t *buf = malloc(ext[i].len ? ext[i].len : 1);
        REQUIRE(buf != NULL);
        fill(buf, ext[i].len, ext[i].kind, &rng);
        REQUIRE(pwrite(fd, buf, ext[i].len, (off_t)ext[i].off) == (ssize_t)ext[i].len);
        free(buf);
    }
    REQUIRE(close(fd) == 0);
}

size_t gen_random_layout(uint64_t *rng, uint64_t size, struct gen_extent *ext, size_t max_ext,
                         bool unaligned)
{
    size_t n = 0;
    uint64_t pos = 0;
    while (n < max_ext && pos < size) {
        uint64_t gap = t_rand(rng) % (size / (max_ext + 1) + 1);
        uint64_t len = 1 + t_rand(rng) % (size / (max_ext + 1) + 1);
        if (!unaligned) {
            gap &= ~4095ull;
            len = (len + 4095) & ~4095ull;
        }
        if (n == 0 && t_rand(rng) % 3 == 0)
            gap = 0; /* data at offset 0 sometimes */
        pos += gap;
        if (pos >= size)
            break;
        if (len > size - pos)
            len = size - pos;
        ext[n].off = pos;
        ext[n].len = len;
        ext[n].kind = (enum fill_kind)(t_rand(rng) % 4);
        n++;
        pos += len;
    }
    return n;
}

void pack_to_mem(const char *path, unsigned threads, uint64_t frame_size, bool keep_zero,
                 struct membuf_sink *out, struct vmsnap_image_stats *st)
{
    struct vmsnap_sink sink;
    membuf_sink_init(out, &sink);
    int fd = open(path, O_RDONLY);
    REQUIRE(fd >= 0);
    struct vmsnap_pack_opts o = {.threads = threads,
                                 .frame_size = frame_size,
                                 .keep_zero_pages = keep_zero,
                                 .keep_cache = true};
    struct vmsnap_err err = {0};
    int rc = vmsnap_image_pack_fd(fd, path, &sink, &o, st, &err);
    close(fd);
    if (rc < 0)
        fprintf(stderr, "pack %s: %s\n", path, err.msg);
    REQUIRE(rc == 0);
}

void write_file(const char *path, const void *data, size_t len)
{
    int fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0600);
    REQUIRE(fd >= 0);
    REQUIRE(write(fd, data, len) == (ssize_t)len);
    REQUIRE(close(fd) == 0);
}

/* Compare the ranges [off, off+len) of two fds. */
static bool range_equal(int fa, int fb, uint64_t off, uint64_t len)
{
    static uint8_t ba[1 << 20], bb[1 << 20];
    while (len) {
        size_t n = len < sizeof(ba) ? (size_t)len : sizeof(ba);
        if (pread(fa, ba, n, (off_t)off) != (ssize_t)n ||
            pread(fb, bb, n, (off_t)off) != (ssize_t)n)
            return false;
        if (memcmp(ba, bb, n) != 0)
            return false;
        off += n;
        len -= n;
    }
    return true;
}

/* Compare every data extent of `fa` against `fb` (holes read as zeros in both). */
static bool extents_match(int fa, int fb, uint64_t size)
{
    uint64_t pos = 0;
    while (pos < size) {
        off_t d = lseek(fa, (off_t)pos, SEEK_DATA);
        if (d < 0)
            break;
        off_t h = lseek(fa, d, SEEK_HOLE);
        if (h < 0 || !range_equal(fa, fb, (uint64_t)d, (uint64_t)(h - d)))
            return false;
        pos = (uint64_t)h;
    }
    return true;
}

bool sparse_files_equal(const char *a, const char *b)
{
    int fa = open(a, O_RDONLY), fb = open(b, O_RDONLY);
    bool ok = false;
    if (fa >= 0 && fb >= 0) {
        off_t sa = lseek(fa, 0, SEEK_END), sb = lseek(fb, 0, SEEK_END);
        ok = sa == sb && extents_match(fa, fb, (uint64_t)sa) && extents_match(fb, fa, (uint64_t)sb);
    }
    if (fa >= 0)
        close(fa);
    if (fb >= 0)
        close(fb);
    return ok;
}

static int64_t ref_rd64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return (int64_t)v;
}

/* The reference reader's algorithm (written here from the documented layout only): check magic
 * and version, stream-decompress everything after byte 12, parse totalSize, records and the -1
 * sentinel, write extents into `dst`. */
bool ref_read_sparse(const uint8_t *obj, size_t len, const char *dst)
{
    if (len < 12 || memcmp(obj, "ATESPRSE", 8) != 0 || obj[8] != 2 || obj[9] || obj[10] || obj[11])
        return false;
    ZSTD_DStream *ds = ZSTD_createDStream();
    size_t cap = 64 << 20;
    uint8_t *content = malloc(cap);
    size_t clen = 0;
    ZSTD_inBuffer in = {obj + 12, len - 12, 0};
    bool ok = true;
    while (in.pos < in.size) {
        if (clen == cap) {
            cap *= 2;
            content = realloc(content, cap);
        }
        ZSTD_outBuffer out = {content + clen, cap - clen, 0};
        size_t r = ZSTD_decompressStream(ds, &out, &in);
        if (ZSTD_isError(r)) {
            fprintf(stderr, "reference reader: %s\n", ZSTD_getErrorName(r));
            ok = false;
            break;
        }
        clen += out.pos;
    }
    ZSTD_freeDStream(ds);
    int fd = open(dst, O_CREAT | O_TRUNC | O_WRONLY, 0600);
    REQUIRE(fd >= 0);
    size_t p = 0;
    int64_t size = -1;
    bool sentinel = false;
    if (ok && clen >= 8) {
        size = ref_rd64(content);
        p = 8;
        ok = size >= 0 && ftruncate(fd, size) == 0;
    }
    while (ok && p + 8 <= clen) {
        int64_t off = ref_rd64(content + p);
        p += 8;
        if (off == -1) {
            sentinel = true;
            break;
        }
        if (p + 8 > clen)
            break;
        int64_t l = ref_rd64(content + p);
        p += 8;
        if (off < 0 || l < 0 || off > size || l > size - off || (size_t)l > clen - p) {
            ok = false;
            break;
        }
        ok = pwrite(fd, content + p, (size_t)l, off) == l;
        p += (size_t)l;
    }
    close(fd);
    free(content);
    return ok && sentinel;
}
