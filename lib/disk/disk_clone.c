/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Cloning images without densifying them.
 *
 * A plain copy_file_range of a whole sparse file on ext4 reads the holes as zeros and writes
 * them out, so a 4 GiB image with 150 KiB of data becomes 4 GiB allocated. The copy here is, in
 * order of preference: a hard link (--link, same filesystem), FICLONE (XFS with reflink, btrfs:
 * shared extents, no data moved), or a walk over the source's data extents
 * (SEEK_DATA/SEEK_HOLE) copying each with copy_file_range (read/write when the kernel refuses),
 * leaving the holes as holes. The copy is made under a temporary name and renamed at the end;
 * --new-uuid patches the temporary copy's superblocks before the rename.
 *
 * With `direct` the extent walk queues extents of 256 KiB and more as 8 MiB aligned chunks that
 * up to 4 threads copy with O_DIRECT set on both descriptors (several requests in flight; a side
 * whose filesystem refuses O_DIRECT, at fcntl or later with EINVAL, goes buffered). Small
 * extents and unaligned edges go through the page cache, which is written out and dropped at the
 * end: a memory image copied to or from a checkpoint leaves no dirty pages to throttle on and no
 * clean ones to evict.
 */
#include "disk_int.h"
#include "sys/sys.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <pthread.h>
#include <stdatomic.h>
#include <linux/fs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#define RW_BUF (1u << 20)
#define DIRECT_BUF (8u << 20)
#define DIRECT_ALIGN 4096u
#define DIRECT_THREADS 4u
#define DIRECT_MIN (256u << 10)

static bool cfr_unsupported(int e)
{
    return e == EXDEV || e == EINVAL || e == ENOSYS || e == EOPNOTSUPP || e == EBADF;
}

/* Copy [off, end) of sfd to the same offsets of dfd. *use_cfr drops to false (and stays) when
 * copy_file_range is refused. */
static int copy_range(int sfd, int dfd, uint64_t off, uint64_t end, bool *use_cfr, uint8_t **buf)
{
    while (off < end && *use_cfr) {
        loff_t in = (loff_t)off, out = (loff_t)off;
        ssize_t n =
            copy_file_range(sfd, &in, dfd, &out, (size_t)VMSNAP_MIN(end - off, 1ull << 30), 0);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (cfr_unsupported(errno)) {
                *use_cfr = false;
                break;
            }
            return -errno;
        }
        if (n == 0)
            return 0; /* source shrank */
        off += (uint64_t)n;
    }
    if (off >= end)
        return 0;
    if (!*buf && !(*buf = malloc(RW_BUF)))
        return -ENOMEM;
    while (off < end) {
        size_t want = (size_t)VMSNAP_MIN(end - off, (uint64_t)RW_BUF);
        ssize_t n = sys_pread_full(sfd, *buf, want, off);
        if (n < 0)
            return (int)n;
        if (n == 0)
            return 0;
        int rc = sys_pwrite_full(dfd, *buf, (size_t)n, off);
        if (rc < 0)
            return rc;
        off += (uint64_t)n;
    }
    return 0;
}

struct direct_io {
    int fd[2];          /* the caller's source and destination descriptors */
    int flags[2];       /* their status flags before O_DIRECT was set, restored after */
    atomic_bool on[2];  /* O_DIRECT is set on that side */
    pthread_mutex_t mu; /* serialises turning O_DIRECT off after an EINVAL */
    bool cached;        /* some bytes went through the page cache (small or unaligned parts) */
    struct dchunk {
        uint64_t off;
        uint32_t len;
    } * c; /* aligned chunks to copy */
    size_t n, cap;
    atomic_size_t next; /* next chunk a worker takes */
    atomic_int rc;      /* first error */
};

/* Queue [off, end) for the O_DIRECT workers: the aligned middle in DIRECT_BUF chunks. Extents
 * under DIRECT_MIN and unaligned heads and tails are copied now through the page cache (one tiny
 * synchronous O_DIRECT request per 4 KiB extent made a fragmented 256 MiB image take 3.7 s
 * instead of 0.13 s); copy_extents flushes and drops those pages at the end. */
