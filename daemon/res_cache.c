/* SPDX-License-Identifier: Apache-2.0 */
/* The page cache (pcache.h: stat answers at once, evict is an operation using the daemon's one
 * retrier) and the node's object cache (objcache.h: one per node, the daemon's cache_dir and
 * cache_size, the same the pulls and resumes it runs fill). */
#include "daemon.h"

#include "vmsnap/objcache.h"
#include "vmsnap/pcache.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>

#define STAT_FILES_MAX 1000 /* files listed in a stat answer; the total counts them all */

static json_object *stat_json(const char *path, const struct vmsnap_pcache_stat *st)
{
    json_object *j = json_object_new_object();
    if (path)
        json_object_object_add(j, "path", json_object_new_string(path));
    else
        json_object_object_add(j, "files", json_object_new_int64((int64_t)st->files));
    json_object_object_add(j, "logical_bytes", json_object_new_int64((int64_t)st->size));
    json_object_object_add(j, "pages", json_object_new_int64((int64_t)st->pages));
    json_object_object_add(j, "cached", json_object_new_int64((int64_t)st->cached));
    json_object_object_add(j, "method",
                           json_object_new_string(st->mincore ? "mincore" : "cachestat"));
    json_object_object_add(j, "dirty", json_object_new_int64((int64_t)st->dirty));
    json_object_object_add(j, "writeback", json_object_new_int64((int64_t)st->writeback));
    json_object_object_add(j, "evicted", json_object_new_int64((int64_t)st->evicted));
    json_object_object_add(j, "recently_evicted",
                           json_object_new_int64((int64_t)st->recently_evicted));
    return j;
}

static int stat_one(void *arg, const char *path, const struct vmsnap_pcache_stat *st)
{
    json_object *a = arg;
    if (json_object_array_length(a) < STAT_FILES_MAX)
        json_object_array_add(a, stat_json(path, st));
    return 0;
}

void r_pcache_stat(struct d_request *rq, struct d_response *rs)
{
    char buf[PATH_MAX];
    const char *p = d_query(rq, "path", buf, sizeof(buf));
    if (!p) {
        d_error_msg(rs, -D_EUSAGE, "pcache stat: ?path= is required");
        return;
    }
    json_object *o = json_object_new_object();
    json_object_object_add(o, "path", json_object_new_string(p));
    if (d_req_path(rq, rs, o, "path", true) < 0) {
        json_object_put(o);
        return;
    }
    json_object *files = json_object_new_array();
    struct vmsnap_pcache_stat total = {0};
    struct vmsnap_err err = {0};
    int rc = vmsnap_pcache_stat_path(d_jstr(o, "path"), stat_one, files, &total, &err);
    if (rc < 0)
        d_error(rs, rc, &err, false);
    else
        rs->body = d_obj();
    /* a failure keeps what was counted before it, as the CLI's stat does */
    json_object_object_add(rs->body, "page_bytes", json_object_new_int((int)total.page_size));
    json_object_object_add(rs->body, "total", stat_json(NULL, &total));
    json_object_object_add(rs->body, "files", files);
    json_object_put(o);
}

