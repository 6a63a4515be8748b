/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The local store: an object is a regular file under the store root. A multipart upload is a
 * hidden temporary file `.<name>.mpu-XXXXXX` (its name is the upload id) beside the object that
 * parts are pwritten into at their offsets, concurrently, from any thread; complete fsyncs it,
 * renames it and fsyncs the directory. A put is such an upload of one part. Listing skips hidden
 * names, so a temporary is never visible as an object; list_uploads reports them, so that the
 * leftovers of a killed push can be aborted. A manifest or push mark is put under a hidden
 * temporary of its own (`.<name>.XXXXXX`), never listed.
 *
 * Page cache: the store is a directory on the node, so every byte written to or read from it
 * lands in the page cache, charged to the caller's memory cgroup (a suspended VM's snapshot,
 * 100% cached after the push, sat next to the next guest's RAM). Objects are dropped from the
 * cache once written and fsynced (clean, so DONTNEED frees them without I/O), and ranges once
 * read (a pull reads each byte once).
 */
#include "store_int.h"

#include "sys/sys.h"
#include "util/util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MPU_TAG ".mpu-"
#define MAX_DEPTH 32

/* A gc of the same store removes directories it emptied (ltidy) while a push may be creating
 * one below them or a file in one: a create that finds its directory gone makes the parents
 * again, at most this many times. */
#define RACE_TRIES 16

/* Create the parent directories of `path` (mode 0700 for new ones). A parent removed between
 * its mkdir and its child's (ENOENT: a gc tidying) is made again. */
static int mkparents(const char *path, struct vmsnap_err *err)
{
    char *p = strdup(path);
    if (!p)
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    int tries = 0;
    for (char *s = strchr(p + 1, '/'); s; s = strchr(s + 1, '/')) {
        *s = '\0';
        if (mkdir(p, 0700) < 0 && errno != EEXIST) {
            int e = errno;
            *s = '/';
            if (e == ENOENT && ++tries < RACE_TRIES) {
                s = p; /* from the top again (strchr(s + 1) skips the leading '/') */
                continue;
            }
            err_code(err, e, "mkdir %s", p);
            free(p);
            return -e;
        }
        *s = '/';
    }
    free(p);
    return 0;
}

/* Split "dir/base" into malloc'd dir and a pointer to base inside `path`. */
static char *dir_of(const char *path, const char **base)
{
    const char *s = strrchr(path, '/');
    *base = s + 1;
    return strndup(path, s == path ? 1 : (size_t)(s - path));
}

/* The temporary file of an upload: dir(key)/upload_id, where upload_id is ".<base>.mpu-XXXXXX". */
static char *mpu_path(const struct vmsnap_store *st, const char *key, const char *id,
                      struct vmsnap_err *err)
{
    const char *slash = strrchr(key, '/');
    const char *base = slash ? slash + 1 : key;
    size_t bl = strlen(base);
    if (strchr(id, '/') || id[0] != '.' || strncmp(id + 1, base, bl) ||
        strncmp(id + 1 + bl, MPU_TAG, strlen(MPU_TAG))) {
        vmsnap_err_set(err, EINVAL, "bad upload id '%s' for %s", id, key);
        return NULL;
    }
    size_t dl = slash ? (size_t)(slash - key) + 1 : 0;
    size_t n = dl + strlen(id) + 1;
    char *k = malloc(n);
    if (!k) {
        vmsnap_err_set(err, ENOMEM, "out of memory");
        return NULL;
    }
    snprintf(k, n, "%.*s%s", (int)dl, key, id);
    char *p = store_local_path(st, k);
    free(k);
    if (!p)
        vmsnap_err_set(err, ENOMEM, "out of memory");
    return p;
}

