/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The push of a layered set (formatVersion 3): every file goes to a new object under
 * <set>/vmsnap-objects/<pushId>/, a full image or a delta over the same file of a parent set,
 * with its page table beside it; then the manifest, one PUT, is the commit. Nothing that any
 * manifest names is ever written again, so a push killed at any moment leaves the set that was
 * there (its manifest untouched) and objects no manifest names, which gc removes after its
 * grace period; two pushes to one URL leave the set of the one that committed last.
 */
#include "xfer_int.h"

#include "vmsnap/objcache.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MAX_PRODUCERS 2u

struct lpush {
    struct xfer *x;
    struct vmsnap_store_conn *ctl;
    const char *dir, *prefix, *url;
    char push_id[33];
    char *mkey;
    struct mf_file *files; /* sorted by name */
    size_t *order;         /* largest first */
    size_t n, next;
    struct manifest parent; /* the parent set's manifest (format_version 3), when usable */
    char *parent_key;       /* its key */
    bool have_parent;
    unsigned max_depth, delta_max_pct;
    unsigned deltas; /* files stored as a delta */
    pthread_mutex_t mu;
    int rc;
    struct vmsnap_err err;
    bool put_sent; /* a commit was sent and its outcome is unknown: nothing is undone */
    char **stored; /* keys this push stored (removed again when it fails) */
    size_t nstored, cap;
    struct vmsnap_objcache *oc; /* write_cache: the node's cache its objects go into too */
};

/* "<prefix>/vmsnap-objects/<id>/<name><suffix>" */
static char *layer_object_key(const char *prefix, const char *id, const char *name,
                              const char *suffix)
{
    char *k = NULL;
    if (asprintf(&k, "%s%s" LAYER_DIR "/%s/%s%s", prefix, *prefix ? "/" : "", id, name, suffix) < 0)
        return NULL;
    return k;
}

static void note_stored(struct lpush *p, const char *key)
{
    char *k = strdup(key);
    pthread_mutex_lock(&p->mu);
    if (k && grow_array(&p->stored, &p->cap, p->nstored + 1, sizeof(*p->stored), 8) == 0)
        p->stored[p->nstored++] = k;
    else
        free(k); /* left for gc: no manifest names it */
    pthread_mutex_unlock(&p->mu);
}

static const struct mf_file *parent_file(const struct lpush *p, const char *name)
{
    if (!p->have_parent)
        return NULL;
    for (size_t i = 0; i < p->parent.n; i++)
        if (!strcmp(p->parent.files[i].name, name))
            return &p->parent.files[i];
    return NULL;
}

/* The page table a parent's file left (its "pages" object), fetched whole and checked against
 * the manifest's digest. */
static int fetch_pages(struct lpush *p, struct vmsnap_store_conn *c, const struct mf_file *pf,
                       struct vmsnap_pages **out, struct vmsnap_err *err)
{
    char url[URL_BUF];
    vmsnap_store_url(p->x->st, pf->pages.key, url, sizeof(url));
    size_t len = (size_t)pf->pages.object_size;
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf)
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    int rc = vmsnap_store_get(c, pf->pages.key, 0, len, buf, err);
    char hx[65];
    if (rc == 0)
        rc = xfer_sha256_hex(buf, len, hx, err);
    if (rc == 0) {
        if (strcmp(hx, pf->pages.sha256))
            rc = vmsnap_err_set(err, EINVAL,
                                "%s: sha256 %s does not match the parent's manifest (%s)", url, hx,
                                pf->pages.sha256);
    }
    if (rc == 0)
        rc = vmsnap_pages_decode(buf, len, url, p->x->o.max_size, out, err);
    free(buf);
    return rc;
}

/* A delta when the parent's file is usable (it has a page table, its chain is short enough):
 * sets f->delta_parent (owned by the caller, in *ptab). Whether the delta is worth it is told
 * by its size once encoded (push_one): a pass over the file to count changed pages first cost
 * every suspend a read of the guest's RAM. */
