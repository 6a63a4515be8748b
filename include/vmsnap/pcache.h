/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Page-cache hygiene: keep snapshot files (memory images, disk and filesystem archives) from
 * sitting in a worker's memory cgroup next to guest RAM.
 *
 * - stat: per file (or recursively per directory) pages cached, dirty, under writeback, evicted
 *   and recently evicted, from cachestat(2) (Linux 6.5+). Where cachestat is unavailable only
 *   resident pages are known, counted with mincore(2), and the result says so.
 * - evict, preserve treatment: a file is never modified. Its clean pages are dropped with
 *   POSIX_FADV_DONTNEED, and only when cachestat reports no dirty and no writeback page in it
 *   (DONTNEED on dirty pages starts writeback and drops nothing). A file still dirty is handed to
 *   a background retrier (default 0.5 s, 1.5 s and 3 s later) when one is given.
 * - evict, staged treatment: a regular file that is ours alone (a single link, not preserved, no
 *   other descriptor or mapping open on it) is unlinked and then, once its link count is 0,
 *   truncated to zero, so the kernel drops its pages without writing them back. Multi-link files,
 *   preserved paths, files open elsewhere or being executed, and files that cannot be opened for
 *   writing (read-only file system) get the preserve treatment. Preservation is explicit (a list
 *   of paths), never inferred from the link count, which only adds protection.
 * - walks: a tree is walked through directory descriptors, never following a symlink below the
 *   root and never leaving the root's mount (another file system or a bind mount is reported and
 *   not entered). A staged walk does not follow a symlink given as the root either (trailing
 *   slashes included).
 * - cachestat failing (ENOSYS on an old kernel, EPERM from a seccomp filter, anything else) is
 *   logged once per process and the preserve treatment becomes a no-op; truncation still works.
 *
 * Thread safety: every function may be called from several threads at once; a retrier may be
 * shared by concurrent evict calls.
 */
#ifndef VMSNAP_PCACHE_H
#define VMSNAP_PCACHE_H

#include "vmsnap/common.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Page-cache state of one file or a sum over files. Counts are in pages of `page_size` bytes. */
struct vmsnap_pcache_stat {
    uint64_t files;            /* regular files counted (1 for a single file) */
    uint64_t size;             /* bytes (sum of file sizes) */
    uint64_t pages;            /* pages spanned by the file sizes */
    uint64_t cached;           /* pages in the page cache */
    uint64_t dirty;            /* dirty pages (cachestat only, else 0) */
    uint64_t writeback;        /* pages under writeback (cachestat only) */
    uint64_t evicted;          /* pages evicted from the cache (cachestat only) */
    uint64_t recently_evicted; /* of those, evicted recently (cachestat only) */
    uint32_t page_size;        /* bytes per page */
    bool mincore;              /* at least one file was counted with mincore: only `cached` is
                                * known for it, its dirty/writeback/evicted count as 0 */
};

/* Page-cache state of the regular file open at `fd`. Falls back to mincore (st->mincore set) when
 * cachestat is unavailable. Returns 0 or -errno (-EINVAL for a non-regular file). */
VMSNAP_API int vmsnap_pcache_stat_fd(int fd, struct vmsnap_pcache_stat *st, struct vmsnap_err *err);

/* Called once per regular file by vmsnap_pcache_stat_path(); a negative return stops the walk
 * and is returned. `path` is valid only during the call. */
typedef int (*vmsnap_pcache_stat_fn)(void *arg, const char *path,
                                     const struct vmsnap_pcache_stat *st);

/* Stat `path`, a file or a directory walked recursively (a symlink given as `path` is followed,
 * those below it are not; other mounts are not entered). `fn` (may be NULL) gets every regular
 * file; `total` (may be NULL) is overwritten with the sum. Files that vanish during the walk and
 * special files inside the tree are skipped. Returns 0, or the first -errno met (the walk continues
 * past per-file errors; `err` names the file); `path` itself being something else than a regular
 * file or a directory is -EINVAL, a symlink loop -ELOOP. */
VMSNAP_API int vmsnap_pcache_stat_path(const char *path, vmsnap_pcache_stat_fn fn, void *arg,
                                       struct vmsnap_pcache_stat *total, struct vmsnap_err *err);

/* Whether cachestat(2) works in this process (probed once; a failure is logged once). */
VMSNAP_API bool vmsnap_pcache_cachestat_available(void);

/* A background thread retrying the preserve treatment of files that were still dirty. Each
 * scheduled file is retried at the given delays after it was scheduled; a retry re-opens the path
 * and acts only when device, inode, size and mtime still match what was scheduled (a replaced or
 * modified file is left alone). It stops for a file once its pages were dropped or the schedule
 * ends. */
struct vmsnap_pcache_retrier;

struct vmsnap_pcache_retrier_stats {
    uint64_t scheduled;     /* files accepted */
    uint64_t attempts;      /* retries made */
    uint64_t dropped_files; /* files found clean and dropped */
    uint64_t dropped_pages; /* pages they had cached */
    uint64_t gave_up;       /* files still dirty when their schedule ended */
    uint64_t replaced;      /* files left alone: gone, replaced or modified */
    uint64_t failed;        /* files dropped from the queue on an error (cachestat failing) */
    uint64_t pending;       /* files still queued */
};

#define VMSNAP_PCACHE_RETRIER_MAX_DELAYS 8192
#define VMSNAP_PCACHE_RETRIER_MAX_PENDING 65536

