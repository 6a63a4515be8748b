/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Walking trees for stat, evict and release: the preserve set (device+inode pairs, and the paths
 * resolved again before a removal) and the walker itself, which never follows a symlink and
 * never leaves the mount of its root. Uses nothing else of the module.
 */
#include "pcache_int.h"

#include <errno.h>
#include <fcntl.h>
#include <dirent.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void pcache_preserve_fini(struct preserve_set *ps)
{
    for (size_t i = 0; ps->path && i < ps->n; i++)
        free(ps->path[i]);
    free(ps->path);
    free(ps->v);
    ps->path = NULL;
    ps->v = NULL;
    ps->n = 0;
}

static bool in_set(const struct devino *v, size_t n, dev_t dev, ino_t ino)
{
    for (size_t i = 0; i < n; i++)
        if (v[i].dev == dev && v[i].ino == ino)
            return true;
    return false;
}

/* Resolve the preserved paths (`base`/name when base is not NULL) to device+inode pairs. */
int pcache_preserve_init(struct preserve_set *ps, const char *base, const char *const *paths,
                         struct vmsnap_err *err)
{
    ps->v = NULL;
    ps->path = NULL;
    ps->n = 0;
    if (!paths)
        return 0;
    size_t n = 0;
    while (paths[n])
        n++;
    if (n == 0)
        return 0;
    ps->v = calloc(n, sizeof(*ps->v));
    ps->path = calloc(n, sizeof(*ps->path));
    if (!ps->v || !ps->path) {
        pcache_preserve_fini(ps);
        return vmsnap_err_set(err, ENOMEM, "pcache: out of memory");
    }
    for (size_t i = 0; i < n; i++) {
        char buf[PATH_MAX];
        const char *p = paths[i];
        if (base && p[0] != '/') {
            if ((size_t)snprintf(buf, sizeof(buf), "%s/%s", base, p) >= sizeof(buf)) {
                pcache_preserve_fini(ps);
                return vmsnap_err_set(err, ENAMETOOLONG, "preserve %s/%s: path too long", base, p);
            }
            p = buf;
        }
        struct stat sb;
        if (stat(p, &sb) != 0) {
            int e = errno;
            pcache_preserve_fini(ps);
            return err_code(err, e, "preserve %s", p);
        }
        if (!(ps->path[ps->n] = strdup(p))) {
            pcache_preserve_fini(ps);
            return vmsnap_err_set(err, ENOMEM, "pcache: out of memory");
        }
        ps->v[ps->n++] = (struct devino){sb.st_dev, sb.st_ino};
    }
    return 0;
}

/* Whether `path` or a directory above it is preserved (for the roots of a walk). */
static bool root_preserved(const struct preserve_set *ps, const char *path)
{
    if (!ps || ps->n == 0)
        return false;
    char *real = realpath(path, NULL);
    if (!real)
        return false;
    bool found = false;
    for (;;) {
        struct stat sb;
        if (stat(real[0] ? real : "/", &sb) == 0 && in_set(ps->v, ps->n, sb.st_dev, sb.st_ino)) {
            found = true;
            break;
        }
        char *slash = strrchr(real, '/');
        if (!slash || !real[0])
            break;
        *slash = '\0';
    }
    free(real);
    return found;
}

/* Whether the file `sb` (`name` in the directory `dfd`) is, right now, at a preserved path or
 * under one. The device+inode pairs are taken when the walk starts; a checkpoint writer may since
 * have renamed a new file or directory onto a preserved path (its usual temporary + rename), and
 * that one must not be removed either: so the paths are resolved again just before a removal. */
bool pcache_preserved_now(const struct preserve_set *ps, int dfd, const struct stat *sb)
{
    if (!ps || ps->n == 0)
        return false;
    char fdp[64], dir[PATH_MAX];
    snprintf(fdp, sizeof(fdp), "/proc/self/fd/%d", dfd);
    ssize_t k = readlink(fdp, dir, sizeof(dir) - 1);
    bool have_dir = k > 0 && dir[0] == '/';
    if (have_dir)
        dir[k] = '\0';
    for (size_t i = 0; i < ps->n; i++) {
        struct stat now;
        if (stat(ps->path[i], &now) == 0 && pcache_same_inode(&now, sb))
            return true;
        char *real = have_dir ? realpath(ps->path[i], NULL) : NULL;
        if (!real)
            continue;
        size_t rl = strlen(real);
        bool under = !strncmp(dir, real, rl) && (dir[rl] == '\0' || dir[rl] == '/' || rl == 1);
        free(real);
        if (under)
            return true;
    }
    return false;
}

