/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Page-cache hygiene: stat (cachestat, mincore fallback), preserve and staged eviction, release of
 * a restore directory.
 *
 * Why per-chunk: a preserved file may be partly dirty (a disk image with recent writes, an image
 * whose writeback is under way). DONTNEED on a range holding dirty pages starts writeback there and
 * drops nothing, but on a clean range it only drops, so the file is examined in 16 MiB chunks and
 * every chunk that cachestat shows free of dirty and writeback pages is dropped. A file with no
 * dirty page at all takes one cachestat and one fadvise.
 *
 * Why truncate on the staged path: unlink alone keeps the inode (and its dirty pages, which may
 * then be written back) while anything holds it open; truncation drops the pages without writeback
 * at once. Why unlink first: only an inode with no link left is certainly ours alone (nothing can
 * link it again), so the link count is read after the unlink, and the file is truncated only at 0.
 */
#include "pcache_int.h"

#include "sys/sys.h"

#include <errno.h>
#include <fcntl.h>
#include <dirent.h>
#include <limits.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef __NR_cachestat
#define __NR_cachestat 451 /* the same number on every architecture */
#endif

/* The kernel's uapi structures (include/uapi/linux/mman.h), defined here because Debian 12's
 * headers predate them. */
struct cs_range {
    uint64_t off;
    uint64_t len;
};
struct cs_result {
    uint64_t nr_cache;
    uint64_t nr_dirty;
    uint64_t nr_writeback;
    uint64_t nr_evicted;
    uint64_t nr_recently_evicted;
};

#define CHUNK (16ull << 20)
#define MINCORE_WINDOW (256ull << 20)

/* 0: not known yet, 1: works, -errno: unavailable for the rest of the process. */
static atomic_int cs_state;
static atomic_flag logged_unavailable = ATOMIC_FLAG_INIT;
static atomic_flag logged_other = ATOMIC_FLAG_INIT;
static atomic_flag logged_lease = ATOMIC_FLAG_INIT;

void pcache_reset_probe(void)
{
    atomic_store(&cs_state, 0);
    atomic_flag_clear(&logged_unavailable);
    atomic_flag_clear(&logged_other);
    atomic_flag_clear(&logged_lease);
}

static uint32_t page_size(void)
{
    long ps = sysconf(_SC_PAGESIZE);
    return ps > 0 ? (uint32_t)ps : 4096u;
}

/* cachestat on a file of this process's own (a memfd: it owns and may write it): 0 when the
 * call works at all, -errno when not (not in this kernel; denied, by a seccomp filter). */
static int cachestat_probe(void)
{
    int fd = memfd_create("vmsnap-cachestat-probe", MFD_CLOEXEC);
    if (fd < 0)
        return -errno;
    struct cs_range range = {0, 0};
    struct cs_result cs = {0};
    int rc = syscall(__NR_cachestat, fd, &range, &cs, 0) == 0 ? 0 : -errno;
    close(fd);
    return rc;
}

/* cachestat does not work in this process (`e`: ENOSYS, EPERM): off for good, said once. */
static void cachestat_off(int e)
{
    atomic_store(&cs_state, -e);
    if (!atomic_flag_test_and_set(&logged_unavailable))
        vlog(VMSNAP_LOG_WARN,
             "cachestat: %s: page-cache eviction of preserved files disabled (stat falls "
             "back to mincore; staged truncation still works)",
             e == ENOSYS ? "not supported by this kernel (needs Linux 6.5+)"
                         : "denied (seccomp filter?)");
}

