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
 * Why truncate before unlink on the staged path: unlink alone keeps the inode (and its dirty
 * pages, which may then be written back) while anything holds it open; truncation drops the pages
 * without writeback at once.
 */
#include "pcache_int.h"

#include <errno.h>
#include <fcntl.h>
#include <fts.h>
#include <limits.h>
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

void pcache_reset_probe(void)
{
    atomic_store(&cs_state, 0);
    atomic_flag_clear(&logged_unavailable);
    atomic_flag_clear(&logged_other);
}

static uint32_t page_size(void)
{
    long ps = sysconf(_SC_PAGESIZE);
    return ps > 0 ? (uint32_t)ps : 4096u;
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
        if (e == ENOSYS || e == EPERM) {
            atomic_store(&cs_state, -e);
            if (!atomic_flag_test_and_set(&logged_unavailable))
                vlog(VMSNAP_LOG_WARN,
                     "cachestat: %s: page-cache eviction of preserved files disabled (stat falls "
                     "back to mincore; staged truncation still works)",
                     e == ENOSYS ? "not supported by this kernel (needs Linux 6.5+)"
                                 : "denied (seccomp filter?)");
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
    int fd = open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return false;
    struct vmsnap_pcache_stat st;
    int rc = pcache_cachestat(fd, 0, 0, &st);
    close(fd);
    return rc == 0;
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
        return vmsnap_err_set(err, errno, "pcache stat: fstat fd %d: %s", fd, strerror(errno));
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
        return vmsnap_err_set(err, -rc, "pcache stat: mincore fd %d: %s", fd, strerror(-rc));
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
    size_t n;
};

static bool in_set(const struct preserve_set *ps, dev_t dev, ino_t ino)
{
    for (size_t i = 0; i < ps->n; i++)
        if (ps->v[i].dev == dev && ps->v[i].ino == ino)
            return true;
    return false;
}

/* Resolve the preserved paths (`base`/name when base is not NULL) to device+inode pairs. */
static int preserve_init(struct preserve_set *ps, const char *base, const char *const *paths,
                         struct vmsnap_err *err)
{
    ps->v = NULL;
    ps->n = 0;
    if (!paths)
        return 0;
    size_t n = 0;
    while (paths[n])
        n++;
    if (n == 0)
        return 0;
    ps->v = calloc(n, sizeof(*ps->v));
    if (!ps->v)
        return vmsnap_err_set(err, ENOMEM, "pcache: out of memory");
    for (size_t i = 0; i < n; i++) {
        char buf[PATH_MAX];
        const char *p = paths[i];
        if (base && p[0] != '/') {
            if ((size_t)snprintf(buf, sizeof(buf), "%s/%s", base, p) >= sizeof(buf)) {
                free(ps->v);
                ps->v = NULL;
                return vmsnap_err_set(err, ENAMETOOLONG, "preserve %s/%s: path too long", base, p);
            }
            p = buf;
        }
        struct stat sb;
        if (stat(p, &sb) != 0) {
            int e = errno;
            free(ps->v);
            ps->v = NULL;
            return vmsnap_err_set(err, e, "preserve %s: %s", p, strerror(e));
        }
        ps->v[ps->n++] = (struct devino){sb.st_dev, sb.st_ino};
    }
    return 0;
}

/* Whether `path` or a directory above it is preserved (for the roots of a walk). */
static bool root_preserved(const struct preserve_set *ps, const char *path)
{
    if (ps->n == 0)
        return false;
    char *real = realpath(path, NULL);
    if (!real)
        return false;
    bool found = false;
    for (;;) {
        struct stat sb;
        if (stat(real[0] ? real : "/", &sb) == 0 && in_set(ps, sb.st_dev, sb.st_ino)) {
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

static int open_file(const char *path, int flags)
{
    int fd = open(path, flags | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_NOATIME);
    if (fd < 0 && errno == EPERM) /* O_NOATIME needs ownership */
        fd = open(path, flags | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY);
    return fd;
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

int vmsnap_pcache_stat_path(const char *path, vmsnap_pcache_stat_fn fn, void *arg,
                            struct vmsnap_pcache_stat *total, struct vmsnap_err *err)
{
    struct vmsnap_pcache_stat sum = {.page_size = page_size()};
    char *argv[] = {(char *)path, NULL};
    FTS *fts = fts_open(argv, FTS_PHYSICAL | FTS_NOCHDIR | FTS_XDEV | FTS_COMFOLLOW, NULL);
    if (!fts)
        return vmsnap_err_set(err, errno, "stat %s: %s", path, strerror(errno));
    int first = 0;
    FTSENT *e;
    while ((e = fts_read(fts)) != NULL) {
        switch (e->fts_info) {
        case FTS_NS:
        case FTS_DNR:
        case FTS_ERR:
            if (e->fts_errno == ENOENT && e->fts_level > 0)
                break;
            note_err(&first, err, e->fts_errno, "stat", e->fts_path, "");
            break;
        case FTS_F: {
            if (!S_ISREG(e->fts_statp->st_mode))
                break;
            int fd = open_file(e->fts_path, O_RDONLY);
            if (fd < 0) {
                if (errno != ENOENT)
                    note_err(&first, err, errno, "stat", e->fts_path, "open: ");
                break;
            }
            struct vmsnap_pcache_stat st;
            struct vmsnap_err ferr;
            int rc = vmsnap_pcache_stat_fd(fd, &st, &ferr);
            close(fd);
            if (rc < 0) {
                if (first == 0)
                    first = vmsnap_err_set(err, -rc, "stat %s: %s", e->fts_path, ferr.msg);
                break;
            }
            add_stat(&sum, &st);
            if (fn) {
                rc = fn(arg, e->fts_path, &st);
                if (rc < 0) {
                    if (first == 0)
                        first =
                            vmsnap_err_set(err, -rc, "stat %s: stopped by the caller", e->fts_path);
                    goto out;
                }
            }
            break;
        }
        default:
            break;
        }
    }
    if (errno != 0 && first == 0)
        first = vmsnap_err_set(err, errno, "stat %s: walk: %s", path, strerror(errno));
out:
    fts_close(fts);
    if (total)
        *total = sum;
    return first;
}

/* ---- evict ---- */

struct evict_ctx {
    const struct vmsnap_pcache_evict_opts *opts;
    struct vmsnap_pcache_report *rep;
    struct preserve_set ps;
    bool remove_dirs;
    int first;
    struct vmsnap_err *err;
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
        note_err(&c->first, c->err, -rc, "evict", path, "fadvise: ");
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

/* The staged treatment of an open, single-link, unpreserved regular file. */
static int truncate_unlink(struct evict_ctx *c, int fd, const char *path, const struct stat *sb)
{
    struct vmsnap_pcache_stat cs;
    uint64_t pages = pcache_cachestat(fd, 0, 0, &cs) == 0 ? cs.cached : 0;
    if (ftruncate(fd, 0) != 0) {
        int e = errno;
        note_err(&c->first, c->err, e, "evict", path, "truncate: ");
        return -e;
    }
    /* Unlink only the file we truncated: the name may have been replaced meanwhile. */
    struct stat now;
    if (lstat(path, &now) != 0 || now.st_dev != sb->st_dev || now.st_ino != sb->st_ino) {
        vlog(VMSNAP_LOG_WARN, "evict %s: replaced while being released; left in place", path);
        return 0;
    }
    if (unlink(path) != 0 && errno != ENOENT) {
        int e = errno;
        note_err(&c->first, c->err, e, "evict", path, "unlink: ");
        return -e;
    }
    c->rep->removed_files++;
    c->rep->removed_bytes += (uint64_t)sb->st_size;
    c->rep->removed_pages += pages;
    return 0;
}

static void evict_file(struct evict_ctx *c, const FTSENT *e, bool preserved)
{
    const struct stat *wsb = e->fts_statp;
    if (!S_ISREG(wsb->st_mode))
        return;
    bool stage = c->opts->staged && !preserved && wsb->st_nlink == 1;
    int fd = open_file(e->fts_path, stage ? O_WRONLY : O_RDONLY);
    if (fd < 0) {
        if (errno != ENOENT)
            note_err(&c->first, c->err, errno, "evict", e->fts_path, "open: ");
        return;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        note_err(&c->first, c->err, errno, "evict", e->fts_path, "fstat: ");
        goto out;
    }
    /* Act only on the file the walk saw: a name replaced meanwhile is left alone. */
    if (!S_ISREG(sb.st_mode) || sb.st_dev != wsb->st_dev || sb.st_ino != wsb->st_ino)
        goto out;
    c->rep->files++;
    if (stage && sb.st_nlink == 1)
        truncate_unlink(c, fd, e->fts_path, &sb);
    else
        preserve_fd(c, fd, e->fts_path, &sb);
out:
    close(fd);
}

static int evict_walk(struct evict_ctx *c, const char *path)
{
    char *argv[] = {(char *)path, NULL};
    int flags = FTS_PHYSICAL | FTS_NOCHDIR | FTS_XDEV;
    if (!c->opts->staged)
        flags |= FTS_COMFOLLOW;
    FTS *fts = fts_open(argv, flags, NULL);
    if (!fts)
        return vmsnap_err_set(c->err, errno, "evict %s: %s", path, strerror(errno));
    FTSENT *e;
    while ((e = fts_read(fts)) != NULL) {
        bool preserved;
        if (e->fts_level == FTS_ROOTLEVEL)
            preserved = root_preserved(&c->ps, e->fts_path);
        else
            preserved = e->fts_parent->fts_number ||
                        in_set(&c->ps, e->fts_statp->st_dev, e->fts_statp->st_ino);
        switch (e->fts_info) {
        case FTS_D:
            e->fts_number = preserved;
            break;
        case FTS_DP:
            if (c->remove_dirs && !e->fts_number) {
                if (rmdir(e->fts_path) == 0)
                    c->rep->removed_dirs++;
                else if (errno != ENOTEMPTY && errno != EEXIST && errno != ENOENT)
                    note_err(&c->first, c->err, errno, "release", e->fts_path, "rmdir: ");
            }
            break;
        case FTS_NS:
        case FTS_DNR:
        case FTS_ERR:
            if (e->fts_errno == ENOENT && e->fts_level > 0)
                break;
            note_err(&c->first, c->err, e->fts_errno, "evict", e->fts_path, "");
            break;
        case FTS_F:
            evict_file(c, e, preserved);
            break;
        default:
            break;
        }
    }
    if (errno != 0 && c->first == 0)
        c->first = vmsnap_err_set(c->err, errno, "evict %s: walk: %s", path, strerror(errno));
    fts_close(fts);
    return c->first;
}

static int evict_common(const char *path, const char *base, const char *const *preserve,
                        const struct vmsnap_pcache_evict_opts *opts, bool remove_dirs,
                        struct vmsnap_pcache_report *rep, struct vmsnap_err *err)
{
    static const struct vmsnap_pcache_evict_opts defaults = {0};
    struct vmsnap_pcache_report scratch = {0};
    struct evict_ctx c = {
        .opts = opts ? opts : &defaults,
        .rep = rep ? rep : &scratch,
        .remove_dirs = remove_dirs,
        .err = err,
    };
    int rc = preserve_init(&c.ps, base, preserve, err);
    if (rc < 0)
        return rc;
    rc = evict_walk(&c, path);
    free(c.ps.v);
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
    struct stat sb;
    if (lstat(dir, &sb) != 0)
        return vmsnap_err_set(err, errno, "release %s: %s", dir, strerror(errno));
    if (!S_ISDIR(sb.st_mode))
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
        return vmsnap_err_set(err, errno, "drop cache %s: %s", path, strerror(errno));
    if (!S_ISREG(sb.st_mode))
        return vmsnap_err_set(err, EINVAL, "drop cache %s: not a regular file", path);
    struct vmsnap_pcache_evict_opts opts = {.kick_writeback = kick_writeback, .retrier = retrier};
    return evict_common(path, NULL, NULL, &opts, false, rep, err);
}
