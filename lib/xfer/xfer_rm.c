/* SPDX-License-Identifier: Apache-2.0 */
/*
 * vmsnap_xfer_remove: a set, its objects, uploads and push marks, or a single snapshot object.
 */
#include "xfer_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* The first bytes of object `key` begin a snapshot image: 1 (vmsnap's or the reference's
 * sparse-extent magic; with `zstd_too`, also a zstd or skippable frame: a plain-zstd snapshot),
 * 0 when they do not, -errno when they cannot be read. */
static int snapshot_magic(struct vmsnap_store_conn *c, const char *key, uint64_t size,
                          bool zstd_too, struct vmsnap_err *err)
{
    uint8_t h[8];
    size_t n = (size_t)VMSNAP_MIN(size, (uint64_t)sizeof(h));
    if (n < 4)
        return 0;
    int rc = vmsnap_store_get(c, key, 0, n, h, err);
    if (rc < 0)
        return rc;
    enum vmsnap_image_magic k = vmsnap_image_sniff(h, n);
    return k == VMSNAP_IMAGE_MAGIC_IMAGE || (zstd_too && k == VMSNAP_IMAGE_MAGIC_ZSTD);
}

/* What rm works on: the set (or single object) at `key`, and what it removed so far. */
struct rm_op {
    struct xfer *x;
    struct vmsnap_store_conn *c;
    const char *url, *key;
    bool force;
    char *mkey; /* the set's manifest */
    char *lp;   /* "<key>/": what is directly in the set */
    char murl[URL_BUF];
    struct manifest m;          /* the set's (none: no set, or --force over an unreadable one) */
    bool object_done;           /* the key was a single object, and it is removed */
    struct vmsnap_err kept_err; /* why the first kept push mark cannot be read */
    struct vmsnap_rm_result *res;
};

/* An object that a committed set beside it names: removing it alone breaks that set (an object
 * the set does not name, an older single-object snapshot, may go; a manifest that cannot be
 * read cannot tell, so it is kept). -EBUSY then. */
static int rm_object_in_set(struct rm_op *r, const char *slash, struct vmsnap_err *err)
{
    const char *key = r->key;
    char pm[URL_BUF], pu[URL_BUF] = "";
    int w = snprintf(pm, sizeof(pm), "%.*s/%s", (int)(slash - key), key, VMSNAP_XFER_MANIFEST);
    struct manifest pmf = {0};
    struct vmsnap_err pe = {0};
    int prc = -ENAMETOOLONG;
    if (w > 0 && (size_t)w < sizeof(pm)) {
        vmsnap_store_url(r->x->st, pm, pu, sizeof(pu));
        prc = xfer_read_manifest(r->c, pm, pu, r->x->o.max_size, &pmf, &pe);
    }
    const char *obj = slash + 1;
    size_t ol = strlen(obj);
    bool named = prc < 0 && prc != -ENOENT;
    for (size_t i = 0; i < pmf.n && !named; i++)
        named = ol == strlen(pmf.files[i].name) + 5 && !strncmp(obj, pmf.files[i].name, ol - 5) &&
                !strcmp(obj + ol - 5, ".zstd");
    manifest_fini(&pmf);
    if (!named)
        return 0;
    return vmsnap_err_set(err, EBUSY,
                          "%s belongs to the snapshot set whose manifest is %s%s%s: removing it "
                          "alone would break that set; remove the set (its URL) instead",
                          r->url, pu, prc < 0 ? ", which cannot be read: " : "",
                          prc < 0 ? pe.msg : "");
}

/* No manifest at the key: a single object is removed (a snapshot's only: rm is not a general
 * delete; r->object_done), else with --force what is under the key is swept (0), else -ENOENT. */
static int rm_no_manifest(struct rm_op *r, struct vmsnap_err *err)
{
    const char *key = r->key, *url = r->url;
    uint64_t size;
    int rc = vmsnap_store_head(r->c, key, &size, err);
    const char *slash = rc == 0 ? strrchr(key, '/') : NULL;
    if (slash && (rc = rm_object_in_set(r, slash, err)) < 0)
        return rc;
    if (rc == 0) {
        rc = snapshot_magic(r->c, key, size, true, err);
        if (rc == 0)
            return vmsnap_err_set(err, EINVAL,
                                  "%s: not a snapshot (no vmsnap, reference or zstd magic at "
                                  "byte 0): not removed",
                                  url);
        if (rc > 0 && (rc = vmsnap_store_delete(r->c, key, err)) == 0)
            r->res->object = r->object_done = true;
        return rc;
    }
    if (rc != -ENOENT)
        return rc;
    if (!r->force)
        return vmsnap_err_set(err, ENOENT,
                              "%s: no snapshot set here (no %s); --force deletes the *.zstd "
                              "objects under it",
                              url, VMSNAP_XFER_MANIFEST);
    return 0;
}

