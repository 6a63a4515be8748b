/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Packing with a base (vmsnap_pack_opts.base): random files and random changes, 1 and 4 threads.
 * The object rebuilt from the sink's writes and the base frames it was told to copy must equal a
 * plain pack of the new file byte for byte; every run of copied frames must hold at least
 * base_min_run bytes and follow at least base_min_run written bytes (or none) since the previous
 * run; a base of another frame size is ignored; unchanged files reuse nearly everything.
 */
#include "img_util.h"

#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MiB (1ull << 20)

static uint64_t rng = 0xba5e5eedull;

/* A sink that rebuilds the object from writes and base copies, and checks the run rules. */
struct rec_sink {
    struct membuf_sink out;
    const struct membuf_sink *base;
    uint64_t min_run;
    uint64_t seg;     /* bytes written since the last copy (the header counts) */
    uint64_t run;     /* bytes of the current run of copies */
    uint64_t run_end; /* base offset where the current run ends */
    bool in_run;
    uint64_t runs, copied, violations;
};

static void end_run(struct rec_sink *r)
{
    if (r->in_run && r->run < r->min_run)
        r->violations++;
    r->in_run = false;
}

static int rec_write(void *arg, const void *buf, size_t len, struct vmsnap_err *err)
{
    (void)err;
    struct rec_sink *r = arg;
    end_run(r);
    if (r->out.len + len > r->out.cap) {
        size_t cap = (r->out.len + len) * 2;
        r->out.data = realloc(r->out.data, cap);
        REQUIRE(r->out.data);
        r->out.cap = cap;
    }
    memcpy(r->out.data + r->out.len, buf, len);
    r->out.len += len;
    r->seg += len;
    return 0;
}

static int rec_copy(void *arg, const struct vmsnap_frame_info *f, struct vmsnap_err *err)
{
    struct rec_sink *r = arg;
    REQUIRE(f->offset + f->csize <= r->base->len);
    if (!(r->in_run && f->offset == r->run_end)) {
        end_run(r);
        /* a run starts: the written bytes before it form a part of their own, or there are none */
        if (r->seg > 0 && r->seg < r->min_run)
            r->violations++;
        r->in_run = true;
        r->run = 0;
        r->runs++;
    }
    r->seg = 0;
    r->run += f->csize;
    r->run_end = f->offset + f->csize;
    r->copied += f->csize;
    if (r->out.len + f->csize > r->out.cap) {
        size_t cap = (r->out.len + (size_t)f->csize) * 2;
        r->out.data = realloc(r->out.data, cap);
        REQUIRE(r->out.data);
        r->out.cap = cap;
    }
    memcpy(r->out.data + r->out.len, r->base->data + f->offset, (size_t)f->csize);
    r->out.len += (size_t)f->csize;
    (void)err;
    return 0;
}

static void pack_with_base(const char *path, unsigned threads, uint64_t frame_size,
                           const struct membuf_sink *base_obj, uint64_t min_run, struct rec_sink *r,
                           struct vmsnap_image_stats *st)
{
    struct vmsnap_membuf mb = {base_obj->data, base_obj->len};
    struct vmsnap_source bsrc;
    vmsnap_source_mem(&bsrc, &mb, "base");
    struct vmsnap_image *base = NULL;
    struct vmsnap_err err = {0};
    REQUIRE(vmsnap_image_open(&bsrc, 0, &base, &err) == 1);
    memset(r, 0, sizeof(*r));
    r->base = base_obj;
    r->min_run = min_run;
    struct vmsnap_sink sink = {rec_write, r, rec_copy};
    int fd = open(path, O_RDONLY);
    REQUIRE(fd >= 0);
    struct vmsnap_pack_opts o = {.threads = threads,
                                 .frame_size = frame_size,
                                 .keep_cache = true,
                                 .base = base,
                                 .base_min_run = min_run};
    int rc = vmsnap_image_pack_fd(fd, path, &sink, &o, st, &err);
    close(fd);
    CHECKF(rc == 0, "pack with a base: %s", err.msg);
    end_run(r);
    vmsnap_image_free(base);
}

/* Rewrite `n` random frame-sized regions of `path` (some become zero, some random, some text). */
static void mutate(const char *path, uint64_t size, uint64_t frame_size, unsigned n)
{
    int fd = open(path, O_RDWR);
    REQUIRE(fd >= 0);
    uint8_t *buf = malloc(frame_size);
    REQUIRE(buf);
    for (unsigned i = 0; i < n; i++) {
        uint64_t f = t_rand(&rng) % (size / frame_size);
        uint64_t len = 4096 * (1 + t_rand(&rng) % (frame_size / 4096));
        for (uint64_t k = 0; k < len; k += 8) {
            uint64_t v = t_rand(&rng);
            memcpy(buf + k, &v, 8);
        }
        if (i % 3 == 1)
            memset(buf, 0, len);
        REQUIRE(pwrite(fd, buf, len, (off_t)(f * frame_size)) == (ssize_t)len);
    }
    free(buf);
    close(fd);
}

