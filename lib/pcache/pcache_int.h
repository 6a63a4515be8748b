/* SPDX-License-Identifier: Apache-2.0 */
/* Page-cache hygiene internals shared by lib/pcache.c and lib/pcache_retry.c. */
#ifndef VMSNAP_PCACHE_INT_H
#define VMSNAP_PCACHE_INT_H

#include "vmsnap/pcache.h"
#include "util/util.h"

#include <sys/stat.h>

/* cachestat(2) over [off, off + len) (len 0: to the end of the file) into the counters of `st`
 * (files/size/pages/page_size are left alone). Returns 0 or -errno. The first failure of the
 * process is logged; ENOSYS and EPERM also mark cachestat unavailable for the rest of it, after
 * which this returns -ENOSYS without calling the kernel. */
int pcache_cachestat(int fd, uint64_t off, uint64_t len, struct vmsnap_pcache_stat *st);

/* The preserve treatment of the regular file open at `fd` (`size` bytes): drop the clean pages of
 * every chunk holding no dirty or writeback page, never touching a dirty chunk. Sets *dropped to
 * the pages that left the cache and *dirty to the dirty + writeback pages left. Returns 0, or
 * -errno when cachestat is unavailable or failed (nothing done) or fadvise failed. */
int pcache_drop_clean(int fd, uint64_t size, uint64_t *dropped, uint64_t *dirty);

/* Queue `path` (identity from `st`: device, inode, size, mtime) for retries. Returns 0,
 * -ENOSPC when the queue is full, -ENOMEM. */
int pcache_retrier_add(struct vmsnap_pcache_retrier *r, const char *path, const struct stat *st);

/* Whether `a` and `b` are the same file with the same size and mtime. */
static inline bool pcache_same_file(const struct stat *a, const struct stat *b)
{
    return a->st_dev == b->st_dev && a->st_ino == b->st_ino && a->st_size == b->st_size &&
           a->st_mtim.tv_sec == b->st_mtim.tv_sec && a->st_mtim.tv_nsec == b->st_mtim.tv_nsec;
}

/* Forget the cachestat probe and the log-once flags (tests only). */
void pcache_reset_probe(void);

/* Make walks behave as on a kernel whose statx gives no mount id, finding bind mounts through
 * /proc/self/mountinfo instead (tests only). */
void pcache_force_mountinfo(bool on);

#endif
