/* SPDX-License-Identifier: Apache-2.0 */
/*
 * vmsnap_xfer_list: the sets under a prefix, and the key collector ls, gc and rm share.
 */
#include "xfer_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int xfer_collect(void *arg, const char *key, uint64_t size, int64_t mtime)
{
    (void)size;
    (void)mtime;
    struct keys *k = arg;
    size_t kl = strlen(key), sl = strlen(k->suffix);
    if (kl < sl || strcmp(key + kl - sl, k->suffix))
        return 0;
    if (k->whole_name && kl > sl && key[kl - sl - 1] != '/')
        return 0; /* "xmanifest.json" is not a manifest */
    if (k->direct && strchr(key + strlen(k->direct), '/'))
        return 0;
    if (k->n >= 1000000)
        return -E2BIG;
    if (grow_array(&k->v, &k->cap, k->n + 1, sizeof(*k->v), 16) < 0)
        return -ENOMEM;
    k->v[k->n] = strdup(key);
    if (!k->v[k->n])
        return -ENOMEM;
    k->n++;
    return 0;
}

void xfer_keys_free(struct keys *k)
{
    for (size_t i = 0; i < k->n; i++)
        free(k->v[i]);
    free(k->v);
}

int vmsnap_xfer_list(const char *url, const struct vmsnap_xfer_opts *opts, vmsnap_xfer_list_fn fn,
                     void *arg, struct vmsnap_err *err)
{
    struct xfer x;
    int rc = xfer_open(&x, url, opts, XFER_PREFIX, err);
    if (rc < 0)
        return rc;
    struct keys k = {.suffix = VMSNAP_XFER_MANIFEST, .whole_name = true};
    char *lp = xfer_join_key(x.key, "");
    if (!lp)
        rc = vmsnap_err_set(err, ENOMEM, "out of memory");
    if (rc == 0)
        rc = xfer_conn(&x, err);
    struct vmsnap_store_conn *c = x.ctl;
    if (rc == 0) {
        rc = vmsnap_store_list(c, lp, xfer_collect, &k, err);
        if (rc < 0 && (!err || !err->code))
            rc = err_code(err, -rc, "list %s", url);
    }
    for (size_t i = 0; i < k.n && rc == 0; i++) {
        char murl[URL_BUF], surl[URL_BUF];
        vmsnap_store_url(x.st, k.v[i], murl, sizeof(murl));
        snprintf(surl, sizeof(surl), "%.*s", (int)(strlen(murl) - strlen(VMSNAP_XFER_MANIFEST) - 1),
                 murl);
        if (vmsnap_store_kind(x.st) == VMSNAP_STORE_LOCAL && !strncmp(surl, "//", 2))
            memmove(surl, surl + 1, strlen(surl));
        struct manifest m = {0};
        struct vmsnap_err me = {0};
        struct vmsnap_xfer_set set = {.url = surl};
        if (xfer_read_manifest(c, k.v[i], murl, x.o.max_size, &m, &me) == 0) {
            set.valid = true;
            set.files = m.n;
            for (size_t j = 0; j < m.n; j++) {
                set.logical += m.files[j].size;
                set.object_bytes += m.files[j].object_size;
            }
        } else {
            vlog(VMSNAP_LOG_WARN, "%s", me.msg);
        }
        manifest_fini(&m);
        rc = fn(arg, &set);
    }
    if (rc == 0 && vmsnap_store_conn_list_skipped(c))
        rc = vmsnap_err_set(err, EACCES,
                            "%s: some directories under it could not be read (skipped: see the "
                            "warnings above); the list is incomplete",
                            url);
    xfer_keys_free(&k);
    free(lp);
    xfer_close(&x);
    return rc;
}