static int queue_range_direct(struct direct_io *d, int sfd, int dfd, uint64_t off, uint64_t end,
                              bool *use_cfr, uint8_t **buf)
{
    uint64_t a0 = (off + DIRECT_ALIGN - 1) / DIRECT_ALIGN * DIRECT_ALIGN;
    uint64_t a1 = end / DIRECT_ALIGN * DIRECT_ALIGN;
    if (a0 >= a1 || a1 - a0 < DIRECT_MIN) {
        d->cached = true;
        return copy_range(sfd, dfd, off, end, use_cfr, buf);
    }
    int rc = 0;
    if (off < a0) {
        d->cached = true;
        rc = copy_range(sfd, dfd, off, a0, use_cfr, buf);
    }
    for (uint64_t o = a0; rc == 0 && o < a1;) {
        if (grow_array(&d->c, &d->cap, d->n + 1, sizeof(*d->c), 256) < 0)
            return -ENOMEM;
        uint32_t len = (uint32_t)VMSNAP_MIN(a1 - o, (uint64_t)DIRECT_BUF);
        d->c[d->n++] = (struct dchunk){o, len};
        o += len;
    }
    if (rc == 0 && a1 < end) {
        d->cached = true;
        rc = copy_range(sfd, dfd, a1, end, use_cfr, buf);
    }
    return rc;
}

/* Set (on) or restore (off) O_DIRECT on side i; false if the filesystem refuses it. */
static bool direct_set(struct direct_io *d, int i, bool on)
{
    int fl = on ? d->flags[i] | O_DIRECT : d->flags[i];
    bool ok = fcntl(d->fd[i], F_SETFL, fl) == 0;
    atomic_store(&d->on[i], on && ok);
    return ok;
}

/* An O_DIRECT request failed with EINVAL (alignment the filesystem or device does not accept):
 * that side goes buffered for the rest of the copy. */
static void direct_give_up(struct direct_io *d, int i)
{
    pthread_mutex_lock(&d->mu);
    if (atomic_load(&d->on[i])) {
        direct_set(d, i, false);
        d->cached = true;
        vlog(VMSNAP_LOG_INFO, "disk clone: O_DIRECT refused on the %s, continuing buffered",
             i ? "destination" : "source");
    }
    pthread_mutex_unlock(&d->mu);
}

static void direct_fail(struct direct_io *d, int rc)
{
    int expect = 0;
    atomic_compare_exchange_strong(&d->rc, &expect, rc);
}

static void *direct_worker(void *arg)
{
    struct direct_io *d = arg;
    uint8_t *buf = NULL;
    if (posix_memalign((void **)&buf, DIRECT_ALIGN, DIRECT_BUF)) {
        direct_fail(d, -ENOMEM);
        return NULL;
    }
    for (;;) {
        size_t i = atomic_fetch_add(&d->next, 1);
        if (i >= d->n || atomic_load(&d->rc))
            break;
        const struct dchunk *c = &d->c[i];
        ssize_t got = sys_pread_full(d->fd[0], buf, c->len, c->off);
        if (got == -EINVAL && atomic_load(&d->on[0])) {
            direct_give_up(d, 0);
            got = sys_pread_full(d->fd[0], buf, c->len, c->off);
        }
        int rc = got < 0 ? (int)got : (size_t)got < c->len ? -EIO /* source shrank */ : 0;
        if (rc == 0) {
            rc = sys_pwrite_full(d->fd[1], buf, c->len, c->off);
            if (rc == -EINVAL && atomic_load(&d->on[1])) {
                direct_give_up(d, 1);
                rc = sys_pwrite_full(d->fd[1], buf, c->len, c->off);
            }
        }
        if (rc < 0) {
            direct_fail(d, rc);
            break;
        }
    }
    free(buf);
    return NULL;
}

/* Copy the queued chunks with up to DIRECT_THREADS threads (the caller's included), O_DIRECT set
 * on each side that accepts it for the duration: O_DIRECT requests are synchronous, and one at a
 * time read at half the speed of a buffered copy's readahead. Returns the first error. */
static int run_direct(struct direct_io *d)
{
    for (int i = 0; i < 2; i++) {
        d->flags[i] = fcntl(d->fd[i], F_GETFL);
        if (d->flags[i] < 0 || !direct_set(d, i, true))
            d->cached = true; /* that side stays buffered */
    }
    pthread_t th[DIRECT_THREADS];
    unsigned started = 0;
    unsigned want = d->n < DIRECT_THREADS ? (unsigned)d->n : DIRECT_THREADS;
    for (unsigned i = 1; i < want; i++) {
        if (thread_start(&th[started], direct_worker, d) != 0)
            break;
        started++;
    }
    direct_worker(d);
    for (unsigned i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < 2; i++)
        if (atomic_load(&d->on[i]))
            direct_set(d, i, false);
    return atomic_load(&d->rc);
}

