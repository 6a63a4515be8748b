/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Read-back verification of a set push: every object's tableSha256 before the commit, the
 * manifest and objects after it, and the checks that the set there is still the one replaced.
 */
#include "xfer_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/*
 * Is what the store holds this push's set? Two pushes to one prefix at the same time (a split
 * brain: two nodes suspending one sandbox) write the same keys; the manifest of one can end up
 * over objects of the other, and both would report success. Each manifest carries its push's id,
 * so: before the commit every object's tableSha256 (its first bytes, which the push keeps, and
 * its seek table, read back with one GET of its tail) must be what we stored (else nothing is
 * committed over another push's objects); after it, the manifest read back must be ours and the
 * objects still ours. Each round runs in parallel on the pool's connections: one round trip for
 * most sets. A push that fails either reports that the snapshot is not stored.
 */
struct check {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    size_t left;
    int rc;
    struct vmsnap_err err;
};

struct check_task {
    struct xtask t;
    struct check *k;
    struct xfer *x;
    char *key;
    const struct mf_file *f; /* NULL: the manifest */
    const char *push_id;
};

int xfer_check_object(struct xfer *x, struct vmsnap_store_conn *c, const char *key,
                      const struct mf_file *f, struct vmsnap_err *err)
{
    char url[URL_BUF];
    vmsnap_store_url(x->st, key, url, sizeof(url));
    struct tail_src t = {.c = c, .key = key};
    t.buf = malloc(TAIL_READ);
    if (!t.buf)
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    size_t got = 0;
    int rc = vmsnap_store_get_tail(c, key, TAIL_READ, t.buf, &got, &t.size, err);
    if (rc == 0 && t.size != f->object_size)
        rc = vmsnap_err_set(err, ESTALE, "%s holds %llu bytes, this push stored %llu", url,
                            (unsigned long long)t.size, (unsigned long long)f->object_size);
    struct vmsnap_image *img = NULL;
    if (rc == 0) {
        t.boff = t.size - got;
        t.blen = got;
        if (f->have_prefix) {
            t.pre = f->prefix;
            t.plen = sizeof(f->prefix);
        }
        struct vmsnap_source src = {xfer_tail_pread, &t, t.size, url};
        rc = vmsnap_image_open(&src, x->o.max_size, &img, err);
        if (rc == 0)
            rc = vmsnap_err_set(err, ESTALE, "%s has no seek table", url);
    }
    char hx[65];
    if (rc > 0 && (rc = xfer_table_sha256(img, hx, err)) == 0 && strcmp(hx, f->sha256))
        rc = vmsnap_err_set(err, ESTALE, "%s is not the object this push stored", url);
    vmsnap_image_free(img);
    free(t.buf);
    return rc;
}

static void check_run(struct xtask *xt, struct vmsnap_store_conn *c)
{
    struct check_task *t = (struct check_task *)xt;
    struct vmsnap_err e = {0};
    int rc;
    cancel_hold(); /* a few small GETs; after the commit, what the push reports rests on them */
    if (t->f) {
        rc = xfer_check_object(t->x, c, t->key, t->f, &e);
    } else {
        char murl[URL_BUF];
        vmsnap_store_url(t->x->st, t->key, murl, sizeof(murl));
        struct manifest m;
        rc = xfer_read_manifest(c, t->key, murl, t->x->o.max_size, &m, &e);
        if (rc == 0) {
            if (strcmp(m.push_id, t->push_id))
                rc = vmsnap_err_set(&e, ESTALE, "%s is from another push (%s)", murl,
                                    m.push_id[0] ? m.push_id : "without a push id");
            manifest_fini(&m);
        }
    }
    pthread_mutex_lock(&t->k->mu);
    if (rc < 0 && t->k->rc == 0) {
        t->k->rc = rc;
        t->k->err = e;
    }
    if (--t->k->left == 0)
        pthread_cond_signal(&t->k->cv);
    pthread_mutex_unlock(&t->k->mu);
    free(t->key);
    free(t);
    cancel_release();
}

int xfer_check_committed(struct xfer *x, const char *prefix, const char *mkey,
                         const struct manifest *m, const char *url, bool committed,
                         struct vmsnap_err *err)
{
    struct check k = {.left = 0};
    pthread_mutex_init(&k.mu, NULL);
    pthread_cond_init(&k.cv, NULL);
    int rc = 0;
    for (size_t i = 0; i < m->n + (committed ? 1 : 0) && rc == 0; i++) {
        struct check_task *t = calloc(1, sizeof(*t));
        if (t)
            t->key = i < m->n ? xfer_object_key(prefix, m->files[i].name) : strdup(mkey);
        if (!t || !t->key) {
            free(t);
            rc = vmsnap_err_set(err, ENOMEM, "out of memory");
            break;
        }
        t->t.run = check_run;
        t->k = &k;
        t->x = x;
        t->f = i < m->n ? &m->files[i] : NULL;
        t->push_id = m->push_id;
        pthread_mutex_lock(&k.mu);
        k.left++;
        pthread_mutex_unlock(&k.mu);
        xpool_submit(&x->pool, &t->t);
    }
    pthread_mutex_lock(&k.mu);
    while (k.left)
        pthread_cond_wait(&k.cv, &k.mu);
    pthread_mutex_unlock(&k.mu);
    pthread_mutex_destroy(&k.mu);
    pthread_cond_destroy(&k.cv);
    if (rc == 0 && k.rc < 0 && k.rc != -ESTALE && k.rc != -ENOENT)
        rc = vmsnap_err_set(err, -k.rc,
                            "%s: cannot read the set back to check it %s: %s; this snapshot is "
                            "NOT known to be stored there",
                            url, committed ? "after the commit" : "before the commit", k.err.msg);
    else if (rc == 0 && k.rc < 0)
        rc = vmsnap_err_set(err, EBUSY,
                            "%s: another push to the same place ran at the same time: %s, %s; "
                            "this snapshot is NOT stored there",
                            url,
                            committed ? "after this one committed" : "before this one could commit",
                            k.err.msg);
    return rc;
}

/* 1 when the manifest at `mkey` is push `id`'s, 0 when it is not (or gone), < 0 when it cannot
 * be read. */
int xfer_manifest_is(struct xfer *x, struct vmsnap_store_conn *c, const char *mkey, const char *id)
{
    char murl[URL_BUF];
    vmsnap_store_url(x->st, mkey, murl, sizeof(murl));
    struct manifest m = {0};
    struct vmsnap_err e = {0};
    int rc = xfer_read_manifest(c, mkey, murl, x->o.max_size, &m, &e);
    if (rc == 0)
        rc = !strcmp(m.push_id, id);
    manifest_fini(&m);
    return rc == -ENOENT ? 0 : rc;
}

/* 1 when the manifest at `mkey` is, byte for byte, the one this push read when it started
 * (the set it replaces), 0 when it is another or gone, < 0 when it cannot be read. */
int xfer_manifest_same(struct xfer *x, struct vmsnap_store_conn *c, const char *mkey,
                       const struct set_push *s, struct vmsnap_err *err)
{
    char murl[URL_BUF];
    vmsnap_store_url(x->st, mkey, murl, sizeof(murl));
    struct manifest m = {0};
    char *raw = NULL;
    size_t len = 0;
    int rc =
        xfer_read_manifest_x(c, mkey, murl, UINT64_MAX, &m, &raw, &len, NULL, err); /* as read */
    manifest_fini(&m);
    if (rc == 0)
        rc = len == s->old_raw_len && !memcmp(raw, s->old_raw, len);
    free(raw);
    if (rc == -ENOENT) {
        vmsnap_err_clear(err);
        return 0;
    }
    return rc;
}

/* Are this push's held uploads (the old set's names) all still there? One listing of the
 * prefix's uploads. Another push starting at the prefix aborts the unfinished uploads it finds
 * there: un-committing over uploads that are gone left neither set (the completions fail, and a
 * restore gives way to that push's mark). 1: all there, 0: one is gone, < 0: cannot tell. */
struct held_ctx {
    const struct set_push *s;
    bool *seen;
};

static int see_held(void *arg, const char *key, const char *id, int64_t started)
{
    (void)key;
    (void)started;
    struct held_ctx *h = arg;
    for (size_t i = 0; i < h->s->n; i++)
        if (h->s->def[i].upload_id && !strcmp(h->s->def[i].upload_id, id))
            h->seen[i] = true;
    return 0;
}

int xfer_held_intact(struct vmsnap_store_conn *ctl, const char *prefix, const struct set_push *s,
                     struct vmsnap_err *err)
{
    if (!s->def)
        return 1;
    char *lp = xfer_join_key(prefix, "");
    bool *seen = calloc(s->n ? s->n : 1, sizeof(*seen));
    struct held_ctx h = {s, seen};
    int rc = lp && seen ? vmsnap_store_list_uploads(ctl, lp, see_held, &h, err)
                        : vmsnap_err_set(err, ENOMEM, "out of memory");
    for (size_t i = 0; rc == 0 && i < s->n; i++)
        if (s->def[i].upload_id && !seen[i])
            rc = vmsnap_err_set(err, EBUSY,
                                "the upload of %s.zstd was aborted meanwhile (another push to the "
                                "same place?): the set there is left as it was; this snapshot is "
                                "NOT stored there",
                                s->files[i].name);
    free(seen);
    free(lp);
    return rc == 0 ? 1 : rc == -EBUSY ? 0 : rc;
}
