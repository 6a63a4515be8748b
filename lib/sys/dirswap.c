/* SPDX-License-Identifier: Apache-2.0 */
/* Replacing several files of a directory all at once (lib/sys/sys.h, struct sys_dir_swap).
 *
 * Renames are atomic one file at a time only, so a pull that renames a set's files into a
 * directory one by one and is killed half way leaves half of each set. Instead the new state of
 * the whole directory is built beside it, in a sibling ".<name>.vmsnap-swap.PID.XXXXXX": a hard
 * link of every entry the directory keeps (anything but the replaced names and the caller's own
 * temporaries), and a hard link of each new file under its final name. One
 * renameat2(RENAME_EXCHANGE) then swaps the two directories: a reader, or a process killed at any
 * moment, sees the old directory or the new one. The old one (now under the sibling name) is
 * removed after. Links, not renames, so that everything the caller had is still where it was
 * whenever the swap cannot be done (the caller then publishes file by file, as before).
 *
 * The swap is refused (-EOPNOTSUPP, nothing changed) where it would change more than the files:
 * a subdirectory in the directory (it cannot be linked), extended attributes on it (default
 * ACLs, labels: a new directory would not have them), an immutable or append-only file in it
 * (its name must stay: the file-by-file publish then fails on it clearly), an owner the caller
 * cannot give the new
 * directory, a mount point (EBUSY), a filesystem without RENAME_EXCHANGE. The new directory gets
 * the old one's mode, owner and group. A sibling left by a killed swap is removed by
 * sys_dir_swap_sweep() (its PID gone and its lock free): before the exchange it holds links
 * only, after it the old files. */
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
#include <time.h>
#include <linux/fs.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#define SWAP_TAG ".vmsnap-swap."

static int split(const char *dir, char *parent, char *base)
{
    char a[PATH_MAX], b[PATH_MAX];
    if (snprintf(a, sizeof(a), "%s", dir) >= (int)sizeof(a) ||
        snprintf(b, sizeof(b), "%s", dir) >= (int)sizeof(b))
        return -ENAMETOOLONG;
    snprintf(parent, PATH_MAX, "%s", dirname(a));
    snprintf(base, NAME_MAX + 1, "%s", basename(b));
    if (!strcmp(base, "/") || !strcmp(base, ".") || !strcmp(base, ".."))
        return -EINVAL;
    return 0;
}

/* Is the regular file `name` immutable or append-only (chattr +i, +a)? Its name in the
 * directory must not change, so neither may the directory (and the old one could not go). */
static bool pinned(int dfd, const char *name)
{
    int fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (fd < 0)
        return false;
    int flags = 0;
    bool pin =
        ioctl(fd, FS_IOC_GETFLAGS, &flags) == 0 && (flags & (FS_IMMUTABLE_FL | FS_APPEND_FL));
    close(fd);
    return pin;
}

/* May the directory open at `dfd` be swapped: no subdirectory, no extended attribute, no
 * immutable or append-only file. */
static int swappable(int dfd, const char *dir, struct vmsnap_err *err)
{
    ssize_t xl = flistxattr(dfd, NULL, 0);
    if (xl > 0)
        return vmsnap_err_set(err, EOPNOTSUPP, "%s has extended attributes", dir);
    int fd = dup(dfd);
    DIR *d = fd < 0 ? NULL : fdopendir(fd);
    if (!d) {
        if (fd >= 0)
            close(fd);
        return err_sys(err, "read directory %s", dir);
    }
    rewinddir(d);
    int rc = 0;
    for (struct dirent *de; rc == 0 && (de = readdir(d));) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        struct stat sb;
        if (fstatat(dfd, de->d_name, &sb, AT_SYMLINK_NOFOLLOW) < 0)
            continue;
        if (S_ISDIR(sb.st_mode))
            rc = vmsnap_err_set(err, EOPNOTSUPP, "%s holds a directory (%s)", dir, de->d_name);
        else if (S_ISREG(sb.st_mode) && pinned(dfd, de->d_name))
            rc = vmsnap_err_set(err, EOPNOTSUPP, "%s/%s is immutable or append-only", dir,
                                de->d_name);
    }
    closedir(d);
    return rc;
}

/* A random suffix for the sibling's name (getrandom: another user cannot guess it). */
static unsigned suffix(void)
{
    unsigned v = 0;
    if (getrandom(&v, sizeof(v), GRND_NONBLOCK) != (ssize_t)sizeof(v))
        v = (unsigned)random() ^ (unsigned)getpid() ^ (unsigned)time(NULL);
    return v & 0xffffff;
}

