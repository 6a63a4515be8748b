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
 */
#include "disk_int.h"
#include "sys/sys.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <linux/fs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#define RW_BUF (1u << 20)

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

static int copy_extents(const char *src, int sfd, int dfd, uint64_t size,
                        enum vmsnap_disk_clone_how *how, struct vmsnap_err *err)
{
    if (ftruncate(dfd, (off_t)size) < 0)
        return vmsnap_err_set(err, errno, "set size: %s", strerror(errno));
    bool use_cfr = true;
    uint8_t *buf = NULL;
    int rc = 0;
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
        rc = copy_range(sfd, dfd, (uint64_t)data, end, &use_cfr, &buf);
        if (rc < 0) {
            rc = vmsnap_err_set(err, -rc, "copy %s at offset %lld: %s", src, (long long)data,
                                strerror(-rc));
            goto out;
        }
        pos = end;
    }
    *how = use_cfr ? VMSNAP_DISK_CLONE_EXTENTS : VMSNAP_DISK_CLONE_RW;
out:
    free(buf);
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
        rc = copy_extents(src, sfd, af.fd, (uint64_t)st.st_size, &h, err);
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
