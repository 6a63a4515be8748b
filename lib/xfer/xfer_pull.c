/* SPDX-License-Identifier: Apache-2.0 */
/*
 * vmsnap_xfer_pull: the pull of one object or a whole set, and the publish of a set's files
 * into their directory, all or nothing.
 */
#include "xfer_int.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <unistd.h>

static int cmp_objsize_desc(const void *a, const void *b, void *files)
{
    const struct mf_file *f = files;
    size_t i = *(const size_t *)a, j = *(const size_t *)b;
    uint64_t x = f[i].object_size, y = f[j].object_size;
    return x < y ? 1 : x > y ? -1 : i < j ? -1 : i > j; /* ties: manifest order */
}

struct any_ctx {
    unsigned n;
};

static int count_any(void *arg, const char *key, uint64_t size, int64_t mtime)
{
    (void)key;
    (void)size;
    (void)mtime;
    ((struct any_ctx *)arg)->n++;
    return -ECANCELED; /* one is enough */
}

/* Links `.vmsnap-old.PID.N` that a pull killed during its publish left in `dir`, and the
 * temporaries `.vmsnap-pull.PID.XXXXXX` of a pull killed while it wrote (the process is gone):
 * they hold a replaced file's blocks, or a whole downloaded file. */
static void drop_stale_links(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *de;
    while ((de = readdir(d))) {
        long pid = 0;
        unsigned long seq = 0;
        char tail = 0;
        char rnd[8];
        bool ours =
            sscanf(de->d_name, ".vmsnap-old.%ld.%lu%c", &pid, &seq, &tail) == 2 ||
            (sscanf(de->d_name, ".vmsnap-pull.%ld.%6[A-Za-z0-9]%c", &pid, rnd, &tail) == 2 &&
             strlen(rnd) == 6);
        if (!ours || pid <= 0 || pid == (long)getpid() || kill((pid_t)pid, 0) == 0 ||
            errno != ESRCH)
            continue;
        /* ours only (a regular file of this user), and for a pull's temporary, not locked: the
         * pid of a pull in another PID namespace sharing this directory looks dead from here */
        struct stat sb;
        if (fstatat(dirfd(d), de->d_name, &sb, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISREG(sb.st_mode) ||
            sb.st_uid != geteuid())
            continue;
        if (!strncmp(de->d_name, ".vmsnap-pull.", 13)) {
            int fd = openat(dirfd(d), de->d_name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
            bool free_ = fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) == 0;
            if (fd >= 0)
                close(fd);
            if (!free_)
                continue;
        }
        unlinkat(dirfd(d), de->d_name, 0);
    }
    closedir(d);
}

/* The names a swap does not keep from the old directory: the set's files (their new versions go
 * in) and this pull's temporaries. */
struct swap_skip {
    const struct down *ds;
    size_t n;
};

static bool swap_skips(const char *name, void *arg)
{
    const struct swap_skip *k = arg;
    for (size_t i = 0; i < k->n; i++) {
        const char *p = strrchr(k->ds[i].af.path, '/'), *t = strrchr(k->ds[i].af.tmp, '/');
        if (!strcmp(name, p ? p + 1 : k->ds[i].af.path) ||
            !strcmp(name, t ? t + 1 : k->ds[i].af.tmp))
            return true;
    }
    return false;
}

/* Publish by swapping the whole directory (lib/sys/dirswap.c): its new state, the set's files
 * beside everything else it holds, is built as hard links next to it and exchanged with it in
 * one rename, so a reader or a kill sees the old set or the new one. 1: not done, nothing
 * changed (a subdirectory, a mount point, no RENAME_EXCHANGE, a parent this user cannot write),
 * publish file by file. */
static int publish_swap(struct xfer *x, const char *dir, struct down *ds, size_t n,
                        struct vmsnap_err *err)
{
    struct swap_skip k = {ds, n};
    struct sys_dir_swap s;
    struct vmsnap_err e2 = {0};
    int rc = sys_dir_swap_begin(&s, dir, swap_skips, &k, &e2);
    for (size_t i = 0; rc == 0 && i < n; i++) {
        const char *b = strrchr(ds[i].af.path, '/');
        rc = sys_dir_swap_add(&s, ds[i].af.tmp, b ? b + 1 : ds[i].af.path, &e2);
    }
    if (rc == 0) {
        rc = sys_dir_swap_commit(&s, !x->o.no_fsync, &e2);
    } else {
        sys_dir_swap_abort(&s);
    }
    if (rc < 0 && !s.swapped) { /* nothing changed: the files go in one by one */
        vlog(VMSNAP_LOG_DEBUG, "pull: %s: publishing file by file: %s", dir, e2.msg);
        return 1;
    }
    /* in place (the temporaries went with the old directory); rc < 0 only for the last fsync */
    for (size_t i = 0; i < n; i++) {
        sys_atomic_forget(&ds[i].af);
        ds[i].af_open = false;
    }
    if (rc < 0)
        *err = e2;
    return rc;
}

/* Publish file by file where the directory cannot be swapped: all or nothing as far as the
 * filesystem lets it. A hard link keeps each file the set replaces, so a rename failing half way
 * (EIO, a quota, a directory block on a full disk) puts back what the earlier ones replaced; a
 * pull killed half way leaves a mix (hence the swap first). Then one fsync of the directory. */
static int publish_renames(struct xfer *x, const char *dir, struct down *ds, size_t n,
                           struct vmsnap_err *err)
{
    static atomic_ulong link_seq; /* unique names for pulls running at once in one process */
    struct pub {
        char *path; /* the destination (the commit frees the atomic file's copy) */
        char *old;  /* a link to the file it replaces, or NULL */
        bool there; /* a file was there */
    } *p = calloc(n, sizeof(*p));
    if (!p)
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        const char *path = ds[i].af.path;
        struct stat db;
        p[i].there = lstat(path, &db) == 0;
        if (!(p[i].path = strdup(path))) {
            rc = vmsnap_err_set(err, ENOMEM, "out of memory");
            continue;
        }
        if (!p[i].there)
            continue;
        if (asprintf(&p[i].old, "%s/.vmsnap-old.%ld.%lu", dir, (long)getpid(),
                     atomic_fetch_add(&link_seq, 1)) < 0) {
            p[i].old = NULL;
            rc = vmsnap_err_set(err, ENOMEM, "out of memory");
            continue;
        }
        unlink(p[i].old); /* left by a killed pull that had this pid */
        if (link(path, p[i].old) < 0) {
            int e = errno;
            free(p[i].old);
            p[i].old = NULL;
            /* a filesystem without hard links, or no room for one more name: published without
             * a way back (as before there was one) */
            if (e != EPERM && e != ENOTSUP && e != EMLINK && e != ENOSPC && e != EDQUOT)
                rc = err_code(err, e, "link %s (kept until the set is in place)", path);
        }
    }
    size_t done = 0; /* commits tried; the last one tried failed when rc < 0 */
    for (; done < n && rc == 0; done++) {
        rc = sys_atomic_commit(&ds[done].af, false, err);
        ds[done].af_open = false;
    }
    if (rc < 0 && done > 1) { /* put back what the commits before the failed one replaced */
        bool mixed = false;
        for (size_t j = 0; j + 1 < done; j++) {
            if (p[j].old ? rename(p[j].old, p[j].path) < 0 : p[j].there || unlink(p[j].path) < 0)
                mixed = true;
        }
        if (mixed)
            vmsnap_err_wrap(err, "%s may now hold files of two sets: ", dir);
    }
    for (size_t j = 0; j < n; j++) {
        if (p[j].old)
            unlink(p[j].old);
        free(p[j].old);
        free(p[j].path);
    }
    free(p);
    if (rc == 0 && !x->o.no_fsync) {
        int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd < 0 || fsync(dfd) < 0)
            rc = err_sys(err,
                         "fsync directory %s (the set is in place, but may not survive a "
                         "crash)",
                         dir);
        if (dfd >= 0)
            close(dfd);
    }
    return rc;
}

