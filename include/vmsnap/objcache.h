/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The node-local object cache: immutable objects fetched from a remote store (named by their
 * digest) kept in a bounded directory, so that resumes from one golden snapshot download it
 * once. docs/objcache.md has the layout, the locking and the reasons.
 *
 * - Entries are files `<dir>/objects/<key>`, read-only (0400); a fill writes a temporary under
 *   `<dir>/tmp/` and publishes it by rename, so a killed fill never becomes an entry (its
 *   temporary is swept by the next vmsnap_objcache_open()).
 * - A fill holds the key's lock (flock on `<dir>/locks/<key>`); a second fill of the key, in
 *   another process or thread, waits for it and then reads the entry. A lock of a dead process
 *   is free.
 * - LRU: each entry's modification time is its last use (set explicitly on every hit and at
 *   publication; atime and mount options play no part). Eviction unlinks: a reader holding an
 *   entry's descriptor keeps reading it.
 * - Page-cache hygiene (docs/pcache.md): a committed fill is written out and dropped from the
 *   page cache; vmsnap_objcache_put() drops what a reader read.
 * - The cache checks an entry's size; its content is the caller's to verify (the codec's
 *   checksums), and a corrupt one is removed with vmsnap_objcache_drop().
 *
 * Thread safety: a handle may be used by several threads at once. A fill's file may be written
 * by several threads (pwrite); its commit or abort is called once, after those writes.
 */
#ifndef VMSNAP_OBJCACHE_H
#define VMSNAP_OBJCACHE_H

#include "vmsnap/common.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Longest key, in bytes. */
#define VMSNAP_OBJCACHE_KEY_MAX 100
/* The default cap: 8 GiB. */
#define VMSNAP_OBJCACHE_DEFAULT_CAP (8ull << 30)

struct vmsnap_objcache;

struct vmsnap_objcache_opts {
    /* NULL: $VMSNAP_CACHE_DIR, else /var/cache/vmsnap when root, else $XDG_CACHE_HOME/vmsnap
     * or ~/.cache/vmsnap */
    const char *dir;
    /* byte cap; 0: $VMSNAP_CACHE_SIZE (a size like 8G, 512M, 1.5T), else 8 GiB */
    uint64_t max_bytes;
};

/* Open the cache at o->dir (`o` may be NULL: all defaults). Creates the directory (0700, and
 * missing parents 0700) if missing and its `objects`, `tmp`, `locks` subdirectories, then
 * sweeps the temporaries of dead fills and free lock files. Refuses (-EPERM) a directory not
 * owned by the effective user or writable by group or others, and (-ELOOP) one that is a
 * symbolic link (its last component; trailing slashes included): another user could plant or
 * swap entries, hold its locks, or redirect where a privileged process creates and removes
 * files. -EINVAL for a bad $VMSNAP_CACHE_SIZE. Free with vmsnap_objcache_close(). */
VMSNAP_API int vmsnap_objcache_open(const struct vmsnap_objcache_opts *o,
                                    struct vmsnap_objcache **out, struct vmsnap_err *err);
/* Close the handle (NULL accepted). Fills still open must be committed or aborted first. */
VMSNAP_API void vmsnap_objcache_close(struct vmsnap_objcache *c);
/* The directory in use (as given or resolved), for messages. */
VMSNAP_API const char *vmsnap_objcache_dir(const struct vmsnap_objcache *c);

/* Keys: [a-z0-9-], 1..VMSNAP_OBJCACHE_KEY_MAX bytes (e.g. "t-<64 hex digits>"); anything else
 * is -EINVAL. `size` is the object's size in bytes: an entry of another size is a miss (and is
 * removed). */

/* A hit: *fd open read-only on the entry, its last use set to now (LRU): returns 0. A miss:
 * -ENOENT (err says so). Other failures: -errno. Give the descriptor back with
 * vmsnap_objcache_put(). */
VMSNAP_API int vmsnap_objcache_get(struct vmsnap_objcache *c, const char *key, uint64_t size,
                                   int *fd, struct vmsnap_err *err);
/* After reading a hit (or the entry vmsnap_objcache_fill_begin() returned): drop the file's
 * pages from the page cache and close `fd` (-1 accepted). */
VMSNAP_API void vmsnap_objcache_put(struct vmsnap_objcache *c, int fd);

struct vmsnap_objcache_fill;
/* The miss path: lock the key, waiting while another process or thread fills it (polled, at
 * most 50 ms apart; a lock held by a process that died is free; -ECANCELED once
 * vmsnap_cancel() is called). Then either the entry exists now: returns 0 with *fd as
 * vmsnap_objcache_get() gives it (*f NULL); or returns 1 with *f, a fill holding the key's lock
 * whose file (vmsnap_objcache_fill_fd(): read-write, already `size` bytes long, sparse) the
 * caller writes with pwrite at any offsets, then commits or aborts (*fd -1). */
