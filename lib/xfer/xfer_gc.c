/* SPDX-License-Identifier: Apache-2.0 */
/*
 * vmsnap_xfer_gc: leftover uploads and the push marks (and the objects they name) of killed
 * pushes, removed only from a prefix that is quiet.
 */
#include "xfer_int.h"

#include "sys/sys.h"
#include "vmsnap/xfer.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <xxhash.h>

size_t xfer_dir_len(const char *key)
{
    const char *sl = strrchr(key, '/');
    return sl ? (size_t)(sl - key) : 0;
}

int xfer_collect_mark(void *arg, const char *key, uint64_t size, int64_t mtime)
{
    struct mark_keys *mk = arg;
    char id[33];
    if (!xfer_mark_name(xfer_key_base(key), id) || !xfer_key_under(mk->under, key))
        return 0;
    return xfer_collect(&mk->k, key, size, mtime);
}

/* Directory first (so that one prefix's marks are adjacent), then name. */
static int cmp_by_dir(const void *a, const void *b)
{
    const char *x = *(char *const *)a, *y = *(char *const *)b;
    size_t dx = xfer_dir_len(x), dy = xfer_dir_len(y);
    int c = memcmp(x, y, VMSNAP_MIN(dx, dy));
    if (c)
        return c;
    if (dx != dy)
        return dx < dy ? -1 : 1;
    return strcmp(x + dx, y + dy);
}

/* The objects gc would delete at a prefix, as its first listing saw them. */
struct cand {
    char *key;
    uint64_t size;
    int64_t mtime;
    bool present; /* in the first listing */
};

/* What a listing of a prefix saw: the newest write, and a fingerprint of every key but the
 * candidates (which are checked one by one), enough to tell that nothing changed between two
 * listings. */
struct prefix_seen {
    uint64_t keys, sum;
    int64_t newest; /* the newest write under it (-1: none seen) */
    bool unknown;   /* a key whose time the store did not give */
    struct cand *cands;
    size_t ncands;
    bool record;  /* first listing: note the candidates; else compare with what it noted */
    bool changed; /* a candidate differs from the first listing */
};

static int see_key(void *arg, const char *key, uint64_t size, int64_t mtime)
{
    struct prefix_seen *p = arg;
    if (mtime < 0)
        p->unknown = true;
    else if (mtime > p->newest)
        p->newest = mtime;
    for (size_t i = 0; i < p->ncands; i++) {
        struct cand *c = &p->cands[i];
        if (strcmp(c->key, key))
            continue;
        if (p->record)
            *c = (struct cand){c->key, size, mtime, true};
        else if (!c->present || c->size != size || c->mtime != mtime)
            p->changed = true; /* written since: a push's now */
        return 0;
    }
    p->keys++;
    uint64_t v[2] = {size, (uint64_t)mtime};
    p->sum += XXH64(key, strlen(key), XXH64(v, sizeof(v), 0));
    return 0;
}

/* Keep every mark of a prefix (reported as kept). */
static void keep_marks(struct leftover_ctx *l, char **keys, size_t n, int64_t age)
{
    for (size_t i = 0; i < n; i++) {
        xfer_gc_report(l, VMSNAP_GC_PUSH, keys[i], age, false);
        l->kept++;
    }
}

