/* SPDX-License-Identifier: Apache-2.0 */
/* vmsnap pack / unpack. */
#include "cli.h"
#include "vmsnap/image.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h> /* optarg, optind */
#include <json.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* --json: the summary in the run's object (zero pages elided: pack only, else null) */
static void summary_json(bool pack, const struct vmsnap_image_stats *st, double wall, double cpu)
{
    json_object *o = cli_out();
    json_object_object_add(o, "logical_bytes", json_object_new_int64((int64_t)st->total_size));
    json_object_object_add(o, "populated_bytes", json_object_new_int64((int64_t)st->populated));
    json_object_object_add(o, "zero_elided_bytes",
                           pack ? json_object_new_int64((int64_t)st->zero_elided) : NULL);
    json_object_object_add(o, "object_bytes", json_object_new_int64((int64_t)st->object_size));
    json_object_object_add(o, "frames", json_object_new_int64((int64_t)st->frames));
    double ratio = st->object_size ? (double)st->populated / (double)st->object_size : 0;
    char r[32];
    snprintf(r, sizeof(r), "%.4f", ratio);
    json_object_object_add(o, "ratio", json_object_new_double_s(ratio, r));
    json_object_object_add(o, "seconds", cli_json_seconds(wall));
    json_object_object_add(o, "cpu_seconds", cli_json_seconds(cpu));
}

static void summary(const char *verb, const struct vmsnap_image_stats *st, double wall, double cpu)
{
    if (cli_json)
        summary_json(!strcmp(verb, "pack"), st, wall, cpu);
    if (cli_quiet || cli_json)
        return;
    char a[32], b[32], c[32], d[32], r[32];
    double ratio = st->object_size ? (double)st->populated / (double)st->object_size : 0;
    fprintf(stderr,
            "%s: logical %s, populated %s, zero pages elided %s, object %s (%.2fx), %llu frames, "
            "%.3f s, %s/s of populated data, %.2f CPU s\n",
            verb, cli_bytes(a, sizeof(a), st->total_size), cli_bytes(b, sizeof(b), st->populated),
            cli_bytes(c, sizeof(c), st->zero_elided), cli_bytes(d, sizeof(d), st->object_size),
            ratio, (unsigned long long)st->frames, wall,
            cli_bytes(r, sizeof(r), wall > 0 ? (uint64_t)((double)st->populated / wall) : 0), cpu);
}

/* What pack and unpack do around the library call: the progress line, the clocks, then the
 * failure or the summary line. */
struct run {
    struct cli_progress p;
    double t0, c0;
    /* pack's progress: the populated bytes below the offset the encoder reached, by a walk of
     * SRC's data extents (SEEK_DATA/SEEK_HOLE) that moves forward with it */
    int fd;
    uint64_t pos, data;
};

static uint64_t populated_below(void *arg, uint64_t off)
{
    struct run *r = arg;
    while (r->pos < off) {
        off_t d = lseek(r->fd, (off_t)r->pos, SEEK_DATA);
        if (d < 0 || (uint64_t)d >= off) { /* a hole up to off (ENXIO: up to the end) */
            r->pos = off;
            break;
        }
        off_t h = lseek(r->fd, d, SEEK_HOLE);
        uint64_t end = h < 0 || (uint64_t)h > off ? off : (uint64_t)h;
        r->data += end - (uint64_t)d;
        r->pos = end;
    }
    return r->data;
}

static void run_start(struct run *r, const char *verb, const char *src)
{
    cli_progress_init(&r->p, verb);
    r->t0 = cli_now();
    r->c0 = cli_cpu_seconds();
    r->fd = -1;
    r->pos = r->data = 0;
    struct stat st;
    /* the total: one walk of the extents up front (as cheap as the encoder's own), then again
     * from the start as the encoder goes */
    if (src && r->p.active && (r->fd = open(src, O_RDONLY | O_CLOEXEC)) >= 0 &&
        fstat(r->fd, &st) == 0 && S_ISREG(st.st_mode)) {
        r->p.map_total = populated_below(r, (uint64_t)st.st_size);
        r->pos = r->data = 0;
        r->p.map = populated_below;
        r->p.map_arg = r;
    }
}

