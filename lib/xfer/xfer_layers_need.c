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

/* The SHA-256 of a buffer, in hex. */
static int sha256_hex(const void *buf, size_t len, char hex[65], struct vmsnap_err *err)
{
    EVP_MD_CTX *c = EVP_MD_CTX_new();
    unsigned char md[32];
    unsigned mdl = 0;
    bool ok = c && EVP_DigestInit_ex(c, EVP_sha256(), NULL) && EVP_DigestUpdate(c, buf, len) &&
              EVP_DigestFinal_ex(c, md, &mdl);
    EVP_MD_CTX_free(c);
    if (!ok)
        return vmsnap_err_set(err, ENOMEM, "sha256");
    xfer_hex32(md, hex);
    return 0;
}

/* One layer's page table: from the cache (key "s-<sha256>"), else fetched (and kept). */
static int load_table(struct xfer *x, struct vmsnap_objcache *oc, struct vmsnap_store_conn *c,
                      const struct mf_layer *l, struct vmsnap_pages **out, struct vmsnap_err *err)
{
    char url[URL_BUF], ck[80];
    vmsnap_store_url(x->st, l->pages_key, url, sizeof(url));
    snprintf(ck, sizeof(ck), "s-%s", l->pages_sha256);
    size_t len = (size_t)l->pages_size;
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf)
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    int fd = -1, rc = -ENOENT;
    struct vmsnap_objcache_fill *f = NULL;
    if (oc && (rc = vmsnap_objcache_get(oc, ck, len, &fd, NULL)) == -ENOENT &&
        vmsnap_objcache_fill_begin(oc, ck, len, &f, &fd, NULL) < 0)
        f = NULL;
    if (fd >= 0 && !f) { /* an entry */
        rc = sys_pread_full(fd, buf, len, 0) == (ssize_t)len ? 0 : -EIO;
        vmsnap_objcache_put(oc, fd);
    }
    if (rc < 0 || f) {
        rc = vmsnap_store_get(c, l->pages_key, 0, len, buf, err);
        if (rc == -ENOENT)
            rc = vmsnap_err_set(err, ENOENT,
                                "the manifest names the page table %s, which is "
                                "missing",
                                url);
    }
    char hx[65];
    if (rc == 0 && (rc = sha256_hex(buf, len, hx, err)) == 0 && strcmp(hx, l->pages_sha256))
        rc = vmsnap_err_set(err, EBADMSG, "%s: sha256 %s, the manifest says %s: refusing it", url,
                            hx, l->pages_sha256);
    if (f) {
        int wr = rc == 0 ? sys_pwrite_full(vmsnap_objcache_fill_fd(f), buf, len, 0) : -1;
        if (wr == 0)
            vmsnap_objcache_fill_commit(f, NULL);
        else
            vmsnap_objcache_fill_abort(f);
    }
    if (rc == 0)
        rc = vmsnap_pages_decode(buf, len, url, x->o.max_size, out, err);
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
 * when not (the pull then decodes every frame), < 0 on an error. */
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
    struct vmsnap_pages **t = calloc(k, sizeof(*t));
    n->bits = calloc(k, sizeof(*n->bits));
    n->pages = calloc(k, sizeof(*n->pages));
    n->n = k;
    n->npages = (f->size + VMSNAP_PAGE_SIZE - 1) / VMSNAP_PAGE_SIZE;
    const size_t words = (size_t)(n->npages / 64 + 1);
    int rc = t && n->bits && n->pages ? 0 : vmsnap_err_set(err, ENOMEM, "out of memory");
    for (size_t i = 0; rc == 0 && i < k; i++) {
        if (!(n->bits[i] = calloc(words, sizeof(uint64_t))))
            rc = vmsnap_err_set(err, ENOMEM, "out of memory");
        else
            rc = load_table(x, oc, c, &f->layers[i], &t[i], err);
    }
    for (uint64_t p = 0; rc == 0 && p < n->npages; p++) {
        size_t from = 0; /* the newest layer that changed p, else the full image */
        for (size_t i = k - 1; i > 0; i--)
            if (hash_at(t[i], p) != hash_at(t[i - 1], p)) {
                from = i;
                break;
            }
        if (from == 0 && hash_at(t[0], p) == 0)
            continue; /* a hole in the full image no delta changed */
        n->bits[from][p / 64] |= 1ull << (p % 64);
        n->pages[from]++;
    }
    for (size_t i = 0; t && i < k; i++)
        vmsnap_pages_free(t[i]);
    free(t);
    if (rc < 0) {
        xfer_need_free(n);
        return rc;
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