static int choose_layer(struct lpush *p, struct vmsnap_store_conn *c, struct mf_file *f,
                        const struct mf_file *pf, struct vmsnap_pages **ptab,
                        struct vmsnap_err *err)
{
    *ptab = NULL;
    if (!pf || !pf->pages.key)
        return 0;
    if (pf->nlayers + 1 > p->max_depth) {
        vlog(VMSNAP_LOG_INFO, "%s: a full layer (the parent's chain has %zu layers, at most %u)",
             f->name, pf->nlayers, p->max_depth);
        return 0;
    }
    struct vmsnap_err e = {0};
    int rc = fetch_pages(p, c, pf, ptab, &e);
    if (rc < 0) {
        vmsnap_pages_free(*ptab);
        *ptab = NULL;
        if (rc == -ECANCELED || rc == -ENOMEM) {
            if (err)
                *err = e;
            return rc;
        }
        vlog(VMSNAP_LOG_WARN, "%s: a full layer (the parent's page table: %s)", f->name, e.msg);
        return 0;
    }
    f->delta_parent = *ptab;
    return 0;
}

/* A delta larger than delta_max_pct of the chain's full image is not worth its chain (a resume
 * reads both): the file goes again as a full layer, over the same key (no manifest names it
 * yet). 1 when it should. */
static bool delta_too_big(const struct lpush *p, const struct mf_file *f, const struct mf_file *pf)
{
    uint64_t full = pf->layers[0].object_size;
    if (f->object_size * 100 <= full * p->delta_max_pct)
        return false;
    vlog(VMSNAP_LOG_INFO,
         "%s: a full layer (the delta is %llu bytes, over %u%% of the %llu of the "
         "chain's full image)",
         f->name, (unsigned long long)f->object_size, p->delta_max_pct, (unsigned long long)full);
    return true;
}

/* write_cache: the page table into the node's cache (as a pull keeps it: "s-<sha256>"); a
 * failure only costs the next pull a fetch. */
static void keep_table(struct lpush *p, const char *hx, const void *buf, size_t len)
{
    if (!p->oc)
        return;
    char ck[80];
    snprintf(ck, sizeof(ck), "s-%s", hx);
    struct vmsnap_objcache_fill *f = NULL;
    int efd = -1;
    struct vmsnap_err e = {0};
    int rc = vmsnap_objcache_fill_begin(p->oc, ck, len, &f, &efd, &e);
    if (rc == 1) { /* ours to fill (0: the entry is there) */
        rc = sys_pwrite_full(vmsnap_objcache_fill_fd(f), buf, len, 0);
        if (rc < 0) {
            vmsnap_err_set(&e, -rc, "write: %s", strerror(-rc));
            vmsnap_objcache_fill_abort(f);
        } else {
            rc = vmsnap_objcache_fill_commit(f, &e);
        }
    }
    vmsnap_objcache_put(p->oc, efd);
    if (rc < 0)
        vlog(VMSNAP_LOG_WARN, "a page table not kept in the node's cache: %s", e.msg);
}

/* write_cache: a fill for the object push_one is about to encode (f->tee; none when the cache
 * cannot take one: a warning). */
static void tee_begin(struct lpush *p, struct mf_file *f)
{
    f->tee = NULL;
    f->tee_bad = false;
    struct vmsnap_err e = {0};
    if (p->oc && vmsnap_objcache_fill_begin_unnamed(p->oc, &f->tee, &e) < 0)
        vlog(VMSNAP_LOG_WARN, "%s: not kept in the node's cache: %s", f->name, e.msg);
}

/* The object is stored (rc 0): its fill becomes the cache entry "t-<tableSha256>", as a pull
 * would have kept it; else it is dropped. */
static void tee_end(struct mf_file *f, int rc)
{
    if (!f->tee)
        return;
    struct vmsnap_objcache_fill *t = f->tee;
    f->tee = NULL;
    if (rc < 0 || f->tee_bad || !f->table_digest) {
        vmsnap_objcache_fill_abort(t);
        return;
    }
    char ck[80];
    snprintf(ck, sizeof(ck), "t-%s", f->sha256);
    struct vmsnap_err e = {0};
    if (vmsnap_objcache_fill_commit_as(t, ck, f->object_size, &e) < 0)
        vlog(VMSNAP_LOG_WARN, "%s: not kept in the node's cache: %s", f->name, e.msg);
}

/* The file's page table as a ".pages" object beside its image. */
static int put_pages(struct lpush *p, struct vmsnap_store_conn *c, struct mf_file *f,
                     struct vmsnap_err *err)
{
    if (!f->pages_out)
        return 0; /* the encoder gave none: the next push of this file gets a full layer */
    void *buf = NULL;
    size_t len = 0;
    int rc = vmsnap_pages_encode(f->pages_out, &buf, &len, err);
    char hx[65];
    if (rc == 0)
        rc = xfer_sha256_hex(buf, len, hx, err);
    char *key = rc == 0 ? layer_object_key(p->prefix, p->push_id, f->name, PAGES_SUFFIX) : NULL;
    if (rc == 0 && !key)
        rc = vmsnap_err_set(err, ENOMEM, "out of memory");
    if (rc == 0 && (rc = vmsnap_store_put(c, key, buf, len, err)) == 0)
        note_stored(p, key);
    if (rc == 0) {
        f->pages.key = key;
        key = NULL;
        f->pages.object_size = len;
        memcpy(f->pages.sha256, hx, sizeof(hx));
        keep_table(p, hx, buf, len);
    }
    free(key);
    free(buf);
    return rc;
}

