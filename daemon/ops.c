/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Operations: every mutating request becomes one, with an id, a target (a VM, a path, a store
 * URL) and a priority. Admission (d_op_submit) refuses at once what cannot be taken: a second
 * operation on a busy target (409, naming the one there), a full queue or a stopping daemon (503
 * with Retry-After). Admitted operations wait in one queue, highest priority first (resumes
 * before suspends: a user waits on a resume), then in arrival order; `workers` threads run them.
 * Bulk operations (priority 0 with a budget: suspend, push, rm, gc, export) take at most
 * bulk_workers of them (a resume finds one free) and, if bulk_nice is set, run at nice +bulk_nice
 * on a thread of their own, which the library's threads for them inherit.
 * Before one starts it is granted codec threads and store connections from the node's budgets
 * (reserved for its life) and a cap on buffer memory, whose bytes come from the node's memory
 * budget shared live by every operation in flight (a vmsnap_xfer_budget); the resource passes
 * them in the library's options; an operation whose threads or connections do not fit waits, and
 * one that fits behind it may go first only if it has the same or a higher priority. Each operation
 * runs under its own cancellation scope (vmsnap_scope_*): DELETE of a running one cancels it
 * exactly as Ctrl-C cancels the CLI (the library's clean-up on ECANCELED), a queued one is dropped,
 * and a watchdog cancels what passes its deadline.
 *
 * One mutex guards the table, the queue and the budgets; `work` wakes workers, `done` wakes
 * waiters of ?wait=. At most 256 finished operations are kept (oldest dropped first).
 */
#include "daemon.h"

#include "vmsnap/pcache.h"
#include "vmsnap/xfer.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#define KEEP_FINISHED 256
#define KEEP_LAST 4096 /* targets whose last operation is remembered (oldest dropped first) */

struct d_op {
    char id[D_REQ_ID_LEN];
    char *kind, *target, *req_id;
    int priority;
    uint64_t seq;
    enum d_op_state state;
    double created, started, ended; /* wall clock, for the API */
    double t_start;                 /* monotonic */
    double deadline_at;             /* monotonic */
    double deadline;
    bool needs_budget, cancel_asked, deadline_hit;
    bool recovered; /* what a killed daemon left, reported at start-up (recover.c) */
    struct d_grant grant;
    struct vmsnap_scope *scope;
    d_op_fn fn;
    void *arg;
    void (*free_arg)(void *arg);
    json_object *result;
    int rc;
    struct vmsnap_err err;
    struct d_op *next; /* every operation, newest first */
};

struct d_ctx {
    const struct d_config *cfg;
    struct d_metrics *metrics;
    struct vmsnap_pcache_retrier *retrier;
    pthread_mutex_t mu;
    pthread_cond_t work, done;
    struct d_op *ops;
    json_object *last; /* target -> its last finished operation (op_json), in finishing order */
    unsigned queued, running, finished;
    unsigned running_bulk; /* bulk operations running (is_bulk) */
    uint64_t seq;
    unsigned threads_free, conns_free;
    struct vmsnap_xfer_budget *mem; /* the node's `memory`, shared live (struct d_grant) */
    double avg_secs; /* recent operations' mean time on a worker (Retry-After), n_secs of them */
    unsigned n_secs;
    struct d_journal *journal; /* operations in flight, last operations (recover.c) */
    pthread_t *tids, watchdog;
    unsigned n_tids;
    bool watchdog_up, stopping, quit;
};

static double wall_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static double mono(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void op_free(struct d_op *op)
{
    if (op->free_arg)
        op->free_arg(op->arg);
    json_object_put(op->result);
    vmsnap_scope_free(op->scope);
    free(op->kind);
    free(op->target);
    free(op->req_id);
    free(op);
}

static struct d_op *find(struct d_ctx *c, const char *id)
{
    for (struct d_op *o = c->ops; o; o = o->next)
        if (!strcmp(o->id, id))
            return o;
    return NULL;
}

static bool finished(const struct d_op *o)
{
    return o->state != D_OP_QUEUED && o->state != D_OP_RUNNING;
}

/* drop the oldest finished operations past KEEP_FINISHED (under mu) */
static void prune(struct d_ctx *c)
{
    while (c->finished > KEEP_FINISHED) {
        struct d_op **oldest = NULL;
        for (struct d_op **p = &c->ops; *p; p = &(*p)->next)
            if (finished(*p))
                oldest = p;
        if (!oldest)
            return;
        struct d_op *o = *oldest;
        *oldest = o->next;
        c->finished--;
        op_free(o);
    }
}

/* What an operation may have: the per-operation caps, or the threads and connections divided
 * by the workers; memory: a cap (op_memory, else the whole budget) on the bytes it takes from
 * the node's budget, which the operations in flight share live. */
static struct d_grant want(const struct d_config *cfg)
{
    unsigned w = cfg->workers ? cfg->workers : 1;
    struct d_grant g = {
        .threads = cfg->op_threads ? cfg->op_threads : cfg->codec_threads / w,
        .memory = cfg->op_memory ? cfg->op_memory : cfg->memory,
        .connections = cfg->op_connections ? cfg->op_connections : cfg->connections / w,
    };
    if (g.threads == 0)
        g.threads = 1;
    if (g.connections == 0)
        g.connections = 1;
    if (g.threads > cfg->codec_threads)
        g.threads = cfg->codec_threads;
    if (g.memory > cfg->memory)
        g.memory = cfg->memory;
    if (g.connections > cfg->connections)
        g.connections = cfg->connections;
    return g;
}

/* A bulk operation: one of priority 0 that takes from the budgets (suspend, push, rm, gc, export),
 * which no user waits on as on a resume. */
static bool is_bulk(const struct d_op *o)
{
    return o->priority == 0 && o->needs_budget;
}

/* How many bulk operations may run at once: bulk_workers, else one worker fewer than there are
 * (a resume then always finds one free), at least 1, at most the workers. */
static unsigned bulk_max(const struct d_config *cfg)
{
    unsigned w = cfg->workers ? cfg->workers : 1;
    unsigned b = cfg->bulk_workers ? cfg->bulk_workers : w > 1 ? w - 1 : 1;
    return b > w ? w : b;
}

/* The next queued operation that can start now (under mu): by priority, then arrival; bulk ones
 * only while fewer than bulk_max run; one that needs a budget that is not free holds back those of
 * lower priority. */
static struct d_op *pick(struct d_ctx *c)
{
    struct d_grant g = want(c->cfg);
    bool bulk_ok = c->running_bulk < bulk_max(c->cfg);
    struct d_op *best = NULL;
    for (struct d_op *o = c->ops; o; o = o->next)
        if (o->state == D_OP_QUEUED && (bulk_ok || !is_bulk(o)) &&
            (!best || o->priority > best->priority ||
             (o->priority == best->priority && o->seq < best->seq)))
            best = o;
    if (!best || !best->needs_budget)
        return best;
    if (g.threads <= c->threads_free && g.connections <= c->conns_free)
        return best;
    /* the best waits for the budget; one needing none of it, of the same priority, may go */
    struct d_op *alt = NULL;
    for (struct d_op *o = c->ops; o; o = o->next)
        if (o->state == D_OP_QUEUED && !o->needs_budget && o->priority >= best->priority &&
            (!alt || o->seq < alt->seq))
            alt = o;
    return alt;
}

static json_object *op_json(const struct d_op *o);

/* remember `op` as its target's last operation (under mu): re-added, so the map stays in
 * finishing order and the oldest target goes first past KEEP_LAST */
static void remember(struct d_ctx *c, const struct d_op *op)
{
    if (!c->last)
        return;
    json_object_object_del(c->last, op->target);
    if (json_object_object_length(c->last) >= KEEP_LAST) {
        struct lh_entry *e = lh_table_head(json_object_get_object(c->last));
        char *oldest = e ? strdup((const char *)lh_entry_k(e)) : NULL;
        if (oldest)
            json_object_object_del(c->last, oldest);
        free(oldest);
    }
    json_object *j = op_json(op);
    json_object_object_add(c->last, op->target, j);
    if (c->journal)
        d_journal_last(c->journal, op->target, j);
}

/* An operation that held a worker until its end (not a cancelled one: its time says nothing of
 * the queue's) goes into the recent mean: the plain mean of the first 8, then a moving one
 * weighing the last 8 (under mu). */
static void note_duration(struct d_ctx *c, const struct d_op *op, double secs)
{
    if (op->started <= 0 || op->cancel_asked)
        return;
    if (c->n_secs < 8)
        c->n_secs++;
    c->avg_secs += (secs - c->avg_secs) / c->n_secs;
}

/* Retry-After for a refused request (under mu): the time the queue ahead of it takes to drain,
 * from the recent operations' mean time and the operations queued and running, over the
 * workers: ceil(mean x (queued + running + 1 - workers) / workers), at least `retry_after`
 * (which is also the answer before any operation ended), at most an hour. */
static unsigned retry_after_locked(const struct d_ctx *c)
{
    unsigned floor = c->cfg->retry_after ? c->cfg->retry_after : 1, w = c->cfg->workers;
    if (c->n_secs == 0 || w == 0)
        return floor;
    double ahead = (double)c->queued + c->running + 1.0 - w;
    double est = ahead > 0 ? c->avg_secs * ahead / w : 0;
    if (est > 3600)
        return 3600;
    unsigned s = (unsigned)est + (est > (unsigned)est);
    return s > floor ? s : floor;
}

void d_ops_memory(struct d_ctx *c, uint64_t *budget, uint64_t *used, uint64_t *peak)
{
    *budget = c->cfg->memory;
    vmsnap_xfer_budget_stat(c->mem, used, peak);
}

unsigned d_ops_retry_after(struct d_ctx *c)
{
    pthread_mutex_lock(&c->mu);
    unsigned s = retry_after_locked(c);
    pthread_mutex_unlock(&c->mu);
    return s;
}

static void finish(struct d_ctx *c, struct d_op *op, int rc)
{
    double secs = mono() - op->t_start;
    op->rc = rc;
    op->ended = wall_now();
    op->state = rc == 0 ? D_OP_DONE : op->cancel_asked ? D_OP_CANCELLED : D_OP_FAILED;
    note_duration(c, op, secs);
    int code = rc == 0 ? 0 : d_exit_code(rc, op->cancel_asked);
    uint64_t up = (uint64_t)d_jint(op->result, "object_bytes", 0);
    uint64_t cached = (uint64_t)d_jint(op->result, "cached_bytes", 0);
    bool down = strstr(op->kind, "pull") || strstr(op->kind, "resume");
    d_metrics_op(c->metrics, op->kind, secs, code, down ? 0 : up, down ? up : 0, cached);
    json_object *steps;
    if (rc == 0 && json_object_object_get_ex(op->result, "steps", &steps)) {
        json_object_object_foreach(steps, k, v)
            d_metrics_step(c->metrics, k, json_object_get_double(v));
    }
    d_log(rc == 0 ? VMSNAP_LOG_INFO : VMSNAP_LOG_WARN, op->req_id, "operation %s %s %s: %s%s%s",
          op->id, op->kind, op->target,
          rc == 0 ? "done" : (op->cancel_asked ? "cancelled" : "failed"), rc == 0 ? "" : ": ",
          rc == 0 ? "" : op->err.msg);
    remember(c, op);
}

/* A bulk operation runs on a thread of its own at nice +bulk_nice (the threads the library starts
 * for it inherit that; a thread cannot lower its nice again unprivileged, so the worker's own
 * stays as it is). */
struct op_run {
    struct d_op *op;
    const struct d_config *cfg;
    json_object *result;
    struct vmsnap_err err;
    int rc;
    bool nice;
};

static void *op_run(void *arg)
{
    struct op_run *r = arg;
    if (r->nice) {
        errno = 0;
        int cur = getpriority(PRIO_PROCESS, (id_t)gettid());
        if (errno == 0 &&
            setpriority(PRIO_PROCESS, (id_t)gettid(), cur + (int)r->cfg->bulk_nice) != 0)
            d_log(VMSNAP_LOG_WARN, r->op->req_id, "operation %s: nice +%u: %s", r->op->id,
                  r->cfg->bulk_nice, strerror(errno));
    }
    vmsnap_scope_enter(r->op->scope);
    r->rc = r->op->fn(r->op, r->cfg, &r->op->grant, r->result, &r->err);
    vmsnap_scope_enter(NULL);
    return NULL;
}

static void *worker(void *arg)
{
    struct d_ctx *c = arg;
    pthread_mutex_lock(&c->mu);
    for (;;) {
        struct d_op *op = NULL;
        while (!c->quit && !(op = pick(c)))
            pthread_cond_wait(&c->work, &c->mu);
        if (!op)
            break;
        op->state = D_OP_RUNNING;
        c->queued--;
        c->running++;
        c->running_bulk += is_bulk(op);
        if (op->needs_budget) {
            op->grant = want(c->cfg);
            op->grant.shared = c->mem;
            c->threads_free -= op->grant.threads;
            c->conns_free -= op->grant.connections;
        }
        op->started = wall_now();
        op->t_start = mono();
        pthread_mutex_unlock(&c->mu);
        if (c->journal) /* before the library call: a killed daemon's next start sees it */
            d_journal_begin(c->journal, op->id, op->kind, op->target, op->started,
                            op->free_arg == d_free_json ? op->arg : NULL);

        struct op_run r = {.op = op, .cfg = c->cfg, .result = json_object_new_object()};
        pthread_t t;
        r.nice = c->cfg->bulk_nice && is_bulk(op);
        if (r.nice && pthread_create(&t, NULL, op_run, &r) == 0) {
            pthread_join(t, NULL);
        } else {
            r.nice = false; /* not bulk, or no thread: here, at the worker's priority */
            op_run(&r);
        }
        int rc = r.rc;
        struct vmsnap_err err = r.err;
        json_object *result = r.result;

        pthread_mutex_lock(&c->mu);
        op->result = result;
        op->err = err;
        if (rc < 0 && op->deadline_hit)
            vmsnap_err_wrap(&op->err, "deadline of %.0f s passed: ", op->deadline);
        if (op->needs_budget) {
            c->threads_free += op->grant.threads;
            c->conns_free += op->grant.connections;
        }
        finish(c, op, rc);
        if (c->journal) /* after the last operation is kept */
            d_journal_end(c->journal, op->id);
        c->running--;
        c->running_bulk -= is_bulk(op);
        c->finished++;
        prune(c);
        pthread_cond_broadcast(&c->done);
        pthread_cond_broadcast(&c->work); /* the budget it held may let another start */
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

/* Deadlines: a running operation past its deadline is cancelled (SIGALRM in its message); a
 * queued one fails without running. Checked every 0.2 s. */
static void *watchdog(void *arg)
{
    struct d_ctx *c = arg;
    pthread_mutex_lock(&c->mu);
    while (!c->quit) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_nsec += 200 * 1000 * 1000;
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        pthread_cond_timedwait(&c->done, &c->mu, &ts);
        double now = mono();
        for (struct d_op *o = c->ops; o; o = o->next) {
            if (finished(o) || now < o->deadline_at || o->deadline_hit)
                continue;
            o->deadline_hit = true;
            if (o->state == D_OP_RUNNING) {
                vmsnap_scope_cancel(o->scope, SIGALRM);
                continue;
            }
            c->queued--;
            c->finished++;
            o->t_start = now;
            vmsnap_err_set(&o->err, ETIMEDOUT, "deadline of %.0f s passed while queued",
                           o->deadline);
            finish(c, o, -ETIMEDOUT);
            pthread_cond_broadcast(&c->done);
        }
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

struct d_ctx *d_ctx_new(const struct d_config *cfg, struct vmsnap_err *err)
{
    struct d_ctx *c = calloc(1, sizeof(*c));
    if (!c) {
        vmsnap_err_set(err, ENOMEM, "out of memory");
        return NULL;
    }
    c->cfg = cfg;
    c->threads_free = cfg->codec_threads;
    c->conns_free = cfg->connections;
    pthread_mutex_init(&c->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&c->work, &ca);
    pthread_cond_init(&c->done, &ca);
    pthread_condattr_destroy(&ca);
    c->metrics = d_metrics_new();
    c->last = json_object_new_object();
    c->tids = calloc(cfg->workers + 1, sizeof(pthread_t)); /* 0 workers: the fuzz target's */
    if (!c->metrics || !c->tids || !c->last) {
        vmsnap_err_set(err, ENOMEM, "out of memory");
        goto fail;
    }
    int rc = vmsnap_pcache_retrier_new(NULL, 0, &c->retrier, err);
    if (rc < 0)
        goto fail;
    if ((rc = vmsnap_xfer_budget_new(cfg->memory ? cfg->memory : 1, &c->mem, err)) < 0)
        goto fail;
    for (; c->n_tids < cfg->workers; c->n_tids++)
        if ((rc = pthread_create(&c->tids[c->n_tids], NULL, worker, c)) != 0) {
            vmsnap_err_set(err, rc, "worker thread: %s", strerror(rc));
            goto fail;
        }
    if ((rc = pthread_create(&c->watchdog, NULL, watchdog, c)) != 0) {
        vmsnap_err_set(err, rc, "watchdog thread: %s", strerror(rc));
        goto fail;
    }
    c->watchdog_up = true;
    return c;
fail:
    d_ctx_stop(c, 0);
    d_ctx_free(c);
    return NULL;
}

void d_ctx_stop(struct d_ctx *c, double timeout)
{
    if (!c)
        return;
    pthread_mutex_lock(&c->mu);
    c->stopping = true;
    /* the queued ones never start */
    for (struct d_op *o = c->ops; o; o = o->next)
        if (o->state == D_OP_QUEUED) {
            o->cancel_asked = true;
            o->t_start = mono();
            vmsnap_err_set(&o->err, ECANCELED, "cancelled: the daemon is stopping");
            c->queued--;
            c->finished++;
            finish(c, o, -ECANCELED);
        }
    double end = mono() + timeout;
    while (c->running > 0 && mono() < end) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_sec += 1;
        pthread_cond_timedwait(&c->done, &c->mu, &ts);
    }
    for (struct d_op *o = c->ops; o; o = o->next)
        if (o->state == D_OP_RUNNING) {
            o->cancel_asked = true;
            vmsnap_scope_cancel(o->scope, SIGTERM);
        }
    c->quit = true;
    pthread_cond_broadcast(&c->work);
    pthread_cond_broadcast(&c->done);
    pthread_mutex_unlock(&c->mu);
    for (unsigned i = 0; i < c->n_tids; i++)
        pthread_join(c->tids[i], NULL);
    c->n_tids = 0;
    if (c->watchdog_up)
        pthread_join(c->watchdog, NULL);
    c->watchdog_up = false;
}

void d_ctx_free(struct d_ctx *c)
{
    if (!c)
        return;
    while (c->ops) {
        struct d_op *o = c->ops;
        c->ops = o->next;
        op_free(o);
    }
    if (c->retrier) {
        vmsnap_pcache_retrier_wait(c->retrier, 3.5);
        vmsnap_pcache_retrier_free(c->retrier);
    }
    d_metrics_free(c->metrics);
    vmsnap_xfer_budget_free(c->mem);
    json_object_put(c->last);
    free(c->tids);
    pthread_cond_destroy(&c->work);
    pthread_cond_destroy(&c->done);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

const struct d_config *d_ctx_config(const struct d_ctx *c)
{
    return c->cfg;
}

struct d_metrics *d_ctx_metrics(struct d_ctx *c)
{
    return c->metrics;
}

struct vmsnap_pcache_retrier *d_ctx_retrier(struct d_ctx *c)
{
    return c->retrier;
}

bool d_ctx_stopping(const struct d_ctx *c)
{
    return c->stopping;
}

void *d_op_arg(struct d_op *op)
{
    return op->arg;
}

const char *d_op_id(const struct d_op *op)
{
    return op->id;
}

static void new_id(char out[D_REQ_ID_LEN])
{
    uint64_t v = 0;
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd < 0 || read(fd, &v, sizeof(v)) != (ssize_t)sizeof(v))
        v = (uint64_t)(mono() * 1e9) ^ ((uint64_t)getpid() << 32);
    if (fd >= 0)
        close(fd);
    snprintf(out, D_REQ_ID_LEN, "%016llx", (unsigned long long)v);
}

static const char *state_name(enum d_op_state s)
{
    static const char *const n[] = {"queued", "running", "done", "failed", "cancelled"};
    return n[s];
}

static json_object *wall(double t)
{
    return t > 0 ? d_seconds(t) : NULL;
}

/* the operation as the API shows it (under mu) */
static json_object *op_json(const struct d_op *o)
{
    json_object *j = json_object_new_object();
    json_object_object_add(j, "id", json_object_new_string(o->id));
    json_object_object_add(j, "kind", json_object_new_string(o->kind));
    json_object_object_add(j, "target", json_object_new_string(o->target));
    json_object_object_add(j, "state", json_object_new_string(state_name(o->state)));
    json_object_object_add(j, "request_id", json_object_new_string(o->req_id));
    json_object_object_add(j, "created", wall(o->created));
    json_object_object_add(j, "started", wall(o->started));
    json_object_object_add(j, "ended", wall(o->ended));
    json_object_object_add(j, "deadline_seconds", d_seconds(o->deadline));
    json_object *g = json_object_new_object();
    json_object_object_add(g, "threads", json_object_new_int((int)o->grant.threads));
    json_object_object_add(g, "memory_bytes", json_object_new_int64((int64_t)o->grant.memory));
    json_object_object_add(g, "connections", json_object_new_int((int)o->grant.connections));
    json_object_object_add(j, "grant", g);
    json_object_object_add(
        j, "result", o->state == D_OP_DONE || o->recovered ? json_object_get(o->result) : NULL);
    if (o->state == D_OP_FAILED || o->state == D_OP_CANCELLED) {
        struct d_response tmp = {0};
        d_error(&tmp, o->rc, &o->err, o->cancel_asked);
        json_object *e;
        json_object_object_get_ex(tmp.body, "error", &e);
        json_object_object_add(j, "error", json_object_get(e));
        json_object_put(tmp.body);
    } else {
        json_object_object_add(j, "error", NULL);
    }
    return j;
}

static void op_response(struct d_response *rs, unsigned status, const struct d_op *o)
{
    json_object_put(rs->body);
    rs->status = status;
    rs->body = d_obj();
    json_object_object_add(rs->body, "operation", op_json(o));
}

void d_op_submit(struct d_ctx *c, const struct d_request *rq, const struct d_op_spec *spec,
                 struct d_response *rs)
{
    struct d_op *op = calloc(1, sizeof(*op));
    if (op) {
        op->kind = strdup(spec->kind);
        op->target = strdup(spec->target);
        op->req_id = strdup(rq->id);
        op->scope = vmsnap_scope_new(op->id);
    }
    if (!op || !op->kind || !op->target || !op->req_id || !op->scope) {
        if (spec->free_arg)
            spec->free_arg(spec->arg);
        if (op)
            op_free(op);
        d_error_msg(rs, -ENOMEM, "out of memory");
        return;
    }
    new_id(op->id);
    op->priority = spec->priority;
    op->needs_budget = spec->needs_budget;
    op->deadline = spec->deadline > 0 ? spec->deadline : c->cfg->deadline;
    op->fn = spec->fn;
    op->arg = spec->arg;
    op->free_arg = spec->free_arg;
    op->created = wall_now();
    op->deadline_at = mono() + op->deadline;

    pthread_mutex_lock(&c->mu);
    const char *refuse = NULL;
    struct d_op *busy = NULL;
    for (struct d_op *o = c->ops; o && !busy; o = o->next)
        if (!finished(o) && !strcmp(o->target, op->target))
            busy = o;
    unsigned idle = c->cfg->workers > c->running ? c->cfg->workers - c->running : 0;
    if (c->stopping)
        refuse = "the daemon is stopping";
    else if (!busy && c->queued >= c->cfg->queue_max + idle)
        refuse = "the queue is full";
    if (busy) {
        d_error_msg(rs, -EBUSY, "%s: operation %s (%s) is %s on it", op->target, busy->id,
                    busy->kind, state_name(busy->state));
        json_object_object_add(rs->body, "operation", op_json(busy));
    } else if (refuse) {
        d_error_msg(rs, -EAGAIN, "%s %s: %s (%u queued, %u running); retry later", spec->kind,
                    op->target, refuse, c->queued, c->running);
        rs->retry_after = retry_after_locked(c);
    } else {
        op->seq = ++c->seq;
        op->state = D_OP_QUEUED;
        op->next = c->ops;
        c->ops = op;
        c->queued++;
        op_response(rs, 202, op);
        pthread_cond_broadcast(&c->work);
    }
    d_metrics_admit(c->metrics, !busy && !refuse);
    pthread_mutex_unlock(&c->mu);
    if (busy || refuse) {
        d_log(VMSNAP_LOG_INFO, rq->id, "refused %s %s: %s", spec->kind, op->target,
              busy ? "busy" : refuse);
        op_free(op);
    }
}

void d_op_get(struct d_ctx *c, const char *id, double wait, struct d_response *rs)
{
    double end = mono() + (wait > 0 ? (wait > 600 ? 600 : wait) : 0);
    pthread_mutex_lock(&c->mu);
    struct d_op *o;
    while ((o = find(c, id)) && !finished(o) && mono() < end && !c->quit) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_nsec += 100 * 1000 * 1000;
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        pthread_cond_timedwait(&c->done, &c->mu, &ts);
    }
    if (o)
        op_response(rs, 200, o);
    else
        d_error_msg(rs, -ENOENT, "operation %s: no such operation", id);
    pthread_mutex_unlock(&c->mu);
}

void d_op_cancel(struct d_ctx *c, const char *id, struct d_response *rs)
{
    pthread_mutex_lock(&c->mu);
    struct d_op *o = find(c, id);
    if (!o) {
        pthread_mutex_unlock(&c->mu);
        d_error_msg(rs, -ENOENT, "operation %s: no such operation", id);
        return;
    }
    if (o->state == D_OP_QUEUED) {
        o->cancel_asked = true;
        o->t_start = mono();
        vmsnap_err_set(&o->err, ECANCELED, "cancelled before it started");
        c->queued--;
        c->finished++;
        finish(c, o, -ECANCELED);
        pthread_cond_broadcast(&c->done);
    } else if (o->state == D_OP_RUNNING) {
        o->cancel_asked = true;
        vmsnap_scope_cancel(o->scope, SIGINT); /* the CLI's Ctrl-C */
    }
    op_response(rs, finished(o) ? 200 : 202, o);
    pthread_mutex_unlock(&c->mu);
}

void d_op_list(struct d_ctx *c, struct d_response *rs)
{
    json_object *a = json_object_new_array();
    pthread_mutex_lock(&c->mu);
    for (struct d_op *o = c->ops; o; o = o->next)
        json_object_array_add(a, op_json(o));
    pthread_mutex_unlock(&c->mu);
    rs->status = 200;
    rs->body = d_obj();
    json_object_object_add(rs->body, "operations", a);
}

void d_ops_counts(struct d_ctx *c, unsigned *queued, unsigned *running)
{
    pthread_mutex_lock(&c->mu);
    *queued = c->queued;
    *running = c->running;
    pthread_mutex_unlock(&c->mu);
}

void d_op_target(struct d_ctx *c, const char *target, json_object **current, json_object **last)
{
    *current = *last = NULL;
    pthread_mutex_lock(&c->mu);
    for (struct d_op *o = c->ops; o && !*current; o = o->next)
        if (!finished(o) && !strcmp(o->target, target))
            *current = op_json(o);
    json_object *l;
    if (c->last && json_object_object_get_ex(c->last, target, &l))
        *last = json_object_get(l);
    pthread_mutex_unlock(&c->mu);
}

void d_ctx_set_journal(struct d_ctx *c, struct d_journal *j)
{
    pthread_mutex_lock(&c->mu);
    c->journal = j;
    pthread_mutex_unlock(&c->mu);
}

void d_op_set_last(struct d_ctx *c, const char *target, json_object *op)
{
    pthread_mutex_lock(&c->mu);
    if (c->last && json_object_object_length(c->last) < KEEP_LAST)
        json_object_object_add(c->last, target, json_object_get(op));
    pthread_mutex_unlock(&c->mu);
}

void d_op_recovered(struct d_ctx *c, const struct d_recovered *r)
{
    struct d_op *op = calloc(1, sizeof(*op));
    if (!op)
        return;
    op->kind = strdup(r->kind);
    op->target = strdup(r->target);
    op->req_id = strdup("");
    if (!op->kind || !op->target || !op->req_id) {
        op_free(op);
        return;
    }
    snprintf(op->id, sizeof(op->id), "%s", r->id);
    op->state = D_OP_FAILED;
    op->recovered = true;
    op->cancel_asked = true; /* the error's class: interrupted */
    op->rc = -EINTR;
    op->err = r->err;
    op->created = op->started = r->started;
    op->ended = wall_now();
    op->result = json_object_get(r->result);
    pthread_mutex_lock(&c->mu);
    op->next = c->ops;
    c->ops = op;
    c->finished++;
    remember(c, op);
    prune(c);
    pthread_mutex_unlock(&c->mu);
}
