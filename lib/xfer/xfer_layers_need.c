/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Which layer of a chain gives which page. Every layer of a chain names the page table of the
 * file as it left it (manifest_layers.c); a delta stored exactly the pages whose hash differs
 * from the table before it, so the page p of the file comes from the newest layer that changed
 * it (or from the full image when none did). A pull decodes only the frames of each layer that
 * hold such pages: in a chain whose deltas rewrite the same pages (a sandbox dirtying the same
 * buffers every cycle) the older deltas give nothing and are not read at all. The tables are
 * small (8 bytes per page, zstd-compressed) and go through the node's object cache like
 * layers, checked against the sha256 the manifest gives.
 */
#include "xfer_int.h"

#include "vmsnap/objcache.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Read a table's bytes from the cache entry `ck` into `buf` (0), or -ENOENT. */
static int from_entry(struct vmsnap_objcache *oc, const char *ck, uint8_t *buf, size_t len)
{
    int fd = -1;
    if (!oc || vmsnap_objcache_get(oc, ck, len, &fd, NULL) < 0)
        return -ENOENT;
    int rc = sys_pread_full(fd, buf, len, 0) == (ssize_t)len ? 0 : -EIO;
    vmsnap_objcache_put(oc, fd);
    return rc;
}

/* One layer's page table: from the node's cache (key "s-<sha256>"; an entry that does not
 * match is dropped), else fetched (and kept). Checked against the manifest's sha256 and the
 * layer's size. -ENOENT: the store has no such object (the caller then decodes every frame). */
static int load_table(struct xfer *x, struct vmsnap_objcache *oc, struct vmsnap_store_conn *c,
                      const struct mf_layer *l, struct vmsnap_pages **out, struct vmsnap_err *err)
{
    char url[URL_BUF], ck[80], hx[65];
    vmsnap_store_url(x->st, l->pages_key, url, sizeof(url));
    snprintf(ck, sizeof(ck), "s-%s", l->pages_sha256);
    size_t len = (size_t)l->pages_size;
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf)
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    int rc = from_entry(oc, ck, buf, len);
    if (rc == 0 && (xfer_sha256_hex(buf, len, hx, NULL) < 0 || strcmp(hx, l->pages_sha256))) {
        vlog(VMSNAP_LOG_WARN, "%s: the node's cached copy is damaged: dropped, fetching it", url);
        vmsnap_objcache_drop(oc, ck, NULL);
        rc = -ENOENT;
    }
    if (rc < 0) {
        rc = vmsnap_store_get(c, l->pages_key, 0, len, buf, err);
        if (rc == 0 && (rc = xfer_sha256_hex(buf, len, hx, err)) == 0 &&
            strcmp(hx, l->pages_sha256))
            rc = vmsnap_err_set(err, EBADMSG, "%s: sha256 %s, the manifest says %s: refusing it",
                                url, hx, l->pages_sha256);
        struct vmsnap_objcache_fill *f = NULL;
        int efd = -1;
        if (rc == 0 && oc && vmsnap_objcache_fill_begin(oc, ck, len, &f, &efd, NULL) == 1) {
            if (sys_pwrite_full(vmsnap_objcache_fill_fd(f), buf, len, 0) == 0)
                vmsnap_objcache_fill_commit(f, NULL);
            else
                vmsnap_objcache_fill_abort(f);
        } else if (efd >= 0) {
            vmsnap_objcache_put(oc, efd);
        }
    }
    if (rc == 0)
        rc = vmsnap_pages_decode(buf, len, url, x->o.max_size, out, err);
    if (rc == 0 && (*out)->size != l->size) {
        rc = vmsnap_err_set(err, EBADMSG,
                            "%s: a table of %llu bytes for a layer of %llu: refusing it", url,
                            (unsigned long long)(*out)->size, (unsigned long long)l->size);
        vmsnap_pages_free(*out);
        *out = NULL;
    }
    free(buf);
    return rc;
}

static uint64_t hash_at(const struct vmsnap_pages *t, uint64_t p)
{
    return p < t->npages ? t->h[p] : 0;
}

