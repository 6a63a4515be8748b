/* SPDX-License-Identifier: Apache-2.0 */
/* vmsnap push. */
#include "cli.h"
#include "vmsnap/xfer.h"

#include <string.h>

static const struct xfer_verb push = {
    "push",
    "usage: vmsnap push [--json] [-j N] [-T N] [--part-size SIZE] [--max-memory SIZE]\n"
    "       [--frame-size SIZE] [--level L] [--endpoint URL] [--region R]\n"
    "       [--path-style] [--retries N] [--layout layered|reference]\n"
    "       [--parent URL] [--max-depth N] [--base URL] [--write-cache]\n"
    "       [--cache-dir DIR] PATH URL\n"
    "  a set (a directory) is stored layered by default: immutable objects and a\n"
    "  manifest that is replaced in one PUT; --parent stores each file as a delta\n"
    "  over the parent set's (only the changed 4 KiB pages), a full layer when the\n"
    "  chain would pass --max-depth (8) or the delta is over 3/4 of the full image;\n"
    "  --layout reference writes the reference system's layout (<name>.zstd);\n"
    "  --write-cache keeps a layered set's objects in the node's object cache as\n"
    "  they are uploaded (S3, GCS), so a pull of it here fetches nothing\n",
    2,
    "expected PATH and URL",
    1,
};

int cmd_push(int argc, char **argv)
{
    struct vmsnap_xfer_opts o = {0};
    int rc, i = cmd_xfer_args(&push, argc, argv, &o, &(struct xfer_flags){0}, &rc);
    if (i < 0)
        return rc;
    if (!strcmp(argv[i], "-"))
        return cli_usage("push", "PATH '-': push reads a file or a directory, not stdin (it walks "
                                 "the file's extents: save the stream to a file, then push it)");
    return cmd_xfer_copy("push", vmsnap_xfer_push, argv[i], argv[i + 1], &o);
}
