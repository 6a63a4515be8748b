/* SPDX-License-Identifier: Apache-2.0 */
/*
 * vmsnapd, the node daemon: the one private header of daemon/. The daemon uses the library only
 * through the public headers (include/vmsnap/), as the CLI does.
 *
 * Layers, one way: config, paths, errmap, jsonbody <- router (pure: a request in, a response
 * out; the fuzz target drives it without a server) <- ops (operations, queue, workers, budgets)
 * <- res_* (one file per resource) <- http (libmicrohttpd) <- main.
 *
 * Thread safety: the router and the resources run on libmicrohttpd's connection threads and
 * the operation workers; everything they share (the operation table, metrics) is behind the
 * locks named below.
 */
#ifndef VMSNAPD_DAEMON_H
#define VMSNAPD_DAEMON_H

#include "vmsnap/common.h"

#include <json.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define D_MAX_ROOTS 16
#define D_MAX_PROFILES 16
#define D_REQ_ID_LEN 17 /* 16 hex digits */

/* ---- config.c: the node's configuration (file, then flags) ---- */

struct d_profile {
    char *name;     /* what a request may name */
    char *aws;      /* the AWS profile it uses (NULL: the same name) */
    char *endpoint; /* NULL: the profile's own or AWS's */
    char *region;
    bool path_style;
};

struct d_config {
    char *socket;
    unsigned socket_mode; /* 0660 */
    char *socket_group;   /* NULL: the daemon's */
    char *roots[D_MAX_ROOTS];
    size_t n_roots;
    char *asset_dirs[D_MAX_ROOTS];
    size_t n_asset_dirs;
    struct d_profile profiles[D_MAX_PROFILES];
    size_t n_profiles;
    char *state_dir; /* VMs (NULL: the library's default) */
    char *ram_dir;
    char *cache_dir; /* the node's object cache (NULL: the library's default) */
    uint64_t cache_size;
    char *qemu, *accel;
    unsigned workers;         /* operations running at once (2) */
    unsigned queue_max;       /* operations waiting (16) */
    unsigned codec_threads;   /* node budget of codec threads (CPUs) */
    uint64_t memory;          /* node budget of transfer/codec buffer memory (512 MiB) */
    unsigned connections;     /* node budget of store connections (16) */
    unsigned op_threads;      /* per operation at most (0: budget / workers) */
    uint64_t op_memory;       /* per operation at most */
    unsigned op_connections;  /* per operation at most */
    double deadline;          /* default deadline of an operation, seconds (3600) */
    double stop_timeout;      /* SIGTERM: seconds in-flight work may take (30) */
    size_t body_max;          /* request body bytes at most (64 KiB) */
    size_t header_mem;        /* libmicrohttpd's per-connection memory: headers (16 KiB) */
    unsigned max_connections; /* concurrent connections (64) */
    unsigned retry_after;     /* a 503's Retry-After: at least this, and before any history (2) */
    /* Bulk operations (priority 0 and a budget: suspend, push, rm, gc, export) yield to the ones a
     * user waits on (resume, run, pull): at most bulk_workers of them run at once (0: workers - 1,
     * at least 1), so a resume finds a worker free; their threads run at nice +bulk_nice (0: off;
     * a busy node starves niced suspends, bench/RESULTS.md). */
    unsigned bulk_workers;
    unsigned bulk_nice;
};

void d_config_init(struct d_config *c);
void d_config_fini(struct d_config *c);
/* Read `path` ("key = value" lines, '#' comments; docs/daemon.md). 0 or -errno, err naming the
 * file and line. */
int d_config_load(struct d_config *c, const char *path, struct vmsnap_err *err);
/* Apply one setting (from the file or a flag). */
int d_config_set(struct d_config *c, const char *key, const char *value, struct vmsnap_err *err);
/* Check the whole configuration once (socket set, roots absolute, ...). */
int d_config_check(const struct d_config *c, struct vmsnap_err *err);
const struct d_profile *d_config_profile(const struct d_config *c, const char *name);

/* ---- paths.c: what a request may name on the node ---- */

/* `path` (absolute, no "." or ".." component, no empty one) must lie under one of `roots`,
 * after every symlink of its existing part is resolved; `out` gets the lexical path. For a
 * path that does not exist yet its deepest existing ancestor is resolved. -EACCES naming the
 * path when it is outside, -EINVAL when it is not a plain absolute path. */
int d_path_check(const char *path, char *const *roots, size_t n_roots, const char *what, char *out,
                 size_t len, struct vmsnap_err *err);
/* A store URL a request may name: s3:// and gs:// as they are; a local store's path (or
 * file:// URL) under the roots. */