/* The marks of one prefix `dir` (the part of their keys before the name). */
static void clean_marks_in(struct xfer *x, struct vmsnap_store_conn *c, struct leftover_ctx *l,
                           char **keys, size_t n, const char *dir)
{
    const struct vmsnap_gc_opts *g = l->gc;
    struct push_mark *pm = calloc(n, sizeof(*pm));
    struct manifest m = {0};
    struct cand *cands = NULL;
    size_t nc = 0;
    char *mkey = xfer_join_key(dir, VMSNAP_XFER_MANIFEST);
    char *lp = xfer_join_key(dir, "");
    char durl[URL_BUF];
    vmsnap_store_url(x->st, dir, durl, sizeof(durl));
    struct vmsnap_err e = {0};
    if (!pm || !mkey || !lp) {
        vmsnap_err_set(&e, ENOMEM, "out of memory");
        xfer_gc_failed(l, keys[0], &e);
        goto out;
    }
    /* every mark, whole: one that cannot be read could be a running push's */
    size_t names = 0;
    for (size_t i = 0; i < n; i++) {
        char murl[URL_BUF];
        vmsnap_store_url(x->st, keys[i], murl, sizeof(murl));
        int rc = xfer_read_mark(c, keys[i], murl, &pm[i], &e);
        if (rc == -ENOENT) { /* gone meanwhile: a push just finished here */
            keep_marks(l, keys, n, 0);
            goto out;
        }
        if (rc < 0) {
            vlog(VMSNAP_LOG_WARN, "%s (nothing under %s removed)", e.msg, durl);
            xfer_gc_failed(l, keys[i], &e);
            keep_marks(l, keys, n, -1);
            goto out;
        }
        names += pm[i].n;
    }
    char murl[URL_BUF];
    vmsnap_store_url(x->st, mkey, murl, sizeof(murl));
    int mrc = xfer_read_manifest(c, mkey, murl, x->o.max_size, &m, &e);
    if (mrc < 0 && mrc != -ENOENT) {
        /* which objects are the set's is not known: leave them all */
        vlog(VMSNAP_LOG_WARN, "%s (the push marks beside it are left in place)", e.msg);
        xfer_gc_failed(l, mkey, &e);
        keep_marks(l, keys, n, -1);
        goto out;
    }
    /* the candidates: objects named by a mark, not by the manifest (once each) */
    cands = calloc(names ? names : 1, sizeof(*cands));
    if (!cands) {
        vmsnap_err_set(&e, ENOMEM, "out of memory");
        xfer_gc_failed(l, keys[0], &e);
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        /* a mark of the committed set's own push: its files are that set's; what it replaced
         * and did not remove yet (killed right after its commit) is not */
        bool own = mrc == 0 && !strcmp(m.push_id, pm[i].push_id);
        for (size_t j = own ? pm[i].nfiles : 0; j < pm[i].n; j++) {
            bool keep = false;
            for (size_t f = 0; mrc == 0 && f < m.n && !keep; f++)
                keep = !strcmp(m.files[f].name, pm[i].names[j]);
            char *k = keep ? NULL : xfer_object_key(dir, pm[i].names[j]);
            for (size_t q = 0; k && q < nc; q++)
                if (!strcmp(cands[q].key, k))
                    free(k), k = NULL;
            if (k)
                cands[nc++].key = k;
        }
    }
    /* quiet: no key written and no upload active for older_than */
    struct prefix_seen seen = {.newest = -1, .cands = cands, .ncands = nc, .record = true};
    struct prefix_uploads up = {.c = c, .newest = -1};
    int rc = vmsnap_store_list(c, lp, see_key, &seen, &e);
    if (rc == 0 && (rc = vmsnap_store_list_uploads(c, lp, xfer_see_upload, &up, &e)) < 0 && !e.code)
        e = up.err; /* stopped by xfer_see_upload */
    if (rc < 0) {
        vlog(VMSNAP_LOG_WARN, "cannot list %s: %s (nothing there removed)", durl, e.msg);
        xfer_gc_failed(l, keys[0], &e);
        keep_marks(l, keys, n, -1);
        goto out;
    }
    int64_t newest = VMSNAP_MAX(seen.newest, up.newest);
    int64_t age = newest < 0 ? -1 : xfer_age_of(l, newest);
    if (g->older_than > 0 && (seen.unknown || up.unknown || !xfer_old_enough(g, age))) {
        keep_marks(l, keys, n, age);
        if (seen.unknown || up.unknown)
            l->unknown += (unsigned)n;
        goto out;
    }
    if (g->dry_run) {
        for (size_t i = 0; i < n; i++)
            xfer_gc_report(l, VMSNAP_GC_PUSH, keys[i], age, true);
        l->pushes += (unsigned)n;
        for (size_t q = 0; q < nc; q++)
            l->objects += cands[q].present;
        goto out;
    }
    sys_failpoint("gc-before-delete");
    /* Each delete right after a listing that shows the prefix as the first one did (a push
     * started since wrote its mark, and whatever it stored is newer), in one attempt: no
     * back-off between the check and the delete. Then the marks. */
    unsigned done = 0;
    for (size_t q = 0; q <= nc; q++) {
        if (q < nc && !cands[q].present)
            continue;
        struct prefix_seen again = {.newest = -1, .cands = cands, .ncands = nc};
        rc = vmsnap_store_list(c, lp, see_key, &again, &e);
        if (rc < 0 || again.keys != seen.keys || again.sum != seen.sum || again.changed) {
            if (rc < 0)
                xfer_gc_failed(l, keys[0], &e);
            else
                vlog(VMSNAP_LOG_WARN,
                     "%s changed while gc looked at it (a push?): left for the next run", durl);
            keep_marks(l, keys, n, age);
            goto counted;
        }
        if (q == nc)
            break;
        rc = xfer_delete_once(c, cands[q].key, &e);
        if (rc < 0 && rc != -ENOENT) {
            vlog(VMSNAP_LOG_WARN, "cannot delete %s: %s (the marks stay for the next run)",
                 cands[q].key, e.msg);
            xfer_gc_failed(l, cands[q].key, &e);
            keep_marks(l, keys, n, age);
            goto counted;
        }
        cands[q].present = false; /* gone now: the next listing must not show it */
        done++;
    }
    for (size_t i = 0; i < n; i++) {
        rc = vmsnap_store_delete(c, keys[i], &e);
        if (rc < 0 && rc != -ENOENT) {
            xfer_gc_failed(l, keys[i], &e);
            l->kept++;
            continue;
        }
        vlog(VMSNAP_LOG_INFO, "removed the push mark %s", keys[i]);
        xfer_gc_report(l, VMSNAP_GC_PUSH, keys[i], age, true);
        l->pushes++;
    }
    if (mrc == -ENOENT)
        vmsnap_store_tidy(c, lp);
counted:
    l->objects += done;
out:
    for (size_t i = 0; pm && i < n; i++)
        push_mark_fini(&pm[i]);
    for (size_t q = 0; q < nc; q++)
        free(cands[q].key);
    free(cands);
    free(pm);
    free(mkey);
    free(lp);
    manifest_fini(&m);
}