static int lmpu_create(struct vmsnap_store_conn *c, const char *key, char **upload_id,
                       struct vmsnap_err *err)
{
    char *path = store_local_path(c->st, key);
    if (!path)
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    int rc = sys_check_replaceable(path, err); /* refused before anything is uploaded */
    if (rc == 0)
        rc = mkparents(path, err);
    if (rc == 0)
        sys_failpoint("local-parents-made"); /* test hook: a gc may tidy them away here */
    const char *base;
    char *dir = rc == 0 ? dir_of(path, &base) : NULL;
    char *tmp = NULL;
    if (rc == 0 && dir) {
        size_t n = strlen(path) + 32;
        tmp = malloc(n);
        if (tmp)
            snprintf(tmp, n, "%s/.%s" MPU_TAG "XXXXXX", strcmp(dir, "/") ? dir : "", base);
    }
    if (rc == 0 && !tmp)
        rc = vmsnap_err_set(err, ENOMEM, "out of memory");
    if (rc == 0) {
        size_t tl = strlen(tmp);
        int fd = mkostemp(tmp, O_CLOEXEC);
        /* the directory removed after mkparents (a gc tidying): made again */
        for (int t = 1; fd < 0 && errno == ENOENT && t < RACE_TRIES; t++) {
            memcpy(tmp + tl - 6, "XXXXXX", 6);
            if ((rc = mkparents(path, err)) < 0)
                break;
            fd = mkostemp(tmp, O_CLOEXEC);
        }
        if (rc == 0 && fd < 0) {
            rc = err_sys(err, "create temporary file for %s", path);
        } else if (rc == 0) {
            close(fd); /* mkostemp creates 0600 */
            *upload_id = strdup(strrchr(tmp, '/') + 1);
            if (!*upload_id) {
                unlink(tmp);
                rc = vmsnap_err_set(err, ENOMEM, "out of memory");
            }
        }
    }
    free(tmp);
    free(dir);
    free(path);
    return rc;
}

static int lmpu_part(struct vmsnap_store_conn *c, const char *key, const char *upload_id,
                     uint32_t number, uint64_t offset, const void *buf, size_t len,
                     struct vmsnap_store_part *out, struct vmsnap_err *err)
{
    char *p = mpu_path(c->st, key, upload_id, err);
    if (!p)
        return -err_code_or(err, EINVAL);
    int rc = 0;
    int fd = open(p, O_WRONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) {
        rc = errno == ENOENT
                 ? vmsnap_err_set(err, ENOENT, "upload %s of %s no longer exists", upload_id, key)
                 : err_sys(err, "open %s", p);
    } else {
        /* Written out here, on the pool thread, while the encoder works on the next parts, then
         * dropped: the upload's dirty pages stay bounded by the parts in flight, and complete's
         * fsync has only metadata left to write. */
        rc = sys_pwrite_full(fd, buf, len, offset);
        if (rc == 0 && sync_file_range(fd, (off64_t)offset, (off64_t)len,
                                       SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE |
                                           SYNC_FILE_RANGE_WAIT_AFTER) < 0)
            rc = -errno;
        if (rc < 0)
            err_code(err, -rc, "write %s at %llu", p, (unsigned long long)offset);
        else
            (void)posix_fadvise(fd, (off_t)offset, (off_t)len, POSIX_FADV_DONTNEED);
        close(fd);
    }
    if (rc == 0 && out) {
        out->number = number;
        snprintf(out->etag, sizeof(out->etag), "local");
    }
    free(p);
    return rc;
}

static int lmpu_complete(struct vmsnap_store_conn *c, const char *key, const char *upload_id,
                         const struct vmsnap_store_part *parts, uint32_t nparts,
                         struct vmsnap_err *err)
{
    (void)parts;
    (void)nparts;
    char *p = mpu_path(c->st, key, upload_id, err);
    if (!p)
        return -err_code_or(err, EINVAL);
    char *dst = store_local_path(c->st, key);
    int rc = 0;
    int fd = dst ? open(p, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK) : -1;
    if (!dst)
        rc = vmsnap_err_set(err, ENOMEM, "out of memory");
    else if (fd < 0)
        rc = err_sys(err, "open %s", p);
    else if (fsync(fd) < 0)
        rc = err_sys(err, "fsync %s", p);
    if (rc == 0)
        rc = sys_check_replaceable(dst, err); /* (one put there meanwhile) */
    if (rc == 0) {
        (void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED); /* clean after the fsync: no I/O */
        if (rename(p, dst) < 0)
            rc = err_sys(err, "rename %s", dst);
        else
            rc = sys_fsync_parent(dst, err);
    }
    if (fd >= 0)
        close(fd);
    free(dst);
    free(p);
    return rc;
}

