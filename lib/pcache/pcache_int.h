/* SPDX-License-Identifier: Apache-2.0 */
/* The page-cache module's private header. Its files use each other one way only:
 * pcache_walk.c (the tree walk) <- pcache_stat.c (cachestat, stat) <- pcache_retry.c (the
 * background retrier) <- pcache_evict.c (preserve, staged eviction, release). */
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

/* Whether `a` and `b` are the same inode. */
static inline bool pcache_same_inode(const struct stat *a, const struct stat *b)
{
    return a->st_dev == b->st_dev && a->st_ino == b->st_ino;
}

/* ---- walking trees (pcache_walk.c) ---- */

struct devino {
    dev_t dev;
    ino_t ino;
};

struct preserve_set {
    struct devino *v;
    char **path; /* as given (joined to `base`), resolved again before a removal */
    size_t n;
};

/* Resolve the preserved paths (`base`/name when base is not NULL) to device+inode pairs;
 * pcache_preserve_fini frees them. */
int pcache_preserve_init(struct preserve_set *ps, const char *base, const char *const *paths,
                         struct vmsnap_err *err);
void pcache_preserve_fini(struct preserve_set *ps);
/* Whether the file `sb` (in the directory `dfd`) is, right now, at a preserved path or under one
 * (the paths are resolved again: a checkpoint writer may have renamed a new file onto one). */
bool pcache_preserved_now(const struct preserve_set *ps, int dfd, const struct stat *sb);

struct walk;
/* A regular file `name` in the directory `dfd` (w->path names it); `sb` from fstatat. A negative
 * return stops the walk. */
typedef int (*walk_file_fn)(struct walk *w, int dfd, const char *name, const struct stat *sb,
                            bool preserved);
/* After a directory's entries (its descriptor closed): `pfd` and `name` locate it (pfd -1 and the
 * path as given for the root). */
typedef void (*walk_dir_fn)(struct walk *w, int pfd, const char *name, const struct stat *sb,
                            bool preserved);

struct walk {
    const char *op;     /* "stat", "evict", "release": the first word of messages */
    bool follow_root;   /* a symlink given as the root is followed (never for staged walks) */
    bool strict_mounts; /* staged: without any way to tell mounts apart, enter no subdirectory */
    bool dir_only;      /* the root must be a directory (release) */
    const struct preserve_set *ps; /* may be NULL */
    walk_file_fn file;
    walk_dir_fn dir_done; /* may be NULL */
    void *arg;
    int first;
    struct vmsnap_err *err;
    uint64_t skipped_mounts;
    bool stopped;
    /* the root's mount */
    dev_t root_dev;
    uint64_t root_mnt;
    enum { MNT_DEV_ONLY, MNT_ID, MNT_MOUNTINFO } mnt_mode; /* how mounts are told apart */
    struct devino *mpoints;
    size_t nmpoints;
    /* the current path, for messages and the retrier */
    char *path;
    size_t len, cap;
};

/* Walk `path`: a directory, or a regular file, calling w->file for every regular file (and
 * w->dir_done after each directory). Returns the first failure (later ones are logged). */
int pcache_walk_root(struct walk *w, const char *path);
void pcache_walk_fini(struct walk *w);
/* Record a per-file failure ("OP PATH: WHATstrerror"): the first goes to `err` and is returned
 * at the end of the walk, later ones are logged. */
void pcache_note_err(int *first, struct vmsnap_err *err, int code, const char *op, const char *path,
                     const char *what);
/* Open `name` in the directory `dfd`, never following a symlink and never blocking. */
int pcache_open_at(int dfd, const char *name, int flags);

/* Forget the cachestat probe and the log-once flags (tests only). pcache_cachestat_reset is
 * pcache_stat.c's part of it. */
void pcache_reset_probe(void);
void pcache_cachestat_reset(void);

/* Make walks behave as on a kernel whose statx gives no mount id, finding bind mounts through
 * /proc/self/mountinfo instead (tests only). */
void pcache_force_mountinfo(bool on);

#endif