static int do_evict(struct d_op *op, const struct d_config *cfg, const struct d_grant *g,
                    json_object *r, struct vmsnap_err *err)
{
    (void)cfg;
    (void)g;
    json_object *o = d_op_body(op), *pres = NULL;
    const char *preserve[17] = {0};
    if (json_object_object_get_ex(o, "preserve", &pres))
        for (size_t i = 0; i < json_object_array_length(pres) && i < 16; i++)
            preserve[i] = json_object_get_string(json_object_array_get_idx(pres, i));
    struct vmsnap_pcache_evict_opts eo = {
        .staged = d_jbool(o, "staged"),
        .kick_writeback = d_jbool(o, "kick_writeback"),
        .preserve = preserve,
        .retrier = NULL,
    };
    struct vmsnap_pcache_report rep = {0};
    int rc = vmsnap_pcache_evict(d_jstr(o, "path"), &eo, &rep, err);
    if (rc < 0)
        return rc;
    json_object_object_add(r, "path", json_object_new_string(d_jstr(o, "path")));
    json_object_object_add(r, "dropped_pages", json_object_new_int64((int64_t)rep.dropped_pages));
    json_object_object_add(r, "dropped_files", json_object_new_int64((int64_t)rep.dropped_files));
    json_object_object_add(r, "removed_files", json_object_new_int64((int64_t)rep.removed_files));
    json_object_object_add(r, "removed_bytes", json_object_new_int64((int64_t)rep.removed_bytes));
    json_object_object_add(r, "dirty_files", json_object_new_int64((int64_t)rep.dirty_files));
    json_object_object_add(r, "busy_files", json_object_new_int64((int64_t)rep.busy_files));
    json_object_object_add(r, "removed_pages", json_object_new_int64((int64_t)rep.removed_pages));
    json_object_object_add(r, "writeback_started_files",
                           json_object_new_int64((int64_t)rep.kicked));
    json_object_object_add(r, "readonly_files", json_object_new_int64((int64_t)rep.readonly_files));
    json_object_object_add(r, "unknown_files", json_object_new_int64((int64_t)rep.unknown_files));
    json_object_object_add(r, "skipped_mounts", json_object_new_int64((int64_t)rep.skipped_mounts));
    return 0;
}

void r_pcache_evict(struct d_request *rq, struct d_response *rs)
{
    static const struct d_field f[] = {
        {"path", D_STR, true},
        {"staged", D_BOOL, false},
        {"kick_writeback", D_BOOL, false},
        {"preserve", D_STR_ARRAY, false},
        {"deadline_seconds", D_INT, false},
        {0},
    };
    json_object *o = d_req_body(rq, rs, f);
    if (!o)
        return;
    json_object *pres = NULL;
    if (d_req_path(rq, rs, o, "path", true) < 0)
        goto refuse;
    if (json_object_object_get_ex(o, "preserve", &pres)) {
        if (json_object_array_length(pres) > 16) {
            d_error_msg(rs, -D_EUSAGE, "preserve: at most 16 paths");
            goto refuse;
        }
        for (size_t i = 0; i < json_object_array_length(pres); i++) {
            json_object *one = json_object_new_object();
            json_object_object_add(one, "preserve",
                                   json_object_get(json_object_array_get_idx(pres, i)));
            int rc = d_req_path(rq, rs, one, "preserve", true);
            json_object_put(one);
            if (rc < 0)
                goto refuse;
        }
    }
    char target[PATH_MAX + 8];
    snprintf(target, sizeof(target), "path:%s", d_jstr(o, "path"));
    d_submit_body(rq, rs, "pcache.evict", target, 0, false, do_evict, o);
    return;
refuse:
    json_object_put(o);
}

static int open_cache(const struct d_config *cfg, struct vmsnap_objcache **c,
                      struct vmsnap_err *err)
{
    struct vmsnap_objcache_opts co = {.dir = cfg->cache_dir, .max_bytes = cfg->cache_size};
    return vmsnap_objcache_open(&co, c, err);
}

#define OBJCACHE_ENTRIES_MAX 50000 /* entries listed by ?entries=true */

static int entry_one(void *arg, const struct vmsnap_objcache_entry *e)
{
    json_object *a = arg;
    if (json_object_array_length(a) >= OBJCACHE_ENTRIES_MAX)
        return -E2BIG;
    json_object *j = json_object_new_object();
    json_object_object_add(j, "key", json_object_new_string(e->key));
    json_object_object_add(j, "bytes", json_object_new_int64((int64_t)e->size));
    json_object_object_add(j, "last_used", json_object_new_int64(e->last_used));
    json_object_array_add(a, j);
    return 0;
}