/* Start a retrier. `delays` (seconds after scheduling, increasing; NULL: 0.5, 1.5, 3) has
 * `ndelays` entries (at most VMSNAP_PCACHE_RETRIER_MAX_DELAYS); the array is copied. At most
 * VMSNAP_PCACHE_RETRIER_MAX_PENDING files are queued at once. Free with
 * vmsnap_pcache_retrier_free(). Returns 0 or -errno (-EINVAL, -ENOMEM, thread creation). */
VMSNAP_API int vmsnap_pcache_retrier_new(const double *delays, size_t ndelays,
                                         struct vmsnap_pcache_retrier **out,
                                         struct vmsnap_err *err);

/* Wait until no file is queued or `timeout` seconds passed (< 0: no limit). Returns 0 when the
 * queue is empty, -ETIMEDOUT otherwise, -ECANCELED once vmsnap_cancel() was called. */
VMSNAP_API int vmsnap_pcache_retrier_wait(struct vmsnap_pcache_retrier *r, double timeout);

/* A snapshot of the counters. */
VMSNAP_API void vmsnap_pcache_retrier_get_stats(struct vmsnap_pcache_retrier *r,
                                                struct vmsnap_pcache_retrier_stats *stats);

/* Cancel queued retries (they are left alone, not attempted), join the thread and free. Returns
 * within one retry's duration. Accepts NULL. */
VMSNAP_API void vmsnap_pcache_retrier_free(struct vmsnap_pcache_retrier *r);

struct vmsnap_pcache_evict_opts {
    bool staged; /* unlink and truncate regular files that are ours alone (see above) */
    /* start writeback of dirty files with sync_file_range(SYNC_FILE_RANGE_WRITE), which does
     * not wait, so that retries find clean pages sooner */
    bool kick_writeback;
    /* NULL-terminated list of preserved paths (files, or directories whose whole tree is
     * preserved), matched by device and inode; NULL: none. Each must exist. */
    const char *const *preserve;
    /* Dirty files are scheduled here (NULL: only counted as dirty). Not owned. */
    struct vmsnap_pcache_retrier *retrier;
};

/* What an evict did. Evict calls add to it: zero it before the first. */
struct vmsnap_pcache_report {
    uint64_t files;         /* regular files visited */
    uint64_t dropped_files; /* files whose clean pages were dropped */
    uint64_t dropped_pages; /* pages they had cached */
    uint64_t removed_files; /* files truncated and unlinked (staged) */
    uint64_t removed_bytes; /* their sizes */
    uint64_t removed_pages; /* pages they had cached (0 when cachestat is unavailable) */
    uint64_t dirty_files;   /* files left with dirty or writeback pages */
    uint64_t dirty_pages;   /* their dirty + writeback pages */
    uint64_t scheduled;     /* of those, handed to the retrier */
    uint64_t kicked;        /* files whose writeback was started */
    uint64_t unknown_files; /* preserve treatment skipped: cachestat unavailable */
    uint64_t removed_dirs;  /* directories removed (vmsnap_pcache_release_dir only) */
    /* staged files not removed, only evicted, because something else holds them: open or mapped
     * by another process, being executed, or linked elsewhere meanwhile (then the name is gone,
     * the content kept) */
    uint64_t busy_files;
    /* staged files not removed, only evicted: not writable (read-only file system or mount,
     * immutable file) */
    uint64_t readonly_files;
    uint64_t skipped_mounts; /* directories not entered: on another mount */
};

/* Evict the page cache of `path` (a file, or a directory walked recursively without following
 * symlinks below it or leaving its mount) as `opts` says (NULL: preserve treatment, no retrier).
 * With opts->staged a symlink given as `path` is refused (-ELOOP); otherwise it is followed.
 * Adds to `rep` (may be NULL). Per-file failures do not stop the walk: the first is returned as
 * -errno with `err` naming the file; files that vanish and special files inside the tree are
 * skipped; `path` itself being something else than a regular file or a directory is -EINVAL.
 * Never modifies a file unless opts->staged and the file is a single-link regular file outside
 * every preserved path that no other process has open or mapped (checked with a write lease where
 * the file system supports leases; where it does not, this is logged once and not checked). */
VMSNAP_API int vmsnap_pcache_evict(const char *path, const struct vmsnap_pcache_evict_opts *opts,
                                   struct vmsnap_pcache_report *rep, struct vmsnap_err *err);

/* Release a restore directory once the guest has loaded it: staged eviction of `dir` with the
 * paths in `preserve` (NULL-terminated, relative to `dir`, may be NULL) kept, then removal of
 * every directory left empty, `dir` included, unless preserved. `dir` must be a directory, not a
 * symlink to one (-ENOTDIR, -ELOOP); the walk stays on its mount. Dirty preserved files go to
 * `retrier` (may be NULL). Returns 0 or the first -errno, like vmsnap_pcache_evict(). */
VMSNAP_API int vmsnap_pcache_release_dir(const char *dir, const char *const *preserve,
                                         struct vmsnap_pcache_retrier *retrier,
                                         struct vmsnap_pcache_report *rep, struct vmsnap_err *err);

/* For `unpack --drop-cache` / `pull --drop-cache`: after the destination `path` is complete and
 * renamed into place, drop its clean pages now, start writeback of dirty ones when
 * `kick_writeback`, and schedule the file on `retrier` (may be NULL) if it is still dirty. Never
 * modifies the file. Adds to `rep` (may be NULL). Returns 0 or -errno. A process about to exit
 * should vmsnap_pcache_retrier_wait() for the schedule (3 s by default) before freeing. */
VMSNAP_API int vmsnap_pcache_drop_written(const char *path, bool kick_writeback,
                                          struct vmsnap_pcache_retrier *retrier,
                                          struct vmsnap_pcache_report *rep, struct vmsnap_err *err);

#ifdef __cplusplus
}
#endif
#endif