/* Put every pulled file of a set in place in `dir`, all or nothing. What can fail is tried for
 * every file first (a directory in a file's place, each file's fsync and close, where a delayed
 * write error shows), so such a failure leaves the directory as it was; then the directory is
 * swapped whole where it can be, else the files are renamed in one by one. */
static int publish_set(struct xfer *x, const char *dir, struct down *ds, size_t n,
                       struct vmsnap_xfer_stats *stats, struct vmsnap_err *err)
{
    sys_failpoint("pull-publishing"); /* every file downloaded, none in place: a test's kill */
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        const char *path = ds[i].af.path;
        struct stat db;
        if (lstat(path, &db) == 0 && S_ISDIR(db.st_mode))
            rc = vmsnap_err_set(err, EISDIR, "%s is a directory: cannot put the set's file there",
                                path);
        else if (!x->o.no_fsync && fsync(ds[i].af.fd) < 0)
            rc = err_sys(err, "fsync %s", path);
        else
            rc = sys_atomic_close(&ds[i].af, err);
    }
    if (rc == 0 && (rc = publish_swap(x, dir, ds, n, err)) == 1)
        rc = publish_renames(x, dir, ds, n, err);
    for (size_t j = 0; rc == 0 && stats && j < n; j++) {
        stats->files++;
        stats->logical += ds[j].stats.total_size;
        stats->populated += ds[j].stats.populated;
        stats->object_bytes += ds[j].osize;
    }
    return rc;
}

