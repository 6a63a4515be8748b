/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The pull of a layered set's files (formatVersion 3): each file's chain of layers into one
 * temporary, newest layer first: a page mask (vmsnap_unpack_opts.under) keeps every page from
 * the newest layer that has it, so each page is written once (oldest first, a chain of 8 wrote
 * the golden's pages and every delta's: 2.3 s against 0.5 s for one layer, bench/layers.sh).
 * Each layer is checked against its digest (tableSha256) and sizes before a byte of it is
 * used. From a remote store the layers
 * go through the node's object cache (include/vmsnap/objcache.h) when one is configured: a
 * layer in it is decoded from there, one missing is fetched once and kept.
 */
#include "xfer_int.h"

#include "vmsnap/objcache.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* What down_open checks a layer against, in the form it takes (a manifest entry). */
static void layer_entry(const struct mf_file *f, const struct mf_layer *l, struct mf_file *out)
{
    memset(out, 0, sizeof(*out));
    out->name = f->name;
    out->detail = true;
    out->size = l->size;
    out->populated = l->populated;
    out->object_size = l->object_size;
    out->table_digest = true;
    memcpy(out->sha256, l->sha256, sizeof(out->sha256));
}

/* One layer from the store: layer 0 into a new temporary beside `dst` (d is the file's own
 * download, which the publish then uses), a later one overlaid onto that temporary. With
 * `fill` the object's bytes are written into that cache entry too. */
static int fetch_layer(struct xfer *x, struct vmsnap_store_conn *ctl, struct down *file,
                       struct down *d, const struct mf_file *le, const char *key, const char *dst,
                       struct vmsnap_objcache_fill *fill, struct vmsnap_pagemask *under,
                       struct need_ref *want, struct vmsnap_err *err)
{
    bool first = d == file;
    d->mf = le;
    if (want) {
        d->want_frame = xfer_need_frame;
        d->want_arg = want;
    }
    d->key = strdup(key);
    if (!d->key)
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    xfer_down_init(d);
    d->x = x;
    d->fill = fill;
    d->fill_fd = fill ? vmsnap_objcache_fill_fd(fill) : 0;
    d->under = under;
    if (!first) {
        d->overlay = true;
        d->ofd = file->af.fd;
        d->oname = file->af.path;
    }
    int rc = xfer_down_open(d, ctl, dst, err);
    if (rc == 0)
        rc = xfer_down_submit(d, err);
    return xfer_down_finish(d, rc, err);
}

/* One layer from a cache entry open at `cfd`: checked as a download is (size, the table's
 * digest, sizes), then decoded in parallel into the file's temporary (created for layer 0). */
static int layer_from_entry(struct xfer *x, int cfd, struct down *file, bool first,
                            const struct mf_file *le, const char *url, const char *dst,
                            struct vmsnap_pagemask *under, struct need_ref *want,
                            struct vmsnap_err *err)
{
    char name[URL_BUF + 32];
    snprintf(name, sizeof(name), "the cached copy of %s", url);
    struct vmsnap_source src;
    vmsnap_source_fd(&src, cfd, le->object_size, name);
    struct vmsnap_image *img = NULL;
    int rc = vmsnap_image_open(&src, x->o.max_size, &img, err);
    if (rc == 0)
        rc = vmsnap_err_set(err, EINVAL, "%s: no seek table", name);
    struct vmsnap_image_stats st = {0};
    char hx[65];
    if (rc > 0)
        rc = xfer_table_sha256(img, hx, err);
    if (rc == 0 && strcmp(hx, le->sha256))
        rc = vmsnap_err_set(err, EINVAL, "%s: tableSha256 %s, the manifest says %s", name, hx,
                            le->sha256);
    if (rc == 0) {
        vmsnap_image_get_stats(img, &st);
        if (st.total_size != le->size || st.populated != le->populated)
            rc = vmsnap_err_set(err, EINVAL, "%s: sizes differ from the manifest's", name);
    }
    if (rc == 0 && first && !file->af_open) {
        if ((rc = sys_atomic_open_tagged(&file->af, dst, 0600, "pull", err)) == 0)
            file->af_open = true;
    }
    if (rc == 0) {
        struct vmsnap_unpack_opts uo = {.threads = x->o.threads,
                                        .max_size = x->o.max_size,
                                        .dst_name = file->af.path,
                                        .under = under,
                                        .want_frame = want ? xfer_need_frame : NULL,
                                        .want_arg = want};
        rc = vmsnap_image_decode_parallel(img, &src, file->af.fd, &uo, &st, err);
    }
    vmsnap_image_free(img);
    return rc;
}