/* The chain in the manifest: the parent's layers and this one (a delta), or this one alone. */
static int make_chain(struct mf_file *f, const struct mf_file *pf, const char *key, bool delta,
                      struct vmsnap_err *err)
{
    size_t n = delta ? pf->nlayers + 1 : 1;
    if (!(f->layers = calloc(n, sizeof(*f->layers))))
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    for (size_t j = 0; j + 1 < n; j++) {
        const struct mf_layer *pl = &pf->layers[j];
        f->layers[j] = *pl;
        f->layers[j].pages_key = NULL;
        if (!(f->layers[j].key = strdup(pl->key)))
            return vmsnap_err_set(err, ENOMEM, "out of memory");
        f->nlayers++;
        /* the parent's last layer's table is the parent file's */
        const char *pk = pl->pages_key ? pl->pages_key : j + 2 == n ? pf->pages.key : NULL;
        if (pk) {
            if (!(f->layers[j].pages_key = strdup(pk)))
                return vmsnap_err_set(err, ENOMEM, "out of memory");
            if (!pl->pages_key) {
                f->layers[j].pages_size = pf->pages.object_size;
                memcpy(f->layers[j].pages_sha256, pf->pages.sha256, 65);
            }
        }
    }
    struct mf_layer *l = &f->layers[n - 1];
    if (!(l->key = strdup(key)))
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    f->nlayers++;
    l->object_size = f->object_size;
    l->size = f->size;
    l->populated = f->populated;
    l->delta = delta;
    memcpy(l->sha256, f->sha256, sizeof(l->sha256));
    if (f->pages.key) {
        if (!(l->pages_key = strdup(f->pages.key)))
            return vmsnap_err_set(err, ENOMEM, "out of memory");
        l->pages_size = f->pages.object_size;
        memcpy(l->pages_sha256, f->pages.sha256, sizeof(l->pages_sha256));
    }
    if (delta && f->pages_out) { /* the file's populated bytes, as its pages say */
        uint64_t b = f->pages_out->populated * VMSNAP_PAGE_SIZE;
        f->populated = b < f->size ? b : f->size;
    }
    return 0;
}

static int push_one(struct lpush *p, struct vmsnap_store_conn *c, struct mf_file *f,
                    struct vmsnap_err *err)
{
    char path[4352];
    snprintf(path, sizeof(path), "%s/%s", p->dir, f->name);
    char *key = layer_object_key(p->prefix, p->push_id, f->name, OBJECT_SUFFIX);
    if (!key)
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    int rc = fd < 0 ? err_sys(err, "open %s", path) : 0;
    const struct mf_file *pf = parent_file(p, f->name);
    struct vmsnap_pages *ptab = NULL;
    if (rc == 0)
        rc = choose_layer(p, c, f, pf, &ptab, err);
    bool delta = f->delta_parent != NULL;
    f->want_pages = true;
    if (rc == 0)
        tee_begin(p, f);
    if (rc == 0 && (rc = xfer_push_fd(p->x, c, fd, path, key, NULL, f, NULL, err)) == 0)
        note_stored(p, key);
    if (rc == 0 && delta && delta_too_big(p, f, pf)) {
        f->delta_parent = NULL;
        delta = false;
        vmsnap_pages_free(f->pages_out);
        f->pages_out = NULL;
        tee_end(f, -1); /* the delta's bytes: not the object stored in the end */
        tee_begin(p, f);
        rc = xfer_push_fd(p->x, c, fd, path, key, NULL, f, NULL, err);
    }
    tee_end(f, rc);
    if (rc == 0)
        rc = put_pages(p, c, f, err);
    if (rc == 0)
        rc = make_chain(f, pf, key, delta, err);
    if (rc == 0 && delta) {
        pthread_mutex_lock(&p->mu);
        p->deltas++;
        pthread_mutex_unlock(&p->mu);
    }
    f->delta_parent = NULL;
    vmsnap_pages_free(ptab);
    if (fd >= 0)
        close(fd);
    free(key);
    return rc;
}

