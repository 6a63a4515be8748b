/* SPDX-License-Identifier: Apache-2.0 */
/* Snapshot sets: push, pull, export, remove and gc are operations (on the store URL, or the
 * pull's destination); ls answers at once. Each calls vmsnap_xfer_* as the CLI's verbs do
 * (cli/cmd_push.c and the others), with the operation's grant as its threads, memory and
 * connections and the node's profile as its store settings. */
#include "daemon.h"

#include "vmsnap/xfer.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static void stats_json(json_object *r, const char *path, const char *url,
                       const struct vmsnap_xfer_stats *st, double secs)
{
    json_object_object_add(r, "path", json_object_new_string(path));
    json_object_object_add(r, "url", json_object_new_string(url));
    json_object_object_add(r, "files", json_object_new_int64((int64_t)st->files));
    json_object_object_add(r, "logical_bytes", json_object_new_int64((int64_t)st->logical));
    json_object_object_add(r, "populated_bytes", json_object_new_int64((int64_t)st->populated));
    json_object_object_add(r, "object_bytes", json_object_new_int64((int64_t)st->object_bytes));
    json_object_object_add(r, "copied_bytes", json_object_new_int64((int64_t)st->copied_bytes));
    json_object_object_add(r, "deltas", json_object_new_int64((int64_t)st->deltas));
    json_object_object_add(r, "cached_bytes", json_object_new_int64((int64_t)st->cached_bytes));
    json_object_object_add(r, "seconds", d_seconds(secs));
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static int do_push(struct d_op *op, const struct d_config *cfg, const struct d_grant *g,
                   json_object *r, struct vmsnap_err *err)
{
    json_object *o = d_op_body(op);
    struct vmsnap_xfer_opts x;
    d_xfer_opts(cfg, o, g, &x);
    x.parent = d_jstr(o, "parent");
    x.base = d_jstr(o, "base");
    x.level = (int)d_jint(o, "level", 0);
    const char *layout = d_jstr(o, "layout");
    x.layout = !layout                        ? VMSNAP_LAYOUT_AUTO
               : !strcmp(layout, "reference") ? VMSNAP_LAYOUT_REFERENCE
                                              : VMSNAP_LAYOUT_LAYERED;
    struct vmsnap_xfer_stats st = {0};
    double t0 = now_s();
    int rc = vmsnap_xfer_push(d_jstr(o, "path"), d_jstr(o, "url"), &x, &st, err);
    if (rc == 0)
        stats_json(r, d_jstr(o, "path"), d_jstr(o, "url"), &st, now_s() - t0);
    return rc;
}

static int do_pull(struct d_op *op, const struct d_config *cfg, const struct d_grant *g,
                   json_object *r, struct vmsnap_err *err)
{
    json_object *o = d_op_body(op);
    struct vmsnap_xfer_opts x;
    d_xfer_opts(cfg, o, g, &x);
    x.set_only = !d_jbool(o, "object"); /* a set unless a single object is allowed too */
    x.no_cache = d_jbool(o, "no_cache");
    struct vmsnap_xfer_stats st = {0};
    double t0 = now_s();
    int rc = vmsnap_xfer_pull(d_jstr(o, "url"), d_jstr(o, "path"), &x, &st, err);
    if (rc == 0)
        stats_json(r, d_jstr(o, "path"), d_jstr(o, "url"), &st, now_s() - t0);
    return rc;
}

static bool layout_ok(struct d_response *rs, json_object *o)
{
    const char *l = d_jstr(o, "layout");
    if (l && strcmp(l, "layered") && strcmp(l, "reference")) {
        d_error_msg(rs, -D_EUSAGE, "layout '%.32s': 'layered' or 'reference'", l);
        return false;
    }
    int64_t lv = d_jint(o, "level", 0);
    if (lv < 0 || lv > 22) {
        d_error_msg(rs, -D_EUSAGE, "level %lld: 0 to 22", (long long)lv);
        return false;
    }
    return true;
}

static void submit(struct d_request *rq, struct d_response *rs, json_object *o, const char *kind,
                   const char *tkey, int prio, d_op_fn fn)
{
    char target[PATH_MAX + 16];
    snprintf(target, sizeof(target), "%s:%s", tkey, d_jstr(o, tkey));
    d_submit_body(rq, rs, kind, target, prio, true, fn, o);
}

void r_set_push(struct d_request *rq, struct d_response *rs)
{
    static const struct d_field f[] = {
        {"path", D_STR, true},
        {"url", D_STR, true},
        {"profile", D_STR, false},
        {"parent", D_STR, false},
        {"base", D_STR, false},
        {"layout", D_STR, false},
        {"level", D_INT, false},
        {"deadline_seconds", D_INT, false},
        {0},
    };
    json_object *o = d_req_body(rq, rs, f);
    if (!o)
        return;
    if (d_req_path(rq, rs, o, "path", true) < 0 || d_req_url(rq, rs, o, "url", true) < 0 ||
        d_req_url(rq, rs, o, "parent", false) < 0 || d_req_url(rq, rs, o, "base", false) < 0 ||
        d_req_profile(rq, rs, o) < 0 || !layout_ok(rs, o)) {
        json_object_put(o);
        return;
    }
    submit(rq, rs, o, "set.push", "url", 0, do_push);
}

void r_set_pull(struct d_request *rq, struct d_response *rs)
{
    static const struct d_field f[] = {
        {"url", D_STR, true},
        {"path", D_STR, true},
        {"profile", D_STR, false},
        {"no_cache", D_BOOL, false},
        {"object", D_BOOL, false},
        {"deadline_seconds", D_INT, false},
        {0},
    };
    json_object *o = d_req_body(rq, rs, f);
    if (!o)
        return;
    if (d_req_path(rq, rs, o, "path", true) < 0 || d_req_url(rq, rs, o, "url", true) < 0 ||
        d_req_profile(rq, rs, o) < 0) {
        json_object_put(o);
        return;
    }
    submit(rq, rs, o, "set.pull", "path", 1, do_pull);
}

static int ls_one(void *arg, const struct vmsnap_xfer_set *s)
{
    json_object *a = arg;
    if (json_object_array_length(a) >= 10000)
        return -E2BIG;
    json_object *j = json_object_new_object();
    json_object_object_add(j, "url", json_object_new_string(s->url));
    json_object_object_add(j, "valid", json_object_new_boolean(s->valid));
    if (s->valid) {
        json_object_object_add(j, "files", json_object_new_int64((int64_t)s->files));
        json_object_object_add(j, "logical_bytes", json_object_new_int64((int64_t)s->logical));
        json_object_object_add(j, "object_bytes", json_object_new_int64((int64_t)s->object_bytes));
    }
    json_object_array_add(a, j);
    return 0;
}

void r_set_list(struct d_request *rq, struct d_response *rs)
{
    char ub[PATH_MAX], pb[128];
    const char *url = d_query(rq, "url", ub, sizeof(ub)),
               *prof = d_query(rq, "profile", pb, sizeof(pb));
    if (!url) {
        d_error_msg(rs, -D_EUSAGE, "sets: ?url= is required");
        return;
    }
    json_object *o = json_object_new_object();
    json_object_object_add(o, "url", json_object_new_string(url));
    if (prof)
        json_object_object_add(o, "profile", json_object_new_string(prof));
    if (d_req_url(rq, rs, o, "url", true) < 0 || d_req_profile(rq, rs, o) < 0) {
        json_object_put(o);
        return;
    }
    struct vmsnap_xfer_opts x;
    struct d_grant g = {.threads = 1, .memory = 16u << 20, .connections = 1};
    d_xfer_opts(d_ctx_config(rq->ctx), o, &g, &x);
    json_object *sets = json_object_new_array();
    struct vmsnap_err err = {0};
    int rc = vmsnap_xfer_list(d_jstr(o, "url"), &x, ls_one, sets, &err);
    if (rc == -E2BIG)
        vmsnap_err_set(&err, E2BIG, "more than 10000 sets under %s: list a longer prefix", url);
    if (rc < 0)
        d_error(rs, rc, &err, false);
    else
        rs->body = d_obj();
    json_object_object_add(rs->body, "url", json_object_new_string(d_jstr(o, "url")));
    json_object_object_add(rs->body, "sets", sets);
    json_object_put(o);
}

static int do_remove(struct d_op *op, const struct d_config *cfg, const struct d_grant *g,
                     json_object *r, struct vmsnap_err *err)
{
    json_object *o = d_op_body(op);
    struct vmsnap_xfer_opts x;
    d_xfer_opts(cfg, o, g, &x);
    struct vmsnap_rm_result res = {0};
    int rc = vmsnap_xfer_remove(d_jstr(o, "url"), d_jbool(o, "force"), &x, &res, err);
    if (rc < 0)
        return rc;
    json_object_object_add(r, "url", json_object_new_string(d_jstr(o, "url")));
    json_object_object_add(r, "removed",
                           json_object_new_string(res.set         ? "set"
                                                  : res.object    ? "object"
                                                  : res.empty_dir ? "empty_dir"
                                                                  : "incomplete_set"));
    json_object_object_add(r, "objects", json_object_new_int((int)res.objects));
    json_object_object_add(r, "uploads", json_object_new_int((int)res.uploads));
    json_object_object_add(r, "pushes", json_object_new_int((int)res.pushes));
    json_object_object_add(r, "kept", json_object_new_int((int)res.kept));
    json_object_object_add(r, "kept_url", res.kept ? json_object_new_string(res.kept_key) : NULL);
    return 0;
}

void r_set_remove(struct d_request *rq, struct d_response *rs)
{
    static const struct d_field f[] = {
        {"url", D_STR, true},
        {"force", D_BOOL, false},
        {"profile", D_STR, false},
        {"deadline_seconds", D_INT, false},
        {0},
    };
    json_object *o = d_req_body(rq, rs, f);
    if (!o)
        return;
    if (d_req_url(rq, rs, o, "url", true) < 0 || d_req_profile(rq, rs, o) < 0) {
        json_object_put(o);
        return;
    }
    submit(rq, rs, o, "set.remove", "url", 0, do_remove);
}

#define GC_ITEMS_MAX 20000 /* items listed in a gc result; the counts count them all */

/* The library's report of one upload, mark or object, as a result item */
static void gc_item(void *arg, enum vmsnap_gc_kind kind, const char *url, uint64_t size,
                    int64_t age, bool act)
{
    json_object *r = arg, *items = NULL;
    json_object_object_get_ex(r, "items", &items);
    if (json_object_array_length(items) >= GC_ITEMS_MAX) {
        json_object *n = NULL;
        json_object_object_get_ex(r, "items_left_out", &n);
        json_object_set_int64(n, json_object_get_int64(n) + 1);
        return;
    }
    static const char *const kinds[] = {"upload", "push_mark", "object"}, *const acts[] = {
                                                                              "abort", "clean",
                                                                              "remove"};
    json_object *j = json_object_new_object();
    json_object_object_add(j, "kind", json_object_new_string(kinds[kind]));
    json_object_object_add(j, "url", json_object_new_string(url));
    json_object_object_add(j, "object_bytes", json_object_new_int64((int64_t)size));
    json_object_object_add(j, "age_seconds", age < 0 ? NULL : json_object_new_int64(age));
    json_object_object_add(j, "action", json_object_new_string(act ? acts[kind] : "keep"));
    json_object_array_add(items, j);
}

static int do_gc(struct d_op *op, const struct d_config *cfg, const struct d_grant *g,
                 json_object *r, struct vmsnap_err *err)
{
    json_object *o = d_op_body(op);
    struct vmsnap_xfer_opts x;
    d_xfer_opts(cfg, o, g, &x);
    struct vmsnap_gc_opts go = {
        .older_than = d_jint(o, "older_than_seconds", 3600),
        .dry_run = d_jbool(o, "dry_run"),
        .report = gc_item,
        .report_arg = r,
    };
    json_object_object_add(r, "url", json_object_new_string(d_jstr(o, "url")));
    json_object_object_add(r, "dry_run", json_object_new_boolean(go.dry_run));
    json_object_object_add(r, "older_than_seconds", json_object_new_int64(go.older_than));
    json_object_object_add(r, "items", json_object_new_array());
    json_object_object_add(r, "items_left_out", json_object_new_int64(0));
    struct vmsnap_gc_result res = {0};
    int rc = vmsnap_xfer_gc(d_jstr(o, "url"), &go, &x, &res, err);
    if (rc < 0)
        return rc;
    json_object_object_add(r, "aborted_uploads", json_object_new_int((int)res.aborted));
    json_object_object_add(r, "cleaned_pushes", json_object_new_int((int)res.pushes));
    json_object_object_add(r, "objects", json_object_new_int((int)(res.objects + res.unreachable)));
    json_object_object_add(r, "unreachable_objects", json_object_new_int((int)res.unreachable));
    json_object_object_add(r, "unreachable_bytes",
                           json_object_new_int64((int64_t)res.unreachable_bytes));
    json_object_object_add(r, "kept", json_object_new_int((int)res.kept));
    json_object_object_add(r, "unknown_age", json_object_new_int((int)res.unknown_age));
    return 0;
}

void r_set_gc(struct d_request *rq, struct d_response *rs)
{
    static const struct d_field f[] = {
        {"url", D_STR, true},      {"older_than_seconds", D_INT, false}, {"dry_run", D_BOOL, false},
        {"profile", D_STR, false}, {"deadline_seconds", D_INT, false},   {0},
    };
    json_object *o = d_req_body(rq, rs, f);
    if (!o)
        return;
    if (d_req_url(rq, rs, o, "url", true) < 0 || d_req_profile(rq, rs, o) < 0) {
        json_object_put(o);
        return;
    }
    if (d_jint(o, "older_than_seconds", 0) < 0) {
        json_object_put(o);
        d_error_msg(rs, -D_EUSAGE, "older_than_seconds: not negative");
        return;
    }
    submit(rq, rs, o, "set.gc", "url", 0, do_gc);
}

static int do_export(struct d_op *op, const struct d_config *cfg, const struct d_grant *g,
                     json_object *r, struct vmsnap_err *err)
{
    json_object *o = d_op_body(op);
    struct vmsnap_xfer_opts x;
    d_xfer_opts(cfg, o, g, &x);
    x.level = (int)d_jint(o, "level", 0);
    struct vmsnap_xfer_stats st = {0};
    double t0 = now_s();
    int rc = vmsnap_xfer_export(d_jstr(o, "source_url"), d_jstr(o, "url"), NULL, &x, &st, err);
    if (rc == 0)
        stats_json(r, d_jstr(o, "source_url"), d_jstr(o, "url"), &st, now_s() - t0);
    return rc;
}

void r_set_export(struct d_request *rq, struct d_response *rs)
{
    static const struct d_field f[] = {
        {"source_url", D_STR, true},        {"url", D_STR, true},
        {"profile", D_STR, false},          {"level", D_INT, false},
        {"deadline_seconds", D_INT, false}, {0},
    };
    json_object *o = d_req_body(rq, rs, f);
    if (!o)
        return;
    if (d_req_url(rq, rs, o, "source_url", true) < 0 || d_req_url(rq, rs, o, "url", true) < 0 ||
        d_req_profile(rq, rs, o) < 0 || !layout_ok(rs, o)) {
        json_object_put(o);
        return;
    }
    submit(rq, rs, o, "set.export", "url", 0, do_export);
}