static int lmpu_abort(struct vmsnap_store_conn *c, const char *key, const char *upload_id,
                      struct vmsnap_err *err)
{
    char *p = mpu_path(c->st, key, upload_id, err);
    if (!p)
        return -err_code_or(err, EINVAL);
    int rc = 0;
    if (unlink(p) < 0 && errno != ENOENT)
        rc = err_sys(err, "unlink %s", p);
    free(p);
    return rc;
}

/* A small file's control object (a manifest, a push mark): a hidden temporary of its own, fsynced
 * and renamed. Not listed as an upload: a push starting at the prefix, or rm, aborts the uploads
 * it finds, and another push's commit would fail half way. */
static int lput_plain(struct vmsnap_store_conn *c, const char *key, const void *buf, size_t len,
                      struct vmsnap_err *err)
{
    char *path = store_local_path(c->st, key);
    if (!path)
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    struct sys_atomic_file af;
    int rc = mkparents(path, err);
    if (rc == 0) {
        sys_failpoint("local-parents-made");
        rc = sys_atomic_open(&af, path, 0600, err);
    }
    for (int t = 1; rc == -ENOENT && t < RACE_TRIES; t++) { /* its directory tidied away */
        vmsnap_err_clear(err);
        if ((rc = mkparents(path, err)) == 0)
            rc = sys_atomic_open(&af, path, 0600, err);
    }
    if (rc == 0) {
        rc = sys_write_full(af.fd, buf, len);
        if (rc == 0 && fsync(af.fd) < 0)
            rc = -errno;
        if (rc < 0) {
            err_code(err, -rc, "write %s", path);
            sys_atomic_abort(&af);
        } else {
            (void)posix_fadvise(af.fd, 0, 0, POSIX_FADV_DONTNEED); /* clean after the fsync */
            const char *b = strrchr(key, '/');
            if (!strcmp(b ? b + 1 : key, "manifest.json"))
                sys_failpoint("local-manifest-written"); /* test hook: its temporary written */
            rc = sys_atomic_commit(&af, false, err);
            if (rc == 0)
                rc = sys_fsync_parent(path, err);
        }
    }
    free(path);
    return rc;
}

/* A single PUT of an object (`*.zstd`) is an upload of one part: its temporary is an upload's
 * (`.<name>.mpu-XXXXXX`), so one a killed push left is an unfinished upload that the next push
 * of that key or gc aborts (a temporary of its own name was never found again). */
static int lput(struct vmsnap_store_conn *c, const char *key, const void *buf, size_t len,
                struct vmsnap_err *err)
{
    size_t kl = strlen(key);
    if (kl < 5 || strcmp(key + kl - 5, ".zstd"))
        return lput_plain(c, key, buf, len, err);
    char *id = NULL;
    int rc = lmpu_create(c, key, &id, err);
    if (rc == 0)
        rc = lmpu_part(c, key, id, 1, 0, buf, len, NULL, err);
    if (rc == 0) {
        sys_failpoint("local-put-written"); /* test hook: the data written */
        rc = lmpu_complete(c, key, id, NULL, 0, err);
    }
    if (rc < 0 && id)
        (void)lmpu_abort(c, key, id, NULL);
    free(id);
    return rc;
}

static int open_obj(struct vmsnap_store_conn *c, const char *key, char **pathp,
                    struct vmsnap_err *err)
{
    char *p = store_local_path(c->st, key);
    if (!p)
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    /* An object is a regular file. A symlink is not followed (a set written by someone else
     * would read any file this process can, a host's or another tenant's, as its own object)
     * and a FIFO does not block the open (O_NONBLOCK; nothing is read from it). */
    int fd = open(p, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0 && errno == ELOOP) {
        vmsnap_err_set(err, EINVAL, "%s: a symbolic link, not an object (refused, not followed)",
                       p);
        free(p);
        return -EINVAL;
    }
    if (fd < 0) {
        int e = errno == ENOTDIR ? ENOENT : errno;
        vmsnap_err_set(err, e, "%s: %s", p, e == ENOENT ? "no such object" : strerror(e));
        free(p);
        return -e;
    }
    struct stat sb;
    bool st_ok = fstat(fd, &sb) == 0;
    if (!st_ok || !S_ISREG(sb.st_mode)) {
        /* a directory is no object (a set's prefix, looked up as one); anything else is refused */
        int e = st_ok && S_ISDIR(sb.st_mode) ? ENOENT : EINVAL;
        close(fd);
        vmsnap_err_set(err, e, "%s: not a regular file%s", p,
                       e == EINVAL ? " (a FIFO, socket or device): not an object, refused" : "");
        free(p);
        return -e;
    }
    (void)fcntl(fd, F_SETFL, 0); /* back to blocking reads (a regular file's are anyway) */
    *pathp = p;
    return fd;
}

