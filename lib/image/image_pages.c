/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Page tables: one 64-bit hash per 4 KiB page of a file, what a delta layer is computed against
 * (docs/FORMAT.md, "Layers"). Here: the page hash itself (shared with the encoder, which hashes
 * the pages it reads anyway), the standalone hash pass over a file, the diff count, and the
 * serialised "pages" object (encode, and a decode that trusts nothing it is given).
 *
 * The hash pass cuts the file into 64 MiB chunks that workers take in turn; each walks its
 * chunk's data with SEEK_DATA/SEEK_HOLE, reads every page an extent touches whole (a page an
 * extent covers in part reads zeros in its hole part, which is its content) 1 MiB at a time,
 * and hashes it. Holes cost nothing: the table is calloc'ed (0 = hole), and for a large table
 * calloc maps fresh zero pages that are never touched where the file has holes.
 */
#include "image_int.h"
#include "sys/sys.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>
#include <zstd.h>

#define ULL(x) ((unsigned long long)(x))

#define PAGES_MAGIC "VMSNPAGE"
#define PAGES_VERSION 1u
#define PAGES_HDR_LEN 48
#define HASH_CHUNK (64ull << 20) /* a worker's unit of the hash pass */
#define HASH_READ (1u << 20)     /* bytes read at once */
#define LE_STEP 4096u            /* hashes converted to little-endian at once (encode) */

uint64_t img_page_hash_nz(const uint8_t *p, size_t len)
{
    uint64_t h = XXH3_64bits(p, len);
    return h ? h : 1;
}

static uint64_t page_hash(const uint8_t *p, size_t len)
{
    return img_all_zero(p, len) ? 0 : img_page_hash_nz(p, len);
}

int img_page_hash_fd(int fd, const char *name, uint64_t size, uint64_t pidx, uint64_t *h,
                     struct vmsnap_err *err)
{
    uint8_t pg[IMG_PAGE];
    const uint64_t off = pidx * IMG_PAGE;
    const size_t len = (size_t)VMSNAP_MIN((uint64_t)IMG_PAGE, size - off);
    ssize_t got = sys_pread_full(fd, pg, len, off);
    if (got < 0)
        return err_code(err, (int)-got, "%s: read %zu bytes at offset %llu", name, len, ULL(off));
    if ((size_t)got != len)
        return vmsnap_err_set(err, EIO,
                              "%s: file shrank while reading (offset %llu): is it in use?", name,
                              ULL(off + (uint64_t)got));
    *h = page_hash(pg, len);
    return 0;
}

int img_pages_check(const struct vmsnap_pages *t, const char *what, struct vmsnap_err *err)
{
    if (!t || t->size > (uint64_t)INT64_MAX || t->npages != (t->size + IMG_PAGE - 1) / IMG_PAGE ||
        (t->npages && !t->h))
        return vmsnap_err_set(err, EINVAL,
                              "%s: inconsistent page table (size %llu, %llu pages): not one "
                              "vmsnap_pages_new, _hash_fd or _decode made",
                              what, t ? ULL(t->size) : 0, t ? ULL(t->npages) : 0);
    return 0;
}

int vmsnap_pages_new(uint64_t size, struct vmsnap_pages **out, struct vmsnap_err *err)
{
    *out = NULL;
    if (size > (uint64_t)INT64_MAX)
        return vmsnap_err_set(err, EINVAL, "page table for %llu bytes: too large", ULL(size));
    const uint64_t n = (size + IMG_PAGE - 1) / IMG_PAGE;
    struct vmsnap_pages *p = calloc(1, sizeof(*p));
    if (p && n)
        p->h = n <= SIZE_MAX / sizeof(*p->h) ? calloc((size_t)n, sizeof(*p->h)) : NULL;
    if (!p || (n && !p->h)) {
        free(p);
        return vmsnap_err_set(err, ENOMEM, "out of memory (page table of %llu pages: %llu MiB)",
                              ULL(n), ULL(n * 8 >> 20));
    }
    p->size = size;
    p->npages = n;
    *out = p;
    return 0;
}

