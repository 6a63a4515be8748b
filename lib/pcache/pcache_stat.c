/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Page-cache stat: cachestat (Linux 6.5+; probed once, off for good where the kernel or a seccomp
 * filter refuses it), the mincore fallback, the per-chunk drop of clean pages that the preserve
 * treatment and the retrier use, and the stat of a whole tree (through pcache_walk.c).
 *
 * Why per-chunk: a preserved file may be partly dirty (a disk image with recent writes, an image
 * whose writeback is under way). DONTNEED on a range holding dirty pages starts writeback there and
 * drops nothing, but on a clean range it only drops, so the file is examined in 16 MiB chunks and
 * every chunk that cachestat shows free of dirty and writeback pages is dropped. A file with no
 * dirty page at all takes one cachestat and one fadvise.
 */
#include "pcache_int.h"

#include "sys/sys.h"

#include <errno.h>
#include <fcntl.h>
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

void pcache_cachestat_reset(void)
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
    int fd = pcache_open_at(dfd, name, O_RDONLY);
    if (fd < 0) {
        if (errno != ENOENT)
            pcache_note_err(&w->first, w->err, errno, "stat", w->path, "open: ");
        return 0;
    }
    struct stat sb;
    struct vmsnap_pcache_stat st;
    struct vmsnap_err ferr;
    int rc = 0;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || !pcache_same_inode(&sb, wsb))
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
    int rc = pcache_walk_root(&w, path);
    pcache_walk_fini(&w);
    if (total)
        *total = s.sum;
    return rc;
}