static int lget(struct vmsnap_store_conn *c, const char *key, uint64_t off, size_t len, void *buf,
                struct vmsnap_err *err)
{
    char *p;
    int fd = open_obj(c, key, &p, err);
    if (fd < 0)
        return fd;
    ssize_t n = sys_pread_full(fd, buf, len, off);
    int rc = 0;
    if (n < 0)
        rc = err_code(err, (int)-n, "read %s at %llu", p, (unsigned long long)off);
    else if ((size_t)n != len)
        rc = vmsnap_err_set(err, EIO, "read %s: short object (%zd of %zu bytes at %llu)", p, n, len,
                            (unsigned long long)off);
    (void)posix_fadvise(fd, (off_t)off, (off_t)len, POSIX_FADV_DONTNEED);
    close(fd);
    free(p);
    return rc;
}

static int lget_tail(struct vmsnap_store_conn *c, const char *key, size_t len, void *buf,
                     size_t *got, uint64_t *size, struct vmsnap_err *err)
{
    char *p;
    int fd = open_obj(c, key, &p, err);
    if (fd < 0)
        return fd;
    struct stat sb;
    int rc = 0;
    if (fstat(fd, &sb) < 0)
        rc = err_sys(err, "%s", p);
    uint64_t sz = rc == 0 ? (uint64_t)sb.st_size : 0;
    size_t n = sz < len ? (size_t)sz : len;
    ssize_t r = rc == 0 && n ? sys_pread_full(fd, buf, n, (off_t)(sz - n)) : 0;
    if (r < 0)
        rc = err_code(err, (int)-r, "read %s at %llu", p, (unsigned long long)(sz - n));
    else if (rc == 0 && (size_t)r != n)
        rc = vmsnap_err_set(err, EIO, "read %s: short object (%zd of %zu bytes at %llu)", p, r, n,
                            (unsigned long long)(sz - n));
    if (rc == 0) {
        *got = n;
        *size = sz;
        (void)posix_fadvise(fd, (off_t)(sz - n), (off_t)n, POSIX_FADV_DONTNEED);
    }
    close(fd);
    free(p);
    return rc;
}

static int lget_stream(struct vmsnap_store_conn *c, const char *key, vmsnap_store_data_fn fn,
                       void *arg, struct vmsnap_err *err)
{
    char *p;
    int fd = open_obj(c, key, &p, err);
    if (fd < 0)
        return fd;
    enum { CHUNK = 1 << 20 };
    char *buf = malloc(CHUNK);
    int rc = buf ? 0 : vmsnap_err_set(err, ENOMEM, "out of memory");
    for (uint64_t off = 0; rc == 0;) {
        ssize_t n = sys_pread_full(fd, buf, CHUNK, off);
        if (n < 0) {
            rc = err_code(err, (int)-n, "read %s", p);
            break;
        }
        if (n == 0)
            break;
        (void)posix_fadvise(fd, (off_t)off, n, POSIX_FADV_DONTNEED);
        rc = fn(arg, buf, (size_t)n, err);
        off += (uint64_t)n;
    }
    free(buf);
    close(fd);
    free(p);
    return rc;
}

/* A local object's tag: device, inode, size and modification time. A put or a completed upload
 * renames a new file into place, so a replaced object always gets a new tag. */
static void local_etag(const struct stat *sb, char *etag)
{
    snprintf(etag, VMSNAP_STORE_ETAG_MAX, "%llx-%llx-%llx-%llx.%09ld",
             (unsigned long long)sb->st_dev, (unsigned long long)sb->st_ino,
             (unsigned long long)sb->st_size, (unsigned long long)sb->st_mtim.tv_sec,
             (long)sb->st_mtim.tv_nsec);
}

