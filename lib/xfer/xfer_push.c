/* SPDX-License-Identifier: Apache-2.0 */
/*
 * vmsnap_xfer_push and vmsnap_xfer_check_dest: the checks before a push and the push of one
 * file or a set.
 */
#include "xfer_int.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* Resolve the base URL to a key of the push's own store (copies work only inside one store). */
static int base_key_in(struct xfer *x, const char *base, struct vmsnap_err *err)
{
    if (vmsnap_store_url_remote(base) != (vmsnap_store_kind(x->st) == VMSNAP_STORE_S3))
        return vmsnap_err_set(err, EINVAL,
                              "base %s is not in the store being pushed to (copies stay inside "
                              "one bucket)",
                              base);
    struct vmsnap_store *bst = NULL;
    char *bkey = NULL;
    int rc = vmsnap_store_open(base, &x->o.store, &bst, &bkey, err);
    if (rc < 0) {
        vmsnap_err_wrap(err, "base: ");
        return rc;
    }
    if (!vmsnap_store_same(x->st, bst))
        rc = vmsnap_err_set(err, EINVAL,
                            "base %s is not in the store being pushed to (copies stay inside one "
                            "bucket)",
                            base);
    else if (!*bkey)
        rc = vmsnap_err_set(err, EINVAL, "base %s: a key (a path inside the bucket) is needed",
                            base);
    vmsnap_store_free(bst);
    if (rc < 0)
        free(bkey);
    else
        x->base_key = bkey;
    return rc;
}

/* Is `key` of a local store the file or directory at `path`, or (`within`) inside that
 * directory? (push FILE FILE replaced the file with its own object; a set pushed into itself or
 * pulled into its own directory mixed files and objects.) */
bool xfer_local_same(const struct xfer *x, const char *key, const char *path, bool within)
{
    struct stat a, b;
    char p[PATH_MAX];
    if (vmsnap_store_kind(x->st) != VMSNAP_STORE_LOCAL || stat(path, &b) < 0 ||
        snprintf(p, sizeof(p), "/%s", key) >= (int)sizeof(p))
        return false;
    for (;;) {
        if (stat(p, &a) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino)
            return true;
        char *sl = strrchr(p, '/');
        if (!within || !sl || sl == p)
            return false;
        *sl = '\0';
    }
}

/* A remote store is asked: a push mark that names nothing is stored at the set's key and
 * removed again, which only an endpoint that answers, credentials it takes and a bucket they may
 * write in allow (what a push does first, before a byte of the set). A mark the removal leaves
 * (its DELETE failed, or this process was killed) is what a killed push leaves: the next push
 * there or gc removes it. */
static int probe_remote(struct xfer *x, const char *url, struct vmsnap_err *err)
{
    char id[33], mname[64];
    int rc = xfer_new_push_id(id, err);
    if (rc < 0)
        return rc;
    snprintf(mname, sizeof(mname), PUSH_MARK_PREFIX "%s" PUSH_MARK_SUFFIX, id);
    char *key = xfer_join_key(x->key, mname);
    char *mark = push_mark_build(id, (int64_t)time(NULL), NULL, 0, NULL, 0);
    if (!key || !mark)
        rc = vmsnap_err_set(err, ENOMEM, "out of memory");
    if (rc == 0)
        rc = xfer_conn(x, err);
    if (rc == 0 && (rc = vmsnap_store_put(x->ctl, key, mark, strlen(mark), err)) < 0)
        vmsnap_err_wrap(err, "%s: the store cannot be written (a test object %s there): ", url,
                        mname);
    if (rc == 0) {
        sys_failpoint("probe-stored");
        struct vmsnap_err de = {0};
        if (vmsnap_store_delete(x->ctl, key, &de) < 0)
            vlog(VMSNAP_LOG_WARN,
                 "%s: cannot remove the test object %s (the next push there or "
                 "'vmsnap gc' will): %s",
                 url, mname, de.msg);
    }
    free(mark);
    free(key);
    return rc;
}

