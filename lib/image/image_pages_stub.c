/* SPDX-License-Identifier: Apache-2.0 */
/* TEMPORARY: stand-ins for the page-table API until lib/image/image_pages.c lands. */
#include "vmsnap/image.h"

#include <errno.h>
#include <stdlib.h>

int vmsnap_pages_hash_fd(int fd, const char *name, unsigned threads, bool keep_cache,
                         struct vmsnap_pages **out, struct vmsnap_err *err)
{
    (void)fd, (void)threads, (void)keep_cache;
    *out = NULL;
    return vmsnap_err_set(err, ENOSYS, "%s: page tables not built yet", name);
}
void vmsnap_pages_free(struct vmsnap_pages *p)
{
    if (p)
        free(p->h);
    free(p);
}
uint64_t vmsnap_pages_diff(const struct vmsnap_pages *parent, const struct vmsnap_pages *cur,
                           uint64_t *holes)
{
    (void)parent, (void)cur;
    if (holes)
        *holes = 0;
    return 0;
}
int vmsnap_pages_encode(const struct vmsnap_pages *p, void **buf, size_t *len,
                        struct vmsnap_err *err)
{
    (void)p, (void)buf, (void)len;
    return vmsnap_err_set(err, ENOSYS, "page tables not built yet");
}
int vmsnap_pages_decode(const void *buf, size_t len, const char *where, uint64_t max_size,
                        struct vmsnap_pages **out, struct vmsnap_err *err)
{
    (void)buf, (void)len, (void)max_size;
    *out = NULL;
    return vmsnap_err_set(err, ENOSYS, "%s: page tables not built yet", where);
}
void vmsnap_frame_decoder_set_overlay(struct vmsnap_frame_decoder *dec, bool overlay)
{
    (void)dec, (void)overlay;
}
