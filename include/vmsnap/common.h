/* SPDX-License-Identifier: Apache-2.0 */
/*
 * vmsnap common definitions: the error value every fallible call fills, the export macro, the
 * log callback and the version.
 *
 * Conventions (all modules): functions return >= 0 on success and a negative errno on failure.
 * The last parameter of a fallible call is `struct vmsnap_err *err` (NULL allowed); on failure
 * it holds the same code and a message naming what failed and where. The library never prints
 * and never exits; it reports through the log callback set with vmsnap_set_log().
 */
#ifndef VMSNAP_COMMON_H
#define VMSNAP_COMMON_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define VMSNAP_API __attribute__((visibility("default")))

#define VMSNAP_ERR_MSG_MAX 1024

/* An error: a positive errno in `code` and a human-readable message. Caller-owned. */
struct vmsnap_err {
    int code;
    char msg[VMSNAP_ERR_MSG_MAX];
};

/* Fill `err` (if not NULL) with `code` (a positive errno) and a formatted message.
 * Returns -code, so a caller can write `return vmsnap_err_set(err, EIO, "...")`. */
VMSNAP_API int vmsnap_err_set(struct vmsnap_err *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Prefix the message in `err` with formatted context ("pull s3://b/k: " + old message).
 * Keeps the code. Returns -err->code (or -EIO if err is NULL or empty). */
VMSNAP_API int vmsnap_err_wrap(struct vmsnap_err *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Reset `err` to "no error". */
VMSNAP_API void vmsnap_err_clear(struct vmsnap_err *err);

/* Cancel the long operations running in this process (pack, unpack, inspect --verify, push,
 * pull, and a VM's upload or download): they check between frames, parts and ranges (a request
 * in flight completes), fail with ECANCELED ("interrupted (SIGINT)"), and clean up as on any
 * other failure: temporary files removed, multipart uploads aborted, a half-stored set deleted,
 * a suspend's checkpoint kept locally. `sig` names the cause in the message (a signal number, or
 * -1); 0 clears it. Async-signal-safe: the CLI calls it on SIGINT, SIGTERM and SIGHUP. */
VMSNAP_API void vmsnap_cancel(int sig);
/* What vmsnap_cancel() was given, else what this thread's scope was cancelled with (0: not
 * cancelled). */
VMSNAP_API int vmsnap_cancelled(void);

/* A cancellation scope, for a process running several operations at once (the node daemon):
 * vmsnap_cancel() cancels every operation of the process; vmsnap_scope_cancel() only those that
 * run under the scope, i.e. on a thread that entered it with vmsnap_scope_enter() and on every
 * thread the library starts on that thread's behalf while it is entered (codec workers, the
 * transfer pool, disk copy threads; not the page cache's shared retrier). A cancelled operation
 * fails and cleans up exactly as after vmsnap_cancel(sig). `arg` is the caller's (e.g. the
 * operation's id, for its log callback: vmsnap_scope_arg() on any of those threads).
 * vmsnap_scope_new() returns NULL when out of memory. The scope must outlive the calls made
 * under it (they join their threads before returning); free it after. vmsnap_scope_enter(NULL)
 * leaves the thread's scope. Cancel and arg are thread-safe; enter affects the calling thread. */
struct vmsnap_scope;
VMSNAP_API struct vmsnap_scope *vmsnap_scope_new(void *arg);
VMSNAP_API void vmsnap_scope_free(struct vmsnap_scope *s);
VMSNAP_API void vmsnap_scope_enter(struct vmsnap_scope *s);
VMSNAP_API void vmsnap_scope_cancel(struct vmsnap_scope *s, int sig);
/* The `arg` of the calling thread's scope, or NULL when it has none. */
VMSNAP_API void *vmsnap_scope_arg(void);

enum vmsnap_log_level {
    VMSNAP_LOG_ERROR = 0,
    VMSNAP_LOG_WARN = 1,
    VMSNAP_LOG_INFO = 2,
    VMSNAP_LOG_DEBUG = 3,
};

/* Log callback: called from any thread; must be thread-safe. `msg` has no trailing newline. */
typedef void (*vmsnap_log_fn)(void *arg, enum vmsnap_log_level level, const char *msg);

/* Install the process-wide log callback (NULL: discard) and the most verbose level passed to it.
 * Not thread-safe against concurrent logging: set it once at start-up. */
VMSNAP_API void vmsnap_set_log(vmsnap_log_fn fn, void *arg, enum vmsnap_log_level max_level);

/* Library version string, e.g. "0.1.0". */
VMSNAP_API const char *vmsnap_version(void);

#ifdef __cplusplus
}
#endif
#endif