int d_url_check(const char *url, char *const *roots, size_t n_roots, char *out, size_t len,
                struct vmsnap_err *err);

/* ---- errmap.c: the CLI's error contract (docs/cli.md) over HTTP ---- */

/* Not an errno: "the request is wrong" (the CLI's usage class, code 2, errno null). */
#define D_EUSAGE 100000

/* The CLI's exit code for -errno `rc` (cli_exit_code's table); `cancelled`: the operation was. */
int d_exit_code(int rc, bool cancelled);
const char *d_class_name(int code, int errnum);
/* The HTTP status of an error of that code and errno. */
unsigned d_http_status(int code, int errnum);

/* ---- jsonbody.c: request bodies, strictly ---- */

enum d_ftype { D_STR, D_INT, D_BOOL, D_OBJ_ARRAY, D_STR_ARRAY };
struct d_field {
    const char *name;
    enum d_ftype type;
    bool required;
};
/* Parse `body` as one JSON object whose keys are all in `fields` (NULL-name terminated), with
 * the types given and the required ones present. *out is the caller's (json_object_put). An
 * unknown key, a wrong type, trailing bytes, nesting deeper than 8: -EINVAL naming the key. */
int d_body_parse(const char *body, size_t len, const struct d_field *fields, json_object **out,
                 struct vmsnap_err *err);
const char *d_jstr(json_object *o, const char *key);
int64_t d_jint(json_object *o, const char *key, int64_t dflt);
bool d_jbool(json_object *o, const char *key);

/* ---- router.c: requests to handlers ---- */

struct d_ctx; /* the daemon: config, operations, metrics (ops.c) */

struct d_request {
    const char *method;
    const char *path; /* without the query */
    const char *query;
    const char *body;
    size_t body_len;
    char id[D_REQ_ID_LEN];
    struct d_ctx *ctx;
    const char *params[4]; /* the path's {parameters}, in order (percent-decoded, in pbuf) */
    size_t n_params;
    char pbuf[1024];
};

struct d_response {
    unsigned status;
    json_object *body; /* owned; NULL: none */
    char *text;        /* or a plain-text body (metrics), owned */
    const char *content_type;
    unsigned retry_after; /* > 0: a Retry-After header */
};