/* Damage, not a failure of the node: the entry is dropped and the layer fetched again. */
static bool corrupt(int rc)
{
    return rc == -EINVAL || rc == -EBADMSG || rc == -EPROTO || rc == -EILSEQ || rc == -EIO;
}

/* A layer through the node's cache: decoded from the entry when there is one, else fetched
 * (once per node: a second pull of the same layer waits for the first's fill), kept, and
 * decoded as it arrives. */
static int cached_layer(struct xfer *x, struct vmsnap_objcache *oc, struct vmsnap_store_conn *ctl,
                        struct down *file, struct down *d, const struct mf_file *le,
                        const char *key, const char *url, const char *dst,
                        struct vmsnap_pagemask *under, struct need_ref *want,
                        struct vmsnap_err *err)
{
    bool first = d == file;
    char ck[80];
    snprintf(ck, sizeof(ck), "t-%s", le->sha256);
    for (int attempt = 0;; attempt++) {
        struct vmsnap_objcache_fill *f = NULL;
        int cfd = -1;
        int rc = vmsnap_objcache_get(oc, ck, le->object_size, &cfd, err);
        if (rc == -ENOENT)
            rc = vmsnap_objcache_fill_begin(oc, ck, le->object_size, &f, &cfd, err);
        if (rc < 0)
            return rc;
        if (f) { /* ours to fill */
            rc = fetch_layer(x, ctl, file, d, le, key, dst, f, under, want, err);
            struct vmsnap_err ce = {0};
            if (rc == 0 && vmsnap_objcache_fill_commit(f, &ce) < 0) /* pulled, only not kept */
                vlog(VMSNAP_LOG_WARN, "%s: not kept in the node's cache: %s", url, ce.msg);
            if (rc == 0)
                return 0;
            vmsnap_objcache_fill_abort(f);
            return rc;
        }
        rc = layer_from_entry(x, cfd, file, first, le, url, dst, under, want, err);
        vmsnap_objcache_put(oc, cfd);
        if (rc == 0) {
            pthread_mutex_lock(&x->mu);
            x->cached_bytes += le->object_size;
            pthread_mutex_unlock(&x->mu);
            d->osize = le->object_size;
            return 0;
        }
        if (!corrupt(rc) || attempt > 0)
            return rc;
        vlog(VMSNAP_LOG_WARN, "%s: the node's cached copy is damaged (%s): dropped, fetching it",
             url, err ? err->msg : "");
        vmsnap_err_clear(err);
        vmsnap_objcache_drop(oc, ck, NULL);
        if (first && file->af_open) { /* the fetch makes its own temporary */
            sys_atomic_abort(&file->af);
            file->af_open = false;
            /* and the pages the damaged attempt marked are in it no more */
            if (under)
                memset(under->bits, 0, (size_t)(under->npages / 64 + 1) * sizeof(uint64_t));
        }
    }
}

/* After layer `l` (read or skipped), newest first: the pages past its end were holes in the
 * file as it left it, so no older layer gives them (a file that shrank, then grew again:
 * the older data must not come back in the grown part). */