static int lhead(struct vmsnap_store_conn *c, const char *key, uint64_t *size, char *etag,
                 struct vmsnap_err *err)
{
    char *p;
    int fd = open_obj(c, key, &p, err);
    if (fd < 0)
        return fd;
    struct stat sb;
    int rc = fstat(fd, &sb) < 0 ? err_sys(err, "stat %s", p) : 0;
    if (rc == 0)
        *size = (uint64_t)sb.st_size;
    if (rc == 0 && etag)
        local_etag(&sb, etag);
    close(fd);
    free(p);
    return rc;
}

/* Read and write `len` bytes from `in` at `ioff` to `out` at `ooff`. Returns 0 or -errno. */
static int copy_rw(int in, uint64_t ioff, int out, uint64_t ooff, uint64_t len)
{
    enum { CHUNK = 1 << 20 };
    char *buf = malloc(CHUNK);
    if (!buf)
        return -ENOMEM;
    int rc = 0;
    while (rc == 0 && len > 0) {
        size_t k = len < CHUNK ? (size_t)len : CHUNK;
        ssize_t n = sys_pread_full(in, buf, k, ioff);
        if (n < 0)
            rc = (int)n;
        else if ((size_t)n != k)
            rc = -EIO;
        else
            rc = sys_pwrite_full(out, buf, k, ooff);
        ioff += k;
        ooff += k;
        len -= k;
    }
    free(buf);
    return rc;
}

/* Copy [src_off, src_off + len) of another object into the upload's file at `offset`: in the
 * kernel (copy_file_range: a reflink where the filesystem shares extents), read and written
 * only where it cannot. */
static int lmpu_part_copy(struct vmsnap_store_conn *c, const char *key, const char *upload_id,
                          uint32_t number, uint64_t offset, const char *src_key,
                          const char *src_etag, uint64_t src_off, uint64_t len,
                          struct vmsnap_store_part *out, struct vmsnap_err *err)
{
    char *sp;
    int sfd = open_obj(c, src_key, &sp, err);
    if (sfd < 0)
        return sfd;
    char *p = mpu_path(c->st, key, upload_id, err);
    int rc = p ? 0 : -err_code_or(err, EINVAL);
    struct stat sb;
    char tag[VMSNAP_STORE_ETAG_MAX];
    if (rc == 0 && fstat(sfd, &sb) < 0)
        rc = err_sys(err, "stat %s", sp);
    if (rc == 0) {
        local_etag(&sb, tag);
        if (strcmp(tag, src_etag))
            rc = vmsnap_err_set(err, ESTALE, "copy %s into part %u of %s: the source changed", sp,
                                number, key);
        else if (src_off > (uint64_t)sb.st_size || len > (uint64_t)sb.st_size - src_off)
            rc = vmsnap_err_set(err, EINVAL, "copy %s: range %llu+%llu past its end", sp,
                                (unsigned long long)src_off, (unsigned long long)len);
    }
    int fd = -1;
    if (rc == 0 && (fd = open(p, O_WRONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK)) < 0)
        rc = errno == ENOENT
                 ? vmsnap_err_set(err, ENOENT, "upload %s of %s no longer exists", upload_id, key)
                 : err_sys(err, "open %s", p);
    if (rc == 0) {
        loff_t in = (loff_t)src_off, o = (loff_t)offset;
        uint64_t left = len;
        while (left > 0) {
            ssize_t n = copy_file_range(sfd, &in, fd, &o, left, 0);
            if (n < 0 &&
                (errno == EXDEV || errno == EINVAL || errno == EOPNOTSUPP || errno == ENOSYS)) {
                /* no in-kernel copy between these files: read and write */
                rc = copy_rw(sfd, (uint64_t)in, fd, (uint64_t)o, left);
                if (rc < 0)
                    err_code(err, -rc, "copy %s to %s", sp, p);
                break;
            }
            if (n <= 0) {
                rc = n < 0 ? -errno : -EIO;
                vmsnap_err_set(err, -rc, "copy %s to %s at %llu: %s", sp, p, (unsigned long long)o,
                               n < 0 ? strerror(-rc) : "source ended");
                break;
            }
            left -= (uint64_t)n;
        }
        if (rc == 0 && sync_file_range(fd, (off64_t)offset, (off64_t)len,
                                       SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE |
                                           SYNC_FILE_RANGE_WAIT_AFTER) < 0)
            rc = err_sys(err, "write %s at %llu", p, (unsigned long long)offset);
        if (rc == 0)
            (void)posix_fadvise(fd, (off_t)offset, (off_t)len, POSIX_FADV_DONTNEED);
    }
    if (rc == 0)
        (void)posix_fadvise(sfd, (off_t)src_off, (off_t)len, POSIX_FADV_DONTNEED);
    if (fd >= 0)
        close(fd);
    close(sfd);
    if (rc == 0 && out) {
        out->number = number;
        snprintf(out->etag, sizeof(out->etag), "local");
    }
    free(p);
    free(sp);
    return rc;
}