/* Record a per-file failure ("OP PATH: WHATstrerror"): the first goes to `err` and is returned
 * at the end of the walk, later ones are logged. */
void pcache_note_err(int *first, struct vmsnap_err *err, int code, const char *op, const char *path,
                     const char *what)
{
    if (*first == 0)
        *first = vmsnap_err_set(err, code, "%s %s: %s%s", op, path, what, strerror(code));
    else
        vlog(VMSNAP_LOG_WARN, "%s %s: %s%s", op, path, what, strerror(code));
}

/* Open `name` in the directory `dfd`, never following a symlink and never blocking (a FIFO, a
 * lease held elsewhere). */
int pcache_open_at(int dfd, const char *name, int flags)
{
    flags |= O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY;
    int fd = openat(dfd, name, flags | O_NOATIME);
    if (fd < 0 && errno == EPERM) /* O_NOATIME needs ownership */
        fd = openat(dfd, name, flags);
    return fd;
}

/*
 * The walker. Every directory is opened relative to its parent's descriptor with O_NOFOLLOW, so
 * a name swapped for a symlink during the walk is never followed, and every file is opened,
 * checked and removed relative to its directory's descriptor. The walk never leaves the mount
 * of its root: a directory on another mount (another file system, or a bind mount of the same
 * one, which has the same st_dev) is reported and not entered. Mounts are told apart by statx's
 * mount id (Linux 5.8+); without it, by st_dev plus the mount points listed in
 * /proc/self/mountinfo (matched by device+inode), and a staged walk that can read neither enters
 * no subdirectory at all.
 */

static atomic_bool force_mountinfo;

void pcache_force_mountinfo(bool on)
{
    atomic_store(&force_mountinfo, on);
}

static int mount_id(int fd, uint64_t *id)
{
    if (atomic_load(&force_mountinfo))
        return -ENOSYS;
    struct statx sx;
    if (statx(fd, "", AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW, STATX_MNT_ID, &sx) != 0)
        return -errno;
    if (!(sx.stx_mask & STATX_MNT_ID))
        return -ENOSYS;
    *id = sx.stx_mnt_id;
    return 0;
}

void pcache_walk_fini(struct walk *w)
{
    free(w->mpoints);
    free(w->path);
}

static int path_set(struct walk *w, size_t at, const char *name)
{
    size_t n = strlen(name), need = at + 1 + n + 1;
    if (grow_array(&w->path, &w->cap, need, 1, need) < 0)
        return -ENOMEM;
    size_t len = at;
    if (at > 0 && w->path[at - 1] != '/')
        w->path[len++] = '/';
    memcpy(w->path + len, name, n + 1);
    w->len = len + n;
    return 0;
}

/* Decode the octal escapes (\040) of a mountinfo field in place. */
static void unescape(char *s)
{
    char *o = s;
    for (char *p = s; *p; p++) {
        if (p[0] == '\\' && p[1] >= '0' && p[1] <= '3' && p[2] >= '0' && p[2] <= '7' &&
            p[3] >= '0' && p[3] <= '7') {
            *o++ = (char)((p[1] - '0') * 64 + (p[2] - '0') * 8 + (p[3] - '0'));
            p += 3;
        } else {
            *o++ = *p;
        }
    }
    *o = '\0';
}

/* The mount points on the root's device, for kernels without statx mount ids. */
static int load_mount_points(struct walk *w)
{
    FILE *f = fopen("/proc/self/mountinfo", "re");
    if (!f)
        return -errno;
    char *line = NULL;
    size_t lcap = 0, cap = 0;
    int rc = 0;
    while (getline(&line, &lcap, f) > 0) {
        /* ID PARENT MAJ:MIN ROOT MOUNTPOINT ... */
        char *p = line;
        for (int i = 0; i < 4 && p; i++) {
            p = strchr(p, ' ');
            if (p)
                p++;
        }
        if (!p)
            continue;
        p[strcspn(p, " \n")] = '\0';
        unescape(p);
        struct stat sb;
        if (stat(p, &sb) != 0 || !S_ISDIR(sb.st_mode) || sb.st_dev != w->root_dev)
            continue;
        if ((rc = grow_array(&w->mpoints, &cap, w->nmpoints + 1, sizeof(*w->mpoints), 16)) < 0)
            break;
        w->mpoints[w->nmpoints++] = (struct devino){sb.st_dev, sb.st_ino};
    }
    free(line);
    fclose(f);
    return rc;
}

