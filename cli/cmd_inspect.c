/* SPDX-License-Identifier: Apache-2.0 */
/* vmsnap inspect: describe an image, optionally verifying every checksum. */
#include "cli.h"
#include "vmsnap/image.h"

#include <getopt.h>
#include <stdio.h>

int cmd_inspect(int argc, char **argv)
{
    static const struct option lopts[] = {
        {"json", no_argument, NULL, 'J'},
        {"verify", no_argument, NULL, 'V'},
        {"threads", required_argument, NULL, 'j'},
        {"max-size", required_argument, NULL, 'm'},
        {"help", no_argument, NULL, 'h'},
        CLI_COMMON_LONGOPTS,
        {0, 0, 0, 0},
    };
    bool json = false, verify = false;
    unsigned threads = 0;
    uint64_t max_size = 0;
    unsigned long v;
    int c;
    optind = 1;
    while ((c = cli_getopt(argc, argv, "j:hqv", lopts)) != -1) {
        switch (c) {
        case 'J':
            json = true;
            break;
        case 'V':
            verify = true;
            break;
        case 'j':
            if (cli_parse_uint(optarg, 1, 256, &v) < 0)
                return cli_usage("inspect", "-j wants a thread count from 1 to 256");
            threads = (unsigned)v;
            break;
        case 'm':
            if (cli_parse_size(optarg, &max_size) < 0 || max_size == 0)
                return cli_usage("inspect", "--max-size wants a size like 64T, not '%s'", optarg);
            break;
        case 'h':
            printf("usage: vmsnap inspect [--json] [--verify] [-j N] [--max-size SIZE] SRC\n");
            cli_verb_description("inspect");
            return EXIT_OK;
        default:
            return cli_usage("inspect", "bad option");
        }
    }
    if (argc - optind != 1)
        return cli_usage("inspect", "wants one SRC");
    const char *src = argv[optind];
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
        printf("{\"path\":\"");
        for (const char *p = src; *p; p++) {
            if (*p == '"' || *p == '\\')
                printf("\\%c", *p);
            else if ((unsigned char)*p < 0x20)
                printf("\\u%04x", *p);
            else
                putchar(*p);
        }
        char ze[32] = "null", fs[32] = "null";
        if (known) {
            snprintf(ze, sizeof(ze), "%llu", (unsigned long long)st.zero_elided);
            snprintf(fs, sizeof(fs), "%llu", (unsigned long long)st.frame_size);
        }
        printf("\",\"format\":\"%s\",\"logical_size\":%llu,\"populated\":%llu,"
               "\"zero_elided\":%s,\"frames\":%llu,\"frame_size\":%s,\"object_size\":%llu,"
               "\"ratio\":%.4f,"
               "\"verified\":%s}\n",
               format, (unsigned long long)st.total_size, (unsigned long long)st.populated, ze,
               (unsigned long long)st.frames, fs, (unsigned long long)st.object_size, ratio,
               checked ? "true" : "false");
        return EXIT_OK;
    }
    char a[32], b[32], d[32], e[32], f[32];
    printf("%s\n  format:            %s\n  logical size:      %s (%llu bytes)\n"
           "  populated:         %s (%llu bytes)%s\n  zero pages elided: %s\n"
           "  frames:            %llu (%s source range each)\n  compressed:        %s (%llu "
           "bytes), ratio %.2fx\n",
           src, format, cli_bytes(a, sizeof(a), st.total_size), (unsigned long long)st.total_size,
           cli_bytes(b, sizeof(b), st.populated), (unsigned long long)st.populated,
           st.plain_zstd ? " in 64 KiB blocks not all zero" : "",
           known ? cli_bytes(d, sizeof(d), st.zero_elided) : "n/a", (unsigned long long)st.frames,
           known ? cli_bytes(f, sizeof(f), st.frame_size) : "n/a",
           cli_bytes(e, sizeof(e), st.object_size), (unsigned long long)st.object_size, ratio);
    if (checked)
        printf("  verified:          %s\n", checked);
    return EXIT_OK;
}
