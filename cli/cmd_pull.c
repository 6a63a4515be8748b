/* SPDX-License-Identifier: Apache-2.0 */
/* vmsnap pull. */
#include "cli.h"
#include "vmsnap/xfer.h"

#include <stdio.h>
#include <string.h>

int cmd_pull(int argc, char **argv)
{
    struct vmsnap_xfer_opts o = {0};
    bool drop_cache = false, json = false;
    int i = cmd_xfer_getopt("pull", argc, argv, &o,
                            &(struct xfer_flags){.drop_cache = &drop_cache, .json = &json});
    if (i == -2) {
        printf("usage: vmsnap pull [--json] [-j N] [--max-memory SIZE] [--threads N] [--max-size "
               "SIZE]\n"
               "       [--no-fsync] [--drop-cache] [--endpoint URL] [--region R] [--path-style]\n"
               "       [--retries N]\n"
               "       URL PATH\n");
        cli_verb_description("pull");
        return EXIT_OK;
    }
    if (i < 0)
        return EXIT_USAGE;
    if (argc - i != 2)
        return cli_usage("pull", "expected URL and PATH");
    if (cmd_xfer_url("pull", argv[i]) < 0)
        return EXIT_USAGE;
    if (!strcmp(argv[i + 1], "-"))
        return cli_usage("pull", "PATH '-': pull writes a file or a directory, not stdout");
    struct cli_progress p;
    cli_progress_init(&p, "pull");
    o.progress = cli_progress_cb;
    o.progress_arg = &p;
    struct vmsnap_xfer_stats st;
    struct vmsnap_err err = {0};
    double t0 = cli_now();
    int rc = vmsnap_xfer_pull(argv[i], argv[i + 1], &o, &st, &err);
    cli_progress_end(&p);
    vmsnap_store_global_cleanup();
    if (rc < 0) {
        cli_error("pull", "%s", err.msg);
        return EXIT_FAIL;
    }
    if (json)
        cmd_xfer_json(argv[i], argv[i + 1], &st, cli_now() - t0);
    else
        cmd_xfer_summary("pull", &st, cli_now() - t0);
    return drop_cache ? cli_drop_cache("pull", argv[i + 1]) : EXIT_OK;
}