/* A set's pull: its manifest, where it goes, and its files' downloads. */
struct set_pull {
    struct xfer *x;
    struct vmsnap_store_conn *ctl;
    const char *prefix;
    const struct manifest *m;
    const char *dir;
    bool created;    /* dir was made by this pull (removed again when it fails) */
    struct down *ds; /* per file (manifest order) */
};

/* The destination directory: there (a killed pull's leftovers dropped), or made. */
static int pull_dir(struct set_pull *p, struct vmsnap_err *err)
{
    const char *dir = p->dir;
    struct stat sb;
    if (stat(dir, &sb) == 0) {
        if (!S_ISDIR(sb.st_mode))
            return vmsnap_err_set(err, ENOTDIR, "%s exists and is not a directory", dir);
        drop_stale_links(dir);   /* a killed pull's room back before this one needs it */
        sys_dir_swap_sweep(dir); /* and a killed swap's, beside it */
    } else if (errno == ENOENT) {
        if (mkdir(dir, 0700) < 0)
            return err_sys(err, "mkdir %s", dir);
        p->created = true;
    } else {
        return err_sys(err, "%s", dir);
    }
    return 0;
}

/* Room for the set: its bytes, an inode and an open file per file. */
static int pull_room(struct set_pull *p, struct vmsnap_err *err)
{
    const struct manifest *m = p->m;
    const char *dir = p->dir;
    /* Fail before downloading anything when the set cannot fit (the manifest gives every
     * file's populated bytes; the decoder writes those and leaves holes) */
    uint64_t need = 0;
    bool known = true;
    for (size_t i = 0; i < m->n; i++) {
        known = known && m->files[i].detail;
        need += m->files[i].populated + 4096;
    }
    struct statvfs vs;
    if (known && statvfs(dir, &vs) == 0 && need > (uint64_t)vs.f_bavail * vs.f_frsize)
        return vmsnap_err_set(err, ENOSPC,
                              "%s: no space for the set: it needs %llu MiB, %llu MiB are free", dir,
                              (unsigned long long)(need >> 20),
                              (unsigned long long)(((uint64_t)vs.f_bavail * vs.f_frsize) >> 20));
    /* an inode per file, for its temporary (f_files 0: the filesystem has no fixed count) */
    if (statvfs(dir, &vs) == 0 && vs.f_files > 0 && (uint64_t)vs.f_favail < (uint64_t)m->n)
        return vmsnap_err_set(err, ENOSPC,
                              "%s: no inodes for the set: its %zu files need %zu, %llu are free",
                              dir, m->n, m->n, (unsigned long long)vs.f_favail);
    /* every file's temporary stays open until the set is published: a set of more files than
     * the soft descriptor limit (often 1024) needs it raised, within the hard limit, for the
     * temporaries, every pool connection (a socket and curl's own descriptors: up to 4 each),
     * stdio and the libraries' own */
    struct rlimit rl;
    const rlim_t want = (rlim_t)m->n + 4 * (rlim_t)(p->x->pool.n + 1) + 64;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && want > rl.rlim_cur) {
        if (rl.rlim_max != RLIM_INFINITY && want > rl.rlim_max)
            return vmsnap_err_set(err, EMFILE,
                                  "a set of %zu files needs %llu open files; the hard limit is "
                                  "%llu (ulimit -Hn)",
                                  m->n, (unsigned long long)want, (unsigned long long)rl.rlim_max);
        rl.rlim_cur = want;
        (void)setrlimit(RLIMIT_NOFILE, &rl);
    }
    return 0;
}

/* Largest object first, opened here on `ctl` and dispatched at once; the others are opened in
 * parallel on the pool's connections meanwhile (one or two GETs each) and dispatched as they
 * come in, so a set costs about two round trips before its largest file streams, however many
 * files it has. A file is started when its d->x is set (down_finish then owes it). */