int pcache_cachestat(int fd, uint64_t off, uint64_t len, struct vmsnap_pcache_stat *st)
{
    int state = atomic_load(&cs_state);
    if (state < 0)
        return state;
    struct cs_range range = {off, len};
    struct cs_result cs = {0};
    if (syscall(__NR_cachestat, fd, &range, &cs, 0) != 0) {
        int e = errno;
        /* EPERM is also the kernel's answer for a file the caller neither owns nor may write
         * (Linux 6.10+): that file's alone, unless the call fails on a file of our own too.
         * One such file used to turn eviction off for the rest of the process. */
        if (e == EPERM && (state > 0 || cachestat_probe() == 0)) {
            atomic_store(&cs_state, 1);
            if (!atomic_flag_test_and_set(&logged_other))
                vlog(VMSNAP_LOG_WARN,
                     "cachestat: not permitted on a file this user neither owns nor may write: "
                     "its page cache is left (skipped)");
            return -e;
        }
        if (e == ENOSYS || e == EPERM) {
            cachestat_off(e);
        } else if (!atomic_flag_test_and_set(&logged_other)) {
            vlog(VMSNAP_LOG_WARN, "cachestat: %s: skipping page-cache eviction of such files",
                 strerror(e));
        }
        return -e;
    }
    atomic_store(&cs_state, 1);
    st->cached = cs.nr_cache;
    st->dirty = cs.nr_dirty;
    st->writeback = cs.nr_writeback;
    st->evicted = cs.nr_evicted;
    st->recently_evicted = cs.nr_recently_evicted;
    return 0;
}

bool vmsnap_pcache_cachestat_available(void)
{
    int state = atomic_load(&cs_state);
    if (state != 0)
        return state > 0;
    /* probed on a file of our own: /proc/self/exe is one a user other than root may not
     * write, which the kernel refuses cachestat on (eviction was then off for every caller
     * but root) */
    int rc = cachestat_probe();
    if (rc == 0) {
        atomic_store(&cs_state, 1);
        return true;
    }
    if (rc == -ENOSYS || rc == -EPERM)
        cachestat_off(-rc);
    return false;
}

/* Resident pages of the file through mincore over read-only mappings, a window at a time so a
 * huge file needs neither a huge mapping nor a huge vector. Mapping does not fault pages in. */
static int mincore_count(int fd, uint64_t size, uint32_t ps, uint64_t *cached)
{
    *cached = 0;
    size_t vlen = (size_t)(MINCORE_WINDOW / ps);
    unsigned char *vec = malloc(vlen);
    if (!vec)
        return -ENOMEM;
    int rc = 0;
    for (uint64_t off = 0; off < size; off += MINCORE_WINDOW) {
        size_t len = (size_t)VMSNAP_MIN(MINCORE_WINDOW, size - off);
        void *map = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, (off_t)off);
        if (map == MAP_FAILED) {
            rc = -errno;
            break;
        }
        size_t n = (len + ps - 1) / ps;
        if (mincore(map, len, vec) != 0)
            rc = -errno;
        else
            for (size_t i = 0; i < n; i++)
                *cached += vec[i] & 1;
        munmap(map, len);
        if (rc < 0)
            break;
    }
    free(vec);
    return rc;
}

int vmsnap_pcache_stat_fd(int fd, struct vmsnap_pcache_stat *st, struct vmsnap_err *err)
{
    memset(st, 0, sizeof(*st));
    struct stat sb;
    if (fstat(fd, &sb) != 0)
        return err_sys(err, "pcache stat: fstat fd %d", fd);
    if (!S_ISREG(sb.st_mode))
        return vmsnap_err_set(err, EINVAL, "pcache stat: fd %d is not a regular file", fd);
    st->page_size = page_size();
    st->files = 1;
    st->size = (uint64_t)sb.st_size;
    st->pages = (st->size + st->page_size - 1) / st->page_size;
    if (pcache_cachestat(fd, 0, 0, st) == 0)
        return 0;
    st->mincore = true;
    int rc = mincore_count(fd, st->size, st->page_size, &st->cached);
    if (rc < 0)
        return err_code(err, -rc, "pcache stat: mincore fd %d", fd);
    return 0;
}