static void *producer(void *arg)
{
    struct lpush *p = arg;
    struct vmsnap_store_conn *c = NULL;
    struct vmsnap_err e = {0};
    int rc = vmsnap_store_conn_new(p->x->st, &c, &e);
    for (;;) {
        pthread_mutex_lock(&p->mu);
        if (rc < 0 && p->rc == 0) {
            p->rc = rc;
            p->err = e;
        }
        if (p->rc || p->next >= p->n) {
            pthread_mutex_unlock(&p->mu);
            break;
        }
        struct mf_file *f = &p->files[p->order[p->next++]];
        pthread_mutex_unlock(&p->mu);
        if ((rc = push_one(p, c, f, &e)) < 0)
            vmsnap_err_wrap(&e, "push %s: ", f->name);
    }
    vmsnap_store_conn_free(c);
    return NULL;
}

static int upload_all(struct lpush *p, struct vmsnap_err *err)
{
    pthread_mutex_init(&p->mu, NULL);
    unsigned np = (unsigned)VMSNAP_MIN(p->n, (size_t)MAX_PRODUCERS);
    pthread_t tids[MAX_PRODUCERS];
    unsigned started = 0;
    for (; started < np; started++)
        if (thread_start(&tids[started], producer, p) != 0)
            break;
    if (started == 0)
        producer(p);
    for (unsigned i = 0; i < started; i++)
        pthread_join(tids[i], NULL);
    pthread_mutex_destroy(&p->mu);
    if (p->rc < 0 && err)
        *err = p->err;
    return p->rc;
}

/* The parent (opts.parent) as a key of this store and its manifest. Not usable (missing, not
 * layered, another store): every file gets a full layer, said once. */
static int read_parent(struct lpush *p, struct vmsnap_err *err)
{
    struct xfer *x = p->x;
    const char *purl = x->o.parent;
    if (!purl)
        return 0;
    struct vmsnap_store *pst = NULL;
    char *pkey = NULL;
    struct vmsnap_err e = {0};
    int rc = vmsnap_store_open(purl, &x->o.store, &pst, &pkey, &e);
    if (rc == 0 && !vmsnap_store_same(x->st, pst))
        rc = vmsnap_err_set(&e, EINVAL, "it is not in the store being pushed to");
    vmsnap_store_free(pst);
    char *mkey = rc == 0 ? xfer_join_key(pkey, VMSNAP_XFER_MANIFEST) : NULL;
    char murl[URL_BUF] = "";
    if (rc == 0 && !mkey)
        rc = vmsnap_err_set(&e, ENOMEM, "out of memory");
    if (rc == 0) {
        vmsnap_store_url(x->st, mkey, murl, sizeof(murl));
        rc = xfer_read_manifest(p->ctl, mkey, murl, x->o.max_size, &p->parent, &e);
    }
    if (rc == 0 && p->parent.format_version != 3) {
        manifest_fini(&p->parent);
        rc = vmsnap_err_set(&e, EINVAL, "not a layered set (pushed with --layout reference?)");
    }
    free(mkey);
    if (rc == 0)
        p->parent_key = pkey;
    else
        free(pkey);
    if (rc == -ENOMEM || rc == -ECANCELED) {
        if (err)
            *err = e;
        return rc;
    }
    if (rc < 0) {
        vlog(x->o.parent_implicit ? VMSNAP_LOG_INFO : VMSNAP_LOG_WARN,
             "parent %s is not used (%s): every file gets a full layer", purl, e.msg);
        return 0;
    }
    p->have_parent = true;
    return 0;
}

/* Before anything is stored: every file opens within --max-size, every key fits the store, no
 * single object sits at the set's key. */