void vmsnap_pages_free(struct vmsnap_pages *p)
{
    if (!p)
        return;
    free(p->h);
    free(p);
}

uint64_t vmsnap_pages_diff(const struct vmsnap_pages *parent, const struct vmsnap_pages *cur,
                           uint64_t *holes)
{
    static const struct vmsnap_pages none;
    if (!parent)
        parent = &none;
    uint64_t n = 0, z = 0;
    for (uint64_t p = 0; p < cur->npages; p++) {
        const uint64_t h = cur->h[p];
        if (h != img_pages_at(parent, p)) {
            n++;
            z += h == 0;
        }
    }
    if (holes)
        *holes = z;
    return n;
}

/* ---- the hash pass ---- */

struct hash_job {
    int fd;
    const char *name;
    uint64_t size;
    bool drop;
    uint64_t *h;
    uint64_t nchunks;
    pthread_mutex_t mu;
    uint64_t next;
    int rc;
    struct vmsnap_err err;
};

/* Hash the pages of chunk `c` that hold data into j->h. */
static int hash_chunk(struct hash_job *j, uint8_t *buf, uint64_t c, struct vmsnap_err *err)
{
    const uint64_t start = c * HASH_CHUNK, end = VMSNAP_MIN(start + HASH_CHUNK, j->size);
    uint64_t pos = start; /* page-aligned, or the end */
    while (pos < end) {
        off_t d = lseek(j->fd, (off_t)pos, SEEK_DATA);
        if (d < 0 && errno == ENXIO)
            break;
        if (d < 0)
            return err_sys(err, "%s: SEEK_DATA at offset %llu", j->name, ULL(pos));
        if ((uint64_t)d >= end)
            break;
        off_t hole = lseek(j->fd, d, SEEK_HOLE);
        if (hole < 0)
            return err_sys(err, "%s: SEEK_HOLE at offset %lld", j->name, (long long)d);
        const uint64_t a = VMSNAP_MAX(pos, (uint64_t)d / IMG_PAGE * IMG_PAGE);
        uint64_t b = VMSNAP_MIN((uint64_t)hole, end);
        b = VMSNAP_MIN((b + IMG_PAGE - 1) / IMG_PAGE * IMG_PAGE, end);
        if (b <= a)
            break;
        for (uint64_t o = a; o < b; o += HASH_READ) {
            const size_t len = (size_t)VMSNAP_MIN((uint64_t)HASH_READ, b - o);
            ssize_t got = sys_pread_full(j->fd, buf, len, o);
            if (got < 0)
                return err_code(err, (int)-got, "%s: read %zu bytes at offset %llu", j->name, len,
                                ULL(o));
            if ((size_t)got != len)
                return vmsnap_err_set(err, EIO,
                                      "%s: file shrank while reading (offset %llu): is it in use?",
                                      j->name, ULL(o + (uint64_t)got));
            for (size_t k = 0; k < len; k += IMG_PAGE)
                j->h[(o + k) / IMG_PAGE] =
                    page_hash(buf + k, VMSNAP_MIN((size_t)IMG_PAGE, len - k));
        }
        pos = b;
    }
    if (j->drop)
        (void)posix_fadvise(j->fd, (off_t)start, (off_t)(end - start), POSIX_FADV_DONTNEED);
    return 0;
}

static void *hash_main(void *arg)
{
    struct hash_job *j = arg;
    uint8_t *buf = malloc(HASH_READ);
    for (;;) {
        pthread_mutex_lock(&j->mu);
        const bool stop = j->rc < 0 || j->next >= j->nchunks || !buf;
        const uint64_t c = j->next++;
        if (!buf && j->rc == 0)
            j->rc = vmsnap_err_set(&j->err, ENOMEM, "out of memory (page hash buffer)");
        pthread_mutex_unlock(&j->mu);
        if (stop)
            break;
        struct vmsnap_err er = {0};
        int rc = cancel_check(&er);
        if (rc == 0)
            rc = hash_chunk(j, buf, c, &er);
        if (rc < 0) {
            pthread_mutex_lock(&j->mu);
            if (j->rc == 0) {
                j->rc = rc;
                j->err = er;
            }
            pthread_mutex_unlock(&j->mu);
        }
    }
    free(buf);
    return NULL;
}

