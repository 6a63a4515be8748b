/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The pull of a layered set's files (formatVersion 3): each file's chain of layers, oldest
 * first, into one temporary: the full image decoded as any object, every delta after it
 * overlaid (its pages written, its zero pages punched). Each layer is checked against its
 * digest (tableSha256) and sizes before a byte of it is used. From a remote store the layers
 * go through the node's object cache (include/vmsnap/objcache.h) when one is configured: a
 * layer in it is decoded from there, one missing is fetched once and kept.
 */
#include "xfer_int.h"

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
 * download, which the publish then uses), a later one overlaid onto that temporary. */
static int fetch_layer(struct xfer *x, struct vmsnap_store_conn *ctl, struct down *file,
                       struct down *d, const struct mf_file *le, const char *key, const char *dst,
                       struct vmsnap_err *err)
{
    bool first = d == file;
    d->mf = le;
    d->key = strdup(key);
    if (!d->key)
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    xfer_down_init(d);
    d->x = x;
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

static int pull_file(struct xfer *x, struct vmsnap_store_conn *ctl, const struct mf_file *f,
                     const char *dir, struct down *file, struct vmsnap_err *err)
{
    char dst[4352];
    snprintf(dst, sizeof(dst), "%s/%s", dir, f->name);
    uint64_t osize = 0;
    int rc = 0;
    for (size_t j = 0; rc == 0 && j < f->nlayers; j++) {
        struct mf_file le;
        layer_entry(f, &f->layers[j], &le);
        struct down over = {0}, *d = j == 0 ? file : &over;
        rc = fetch_layer(x, ctl, file, d, &le, f->layers[j].key, dst, err);
        if (rc < 0 && err)
            vmsnap_err_wrap(err, "%s, layer %zu of %zu: ", f->name, j + 1, f->nlayers);
        osize += d->osize;
        if (d != file)
            xfer_down_free(d, false);
        else
            file->mf = NULL; /* `le` is gone; the publish reads only af and stats */
    }
    if (rc == 0) {
        file->stats.total_size = f->size;
        file->stats.populated = f->populated;
        file->osize = osize;
    }
    return rc;
}

int xfer_pull_layered(struct xfer *x, struct vmsnap_store_conn *ctl, const struct manifest *m,
                      const char *dir, struct down *ds, struct vmsnap_err *err)
{
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < m->n; i++)
        rc = pull_file(x, ctl, &m->files[i], dir, &ds[i], err);
    return rc;
}