/* The manifest first: from there on the set is no longer visible. */
static int rm_manifest(struct rm_op *r, struct vmsnap_err *err)
{
    struct vmsnap_err me = {0};
    bool unusable = false;
    int mrc = xfer_read_manifest_x(r->c, r->mkey, r->murl, r->x->o.max_size, &r->m, NULL, NULL,
                                   &unusable, &me);
    if (mrc == -ENOENT && vmsnap_store_conn_no_bucket(r->c)) { /* a HEAD's 404 cannot tell */
        if (err)
            *err = me;
        return mrc;
    }
    if (mrc == -ENOENT)
        return rm_no_manifest(r, err);
    if (mrc < 0 && !r->force) {
        if (err)
            *err = me;
        /* --force is for a manifest that is not one (corrupt); a store that did not answer
         * is not helped by it */
        vmsnap_err_wrap(err, unusable ? "cannot read the manifest (--force deletes anyway): "
                                      : "cannot read the manifest: ");
        return mrc;
    }
    int rc = vmsnap_store_delete(r->c, r->mkey, err);
    if (rc == 0)
        r->res->set = true;
    return rc;
}

/* The objects the manifest names. */
static int rm_set_objects(struct rm_op *r, struct vmsnap_err *err)
{
    int rc = 0;
    for (size_t i = 0; i < r->m.n && rc == 0; i++) {
        char *ok = xfer_object_key(r->key, r->m.files[i].name);
        uint64_t osize;
        /* counted only when there (deleting a missing object succeeds) */
        rc = ok ? vmsnap_store_head(r->c, ok, &osize, err)
                : vmsnap_err_set(err, ENOMEM, "out of memory");
        if (rc == -ENOENT) {
            rc = 0;
        } else if (rc == 0 && (rc = vmsnap_store_delete(r->c, ok, err)) == 0) {
            char kurl[URL_BUF];
            vlog(VMSNAP_LOG_INFO, "removed %s", vmsnap_store_url(r->x->st, ok, kurl, sizeof(kurl)));
            r->res->objects++;
        }
        free(ok);
    }
    return rc;
}

/* --force: the other *.zstd objects directly in the set that are vmsnap images. */
static int rm_forced_objects(struct rm_op *r, struct vmsnap_err *err)
{
    struct vmsnap_rm_result *res = r->res;
    /* the set's objects are vmsnap images: anything else named *.zstd here (a plain zstd
     * backup, a file of the user's) is not the set's, and stays */
    struct keys k = {.suffix = ".zstd", .direct = r->lp};
    int rc = vmsnap_store_list(r->c, r->lp, xfer_collect, &k, err);
    for (size_t i = 0; i < k.n && rc == 0; i++) {
        uint64_t size;
        rc = vmsnap_store_head(r->c, k.v[i], &size, err);
        if (rc == -ENOENT) {
            rc = 0; /* deleted above (a manifest's) or meanwhile */
            continue;
        }
        if (rc == 0)
            rc = snapshot_magic(r->c, k.v[i], size, false, err);
        if (rc == -ENOENT) { /* gone between the HEAD and the GET */
            rc = 0;
            continue;
        }
        char kurl[URL_BUF];
        vmsnap_store_url(r->x->st, k.v[i], kurl, sizeof(kurl));
        if (rc == 0) {
            vlog(VMSNAP_LOG_INFO, "kept %s: not a vmsnap image", kurl);
            if (!res->kept++) { /* (a URL past the field is cut) */
                size_t kl = strnlen(kurl, sizeof(res->kept_key) - 1);
                memcpy(res->kept_key, kurl, kl);
                res->kept_key[kl] = 0;
            }
        } else if (rc > 0 && (rc = vmsnap_store_delete(r->c, k.v[i], err)) == 0) {
            vlog(VMSNAP_LOG_INFO, "removed %s", kurl);
            res->objects++;
        }
    }
    xfer_keys_free(&k);
    return rc;
}

/* The marks of pushes that did not finish here, and the objects they name (the set is gone
 * anyway; without them nothing would ever find those objects again). */
static int rm_marks(struct rm_op *r, struct vmsnap_err *err)
{
    struct mark_keys mk = {.k = {.suffix = "", .direct = r->lp}, .under = r->key};
    int rc = vmsnap_store_list(r->c, r->lp, xfer_collect_mark, &mk, err);
    for (size_t i = 0; i < mk.k.n && rc == 0; i++) {
        struct push_mark pm;
        char kurl[URL_BUF];
        vmsnap_store_url(r->x->st, mk.k.v[i], kurl, sizeof(kurl));
        struct vmsnap_err ke = {0};
        int krc = xfer_read_mark(r->c, mk.k.v[i], kurl, &pm, &ke);
        if (krc == -ENOENT)
            continue; /* removed meanwhile (a gc) */
        if (krc < 0 && !r->force) {
            /* it names objects that nothing else finds again: kept with them, and said */
            if (!r->res->marks_kept++)
                r->kept_err = ke;
            continue;
        }
        if (krc == 0) {
            for (size_t j = 0; j < pm.n && rc == 0; j++) {
                char *ok = xfer_object_key(r->key, pm.names[j]);
                rc = ok ? vmsnap_store_delete(r->c, ok, err)
                        : vmsnap_err_set(err, ENOMEM, "out of memory");
                if (rc == -ENOENT)
                    rc = 0;
                free(ok);
            }
            push_mark_fini(&pm);
        }
        if (rc == 0 && (rc = vmsnap_store_delete(r->c, mk.k.v[i], err)) == 0)
            r->res->pushes++;
    }
    xfer_keys_free(&mk.k);
    return rc;
}

