/* SPDX-License-Identifier: Apache-2.0 */
/* The node's own resources (health, readiness, metrics, version, operations) and what every
 * resource shares: strict bodies, checked paths, URLs and profiles, the library's options. */
#include "daemon.h"

#include "vmsnap/xfer.h"

#include <errno.h>
#include <stdio.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

json_object *d_req_body(struct d_request *rq, struct d_response *rs, const struct d_field *fields)
{
    json_object *o;
    struct vmsnap_err err = {0};
    int rc = d_body_parse(rq->body, rq->body_len, fields, &o, &err);
    if (rc < 0) {
        d_error(rs, rc, &err, false);
        return NULL;
    }
    return o;
}

static int checked(struct d_response *rs, json_object *o, const char *key, bool required,
                   const char **v)
{
    *v = d_jstr(o, key);
    if (!*v && required) {
        d_error_msg(rs, -D_EUSAGE, "'%s' is required", key);
        return -1;
    }
    return *v ? 1 : 0;
}

int d_req_path(struct d_request *rq, struct d_response *rs, json_object *o, const char *key,
               bool required)
{
    const struct d_config *cfg = d_ctx_config(rq->ctx);
    const char *v;
    int rc = checked(rs, o, key, required, &v);
    if (rc <= 0)
        return rc;
    char out[PATH_MAX];
    struct vmsnap_err err = {0};
    if ((rc = d_path_check(v, cfg->roots, cfg->n_roots, key, out, sizeof(out), &err)) < 0) {
        d_error(rs, rc, &err, false);
        return rc;
    }
    json_object_object_add(o, key, json_object_new_string(out));
    return 0;
}

int d_req_url(struct d_request *rq, struct d_response *rs, json_object *o, const char *key,
              bool required)
{
    const struct d_config *cfg = d_ctx_config(rq->ctx);
    const char *v;
    int rc = checked(rs, o, key, required, &v);
    if (rc <= 0)
        return rc;
    char out[PATH_MAX];
    struct vmsnap_err err = {0};
    if ((rc = d_url_check(v, cfg->roots, cfg->n_roots, out, sizeof(out), &err)) < 0) {
        d_error(rs, rc, &err, false);
        return rc;
    }
    json_object_object_add(o, key, json_object_new_string(out));
    return 0;
}

int d_req_profile(struct d_request *rq, struct d_response *rs, json_object *o)
{
    const char *p = d_jstr(o, "profile");
    if (p && !d_config_profile(d_ctx_config(rq->ctx), p)) {
        d_error_msg(rs, -EACCES, "profile '%.64s': not configured on this node", p);
        return -1;
    }
    return 0;
}

void d_xfer_opts(const struct d_config *cfg, json_object *o, const struct d_grant *g,
                 struct vmsnap_xfer_opts *x)
{
    *x = (struct vmsnap_xfer_opts){0};
    if (g) {
        x->threads = g->threads;
        x->max_memory = g->memory;
        x->connections = g->connections;
        x->budget = g->shared;
    }
    x->cache_dir = cfg->cache_dir;
    x->cache_size = cfg->cache_size;
    const struct d_profile *p = d_config_profile(cfg, d_jstr(o, "profile"));
    if (p) {
        x->store.profile = p->aws ? p->aws : p->name;
        x->store.endpoint = p->endpoint;
        x->store.region = p->region;
        x->store.path_style = p->path_style;
    }
}

void d_free_json(void *arg)
{
    json_object_put(arg);
}

json_object *d_op_body(struct d_op *op)
{
    return d_op_arg(op);
}

void d_submit_body(struct d_request *rq, struct d_response *rs, const char *kind,
                   const char *target, int priority, bool budget, d_op_fn fn, json_object *o)
{
    struct d_op_spec spec = {
        .kind = kind,
        .target = target,
        .priority = priority,
        .needs_budget = budget,
        .deadline = (double)d_jint(o, "deadline_seconds", 0),
        .fn = fn,
        .arg = o,
        .free_arg = d_free_json,
    };
    d_op_submit(rq->ctx, rq, &spec, rs);
}

void r_healthz(struct d_request *rq, struct d_response *rs)
{
    (void)rq;
    rs->body = d_obj();
    json_object_object_add(rs->body, "status", json_object_new_string("ok"));
}

void r_readyz(struct d_request *rq, struct d_response *rs)
{
    unsigned q, r;
    d_ops_counts(rq->ctx, &q, &r);
    bool stopping = d_ctx_stopping(rq->ctx);
    const struct d_config *cfg = d_ctx_config(rq->ctx);
    bool full = q >= cfg->queue_max + (cfg->workers > r ? cfg->workers - r : 0);
    rs->body = d_obj();
    json_object_object_add(rs->body, "status",
                           json_object_new_string(stopping ? "stopping"
                                                  : full   ? "full"
                                                           : "ready"));
    json_object_object_add(rs->body, "queued", json_object_new_int((int)q));
    json_object_object_add(rs->body, "running", json_object_new_int((int)r));
    if (stopping || full) {
        rs->status = 503;
        rs->retry_after = d_ops_retry_after(rq->ctx);
    }
}

void r_metrics(struct d_request *rq, struct d_response *rs)
{
    unsigned q, r;
    d_ops_counts(rq->ctx, &q, &r);
    char *t = d_metrics_text(d_ctx_metrics(rq->ctx), q, r);
    uint64_t budget, used, peak;
    d_ops_memory(rq->ctx, &budget, &used, &peak);
    /* the node's memory budget, shared live by the operations in flight */
    if (t && asprintf(&rs->text,
                      "%s# HELP vmsnapd_memory_budget_bytes The node's buffer memory budget.\n"
                      "# TYPE vmsnapd_memory_budget_bytes gauge\nvmsnapd_memory_budget_bytes %llu\n"
                      "# HELP vmsnapd_memory_used_bytes Buffer bytes the operations hold now.\n"
                      "# TYPE vmsnapd_memory_used_bytes gauge\nvmsnapd_memory_used_bytes %llu\n"
                      "# HELP vmsnapd_memory_peak_bytes The most buffer bytes held at once.\n"
                      "# TYPE vmsnapd_memory_peak_bytes gauge\nvmsnapd_memory_peak_bytes %llu\n",
                      t, (unsigned long long)budget, (unsigned long long)used,
                      (unsigned long long)peak) < 0)
        rs->text = NULL;
    free(t);
    rs->content_type = "text/plain; version=0.0.4";
    if (!rs->text)
        d_error_msg(rs, -ENOMEM, "metrics: out of memory");
}

void r_version(struct d_request *rq, struct d_response *rs)
{
    (void)rq;
    rs->body = d_obj();
    json_object_object_add(rs->body, "version", json_object_new_string(vmsnap_version()));
    json_object_object_add(rs->body, "api", json_object_new_string("v1"));
}

void r_ops_list(struct d_request *rq, struct d_response *rs)
{
    d_op_list(rq->ctx, rs);
}

void r_op_get(struct d_request *rq, struct d_response *rs)
{
    char buf[32];
    const char *w = d_query(rq, "wait", buf, sizeof(buf));
    char *end = NULL;
    double wait = w ? strtod(w, &end) : 0;
    if (w && (end == w || *end || !(wait >= 0))) {
        d_error_msg(rs, -D_EUSAGE, "wait=%s: not a number of seconds", w);
        return;
    }
    d_op_get(rq->ctx, rq->params[0], wait, rs);
}

void r_op_cancel(struct d_request *rq, struct d_response *rs)
{
    d_op_cancel(rq->ctx, rq->params[0], rs);
}
