/* SPDX-License-Identifier: Apache-2.0 */
/* vmsnap push. */
#include "cli.h"
#include "vmsnap/xfer.h"

#include <string.h>

static const struct xfer_verb push = {
    "push",
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
    return cmd_xfer_copy("push", cli_socket ? cli_client_push : vmsnap_xfer_push, argv[i],
                         argv[i + 1], &o);
}
