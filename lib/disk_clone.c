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
 * With `direct` the extent walk queues the data as 8 MiB aligned chunks that up to 4 threads
 * read and write through second descriptors opened O_DIRECT (several requests in flight): nothing
 * of either file enters the page cache, so a memory image copied to or from a checkpoint leaves no
 * dirty pages to throttle on and no clean ones to evict. Parts that are not 4 KiB aligned (a file's
 * unaligned tail) go through the buffered descriptors.
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
    int sfd, dfd;      /* the source and the temporary destination, O_DIRECT where possible */
    bool own_s, own_d; /* opened here with O_DIRECT (else the buffered descriptors) */
    struct dchunk {
        uint64_t off;
        uint32_t len;
    } * c; /* aligned chunks to copy */
    size_t n, cap;
    atomic_size_t next; /* next chunk a worker takes */
    atomic_int rc;      /* first error */
};

/* Queue [off, end) for the O_DIRECT workers: the aligned middle in DIRECT_BUF chunks; an
 * unaligned head or tail is copied now through the buffered descriptors. */
static int queue_range_direct(struct direct_io *d, int sfd, int dfd, uint64_t off, uint64_t end,
                              bool *use_cfr, uint8_t **buf)
{
    uint64_t a0 = (off + DIRECT_ALIGN - 1) / DIRECT_ALIGN * DIRECT_ALIGN;
    uint64_t a1 = end / DIRECT_ALIGN * DIRECT_ALIGN;
    if (a0 >= a1)
        return copy_range(sfd, dfd, off, end, use_cfr, buf);
    int rc = off < a0 ? copy_range(sfd, dfd, off, a0, use_cfr, buf) : 0;
    for (uint64_t o = a0; rc == 0 && o < a1;) {
        if (d->n == d->cap) {
            size_t cap = d->cap ? d->cap * 2 : 256;
            struct dchunk *c = realloc(d->c, cap * sizeof(*c));
            if (!c)
                return -ENOMEM;
            d->c = c;
            d->cap = cap;
        }
        uint32_t len = (uint32_t)VMSNAP_MIN(a1 - o, (uint64_t)DIRECT_BUF);
        d->c[d->n++] = (struct dchunk){o, len};
        o += len;
    }
    if (rc == 0 && a1 < end)
        rc = copy_range(sfd, dfd, a1, end, use_cfr, buf);
    return rc;
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
        ssize_t got = sys_pread_full(d->sfd, buf, c->len, c->off);
        int rc = got < 0 ? (int)got : (size_t)got < c->len ? -EIO /* source shrank */ : 0;
        if (rc == 0)
            rc = sys_pwrite_full(d->dfd, buf, c->len, c->off);
        if (rc < 0) {
            direct_fail(d, rc);
            break;
        }
    }
    free(buf);
    return NULL;
}

/* Copy the queued chunks with up to DIRECT_THREADS threads (the caller's included): O_DIRECT
 * requests are synchronous, and one at a time read at half the speed of a buffered copy's
 * readahead. Returns the first error. */