void r_objcache_stat(struct d_request *rq, struct d_response *rs)
{
    struct vmsnap_objcache *c = NULL;
    struct vmsnap_err err = {0};
    uint64_t entries = 0, bytes = 0, cap = 0;
    char eb[8];
    const char *want = d_query(rq, "entries", eb, sizeof(eb));
    json_object *list = want && !strcmp(want, "true") ? json_object_new_array() : NULL;
    int rc = open_cache(d_ctx_config(rq->ctx), &c, &err);
    if (rc == 0)
        rc = vmsnap_objcache_stat(c, &entries, &bytes, &cap, &err);
    if (rc == 0 && list)
        rc = vmsnap_objcache_list(c, entry_one, list, &err);
    if (rc == -E2BIG)
        vmsnap_err_set(&err, E2BIG, "more than %d entries in the object cache: trim it",
                       OBJCACHE_ENTRIES_MAX);
    if (rc < 0) {
        d_error(rs, rc, &err, false);
        json_object_put(list);
    } else {
        rs->body = d_obj();
        json_object_object_add(rs->body, "path", json_object_new_string(vmsnap_objcache_dir(c)));
        json_object_object_add(rs->body, "objects", json_object_new_int64((int64_t)entries));
        json_object_object_add(rs->body, "object_bytes", json_object_new_int64((int64_t)bytes));
        json_object_object_add(rs->body, "cap_bytes", json_object_new_int64((int64_t)cap));
        if (list)
            json_object_object_add(rs->body, "entries", list);
    }
    vmsnap_objcache_close(c);
}

static int do_trim(struct d_op *op, const struct d_config *cfg, const struct d_grant *g,
                   json_object *r, struct vmsnap_err *err)
{
    (void)g;
    json_object *o = d_op_body(op);
    struct vmsnap_objcache *c = NULL;
    int rc = open_cache(cfg, &c, err);
    uint64_t evicted = 0, freed = 0, cap = 0, entries = 0, bytes = 0, target = 0;
    if (rc == 0)
        rc = vmsnap_objcache_stat(c, NULL, NULL, &cap, err);
    if (rc == 0) {
        target = (uint64_t)d_jint(o, "max_bytes", (int64_t)cap);
        rc = vmsnap_objcache_trim(c, target, &evicted, &freed, err);
    }
    if (rc == 0)
        rc = vmsnap_objcache_stat(c, &entries, &bytes, NULL, err);
    if (rc == 0) {
        json_object_object_add(r, "path", json_object_new_string(vmsnap_objcache_dir(c)));
        json_object_object_add(r, "objects", json_object_new_int64((int64_t)evicted));
        json_object_object_add(r, "removed_bytes", json_object_new_int64((int64_t)freed));
        /* the CLI's cache trim --json keys */
        json_object_object_add(r, "max_bytes", json_object_new_int64((int64_t)target));
        json_object_object_add(r, "evicted", json_object_new_int64((int64_t)evicted));
        json_object_object_add(r, "freed_bytes", json_object_new_int64((int64_t)freed));
        json_object_object_add(r, "entries", json_object_new_int64((int64_t)entries));
        json_object_object_add(r, "bytes", json_object_new_int64((int64_t)bytes));
        json_object_object_add(r, "cap_bytes", json_object_new_int64((int64_t)cap));
    }
    vmsnap_objcache_close(c);
    return rc;
}

void r_objcache_trim(struct d_request *rq, struct d_response *rs)
{
    static const struct d_field f[] = {
        {"max_bytes", D_INT, false}, {"deadline_seconds", D_INT, false}, {0}};
    json_object *o = d_req_body(rq, rs, f);
    if (!o)
        return;
    if (d_jint(o, "max_bytes", 0) < 0) {
        json_object_put(o);
        d_error_msg(rs, -D_EUSAGE, "max_bytes: not negative");
        return;
    }
    d_submit_body(rq, rs, "objcache.trim", "objcache", 0, false, do_trim, o);
}
