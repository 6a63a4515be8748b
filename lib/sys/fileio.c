/* SPDX-License-Identifier: Apache-2.0 */
/* Whole-buffer I/O and atomically published files. */
#include "sys/sys.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

ssize_t sys_pread_full(int fd, void *buf, size_t len, uint64_t off)
{
    size_t done = 0;
    while (done < len) {
        ssize_t n = pread(fd, (char *)buf + done, len - done, (off_t)(off + done));
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        if (n == 0)
            break;
        done += (size_t)n;
    }
    return (ssize_t)done;
}

/* write(2) or, with `off`, pwrite(2) of the whole buffer (EINTR retried, a zero write an EIO) */
static int write_all(int fd, const void *buf, size_t len, const uint64_t *off)
{
    size_t done = 0;
    while (done < len) {
        const char *p = (const char *)buf + done;
        ssize_t n =
            off ? pwrite(fd, p, len - done, (off_t)(*off + done)) : write(fd, p, len - done);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        if (n == 0)
            return -EIO;
        done += (size_t)n;
    }
    return 0;
}

int sys_pwrite_full(int fd, const void *buf, size_t len, uint64_t off)
{
    return write_all(fd, buf, len, &off);
}

int sys_write_full(int fd, const void *buf, size_t len)
{
    return write_all(fd, buf, len, NULL);
}