/* Run the pass on `threads` threads (the caller's among them). */
static void hash_run(struct hash_job *j, unsigned threads)
{
    pthread_t *tid = threads > 1 ? calloc(threads - 1, sizeof(*tid)) : NULL;
    unsigned started = 0;
    for (; tid && started < threads - 1; started++)
        if (thread_start(&tid[started], hash_main, j) != 0)
            break;
    hash_main(j);
    for (unsigned i = 0; i < started; i++)
        pthread_join(tid[i], NULL);
    free(tid);
}

int vmsnap_pages_hash_fd(int fd, const char *name, unsigned threads, bool keep_cache,
                         struct vmsnap_pages **out, struct vmsnap_err *err)
{
    *out = NULL;
    if (!name)
        name = "source";
    struct stat st, after;
    if (fstat(fd, &st) < 0)
        return err_sys(err, "stat %s", name);
    if (!S_ISREG(st.st_mode))
        return vmsnap_err_set(err, EINVAL, "%s: not a regular file", name);
    struct vmsnap_pages *t = NULL;
    int rc = vmsnap_pages_new((uint64_t)st.st_size, &t, err);
    if (rc < 0)
        return rc;
    struct hash_job j = {.fd = fd,
                         .name = name,
                         .size = t->size,
                         .drop = !keep_cache,
                         .h = t->h,
                         .nchunks = (t->size + HASH_CHUNK - 1) / HASH_CHUNK};
    pthread_mutex_init(&j.mu, NULL);
    if (!threads)
        threads = sys_cpus();
    threads = (unsigned)VMSNAP_MIN((uint64_t)VMSNAP_MIN(threads, 256u), VMSNAP_MAX(j.nchunks, 1));
    hash_run(&j, threads);
    pthread_mutex_destroy(&j.mu);
    rc = j.rc;
    if (rc < 0 && err)
        *err = j.err;
    if (rc == 0 &&
        (fstat(fd, &after) < 0 || after.st_size != st.st_size ||
         after.st_mtim.tv_sec != st.st_mtim.tv_sec || after.st_mtim.tv_nsec != st.st_mtim.tv_nsec))
        rc = vmsnap_err_set(err, EAGAIN,
                            "%s changed while being read (size or modification time): hash it "
                            "again when nothing writes to it",
                            name);
    if (rc < 0) {
        vmsnap_pages_free(t);
        return rc;
    }
    for (uint64_t p = 0; p < t->npages; p++)
        t->populated += t->h[p] != 0;
    *out = t;
    return 0;
}

/* ---- the serialised table ---- */

/* The 48-byte header of table `p` whose hashes have XXH64 `sum`. */
static void put_header(uint8_t *h, const struct vmsnap_pages *p, uint64_t sum)
{
    memcpy(h, PAGES_MAGIC, 8);
    put_le32(h + 8, PAGES_VERSION);
    put_le32(h + 12, IMG_PAGE);
    put_le64(h + 16, p->size);
    put_le64(h + 24, p->npages);
    put_le64(h + 32, p->populated);
    put_le64(h + 40, sum);
}

/* Hashes [i, i + n) as little-endian bytes into `le`. */
static void hashes_le(const struct vmsnap_pages *p, uint64_t i, size_t n, uint8_t *le)
{
    for (size_t k = 0; k < n; k++)
        put_le64(le + 8 * k, p->h[i + k]);
}