VMSNAP_API int vmsnap_objcache_fill_begin(struct vmsnap_objcache *c, const char *key, uint64_t size,
                                          struct vmsnap_objcache_fill **f, int *fd,
                                          struct vmsnap_err *err);
/* The fill's file descriptor (owned by the fill: do not close it). */
VMSNAP_API int vmsnap_objcache_fill_fd(const struct vmsnap_objcache_fill *f);
/* Optional, after writing [off, off + len) (len 0: to the end): start writing that range out,
 * and wait for the range handed in the call before (by this or another thread) to be written
 * and drop it from the page cache; so a large fill's dirty pages stay bounded by what is in
 * flight (as the local store does with parts) without the writer stalling on what it just
 * wrote. The commit writes out and drops the rest. Returns 0 or -errno. */
VMSNAP_API int vmsnap_objcache_fill_written(struct vmsnap_objcache_fill *f, uint64_t off,
                                            uint64_t len, struct vmsnap_err *err);
/* The content is complete and verified by the caller: make it durable (fsync), drop it from
 * the page cache, publish it under its key (rename; mode 0400, last use now), release the lock,
 * then evict least recently used entries until the cache is within its cap (never the one just
 * filled; an eviction failure is logged, not returned). A file grown past `size` is refused
 * (-EINVAL). Frees `f` whatever the result; on failure nothing is published. */
VMSNAP_API int vmsnap_objcache_fill_commit(struct vmsnap_objcache_fill *f, struct vmsnap_err *err);
/* A fill whose key and size are known only once it is written (an object a push is encoding,
 * named by its digest at the end): a temporary (empty, growing as written), no lock held
 * while it is written. Write it with pwrite (and vmsnap_objcache_fill_written()), then commit
 * it with vmsnap_objcache_fill_commit_as() or abort it. Returns 0 with *f, or -errno. */
VMSNAP_API int vmsnap_objcache_fill_begin_unnamed(struct vmsnap_objcache *c,
                                                  struct vmsnap_objcache_fill **f,
                                                  struct vmsnap_err *err);
/* Name an unnamed fill `key` and commit it (as vmsnap_objcache_fill_commit(); the file must be
 * `size` bytes). The key's lock is only tried: when another fill holds it, or the entry is
 * there already, ours is dropped and 0 returned (the entry is, or is about to be, there).
 * Returns 1 when this fill became the entry, 0 as said, -errno on a failure (nothing
 * published). Frees `f` whatever the result. */
VMSNAP_API int vmsnap_objcache_fill_commit_as(struct vmsnap_objcache_fill *f, const char *key,
                                              uint64_t size, struct vmsnap_err *err);
/* Give up: remove the temporary, release the lock, free `f` (NULL accepted). */
VMSNAP_API void vmsnap_objcache_fill_abort(struct vmsnap_objcache_fill *f);

/* Remove an entry (found corrupt by its reader; readers holding it keep their descriptor).
 * Returns 0, also when there was none. */
VMSNAP_API int vmsnap_objcache_drop(struct vmsnap_objcache *c, const char *key,
                                    struct vmsnap_err *err);

struct vmsnap_objcache_entry {
    const char *key;        /* valid during the callback only */
    uint64_t size;          /* bytes */
    int64_t last_used;      /* Unix time, seconds */
    int32_t last_used_nsec; /* and nanoseconds */
};
/* Call `fn` for every entry, in directory order (not sorted: memory stays bounded). A negative
 * return of `fn` stops the listing and is returned. Files in objects/ whose names are not keys
 * are not entries (skipped). */
VMSNAP_API int vmsnap_objcache_list(struct vmsnap_objcache *c,
                                    int (*fn)(void *arg, const struct vmsnap_objcache_entry *e),
                                    void *arg, struct vmsnap_err *err);
/* Evict least recently used entries until at most `max_bytes` are held (0 empties the cache);
 * counts in *evicted / *freed (each may be NULL). An entry whose key is locked at that moment (a
 * fill or another eviction of it) is skipped. */
VMSNAP_API int vmsnap_objcache_trim(struct vmsnap_objcache *c, uint64_t max_bytes,
                                    uint64_t *evicted, uint64_t *freed, struct vmsnap_err *err);
/* Entries, bytes held (the sum of their sizes), cap (each may be NULL). One scan of objects/. */
VMSNAP_API int vmsnap_objcache_stat(struct vmsnap_objcache *c, uint64_t *entries, uint64_t *bytes,
                                    uint64_t *cap, struct vmsnap_err *err);

#ifdef __cplusplus
}
#endif
#endif
