/* SPDX-License-Identifier: Apache-2.0 */
/* vmsnap ls: snapshot sets under a prefix, with their manifest summary. */
#include "cli.h"
#include "vmsnap/xfer.h"

#include <json.h>
#include <stdio.h>

static int print_set(void *arg, const struct vmsnap_xfer_set *s)
{
    json_object *arr = arg;
    if (arr) { /* --json: exact numbers, in the run's object as "sets" */
        json_object *o = json_object_new_object();
        json_object_object_add(o, "url", json_object_new_string(s->url));
        json_object_object_add(o, "valid", json_object_new_boolean(s->valid));
        if (s->valid) {
            json_object_object_add(o, "files", json_object_new_int64((int64_t)s->files));
            json_object_object_add(o, "logical_bytes", json_object_new_int64((int64_t)s->logical));
            json_object_object_add(o, "object_bytes",
                                   json_object_new_int64((int64_t)s->object_bytes));
        }
        json_object_array_add(arr, o);
        return 0;
    }
    /* keys are anyone's with write access to the bucket: a newline or a terminal escape in one
     * must not forge lines of this listing */
    static char u[CLI_PRINTABLE_MAX];
    cli_printable(u, sizeof(u), s->url);
    char a[32], b[32];
    if (!s->valid)
        printf("%s\t(unreadable manifest)\n", u);
    else
        printf("%s\t%llu file%s\t%s logical\t%s stored\n", u, (unsigned long long)s->files,
               s->files == 1 ? "" : "s", cli_bytes(a, sizeof(a), s->logical),
               cli_bytes(b, sizeof(b), s->object_bytes));
    return 0;
}

static const struct xfer_verb ls = {
    "ls",
    1,
    "expected one URL",
    0,
};

int cmd_ls(int argc, char **argv)
{
    struct vmsnap_xfer_opts o = {0};
    int rc, i = cmd_xfer_args(&ls, argc, argv, &o, NULL, &rc);
    if (i < 0)
        return rc;
    struct vmsnap_err err = {0};
    json_object *arr = NULL;
    if (cli_json) /* what could be listed, also when the listing was incomplete (with "error") */
        json_object_object_add(cli_out(), "sets", arr = json_object_new_array());
    rc = cli_socket ? cli_client_list(argv[i], &o, print_set, arr, &err)
                    : vmsnap_xfer_list(argv[i], &o, print_set, arr, &err);
    return cmd_xfer_end("ls", rc, &err);
}