/* Route `rq` and fill `rs` (always: an unknown path or method is a 404/405 error object). */
void d_route(struct d_request *rq, struct d_response *rs);
/* Fill `rs` with the error object for -errno `rc` and `err`'s message. */
void d_error(struct d_response *rs, int rc, const struct vmsnap_err *err, bool cancelled);
void d_error_msg(struct d_response *rs, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* {"schema":1} plus the caller's keys */
json_object *d_obj(void);
json_object *d_seconds(double s);
/* The route table, for the fuzz target and the OpenAPI test: method and pattern of row i, or
 * NULL past the end. */
const char *d_route_pattern(size_t i, const char **method);

/* ---- log.c: structured JSON lines on stderr ---- */

void d_log_init(int level);
void d_log(enum vmsnap_log_level level, const char *req_id, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* One request's access line. */
void d_log_access(const struct d_request *rq, unsigned status, double seconds);
/* The library's callback: lines carry the operation id of the thread's scope. */
void d_log_lib(void *arg, enum vmsnap_log_level level, const char *msg);

/* ---- metrics.c ---- */

struct d_metrics;
struct d_metrics *d_metrics_new(void);
void d_metrics_free(struct d_metrics *m);
void d_metrics_request(struct d_metrics *m, unsigned status);
/* An operation `kind` ended after `seconds` with exit code `code` (0: ok), having moved those
 * bytes. */
void d_metrics_op(struct d_metrics *m, const char *kind, double seconds, int code, uint64_t up,
                  uint64_t down, uint64_t cached);
void d_metrics_step(struct d_metrics *m, const char *step, double seconds);
void d_metrics_admit(struct d_metrics *m, bool admitted);
/* The exposition (caller frees). */
char *d_metrics_text(struct d_metrics *m, unsigned queued, unsigned running);

/* ---- ops.c: operations, admission, budgets ---- */

enum d_op_state { D_OP_QUEUED, D_OP_RUNNING, D_OP_DONE, D_OP_FAILED, D_OP_CANCELLED };

/* What an operation was granted from the node's budgets; passed in the library's options.
 * Threads and connections are reserved for the operation's life; `memory` is only its cap:
 * the bytes are the node's `memory` budget, `shared` live by every operation in flight. */
struct d_grant {
    unsigned threads;
    uint64_t memory;
    unsigned connections;
    struct vmsnap_xfer_budget *shared;
};

struct d_op;
/* The work of one operation: runs on a worker under the operation's cancellation scope; fills
 * `result` (an object, owned by the caller) and returns 0 or -errno with err. */
typedef int (*d_op_fn)(struct d_op *op, const struct d_config *cfg, const struct d_grant *g,
                       json_object *result, struct vmsnap_err *err);

struct d_op_spec {
    const char *kind;   /* "disk.create", "set.push", "vm.resume", ... */
    const char *target; /* what it locks: one operation at a time per target (a VM, a path) */
    int priority;       /* higher first: resumes before suspends */
    bool needs_budget;  /* takes threads/memory/connections from the node budget */
    double deadline;    /* seconds after admission; 0: the configured default */
    d_op_fn fn;
    void *arg; /* owned by the operation: freed with free_arg */
    void (*free_arg)(void *arg);
};
/* an operation's argument */
void *d_op_arg(struct d_op *op);

struct d_ctx *d_ctx_new(const struct d_config *cfg, struct vmsnap_err *err);
/* Stop: no new operations, the queued ones cancelled, running ones given `timeout` seconds and
 * then cancelled; returns when every worker has ended. */
void d_ctx_stop(struct d_ctx *c, double timeout);
void d_ctx_free(struct d_ctx *c);
const struct d_config *d_ctx_config(const struct d_ctx *c);
struct d_metrics *d_ctx_metrics(struct d_ctx *c);
struct vmsnap_pcache_retrier *d_ctx_retrier(struct d_ctx *c);
bool d_ctx_stopping(const struct d_ctx *c);

/* Admit an operation: 202 with the operation object in rs; 409 naming the operation running
 * on the same target; 503 + Retry-After when the queue is full or the daemon stops. The spec's
 * arg is the operation's from here on (freed also on refusal). */
void d_op_submit(struct d_ctx *c, const struct d_request *rq, const struct d_op_spec *spec,
                 struct d_response *rs);
/* GET /v1/operations/{id} (?wait=SECONDS), DELETE (cancel), GET /v1/operations */
void d_op_get(struct d_ctx *c, const char *id, double wait, struct d_response *rs);
void d_op_cancel(struct d_ctx *c, const char *id, struct d_response *rs);
void d_op_list(struct d_ctx *c, struct d_response *rs);
void d_ops_counts(struct d_ctx *c, unsigned *queued, unsigned *running);
/* Seconds a refused client should wait (Retry-After): the queue ahead of it over the workers,
 * at the recent operations' mean time; `retry_after` at least and before any history. */
unsigned d_ops_retry_after(struct d_ctx *c);
/* The node's memory budget: its size, the bytes the operations in flight hold now and the most
 * they held at once. */
void d_ops_memory(struct d_ctx *c, uint64_t *budget, uint64_t *used, uint64_t *peak);
/* The operation on `target` now (queued or running; NULL when none) and the last one that ended
 * there (NULL when none since the daemon started; the last KEEP_LAST targets are kept), as
 * the API shows operations. The caller owns both (json_object_put). */
void d_op_target(struct d_ctx *c, const char *target, json_object **current, json_object **last);
/* The operation id (valid while the operation exists) */
const char *d_op_id(const struct d_op *op);

/* ---- recover.c: the journal of operations in flight, start-up recovery, last operations ---- */

/* Under <state_dir>/vmsnapd/ (docs/daemon.md, "Service life"): ops/<id>.json for each operation
 * running now (written before its library call, removed after it ended), last/<vm>.json the last
 * operation of each VM, `alive` touched every second (when the daemon died), `lock` (one daemon
 * per state directory). */
struct d_journal;
/* Open the journal (locked: EBUSY when another daemon holds it), and before anything is served
 * recover what a killed daemon left: for every entry the sweeps of its kind (a VM settled,
 * temporaries and push leftovers removed), reported as a failed operation of class interrupted
 * whose result says what recovery did; the VMs' last operations loaded. Then the heartbeat
 * starts and `c` journals its operations. 0 or -errno. */
int d_recover(struct d_ctx *c, const struct d_config *cfg, struct d_journal **out,
              struct vmsnap_err *err);
/* Stop the heartbeat and free (after d_ctx_stop: no operation journals any more). */
void d_journal_close(struct d_journal *j);
/* ops.c's hooks: an operation starts (its body: NULL when it has none), ends; the last
 * operation of `target` (persisted for VM targets). */
void d_journal_begin(struct d_journal *j, const char *id, const char *kind, const char *target,
                     double started, json_object *body);
void d_journal_end(struct d_journal *j, const char *id);
void d_journal_last(struct d_journal *j, const char *target, json_object *op);

/* ops.c: what recovery hands the operation table */
struct d_recovered {
    const char *id, *kind, *target;
    double started;        /* wall clock, from the journal */
    struct vmsnap_err err; /* "interrupted: ...; recovery: ..." */
    json_object *result;   /* {"recovery": {...}} (a reference taken) */
};
void d_ctx_set_journal(struct d_ctx *c, struct d_journal *j);
/* A finished operation (state failed, class interrupted) in the table and as its target's last. */
void d_op_recovered(struct d_ctx *c, const struct d_recovered *r);
/* `op` (an operation object) as target's last operation (a reference taken). */
void d_op_set_last(struct d_ctx *c, const char *target, json_object *op);

/* ---- resources (res_*.c): the handlers the route table names ---- */

void r_healthz(struct d_request *rq, struct d_response *rs);
void r_readyz(struct d_request *rq, struct d_response *rs);
void r_metrics(struct d_request *rq, struct d_response *rs);
void r_version(struct d_request *rq, struct d_response *rs);
void r_ops_list(struct d_request *rq, struct d_response *rs);
void r_op_get(struct d_request *rq, struct d_response *rs);
void r_op_cancel(struct d_request *rq, struct d_response *rs);
void r_disk_create(struct d_request *rq, struct d_response *rs);
void r_disk_clone(struct d_request *rq, struct d_response *rs);
void r_disk_info(struct d_request *rq, struct d_response *rs);
void r_set_push(struct d_request *rq, struct d_response *rs);
void r_set_pull(struct d_request *rq, struct d_response *rs);
void r_set_list(struct d_request *rq, struct d_response *rs);
void r_set_remove(struct d_request *rq, struct d_response *rs);
void r_set_gc(struct d_request *rq, struct d_response *rs);
void r_set_export(struct d_request *rq, struct d_response *rs);
void r_pcache_stat(struct d_request *rq, struct d_response *rs);
void r_pcache_evict(struct d_request *rq, struct d_response *rs);
void r_objcache_stat(struct d_request *rq, struct d_response *rs);
void r_objcache_trim(struct d_request *rq, struct d_response *rs);
void r_vm_list(struct d_request *rq, struct d_response *rs);
void r_vm_info(struct d_request *rq, struct d_response *rs);
void r_vm_run(struct d_request *rq, struct d_response *rs);
void r_vm_action(struct d_request *rq, struct d_response *rs); /* pause/suspend/resume/stop */

/* Shared by the resources (res_node.c). */
struct vmsnap_xfer_opts;
/* Parse the body against `fields`; on failure fill rs and return NULL. */
json_object *d_req_body(struct d_request *rq, struct d_response *rs, const struct d_field *fields);
/* Replace o[key] (when present, or required) by its checked form: a path under the roots
 * (d_path_check), a store URL (d_url_check), a profile configured on the node. 0, or fills rs
 * and returns < 0. */
int d_req_path(struct d_request *rq, struct d_response *rs, json_object *o, const char *key,
               bool required);
int d_req_url(struct d_request *rq, struct d_response *rs, json_object *o, const char *key,
              bool required);
int d_req_profile(struct d_request *rq, struct d_response *rs, json_object *o);
/* The library's transfer options of an operation: the grant, the node's cache, the profile's
 * store settings (strings point into `o` and the config). */
void d_xfer_opts(const struct d_config *cfg, json_object *o, const struct d_grant *g,
                 struct vmsnap_xfer_opts *x);
/* The op_fn's argument: the request body (json_object_put when the operation goes). */
void d_free_json(void *arg);
json_object *d_op_body(struct d_op *op);
/* Submit an operation whose argument is the body `o` (owned from here on). */
void d_submit_body(struct d_request *rq, struct d_response *rs, const char *kind,
                   const char *target, int priority, bool budget, d_op_fn fn, json_object *o);

/* ---- http.c (libmicrohttpd) and sock.c ---- */

struct d_http;
struct d_http *d_http_start(struct d_ctx *ctx, int listen_fd, struct vmsnap_err *err);
void d_http_quiesce(struct d_http *h, double timeout);
void d_http_stop(struct d_http *h);
/* Bind and listen on the unix socket `path` (mode, group): a live socket there (someone
 * accepts) is refused with EADDRINUSE, a stale one replaced, anything else refused. */
int d_sock_listen(const char *path, unsigned mode, const char *group, struct vmsnap_err *err);

/* A query parameter's value into buf (NULL when absent). */
const char *d_query(const struct d_request *rq, const char *key, char *buf, size_t len);

#endif
