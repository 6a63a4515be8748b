/* SPDX-License-Identifier: Apache-2.0 */
/* vmsnap rm: delete a snapshot set, manifest first. */
#include "cli.h"
#include "vmsnap/xfer.h"

#include <json.h>
#include <stdio.h>
#include <string.h>

static const struct xfer_verb rm = {
    "rm",
    1,
    "expected one URL",
    0,
};

int cmd_rm(int argc, char **argv)
{
    struct vmsnap_xfer_opts o = {0};
    bool force = false;
    int rc, i = cmd_xfer_args(&rm, argc, argv, &o, &(struct xfer_flags){.force = &force}, &rc);
    if (i < 0)
        return rc;
    struct vmsnap_err err = {0};
    struct vmsnap_rm_result r;
    int (*remove)(const char *, bool, const struct vmsnap_xfer_opts *, struct vmsnap_rm_result *,
                  struct vmsnap_err *) = cli_socket ? cli_client_remove : vmsnap_xfer_remove;
    if ((rc = cmd_xfer_end("rm", remove(argv[i], force, &o, &r, &err), &err)) != EXIT_OK)
        return rc;
    if (cli_json) {
        json_object *j = cli_out();
        json_object_object_add(j, "removed",
                               json_object_new_string(r.object      ? "object"
                                                      : r.empty_dir ? "empty_dir"
                                                      : r.set       ? "set"
                                                                    : "incomplete_set"));
        json_object_object_add(j, "objects", json_object_new_int64(r.object ? 1 : r.objects));
        json_object_object_add(j, "uploads", json_object_new_int64(r.uploads));
        json_object_object_add(j, "pushes", json_object_new_int64(r.pushes));
        json_object_object_add(j, "kept", json_object_new_int64(r.kept));
        json_object_object_add(j, "kept_url", r.kept ? json_object_new_string(r.kept_key) : NULL);
    }
    /* what went, so that a user sees what a --force removed */
    if (!cli_quiet && !cli_json) {
        static char u[CLI_PRINTABLE_MAX], k[CLI_PRINTABLE_MAX];
        const char *url = cli_printable(u, sizeof(u), argv[i]);
        if (r.object)
            fprintf(stderr, "rm: removed the object %s\n", url);
        else if (r.empty_dir)
            fprintf(stderr, "rm: removed the empty directory %s", url);
        else
            fprintf(stderr, "rm: removed %s%s: %u object%s%s", url,
                    r.set ? " (its manifest first)" : " (no manifest)", r.objects,
                    r.objects == 1 ? "" : "s", r.set ? " of the set" : "");
        if (!r.object && r.uploads)
            fprintf(stderr, ", %u unfinished upload%s aborted", r.uploads,
                    r.uploads == 1 ? "" : "s");
        if (!r.object && r.pushes)
            fprintf(stderr, ", %u unfinished push%s cleaned up", r.pushes,
                    r.pushes == 1 ? "" : "es");
        if (!r.object)
            fputc('\n', stderr);
        if (r.kept)
            fprintf(stderr,
                    "rm: kept the *.zstd objects there that are not vmsnap images (%u, first: "
                    "%s)\n",
                    r.kept, cli_printable(k, sizeof(k), r.kept_key));
    }
    return EXIT_OK;
}