static int pull_dispatch(struct set_pull *p, struct vmsnap_err *err)
{
    struct xfer *x = p->x;
    const struct manifest *m = p->m;
    struct down *ds = p->ds;
    int rc = 0;
    size_t *order = calloc(m->n ? m->n : 1, sizeof(*order));
    if (!order)
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    for (size_t i = 0; i < m->n; i++)
        order[i] = i;
    qsort_r(order, m->n, sizeof(*order), cmp_objsize_desc, m->files);
    char path0[4352] = "";
    /* at most one open per pool thread ahead of the dispatch: the bytes read when opening
     * (up to TAIL_READ per file) stay bounded for a set of many files */
    size_t ahead = x->pool.n ? x->pool.n : 1, started = 0;
    for (size_t k = 0; k < m->n; k++) {
        while (rc == 0 && started < m->n && started <= k + ahead) {
            size_t i = order[started];
            struct down *d = &ds[i];
            d->mf = &m->files[i];
            d->key = xfer_object_key(p->prefix, m->files[i].name);
            struct open_task *ot = started ? calloc(1, sizeof(*ot)) : NULL;
            if (!d->key || (started && !ot)) {
                free(ot);
                free(d->key);
                d->key = NULL;
                rc = vmsnap_err_set(err, ENOMEM, "out of memory");
                break;
            }
            xfer_down_init(d);
            d->x = x; /* marks it started: finished and freed below */
            if (started++ == 0) {
                snprintf(path0, sizeof(path0), "%s/%s", p->dir, m->files[i].name);
                xfer_down_prefetch(d);
                continue;
            }
            snprintf(ot->dst, sizeof(ot->dst), "%s/%s", p->dir, m->files[i].name);
            ot->t.run = xfer_down_open_run;
            ot->d = d;
            xpool_submit(&x->pool, &ot->t);
        }
        struct down *d = &ds[order[k]];
        if (!d->x)
            break;
        int r;
        if (k == 0) {
            r = rc == 0 ? xfer_down_open(d, p->ctl, path0, err) : -ECANCELED;
            d->opened = true;
        } else {
            pthread_mutex_lock(&d->mu);
            while (!d->opened)
                pthread_cond_wait(&d->cv, &d->mu);
            r = d->start_rc;
            pthread_mutex_unlock(&d->mu);
            if (r < 0 && rc == 0 && err)
                *err = d->open_err;
        }
        if (r == 0 && rc == 0)
            r = xfer_down_submit(d, err);
        else if (r == 0)
            r = -ECANCELED; /* opened, but an earlier file failed: not dispatched */
        d->start_rc = r;
        if (r < 0 && rc == 0)
            rc = r;
    }
    free(order);
    return rc;
}

static int pull_set(struct xfer *x, struct vmsnap_store_conn *ctl, const char *prefix,
                    const struct manifest *m, const char *dir, struct vmsnap_xfer_stats *stats,
                    struct vmsnap_err *err)
{
    struct set_pull p = {.x = x, .ctl = ctl, .prefix = prefix, .m = m, .dir = dir};
    int rc = pull_dir(&p, err);
    if (rc < 0)
        return rc;
    if ((rc = pull_room(&p, err)) < 0)
        goto undo_mkdir;
    p.ds = calloc(m->n ? m->n : 1, sizeof(*p.ds));
    if (!p.ds) {
        rc = vmsnap_err_set(err, ENOMEM, "out of memory");
        goto undo_mkdir;
    }
    bool layered = m->format_version == 3;
    rc = layered ? xfer_pull_layered(x, ctl, m, dir, p.ds, err) : pull_dispatch(&p, err);
    for (size_t i = 0; i < m->n; i++) {
        if (!p.ds[i].x || layered) /* a layered file's downloads are finished */
            continue;
        struct vmsnap_err e = {0};
        int r = xfer_down_finish(&p.ds[i], p.ds[i].start_rc, &e);
        if (r < 0 && rc == 0) {
            rc = r;
            if (err)
                *err = e;
        }
    }
    /* all verified: publish every file (all were started when rc is 0) */
    if (rc == 0)
        rc = publish_set(x, dir, p.ds, m->n, stats, err);
    if (rc == 0 && stats)
        stats->cached_bytes = x->cached_bytes;
    for (size_t i = 0; i < m->n; i++)
        if (p.ds[i].x)
            xfer_down_free(&p.ds[i], false);
    free(p.ds);
undo_mkdir:
    if (rc < 0 && p.created)
        rmdir(dir);
    return rc;
}

