/* SPDX-License-Identifier: Apache-2.0 */
/* vmsnap ls: snapshot sets under a prefix, with their manifest summary. */
#include "cli.h"
#include "vmsnap/xfer.h"

#include <stdio.h>

static int print_set(void *arg, const struct vmsnap_xfer_set *s)
{
    (void)arg;
    char a[32], b[32];
    if (!s->valid)
        printf("%s\t(unreadable manifest)\n", s->url);
    else
        printf("%s\t%llu files\t%s logical\t%s stored\n", s->url, (unsigned long long)s->files,
               cli_bytes(a, sizeof(a), s->logical), cli_bytes(b, sizeof(b), s->object_bytes));
    return 0;
}

int cmd_ls(int argc, char **argv)
{
    struct vmsnap_xfer_opts o = {0};
    int i = cmd_xfer_getopt("ls", argc, argv, &o, NULL);
    if (i == -2) {
        printf("usage: vmsnap ls [--endpoint URL] [--region R] [--path-style] URL\n");
        return EXIT_OK;
    }
    if (i < 0)
        return EXIT_USAGE;
    if (argc - i != 1)
        return cli_usage("ls", "expected one URL");
    struct vmsnap_err err = {0};
    int rc = vmsnap_xfer_list(argv[i], &o, print_set, NULL, &err);
    vmsnap_store_global_cleanup();
    if (rc < 0) {
        cli_error("ls", "%s", err.msg);
        return EXIT_FAIL;
    }
    return EXIT_OK;
}