static int run_end(struct run *r, const char *verb, int rc, const struct vmsnap_err *err,
                   const struct vmsnap_image_stats *st)
{
    cli_progress_end(&r->p);
    if (r->fd >= 0)
        close(r->fd);
    if (rc < 0)
        return cli_fail(verb, err);
    summary(verb, st, cli_now() - r->t0, cli_cpu_seconds() - r->c0);
    return EXIT_OK;
}

/* -T N (or -j N, its older name) (optarg): 0 is all CPUs; -1 after the usage error. */
static int threads_opt(const char *verb, unsigned *threads)
{
    unsigned long v;
    if (cli_parse_uint(optarg, 0, 256, &v) < 0)
        return cli_usage(verb, "-T wants a thread count from 0 (all CPUs) to 256, not '%s'",
                         optarg),
               -1;
    *threads = (unsigned)v;
    return 0;
}

const struct cli_opt cli_pack_opts[] = {
    {"json", 0, 'J', NULL, CLI_K_NONE, NULL, NULL, "the summary as one JSON object on stdout"},
    {"force", 'f', 'f', NULL, CLI_K_NONE, NULL, NULL, "replace an existing DST"},
    {"threads", 'T', 'T', "N", CLI_K_NONE, NULL, NULL,
     "compress on N threads (0, the default: all CPUs); the output is the same for every N"},
    {NULL, 'j', 'T', "N", CLI_K_NONE, NULL, NULL, "the older name of -T"},
    {"frame-size", 0, 'F', "SIZE", CLI_K_NONE, NULL, NULL,
     "the source range of one independent frame (default 64M)"},
    {"level", 0, 'l', "L", CLI_K_NONE, NULL, NULL, "the zstd level, 1 to 22 (default 1)"},
    {"keep-zero-pages", 0, 'z', NULL, CLI_K_NONE, NULL, NULL,
     "store all-zero pages of data extents too"},
    {"keep-cache", 0, 'k', NULL, CLI_K_NONE, NULL, NULL,
     "leave SRC's pages in the page cache (they are dropped as they are read)"},
    {"fsync", 0, 's', NULL, CLI_K_NONE, NULL, NULL, "make DST durable before it appears"},
    CLI_OPT_END,
};

int cmd_pack(int argc, char **argv)
{
    struct vmsnap_pack_opts o = {0};
    unsigned long v;
    bool force = false;
    int c;
    optind = 1;
    while ((c = cli_getopt(argc, argv, cli_pack_opts)) != -1) {
        switch (c) {
        case 'T':
            if (threads_opt("pack", &o.threads) < 0)
                return EXIT_USAGE;
            break;
        case 'f':
            force = true;
            break;
        case 'J':
            cli_json = true;
            break;
        case 'F':
            if (cli_parse_size(optarg, &o.frame_size) < 0 || o.frame_size == 0)
                return cli_usage("pack", "--frame-size wants a size like 64M, not '%s'", optarg);
            break;
        case 'l':
            if (cli_parse_uint(optarg, 1, 22, &v) < 0)
                return cli_usage("pack", "--level wants a zstd level from 1 to 22, not '%s'",
                                 optarg);
            o.level = (int)v;
            break;
        case 'z':
            o.keep_zero_pages = true;
            break;
        case 'k':
            o.keep_cache = true;
            break;
        case 's':
            o.fsync = true;
            break;
        case 'h':
            return cli_verb_help("pack");
        default:
            return cli_usage("pack", "bad option");
        }
    }
    if (argc - optind != 2)
        return cli_usage("pack", "wants SRC and DST");
    struct vmsnap_err perr = {0};
    if (vmsnap_image_check_pack_opts(&o, &perr) < 0)
        return cli_usage("pack", "%s", perr.msg);
    const char *src = argv[optind], *dst = argv[optind + 1];
    if (!strcmp(src, "-"))
        return cli_usage("pack", "SRC '-': pack reads a file, not stdin (it walks the file's "
                                 "extents: save the stream to a file, then pack it)");
    if (strcmp(dst, "-") == 0 && isatty(STDOUT_FILENO))
        return cli_usage("pack", "refusing to write an image to a terminal");
    if (strcmp(dst, "-") == 0 && cli_json)
        return cli_usage("pack", "--json with DST '-': the image and the JSON would share stdout");
    cli_subject("source_path", src);
    cli_subject("path", dst);
    int rc = strcmp(dst, "-") ? cli_refuse_existing("pack", dst, force) : EXIT_OK;
    if (rc != EXIT_OK)
        return rc;
    struct run r;
    run_start(&r, "pack", src);
    o.progress = cli_progress_cb;
    o.progress_arg = &r.p;
    struct vmsnap_err err = {0};
    struct vmsnap_image_stats st;
    return run_end(&r, "pack", vmsnap_image_pack(src, dst, &o, &st, &err), &err, &st);
}

