/* SPDX-License-Identifier: Apache-2.0 */
/* vmsnap pack / unpack. */
#include "cli.h"
#include "vmsnap/image.h"

#include <getopt.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static void summary(const char *verb, const struct vmsnap_image_stats *st, double wall, double cpu)
{
    if (cli_quiet)
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
};

static void run_start(struct run *r, const char *verb)
{
    cli_progress_init(&r->p, verb);
    r->t0 = cli_now();
    r->c0 = cli_cpu_seconds();
}

static int run_end(struct run *r, const char *verb, int rc, const struct vmsnap_err *err,
                   const struct vmsnap_image_stats *st)
{
    cli_progress_end(&r->p);
    if (rc < 0)
        return cli_fail(verb, err);
    summary(verb, st, cli_now() - r->t0, cli_cpu_seconds() - r->c0);
    return EXIT_OK;
}

/* -j N (optarg): -1 after the usage error. */
static int threads_opt(const char *verb, unsigned *threads)
{
    unsigned long v;
    if (cli_parse_uint(optarg, 1, 256, &v) < 0)
        return cli_usage(verb, "-j wants a thread count from 1 to 256, not '%s'", optarg), -1;
    *threads = (unsigned)v;
    return 0;
}

int cmd_pack(int argc, char **argv)
{
    static const struct option lopts[] = {
        {"threads", required_argument, NULL, 'j'},
        {"frame-size", required_argument, NULL, 'f'},
        {"level", required_argument, NULL, 'l'},
        {"keep-zero-pages", no_argument, NULL, 'z'},
        {"keep-cache", no_argument, NULL, 'k'},
        {"fsync", no_argument, NULL, 's'},
        {"help", no_argument, NULL, 'h'},
        CLI_COMMON_LONGOPTS,
        {0, 0, 0, 0},
    };
    struct vmsnap_pack_opts o = {0};
    unsigned long v;
    int c;
    optind = 1;
    while ((c = cli_getopt(argc, argv, "j:hqv", lopts)) != -1) {
        switch (c) {
        case 'j':
            if (threads_opt("pack", &o.threads) < 0)
                return EXIT_USAGE;
            break;
        case 'f':
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
            printf("usage: vmsnap pack [-j N] [--frame-size SIZE] [--level L] [--keep-zero-pages] "
                   "[--keep-cache] [--fsync] SRC DST\n");
            cli_verb_description("pack");
            return EXIT_OK;
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
    struct run r;
    run_start(&r, "pack");
    o.progress = cli_progress_cb;
    o.progress_arg = &r.p;
    struct vmsnap_err err = {0};
    struct vmsnap_image_stats st;
    return run_end(&r, "pack", vmsnap_image_pack(src, dst, &o, &st, &err), &err, &st);
}

int cmd_unpack(int argc, char **argv)
{
    static const struct option lopts[] = {
        {"threads", required_argument, NULL, 'j'},
        {"max-size", required_argument, NULL, 'm'},
        {"fsync", no_argument, NULL, 's'},
        {"drop-cache", no_argument, NULL, 'D'},
        {"help", no_argument, NULL, 'h'},
        CLI_COMMON_LONGOPTS,
        {0, 0, 0, 0},
    };
    struct vmsnap_unpack_opts o = {0};
    bool drop_cache = false;
    int c;
    optind = 1;
    while ((c = cli_getopt(argc, argv, "j:hqv", lopts)) != -1) {
        switch (c) {
        case 'j':
            if (threads_opt("unpack", &o.threads) < 0)
                return EXIT_USAGE;
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
            printf(
                "usage: vmsnap unpack [-j N] [--max-size SIZE] [--fsync] [--drop-cache] SRC DST\n");
            cli_verb_description("unpack");
            return EXIT_OK;
        default:
            return cli_usage("unpack", "bad option");
        }
    }
    if (argc - optind != 2)
        return cli_usage("unpack", "wants SRC and DST");
    const char *src = argv[optind], *dst = argv[optind + 1];
    if (strcmp(dst, "-") == 0)
        return cli_usage("unpack", "DST must be a file path (the output is a sparse file)");
    struct run r;
    run_start(&r, "unpack");
    o.progress = cli_progress_cb;
    o.progress_arg = &r.p;
    struct vmsnap_err err = {0};
    struct vmsnap_image_stats st;
    int rc = run_end(&r, "unpack", vmsnap_image_unpack(src, dst, &o, &st, &err), &err, &st);
    return rc == EXIT_OK && drop_cache ? cli_drop_cache("unpack", dst) : rc;
}
