/* SPDX-License-Identifier: Apache-2.0 */
/*
 * vmsnap_xfer_gc: leftover uploads and the push marks (and the objects they name) of killed
 * pushes, removed only from a prefix that is quiet.
 */
#include "xfer_int.h"

#include <errno.h>
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
        xfer_gc_report(l, VMSNAP_GC_PUSH, keys[i], 0, age, false);
        l->kept++;
    }
}

/* gc at one prefix `dir` (the part of its marks' keys before the name): what it found there. */
struct marks_at {
    struct xfer *x;
    struct vmsnap_store_conn *c;
    struct leftover_ctx *l;
    char **keys; /* the marks */
    size_t n;
    const char *dir;
    char durl[URL_BUF];
    char *mkey;           /* the set's manifest there */
    char *lp;             /* "<dir>/" */
    struct push_mark *pm; /* per mark */
    size_t names;         /* the names of every mark */
    struct manifest m;    /* the set there, when mrc is 0 (-ENOENT: none) */
    int mrc;
    struct cand *cands; /* the objects gc would delete */
    size_t nc;
    struct prefix_seen seen; /* the first listing of the prefix */
    int64_t age;             /* of the newest write or upload there (-1: unknown) */
    struct vmsnap_err e;
};

/* Every mark, whole: one that cannot be read could be a running push's. False when gc leaves
 * the prefix (said and counted). */
static bool marks_read(struct marks_at *a)
{
    struct leftover_ctx *l = a->l;
    for (size_t i = 0; i < a->n; i++) {
        char murl[URL_BUF];
        vmsnap_store_url(a->x->st, a->keys[i], murl, sizeof(murl));
        int rc = xfer_read_mark(a->c, a->keys[i], murl, &a->pm[i], &a->e);
        if (rc == -ENOENT) { /* gone meanwhile: a push just finished here */
            keep_marks(l, a->keys, a->n, 0);
            return false;
        }
        if (rc < 0) {
            vlog(VMSNAP_LOG_WARN, "%s (nothing under %s removed)", a->e.msg, a->durl);
            xfer_gc_failed(l, a->keys[i], &a->e);
            keep_marks(l, a->keys, a->n, -1);
            return false;
        }
        a->names += a->pm[i].n;
    }
    return true;
}

/* The set there, if any: which objects are its own. */
static bool marks_set(struct marks_at *a)
{
    char murl[URL_BUF];
    vmsnap_store_url(a->x->st, a->mkey, murl, sizeof(murl));
    a->mrc = xfer_read_manifest(a->c, a->mkey, murl, a->x->o.max_size, &a->m, &a->e);
    if (a->mrc < 0 && a->mrc != -ENOENT) {
        /* which objects are the set's is not known: leave them all */
        vlog(VMSNAP_LOG_WARN, "%s (the push marks beside it are left in place)", a->e.msg);
        xfer_gc_failed(a->l, a->mkey, &a->e);
        keep_marks(a->l, a->keys, a->n, -1);
        return false;
    }
    return true;
}

/* The candidates: objects named by a mark, not by the manifest (once each). */
static bool marks_candidates(struct marks_at *a)
{
    a->cands = calloc(a->names ? a->names : 1, sizeof(*a->cands));
    if (!a->cands) {
        vmsnap_err_set(&a->e, ENOMEM, "out of memory");
        xfer_gc_failed(a->l, a->keys[0], &a->e);
        return false;
    }
    const struct manifest *m = &a->m;
    for (size_t i = 0; i < a->n; i++) {
        const struct push_mark *pm = &a->pm[i];
        /* a mark of the committed set's own push: its files are that set's; what it replaced
         * and did not remove yet (killed right after its commit) is not */
        bool own = a->mrc == 0 && !strcmp(m->push_id, pm->push_id);
        for (size_t j = own ? pm->nfiles : 0; j < pm->n; j++) {
            bool keep = false;
            for (size_t f = 0; a->mrc == 0 && f < m->n && !keep; f++)
                keep = !strcmp(m->files[f].name, pm->names[j]);
            char *k = keep ? NULL : xfer_object_key(a->dir, pm->names[j]);
            for (size_t q = 0; k && q < a->nc; q++)
                if (!strcmp(a->cands[q].key, k))
                    free(k), k = NULL;
            if (k)
                a->cands[a->nc++].key = k;
        }
    }
    return true;
}

/* Quiet: no key written and no upload active for older_than. */
static bool marks_quiet(struct marks_at *a)
{
    struct leftover_ctx *l = a->l;
    const struct vmsnap_gc_opts *g = l->gc;
    a->seen =
        (struct prefix_seen){.newest = -1, .cands = a->cands, .ncands = a->nc, .record = true};
    struct prefix_uploads up = {.c = a->c, .newest = -1};
    int rc = vmsnap_store_list(a->c, a->lp, see_key, &a->seen, &a->e);
    if (rc == 0 && (rc = vmsnap_store_list_uploads(a->c, a->lp, xfer_see_upload, &up, &a->e)) < 0 &&
        !a->e.code)
        a->e = up.err; /* stopped by xfer_see_upload */
    if (rc < 0) {
        vlog(VMSNAP_LOG_WARN, "cannot list %s: %s (nothing there removed)", a->durl, a->e.msg);
        xfer_gc_failed(l, a->keys[0], &a->e);
        keep_marks(l, a->keys, a->n, -1);
        return false;
    }
    int64_t newest = VMSNAP_MAX(a->seen.newest, up.newest);
    a->age = newest < 0 ? -1 : xfer_age_of(l, newest);
    if (g->older_than > 0 && (a->seen.unknown || up.unknown || !xfer_old_enough(g, a->age))) {
        keep_marks(l, a->keys, a->n, a->age);
        if (a->seen.unknown || up.unknown)
            l->unknown += (unsigned)a->n;
        return false;
    }
    return true;
}