static int clean_marks(struct xfer *x, struct vmsnap_store_conn *c, struct leftover_ctx *l,
                       const char *prefix, struct vmsnap_err *err)
{
    struct mark_keys mk = {.k = {.suffix = ""}, .under = prefix};
    /* every key that starts with `prefix`, then xfer_key_under */
    int rc = vmsnap_store_list(c, prefix, xfer_collect_mark, &mk, err);
    if (rc < 0 && (!err || !err->code))
        rc = err_code(err, -rc, "list %s", prefix);
    if (rc == 0 && mk.k.n)
        qsort(mk.k.v, mk.k.n, sizeof(*mk.k.v), cmp_by_dir);
    for (size_t i = 0; rc == 0 && i < mk.k.n;) {
        size_t dl = xfer_dir_len(mk.k.v[i]);
        size_t j = i + 1;
        while (j < mk.k.n && xfer_dir_len(mk.k.v[j]) == dl && !strncmp(mk.k.v[j], mk.k.v[i], dl))
            j++;
        char *dir = strndup(mk.k.v[i], dl);
        if (!dir) {
            rc = vmsnap_err_set(err, ENOMEM, "out of memory");
            break;
        }
        clean_marks_in(x, c, l, mk.k.v + i, j - i, dir);
        free(dir);
        i = j;
    }
    xfer_keys_free(&mk.k);
    return rc;
}

int vmsnap_xfer_gc(const char *url, const struct vmsnap_gc_opts *g,
                   const struct vmsnap_xfer_opts *opts, struct vmsnap_gc_result *res,
                   struct vmsnap_err *err)
{
    static const struct vmsnap_gc_opts all;
    struct xfer x;
    if (res)
        *res = (struct vmsnap_gc_result){0};
    int rc = xfer_open(&x, url, opts, XFER_PREFIX, err);
    if (rc < 0)
        return rc;
    const char *key = x.key;
    struct leftover_ctx l = {.under = key, .gc = g ? g : &all, .now = (int64_t)time(NULL)};
    rc = xfer_conn(&x, err);
    struct vmsnap_store_conn *c = x.ctl;
    l.c = c;
    if (rc == 0)
        rc = vmsnap_store_list_uploads(c, key, xfer_abort_leftover, &l, err);
    unsigned up_failed = l.failed;
    if (rc == 0)
        rc = clean_marks(&x, c, &l, key, err);
    if (rc == 0 && up_failed)
        rc = vmsnap_err_set(err, l.first.code ? l.first.code : EIO,
                            "could not abort %u of %u unfinished upload%s under %s (%s: %s)",
                            up_failed, up_failed + l.n, up_failed + l.n == 1 ? "" : "s", url,
                            l.first_key, l.first.msg);
    else if (rc == 0 && l.failed)
        rc = vmsnap_err_set(err, l.first.code ? l.first.code : EIO,
                            "%u of the things killed pushes left under %s could not be removed "
                            "(%s: %s)",
                            l.failed, url, l.first_key, l.first.msg);
    else if (rc == 0 && vmsnap_store_conn_list_skipped(c))
        rc = vmsnap_err_set(err, EACCES,
                            "some directories under %s could not be read (skipped: see the "
                            "warnings above); what killed pushes left there stays",
                            url);
    if (res)
        *res = (struct vmsnap_gc_result){.aborted = l.n,
                                         .pushes = l.pushes,
                                         .objects = l.objects,
                                         .kept = l.kept,
                                         .unknown_age = l.unknown,
                                         .failed = l.failed};
    free(l.live_dir);
    xfer_close(&x);
    return rc;
}
