/* SPDX-License-Identifier: Apache-2.0 */
/* vmsnap pull. */
#include "cli.h"
#include "vmsnap/xfer.h"

#include <errno.h>
#include <json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const struct xfer_verb pull = {
    "pull",
    2,
    "expected URL and PATH",
    0,
};

/* The first of the manifest's file names (`mf`, `len` bytes: snapshotFiles, or the keys of
 * "files" in a layered set's) that exists in the directory `dir`, into `hit`; false when none
 * does (or the manifest does not parse: the pull says why). */
static bool set_name_exists(const char *mf, size_t len, const char *dir, char *hit, size_t cap)
{
    json_tokener *tok = json_tokener_new();
    json_object *root = tok ? json_tokener_parse_ex(tok, mf, (int)len) : NULL, *names;
    bool found = false;
    if (root && json_object_object_get_ex(root, "snapshotFiles", &names) &&
        json_object_is_type(names, json_type_array))
        for (size_t i = 0; !found && i < json_object_array_length(names); i++) {
            const char *n = json_object_get_string(json_object_array_get_idx(names, i));
            struct stat st;
            snprintf(hit, cap, "%s/%s", dir, n ? n : "");
            found = n && *n && lstat(hit, &st) == 0;
        }
    else if (root && json_object_object_get_ex(root, "files", &names) &&
             json_object_is_type(names, json_type_object)) {
        json_object_object_foreach(names, n, v)
        {
            (void)v;
            struct stat st;
            snprintf(hit, cap, "%s/%s", dir, n);
            if (!found && *n && lstat(hit, &st) == 0)
                found = true;
            if (found)
                break;
        }
    }
    json_object_put(root);
    if (tok)
        json_tokener_free(tok);
    return found;
}

/* Without --force a pull replaces nothing: a set's file that exists in the directory PATH, or
 * PATH itself for one object, is refused. The manifest is read once more for its names (one
 * small GET). EXIT_OK, or the exit code of the refusal or failure printed. */
static int refuse_existing(const char *url, const char *path, const struct vmsnap_xfer_opts *o)
{
    struct stat st;
    if (lstat(path, &st) < 0)
        return EXIT_OK; /* nothing there (or the pull says why it cannot write it) */
    /* through the daemon the store's keys are the node's: its manifest is not read here */
    if (cli_socket && strstr(url, "://") && strncmp(url, "file://", 7))
        return cli_fail_code("pull", EEXIST,
                             "%s exists: through the daemon (--socket) a pull from a remote store "
                             "replaces nothing there without -f/--force",
                             path);
    struct vmsnap_store *s = NULL;
    struct vmsnap_store_conn *c = NULL;
    struct vmsnap_err err = {0};
    char *key = NULL, *mkey = NULL, *buf = malloc(VMSNAP_XFER_MANIFEST_MAX);
    size_t got = 0;
    uint64_t size = 0;
    int rc = buf ? vmsnap_store_open(url, &o->store, &s, &key, &err)
                 : vmsnap_err_set(&err, ENOMEM, "out of memory");
    if (rc == 0)
        rc = vmsnap_store_conn_new(s, &c, &err);
    if (rc == 0 && asprintf(&mkey, "%s%s" VMSNAP_XFER_MANIFEST, key, *key ? "/" : "") < 0)
        rc = vmsnap_err_set(&err, ENOMEM, "out of memory"), mkey = NULL;
    if (rc == 0)
        rc = vmsnap_store_get_tail(c, mkey, VMSNAP_XFER_MANIFEST_MAX, buf, &got, &size, &err);
    char hit[8192];
    int out = EXIT_OK;
    if (rc == -ENOENT && !vmsnap_store_conn_no_bucket(c)) /* one object: PATH is its file */
        out =
            cli_fail_code("pull", EEXIST, "%s exists: not replaced (-f/--force replaces it)", path);
    else if (rc < 0)
        out = cli_fail("pull", &err);
    else if (got == size && S_ISDIR(st.st_mode) &&
             set_name_exists(buf, got, path, hit, sizeof(hit)))
        out = cli_fail_code("pull", EEXIST,
                            "%s exists: not replaced (-f/--force replaces the set's files there)",
                            hit);
    vmsnap_store_conn_free(c);
    vmsnap_store_free(s);
    free(key);
    free(mkey);
    free(buf);
    return out;
}

int cmd_pull(int argc, char **argv)
{
    struct vmsnap_xfer_opts o = {0};
    bool drop_cache = false, force = false;
    int rc,
        i = cmd_xfer_args(&pull, argc, argv, &o,
                          &(struct xfer_flags){.drop_cache = &drop_cache, .force = &force}, &rc);
    if (i < 0)
        return rc;
    if (!strcmp(argv[i + 1], "-"))
        return cli_usage("pull", "PATH '-': pull writes a file or a directory, not stdout");
    if (!force && (rc = refuse_existing(argv[i], argv[i + 1], &o)) != EXIT_OK) {
        vmsnap_store_global_cleanup();
        return rc;
    }
    rc = cmd_xfer_copy("pull", cli_socket ? cli_client_pull : vmsnap_xfer_pull, argv[i],
                       argv[i + 1], &o);
    return rc == EXIT_OK && drop_cache ? cli_drop_cache("pull", argv[i + 1]) : rc;
}