int vmsnap_xfer_check_dest(const char *url, bool set, const struct vmsnap_xfer_opts *opts,
                           struct vmsnap_err *err)
{
    struct xfer x;
    int rc =
        xfer_open(&x, url, opts, XFER_KEY, err); /* the options and URL, as a push takes them */
    if (rc < 0)
        return rc;
    const char *key = x.key;
    char p[PATH_MAX];
    if (vmsnap_store_kind(x.st) == VMSNAP_STORE_LOCAL &&
        snprintf(p, sizeof(p), "/%s", key) < (int)sizeof(p)) {
        struct stat sb;
        char *sl;
        while (lstat(p, &sb) < 0 && (sl = strrchr(p, '/')) && sl != p)
            *sl = '\0';
        bool found = stat(p, &sb) == 0;
        if (!found)
            rc = vmsnap_err_set(err, ENOENT, "%s: %s is a symlink to nothing", url, p);
        else if (!S_ISDIR(sb.st_mode) && (set || strcmp(p + 1, key)))
            rc = vmsnap_err_set(err, ENOTDIR, "%s: %s is not a directory", url, p);
        else if (S_ISDIR(sb.st_mode) && access(p, W_OK | X_OK) < 0)
            rc = err_sys(err, "%s: cannot write in %s", url, p);
    } else if (vmsnap_store_kind(x.st) == VMSNAP_STORE_S3 && set)
        rc = probe_remote(&x, url, err);
    xfer_close(&x);
    return rc;
}

/* 1 when a committed set is at `dir` (its manifest is there), 0 when none is, < 0 on an error. */
static int set_at(struct vmsnap_store_conn *ctl, const char *dir, struct vmsnap_err *err)
{
    char *mk = xfer_join_key(dir, VMSNAP_XFER_MANIFEST);
    int rc = mk ? xfer_key_exists(ctl, mk, err) : vmsnap_err_set(err, ENOMEM, "out of memory");
    free(mk);
    return rc;
}

/* A local store's set directory holding layer objects (LAYER_DIR): an rm of the set
 * leaves them, and so the directory, until a gc; a file cannot be pushed there before. */
static bool layers_in_dir(const struct xfer *x, const char *key)
{
    if (vmsnap_store_kind(x->st) != VMSNAP_STORE_LOCAL)
        return false;
    char *k = xfer_join_key(key, LAYER_DIR);
    char *p = k ? vmsnap_store_local_path(x->st, k) : NULL;
    struct stat sb;
    bool there = p && lstat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
    free(p);
    free(k);
    return there;
}

/* No file is pushed inside a committed set (KEY's parent holds a manifest): it would replace
 * one of its objects or its manifest (a set was destroyed so). A set below a set is another
 * matter: its objects are in its own directory. */
static int not_inside_set(struct vmsnap_store_conn *ctl, const char *key, const char *url,
                          const char *what, struct vmsnap_err *err)
{
    const char *slash = strrchr(key, '/');
    char *parent = strndup(key, slash ? (size_t)(slash - key) : 0);
    int rc = parent ? set_at(ctl, parent, err) : vmsnap_err_set(err, ENOMEM, "out of memory");
    if (rc > 0) {
        const char *us = strrchr(url, '/');
        rc = vmsnap_err_set(err, EEXIST,
                            "%s is inside the snapshot set %.*s (it has a %s): %s pushed there "
                            "would replace or join its objects; push elsewhere",
                            url, us ? (int)(us - url) : 1, us ? url : ".", VMSNAP_XFER_MANIFEST,
                            what);
    }
    free(parent);
    return rc < 0 ? rc : 0;
}

/* The layout of a set push: the option, else $VMSNAP_LAYOUT, else layered. */
int xfer_layout_layered(const struct xfer *x, bool *layered, struct vmsnap_err *err)
{
    *layered = x->o.layout != VMSNAP_LAYOUT_REFERENCE;
    if (x->o.layout != VMSNAP_LAYOUT_AUTO)
        return 0;
    const char *v = getenv("VMSNAP_LAYOUT");
    if (!v || !*v || !strcmp(v, "layered"))
        return 0;
    if (!strcmp(v, "reference")) {
        *layered = false;
        return 0;
    }
    return vmsnap_err_set(err, EINVAL, "VMSNAP_LAYOUT: '%.32s' is not 'layered' or 'reference'", v);
}

