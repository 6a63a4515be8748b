/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Scans of objects/: the listing, the totals and LRU eviction.
 *
 * Nothing is kept between calls: the byte count is the sum of the entries' sizes found by one
 * readdir + fstatat pass (about a microsecond per entry from a warm dentry cache: thousands of
 * entries cost milliseconds). Eviction keeps memory bounded too: a pass keeps only the CANDS
 * oldest entries (a max-heap on last use), removes from the oldest until the total is within the
 * target, and scans again only when all of those went and it is still over. Each removal holds
 * the key's lock (skipped when busy: a fill of that key) and checks that the name is still the
 * scanned file with the scanned last use: one published or used since is left.
 */
#include "objcache/objcache_int.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CANDS 256 /* eviction candidates per pass */

struct cand {
    int64_t used; /* last use, ns */
    uint64_t size;
    dev_t dev;
    ino_t ino;
    char key[VMSNAP_OBJCACHE_KEY_MAX + 1];
};

/* Whether a was used after b (ties: the key decides, so the order is total). */
static bool newer(const struct cand *a, const struct cand *b)
{
    return a->used != b->used ? a->used > b->used : strcmp(a->key, b->key) > 0;
}

/* The CANDS oldest entries seen so far: a max-heap, its root the newest of them. */
struct oldest {
    struct cand *v;
    size_t n;
};

static void sift_down(struct oldest *h, size_t i)
{
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < h->n && newer(&h->v[l], &h->v[m]))
            m = l;
        if (r < h->n && newer(&h->v[r], &h->v[m]))
            m = r;
        if (m == i)
            return;
        struct cand t = h->v[i];
        h->v[i] = h->v[m];
        h->v[m] = t;
        i = m;
    }
}

static void oldest_add(struct oldest *h, const struct cand *c)
{
    if (h->n == CANDS) {
        if (!newer(&h->v[0], c))
            return;
        h->v[0] = *c;
        sift_down(h, 0);
        return;
    }
    size_t i = h->n++;
    h->v[i] = *c;
    while (i > 0 && newer(&h->v[i], &h->v[(i - 1) / 2])) {
        struct cand t = h->v[i];
        h->v[i] = h->v[(i - 1) / 2];
        h->v[(i - 1) / 2] = t;
        i = (i - 1) / 2;
    }
}

static int by_use(const void *a, const void *b)
{
    return newer(a, b) ? 1 : newer(b, a) ? -1 : 0;
}

/* Called for every entry of a scan (a regular file named by a key). */
typedef int (*scan_fn)(void *arg, const char *key, const struct stat *st);