/* Feed `len` bytes at `src` to the frame being compressed into `out`. */
static size_t feed(ZSTD_CCtx *cc, ZSTD_outBuffer *out, const void *src, size_t len)
{
    ZSTD_inBuffer in = {src, len, 0};
    size_t r = 0;
    while (!ZSTD_isError(r) && in.pos < in.size)
        r = ZSTD_compressStream2(cc, out, &in, ZSTD_e_continue);
    return r;
}

/* The whole content (header, then the hashes) as one zstd frame into `out` (of the bound). */
static int compress_table(ZSTD_CCtx *cc, const struct vmsnap_pages *p, const uint8_t *hdr,
                          uint8_t *le, ZSTD_outBuffer *out, struct vmsnap_err *err)
{
    size_t r = ZSTD_CCtx_setParameter(cc, ZSTD_c_compressionLevel, 1);
    if (!ZSTD_isError(r))
        r = ZSTD_CCtx_setParameter(cc, ZSTD_c_checksumFlag, 1);
    if (!ZSTD_isError(r))
        r = ZSTD_CCtx_setPledgedSrcSize(cc, PAGES_HDR_LEN + 8 * p->npages);
    if (!ZSTD_isError(r))
        r = feed(cc, out, hdr, PAGES_HDR_LEN);
    for (uint64_t i = 0; !ZSTD_isError(r) && i < p->npages; i += LE_STEP) {
        const size_t n = (size_t)VMSNAP_MIN((uint64_t)LE_STEP, p->npages - i);
        hashes_le(p, i, n, le);
        r = feed(cc, out, le, 8 * n);
    }
    ZSTD_inBuffer none = {NULL, 0, 0};
    while (!ZSTD_isError(r) && (r = ZSTD_compressStream2(cc, out, &none, ZSTD_e_end)) != 0 &&
           !ZSTD_isError(r) && out->pos < out->size)
        ;
    if (ZSTD_isError(r) || r != 0)
        return vmsnap_err_set(err, EIO, "page table: zstd: %s",
                              ZSTD_isError(r) ? ZSTD_getErrorName(r) : "frame larger than bound");
    return 0;
}

int vmsnap_pages_encode(const struct vmsnap_pages *p, void **buf, size_t *len,
                        struct vmsnap_err *err)
{
    *buf = NULL;
    *len = 0;
    int rc = img_pages_check(p, "page table", err);
    if (rc < 0)
        return rc;
    uint64_t pop = 0;
    XXH64_state_t *x = XXH64_createState();
    uint8_t *le = malloc(8 * LE_STEP);
    ZSTD_CCtx *cc = ZSTD_createCCtx();
    const uint64_t content = PAGES_HDR_LEN + 8 * p->npages;
    const size_t cap = ZSTD_compressBound(content);
    uint8_t *o = content <= SIZE_MAX / 2 ? malloc(cap) : NULL;
    if (!x || !le || !cc || !o) {
        rc =
            vmsnap_err_set(err, ENOMEM, "out of memory (page table of %llu pages)", ULL(p->npages));
        goto out;
    }
    XXH64_reset(x, 0);
    for (uint64_t i = 0; i < p->npages; i += LE_STEP) {
        const size_t n = (size_t)VMSNAP_MIN((uint64_t)LE_STEP, p->npages - i);
        hashes_le(p, i, n, le);
        XXH64_update(x, le, 8 * n);
        for (size_t k = 0; k < n; k++)
            pop += p->h[i + k] != 0;
    }
    if (pop != p->populated) {
        rc = vmsnap_err_set(err, EINVAL, "page table: populated says %llu pages, %llu are not 0",
                            ULL(p->populated), ULL(pop));
        goto out;
    }
    uint8_t hdr[PAGES_HDR_LEN];
    put_header(hdr, p, XXH64_digest(x));
    ZSTD_outBuffer ob = {o, cap, 0};
    if ((rc = compress_table(cc, p, hdr, le, &ob, err)) < 0)
        goto out;
    *buf = o;
    *len = ob.pos;
    o = NULL;
out:
    free(o);
    ZSTD_freeCCtx(cc);
    free(le);
    XXH64_freeState(x);
    return rc;
}

