/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Reading and filling entries.
 *
 * A fill holds its key's lock from fill_begin to the end of commit or abort: the check that the
 * entry is still missing, the temporary's creation and the rename that publishes it all happen
 * under it, so one fill per key runs at a time across processes, and a second one finds the
 * entry when the lock comes free. The temporary is created 0600 under tmp/ and flocked; the
 * commit fsyncs it (its pages are then clean, so POSIX_FADV_DONTNEED frees them without I/O),
 * makes it 0400, sets its last use and renames it into objects/.
 */
#include "objcache/objcache_int.h"
#include "sys/sys.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <unistd.h>

/* Remove the entry named `key` if it still is the file `st` (a wrong size, a non-file). */
static void remove_stale(struct vmsnap_objcache *c, const char *key, const struct stat *st,
                         const char *why)
{
    struct stat now;
    if (fstatat(c->ofd, key, &now, AT_SYMLINK_NOFOLLOW) < 0 || now.st_dev != st->st_dev ||
        now.st_ino != st->st_ino)
        return;
    if (unlinkat(c->ofd, key, S_ISDIR(now.st_mode) ? AT_REMOVEDIR : 0) < 0)
        vlog(VMSNAP_LOG_WARN, "object cache %s: remove objects/%s (%s): %s", c->dir, key, why,
             strerror(errno));
    else
        vlog(VMSNAP_LOG_INFO, "object cache %s: removed objects/%s: %s", c->dir, key, why);
}

/* Open the entry `key` of `size` bytes: 0 with *fd (last use set), -ENOENT (also for an entry of
 * another size or type, which is removed), -errno. */
static int open_entry(struct vmsnap_objcache *c, const char *key, uint64_t size, int *fd,
                      struct vmsnap_err *err)
{
    int e = openat(c->ofd, key, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    struct stat st;
    if (e < 0 && errno == ENOENT)
        return vmsnap_err_set(err, ENOENT, "object cache: %s not cached", key);
    if (e < 0 && (errno == ELOOP || errno == EISDIR || errno == ENXIO) &&
        fstatat(c->ofd, key, &st, AT_SYMLINK_NOFOLLOW) == 0) {
        remove_stale(c, key, &st, "not a regular file");
        return vmsnap_err_set(err, ENOENT, "object cache: %s not cached", key);
    }
    if (e < 0)
        return err_sys(err, "object cache: open %s/objects/%s", c->dir, key);
    if (fstat(e, &st) < 0) {
        int rc = err_sys(err, "object cache: stat %s/objects/%s", c->dir, key);
        close(e);
        return rc;
    }
    if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size != size) {
        char why[96];
        snprintf(why, sizeof(why),
                 S_ISREG(st.st_mode) ? "%llu bytes, the object has %llu" : "not a regular file",
                 (unsigned long long)st.st_size, (unsigned long long)size);
        close(e);
        remove_stale(c, key, &st, why);
        return vmsnap_err_set(err, ENOENT, "object cache: %s not cached (%s)", key, why);
    }
    objcache_touch(e, key);
    *fd = e;
    return 0;
}

int vmsnap_objcache_get(struct vmsnap_objcache *c, const char *key, uint64_t size, int *fd,
                        struct vmsnap_err *err)
{
    *fd = -1;
    int rc = objcache_check_key(key, err);
    return rc < 0 ? rc : open_entry(c, key, size, fd, err);
}