static int ldel(struct vmsnap_store_conn *c, const char *key, struct vmsnap_err *err)
{
    char *p = store_local_path(c->st, key);
    if (!p)
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    int rc = 0;
    struct stat sb;
    if (lstat(p, &sb) == 0 && !S_ISREG(sb.st_mode))
        rc = vmsnap_err_set(err, EISDIR, "delete %s: not an object", p);
    else if (unlink(p) < 0 && errno != ENOENT && errno != ENOTDIR)
        rc = err_sys(err, "delete %s", p);
    else
        (void)sys_fsync_parent(p, NULL); /* best effort: the unlink itself succeeded */
    free(p);
    return rc;
}

static void ltidy(struct vmsnap_store_conn *c, const char *prefix)
{
    char *p = store_local_path(c->st, prefix);
    if (p && rmdir(p) == 0) /* only when empty */
        (void)sys_fsync_parent(p, NULL);
    free(p);
}

/* Directory walk shared by list and list_uploads. `dirkey` is the key of the directory ("" for
 * the root), `prefix` the full key prefix wanted. */
struct walk {
    struct vmsnap_store_conn *c;
    const struct vmsnap_store *st;
    const char *prefix;
    vmsnap_store_list_fn list_fn;
    vmsnap_store_upload_fn up_fn;
    void *arg;
    struct vmsnap_err *err;
};

/* When the upload whose temporary is `dpath`/`name` started, as far as gc cares: its last write
 * (parts keep a live upload's recent). -1 if it cannot be read. */