/* "<where>: corrupt page table: <reason>", EBADMSG. */
__attribute__((format(printf, 3, 4))) static int bad(struct vmsnap_err *err, const char *where,
                                                     const char *fmt, ...)
{
    char what[240];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    return vmsnap_err_set(err, EBADMSG, "%s: corrupt page table: %s", where, what);
}

/* Decompress the next `want` bytes of the frame into `dst` (*ret: zstd's last answer, 0 once
 * the frame is whole); fails when the frame ends before or is damaged. */
static int take(ZSTD_DCtx *dc, ZSTD_inBuffer *in, uint8_t *dst, size_t want, size_t *ret,
                const char *where, struct vmsnap_err *err)
{
    ZSTD_outBuffer out = {dst, want, 0};
    while (out.pos < want) {
        const size_t in0 = in->pos, out0 = out.pos;
        *ret = ZSTD_decompressStream(dc, &out, in);
        if (ZSTD_isError(*ret))
            return bad(err, where, "zstd: %s", ZSTD_getErrorName(*ret));
        if (out.pos < want && (*ret == 0 || (in->pos == in0 && out.pos == out0)))
            return bad(err, where, "content ends after %zu of %zu bytes", out.pos, want);
    }
    return 0;
}

/* The header's fields into `t`, each checked (against the zstd content size `fcs` too). */
static int check_header(const uint8_t *h, uint64_t fcs, uint64_t max_size, const char *where,
                        struct vmsnap_pages *t, struct vmsnap_err *err)
{
    if (memcmp(h, PAGES_MAGIC, 8) != 0)
        return bad(err, where, "magic at byte 0 is not \"" PAGES_MAGIC "\"");
    if (get_le32(h + 8) != PAGES_VERSION)
        return bad(err, where, "version %u at byte 8 (this reader knows %u)", get_le32(h + 8),
                   PAGES_VERSION);
    if (get_le32(h + 12) != IMG_PAGE)
        return bad(err, where, "page size %u at byte 12 (expected %u)", get_le32(h + 12), IMG_PAGE);
    t->size = get_le64(h + 16);
    t->npages = get_le64(h + 24);
    t->populated = get_le64(h + 32);
    if (t->size > (uint64_t)INT64_MAX)
        return bad(err, where, "size %llu at byte 16 is negative", ULL(t->size));
    if (t->npages != (t->size + IMG_PAGE - 1) / IMG_PAGE)
        return bad(err, where, "%llu pages at byte 24 for a size of %llu bytes (expected %llu)",
                   ULL(t->npages), ULL(t->size), ULL((t->size + IMG_PAGE - 1) / IMG_PAGE));
    if (t->populated > t->npages)
        return bad(err, where, "%llu populated pages at byte 32 of %llu", ULL(t->populated),
                   ULL(t->npages));
    if (fcs != PAGES_HDR_LEN + 8 * t->npages)
        return bad(err, where, "zstd content size %llu for %llu pages (expected %llu)", ULL(fcs),
                   ULL(t->npages), ULL(PAGES_HDR_LEN + 8 * t->npages));
    if (t->size > max_size) /* a policy, not damage: checked once the fields agree */
        return vmsnap_err_set(err, EFBIG,
                              "%s: page table of a %llu-byte file exceeds the cap of %llu bytes "
                              "(--max-size; raise it for a larger image)",
                              where, ULL(t->size), ULL(max_size));
    return 0;
}