static int ready(struct lpush *p, struct vmsnap_err *err)
{
    int rc = xfer_scan_set(p->dir, &p->files, &p->n, err);
    if (rc < 0)
        return rc;
    p->mkey = xfer_join_key(p->prefix, VMSNAP_XFER_MANIFEST);
    p->order = calloc(p->n, sizeof(*p->order));
    if (!p->mkey || !p->order)
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    for (size_t i = 0; i < p->n; i++)
        p->order[i] = i;
    qsort_r(p->order, p->n, sizeof(*p->order), xfer_cmp_size_desc, p->files);
    if ((rc = xfer_new_push_id(p->push_id, err)) < 0)
        return rc;
    for (size_t i = 0; rc == 0 && i < p->n; i++) {
        const struct mf_file *f = &p->files[i];
        if (f->size > p->x->o.max_size)
            return vmsnap_err_set(err, EFBIG,
                                  "%s/%s is %llu bytes, over the cap of %llu (--max-size; raise "
                                  "it for a larger image)",
                                  p->dir, f->name, (unsigned long long)f->size,
                                  (unsigned long long)p->x->o.max_size);
        char *k = layer_object_key(p->prefix, p->push_id, f->name, PAGES_SUFFIX);
        rc = k ? xfer_key_fits(p->x, k, err) : vmsnap_err_set(err, ENOMEM, "out of memory");
        free(k);
    }
    if (rc == 0 && *p->prefix && vmsnap_store_kind(p->x->st) == VMSNAP_STORE_S3) {
        uint64_t sz;
        int h = vmsnap_store_head(p->ctl, p->prefix, &sz, NULL);
        if (h == 0)
            return vmsnap_err_set(err, EEXIST,
                                  "%s holds a single object: a set pushed there would hide it "
                                  "(pull takes the set); remove it first ('vmsnap rm %s') or "
                                  "push elsewhere",
                                  p->url, p->url);
    }
    return rc;
}

/* The layers of the parent that the new manifest names are still there: a parent replaced
 * meanwhile and collected by a gc would leave this set naming objects that are gone. The
 * parent's manifest read again and unchanged (one GET) names them all, so no gc removes them;
 * else every one is looked at (a HEAD each). */
static int parents_there(struct lpush *p, struct vmsnap_err *err)
{
    if (!p->have_parent || !p->deltas)
        return 0;
    char *mkey = xfer_join_key(p->parent_key, VMSNAP_XFER_MANIFEST);
    if (!mkey)
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    int same = xfer_manifest_is(p->x, p->ctl, mkey, p->parent.push_id);
    free(mkey);
    if (same == 1)
        return 0;
    for (size_t i = 0; i < p->n; i++) {
        const struct mf_file *f = &p->files[i];
        for (size_t j = 0; j + 1 < f->nlayers; j++) {
            uint64_t sz = 0;
            int rc = vmsnap_store_head(p->ctl, f->layers[j].key, &sz, err);
            if (rc == 0 && sz != f->layers[j].object_size)
                rc = -ESTALE;
            if (rc == 0 && f->layers[j].pages_key &&
                (rc = vmsnap_store_head(p->ctl, f->layers[j].pages_key, &sz, err)) == 0 &&
                sz != f->layers[j].pages_size)
                rc = -ESTALE;
            if (rc < 0) {
                char u[URL_BUF];
                vmsnap_store_url(p->x->st, f->layers[j].key, u, sizeof(u));
                return vmsnap_err_set(err, rc == -ENOENT || rc == -ESTALE ? ESTALE : -rc,
                                      "%s: the parent's layer %s is gone or changed (the parent "
                                      "was replaced and collected meanwhile?): push again",
                                      f->name, u);
            }
        }
    }
    return 0;
}

/* This push's own objects are still there: one that ran longer than gc's grace period
 * (--older-than, 1 h by default) may have had them collected (they are no manifest's yet). */
static int own_there(struct lpush *p, struct vmsnap_err *err)
{
    for (size_t i = 0; i < p->nstored; i++) {
        uint64_t sz = 0;
        int rc = vmsnap_store_head(p->ctl, p->stored[i], &sz, err);
        if (rc < 0) {
            char u[URL_BUF];
            vmsnap_store_url(p->x->st, p->stored[i], u, sizeof(u));
            return vmsnap_err_set(err, rc == -ENOENT ? ESTALE : -rc,
                                  "%s: this push's object %s is gone before its commit (a gc "
                                  "with a grace period shorter than the push?): push again",
                                  p->url, u);
        }
    }
    return 0;
}