static void mount_init(struct walk *w, int dfd, const struct stat *sb)
{
    w->root_dev = sb->st_dev;
    if (mount_id(dfd, &w->root_mnt) == 0) {
        w->mnt_mode = MNT_ID;
        return;
    }
    int rc = load_mount_points(w);
    w->mnt_mode = rc == 0 ? MNT_MOUNTINFO : MNT_DEV_ONLY;
    const char *how = rc == 0            ? "bind mounts found through /proc/self/mountinfo"
                      : w->strict_mounts ? "nor /proc/self/mountinfo: subdirectories not entered"
                                         : "nor /proc/self/mountinfo: bind mounts not detected";
    vlog(rc == 0 ? VMSNAP_LOG_DEBUG : VMSNAP_LOG_WARN, "%s %s: statx gives no mount id; %s", w->op,
         w->path, how);
}

/* Whether the directory open at `fd` is on the root's mount. */
static bool on_root_mount(struct walk *w, int fd, const struct stat *sb)
{
    if (sb->st_dev != w->root_dev)
        return false;
    uint64_t id;
    switch (w->mnt_mode) {
    case MNT_ID:
        return mount_id(fd, &id) == 0 && id == w->root_mnt;
    case MNT_MOUNTINFO:
        return !in_set(w->mpoints, w->nmpoints, sb->st_dev, sb->st_ino);
    default:
        return !w->strict_mounts;
    }
}