/* One pass over objects/: `fn` for each entry; totals into *entries / *bytes (may be NULL). */
static int scan(struct vmsnap_objcache *c, scan_fn fn, void *arg, uint64_t *entries,
                uint64_t *bytes, struct vmsnap_err *err)
{
    /* a descriptor of its own: a dup would share the directory offset with other threads */
    int fd = openat(c->ofd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        int rc = err_sys(err, "object cache: open %s/objects", c->dir);
        if (fd >= 0)
            close(fd);
        return rc;
    }
    uint64_t n = 0, sum = 0;
    int rc = 0;
    errno = 0;
    for (struct dirent *de; rc == 0 && (de = readdir(d)); errno = 0) {
        struct stat st;
        if (!objcache_key_ok(de->d_name) ||
            fstatat(c->ofd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISREG(st.st_mode))
            continue; /* not an entry, or removed since the readdir */
        n++;
        sum += (uint64_t)st.st_size;
        if (fn)
            rc = fn(arg, de->d_name, &st);
    }
    if (rc == 0 && errno)
        rc = err_sys(err, "object cache: read %s/objects", c->dir);
    closedir(d);
    if (entries)
        *entries = n;
    if (bytes)
        *bytes = sum;
    return rc;
}

struct evict_scan {
    struct oldest h;
    const char *exclude;
};

static int evict_cb(void *arg, const char *key, const struct stat *st)
{
    struct evict_scan *s = arg;
    if (s->exclude && !strcmp(key, s->exclude))
        return 0;
    struct cand c = {objcache_mtime_ns(st), (uint64_t)st->st_size, st->st_dev, st->st_ino, ""};
    memcpy(c.key, key, strlen(key) + 1);
    oldest_add(&s->h, &c);
    return 0;
}

/* Remove the candidate if its name still holds the scanned file, unused since. */
static bool evict_one(struct vmsnap_objcache *c, const struct cand *e)
{
    int lock;
    if (objcache_lock(c, e->key, false, &lock, NULL) < 0)
        return false;
    struct stat st;
    bool gone = fstatat(c->ofd, e->key, &st, AT_SYMLINK_NOFOLLOW) == 0 && st.st_dev == e->dev &&
                st.st_ino == e->ino && objcache_mtime_ns(&st) == e->used &&
                unlinkat(c->ofd, e->key, 0) == 0;
    objcache_unlock(c, e->key, lock);
    if (gone)
        vlog(VMSNAP_LOG_DEBUG, "object cache %s: evicted %s (%llu bytes)", c->dir, e->key,
             (unsigned long long)e->size);
    return gone;
}

int objcache_evict(struct vmsnap_objcache *c, uint64_t target, const char *exclude,
                   uint64_t *evicted, uint64_t *freed, struct vmsnap_err *err)
{
    struct evict_scan s = {{calloc(CANDS, sizeof(struct cand)), 0}, exclude};
    if (!s.h.v)
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    int rc;
    for (;;) {
        uint64_t total;
        s.h.n = 0;
        if ((rc = scan(c, evict_cb, &s, NULL, &total, err)) < 0 || total <= target)
            break;
        qsort(s.h.v, s.h.n, sizeof(struct cand), by_use);
        size_t removed = 0;
        for (size_t i = 0; i < s.h.n && total > target; i++) {
            if (!evict_one(c, &s.h.v[i]))
                continue;
            removed++;
            total -= VMSNAP_MIN(total, s.h.v[i].size);
            if (evicted)
                (*evicted)++;
            if (freed)
                *freed += s.h.v[i].size;
        }
        /* all candidates tried (the rest is excluded or busy), or none could go: done */
        if (s.h.n < CANDS || removed == 0 || total <= target)
            break;
    }
    free(s.h.v);
    return rc;
}

struct list_arg {
    int (*fn)(void *arg, const struct vmsnap_objcache_entry *e);
    void *arg;
};

static int list_cb(void *arg, const char *key, const struct stat *st)
{
    const struct list_arg *l = arg;
    const struct vmsnap_objcache_entry e = {key, (uint64_t)st->st_size, st->st_mtim.tv_sec,
                                            (int32_t)st->st_mtim.tv_nsec};
    return l->fn(l->arg, &e);
}

int vmsnap_objcache_list(struct vmsnap_objcache *c,
                         int (*fn)(void *arg, const struct vmsnap_objcache_entry *e), void *arg,
                         struct vmsnap_err *err)
{
    struct list_arg l = {fn, arg};
    return scan(c, list_cb, &l, NULL, NULL, err);
}

int vmsnap_objcache_trim(struct vmsnap_objcache *c, uint64_t max_bytes, uint64_t *evicted,
                         uint64_t *freed, struct vmsnap_err *err)
{
    if (evicted)
        *evicted = 0;
    if (freed)
        *freed = 0;
    return objcache_evict(c, max_bytes, NULL, evicted, freed, err);
}

int vmsnap_objcache_stat(struct vmsnap_objcache *c, uint64_t *entries, uint64_t *bytes,
                         uint64_t *cap, struct vmsnap_err *err)
{
    if (cap)
        *cap = c->cap;
    return scan(c, NULL, NULL, entries, bytes, err);
}