static void mark_past_end(struct vmsnap_pagemask *m, const struct mf_layer *l)
{
    uint64_t p = (l->size + VMSNAP_PAGE_SIZE - 1) / VMSNAP_PAGE_SIZE;
    for (; p < m->npages; p++) {
        if (p % 64 == 0 && p + 64 <= m->npages) {
            m->bits[p / 64] = ~0ull;
            p += 63;
            continue;
        }
        m->bits[p / 64] |= 1ull << (p % 64);
    }
}

static int pull_file(struct xfer *x, struct vmsnap_objcache *oc, struct vmsnap_store_conn *ctl,
                     const struct mf_file *f, const char *dir, struct down *file,
                     struct vmsnap_err *err)
{
    char dst[4352];
    snprintf(dst, sizeof(dst), "%s/%s", dir, f->name);
    uint64_t osize = 0;
    struct vmsnap_pagemask *under = NULL;
    int rc = f->nlayers > 1 ? vmsnap_pagemask_new(f->size, &under, err) : 0;
    struct layer_need need = {0};
    int known = rc == 0 ? xfer_need(x, oc, ctl, f, &need, err) : 0;
    if (known < 0)
        rc = known;
    file->x = x; /* started: the caller frees it */
    for (size_t n = 0; rc == 0 && n < f->nlayers; n++) {
        size_t j = f->nlayers - 1 - n; /* newest first */
        if (known == 1 && n > 0 && need.pages[j] == 0) {
            mark_past_end(under, &f->layers[j]);
            continue; /* newer layers replaced every page it had: not read at all */
        }
        struct need_ref ref = {&need, j}, *want = known == 1 ? &ref : NULL;
        struct mf_file le;
        layer_entry(f, &f->layers[j], &le);
        struct down over = {0}, *d = n == 0 ? file : &over;
        char url[URL_BUF];
        vmsnap_store_url(x->st, f->layers[j].key, url, sizeof(url));
        rc = oc ? cached_layer(x, oc, ctl, file, d, &le, f->layers[j].key, url, dst, under, want,
                               err)
                : fetch_layer(x, ctl, file, d, &le, f->layers[j].key, dst, NULL, under, want, err);
        if (rc < 0 && err)
            vmsnap_err_wrap(err, "%s, layer %zu of %zu: ", f->name, j + 1, f->nlayers);
        osize += d->osize;
        if (rc == 0 && under)
            mark_past_end(under, &f->layers[j]);
        if (d != file)
            xfer_down_free(d, false);
        else
            file->mf = NULL; /* `le` is gone; the publish reads only af and stats */
    }
    if (rc == 0 && under && ftruncate(file->af.fd, (off_t)f->size) < 0)
        rc = err_sys(err, "set size of %s to %llu", file->af.path, (unsigned long long)f->size);
    vmsnap_pagemask_free(under);
    xfer_need_free(&need);
    if (rc == 0) {
        file->stats.total_size = f->size;
        file->stats.populated = f->populated;
        file->osize = osize;
    }
    return rc;
}

/* The node's cache, for a remote store: a cache that cannot be opened is a warning. */
struct vmsnap_objcache *xfer_open_cache(const struct xfer *x)
{
    if (x->o.no_cache || vmsnap_store_kind(x->st) != VMSNAP_STORE_S3)
        return NULL;
    struct vmsnap_objcache_opts co = {.dir = x->o.cache_dir, .max_bytes = x->o.cache_size};
    struct vmsnap_objcache *oc = NULL;
    struct vmsnap_err e = {0};
    if (vmsnap_objcache_open(&co, &oc, &e) < 0) {
        vlog(VMSNAP_LOG_WARN, "the node's object cache is not used: %s", e.msg);
        return NULL;
    }
    return oc;
}

int xfer_pull_layered(struct xfer *x, struct vmsnap_store_conn *ctl, const struct manifest *m,
                      const char *dir, struct down *ds, struct vmsnap_err *err)
{
    struct vmsnap_objcache *oc = xfer_open_cache(x);
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < m->n; i++)
        rc = pull_file(x, oc, ctl, &m->files[i], dir, &ds[i], err);
    vmsnap_objcache_close(oc);
    return rc;
}
