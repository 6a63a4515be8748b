/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Page-cache eviction: the preserve treatment (drop the clean chunks, kick writeback, queue the
 * dirty for the retrier), the staged treatment (remove a file that is ours alone, truncating it),
 * and release of a restore directory. The top of the module: it uses pcache_walk.c,
 * pcache_stat.c and pcache_retry.c, and none of them uses it.
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
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static atomic_flag logged_lease = ATOMIC_FLAG_INIT;

void pcache_reset_probe(void)
{
    pcache_cachestat_reset();
    atomic_flag_clear(&logged_lease);
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
        pcache_note_err(&c->w->first, c->w->err, -rc, "evict", path, "fadvise: ");
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
    if (fstatat(dfd, name, &now, AT_SYMLINK_NOFOLLOW) != 0 || !pcache_same_inode(&now, sb)) {
        vlog(VMSNAP_LOG_WARN, "evict %s: replaced while being released; left in place", path);
        goto out;
    }
    if (lease > 0 && lease_broken(fd)) {
        keep_file(c, fd, path, sb, true, "opened by another process meanwhile");
        goto out;
    }
    if (pcache_preserved_now(c->w->ps, dfd, sb)) {
        vlog(VMSNAP_LOG_INFO, "evict %s: now at a preserved path; kept", path);
        preserve_fd(c, fd, path, sb);
        goto out;
    }
    if (unlinkat(dfd, name, 0) != 0) {
        int e = errno;
        if (e != ENOENT) {
            pcache_note_err(&c->w->first, c->w->err, e, "evict", path, "unlink: ");
            preserve_fd(c, fd, path, sb);
        }
        goto out;
    }
    struct stat after;
    if (fstat(fd, &after) != 0) {
        pcache_note_err(&c->w->first, c->w->err, errno, "evict", path, "fstat: ");
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
        pcache_note_err(&c->w->first, c->w->err, errno, "evict", path, "truncate: ");
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
        fd = pcache_open_at(dfd, name, O_WRONLY);
        if (fd < 0 && write_refused(errno, &busy)) {
            refused = errno;
            stage = false;
        } else if (fd < 0) {
            if (errno != ENOENT)
                pcache_note_err(&w->first, w->err, errno, "evict", w->path, "open: ");
            return 0;
        }
    }
    if (!stage) {
        fd = pcache_open_at(dfd, name, O_RDONLY);
        if (fd < 0) {
            if (errno != ENOENT)
                pcache_note_err(&w->first, w->err, errno, "evict", w->path, "open: ");
            return 0;
        }
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        pcache_note_err(&w->first, w->err, errno, "evict", w->path, "fstat: ");
        goto out;
    }
    /* Act only on the file the walk saw: a name replaced meanwhile is left alone. */
    if (!S_ISREG(sb.st_mode) || !pcache_same_inode(&sb, wsb))
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
    if (pfd >= 0 && pcache_preserved_now(w->ps, pfd, sb))
        return;
    if (pfd >= 0) {
        rc = unlinkat(pfd, name, AT_REMOVEDIR);
    } else {
        struct stat now;
        if (lstat(name, &now) != 0 || !pcache_same_inode(&now, sb))
            return;
        rc = rmdir(name);
    }
    if (rc == 0)
        c->rep->removed_dirs++;
    else if (errno != ENOTEMPTY && errno != EEXIST && errno != ENOENT)
        pcache_note_err(&w->first, w->err, errno, "release", w->path, "rmdir: ");
}

static int evict_common(const char *path, const char *base, const char *const *preserve,
                        const struct vmsnap_pcache_evict_opts *opts, bool remove_dirs,
                        struct vmsnap_pcache_report *rep, struct vmsnap_err *err)
{
    static const struct vmsnap_pcache_evict_opts defaults = {0};
    struct vmsnap_pcache_report scratch = {0};
    struct preserve_set ps;
    int rc = pcache_preserve_init(&ps, base, preserve, err);
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
    rc = pcache_walk_root(&w, path);
    c.rep->skipped_mounts += w.skipped_mounts;
    pcache_walk_fini(&w);
    pcache_preserve_fini(&ps);
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
