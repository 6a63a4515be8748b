/* SPDX-License-Identifier: Apache-2.0 */
/* The object cache's private header. Its files use each other one way only: objcache.c (open,
 * keys, key locks, the sweep) <- objcache_evict.c (scans, list, stat, LRU eviction) <-
 * objcache_fill.c (get, put, fills, drop). */
#ifndef VMSNAP_OBJCACHE_INT_H
#define VMSNAP_OBJCACHE_INT_H

#include "vmsnap/objcache.h"
#include "util/util.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>

struct vmsnap_objcache {
    char *dir; /* as given or resolved (messages) */
    int dfd;   /* the cache directory */
    int ofd;   /* objects/: the entries */
    int tfd;   /* tmp/: the fills' temporaries */
    int lfd;   /* locks/: the key locks */
    uint64_t cap;
};

struct vmsnap_objcache_fill {
    struct vmsnap_objcache *c;
    uint64_t size;
    int fd;       /* the temporary, flocked */
    int lock;     /* the key's lock (-1 for an unnamed fill until its commit) */
    bool unnamed; /* vmsnap_objcache_fill_begin_unnamed(): key and size come at the commit */
    /* fill_written(): the range whose write-out was started last, waited for at the next */
    pthread_mutex_t mu;
    uint64_t pend_off, pend_len;
    bool pend;
    char key[VMSNAP_OBJCACHE_KEY_MAX + 1];
    char tmp[VMSNAP_OBJCACHE_KEY_MAX + 32]; /* its name in tmp/ */
};

/* Whether `key` is a key ([a-z0-9-], 1..100 bytes). */
bool objcache_key_ok(const char *key);
/* The same, -EINVAL with a message naming it otherwise. */
int objcache_check_key(const char *key, struct vmsnap_err *err);

/* Take the key's lock (flock of locks/<key>, created if missing) into *fd. With `wait`, polls
 * until it is free (checking for a cancel); without, -EBUSY when another holds it. The name is
 * checked to still be the locked file after the flock (a holder removes it when it is done), so
 * two holders never lock different files of one key. */
int objcache_lock(const struct vmsnap_objcache *c, const char *key, bool wait, int *fd,
                  struct vmsnap_err *err);
/* Release it: the lock file is removed (while held), then closed. */
void objcache_unlock(const struct vmsnap_objcache *c, const char *key, int fd);

/* A file's modification time (an entry's last use) in nanoseconds since the epoch. */
static inline int64_t objcache_mtime_ns(const struct stat *st)
{
    return (int64_t)st->st_mtim.tv_sec * 1000000000 + st->st_mtim.tv_nsec;
}

/* Set the entry open at `fd`'s last use to now (its mtime, explicitly: no atime). */
void objcache_touch(int fd, const char *key);

/* Evict least recently used entries, never `exclude` (may be NULL), until at most `target`
 * bytes are held. Adds to *evicted / *freed (may be NULL). */
int objcache_evict(struct vmsnap_objcache *c, uint64_t target, const char *exclude,
                   uint64_t *evicted, uint64_t *freed, struct vmsnap_err *err);

#endif