static void copy_file(const char *from, const char *to)
{
    int a = open(from, O_RDONLY), b = open(to, O_CREAT | O_TRUNC | O_WRONLY, 0600);
    REQUIRE(a >= 0 && b >= 0);
    struct stat sb;
    REQUIRE(fstat(a, &sb) == 0 && ftruncate(b, sb.st_size) == 0);
    static uint8_t buf[1 << 20];
    for (off_t off = 0; off < sb.st_size;) {
        off_t d = lseek(a, off, SEEK_DATA);
        if (d < 0)
            break;
        off_t h = lseek(a, d, SEEK_HOLE);
        for (off_t p = d; p < h;) {
            size_t n = (size_t)(h - p) < sizeof(buf) ? (size_t)(h - p) : sizeof(buf);
            REQUIRE(pread(a, buf, n, p) == (ssize_t)n && pwrite(b, buf, n, p) == (ssize_t)n);
            p += (off_t)n;
        }
        off = h;
    }
    close(a);
    close(b);
}

static unsigned rounds_with_copies;

static void one_case(unsigned round, uint64_t size, uint64_t frame_size, uint64_t min_run,
                     unsigned changes)
{
    const char *v1 = t_path("v1");
    const char *v2 = t_path("v2");
    struct gen_extent ext[64];
    size_t n = gen_random_layout(&rng, size, ext, 64, round % 2);
    gen_file(v1, size, ext, n, t_rand(&rng));
    copy_file(v1, v2);
    mutate(v2, size, frame_size, changes);

    struct membuf_sink base, plain;
    struct vmsnap_image_stats sb, sp;
    pack_to_mem(v1, 2, frame_size, false, &base, &sb);
    pack_to_mem(v2, 2, frame_size, false, &plain, &sp);
    struct rec_sink r1, r4;
    struct vmsnap_image_stats s1, s4;
    pack_with_base(v2, 1, frame_size, &base, min_run, &r1, &s1);
    pack_with_base(v2, 4, frame_size, &base, min_run, &r4, &s4);
    CHECKF(r1.out.len == plain.len && !memcmp(r1.out.data, plain.data, plain.len),
           "round %u: object rebuilt from the base differs from a plain pack (%zu vs %zu bytes)",
           round, r1.out.len, plain.len);
    CHECKF(r4.out.len == r1.out.len && !memcmp(r4.out.data, r1.out.data, r1.out.len) &&
               r4.copied == r1.copied && r4.runs == r1.runs,
           "round %u: -j1 and -j4 differ", round);
    CHECKF(r1.violations == 0, "round %u: %llu run-rule violations (min %llu)", round,
           (unsigned long long)r1.violations, (unsigned long long)min_run);
    CHECKF(s1.reused_bytes == r1.copied && s1.object_size == plain.len,
           "round %u: stats reused %llu vs copied %llu", round, (unsigned long long)s1.reused_bytes,
           (unsigned long long)r1.copied);
    CHECKF(s1.populated == sp.populated && s1.extents == sp.extents &&
               s1.zero_elided == sp.zero_elided && s1.frames == sp.frames,
           "round %u: stats differ from a plain pack", round);
    rounds_with_copies += r1.copied > 0;
    membuf_sink_free(&r1.out);
    membuf_sink_free(&r4.out);
    membuf_sink_free(&base);
    membuf_sink_free(&plain);
}

int main(void)
{
    t_tmpdir();
    /* random layouts and changes; minimum runs of 256 KiB to 1 MiB against objects of 7-11 MB
     * (mixed, compressible data), so that runs qualify and the rules are exercised */
    for (unsigned round = 0; round < 12; round++)
        one_case(round, 48 * MiB, 1 * MiB, (256 << 10) << (round % 3), 1 + round % 6);
    /* a few changed frames in 48 leave long unchanged runs: reuse must actually happen */
    CHECKF(rounds_with_copies >= 9, "only %u of 12 rounds reused anything", rounds_with_copies);

    /* an unchanged file: everything but the header/sentinel frames comes from the base, in one
     * run (the head is compressed only when the header alone precedes it) */
    const char *v = t_path("same");
    struct gen_extent ext[] = {{0, 20 * MiB, FILL_RANDOM}, {24 * MiB, 8 * MiB, FILL_MIXED}};
    gen_file(v, 32 * MiB, ext, 2, 7);
    struct membuf_sink base;
    struct vmsnap_image_stats sb, s;
    pack_to_mem(v, 2, MiB, false, &base, &sb);
    struct rec_sink r;
    pack_with_base(v, 2, MiB, &base, 4 * MiB, &r, &s);
    CHECKF(r.out.len == base.len && !memcmp(r.out.data, base.data, base.len),
           "unchanged file: object differs from the base");
    CHECKF(r.copied + 5 * MiB >= base.len - 1024 && r.violations == 0,
           "unchanged file: only %llu of %zu bytes reused", (unsigned long long)r.copied, base.len);
    membuf_sink_free(&r.out);

    /* a base of another frame size is ignored: no copies, same bytes */
    struct membuf_sink base2;
    pack_to_mem(v, 2, 2 * MiB, false, &base2, &sb);
    pack_with_base(v, 2, MiB, &base2, MiB, &r, &s);
    CHECKF(r.copied == 0 && s.reused == 0 && r.out.len == base.len &&
               !memcmp(r.out.data, base.data, base.len),
           "a base of another frame size was used");
    membuf_sink_free(&r.out);
    membuf_sink_free(&base);
    membuf_sink_free(&base2);
    return t_done();
}
