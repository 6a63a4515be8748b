/* SPDX-License-Identifier: Apache-2.0 */
/* vmsnap gc: abort the unfinished multipart uploads (killed pushes) under a prefix. */
#include "cli.h"
#include "vmsnap/xfer.h"

#include <stdio.h>

int cmd_gc(int argc, char **argv)
{
    struct vmsnap_xfer_opts o = {0};
    int i = cmd_xfer_getopt("gc", argc, argv, &o, NULL, NULL);
    if (i == -2) {
        printf("usage: vmsnap gc [--endpoint URL] [--region R] [--path-style] URL\n");
        return EXIT_OK;
    }
    if (i < 0)
        return EXIT_USAGE;
    if (argc - i != 1)
        return cli_usage("gc", "expected one URL");
    struct vmsnap_err err = {0};
    unsigned n = 0;
    int rc = vmsnap_xfer_gc(argv[i], &o, &n, &err);
    vmsnap_store_global_cleanup();
    if (rc < 0) {
        cli_error("gc", "%s", err.msg);
        return EXIT_FAIL;
    }
    if (!cli_quiet)
        fprintf(stderr, "gc: aborted %u unfinished upload%s\n", n, n == 1 ? "" : "s");
    return EXIT_OK;
}
