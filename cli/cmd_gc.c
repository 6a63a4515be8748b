/* SPDX-License-Identifier: Apache-2.0 */
/* vmsnap gc: clean what killed pushes left under a prefix (unfinished multipart uploads, objects
 * of set pushes that never committed), leaving the young ones (pushes that may still be running)
 * alone. */
#include "cli.h"
#include "vmsnap/xfer.h"

#include <inttypes.h>
#include <json.h>
#include <stdio.h>

#define GC_DEFAULT_AGE 3600 /* an hour without activity: no running push is that idle */

static void age_text(char *b, size_t n, int64_t s)
{
    if (s < 0)
        snprintf(b, n, "unknown age");
    else if (s < 120)
        snprintf(b, n, "%" PRId64 " s old", s);
    else if (s < 7200)
        snprintf(b, n, "%" PRId64 " min old", s / 60);
    else if (s < 172800)
        snprintf(b, n, "%" PRId64 " h old", s / 3600);
    else
        snprintf(b, n, "%" PRId64 " days old", s / 86400);
}

/* --json: each upload or mark found, in the run's object as "items" */
static json_object *items;

static void report(void *arg, enum vmsnap_gc_kind kind, const char *key, uint64_t size, int64_t age,
                   bool act)
{
    const bool *dry = arg;
    if (items) {
        json_object *o = json_object_new_object();
        json_object_object_add(
            o, "kind", json_object_new_string(kind == VMSNAP_GC_UPLOAD ? "upload" : "push_mark"));
        json_object_object_add(o, "url", json_object_new_string(key));
        json_object_object_add(o, "age_seconds", age < 0 ? NULL : json_object_new_int64(age));
        json_object_object_add(o, "action",
                               json_object_new_string(!act                       ? "keep"
                                                      : kind == VMSNAP_GC_UPLOAD ? "abort"
                                                                                 : "clean"));
        json_object_array_add(items, o);
        return;
    }
    char a[32];
    age_text(a, sizeof(a), age);
    const char *what = kind == VMSNAP_GC_UPLOAD ? "upload"
                       : kind == VMSNAP_GC_PUSH ? "push mark"
                                                : "object";
    static char k[CLI_PRINTABLE_MAX];
    key = cli_printable(k, sizeof(k), key);
    if (*dry && kind == VMSNAP_GC_OBJECT)
        printf("%s\t%s\t%s\t%" PRIu64 " bytes\t%s\n", act ? "would remove" : "keep", what, a, size,
               key);
    else if (*dry)
        printf("%s\t%s\t%s\t%s\n",
               act ? (kind == VMSNAP_GC_UPLOAD ? "would abort" : "would clean") : "keep", what, a,
               key);
    else if (cli_verbose && !cli_quiet)
        fprintf(stderr, "gc: %s %s %s (%s)\n", act ? "cleaning" : "keeping", what, key, a);
}

static const struct xfer_verb gc = {
    "gc",
    1,
    "expected one URL",
    0,
};

int cmd_gc(int argc, char **argv)
{
    struct vmsnap_xfer_opts o = {0};
    bool dry = false;
    int64_t age = GC_DEFAULT_AGE;
    int rc, i = cmd_xfer_args(&gc, argc, argv, &o,
                              &(struct xfer_flags){.dry_run = &dry, .older_than = &age}, &rc);
    if (i < 0)
        return rc;
    struct vmsnap_err err = {0};
    struct vmsnap_gc_result res;
    struct vmsnap_gc_opts g = {
        .older_than = age, .dry_run = dry, .report = report, .report_arg = &dry};
    json_object *j = cli_json ? cli_out() : NULL;
    if (j) {
        json_object_object_add(j, "dry_run", json_object_new_boolean(dry));
        json_object_object_add(j, "older_than_seconds", json_object_new_int64(age));
        json_object_object_add(j, "items", items = json_object_new_array());
    }
    rc = cmd_xfer_end(
        "gc", (cli_socket ? cli_client_gc : vmsnap_xfer_gc)(argv[i], &g, &o, &res, &err), &err);
    items = NULL;
    if (rc != EXIT_OK)
        return rc;
    if (j) {
        json_object_object_add(j, "aborted_uploads", json_object_new_int64(res.aborted));
        json_object_object_add(j, "cleaned_pushes", json_object_new_int64(res.pushes));
        json_object_object_add(j, "objects", json_object_new_int64(res.objects));
        json_object_object_add(j, "kept", json_object_new_int64(res.kept));
        json_object_object_add(j, "unknown_age", json_object_new_int64(res.unknown_age));
    } else if (!cli_quiet) {
        fprintf(stderr, "gc: %s %u unfinished upload%s", dry ? "would abort" : "aborted",
                res.aborted, res.aborted == 1 ? "" : "s");
        if (res.pushes)
            fprintf(stderr, ", %s %u mark%s of unfinished set pushes",
                    dry ? "would remove" : "removed", res.pushes, res.pushes == 1 ? "" : "s");
        if (res.objects)
            fprintf(stderr, " and %u object%s they named", res.objects,
                    res.objects == 1 ? "" : "s");
        if (res.unreachable || res.unreachable_bytes)
            fprintf(stderr, ", %s %u object%s no set names (%" PRIu64 " bytes)",
                    dry ? "would remove" : "removed", res.unreachable,
                    res.unreachable == 1 ? "" : "s", res.unreachable_bytes);
        if (res.kept) {
            char d[32];
            if (age % 86400 == 0)
                snprintf(d, sizeof(d), "%" PRId64 "d", age / 86400);
            else if (age % 3600 == 0)
                snprintf(d, sizeof(d), "%" PRId64 "h", age / 3600);
            else if (age % 60 == 0)
                snprintf(d, sizeof(d), "%" PRId64 "m", age / 60);
            else
                snprintf(d, sizeof(d), "%" PRId64 "s", age);
            fprintf(stderr, "; kept %u younger than %s (--older-than)", res.kept - res.unknown_age,
                    d);
            if (res.unknown_age)
                fprintf(stderr, " and %u of unknown age", res.unknown_age);
        }
        fputc('\n', stderr);
    }
    return EXIT_OK;
}