static int commit(struct lpush *p, struct vmsnap_err *err)
{
    struct manifest m = {.files = p->files,
                         .n = p->n,
                         .format_version = 3,
                         .created = (int64_t)time(NULL),
                         .parent = p->deltas ? (char *)p->x->o.parent : NULL};
    memcpy(m.push_id, p->push_id, sizeof(m.push_id));
    char *json = manifest_build_layered(&m);
    if (!json)
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    sys_failpoint("layered-uploaded"); /* every object stored, the manifest not yet */
    int rc = 0;
    if (strlen(json) > VMSNAP_XFER_MANIFEST_MAX) /* a pull (and gc) would refuse it */
        rc = vmsnap_err_set(err, EFBIG,
                            "%s: its manifest would be %zu bytes, over the %u a pull takes (%zu "
                            "files): push fewer files, or a shorter chain (--max-depth)",
                            p->url, strlen(json), VMSNAP_XFER_MANIFEST_MAX, p->n);
    if (rc == 0)
        rc = parents_there(p, err);
    if (rc == 0)
        rc = own_there(p, err);
    if (rc == 0)
        rc = cancel_check(err);
    if (rc == 0) {
        cancel_hold();
        p->put_sent = true;
        rc = vmsnap_store_put(p->ctl, p->mkey, json, strlen(json), err);
        int is = rc < 0 ? xfer_manifest_is(p->x, p->ctl, p->mkey, p->push_id) : 1;
        if (rc < 0 && is == 1) {
            vlog(VMSNAP_LOG_WARN,
                 "%s: the commit's answer was lost, but the manifest there is "
                 "this push's",
                 p->url);
            vmsnap_err_clear(err);
            rc = 0;
        }
        /* not there, and another manifest or none there: this push's objects are nobody's */
        p->put_sent = is < 0;
        if (rc < 0)
            vmsnap_err_wrap(err, "commit %s/%s: ", p->url, VMSNAP_XFER_MANIFEST);
        if (rc < 0 && is < 0)
            vlog(VMSNAP_LOG_WARN,
                 "%s: whether the commit was carried out cannot be told: this push's objects "
                 "stay (a manifest may name them; 'vmsnap gc' removes them if none does)",
                 p->url);
        cancel_release();
    }
    if (rc == 0)
        sys_failpoint("push-committed");
    free(json);
    return rc;
}

/* A failed push: what it stored is nobody's (no manifest names a key of its push id), so it
 * goes without any check; what cannot be removed is gc's. Not once a commit was sent whose
 * outcome is unknown (its manifest may be there, naming them). The first delete that fails
 * (after its retries) ends it: the store is gone or refusing, and trying each object in turn
 * kept a Ctrl-C'd push against a dead or stalled store for minutes (6 attempts of up to 30 s
 * stall each, per object). */
static void undo(struct lpush *p)
{
    if (p->put_sent)
        return;
    size_t left = 0;
    for (size_t i = 0; i < p->nstored && !left; i++)
        if (vmsnap_store_delete(p->ctl, p->stored[i], NULL) < 0)
            left = p->nstored - i;
    if (left)
        vlog(VMSNAP_LOG_WARN,
             "%s: %zu objects of this push could not be removed ('vmsnap gc' "
             "removes them after its grace period)",
             p->url, left);
}

int xfer_push_layered(struct xfer *x, struct vmsnap_store_conn *ctl, const char *dir,
                      const char *prefix, const char *url, struct vmsnap_xfer_stats *stats,
                      struct vmsnap_err *err)
{
    struct lpush p = {.x = x, .ctl = ctl, .dir = dir, .prefix = prefix, .url = url};
    p.max_depth = x->o.max_depth ? x->o.max_depth : VMSNAP_XFER_DEFAULT_MAX_DEPTH;
    if (p.max_depth > MAX_LAYERS)
        p.max_depth = MAX_LAYERS;
    p.delta_max_pct = x->o.delta_max_pct ? x->o.delta_max_pct : VMSNAP_XFER_DEFAULT_DELTA_MAX_PCT;
    int rc = ready(&p, err);
    if (rc == 0 && x->o.write_cache)
        p.oc = xfer_open_cache(x);
    if (rc == 0)
        rc = read_parent(&p, err);
    if (rc == 0)
        rc = upload_all(&p, err);
    if (rc == 0)
        rc = commit(&p, err);
    if (rc < 0)
        undo(&p);
    if (rc == 0 && stats) {
        stats->files = p.n;
        for (size_t i = 0; i < p.n; i++) {
            stats->logical += p.files[i].size;
            stats->populated += p.files[i].populated;
            stats->object_bytes += p.files[i].object_size + p.files[i].pages.object_size;
        }
        stats->deltas = p.deltas;
    }
    for (size_t i = 0; i < p.n; i++)
        vmsnap_pages_free(p.files[i].pages_out);
    struct manifest m = {.files = p.files, .n = p.n};
    manifest_fini(&m);
    manifest_fini(&p.parent);
    free(p.parent_key);
    for (size_t i = 0; i < p.nstored; i++)
        free(p.stored[i]);
    free(p.stored);
    free(p.order);
    free(p.mkey);
    vmsnap_objcache_close(p.oc);
    return rc;
}