static int copy_extents(const char *src, int sfd, int dfd, uint64_t size, bool direct,
                        enum vmsnap_disk_clone_how *how, struct vmsnap_err *err)
{
    if (ftruncate(dfd, (off_t)size) < 0)
        return err_sys(err, "set size");
    bool use_cfr = true;
    uint8_t *buf = NULL;
    int rc = 0;
    struct direct_io d = {.fd = {sfd, dfd}};
    pthread_mutex_init(&d.mu, NULL);
    uint64_t pos = 0;
    while (pos < size) {
        off_t data = lseek(sfd, (off_t)pos, SEEK_DATA);
        if (data < 0) {
            if (errno == ENXIO)
                break;
            rc = err_sys(err, "seek data in %s", src);
            goto out;
        }
        off_t hole = lseek(sfd, data, SEEK_HOLE);
        if (hole < 0) {
            rc = err_sys(err, "seek hole in %s", src);
            goto out;
        }
        uint64_t end = VMSNAP_MIN((uint64_t)hole, size);
        rc = direct ? queue_range_direct(&d, sfd, dfd, (uint64_t)data, end, &use_cfr, &buf)
                    : copy_range(sfd, dfd, (uint64_t)data, end, &use_cfr, &buf);
        if (rc == -ENOSPC || rc == -EDQUOT) { /* the copy's side (the caller names it) */
            rc = err_code(err, -rc, "writing the copy at offset %lld", (long long)data);
            goto out;
        } else if (rc < 0) {
            rc = err_code(err, -rc, "copy %s at offset %lld", src, (long long)data);
            goto out;
        }
        pos = end;
    }
    if (direct && d.n && (rc = run_direct(&d)) < 0) {
        rc = err_code(err, -rc, "%s %s (direct I/O)",
                      rc == -ENOSPC || rc == -EDQUOT ? "writing the copy of" : "copy", src);
        goto out;
    }
    if (direct && d.cached) {
        /* what went through the page cache (small extents, unaligned edges, a side without
         * O_DIRECT): written out and dropped, so the copy still leaves neither file cached */
        if (sync_file_range(dfd, 0, 0,
                            SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE |
                                SYNC_FILE_RANGE_WAIT_AFTER) < 0) {
            rc = err_sys(err, "write out the copy of %s", src);
            goto out;
        }
        (void)posix_fadvise(dfd, 0, 0, POSIX_FADV_DONTNEED);
        (void)posix_fadvise(sfd, 0, 0, POSIX_FADV_DONTNEED);
    }
    *how = direct    ? VMSNAP_DISK_CLONE_DIRECT
           : use_cfr ? VMSNAP_DISK_CLONE_EXTENTS
                     : VMSNAP_DISK_CLONE_RW;
out:
    free(buf);
    free(d.c);
    pthread_mutex_destroy(&d.mu);
    return rc;
}

/* Hard-link src at dst; with force an existing dst is replaced atomically. Returns -EXDEV when
 * the two are on different filesystems (the caller copies instead). */
/* link(2) of SRC's name following a symlink there (plain link() would link the symlink itself:
 * a relative one then dangles, or names another image, from DST's directory), then checked to
 * be the file that was opened and checked (`want`): else the new name goes again. */
static int link_checked(const char *src, const char *to, const struct stat *want)
{
    if (linkat(AT_FDCWD, src, AT_FDCWD, to, AT_SYMLINK_FOLLOW) != 0)
        return -1;
    struct stat now;
    if (lstat(to, &now) == 0 && now.st_dev == want->st_dev && now.st_ino == want->st_ino)
        return 0;
    unlink(to);
    errno = EAGAIN; /* SRC's name was given to another file meanwhile */
    return -1;
}

static int do_link(const char *src, const char *dst, const struct stat *want, bool force,
                   struct vmsnap_err *err)
{
    if (!force) {
        if (link_checked(src, dst, want) == 0)
            return 0;
        if (errno == EXDEV || errno == EPERM)
            return -EXDEV;
        return err_sys(err, "disk clone %s: link to %s", src, dst);
    }
    size_t n = strlen(dst) + 32;
    char *tmp = malloc(n);
    if (!tmp)
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    for (unsigned i = 0;; i++) {
        snprintf(tmp, n, "%s.link%u.%d", dst, i, (int)getpid());
        if (link_checked(src, tmp, want) == 0)
            break;
        int e = errno;
        if (e == EEXIST && i < 100)
            continue;
        free(tmp);
        if (e == EXDEV || e == EPERM)
            return -EXDEV;
        return err_code(err, e, "disk clone %s: link to %s", src, dst);
    }
    if (rename(tmp, dst) < 0) {
        int e = errno;
        unlink(tmp);
        free(tmp);
        return err_code(err, e, "disk clone %s: rename onto %s", src, dst);
    }
    free(tmp);
    return 0;
}