static int run_direct(struct direct_io *d)
{
    pthread_t th[DIRECT_THREADS];
    unsigned started = 0;
    unsigned want = d->n < DIRECT_THREADS ? (unsigned)d->n : DIRECT_THREADS;
    for (unsigned i = 1; i < want; i++) {
        if (pthread_create(&th[started], NULL, direct_worker, d) != 0)
            break;
        started++;
    }
    direct_worker(d);
    for (unsigned i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    return atomic_load(&d->rc);
}

/* A second descriptor with O_DIRECT for the very file `fd` is open on (through /proc, so a
 * path replaced in between cannot be picked up instead); -1 if that is not possible. */
static int reopen_direct(int fd, int mode)
{
    char p[64];
    snprintf(p, sizeof(p), "/proc/self/fd/%d", fd);
    return open(p, mode | O_DIRECT | O_CLOEXEC);
}

static int copy_extents(const char *src, int sfd, int dfd, uint64_t size, bool direct,
                        enum vmsnap_disk_clone_how *how, struct vmsnap_err *err)
{
    if (ftruncate(dfd, (off_t)size) < 0)
        return vmsnap_err_set(err, errno, "set size: %s", strerror(errno));
    bool use_cfr = true;
    uint8_t *buf = NULL;
    int rc = 0;
    struct direct_io d = {.sfd = -1, .dfd = -1};
    if (direct) {
        /* Each side on its own: a filesystem that refuses O_DIRECT (an older tmpfs) is read or
         * written through its buffered descriptor, which is where its pages live anyway. */
        int own_s = reopen_direct(sfd, O_RDONLY);
        int own_d = reopen_direct(dfd, O_WRONLY);
        d.sfd = own_s >= 0 ? own_s : sfd;
        d.dfd = own_d >= 0 ? own_d : dfd;
        d.own_s = own_s >= 0;
        d.own_d = own_d >= 0;
        if (!d.own_s && !d.own_d) {
            vlog(VMSNAP_LOG_INFO, "disk clone %s: no O_DIRECT on either side, copying buffered",
                 src);
            direct = false;
        }
    }
    uint64_t pos = 0;
    while (pos < size) {
        off_t data = lseek(sfd, (off_t)pos, SEEK_DATA);
        if (data < 0) {
            if (errno == ENXIO)
                break;
            rc = vmsnap_err_set(err, errno, "seek data in %s: %s", src, strerror(errno));
            goto out;
        }
        off_t hole = lseek(sfd, data, SEEK_HOLE);
        if (hole < 0) {
            rc = vmsnap_err_set(err, errno, "seek hole in %s: %s", src, strerror(errno));
            goto out;
        }
        uint64_t end = VMSNAP_MIN((uint64_t)hole, size);
        rc = direct ? queue_range_direct(&d, sfd, dfd, (uint64_t)data, end, &use_cfr, &buf)
                    : copy_range(sfd, dfd, (uint64_t)data, end, &use_cfr, &buf);
        if (rc < 0) {
            rc = vmsnap_err_set(err, -rc, "copy %s at offset %lld: %s", src, (long long)data,
                                strerror(-rc));
            goto out;
        }
        pos = end;
    }
    if (direct && (rc = run_direct(&d)) < 0) {
        rc = vmsnap_err_set(err, -rc, "copy %s (direct I/O): %s", src, strerror(-rc));
        goto out;
    }
    *how = direct    ? VMSNAP_DISK_CLONE_DIRECT
           : use_cfr ? VMSNAP_DISK_CLONE_EXTENTS
                     : VMSNAP_DISK_CLONE_RW;
out:
    free(buf);
    free(d.c);
    if (d.own_s)
        close(d.sfd);
    if (d.own_d)
        close(d.dfd);
    return rc;
}

/* Hard-link src at dst; with force an existing dst is replaced atomically. Returns -EXDEV when
 * the two are on different filesystems (the caller copies instead). */
static int do_link(const char *src, const char *dst, bool force, struct vmsnap_err *err)
{
    if (!force) {
        if (link(src, dst) == 0)
            return 0;
        if (errno == EXDEV || errno == EPERM)
            return -EXDEV;
        return vmsnap_err_set(err, errno, "disk clone %s: link to %s: %s", src, dst,
                              strerror(errno));
    }
    size_t n = strlen(dst) + 32;
    char *tmp = malloc(n);
    if (!tmp)
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    for (unsigned i = 0;; i++) {
        snprintf(tmp, n, "%s.link%u.%d", dst, i, (int)getpid());
        if (link(src, tmp) == 0)
            break;
        int e = errno;
        if (e == EEXIST && i < 100)
            continue;
        free(tmp);
        if (e == EXDEV || e == EPERM)
            return -EXDEV;
        return vmsnap_err_set(err, e, "disk clone %s: link to %s: %s", src, dst, strerror(e));
    }
    if (rename(tmp, dst) < 0) {
        int e = errno;
        unlink(tmp);
        free(tmp);
        return vmsnap_err_set(err, e, "disk clone %s: rename onto %s: %s", src, dst, strerror(e));
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
    int sfd = open(src, O_RDONLY | O_CLOEXEC);
    if (sfd < 0)
        return vmsnap_err_set(err, errno, "disk clone: source image %s: %s", src, strerror(errno));
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
        rc = do_link(src, dst, o->force, err);
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
    rc = sys_atomic_open(&af, dst, st.st_mode & 0777, err);
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
            rc = vmsnap_err_set(err, e, "disk clone %s: FICLONE to %s: %s", src, dst, strerror(e));
            goto fail;
        }
        rc = copy_extents(src, sfd, af.fd, (uint64_t)st.st_size, o->direct, &h, err);
        if (rc < 0) {
            vmsnap_err_wrap(err, "disk clone %s to %s: ", src, dst);
            goto fail;
        }
    }
    if (o->new_uuid) {
        rc = vmsnap_disk_set_uuid(af.tmp, NULL, o->force, err);
        if (rc < 0) {
            vmsnap_err_wrap(err, "disk clone %s to %s: ", src, dst);
            goto fail;
        }
    }
    close(sfd);
    sfd = -1;
    rc = sys_atomic_commit(&af, false, err);
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