int pcache_drop_clean(int fd, uint64_t size, uint64_t *dropped, uint64_t *dirty)
{
    *dropped = 0;
    *dirty = 0;
    struct vmsnap_pcache_stat before, after, c;
    if (pcache_cachestat(fd, 0, 0, &before) < 0)
        return 1;
    int rc;
    if (before.cached == 0)
        return 0;
    if (before.dirty + before.writeback == 0) {
        rc = posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        if (rc != 0)
            return -rc;
    } else {
        /* Round the end up so pages past the last full chunk (and beyond a size that shrank
         * meanwhile) are still examined. */
        for (uint64_t off = 0; off < size + CHUNK; off += CHUNK) {
            if (pcache_cachestat(fd, off, CHUNK, &c) < 0)
                return 1;
            if (c.cached == 0)
                continue;
            if (c.dirty + c.writeback != 0) {
                *dirty += c.dirty + c.writeback;
                continue;
            }
            rc = posix_fadvise(fd, (off_t)off, (off_t)CHUNK, POSIX_FADV_DONTNEED);
            if (rc != 0)
                return -rc;
        }
    }
    if (pcache_cachestat(fd, 0, 0, &after) == 0) {
        *dropped = before.cached > after.cached ? before.cached - after.cached : 0;
        *dirty = after.dirty + after.writeback;
    }
    return 0;
}

/* ---- walking trees ---- */

struct devino {
    dev_t dev;
    ino_t ino;
};

struct preserve_set {
    struct devino *v;
    char **path; /* as given (joined to `base`), resolved again before a removal */
    size_t n;
};

