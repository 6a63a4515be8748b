/* SPDX-License-Identifier: Apache-2.0 */
/* vmsnap pull. */
#include "cli.h"
#include "vmsnap/xfer.h"

#include <string.h>

static const struct xfer_verb pull = {
    "pull",
    "usage: vmsnap pull [--json] [-j N] [--max-memory SIZE] [--threads N] [--max-size SIZE]\n"
    "       [--no-fsync] [--drop-cache] [--endpoint URL] [--region R] [--path-style]\n"
    "       [--retries N] [--no-cache] [--cache-dir DIR]\n"
    "       URL PATH\n",
    2,
    "expected URL and PATH",
    0,
};

int cmd_pull(int argc, char **argv)
{
    struct vmsnap_xfer_opts o = {0};
    bool drop_cache = false, json = false;
    int rc, i = cmd_xfer_args(&pull, argc, argv, &o,
                              &(struct xfer_flags){.drop_cache = &drop_cache, .json = &json}, &rc);
    if (i < 0)
        return rc;
    if (!strcmp(argv[i + 1], "-"))
        return cli_usage("pull", "PATH '-': pull writes a file or a directory, not stdout");
    rc = cmd_xfer_copy("pull", vmsnap_xfer_pull, argv[i], argv[i + 1], &o, json);
    return rc == EXIT_OK && drop_cache ? cli_drop_cache("pull", argv[i + 1]) : rc;
}