/* What was removed: a mark kept fails the call, an empty directory left by a failed push goes,
 * and nothing at all removed is an error. */
static int rm_outcome(struct rm_op *r, struct vmsnap_err *err)
{
    struct vmsnap_rm_result *res = r->res;
    const char *url = r->url;
    if (res->marks_kept)
        return vmsnap_err_set(err, r->kept_err.code ? r->kept_err.code : EINVAL,
                              "%s: %s%u push mark%s kept, which cannot be read (first: %s); the "
                              "objects a mark names would be lost to gc without it: repair or "
                              "inspect it, or 'rm --force' deletes it and every vmsnap image here",
                              url, res->set ? "set removed, but " : "", res->marks_kept,
                              res->marks_kept == 1 ? "" : "s", r->kept_err.msg);
    if (!res->set && !res->objects && !res->uploads && !res->pushes && !res->kept &&
        vmsnap_store_kind(r->x->st) == VMSNAP_STORE_LOCAL) {
        /* an empty directory a failed push left: removing it is what rm --force is for */
        char *dir = vmsnap_store_local_path(r->x->st, r->key);
        struct stat sb;
        if (dir && lstat(dir, &sb) == 0 && S_ISDIR(sb.st_mode)) {
            vmsnap_store_tidy(r->c, r->lp);
            res->empty_dir = lstat(dir, &sb) < 0;
        }
        free(dir);
    }
    if (!res->set && !res->objects && !res->uploads && !res->pushes && !res->empty_dir)
        return res->kept ? vmsnap_err_set(err, EINVAL,
                                          "%s: nothing removed: no %s, and the *.zstd objects "
                                          "here (%u) are not vmsnap images (first: %s)",
                                          url, VMSNAP_XFER_MANIFEST, res->kept, res->kept_key)
                         : vmsnap_err_set(err, ENOENT,
                                          "%s: nothing to remove (no %s, no object, no unfinished "
                                          "upload or push here)",
                                          url, VMSNAP_XFER_MANIFEST);
    vmsnap_store_tidy(r->c, r->lp);
    return 0;
}

int vmsnap_xfer_remove(const char *url, bool force, const struct vmsnap_xfer_opts *opts,
                       struct vmsnap_rm_result *res, struct vmsnap_err *err)
{
    struct vmsnap_rm_result r0 = {0};
    if (!res)
        res = &r0;
    *res = r0;
    struct xfer x;
    int rc = xfer_open(&x, url, opts, 0, err);
    if (rc < 0)
        return rc;
    struct rm_op r = {.x = &x, .url = url, .key = x.key, .force = force, .res = res};
    r.mkey = xfer_join_key(r.key, VMSNAP_XFER_MANIFEST);
    r.lp = xfer_join_key(r.key, "");
    if (!*r.key) {
        rc = vmsnap_err_set(err, EINVAL, "%s: refusing to remove a whole bucket or root", url);
        goto out;
    }
    if (!r.mkey || !r.lp) {
        rc = vmsnap_err_set(err, ENOMEM, "out of memory");
        goto out;
    }
    vmsnap_store_url(x.st, r.mkey, r.murl, sizeof(r.murl));
    if ((rc = xfer_conn(&x, err)) < 0)
        goto out;
    r.c = x.ctl;
    if ((rc = rm_manifest(&r, err)) < 0 || r.object_done)
        goto out;
    /* a layered set's objects may be layers of other sets: gc removes those nobody names */
    if (r.m.format_version == 3)
        vlog(VMSNAP_LOG_INFO,
             "%s: its layer objects stay until a 'vmsnap gc' past its grace period "
             "(--older-than) finds no set naming them",
             url);
    else
        rc = rm_set_objects(&r, err);
    if (rc == 0 && force)
        rc = rm_forced_objects(&r, err);
    if (rc == 0) {
        /* this set's uploads only: a push to a set below it is not this set's */
        struct leftover_ctx l = {.c = r.c, .in = r.lp};
        rc = vmsnap_store_list_uploads(r.c, r.lp, xfer_abort_leftover, &l, err);
        res->uploads = l.n;
    }
    if (rc == 0)
        rc = rm_marks(&r, err);
    if (rc == 0)
        rc = rm_outcome(&r, err);
out:
    if (rc < 0 && err && !strstr(err->msg, url))
        vmsnap_err_wrap(err, "rm %s: ", url);
    manifest_fini(&r.m);
    free(r.mkey);
    free(r.lp);
    xfer_close(&x);
    return rc;
}
