/* SPDX-License-Identifier: Apache-2.0 */
/* Private system helpers: whole-buffer I/O, atomically published output files, CPU count. */
#ifndef VMSNAP_SYS_H
#define VMSNAP_SYS_H

#include "util/util.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

/* pread/pwrite/write the whole buffer, retrying on EINTR and short counts.
 * pread_full returns the bytes read (less than len only at end of file) or -errno. */
ssize_t sys_pread_full(int fd, void *buf, size_t len, uint64_t off);
int sys_pwrite_full(int fd, const void *buf, size_t len, uint64_t off);
int sys_write_full(int fd, const void *buf, size_t len);

/* Online CPUs (at least 1). */
unsigned sys_cpus(void);
/* Sleep `ms` milliseconds (the whole time: resumed after a signal). */
void sys_sleep_ms(unsigned ms);

/* A file created under a temporary name beside `path` and renamed onto it by commit.
 * Abort (or a failed commit) unlinks the temporary file; nothing appears at `path`. */
struct sys_atomic_file {
    int fd;
    char *path;
    char *tmp;
};
/* True when `path` exists and is the file open at `fd` (an output that would replace its own
 * input). */
bool sys_same_file(int fd, const char *path);
int sys_atomic_open(struct sys_atomic_file *af, const char *path, mode_t mode,
                    struct vmsnap_err *err);
/* The same, the temporary named ".vmsnap-TAG.PID.XXXXXX" (not after the file) and flocked while
 * open: a caller can remove those a killed process left (PID gone, lock free). */
int sys_atomic_open_tagged(struct sys_atomic_file *af, const char *path, mode_t mode,
                           const char *tag, struct vmsnap_err *err);
/* fsync the file (if `sync`), rename onto the final path, fsync the directory (if `sync`; when
 * only that fails, the file is in place and the error says so). */
int sys_atomic_commit(struct sys_atomic_file *af, bool sync, struct vmsnap_err *err);
/* The same; with `noreplace`, a file that appeared at the path meanwhile is kept and the commit
 * fails with EEXIST (a caller that checked the path was free at the start, without --force). */
int sys_atomic_commit_ex(struct sys_atomic_file *af, bool sync, bool noreplace,
                         struct vmsnap_err *err);
/* Close the temporary file before the commit (a delayed write error shows here); the commit then
 * only renames, and cannot fsync the data any more: fsync before closing when it matters. */
int sys_atomic_close(struct sys_atomic_file *af, struct vmsnap_err *err);
void sys_atomic_abort(struct sys_atomic_file *af);
/* Release `af` leaving the temporary where it is (it went with its directory: sys_dir_swap). */
void sys_atomic_forget(struct sys_atomic_file *af);

/* Test hook, one for every module: VMSNAP_FAILPOINT=NAME kills the process at the point NAME
 * (SIGKILL: no clean-up runs, as a crash or the OOM killer would), NAME:stop freezes it there
 * (SIGSTOP; continued, it waits 0.2 s: a signal a test sent while it was stopped, a SIGINT
 * before its SIGCONT, is taken by the CLI's signal thread, which needs that time to set the
 * cancel flag before this thread runs past the checks the test is about). */
void sys_failpoint(const char *name);

/* fsync the directory holding `path`. */
int sys_fsync_parent(const char *path, struct vmsnap_err *err);
/* 0 when `path` is a regular file or nothing: what may be replaced by a rename. Else an error
 * naming what is there (a directory, a link, a FIFO, a socket, a device). */
int sys_check_replaceable(const char *path, struct vmsnap_err *err);
/* Remove `path` and, when it is a directory (not a link to one), everything below it, through
 * directory descriptors opened without following links: a directory of the tree renamed away
 * and replaced by a link while this runs (a tree in a world-writable place such as /dev/shm)
 * makes nothing outside the tree go. 0, or -errno of the first failure (it goes on). */
int sys_rm_tree(const char *path);
/* The absolute, canonical spelling of `path` in `out` (PATH_MAX bytes): realpath() of its
 * longest existing ancestor, then the rest without empty or "." components. Two spellings of one
 * directory (a trailing slash, a relative path, a symlinked parent) give one string, also before
 * the directory exists. 0, or -errno (ENAMETOOLONG, or EINVAL for ".." after a missing part). */
int sys_canon_path(const char *path, char *out);
/* `path` made absolute (from the working directory) with "." and ".." resolved as text, as the
 * local store names its keys (a ".." drops what precedes it, whether that exists or not), in
 * `out` (`len` bytes; "/" for the root). 0, or -errno (getcwd), -ENAMETOOLONG. */
int sys_lexical_path(const char *path, char *out, size_t len);

/* Replace several files of a directory at once (lib/sys/dirswap.c): the directory's new state is
 * built beside it, of hard links, and swapped in by one renameat2(RENAME_EXCHANGE); a reader or
 * a kill sees the old directory or the new one. Caller-owned; begin, add each file, commit (or
 * abort). */
struct sys_dir_swap {
    char dir[4096]; /* the directory's canonical path */
    char side[256]; /* the sibling's name in the parent */
    int dfd, pfd, sfd;
    bool made, swapped;
    dev_t dev; /* the directory as it was at the start */
    ino_t ino;
    struct timespec mtime;
};
/* Names the directory does not keep (the files being replaced, the caller's temporaries). */
typedef bool sys_dir_swap_skip_fn(const char *name, void *arg);
/* Build the sibling holding a link of every entry of `dir` that `skip` does not name. Any
 * failure here, in _add or in _commit before the exchange leaves `dir` as it was (the caller can
 * publish another way); -EOPNOTSUPP where a swap would change more than the files: a
 * subdirectory, extended attributes, an immutable file, an owner, group or mode the new
 * directory cannot get. */
int sys_dir_swap_begin(struct sys_dir_swap *s, const char *dir, sys_dir_swap_skip_fn *skip,
                       void *arg, struct vmsnap_err *err);
/* Link the file at `from` (on the same filesystem) into the new state as `name`. */
int sys_dir_swap_add(struct sys_dir_swap *s, const char *from, const char *name,
                     struct vmsnap_err *err);
/* Swap the new state in (fsyncs first with `sync`), remove the old one; `swapped` says whether
 * the exchange happened (a failure without it changed nothing: a mount point, a filesystem
 * without RENAME_EXCHANGE, a directory changed meanwhile). Ends the swap either way. */
int sys_dir_swap_commit(struct sys_dir_swap *s, bool sync, struct vmsnap_err *err);
/* Remove the sibling (before a commit: nothing in `dir` changed). Idempotent. */
void sys_dir_swap_abort(struct sys_dir_swap *s);
/* Remove the siblings of `dir` that killed swaps left (their PID gone, their lock free). */
void sys_dir_swap_sweep(const char *dir);

#endif