/* --dry-run: what would go. */
static void marks_dry_run(struct marks_at *a)
{
    struct leftover_ctx *l = a->l;
    for (size_t i = 0; i < a->n; i++)
        xfer_gc_report(l, VMSNAP_GC_PUSH, a->keys[i], 0, a->age, true);
    l->pushes += (unsigned)a->n;
    for (size_t q = 0; q < a->nc; q++)
        l->objects += a->cands[q].present;
}

/* Each delete right after a listing that shows the prefix as the first one did (a push started
 * since wrote its mark, and whatever it stored is newer), in one attempt: no back-off between
 * the check and the delete. *done: the objects deleted. False when gc stopped (the marks stay). */
static bool marks_delete_objects(struct marks_at *a, unsigned *done)
{
    struct leftover_ctx *l = a->l;
    for (size_t q = 0; q <= a->nc; q++) {
        if (q < a->nc && !a->cands[q].present)
            continue;
        struct prefix_seen again = {.newest = -1, .cands = a->cands, .ncands = a->nc};
        int rc = vmsnap_store_list(a->c, a->lp, see_key, &again, &a->e);
        if (rc < 0 || again.keys != a->seen.keys || again.sum != a->seen.sum || again.changed) {
            if (rc < 0)
                xfer_gc_failed(l, a->keys[0], &a->e);
            else
                vlog(VMSNAP_LOG_WARN,
                     "%s changed while gc looked at it (a push?): left for the next run", a->durl);
            keep_marks(l, a->keys, a->n, a->age);
            return false;
        }
        if (q == a->nc)
            break;
        rc = xfer_delete_once(a->c, a->cands[q].key, &a->e);
        if (rc < 0 && rc != -ENOENT) {
            vlog(VMSNAP_LOG_WARN, "cannot delete %s: %s (the marks stay for the next run)",
                 a->cands[q].key, a->e.msg);
            xfer_gc_failed(l, a->cands[q].key, &a->e);
            keep_marks(l, a->keys, a->n, a->age);
            return false;
        }
        a->cands[q].present = false; /* gone now: the next listing must not show it */
        (*done)++;
    }
    return true;
}

/* Then the marks (and the directory, when no set is there). */
static void marks_delete(struct marks_at *a)
{
    struct leftover_ctx *l = a->l;
    for (size_t i = 0; i < a->n; i++) {
        int rc = vmsnap_store_delete(a->c, a->keys[i], &a->e);
        if (rc < 0 && rc != -ENOENT) {
            xfer_gc_failed(l, a->keys[i], &a->e);
            l->kept++;
            continue;
        }
        vlog(VMSNAP_LOG_INFO, "removed the push mark %s", a->keys[i]);
        xfer_gc_report(l, VMSNAP_GC_PUSH, a->keys[i], 0, a->age, true);
        l->pushes++;
    }
    if (a->mrc == -ENOENT)
        vmsnap_store_tidy(a->c, a->lp);
}

/* The marks of one prefix `dir`: read, checked quiet, then what they name and they go. */
static void clean_marks_in(struct xfer *x, struct vmsnap_store_conn *c, struct leftover_ctx *l,
                           char **keys, size_t n, const char *dir)
{
    struct marks_at a = {.x = x, .c = c, .l = l, .keys = keys, .n = n, .dir = dir};
    a.pm = calloc(n, sizeof(*a.pm));
    a.mkey = xfer_join_key(dir, VMSNAP_XFER_MANIFEST);
    a.lp = xfer_join_key(dir, "");
    vmsnap_store_url(x->st, dir, a.durl, sizeof(a.durl));
    if (!a.pm || !a.mkey || !a.lp) {
        vmsnap_err_set(&a.e, ENOMEM, "out of memory");
        xfer_gc_failed(l, keys[0], &a.e);
        goto out;
    }
    if (!marks_read(&a) || !marks_set(&a) || !marks_candidates(&a) || !marks_quiet(&a))
        goto out;
    if (l->gc->dry_run) {
        marks_dry_run(&a);
        goto out;
    }
    sys_failpoint("gc-before-delete");
    unsigned done = 0;
    if (marks_delete_objects(&a, &done))
        marks_delete(&a);
    l->objects += done;
out:
    for (size_t i = 0; a.pm && i < n; i++)
        push_mark_fini(&a.pm[i]);
    for (size_t q = 0; q < a.nc; q++)
        free(a.cands[q].key);
    free(a.cands);
    free(a.pm);
    free(a.mkey);
    free(a.lp);
    manifest_fini(&a.m);
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
    if (rc == 0)
        rc = xfer_gc_layers(&x, c, key, &l, err);
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
                                         .failed = l.failed,
                                         .unreachable = l.unreachable,
                                         .unreachable_bytes = l.unreachable_bytes};
    free(l.live_dir);
    xfer_close(&x);
    return rc;
}