/* The frame around the content: a whole zstd frame, nothing after it, its content size given. */
static int check_frame(const uint8_t *b, size_t len, const char *where, uint64_t *fcs,
                       struct vmsnap_err *err)
{
    if (len < 4 || get_le32(b) != ZSTD_MAGICNUMBER)
        return bad(err, where, "not a zstd frame (%zu bytes)", len);
    const unsigned long long cs = ZSTD_getFrameContentSize(b, len);
    if (cs == ZSTD_CONTENTSIZE_ERROR)
        return bad(err, where, "damaged zstd frame header");
    if (cs == ZSTD_CONTENTSIZE_UNKNOWN)
        return bad(err, where, "zstd frame without a content size");
    const size_t fsz = ZSTD_findFrameCompressedSize(b, len);
    if (ZSTD_isError(fsz))
        return bad(err, where, "truncated or damaged zstd frame (%zu bytes): %s", len,
                   ZSTD_getErrorName(fsz));
    if (fsz != len)
        return bad(err, where, "%zu bytes after the zstd frame", len - fsz);
    if (cs < PAGES_HDR_LEN)
        return bad(err, where, "content of %llu bytes is shorter than the header", cs);
    *fcs = cs;
    return 0;
}

/* The hashes after the header: decompressed straight into the table, little-endian to host,
 * checked against the header's XXH64 and populated count. */
static int read_hashes(ZSTD_DCtx *dc, ZSTD_inBuffer *in, const uint8_t *hdr, size_t ret,
                       const char *where, struct vmsnap_pages *t, struct vmsnap_err *err)
{
    uint8_t *raw = (uint8_t *)t->h;
    if (t->npages && ret == 0)
        return bad(err, where, "content ends after the header");
    int rc = t->npages ? take(dc, in, raw, (size_t)(8 * t->npages), &ret, where, err) : 0;
    if (rc < 0)
        return rc;
    uint8_t extra;
    ZSTD_outBuffer more = {&extra, 1, 0};
    while (ret != 0 && !ZSTD_isError(ret) && more.pos == 0) {
        const size_t in0 = in->pos;
        ret = ZSTD_decompressStream(dc, &more, in);
        if (!ZSTD_isError(ret) && ret != 0 && in->pos == in0 && more.pos == 0)
            return bad(err, where, "truncated zstd frame");
    }
    if (ZSTD_isError(ret))
        return bad(err, where, "zstd: %s", ZSTD_getErrorName(ret));
    if (more.pos)
        return bad(err, where, "content longer than %llu pages", ULL(t->npages));
    if (XXH64(t->npages ? raw : hdr, (size_t)(8 * t->npages), 0) != get_le64(hdr + 40))
        return bad(err, where, "checksum mismatch (XXH64 at byte 40)");
    uint64_t pop = 0;
    for (uint64_t p = 0; p < t->npages; p++) {
        t->h[p] = get_le64(raw + 8 * p);
        pop += t->h[p] != 0;
    }
    if (pop != t->populated)
        return bad(err, where, "populated says %llu pages (byte 32), %llu hashes are not 0",
                   ULL(t->populated), ULL(pop));
    return 0;
}

int vmsnap_pages_decode(const void *buf, size_t len, const char *where, uint64_t max_size,
                        struct vmsnap_pages **out, struct vmsnap_err *err)
{
    *out = NULL;
    if (!where)
        where = "page table";
    if (!max_size)
        max_size = VMSNAP_IMAGE_DEFAULT_MAX_SIZE;
    uint64_t fcs = 0;
    int rc = check_frame(buf, len, where, &fcs, err);
    if (rc < 0)
        return rc;
    ZSTD_DCtx *dc = ZSTD_createDCtx();
    if (!dc)
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    ZSTD_inBuffer in = {buf, len, 0};
    uint8_t hdr[PAGES_HDR_LEN];
    struct vmsnap_pages hv = {0}, *t = NULL;
    size_t ret = 1;
    if ((rc = take(dc, &in, hdr, sizeof(hdr), &ret, where, err)) < 0 ||
        (rc = check_header(hdr, fcs, max_size, where, &hv, err)) < 0 ||
        (rc = vmsnap_pages_new(hv.size, &t, err)) < 0)
        goto out;
    t->populated = hv.populated;
    if ((rc = read_hashes(dc, &in, hdr, ret, where, t, err)) < 0)
        goto out;
    *out = t;
    t = NULL;
out:
    vmsnap_pages_free(t);
    ZSTD_freeDCtx(dc);
    return rc;
}