static void walk_dir(struct walk *w, int dfd, bool preserved)
{
    DIR *d = fdopendir(dfd);
    if (!d) {
        pcache_note_err(&w->first, w->err, errno, w->op, w->path, "opendir: ");
        close(dfd);
        return;
    }
    size_t at = w->len;
    for (;;) {
        errno = 0;
        struct dirent *de = readdir(d);
        if (!de) {
            if (errno != 0)
                pcache_note_err(&w->first, w->err, errno, w->op, w->path, "readdir: ");
            break;
        }
        const char *name = de->d_name;
        if (strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
            continue;
        if (path_set(w, at, name) < 0) {
            pcache_note_err(&w->first, w->err, ENOMEM, w->op, w->path, "");
            break;
        }
        struct stat sb;
        if (fstatat(dfd, name, &sb, AT_SYMLINK_NOFOLLOW) != 0) {
            if (errno != ENOENT)
                pcache_note_err(&w->first, w->err, errno, w->op, w->path, "");
            continue;
        }
        bool pres = preserved || (w->ps && in_set(w->ps->v, w->ps->n, sb.st_dev, sb.st_ino));
        if (S_ISREG(sb.st_mode)) {
            if (w->file(w, dfd, name, &sb, pres) < 0)
                w->stopped = true;
        } else if (S_ISDIR(sb.st_mode)) {
            int cfd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            struct stat csb;
            if (cfd < 0) {
                /* gone, or swapped for a symlink or a file meanwhile: not ours to follow */
                if (errno != ENOENT && errno != ENOTDIR && errno != ELOOP)
                    pcache_note_err(&w->first, w->err, errno, w->op, w->path, "open: ");
            } else if (fstat(cfd, &csb) != 0 || !pcache_same_inode(&csb, &sb)) {
                close(cfd);
            } else if (!on_root_mount(w, cfd, &csb)) {
                close(cfd);
                w->skipped_mounts++;
                vlog(w->strict_mounts ? VMSNAP_LOG_WARN : VMSNAP_LOG_INFO,
                     "%s %s: on another mount (a bind mount or another file system); not entered",
                     w->op, w->path);
            } else {
                walk_dir(w, cfd, pres); /* takes cfd; leaves w->path naming this directory */
                if (w->dir_done && !w->stopped)
                    w->dir_done(w, dfd, name, &csb, pres);
            }
        }
        /* Anything else (symlinks, FIFOs, devices, sockets) inside a tree is skipped. */
        if (w->stopped)
            break;
    }
    w->len = at;
    w->path[at] = '\0';
    closedir(d);
}

/* Walk `path`: a directory, or a regular file. The root is opened once (O_PATH, with O_NOFOLLOW
 * unless w->follow_root) and everything else is reached from that descriptor. */
int pcache_walk_root(struct walk *w, const char *path)
{
    /* Trailing slashes (and "/." components) would make the kernel follow a symlink despite
     * O_NOFOLLOW: "lnk/." is the directory lnk points to. */
    char *p = strdup(path);
    if (!p)
        return vmsnap_err_set(w->err, ENOMEM, "%s %s: out of memory", w->op, path);
    size_t n = strlen(p);
    for (;;) {
        if (n > 1 && p[n - 1] == '/')
            p[--n] = '\0';
        else if (n > 2 && p[n - 1] == '.' && p[n - 2] == '/')
            p[n -= 2] = '\0';
        else
            break;
    }
    const char *last = strrchr(p, '/');
    last = last ? last + 1 : p;
    if (!w->follow_root && !strcmp(last, "..")) {
        free(p);
        return vmsnap_err_set(w->err, EINVAL,
                              "%s %s: a staged walk takes a directory by its own name, not '..' "
                              "(which may be reached through a symbolic link)",
                              w->op, path);
    }
    int rc = path_set(w, 0, p);
    int pfd = -1, dfd = -1;
    char *real = NULL;
    if (rc < 0) {
        rc = vmsnap_err_set(w->err, ENOMEM, "%s %s: out of memory", w->op, path);
        goto out;
    }
    pfd = open(w->follow_root ? path : p, O_PATH | O_CLOEXEC | (w->follow_root ? 0 : O_NOFOLLOW));
    struct stat sb;
    if (pfd < 0 || fstat(pfd, &sb) != 0) {
        rc = err_sys(w->err, "%s %s", w->op, path);
        goto out;
    }
    if (S_ISLNK(sb.st_mode)) {
        rc = vmsnap_err_set(w->err, ELOOP,
                            "%s %s: is a symbolic link, which a staged walk does not follow "
                            "(give the directory it points to)",
                            w->op, path);
    } else if (S_ISDIR(sb.st_mode)) {
        dfd = openat(pfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        struct stat dsb;
        if (dfd < 0 || fstat(dfd, &dsb) != 0) {
            rc = err_sys(w->err, "%s %s", w->op, path);
            goto out;
        }
        bool preserved = root_preserved(w->ps, p);
        mount_init(w, dfd, &dsb);
        walk_dir(w, dfd, preserved); /* takes dfd */
        dfd = -1;
        if (w->dir_done && !w->stopped)
            w->dir_done(w, -1, p, &dsb, preserved);
        rc = w->first;
    } else if (w->dir_only) {
        rc = vmsnap_err_set(w->err, ENOTDIR, "%s %s: not a directory", w->op, path);
    } else if (S_ISREG(sb.st_mode)) {
        /* Reach the file as a name in its directory, like the files of a tree. The final
         * component is the file itself (O_NOFOLLOW above) or, when following, its target. */
        const char *file = p;
        if (w->follow_root) {
            real = realpath(path, NULL);
            if (!real) {
                rc = err_sys(w->err, "%s %s", w->op, path);
                goto out;
            }
            file = real;
        }
        char *slash = strrchr(file, '/');
        const char *base = slash ? slash + 1 : file;
        char *dir = slash ? strndup(file, slash == file ? 1 : (size_t)(slash - file)) : NULL;
        errno = ENOMEM;
        dfd = slash && !dir ? -1 : open(slash ? dir : ".", O_PATH | O_DIRECTORY | O_CLOEXEC);
        int e = errno;
        free(dir);
        struct stat fsb;
        if (dfd < 0) {
            rc = err_code(w->err, e, "%s %s: parent directory", w->op, path);
        } else if (fstatat(dfd, base, &fsb, AT_SYMLINK_NOFOLLOW) != 0 ||
                   !pcache_same_inode(&fsb, &sb)) {
            rc = vmsnap_err_set(w->err, EAGAIN, "%s %s: replaced while being opened; try again",
                                w->op, path);
        } else {
            w->file(w, dfd, base, &fsb, root_preserved(w->ps, file));
            rc = w->first;
        }
    } else {
        rc = vmsnap_err_set(w->err, EINVAL, "%s %s: not a regular file or directory", w->op, path);
    }
out:
    if (dfd >= 0)
        close(dfd);
    if (pfd >= 0)
        close(pfd);
    free(real);
    free(p);
    return rc;
}
