/* SPDX-License-Identifier: Apache-2.0 */
/* vmsnap inspect: describe an image, optionally verifying every checksum. */
#include "cli.h"
#include "vmsnap/image.h"

#include <getopt.h> /* optarg, optind */
#include <json.h>
#include <stdio.h>

const struct cli_opt cli_inspect_opts[] = {
    {"json", 0, 'J', NULL, CLI_K_NONE, NULL, NULL, "the description as one JSON object on stdout"},
    {"verify", 0, 'V', NULL, CLI_K_NONE, NULL, NULL,
     "decode everything and check every checksum, writing nothing"},
    {"threads", 'T', 'T', "N", CLI_K_NONE, NULL, NULL,
     "decoder threads for --verify (0, the default: all CPUs)"},
    {NULL, 'j', 'T', "N", CLI_K_NONE, NULL, NULL, "the older name of -T"},
    {"max-size", 0, 'm', "SIZE", CLI_K_NONE, NULL, NULL,
     "refuse an image of a larger logical size (default 64T)"},
    CLI_OPT_END,
};

int cmd_inspect(int argc, char **argv)
{
    bool json = false, verify = false;
    unsigned threads = 0;
    uint64_t max_size = 0;
    unsigned long v;
    int c;
    optind = 1;
    while ((c = cli_getopt(argc, argv, cli_inspect_opts)) != -1) {
        switch (c) {
        case 'J':
            cli_json = true;
            break;
        case 'V':
            verify = true;
            break;
        case 'T':
            if (cli_parse_uint(optarg, 0, 256, &v) < 0)
                return cli_usage("inspect", "-T wants a thread count from 0 (all CPUs) to 256");
            threads = (unsigned)v;
            break;
        case 'm':
            if (cli_parse_size(optarg, &max_size) < 0 || max_size == 0)
                return cli_usage("inspect", "--max-size wants a size like 64T, not '%s'", optarg);
            break;
        case 'h':
            return cli_verb_help("inspect");
        default:
            return cli_usage("inspect", "bad option");
        }
    }
    if (argc - optind != 1)
        return cli_usage("inspect", "wants one SRC");
    const char *src = argv[optind];
    cli_subject("path", src);
    json = cli_json;
    struct vmsnap_err err = {0};
    struct vmsnap_image_stats st = {0};
    if (vmsnap_image_inspect(src, verify, threads, max_size, &st, &err) < 0)
        return cli_fail("inspect", &err);
    const char *format = st.plain_zstd       ? "plain-zstd"
                         : st.has_seek_table ? "sparse-extent-v2+seek-table"
                                             : "sparse-extent-v2";
    double ratio = st.object_size ? (double)st.populated / (double)st.object_size : 0;
    /* zero pages elided and the frame size are recorded in the seek table only */
    const bool known = st.has_seek_table;
    const char *checked = verify || !st.has_seek_table
                              ? (st.has_seek_table ? "every frame decoded, all checksums match"
                                                   : "every frame decoded (zstd's checksums "
                                                     "checked where the frames carry them)")
                              : NULL;
    if (json) {
        json_object *o = cli_out();
        json_object_object_add(o, "format", json_object_new_string(format));
        json_object_object_add(o, "logical_bytes", json_object_new_int64((int64_t)st.total_size));
        json_object_object_add(o, "populated_bytes", json_object_new_int64((int64_t)st.populated));
        json_object_object_add(o, "zero_elided_bytes",
                               known ? json_object_new_int64((int64_t)st.zero_elided) : NULL);
        json_object_object_add(o, "frames", json_object_new_int64((int64_t)st.frames));
        json_object_object_add(o, "frame_bytes",
                               known ? json_object_new_int64((int64_t)st.frame_size) : NULL);
        json_object_object_add(o, "object_bytes", json_object_new_int64((int64_t)st.object_size));
        char r[32];
        snprintf(r, sizeof(r), "%.4f", ratio);
        json_object_object_add(o, "ratio", json_object_new_double_s(ratio, r));
        json_object_object_add(o, "verified", json_object_new_boolean(checked != NULL));
        return EXIT_OK;
    }
    static char name[CLI_PRINTABLE_MAX];
    char a[32], b[32], d[32], e[32], f[32];
    printf("%s\n  format:            %s\n  logical size:      %s (%llu bytes)\n"
           "  populated:         %s (%llu bytes)%s\n  zero pages elided: %s\n"
           "  frames:            %llu (%s source range each)\n  compressed:        %s (%llu "
           "bytes), ratio %.2fx\n",
           cli_printable(name, sizeof(name), src), format, cli_bytes(a, sizeof(a), st.total_size),
           (unsigned long long)st.total_size, cli_bytes(b, sizeof(b), st.populated),
           (unsigned long long)st.populated, st.plain_zstd ? " in 64 KiB blocks not all zero" : "",
           known ? cli_bytes(d, sizeof(d), st.zero_elided) : "n/a", (unsigned long long)st.frames,
           known ? cli_bytes(f, sizeof(f), st.frame_size) : "n/a",
           cli_bytes(e, sizeof(e), st.object_size), (unsigned long long)st.object_size, ratio);
    if (checked)
        printf("  verified:          %s\n", checked);
    return EXIT_OK;
}