void vmsnap_objcache_put(struct vmsnap_objcache *c, int fd)
{
    (void)c;
    if (fd < 0)
        return;
    /* the entry is never written once published: its pages are clean and go without I/O */
    (void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
}

static struct vmsnap_objcache_fill *fill_new(struct vmsnap_objcache *c, uint64_t size)
{
    struct vmsnap_objcache_fill *f = calloc(1, sizeof(*f));
    if (!f)
        return NULL;
    f->c = c;
    f->size = size;
    f->fd = -1;
    f->lock = -1;
    pthread_mutex_init(&f->mu, NULL);
    return f;
}

static void fill_free(struct vmsnap_objcache_fill *f)
{
    pthread_mutex_destroy(&f->mu);
    free(f);
}

/* Create the fill's temporary "<key>.<random>" in tmp/, flocked, `size` bytes long. */
static int create_tmp(struct vmsnap_objcache_fill *f, struct vmsnap_err *err)
{
    const struct vmsnap_objcache *c = f->c;
    for (int tries = 0; tries < 16; tries++) {
        uint64_t r;
        if (getrandom(&r, sizeof(r), 0) != sizeof(r))
            r = ((uint64_t)getpid() << 32) ^ (uint64_t)(mono_now() * 1e9) ^ (uint64_t)tries;
        snprintf(f->tmp, sizeof(f->tmp), "%s.%016llx", f->key, (unsigned long long)r);
        f->fd = openat(c->tfd, f->tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (f->fd >= 0)
            break;
        if (errno != EEXIST)
            return err_sys(err, "object cache: create %s/tmp/%s", c->dir, f->tmp);
    }
    if (f->fd < 0)
        return vmsnap_err_set(err, EEXIST, "object cache: no free temporary name in %s/tmp",
                              c->dir);
    int rc = 0;
    if (flock(f->fd, LOCK_EX | LOCK_NB) < 0)
        rc = err_sys(err, "object cache: flock %s/tmp/%s", c->dir, f->tmp);
    else if (ftruncate(f->fd, (off_t)f->size) < 0)
        rc = err_sys(err, "object cache: size %s/tmp/%s to %llu bytes", c->dir, f->tmp,
                     (unsigned long long)f->size);
    if (rc < 0) {
        (void)unlinkat(c->tfd, f->tmp, 0);
        close(f->fd);
        f->fd = -1;
    }
    return rc;
}

int vmsnap_objcache_fill_begin(struct vmsnap_objcache *c, const char *key, uint64_t size,
                               struct vmsnap_objcache_fill **out, int *fd, struct vmsnap_err *err)
{
    *out = NULL;
    *fd = -1;
    int rc = objcache_check_key(key, err);
    if (rc < 0)
        return rc;
    if (size > (uint64_t)INT64_MAX)
        return vmsnap_err_set(err, EFBIG, "object cache: %s: size %llu too large", key,
                              (unsigned long long)size);
    struct vmsnap_objcache_fill *f = fill_new(c, size);
    if (!f)
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    memcpy(f->key, key, strlen(key) + 1);
    if ((rc = objcache_lock(c, key, true, &f->lock, err)) < 0) {
        fill_free(f);
        return rc;
    }
    /* filled by another while we waited, or before */
    rc = open_entry(c, key, size, fd, err);
    if (rc != -ENOENT) {
        objcache_unlock(c, key, f->lock);
        fill_free(f);
        return rc;
    }
    vmsnap_err_clear(err);
    if ((rc = create_tmp(f, err)) < 0) {
        objcache_unlock(c, key, f->lock);
        fill_free(f);
        return rc;
    }
    *out = f;
    return 1;
}

int vmsnap_objcache_fill_fd(const struct vmsnap_objcache_fill *f)
{
    return f->fd;
}

/* The range handed in is only started on its way to the disk; the one handed in before it
 * (by now mostly written) is waited for and dropped. So a writer does not stall on the range
 * it just wrote (a pull decoding as it fills, a push's write-through), while the fill's dirty
 * pages stay bounded by two ranges per writer; the commit's fsync waits for the rest. */
int vmsnap_objcache_fill_written(struct vmsnap_objcache_fill *f, uint64_t off, uint64_t len,
                                 struct vmsnap_err *err)
{
    if (sync_file_range(f->fd, (off64_t)off, (off64_t)len, SYNC_FILE_RANGE_WRITE) < 0)
        return err_sys(err, "object cache: write out %s at %llu", f->key, (unsigned long long)off);
    pthread_mutex_lock(&f->mu);
    bool prev = f->pend;
    uint64_t po = f->pend_off, pl = f->pend_len;
    f->pend = true;
    f->pend_off = off;
    f->pend_len = len;
    pthread_mutex_unlock(&f->mu);
    if (!prev)
        return 0;
    if (sync_file_range(f->fd, (off64_t)po, (off64_t)pl,
                        SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE |
                            SYNC_FILE_RANGE_WAIT_AFTER) < 0)
        return err_sys(err, "object cache: write out %s at %llu", f->key, (unsigned long long)po);
    (void)posix_fadvise(f->fd, (off_t)po, (off_t)pl, POSIX_FADV_DONTNEED);
    return 0;
}

/* The commit's steps up to the rename; on failure nothing is published. */
static int publish(struct vmsnap_objcache_fill *f, struct vmsnap_err *err)
{
    const struct vmsnap_objcache *c = f->c;
    struct stat st;
    if (fstat(f->fd, &st) < 0)
        return err_sys(err, "object cache: stat %s/tmp/%s", c->dir, f->tmp);
    if ((uint64_t)st.st_size != f->size)
        return vmsnap_err_set(err, EINVAL,
                              "object cache: fill of %s is %llu bytes, the object has %llu: not "
                              "published",
                              f->key, (unsigned long long)st.st_size, (unsigned long long)f->size);
    if (fsync(f->fd) < 0)
        return err_sys(err, "object cache: fsync %s/tmp/%s", c->dir, f->tmp);
    (void)posix_fadvise(f->fd, 0, 0, POSIX_FADV_DONTNEED); /* clean after the fsync: no I/O */
    if (fchmod(f->fd, 0400) < 0)
        return err_sys(err, "object cache: chmod %s/tmp/%s", c->dir, f->tmp);
    objcache_touch(f->fd, f->key);
    sys_failpoint("objcache-publish");
    if (renameat(c->tfd, f->tmp, c->ofd, f->key) < 0)
        return err_sys(err, "object cache: rename %s/tmp/%s to objects/%s", c->dir, f->tmp, f->key);
    /* an entry lost to a power cut before this is only a miss */
    if (fsync(c->ofd) < 0)
        vlog(VMSNAP_LOG_WARN, "object cache: fsync %s/objects: %s", c->dir, strerror(errno));
    return 0;
}

int vmsnap_objcache_fill_commit(struct vmsnap_objcache_fill *f, struct vmsnap_err *err)
{
    int rc = publish(f, err);
    if (rc < 0) {
        vmsnap_objcache_fill_abort(f);
        return rc;
    }
    struct vmsnap_objcache *c = f->c;
    char key[VMSNAP_OBJCACHE_KEY_MAX + 1];
    memcpy(key, f->key, sizeof(key));
    close(f->fd);
    objcache_unlock(c, key, f->lock);
    fill_free(f);
    uint64_t evicted = 0, freed = 0;
    struct vmsnap_err e2 = {0};
    if (objcache_evict(c, c->cap, key, &evicted, &freed, &e2) < 0)
        vlog(VMSNAP_LOG_WARN, "%s (after filling %s)", e2.msg, key);
    else if (evicted)
        vlog(VMSNAP_LOG_INFO,
             "object cache %s: evicted %llu entries (%llu bytes) to stay within "
             "%llu bytes",
             c->dir, (unsigned long long)evicted, (unsigned long long)freed,
             (unsigned long long)c->cap);
    return 0;
}

int vmsnap_objcache_fill_begin_unnamed(struct vmsnap_objcache *c, struct vmsnap_objcache_fill **out,
                                       struct vmsnap_err *err)
{
    *out = NULL;
    struct vmsnap_objcache_fill *f = fill_new(c, 0);
    if (!f)
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    f->unnamed = true;
    memcpy(f->key, "unnamed", sizeof("unnamed")); /* the temporary's name until the commit */
    int rc = create_tmp(f, err);
    if (rc < 0) {
        fill_free(f);
        return rc;
    }
    *out = f;
    return 0;
}

int vmsnap_objcache_fill_commit_as(struct vmsnap_objcache_fill *f, const char *key, uint64_t size,
                                   struct vmsnap_err *err)
{
    int rc = objcache_check_key(key, err);
    if (rc == 0 && !f->unnamed)
        rc = vmsnap_err_set(err, EINVAL, "object cache: %s: not an unnamed fill", f->key);
    if (rc == 0 && size > (uint64_t)INT64_MAX)
        rc = vmsnap_err_set(err, EFBIG, "object cache: %s: size %llu too large", key,
                            (unsigned long long)size);
    if (rc < 0) {
        vmsnap_objcache_fill_abort(f);
        return rc;
    }
    memcpy(f->key, key, strlen(key) + 1);
    f->size = size;
    /* another fill of the key under way, or the entry there already: ours is not needed */
    rc = objcache_lock(f->c, key, false, &f->lock, err);
    int efd = -1;
    if (rc == 0 && open_entry(f->c, key, size, &efd, NULL) == 0) {
        close(efd);
        rc = -EEXIST;
    }
    if (rc == -EBUSY || rc == -EEXIST) {
        vmsnap_err_clear(err);
        vmsnap_objcache_fill_abort(f);
        return 0;
    }
    if (rc < 0) {
        vmsnap_objcache_fill_abort(f);
        return rc;
    }
    rc = vmsnap_objcache_fill_commit(f, err);
    return rc < 0 ? rc : 1;
}

void vmsnap_objcache_fill_abort(struct vmsnap_objcache_fill *f)
{
    if (!f)
        return;
    if (f->fd >= 0) {
        if (unlinkat(f->c->tfd, f->tmp, 0) < 0 && errno != ENOENT)
            vlog(VMSNAP_LOG_WARN, "object cache: remove %s/tmp/%s: %s", f->c->dir, f->tmp,
                 strerror(errno));
        close(f->fd);
    }
    objcache_unlock(f->c, f->key, f->lock);
    fill_free(f);
}

int vmsnap_objcache_drop(struct vmsnap_objcache *c, const char *key, struct vmsnap_err *err)
{
    int rc = objcache_check_key(key, err);
    if (rc < 0)
        return rc;
    if (unlinkat(c->ofd, key, 0) < 0)
        return errno == ENOENT ? 0
                               : err_sys(err, "object cache: remove %s/objects/%s", c->dir, key);
    vlog(VMSNAP_LOG_INFO, "object cache %s: dropped %s", c->dir, key);
    return 0;
}