const struct cli_opt cli_unpack_opts[] = {
    {"json", 0, 'J', NULL, CLI_K_NONE, NULL, NULL, "the summary as one JSON object on stdout"},
    {"force", 'f', 'f', NULL, CLI_K_NONE, NULL, NULL, "replace an existing DST"},
    {"threads", 'T', 'T', "N", CLI_K_NONE, NULL, NULL,
     "decoder threads (0, the default: all CPUs)"},
    {NULL, 'j', 'T', "N", CLI_K_NONE, NULL, NULL, "the older name of -T"},
    {"max-size", 0, 'm', "SIZE", CLI_K_NONE, NULL, NULL,
     "refuse an image of a larger logical size (default 64T)"},
    {"fsync", 0, 's', NULL, CLI_K_NONE, NULL, NULL,
     "make DST durable before it is renamed into place"},
    {"drop-cache", 0, 'D', NULL, CLI_K_NONE, NULL, NULL,
     "then drop DST's page cache (writeback started, retried for a few seconds)"},
    CLI_OPT_END,
};

int cmd_unpack(int argc, char **argv)
{
    struct vmsnap_unpack_opts o = {0};
    bool drop_cache = false, force = false;
    int c;
    optind = 1;
    while ((c = cli_getopt(argc, argv, cli_unpack_opts)) != -1) {
        switch (c) {
        case 'T':
            if (threads_opt("unpack", &o.threads) < 0)
                return EXIT_USAGE;
            break;
        case 'f':
            force = true;
            break;
        case 'J':
            cli_json = true;
            break;
        case 'm':
            if (cli_parse_size(optarg, &o.max_size) < 0 || o.max_size == 0)
                return cli_usage("unpack", "--max-size wants a size like 64T, not '%s'", optarg);
            break;
        case 's':
            o.fsync = true;
            break;
        case 'D':
            drop_cache = true;
            break;
        case 'h':
            return cli_verb_help("unpack");
        default:
            return cli_usage("unpack", "bad option");
        }
    }
    if (argc - optind != 2)
        return cli_usage("unpack", "wants SRC and DST");
    const char *src = argv[optind], *dst = argv[optind + 1];
    if (strcmp(dst, "-") == 0)
        return cli_usage("unpack", "DST must be a file path (the output is a sparse file)");
    cli_subject("source_path", src);
    cli_subject("path", dst);
    int rc = cli_refuse_existing("unpack", dst, force);
    if (rc != EXIT_OK)
        return rc;
    struct run r;
    run_start(&r, "unpack", NULL);
    o.progress = cli_progress_cb;
    o.progress_arg = &r.p;
    struct vmsnap_err err = {0};
    struct vmsnap_image_stats st;
    rc = run_end(&r, "unpack", vmsnap_image_unpack(src, dst, &o, &st, &err), &err, &st);
    return rc == EXIT_OK && drop_cache ? cli_drop_cache("unpack", dst) : rc;
}