static void preserve_fini(struct preserve_set *ps)
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
static int preserve_init(struct preserve_set *ps, const char *base, const char *const *paths,
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
        preserve_fini(ps);
        return vmsnap_err_set(err, ENOMEM, "pcache: out of memory");
    }
    for (size_t i = 0; i < n; i++) {
        char buf[PATH_MAX];
        const char *p = paths[i];
        if (base && p[0] != '/') {
            if ((size_t)snprintf(buf, sizeof(buf), "%s/%s", base, p) >= sizeof(buf)) {
                preserve_fini(ps);
                return vmsnap_err_set(err, ENAMETOOLONG, "preserve %s/%s: path too long", base, p);
            }
            p = buf;
        }
        struct stat sb;
        if (stat(p, &sb) != 0) {
            int e = errno;
            preserve_fini(ps);
            return err_code(err, e, "preserve %s", p);
        }
        if (!(ps->path[ps->n] = strdup(p))) {
            preserve_fini(ps);
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

static bool same_inode(const struct stat *a, const struct stat *b)
{
    return a->st_dev == b->st_dev && a->st_ino == b->st_ino;
}

/* Whether the file `sb` (`name` in the directory `dfd`) is, right now, at a preserved path or
 * under one. The device+inode pairs are taken when the walk starts; a checkpoint writer may since
 * have renamed a new file or directory onto a preserved path (its usual temporary + rename), and
 * that one must not be removed either: so the paths are resolved again just before a removal. */
static bool preserved_now(const struct preserve_set *ps, int dfd, const struct stat *sb)
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
        if (stat(ps->path[i], &now) == 0 && same_inode(&now, sb))
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
static void note_err(int *first, struct vmsnap_err *err, int code, const char *op, const char *path,
                     const char *what)
{
    if (*first == 0)
        *first = vmsnap_err_set(err, code, "%s %s: %s%s", op, path, what, strerror(code));
    else
        vlog(VMSNAP_LOG_WARN, "%s %s: %s%s", op, path, what, strerror(code));
}

/* Open `name` in the directory `dfd`, never following a symlink and never blocking (a FIFO, a
 * lease held elsewhere). */
static int open_at(int dfd, const char *name, int flags)
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

struct walk;
/* A regular file `name` in the directory `dfd` (w->path names it); `sb` from fstatat. A negative
 * return stops the walk. */
typedef int (*walk_file_fn)(struct walk *w, int dfd, const char *name, const struct stat *sb,
                            bool preserved);
/* After a directory's entries (its descriptor closed): `pfd` and `name` locate it (pfd -1 and the
 * path as given for the root). */
typedef void (*walk_dir_fn)(struct walk *w, int pfd, const char *name, const struct stat *sb,
                            bool preserved);

struct walk {
    const char *op;     /* "stat", "evict", "release": the first word of messages */
    bool follow_root;   /* a symlink given as the root is followed (never for staged walks) */
    bool strict_mounts; /* staged: without any way to tell mounts apart, enter no subdirectory */
    bool dir_only;      /* the root must be a directory (release) */
    const struct preserve_set *ps; /* may be NULL */
    walk_file_fn file;
    walk_dir_fn dir_done; /* may be NULL */
    void *arg;
    int first;
    struct vmsnap_err *err;
    uint64_t skipped_mounts;
    bool stopped;
    /* the root's mount */
    dev_t root_dev;
    uint64_t root_mnt;
    enum { MNT_DEV_ONLY, MNT_ID, MNT_MOUNTINFO } mnt_mode; /* how mounts are told apart */
    struct devino *mpoints;
    size_t nmpoints;
    /* the current path, for messages and the retrier */
    char *path;
    size_t len, cap;
};

static void walk_fini(struct walk *w)
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
        note_err(&w->first, w->err, errno, w->op, w->path, "opendir: ");
        close(dfd);
        return;
    }
    size_t at = w->len;
    for (;;) {
        errno = 0;
        struct dirent *de = readdir(d);
        if (!de) {
            if (errno != 0)
                note_err(&w->first, w->err, errno, w->op, w->path, "readdir: ");
            break;
        }
        const char *name = de->d_name;
        if (strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
            continue;
        if (path_set(w, at, name) < 0) {
            note_err(&w->first, w->err, ENOMEM, w->op, w->path, "");
            break;
        }
        struct stat sb;
        if (fstatat(dfd, name, &sb, AT_SYMLINK_NOFOLLOW) != 0) {
            if (errno != ENOENT)
                note_err(&w->first, w->err, errno, w->op, w->path, "");
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
                    note_err(&w->first, w->err, errno, w->op, w->path, "open: ");
            } else if (fstat(cfd, &csb) != 0 || !same_inode(&csb, &sb)) {
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
static int walk_root(struct walk *w, const char *path)
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
        } else if (fstatat(dfd, base, &fsb, AT_SYMLINK_NOFOLLOW) != 0 || !same_inode(&fsb, &sb)) {
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

/* ---- stat ---- */

static void add_stat(struct vmsnap_pcache_stat *t, const struct vmsnap_pcache_stat *s)
{
    t->files += s->files;
    t->size += s->size;
    t->pages += s->pages;
    t->cached += s->cached;
    t->dirty += s->dirty;
    t->writeback += s->writeback;
    t->evicted += s->evicted;
    t->recently_evicted += s->recently_evicted;
    t->mincore |= s->mincore;
}

struct stat_ctx {
    vmsnap_pcache_stat_fn fn;
    void *arg;
    struct vmsnap_pcache_stat sum;
};

static int stat_file(struct walk *w, int dfd, const char *name, const struct stat *wsb,
                     bool preserved)
{
    (void)preserved;
    struct stat_ctx *s = w->arg;
    int fd = open_at(dfd, name, O_RDONLY);
    if (fd < 0) {
        if (errno != ENOENT)
            note_err(&w->first, w->err, errno, "stat", w->path, "open: ");
        return 0;
    }
    struct stat sb;
    struct vmsnap_pcache_stat st;
    struct vmsnap_err ferr;
    int rc = 0;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || !same_inode(&sb, wsb))
        goto out; /* replaced meanwhile */
    rc = vmsnap_pcache_stat_fd(fd, &st, &ferr);
    if (rc < 0) {
        if (w->first == 0)
            w->first = vmsnap_err_set(w->err, -rc, "stat %s: %s", w->path, ferr.msg);
        rc = 0;
        goto out;
    }
    add_stat(&s->sum, &st);
    if (s->fn) {
        rc = s->fn(s->arg, w->path, &st);
        if (rc < 0 && w->first == 0)
            w->first = vmsnap_err_set(w->err, -rc, "stat %s: stopped by the caller", w->path);
    }
out:
    close(fd);
    return rc;
}

int vmsnap_pcache_stat_path(const char *path, vmsnap_pcache_stat_fn fn, void *arg,
                            struct vmsnap_pcache_stat *total, struct vmsnap_err *err)
{
    struct stat_ctx s = {.fn = fn, .arg = arg, .sum = {.page_size = page_size()}};
    struct walk w = {.op = "stat", .follow_root = true, .file = stat_file, .arg = &s, .err = err};
    int rc = walk_root(&w, path);
    walk_fini(&w);
    if (total)
        *total = s.sum;
    return rc;
}

/* ---- evict ---- */

struct evict_ctx {
    const struct vmsnap_pcache_evict_opts *opts;
    struct vmsnap_pcache_report *rep;
    struct walk *w;
};

/* The preserve treatment of an open file. */
static int preserve_fd(struct evict_ctx *c, int fd, const char *path, const struct stat *sb)
{
    struct vmsnap_pcache_report *rep = c->rep;
    uint64_t dropped, dirty;
    int rc = pcache_drop_clean(fd, (uint64_t)sb->st_size, &dropped, &dirty);
    if (rc > 0) {
        /* cachestat unavailable or failing for this file: logged once, a no-op here. */
        rep->unknown_files++;
        return 0;
    }
    if (rc < 0) {
        note_err(&c->w->first, c->w->err, -rc, "evict", path, "fadvise: ");
        return rc;
    }
    if (dropped) {
        rep->dropped_files++;
        rep->dropped_pages += dropped;
    }
    if (dirty) {
        rep->dirty_files++;
        rep->dirty_pages += dirty;
        if (c->opts->kick_writeback) {
            if (sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WRITE) == 0)
                rep->kicked++;
            else
                vlog(VMSNAP_LOG_WARN, "sync_file_range %s: %s", path, strerror(errno));
        }
        if (c->opts->retrier) {
            int arc = pcache_retrier_add(c->opts->retrier, path, sb);
            if (arc == 0)
                rep->scheduled++;
            else
                vlog(VMSNAP_LOG_WARN, "evict %s: not retried: %s", path, strerror(-arc));
        }
    }
    return 0;
}

/* A staged file that turned out not to be ours alone: counted, said, and only evicted. */
static void keep_file(struct evict_ctx *c, int fd, const char *path, const struct stat *sb,
                      bool busy, const char *why)
{
    if (busy)
        c->rep->busy_files++;
    else
        c->rep->readonly_files++;
    vlog(busy ? VMSNAP_LOG_WARN : VMSNAP_LOG_INFO, "evict %s: %s; not removed, only evicted", path,
         why);
    preserve_fd(c, fd, path, sb);
}

/* A write lease on `fd` (the only descriptor this process has on the file): 1 taken, 0 the file
 * is open or mapped elsewhere (or being executed), -errno leases unavailable here. The kernel
 * signals a lease's owner when another open breaks it, with SIGIO by default, which would end the
 * process; so the signal is first set to SIGURG (ignored by default) and the owner is cleared
 * right after, from when on nothing is signalled. An open that breaks the lease waits (or fails
 * with EWOULDBLOCK) until the lease is released, and we notice it through F_GETLEASE. */
static int take_lease(int fd)
{
    if (fcntl(fd, F_SETSIG, SIGURG) != 0)
        return -errno;
    if (fcntl(fd, F_SETLEASE, F_WRLCK) != 0)
        return errno == EAGAIN ? 0 : -errno;
    (void)fcntl(fd, F_SETOWN, 0);
    return 1;
}

static bool lease_broken(int fd)
{
    return fcntl(fd, F_GETLEASE) != F_WRLCK;
}

/*
 * The staged treatment of `name` in `dfd`, open for writing at `fd` (`sb` from fstat), a
 * single-link unpreserved regular file when the walk saw it. It is removed only when nothing else
 * holds it: a write lease proves no other descriptor or mapping exists and holds off new opens
 * while we act; the name is checked to still be this file and unlinked first, and the file is
 * truncated only if its link count is then 0 (an unlinked inode cannot gain a link, so a link
 * made at any moment before is seen). Otherwise it gets the preserve treatment.
 */
static void stage_file(struct evict_ctx *c, int dfd, const char *name, int fd, const char *path,
                       const struct stat *sb)
{
    int lease = take_lease(fd);
    if (lease == 0) {
        keep_file(c, fd, path, sb, true, "open or mapped by another process");
        return;
    }
    if (lease < 0 && !atomic_flag_test_and_set(&logged_lease))
        vlog(VMSNAP_LOG_WARN,
             "evict %s: file leases unavailable (%s): staged files other processes have open "
             "cannot be detected; their names are removed, their content is not truncated",
             path, strerror(-lease));
    struct stat now;
    if (fstatat(dfd, name, &now, AT_SYMLINK_NOFOLLOW) != 0 || !same_inode(&now, sb)) {
        vlog(VMSNAP_LOG_WARN, "evict %s: replaced while being released; left in place", path);
        goto out;
    }
    if (lease > 0 && lease_broken(fd)) {
        keep_file(c, fd, path, sb, true, "opened by another process meanwhile");
        goto out;
    }
    if (preserved_now(c->w->ps, dfd, sb)) {
        vlog(VMSNAP_LOG_INFO, "evict %s: now at a preserved path; kept", path);
        preserve_fd(c, fd, path, sb);
        goto out;
    }
    if (unlinkat(dfd, name, 0) != 0) {
        int e = errno;
        if (e != ENOENT) {
            note_err(&c->w->first, c->w->err, e, "evict", path, "unlink: ");
            preserve_fd(c, fd, path, sb);
        }
        goto out;
    }
    struct stat after;
    if (fstat(fd, &after) != 0) {
        note_err(&c->w->first, c->w->err, errno, "evict", path, "fstat: ");
        goto out;
    }
    if (after.st_nlink != 0) {
        keep_file(c, fd, path, sb, true, "another link to it exists (name removed, content kept)");
        goto out;
    }
    if (lease > 0 && lease_broken(fd)) {
        keep_file(c, fd, path, sb, true,
                  "opened by another process meanwhile (name removed, content kept)");
        goto out;
    }
    if (lease < 0) {
        /* Without a lease another process may hold the file open or mapped: truncating it
         * would kill a process that maps it (SIGBUS). The name is gone; the pages go when the
         * last holder closes it (at once when that was us), without writeback either way. */
        c->rep->removed_files++;
        c->rep->removed_bytes += (uint64_t)sb->st_size;
        goto out;
    }
    struct vmsnap_pcache_stat cs;
    uint64_t pages = pcache_cachestat(fd, 0, 0, &cs) == 0 ? cs.cached : 0;
    if (ftruncate(fd, 0) != 0) {
        note_err(&c->w->first, c->w->err, errno, "evict", path, "truncate: ");
        goto out;
    }
    c->rep->removed_files++;
    c->rep->removed_bytes += (uint64_t)sb->st_size;
    c->rep->removed_pages += pages;
out:
    if (lease > 0)
        (void)fcntl(fd, F_SETLEASE, F_UNLCK);
}

/* Open failures for writing that mean "not ours to remove" rather than an error. */
static bool write_refused(int e, bool *busy)
{
    *busy = e == ETXTBSY || e == EAGAIN; /* being executed; a lease held elsewhere */
    return *busy || e == EROFS || e == EPERM || e == EACCES; /* EACCES: mode 0444, not ours */
}

static int evict_file(struct walk *w, int dfd, const char *name, const struct stat *wsb,
                      bool preserved)
{
    struct evict_ctx *c = w->arg;
    bool stage = c->opts->staged && !preserved && wsb->st_nlink == 1;
    int fd = -1, refused = 0;
    bool busy = false;
    if (stage) {
        fd = open_at(dfd, name, O_WRONLY);
        if (fd < 0 && write_refused(errno, &busy)) {
            refused = errno;
            stage = false;
        } else if (fd < 0) {
            if (errno != ENOENT)
                note_err(&w->first, w->err, errno, "evict", w->path, "open: ");
            return 0;
        }
    }
    if (!stage) {
        fd = open_at(dfd, name, O_RDONLY);
        if (fd < 0) {
            if (errno != ENOENT)
                note_err(&w->first, w->err, errno, "evict", w->path, "open: ");
            return 0;
        }
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        note_err(&w->first, w->err, errno, "evict", w->path, "fstat: ");
        goto out;
    }
    /* Act only on the file the walk saw: a name replaced meanwhile is left alone. */
    if (!S_ISREG(sb.st_mode) || !same_inode(&sb, wsb))
        goto out;
    c->rep->files++;
    if (stage) {
        stage_file(c, dfd, name, fd, w->path, &sb);
    } else if (refused) {
        char why[128];
        snprintf(why, sizeof(why), "cannot be opened for writing (%s)", strerror(refused));
        keep_file(c, fd, w->path, &sb, busy, why);
    } else {
        preserve_fd(c, fd, w->path, &sb);
    }
out:
    close(fd);
    return 0;
}

/* release: remove the directories left empty (`name` in `pfd`, or the root by its path). */
static void release_dir_done(struct walk *w, int pfd, const char *name, const struct stat *sb,
                             bool preserved)
{
    struct evict_ctx *c = w->arg;
    if (preserved)
        return;
    int rc;
    /* a directory renamed onto a preserved path since the walk began (a checkpoint writer's
     * temporary + rename) is that checkpoint now, empty or not: an empty one was removed */
    if (pfd >= 0 && preserved_now(w->ps, pfd, sb))
        return;
    if (pfd >= 0) {
        rc = unlinkat(pfd, name, AT_REMOVEDIR);
    } else {
        struct stat now;
        if (lstat(name, &now) != 0 || !same_inode(&now, sb))
            return;
        rc = rmdir(name);
    }
    if (rc == 0)
        c->rep->removed_dirs++;
    else if (errno != ENOTEMPTY && errno != EEXIST && errno != ENOENT)
        note_err(&w->first, w->err, errno, "release", w->path, "rmdir: ");
}

static int evict_common(const char *path, const char *base, const char *const *preserve,
                        const struct vmsnap_pcache_evict_opts *opts, bool remove_dirs,
                        struct vmsnap_pcache_report *rep, struct vmsnap_err *err)
{
    static const struct vmsnap_pcache_evict_opts defaults = {0};
    struct vmsnap_pcache_report scratch = {0};
    struct preserve_set ps;
    int rc = preserve_init(&ps, base, preserve, err);
    if (rc < 0)
        return rc;
    sys_failpoint("evict-preserved");
    struct evict_ctx c = {.opts = opts ? opts : &defaults, .rep = rep ? rep : &scratch};
    struct walk w = {
        .op = remove_dirs ? "release" : "evict",
        .follow_root = !c.opts->staged,
        .strict_mounts = c.opts->staged,
        .ps = &ps,
        .file = evict_file,
        .dir_only = remove_dirs,
        .dir_done = remove_dirs ? release_dir_done : NULL,
        .arg = &c,
        .err = err,
    };
    c.w = &w;
    rc = walk_root(&w, path);
    c.rep->skipped_mounts += w.skipped_mounts;
    walk_fini(&w);
    preserve_fini(&ps);
    return rc;
}

int vmsnap_pcache_evict(const char *path, const struct vmsnap_pcache_evict_opts *opts,
                        struct vmsnap_pcache_report *rep, struct vmsnap_err *err)
{
    return evict_common(path, NULL, opts ? opts->preserve : NULL, opts, false, rep, err);
}

int vmsnap_pcache_release_dir(const char *dir, const char *const *preserve,
                              struct vmsnap_pcache_retrier *retrier,
                              struct vmsnap_pcache_report *rep, struct vmsnap_err *err)
{
    /* Only a check for a clear message: the walk opens `dir` itself, once, without following
     * a symlink, and refuses anything but a directory there too. */
    struct stat sb;
    if (lstat(dir, &sb) != 0)
        return err_sys(err, "release %s", dir);
    if (!S_ISDIR(sb.st_mode) && !S_ISLNK(sb.st_mode))
        return vmsnap_err_set(err, ENOTDIR, "release %s: not a directory", dir);
    struct vmsnap_pcache_evict_opts opts = {.staged = true, .retrier = retrier};
    return evict_common(dir, dir, preserve, &opts, true, rep, err);
}

int vmsnap_pcache_drop_written(const char *path, bool kick_writeback,
                               struct vmsnap_pcache_retrier *retrier,
                               struct vmsnap_pcache_report *rep, struct vmsnap_err *err)
{
    struct stat sb;
    if (lstat(path, &sb) != 0)
        return err_sys(err, "drop cache %s", path);
    if (!S_ISREG(sb.st_mode))
        return vmsnap_err_set(err, EINVAL, "drop cache %s: not a regular file", path);
    struct vmsnap_pcache_evict_opts opts = {.kick_writeback = kick_writeback, .retrier = retrier};
    return evict_common(path, NULL, NULL, &opts, false, rep, err);
}