/* The sibling, made 0700 and locked while it is built; then the old directory's owner, group
 * and mode, and no inherited ACL (a default ACL of the parent would give it one). */
static int make_side(struct sys_dir_swap *s, const char *base, const struct stat *db,
                     struct vmsnap_err *err)
{
    for (int tries = 0;; tries++) {
        snprintf(s->side, sizeof(s->side), ".%.*s" SWAP_TAG "%ld.%06x", NAME_MAX - 40, base,
                 (long)getpid(), suffix());
        if (mkdirat(s->pfd, s->side, 0700) == 0)
            break;
        if (errno != EEXIST || tries > 20)
            return err_sys(err, "make a directory beside %s", s->dir);
    }
    s->made = true;
    struct stat sb;
    if ((s->sfd = openat(s->pfd, s->side, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0 ||
        flock(s->sfd, LOCK_EX | LOCK_NB) < 0)
        return err_sys(err, "open the directory beside %s", s->dir);
    if (fchown(s->sfd, db->st_uid, db->st_gid) < 0 || fchmod(s->sfd, db->st_mode & 07777) < 0 ||
        fstat(s->sfd, &sb) < 0 || sb.st_uid != db->st_uid || sb.st_gid != db->st_gid ||
        (sb.st_mode & 07777) != (db->st_mode & 07777))
        return vmsnap_err_set(err, EOPNOTSUPP,
                              "%s: a new directory cannot get its owner, group and mode", s->dir);
    if (flistxattr(s->sfd, NULL, 0) > 0)
        return vmsnap_err_set(err, EOPNOTSUPP,
                              "%s: a new directory beside it inherits extended attributes (a "
                              "default ACL)",
                              s->dir);
    return 0;
}

int sys_dir_swap_begin(struct sys_dir_swap *s, const char *dir, sys_dir_swap_skip_fn *skip,
                       void *arg, struct vmsnap_err *err)
{
    *s = (struct sys_dir_swap){.dfd = -1, .pfd = -1, .sfd = -1};
    /* the directory's own path, links resolved: a symlink to it or "." is swapped where the
     * directory is, never in the link's place */
    char canon[PATH_MAX], parent[PATH_MAX], base[NAME_MAX + 1];
    int rc = realpath(dir, canon) ? split(canon, parent, base) : -errno;
    if (rc == 0 && snprintf(s->dir, sizeof(s->dir), "%s", canon) >= (int)sizeof(s->dir))
        rc = -ENAMETOOLONG;
    if (rc < 0)
        return err_code(err, -rc, "%s: not a directory a set can be swapped into", dir);
    struct stat db;
    if ((s->pfd = open(parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0) {
        rc = err_sys(err, "open directory %s", parent);
        goto fail;
    }
    if ((s->dfd = openat(s->pfd, base, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0 ||
        fstat(s->dfd, &db) < 0) {
        rc = err_sys(err, "open directory %s", s->dir);
        goto fail;
    }
    s->dev = db.st_dev;
    s->ino = db.st_ino;
    s->mtime = db.st_mtim;
    if ((rc = swappable(s->dfd, s->dir, err)) < 0 || (rc = make_side(s, base, &db, err)) < 0)
        goto fail;
    /* what the directory keeps: every entry the caller does not replace */
    int fd = dup(s->dfd);
    DIR *d = fd < 0 ? NULL : fdopendir(fd);
    if (!d) {
        if (fd >= 0)
            close(fd);
        rc = err_sys(err, "read directory %s", s->dir);
        goto fail;
    }
    rewinddir(d);
    for (struct dirent *de; rc == 0 && (de = readdir(d));) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..") ||
            (skip && skip(de->d_name, arg)))
            continue;
        if (linkat(s->dfd, de->d_name, s->sfd, de->d_name, 0) < 0)
            rc = err_sys(err, "link %s/%s beside it", s->dir, de->d_name);
    }
    closedir(d);
    if (rc < 0)
        goto fail;
    return 0;
fail:
    sys_dir_swap_abort(s);
    return rc;
}

int sys_dir_swap_add(struct sys_dir_swap *s, const char *from, const char *name,
                     struct vmsnap_err *err)
{
    if (linkat(AT_FDCWD, from, s->sfd, name, 0) == 0)
        return 0;
    return err_sys(err, "link %s into the directory beside %s", from, s->dir);
}

int sys_dir_swap_commit(struct sys_dir_swap *s, bool sync, struct vmsnap_err *err)
{
    char base[NAME_MAX + 1], parent[PATH_MAX];
    split(s->dir, parent, base);
    int rc = 0;
    struct stat now;
    if (sync && fsync(s->sfd) < 0)
        rc = err_sys(err, "fsync the directory beside %s", s->dir);
    /* still the directory the new state was built from, unchanged since (an entry made or
     * removed meanwhile would be lost or come back) */
    else if (fstatat(s->pfd, base, &now, AT_SYMLINK_NOFOLLOW) < 0 || now.st_dev != s->dev ||
             now.st_ino != s->ino || fstat(s->dfd, &now) < 0 ||
             now.st_mtim.tv_sec != s->mtime.tv_sec || now.st_mtim.tv_nsec != s->mtime.tv_nsec)
        rc = vmsnap_err_set(err, EAGAIN, "%s changed while the set was put beside it", s->dir);
    sys_failpoint("dir-swap-exchange"); /* the new directory built, the old one in place */
    if (rc == 0 && renameat2(s->pfd, s->side, s->pfd, base, RENAME_EXCHANGE) < 0)
        rc = err_sys(err, "swap %s into place", s->dir);
    if (rc < 0) {
        sys_dir_swap_abort(s); /* nothing in the directory changed */
        return rc;
    }
    s->swapped = true;
    sys_failpoint("dir-swap-exchanged"); /* the new directory in place, the old one beside */
    if (sync && fsync(s->pfd) < 0)
        rc = err_sys(err, "fsync %s (the set is in place, but may not survive a crash)", parent);
    /* the old directory, now the sibling, goes: only when the sibling's name holds it */
    if (fstatat(s->pfd, s->side, &now, AT_SYMLINK_NOFOLLOW) < 0 || now.st_dev != s->dev ||
        now.st_ino != s->ino)
        s->made = false;
    sys_dir_swap_abort(s);
    return rc;
}

void sys_dir_swap_abort(struct sys_dir_swap *s)
{
    char parent[PATH_MAX], base[NAME_MAX + 1], path[PATH_MAX + NAME_MAX + 2];
    if (s->made && split(s->dir, parent, base) == 0 &&
        snprintf(path, sizeof(path), "%s/%s", parent, s->side) < (int)sizeof(path))
        sys_rm_tree(path); /* through descriptors, without following links */
    if (s->sfd >= 0)
        close(s->sfd);
    if (s->dfd >= 0)
        close(s->dfd);
    if (s->pfd >= 0)
        close(s->pfd);
    s->sfd = s->dfd = s->pfd = -1;
    s->made = false;
}

void sys_dir_swap_sweep(const char *dir)
{
    char parent[PATH_MAX], base[NAME_MAX + 1];
    if (split(dir, parent, base) < 0)
        return;
    int pfd = open(parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = pfd < 0 ? NULL : fdopendir(pfd);
    if (!d) {
        if (pfd >= 0)
            close(pfd);
        return;
    }
    char prefix[NAME_MAX + 64];
    int pl = snprintf(prefix, sizeof(prefix), ".%.*s" SWAP_TAG, NAME_MAX - 40, base);
    for (struct dirent *de; (de = readdir(d));) {
        long pid = 0;
        unsigned rnd = 0;
        char tail = 0;
        if (strncmp(de->d_name, prefix, (size_t)pl) ||
            sscanf(de->d_name + pl, "%ld.%6x%c", &pid, &rnd, &tail) != 2 || pid <= 0 ||
            pid == (long)getpid() || kill((pid_t)pid, 0) == 0 || errno != ESRCH)
            continue;
        struct stat sb;
        if (fstatat(dirfd(d), de->d_name, &sb, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISDIR(sb.st_mode) ||
            sb.st_uid != geteuid())
            continue;
        /* a swap in another PID namespace looks dead from here: its lock says it is not */
        int fd = openat(dirfd(d), de->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        bool free_ = fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) == 0;
        if (fd >= 0)
            close(fd);
        if (!free_)
            continue;
        char path[PATH_MAX];
        if (snprintf(path, sizeof(path), "%s/%s", parent, de->d_name) < (int)sizeof(path))
            sys_rm_tree(path);
    }
    closedir(d);
}
