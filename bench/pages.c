/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What page tables cost (bench/codec.sh, #23): vmsnap_pages_hash_fd over an image on 1 and N
 * threads, and vmsnap_image_pack_fd on N threads into a sink that drops the bytes, without and
 * with pages_out, and as a delta of the image over its own table (nothing changed: the hash
 * pass of a delta with no data). The image's page cache is kept (an image on tmpfs has nothing
 * else). Wall and CPU seconds (user + sys of the process), the best of 3 runs each, runs of
 * the two packs alternating.
 *
 *   vmsnap_pagebench IMAGE [THREADS]
 * prints key=value lines.
 */
#include "vmsnap/image.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static double cpu(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
}

static int drop(void *arg, const void *buf, size_t len, struct vmsnap_err *err)
{
    (void)buf;
    (void)err;
    *(uint64_t *)arg += len;
    return 0;
}

struct best {
    double wall, cpu;
};

static void keep(struct best *b, double w0, double c0)
{
    double w = now() - w0, c = cpu() - c0;
    if (b->wall == 0 || w < b->wall)
        *b = (struct best){w, c};
}

static void die(const char *what, const struct vmsnap_err *err)
{
    fprintf(stderr, "vmsnap_pagebench: %s: %s\n", what, err->msg);
    exit(1);
}

/* One pack of `fd` (pages_out when `pages`, a delta over `parent` when not NULL). */
static void pack(int fd, const char *name, unsigned threads, struct vmsnap_pages **pages,
                 const struct vmsnap_pages *parent, struct best *b, uint64_t *bytes)
{
    uint64_t n = 0;
    struct vmsnap_sink sink = {.write = drop, .arg = &n};
    struct vmsnap_pack_opts o = {
        .threads = threads, .keep_cache = true, .pages_out = pages, .delta_parent = parent};
    struct vmsnap_err err = {0};
    double w0 = now(), c0 = cpu();
    if (vmsnap_image_pack_fd(fd, name, &sink, &o, NULL, &err) < 0)
        die("pack", &err);
    keep(b, w0, c0);
    *bytes = n;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: vmsnap_pagebench IMAGE [THREADS]\n");
        return 2;
    }
    const unsigned n = argc > 2 ? (unsigned)atoi(argv[2]) : 2;
    int fd = open(argv[1], O_RDONLY);
    if (fd < 0) {
        perror(argv[1]);
        return 1;
    }
    struct vmsnap_err err = {0};
    struct vmsnap_pages *t = NULL;
    struct best h1 = {0}, hn = {0}, p0 = {0}, p1 = {0}, dz = {0};
    uint64_t populated = 0, npages = 0, plain = 0, with = 0, delta = 0;
    for (int r = 0; r < 3; r++) {
        for (int k = 0; k < 2; k++) {
            double w0 = now(), c0 = cpu();
            if (vmsnap_pages_hash_fd(fd, argv[1], k ? n : 1, true, &t, &err) < 0)
                die("hash", &err);
            keep(k ? &hn : &h1, w0, c0);
            populated = t->populated;
            npages = t->npages;
            vmsnap_pages_free(t);
        }
        pack(fd, argv[1], n, NULL, NULL, &p0, &plain);
        pack(fd, argv[1], n, &t, NULL, &p1, &with);
        pack(fd, argv[1], n, NULL, t, &dz, &delta);
        vmsnap_pages_free(t);
    }
    close(fd);
    printf("pages=%llu\npopulated=%llu\nthreads=%u\n", (unsigned long long)npages,
           (unsigned long long)populated, n);
    printf("hash_1_wall=%.3f\nhash_1_cpu=%.3f\nhash_n_wall=%.3f\nhash_n_cpu=%.3f\n", h1.wall,
           h1.cpu, hn.wall, hn.cpu);
    printf("pack_wall=%.3f\npack_cpu=%.3f\npack_pages_wall=%.3f\npack_pages_cpu=%.3f\n", p0.wall,
           p0.cpu, p1.wall, p1.cpu);
    printf("delta_same_wall=%.3f\ndelta_same_cpu=%.3f\ndelta_same_bytes=%llu\n", dz.wall, dz.cpu,
           (unsigned long long)delta);
    printf("pack_bytes=%llu\npack_pages_bytes=%llu\n", (unsigned long long)plain,
           (unsigned long long)with);
    return plain == with ? 0 : 1; /* pages_out must not change the object */
}