int vmsnap_xfer_pull(const char *url, const char *path, const struct vmsnap_xfer_opts *opts,
                     struct vmsnap_xfer_stats *stats, struct vmsnap_err *err)
{
    if (stats)
        memset(stats, 0, sizeof(*stats));
    struct xfer x;
    int rc = xfer_open(&x, url, opts, 0, err);
    if (rc < 0)
        return rc;
    const char *key = x.key;
    char *mkey = xfer_join_key(key, VMSNAP_XFER_MANIFEST);
    char murl[URL_BUF];
    struct manifest m = {0};
    if (!mkey) {
        rc = vmsnap_err_set(err, ENOMEM, "out of memory");
        goto out;
    }
    vmsnap_store_url(x.st, mkey, murl, sizeof(murl));
    if (xfer_local_same(&x, key, path, false)) {
        rc =
            vmsnap_err_set(err, EINVAL, "the destination %s is where the snapshot is stored", path);
        goto out;
    }
    if ((rc = xfer_conn(&x, err)) < 0)
        goto out;
    struct vmsnap_store_conn *ctl = x.ctl;
    rc = xfer_read_manifest(ctl, mkey, murl, x.o.max_size, &m, err);
    if (rc == 0) {
        if ((rc = xfer_start_pool(&x, err)) < 0)
            goto out;
        rc = pull_set(&x, ctl, key, &m, path, stats, err);
        goto out;
    }
    if (rc != -ENOENT || !*key)
        goto out;
    if (x.o.set_only) {
        uint64_t osz;
        bool object = vmsnap_store_head(ctl, key, &osz, NULL) == 0;
        rc = vmsnap_err_set(err, ENOENT, "%s: no snapshot set there (no %s)%s", url,
                            VMSNAP_XFER_MANIFEST,
                            object ? ": it is a single object, and a set is needed" : "");
        goto out;
    }
    /* no manifest: a single object, or an incomplete set */
    uint64_t size;
    struct vmsnap_err herr = {0};
    rc = vmsnap_store_head(ctl, key, &size, &herr);
    if (rc == -ENOENT) {
        struct any_ctx any = {0};
        char *lp = xfer_join_key(key, "");
        int lrc = lp ? vmsnap_store_list(ctl, lp, count_any, &any, err) : -ENOMEM;
        free(lp);
        if (lrc < 0 && lrc != -ECANCELED) {
            rc = lrc;
            goto out;
        }
        if (any.n)
            rc = vmsnap_err_set(err, ENOENT, "incomplete snapshot: no manifest at %s", murl);
        else
            rc = vmsnap_err_set(err, ENOENT, "%s: no such object or snapshot set", url);
        goto out;
    }
    if (rc < 0) {
        if (err)
            *err = herr;
        goto out;
    }
    if ((rc = xfer_start_pool(&x, err)) < 0)
        goto out;
    struct down d = {.x = &x, .key = strdup(key)};
    if (!d.key) {
        rc = vmsnap_err_set(err, ENOMEM, "out of memory");
        goto out;
    }
    xfer_down_init(&d);
    { /* a killed pull's temporaries beside the destination: their room back first */
        char pdir[4352];
        snprintf(pdir, sizeof(pdir), "%s", path);
        char *sl = strrchr(pdir, '/');
        if (sl)
            sl[sl == pdir] = '\0';
        drop_stale_links(sl ? pdir : ".");
    }
    rc = xfer_down_open(&d, ctl, path, err);
    if (rc == 0)
        rc = xfer_down_submit(&d, err);
    rc = xfer_down_finish(&d, rc, err);
    if (rc == 0)
        rc = sys_atomic_commit(&d.af, !x.o.no_fsync, err);
    if (rc == 0) {
        d.af_open = false;
        if (stats) {
            stats->files = 1;
            stats->logical = d.stats.total_size;
            stats->populated = d.stats.populated;
            stats->object_bytes = d.osize;
        }
    }
    d.af_open = d.af_open && rc < 0;
    xfer_down_free(&d, false);
out:
    if (rc < 0 && err && !strstr(err->msg, "incomplete snapshot") &&
        strncmp(err->msg, url, strlen(url)))
        vmsnap_err_wrap(err, "pull %s: ", url);
    manifest_fini(&m);
    free(mkey);
    xfer_close(&x);
    return rc;
}