int vmsnap_disk_clone(const char *src, const char *dst, const struct vmsnap_disk_clone_opts *o,
                      enum vmsnap_disk_clone_how *how, struct vmsnap_err *err)
{
    enum vmsnap_disk_clone_how h = VMSNAP_DISK_CLONE_EXTENTS;
    if (o->link && o->new_uuid)
        return vmsnap_err_set(err, EINVAL,
                              "disk clone %s: --link and --new-uuid together would change the "
                              "source's UUID too",
                              src);
    int sfd = open(src, O_RDONLY | O_NONBLOCK | O_CLOEXEC); /* a FIFO is refused, not waited on */
    if (sfd < 0)
        return err_sys(err, "disk clone: source image %s", src);
    struct stat st, dst_st;
    if (fstat(sfd, &st) < 0 || !S_ISREG(st.st_mode)) {
        int e = S_ISREG(st.st_mode) ? errno : EINVAL;
        close(sfd);
        return vmsnap_err_set(err, e, "disk clone: source image %s: %s", src,
                              e == EINVAL ? "not a regular file" : strerror(e));
    }
    if (lstat(dst, &dst_st) == 0) {
        if (dst_st.st_dev == st.st_dev && dst_st.st_ino == st.st_ino) {
            close(sfd);
            return vmsnap_err_set(err, EINVAL, "disk clone %s: destination %s is the source", src,
                                  dst);
        }
        if (!o->force) {
            close(sfd);
            return vmsnap_err_set(err, EEXIST,
                                  "disk clone %s: destination %s exists (use --force to replace)",
                                  src, dst);
        }
    }
    int rc;
    if (o->link) {
        /* only a regular file is replaced, as by a copy (a FIFO, a link, a device went) */
        rc = sys_check_replaceable(dst, err);
        if (rc < 0) {
            close(sfd);
            return rc;
        }
        rc = do_link(src, dst, &st, o->force, err);
        if (rc == 0) {
            close(sfd);
            if (how)
                *how = VMSNAP_DISK_CLONE_LINK;
            return 0;
        }
        if (rc != -EXDEV) {
            close(sfd);
            return rc;
        }
        vlog(VMSNAP_LOG_INFO, "disk clone %s: %s is on another filesystem, copying instead", src,
             dst);
    }
    struct sys_atomic_file af;
    /* writable by its owner while it is made (a read-only image's clone got its mode at once,
     * and --new-uuid, reopening it to patch the UUID, was refused to anyone but root); the
     * source's mode before the commit */
    rc = sys_atomic_open(&af, dst, (st.st_mode & 0777) | 0600, err);
    if (rc < 0) {
        close(sfd);
        return vmsnap_err_wrap(err, "disk clone %s: ", src);
    }
    if (ioctl(af.fd, FICLONE, sfd) == 0) {
        h = VMSNAP_DISK_CLONE_FICLONE;
    } else {
        int e = errno;
        if (e != EOPNOTSUPP && e != ENOTTY && e != EXDEV && e != EINVAL && e != ENOSYS &&
            e != EPERM) {
            rc = err_code(err, e, "disk clone %s: FICLONE to %s", src, dst);
            goto fail;
        }
        rc = copy_extents(src, sfd, af.fd, (uint64_t)st.st_size, o->direct, &h, err);
        if (rc < 0) {
            vmsnap_err_wrap(err, "disk clone %s to %s: ", src, dst);
            goto fail;
        }
        /* the copy followed the size seen at the start: a source that changed size meanwhile
         * (an image still in use) gave a copy of neither state */
        struct stat st2;
        if (fstat(sfd, &st2) == 0 && st2.st_size != st.st_size) {
            rc = vmsnap_err_set(err, EAGAIN,
                                "disk clone %s to %s: the source changed size while being copied "
                                "(%lld -> %lld bytes): is it in use?",
                                src, dst, (long long)st.st_size, (long long)st2.st_size);
            goto fail;
        }
    }
    if (o->new_uuid) {
        rc = disk_set_uuid(af.tmp, dst, NULL, o->force, err);
        if (rc < 0) {
            vmsnap_err_wrap(err, "disk clone %s to %s: ", src, dst);
            goto fail;
        }
    }
    close(sfd);
    sfd = -1;
    sys_failpoint("disk-clone-copied"); /* test hook: the copy made */
    if (fchmod(af.fd, st.st_mode & 0777) < 0) {
        rc = err_sys(err, "disk clone %s: chmod %s", src, af.tmp);
        sys_atomic_abort(&af);
        return rc;
    }
    rc = sys_atomic_commit_ex(&af, false, !o->force, err);
    if (rc < 0)
        return vmsnap_err_wrap(err, "disk clone %s: ", src);
    if (how)
        *how = h;
    return 0;
fail:
    if (sfd >= 0)
        close(sfd);
    sys_atomic_abort(&af);
    return rc;
}
