/* SPDX-License-Identifier: Apache-2.0 */
/* vmsnap push. */
#include "cli.h"
#include "vmsnap/xfer.h"

#include <stdio.h>
#include <string.h>

int cmd_push(int argc, char **argv)
{
    struct vmsnap_xfer_opts o = {0};
    bool json = false;
    int i = cmd_xfer_getopt("push", argc, argv, &o, &(struct xfer_flags){.json = &json});
    if (i == -2) {
        printf("usage: vmsnap push [--json] [-j N] [--part-size SIZE] [--max-memory SIZE] "
               "[--threads N]\n"
               "       [--frame-size SIZE] [--level L] [--endpoint URL] [--region R]\n"
               "       [--path-style] [--retries N] [--base URL] PATH URL\n");
        cli_verb_description("push");
        return EXIT_OK;
    }
    if (i < 0)
        return EXIT_USAGE;
    if (argc - i != 2)
        return cli_usage("push", "expected PATH and URL");
    if (cmd_xfer_url("push", argv[i + 1]) < 0)
        return EXIT_USAGE;
    if (!strcmp(argv[i], "-"))
        return cli_usage("push", "PATH '-': push reads a file or a directory, not stdin (it walks "
                                 "the file's extents: save the stream to a file, then push it)");
    struct cli_progress p;
    cli_progress_init(&p, "push");
    o.progress = cli_progress_cb;
    o.progress_arg = &p;
    struct vmsnap_xfer_stats st;
    struct vmsnap_err err = {0};
    double t0 = cli_now();
    int rc = vmsnap_xfer_push(argv[i], argv[i + 1], &o, &st, &err);
    cli_progress_end(&p);
    vmsnap_store_global_cleanup();
    if (rc < 0) {
        cli_error("push", "%s", err.msg);
        return EXIT_FAIL;
    }
    if (json)
        cmd_xfer_json(argv[i], argv[i + 1], &st, cli_now() - t0);
    else
        cmd_xfer_summary("push", &st, cli_now() - t0);
    return EXIT_OK;
}
