/* SPDX-License-Identifier: Apache-2.0 */
/* vmsnap rm: delete a snapshot set, manifest first. */
#include "cli.h"
#include "vmsnap/xfer.h"

#include <stdio.h>

int cmd_rm(int argc, char **argv)
{
    struct vmsnap_xfer_opts o = {0};
    bool force = false;
    int i = cmd_xfer_getopt("rm", argc, argv, &o, &(struct xfer_flags){.force = &force});
    if (i == -2) {
        printf("usage: vmsnap rm [--force] [--endpoint URL] [--region R] [--path-style] URL\n");
        return EXIT_OK;
    }
    if (i < 0)
        return EXIT_USAGE;
    if (argc - i != 1)
        return cli_usage("rm", "expected one URL");
    struct vmsnap_err err = {0};
    int rc = vmsnap_xfer_remove(argv[i], force, &o, &err);
    vmsnap_store_global_cleanup();
    if (rc < 0) {
        cli_error("rm", "%s", err.msg);
        return EXIT_FAIL;
    }
    return EXIT_OK;
}
