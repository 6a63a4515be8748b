/* SPDX-License-Identifier: Apache-2.0 */
/* vmsnap export: a set written again in the reference layout (layers flattened). */
#include "cli.h"
#include "vmsnap/xfer.h"

#include <stdlib.h>

static const struct xfer_verb export_verb = {
    "export",
    2,
    "expected URL and DEST",
    1,
};

static int export_fn(const char *from, const char *to, const struct vmsnap_xfer_opts *o,
                     struct vmsnap_xfer_stats *st, struct vmsnap_err *err)
{
    if (cli_socket)
        return cli_client_export(from, to, o, st, err);
    return vmsnap_xfer_export(from, to, NULL, o, st, err);
}

int cmd_export(int argc, char **argv)
{
    struct vmsnap_xfer_opts o = {0};
    int rc, i = cmd_xfer_args(&export_verb, argc, argv, &o, &(struct xfer_flags){0}, &rc);
    if (i < 0)
        return rc;
    return cmd_xfer_copy("export", export_fn, argv[i], argv[i + 1], &o);
}