void sys_sleep_ms(unsigned ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

unsigned sys_cpus(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (unsigned)n : 1;
}

/* Only a regular file (or nothing) is replaced: a rename over a device node, a FIFO or a
 * symbolic link put a file in its place (`pack IMG /dev/null` as root replaced /dev/null), and
 * one over a directory failed only after all the work. */
int sys_check_replaceable(const char *path, struct vmsnap_err *err)
{
    struct stat sb;
    if (lstat(path, &sb) < 0 || S_ISREG(sb.st_mode))
        return 0;
    const char *what = S_ISDIR(sb.st_mode)    ? "a directory"
                       : S_ISLNK(sb.st_mode)  ? "a symbolic link"
                       : S_ISFIFO(sb.st_mode) ? "a FIFO"
                       : S_ISSOCK(sb.st_mode) ? "a socket"
                                              : "a device";
    return vmsnap_err_set(err, S_ISDIR(sb.st_mode) ? EISDIR : EEXIST,
                          "%s is %s, not a file: not replaced (name a regular file or a new one)",
                          path, what);
}

int sys_atomic_open(struct sys_atomic_file *af, const char *path, mode_t mode,
                    struct vmsnap_err *err)
{
    return sys_atomic_open_tagged(af, path, mode, NULL, err);
}

int sys_atomic_open_tagged(struct sys_atomic_file *af, const char *path, mode_t mode,
                           const char *tag, struct vmsnap_err *err)
{
    af->fd = -1;
    af->path = af->tmp = NULL;
    int crc = sys_check_replaceable(path, err);
    if (crc < 0)
        return crc;
    af->path = strdup(path);
    size_t n = strlen(path) + 64 + (tag ? strlen(tag) : 0);
    af->tmp = malloc(n);
    if (!af->path || !af->tmp) {
        free(af->path);
        free(af->tmp);
        af->path = af->tmp = NULL;
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    }
    /* Hidden temporary name in the same directory so rename is atomic. */
    char *dup = strdup(path);
    if (!dup) {
        sys_atomic_abort(af);
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    }
    char *dup2 = strdup(path);
    if (!dup2) {
        free(dup);
        sys_atomic_abort(af);
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    }
    const char *dir = dirname(dup);
    const char *base = basename(dup2);
    /* ".NAME.XXXXXX" shows whose temporary it is; a name too long for that (NAME_MAX 255
     * with the 8 bytes added) gets a generic one */
    if (tag) /* ".vmsnap-TAG.PID.XXXXXX": whose it is, for a clean-up after a kill */
        snprintf(af->tmp, n, "%s/.vmsnap-%s.%ld.XXXXXX", dir, tag, (long)getpid());
    else if (strlen(base) + 8 <= NAME_MAX)
        snprintf(af->tmp, n, "%s/.%s.XXXXXX", dir, base);
    else
        snprintf(af->tmp, n, "%s/.vmsnap-tmp.XXXXXX", dir);
    free(dup2);
    free(dup);
    af->fd = mkostemp(af->tmp, O_CLOEXEC);
    if (af->fd < 0) {
        int e = errno;
        sys_atomic_abort(af);
        return err_code(err, e, "create temporary file for %s", path);
    }
    /* a tagged temporary is locked while its writer lives: a clean-up from another PID
     * namespace (a directory shared between containers) cannot take it for a dead one's */
    if (tag)
        (void)flock(af->fd, LOCK_EX | LOCK_NB);
    if (fchmod(af->fd, mode) < 0) {
        int e = errno;
        sys_atomic_abort(af);
        return err_code(err, e, "chmod %s", path);
    }
    return 0;
}

int sys_fsync_parent(const char *path, struct vmsnap_err *err)
{
    char *dup = strdup(path);
    if (!dup)
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    int dfd = open(dirname(dup), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    int rc = 0;
    if (dfd < 0 || fsync(dfd) < 0)
        rc = err_sys(err, "fsync directory of %s", path);
    if (dfd >= 0)
        close(dfd);
    free(dup);
    return rc;
}

int sys_atomic_close(struct sys_atomic_file *af, struct vmsnap_err *err)
{
    if (af->fd < 0)
        return 0;
    int rc = close(af->fd) < 0 ? err_sys(err, "close %s", af->path) : 0;
    af->fd = -1;
    return rc;
}

int sys_atomic_commit(struct sys_atomic_file *af, bool sync, struct vmsnap_err *err)
{
    return sys_atomic_commit_ex(af, sync, false, err);
}

/* Put the temporary at the final path without replacing anything there: renameat2's
 * RENAME_NOREPLACE, or where the filesystem lacks it a hard link (which fails on an existing
 * name too) and the temporary's unlink. */
static int rename_noreplace(const char *tmp, const char *path)
{
    if (renameat2(AT_FDCWD, tmp, AT_FDCWD, path, RENAME_NOREPLACE) == 0)
        return 0;
    if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP)
        return -1;
    if (link(tmp, path) < 0)
        return -1;
    (void)unlink(tmp);
    return 0;
}

int sys_atomic_commit_ex(struct sys_atomic_file *af, bool sync, bool noreplace,
                         struct vmsnap_err *err)
{
    int rc = 0;
    if (sync && af->fd >= 0 && fsync(af->fd) < 0) {
        rc = err_sys(err, "fsync %s", af->path);
        goto fail;
    }
    if ((rc = sys_atomic_close(af, err)) < 0)
        goto fail;
    if ((rc = sys_check_replaceable(af->path, err)) < 0) /* (one put there meanwhile) */
        goto fail;
    if (noreplace && rename_noreplace(af->tmp, af->path) < 0) {
        rc = errno == EEXIST ? vmsnap_err_set(err, EEXIST,
                                              "%s appeared while this ran (not replaced; the "
                                              "result is discarded)",
                                              af->path)
                             : err_sys(err, "rename %s to %s", af->tmp, af->path);
        goto fail;
    }
    if (!noreplace && rename(af->tmp, af->path) < 0) {
        rc = err_sys(err, "rename %s to %s", af->tmp, af->path);
        goto fail;
    }
    free(af->tmp);
    af->tmp = NULL;
    if (sync && (rc = sys_fsync_parent(af->path, err)) < 0)
        vmsnap_err_wrap(err, "%s is in place, but may not survive a crash: ", af->path);
    free(af->path);
    af->path = NULL;
    return rc;
fail:
    sys_atomic_abort(af);
    return rc;
}

void sys_atomic_forget(struct sys_atomic_file *af)
{
    if (af->fd >= 0)
        close(af->fd);
    af->fd = -1;
    free(af->tmp);
    af->tmp = NULL;
    free(af->path);
    af->path = NULL;
}

void sys_atomic_abort(struct sys_atomic_file *af)
{
    if (af->fd >= 0)
        close(af->fd);
    af->fd = -1;
    if (af->tmp) {
        unlink(af->tmp);
        free(af->tmp);
    }
    af->tmp = NULL;
    free(af->path);
    af->path = NULL;
}

bool sys_same_file(int fd, const char *path)
{
    struct stat a, b;
    return fstat(fd, &a) == 0 && stat(path, &b) == 0 && a.st_dev == b.st_dev &&
           a.st_ino == b.st_ino;
}

/* Remove `name` in the directory open at `pfd` (see sys_rm_tree). */
static int rm_at(int pfd, const char *name, int depth)
{
    struct stat st;
    if (fstatat(pfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
        return errno == ENOENT ? 0 : -errno;
    if (!S_ISDIR(st.st_mode))
        return unlinkat(pfd, name, 0) == 0 || errno == ENOENT ? 0 : -errno;
    if (depth >= 128) /* deeper than any tree vmsnap makes: not left half removed silently */
        return -ELOOP;
    int fd = openat(pfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0 && (errno == ELOOP || errno == ENOTDIR)) {
        /* replaced by a link or a file since: the name itself goes */
        return unlinkat(pfd, name, 0) == 0 || errno == ENOENT ? 0 : -errno;
    }
    if (fd < 0)
        return errno == ENOENT ? 0 : -errno;
    DIR *d = fdopendir(fd);
    if (!d) {
        int e = errno;
        close(fd);
        return -e;
    }
    int rc = 0;
    for (struct dirent *de; (de = readdir(d));) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        int r = rm_at(dirfd(d), de->d_name, depth + 1);
        if (r < 0 && rc == 0)
            rc = r;
    }
    closedir(d);
    int r = unlinkat(pfd, name, AT_REMOVEDIR);
    if (r < 0 && errno == ENOTDIR) /* moved away and replaced meanwhile: the replacement goes */
        r = unlinkat(pfd, name, 0);
    if (r < 0 && errno != ENOENT && rc == 0)
        rc = -errno;
    return rc;
}

int sys_rm_tree(const char *path)
{
    char dir[PATH_MAX], base[PATH_MAX];
    if (snprintf(dir, sizeof(dir), "%s", path) >= (int)sizeof(dir) ||
        snprintf(base, sizeof(base), "%s", path) >= (int)sizeof(base))
        return -ENAMETOOLONG;
    const char *b = basename(base);
    if (!strcmp(b, "/") || !strcmp(b, ".") || !strcmp(b, ".."))
        return -EINVAL;
    int pfd = open(dirname(dir), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (pfd < 0)
        return errno == ENOENT ? 0 : -errno;
    int rc = rm_at(pfd, b, 0);
    close(pfd);
    return rc;
}

int sys_canon_path(const char *path, char *out)
{
    char head[PATH_MAX];
    if (!path || !*path)
        return -EINVAL;
    if (snprintf(head, sizeof(head), "%s", path) >= (int)sizeof(head))
        return -ENAMETOOLONG;
    /* strip trailing components until what is left resolves; they are appended back */
    size_t len = strlen(head);
    const char *tail[PATH_MAX / 2];
    size_t nt = 0;
    bool cwd = false; /* every component was stripped: resolve the working directory */
    for (;;) {
        while (!cwd && len > 1 && head[len - 1] == '/')
            head[--len] = '\0';
        if (realpath(cwd ? "." : head, out))
            break;
        if (cwd)
            return -errno;
        if (errno != ENOENT)
            return -errno;
        char *slash = strrchr(head, '/');
        const char *comp = slash ? slash + 1 : head;
        if (!strcmp(comp, ".."))
            return -EINVAL;
        if (*comp && strcmp(comp, ".") && nt < sizeof(tail) / sizeof(tail[0]))
            tail[nt++] = comp;
        if (!slash) {
            cwd = true; /* head keeps the component's bytes: tail points into it */
        } else if (slash == head) {
            len = 1;
            head[1] = '\0';
        } else {
            *slash = '\0';
            len = (size_t)(slash - head);
        }
    }
    size_t o = strlen(out);
    while (nt > 0) {
        const char *comp = tail[--nt];
        int w = snprintf(out + o, PATH_MAX - o, "%s%s", o > 1 ? "/" : "", comp);
        if (w < 0 || (size_t)w >= PATH_MAX - o)
            return -ENAMETOOLONG;
        o += (size_t)w;
    }
    return 0;
}

int sys_lexical_path(const char *path, char *out, size_t len)
{
    char buf[PATH_MAX];
    if (path[0] != '/') {
        char cwd[PATH_MAX];
        if (!getcwd(cwd, sizeof(cwd)))
            return -errno;
        if (snprintf(buf, sizeof(buf), "%s/%s", cwd, path) >= (int)sizeof(buf))
            return -ENAMETOOLONG;
        path = buf;
    }
    if (len < 2)
        return -ENAMETOOLONG;
    size_t o = 0;
    out[0] = '\0';
    for (const char *p = path; *p;) {
        while (*p == '/')
            p++;
        size_t n = strcspn(p, "/");
        if (n == 0)
            break;
        if (n == 2 && p[0] == '.' && p[1] == '.') {
            while (o > 0 && out[o - 1] != '/')
                o--;
            if (o > 0)
                o--;
            out[o] = '\0';
        } else if (!(n == 1 && p[0] == '.')) {
            if (o + n + 2 > len)
                return -ENAMETOOLONG;
            out[o++] = '/';
            memcpy(out + o, p, n);
            o += n;
            out[o] = '\0';
        }
        p += n;
    }
    if (o == 0)
        snprintf(out, len, "/");
    return 0;
}

void sys_failpoint(const char *name)
{
    const char *f = getenv("VMSNAP_FAILPOINT");
    size_t nl = strlen(name);
    if (f && !strcmp(f, name))
        raise(SIGKILL);
    if (f && !strncmp(f, name, nl) && !strcmp(f + nl, ":stop")) {
        raise(SIGSTOP);
        struct timespec ts = {0, 200 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}