void xfer_need_free(struct layer_need *n)
{
    for (size_t i = 0; i < n->n; i++)
        free(n->bits[i]);
    free(n->bits);
    free(n->pages);
    memset(n, 0, sizeof(*n));
}

/* The pages each layer of `f`'s chain gives: 1 when known (every layer names its table), 0
 * when not (a table missing: the pull then decodes every frame), < 0 on an error. The chain is
 * walked newest first with two tables in memory (16 bytes per page) and one bit per page and
 * layer: page p comes from the newest layer i whose table differs from the one before it at p,
 * else from the full image where that has data. */
int xfer_need(struct xfer *x, struct vmsnap_objcache *oc, struct vmsnap_store_conn *c,
              const struct mf_file *f, struct layer_need *n, struct vmsnap_err *err)
{
    memset(n, 0, sizeof(*n));
    if (f->nlayers < 2)
        return 0;
    for (size_t i = 0; i < f->nlayers; i++)
        if (!f->layers[i].pages_key)
            return 0;
    const size_t k = f->nlayers;
    n->bits = calloc(k, sizeof(*n->bits));
    n->pages = calloc(k, sizeof(*n->pages));
    n->n = k;
    n->npages = (f->size + VMSNAP_PAGE_SIZE - 1) / VMSNAP_PAGE_SIZE;
    const size_t words = (size_t)(n->npages / 64 + 1);
    uint64_t *decided = calloc(words, sizeof(uint64_t));
    int rc = decided && n->bits && n->pages ? 0 : vmsnap_err_set(err, ENOMEM, "out of memory");
    for (size_t i = 0; rc == 0 && i < k; i++)
        if (!(n->bits[i] = calloc(words, sizeof(uint64_t))))
            rc = vmsnap_err_set(err, ENOMEM, "out of memory");
    struct vmsnap_pages *newer = NULL, *older = NULL;
    if (rc == 0)
        rc = load_table(x, oc, c, &f->layers[k - 1], &newer, err);
    for (size_t i = k - 1; rc == 0 && i > 0; i--) {
        if ((rc = load_table(x, oc, c, &f->layers[i - 1], &older, err)) < 0)
            break;
        for (uint64_t p = 0; p < n->npages; p++)
            if (!(decided[p / 64] & (1ull << (p % 64))) && hash_at(newer, p) != hash_at(older, p)) {
                decided[p / 64] |= 1ull << (p % 64);
                n->bits[i][p / 64] |= 1ull << (p % 64);
                n->pages[i]++;
            }
        vmsnap_pages_free(newer);
        newer = older; /* the full image's, at the end */
        older = NULL;
    }
    for (uint64_t p = 0; rc == 0 && p < n->npages; p++)
        if (!(decided[p / 64] & (1ull << (p % 64))) && hash_at(newer, p) != 0) {
            n->bits[0][p / 64] |= 1ull << (p % 64);
            n->pages[0]++;
        }
    vmsnap_pages_free(newer);
    vmsnap_pages_free(older);
    free(decided);
    if (rc < 0) {
        xfer_need_free(n);
        if (rc != -ENOENT)
            return rc;
        vlog(VMSNAP_LOG_WARN,
             "%s: a page table of its chain is missing (%s): every frame of every "
             "layer is read",
             f->name, err ? err->msg : "");
        vmsnap_err_clear(err);
        return 0;
    }
    return 1;
}

/* vmsnap_unpack_opts.want_frame over a struct need_ref: does the frame's source range hold a
 * page its layer gives? */
bool xfer_need_frame(void *arg, const struct vmsnap_frame_info *fi)
{
    const struct need_ref *r = arg;
    const uint64_t *b = r->need->bits[r->layer];
    uint64_t p0 = fi->src_start / VMSNAP_PAGE_SIZE;
    uint64_t p1 = (fi->src_end + VMSNAP_PAGE_SIZE - 1) / VMSNAP_PAGE_SIZE;
    if (p1 > r->need->npages)
        p1 = r->need->npages;
    for (uint64_t p = p0; p < p1;) {
        if (p % 64 == 0 && p + 64 <= p1) {
            if (b[p / 64])
                return true;
            p += 64;
            continue;
        }
        if (b[p / 64] & (1ull << (p % 64)))
            return true;
        p++;
    }
    return false;
}