int vmsnap_xfer_push(const char *path, const char *url, const struct vmsnap_xfer_opts *opts,
                     struct vmsnap_xfer_stats *stats, struct vmsnap_err *err)
{
    if (stats)
        memset(stats, 0, sizeof(*stats));
    struct stat sb;
    if (stat(path, &sb) < 0)
        return err_sys(err, "%s", path);
    if (!S_ISREG(sb.st_mode) && !S_ISDIR(sb.st_mode))
        return vmsnap_err_set(err, EINVAL, "%s: not a regular file or a directory", path);
    struct xfer x;
    int rc = xfer_open(&x, url, opts, XFER_KEY, err);
    if (rc < 0)
        return rc;
    const char *key = x.key;
    /* what would fail late is refused before anything changes (a push over a set un-commits it
     * first) */
    struct vmsnap_pack_opts cpo = {.frame_size = x.o.frame_size, .level = x.o.level};
    if ((rc = vmsnap_image_check_pack_opts(&cpo, err)) < 0)
        goto out;
    if (x.o.part_size > VMSNAP_STORE_MAX_PART) {
        rc = vmsnap_err_set(err, EINVAL, "part size %llu: at most 5 GiB (S3's largest part)",
                            (unsigned long long)x.o.part_size);
        goto out;
    }
    if (xfer_local_same(&x, key, path, S_ISDIR(sb.st_mode))) {
        rc = vmsnap_err_set(err, EINVAL, "push %s to %s: the destination is the %s being pushed",
                            path, url, S_ISDIR(sb.st_mode) ? "directory (or inside it)" : "file");
        goto out;
    }
    bool layered = false;
    if (S_ISDIR(sb.st_mode) && (rc = xfer_layout_layered(&x, &layered, err)) < 0)
        goto out;
    if (layered && !x.o.parent && x.o.base) { /* a base is a parent to a layered set */
        x.o.parent = x.o.base;
        x.o.parent_implicit = x.o.base_implicit;
    }
    if (!layered && x.o.parent) {
        rc = vmsnap_err_set(err, EINVAL,
                            "a parent (--parent) needs a layered set push (not --layout "
                            "reference, nor a single file)");
        goto out;
    }
    if (!layered && x.o.base && (rc = base_key_in(&x, x.o.base, err)) < 0)
        goto out;
    if ((rc = xfer_conn(&x, err)) < 0 || (rc = xfer_start_pool(&x, err)) < 0)
        goto out;
    struct vmsnap_store_conn *ctl = x.ctl;
    if (S_ISDIR(sb.st_mode)) {
        /* (a set below a set is fine) */
        rc = layered ? xfer_push_layered(&x, ctl, path, key, url, stats, err)
                     : xfer_push_set(&x, ctl, path, key, url, stats, err);
    } else {
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
            rc = err_sys(err, "open %s", path);
            goto out;
        }
        /* a set under KEY/ would shadow this object: pull KEY prefers the set */
        rc = set_at(ctl, key, err);
        if (rc > 0 && layers_in_dir(&x, key))
            rc = vmsnap_err_set(err, EEXIST,
                                "%s holds a snapshot set (%s/%s): a file pushed there would be "
                                "hidden by it, and its layers keep the directory: remove the set "
                                "('vmsnap rm %s'), its layers once gc's grace period is past "
                                "('vmsnap gc %s'), then the emptied directory "
                                "('vmsnap rm --force %s'); or push elsewhere",
                                url, url, VMSNAP_XFER_MANIFEST, url, url, url);
        else if (rc > 0)
            rc = vmsnap_err_set(err, EEXIST,
                                "%s holds a snapshot set (%s/%s): a file pushed there would be "
                                "hidden by it; remove the set first ('vmsnap rm %s') or push "
                                "elsewhere",
                                url, url, VMSNAP_XFER_MANIFEST, url);
        const char *slash = strrchr(key, '/');
        if (rc == 0 && !strcmp(slash ? slash + 1 : key, VMSNAP_XFER_MANIFEST))
            rc = vmsnap_err_set(err, EINVAL,
                                "%s: %s is the name of a snapshot set's manifest, not one for an "
                                "object",
                                url, VMSNAP_XFER_MANIFEST);
        if (rc == 0)
            rc = not_inside_set(ctl, key, url, "a file", err);
        struct leftover_ctx l = {.exact = key, .c = ctl};
        if (rc == 0)
            rc = vmsnap_store_list_uploads(ctl, key, xfer_abort_leftover, &l, err);
        struct mf_file mf = {0};
        if (rc == 0)
            rc = xfer_push_fd(&x, ctl, fd, path, key, x.base_key, &mf, NULL, err);
        close(fd);
        if (rc == 0 && stats) {
            stats->files = 1;
            stats->logical = mf.size;
            stats->populated = mf.populated;
            stats->object_bytes = mf.object_size;
            stats->copied_bytes = mf.copied;
        }
    }
    if (rc < 0 && err && !strstr(err->msg, url))
        vmsnap_err_wrap(err, "push %s to %s: ", path, url);
    if (rc == 0 && x.base_key && !atomic_load(&x.base_used)) /* a typo costs the whole saving */
        vlog(x.o.base_implicit ? VMSNAP_LOG_INFO : VMSNAP_LOG_WARN,
             "base %s was not used (%s): every frame was compressed and uploaded", x.o.base,
             atomic_load(&x.base_why_set) ? x.base_why : "no file had one");
out:
    xfer_close(&x);
    return rc;
}
