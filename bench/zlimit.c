/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The codec's limit on this machine (bench/codec.sh): libzstd with exactly the pack's pinned
 * parameters (level, 1 MiB window at level <= 1, no zstd checksum, content size, no zstd
 * threads; lib/image/image_enc_zstd.c) over the populated non-zero 4 KiB pages of an image, in
 * memory, one frame per source range (64 MiB by default) as pack cuts them; on 1 and N threads,
 * compress and decompress; and XXH64 over the same bytes (pack hashes each range's content). No
 * file I/O, no page cache, no extent walk, no records: what is left of pack's and unpack's time
 * beyond these is the codec's own overhead.
 *
 *   vmsnap_zlimit IMAGE [THREADS] [FRAME_MIB] [LEVEL]
 * prints key=value lines (seconds are the best of 3 runs, wall; the _cpu keys are the CPU
 * seconds of the process in the run that was fastest by CPU, which a machine shared with other
 * work inflates less than wall time).
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>
#include <zstd.h>

#define PAGE 4096

struct frame {
    uint8_t *src; /* the range's non-zero pages, back to back */
    size_t len;
    uint8_t *dst; /* its compressed frame */
    size_t dlen, cap;
    uint8_t *out; /* decompressed */
};

static struct frame *frames;
static size_t nframes;
static atomic_size_t next;
static int level = 1;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int all_zero(const uint8_t *p)
{
    static const uint8_t z[PAGE];
    return !memcmp(p, z, PAGE);
}

/* The image's populated pages, non-zero ones only, grouped by source range. */
static void load(const char *path, uint64_t frame)
{
    int fd = open(path, O_RDONLY);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) < 0) {
        perror(path);
        exit(1);
    }
    nframes = (size_t)(((uint64_t)sb.st_size + frame - 1) / frame);
    frames = calloc(nframes, sizeof(*frames));
    uint8_t *page = malloc(PAGE);
    for (off_t pos = 0;;) {
        off_t d = lseek(fd, pos, SEEK_DATA);
        if (d < 0)
            break;
        off_t h = lseek(fd, d, SEEK_HOLE);
        for (off_t o = d & ~(off_t)(PAGE - 1); o < h; o += PAGE) {
            if (pread(fd, page, PAGE, o) != PAGE || all_zero(page))
                continue;
            struct frame *f = &frames[(uint64_t)o / frame];
            if (f->len == f->cap) {
                f->cap = f->cap ? f->cap * 2 : 1 << 20;
                f->src = realloc(f->src, f->cap);
            }
            memcpy(f->src + f->len, page, PAGE);
            f->len += PAGE;
        }
        pos = h;
    }
    free(page);
    close(fd);
}

static void set_params(ZSTD_CCtx *c)
{
    ZSTD_CCtx_setParameter(c, ZSTD_c_compressionLevel, level);
    if (level <= 1)
        ZSTD_CCtx_setParameter(c, ZSTD_c_windowLog, 20);
    ZSTD_CCtx_setParameter(c, ZSTD_c_checksumFlag, 0);
    ZSTD_CCtx_setParameter(c, ZSTD_c_contentSizeFlag, 1);
    ZSTD_CCtx_setParameter(c, ZSTD_c_nbWorkers, 0);
}

static void *compress_worker(void *arg)
{
    (void)arg;
    ZSTD_CCtx *c = ZSTD_createCCtx();
    set_params(c);
    for (size_t i; (i = atomic_fetch_add(&next, 1)) < nframes;) {
        struct frame *f = &frames[i];
        if (!f->len)
            continue;
        f->dlen = ZSTD_compress2(c, f->dst, ZSTD_compressBound(f->len), f->src, f->len);
        if (ZSTD_isError(f->dlen)) {
            fprintf(stderr, "compress: %s\n", ZSTD_getErrorName(f->dlen));
            exit(1);
        }
    }
    ZSTD_freeCCtx(c);
    return NULL;
}

static void *decompress_worker(void *arg)
{
    (void)arg;
    ZSTD_DCtx *d = ZSTD_createDCtx();
    for (size_t i; (i = atomic_fetch_add(&next, 1)) < nframes;) {
        struct frame *f = &frames[i];
        if (!f->len)
            continue;
        size_t r = ZSTD_decompressDCtx(d, f->out, f->len, f->dst, f->dlen);
        if (ZSTD_isError(r) || r != f->len) {
            fprintf(stderr, "decompress: %s\n", ZSTD_isError(r) ? ZSTD_getErrorName(r) : "size");
            exit(1);
        }
    }
    ZSTD_freeDCtx(d);
    return NULL;
}

static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Best of 3 runs of `fn` on `threads` threads: wall seconds, and CPU seconds in *cpu. */
static double run(void *(*fn)(void *), unsigned threads, double *cpu)
{
    double best = 1e9;
    *cpu = 1e9;
    for (int rep = 0; rep < 3; rep++) {
        atomic_store(&next, 0);
        pthread_t t[64];
        double t0 = now(), c0 = cpu_now();
        for (unsigned i = 0; i < threads; i++)
            pthread_create(&t[i], NULL, fn, NULL);
        for (unsigned i = 0; i < threads; i++)
            pthread_join(t[i], NULL);
        double dt = now() - t0, dc = cpu_now() - c0;
        best = dt < best ? dt : best;
        *cpu = dc < *cpu ? dc : *cpu;
    }
    return best;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s IMAGE [THREADS] [FRAME_MIB] [LEVEL]\n", argv[0]);
        return 2;
    }
    unsigned threads = argc > 2 ? (unsigned)atoi(argv[2]) : 2;
    uint64_t frame = (argc > 3 ? (uint64_t)atoi(argv[3]) : 64) << 20;
    level = argc > 4 ? atoi(argv[4]) : 1;
    if (threads < 1 || threads > 64 || !frame)
        return 2;
    load(argv[1], frame);
    size_t bytes = 0, cbytes = 0;
    for (size_t i = 0; i < nframes; i++) {
        struct frame *f = &frames[i];
        bytes += f->len;
        f->dst = malloc(ZSTD_compressBound(f->len) + 1);
        f->out = malloc(f->len + 1);
        memset(f->out, 1, f->len); /* faulted in before timing, as a reused buffer would be */
    }
    double c1c, cnc, d1c, dnc;
    double c1 = run(compress_worker, 1, &c1c), cn = run(compress_worker, threads, &cnc);
    for (size_t i = 0; i < nframes; i++)
        cbytes += frames[i].dlen;
    double d1 = run(decompress_worker, 1, &d1c), dn = run(decompress_worker, threads, &dnc);
    double h = 1e9;
    uint64_t sum = 0;
    for (int rep = 0; rep < 3; rep++) {
        double t0 = now();
        for (size_t i = 0; i < nframes; i++)
            sum ^= XXH64(frames[i].src, frames[i].len, 0);
        double dt = now() - t0;
        h = dt < h ? dt : h;
    }
    printf("bytes=%zu\ncompressed=%zu\nframes=%zu\nthreads=%u\n", bytes, cbytes, nframes, threads);
    printf("compress_1=%.3f\ncompress_n=%.3f\ndecompress_1=%.3f\ndecompress_n=%.3f\n", c1, cn, d1,
           dn);
    printf(
        "compress_1_cpu=%.3f\ncompress_n_cpu=%.3f\ndecompress_1_cpu=%.3f\ndecompress_n_cpu=%.3f\n",
        c1c, cnc, d1c, dnc);
    printf("xxh64_1=%.3f\nxxh64_sum=%016llx\n", h, (unsigned long long)sum);
    return 0;
}