static int64_t upload_started(const char *dpath, const char *name)
{
    int fd = open(dpath, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    struct stat sb;
    int r = fstatat(fd, name, &sb, AT_SYMLINK_NOFOLLOW);
    close(fd);
    return r == 0 ? (int64_t)sb.st_mtim.tv_sec : -1;
}

static int walk_dir(struct walk *w, const char *dirkey, int depth)
{
    char *dpath = store_local_path(w->st, dirkey);
    if (!dpath)
        return vmsnap_err_set(w->err, ENOMEM, "out of memory");
    if (depth > MAX_DEPTH) {
        /* not listed, and said: gc and ls then exit 1 rather than miss what is there */
        vlog(VMSNAP_LOG_WARN,
             "not listing %s: more than %d directory levels below the prefix "
             "(skipped)",
             dpath, MAX_DEPTH);
        w->c->list_skipped = true;
        free(dpath);
        return 0;
    }
    struct dirent **ents = NULL;
    int n = scandir(dpath, &ents, NULL, alphasort);
    if (n < 0) {
        int e = errno;
        if (depth > 0 && (e == EACCES || e == EPERM)) {
            /* a directory below the prefix that this user cannot read (another tenant's, a
             * root-owned one): the rest of the listing goes on; the caller learns of it */
            vlog(VMSNAP_LOG_WARN, "cannot list %s: %s (skipped)", dpath, strerror(e));
            w->c->list_skipped = true;
            free(dpath);
            return 0;
        }
        if (e != ENOENT && e != ENOTDIR)
            err_code(w->err, e, "list %s", dpath);
        free(dpath);
        return e == ENOENT || e == ENOTDIR ? 0 : -e;
    }
    size_t plen = strlen(w->prefix);
    int rc = 0;
    for (int i = 0; i < n; i++) {
        const char *name = ents[i]->d_name;
        if (rc < 0 || !strcmp(name, ".") || !strcmp(name, ".."))
            continue;
        bool hidden = name[0] == '.';
        const char *logical = name; /* the key name an upload temp stands for */
        char base[256];
        if (hidden) {
            const char *tag = strstr(name, MPU_TAG);
            if (!w->up_fn || !tag || tag == name + 1 || (size_t)(tag - name - 1) >= sizeof(base))
                continue;
            snprintf(base, sizeof(base), "%.*s", (int)(tag - name - 1), name + 1);
            logical = base;
        }
        size_t kn = strlen(dirkey) + strlen(logical) + 2;
        char *k = malloc(kn);
        if (!k) {
            rc = vmsnap_err_set(w->err, ENOMEM, "out of memory");
            continue;
        }
        snprintf(k, kn, "%s%s%s", dirkey, *dirkey ? "/" : "", logical);
        size_t klen = strlen(k);
        bool match = klen >= plen && !strncmp(k, w->prefix, plen);
        char *full = store_local_path(w->st, k);
        struct stat sb;
        if (!full) {
            rc = vmsnap_err_set(w->err, ENOMEM, "out of memory");
        } else if (hidden) {
            if (match)
                rc = w->up_fn(w->arg, k, name, upload_started(dpath, name));
        } else if (lstat(full, &sb) == 0) {
            if (S_ISDIR(sb.st_mode)) {
                /* descend if some key below could start with the prefix */
                bool could = match || (klen < plen && !strncmp(k, w->prefix, klen) &&
                                       w->prefix[klen] == '/');
                if (could)
                    rc = walk_dir(w, k, depth + 1);
            } else if (S_ISREG(sb.st_mode) && match && w->list_fn) {
                rc = w->list_fn(w->arg, k, (uint64_t)sb.st_size, (int64_t)sb.st_mtim.tv_sec);
            }
        }
        free(full);
        free(k);
    }
    for (int i = 0; i < n; i++)
        free(ents[i]);
    free(ents);
    free(dpath);
    return rc;
}

static int walk_prefix(struct walk *w)
{
    /* start at the deepest directory named entirely by the prefix */
    const char *slash = strrchr(w->prefix, '/');
    size_t dl = slash ? (size_t)(slash - w->prefix) : 0;
    char *dirkey = malloc(dl + 1);
    if (!dirkey)
        return vmsnap_err_set(w->err, ENOMEM, "out of memory");
    memcpy(dirkey, w->prefix, dl);
    dirkey[dl] = '\0';
    int rc = walk_dir(w, dirkey, 0);
    free(dirkey);
    /* a prefix "D/name" is listed from D (keys "D/name2" match it too); when D cannot be read
     * but D/name is a directory that can, list that: what else D holds cannot be read anyway */
    size_t pl = strlen(w->prefix);
    if ((rc == -EACCES || rc == -EPERM) && pl > dl + 1 && w->prefix[pl - 1] != '/') {
        char *p = store_local_path(w->st, w->prefix);
        struct stat sb;
        bool dir = p && stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
        free(p);
        if (dir) {
            vmsnap_err_clear(w->err);
            rc = walk_dir(w, w->prefix, 0);
        }
    }
    return rc;
}

static int llist(struct vmsnap_store_conn *c, const char *prefix, vmsnap_store_list_fn fn,
                 void *arg, struct vmsnap_err *err)
{
    struct walk w = {c, c->st, prefix, fn, NULL, arg, err};
    return walk_prefix(&w);
}

static int llist_uploads(struct vmsnap_store_conn *c, const char *prefix, vmsnap_store_upload_fn fn,
                         void *arg, struct vmsnap_err *err)
{
    struct walk w = {c, c->st, prefix, NULL, fn, arg, err};
    return walk_prefix(&w);
}

const struct store_ops store_local_ops = {
    .put = lput,
    .mpu_create = lmpu_create,
    .mpu_part = lmpu_part,
    .mpu_part_copy = lmpu_part_copy,
    .mpu_complete = lmpu_complete,
    .mpu_abort = lmpu_abort,
    .get = lget,
    .get_stream = lget_stream,
    .get_tail = lget_tail,
    .head = lhead,
    .del = ldel,
    .tidy = ltidy,
    .list = llist,
    .list_uploads = llist_uploads,
};
