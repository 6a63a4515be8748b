/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The sweep of leftover multipart uploads (a retried create, a killed push), and gc's test of
 * whether a set push is running in a directory.
 */
#include "xfer_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* `key` is `under` itself or under "under/" ("K1/x" is not under "K"); under NULL or "": any. */
bool xfer_key_under(const char *under, const char *key)
{
    if (!under || !*under)
        return true;
    size_t ul = strlen(under);
    return !strncmp(key, under, ul) && (!key[ul] || key[ul] == '/' || under[ul - 1] == '/');
}

int64_t xfer_age_of(const struct leftover_ctx *l, int64_t started)
{
    return started < 0 ? -1 : l->now >= started ? l->now - started : 0;
}

/* Tell gc's caller about an upload or mark (`key`), by its URL: a key alone named neither the
 * bucket nor, for the local store, the absolute path. */
void xfer_gc_report(const struct leftover_ctx *l, enum vmsnap_gc_kind kind, const char *key,
                    uint64_t size, int64_t age, bool act)
{
    const struct vmsnap_gc_opts *g = l->gc;
    char u[URL_BUF];
    if (g && g->report)
        g->report(g->report_arg, kind,
                  vmsnap_store_url(vmsnap_store_conn_store(l->c), key, u, sizeof(u)), size, age,
                  act);
}

bool xfer_old_enough(const struct vmsnap_gc_opts *g, int64_t age)
{
    return !g || g->older_than <= 0 || (age >= 0 && age >= g->older_than);
}

void xfer_gc_failed(struct leftover_ctx *l, const char *key, const struct vmsnap_err *e)
{
    if (!l->failed++) {
        l->first = *e;
        snprintf(l->first_key, sizeof(l->first_key), "%s", key);
    }
}

/* When the upload was last active: its newest part's time where the store tells (S3 gives only
 * when an upload began, and a long push may still be adding parts), else `started`. -ENOENT: it
 * is gone (finished or aborted meanwhile). */
static int upload_last(struct vmsnap_store_conn *c, const char *key, const char *id,
                       int64_t started, int64_t *last, struct vmsnap_err *err)
{
    *last = started;
    if (started < 0)
        return 0;
    int64_t part = -1;
    int rc = vmsnap_store_mpu_last_part(c, key, id, &part, err);
    if (rc == 0 && part > started)
        *last = part;
    return rc;
}

int xfer_see_upload(void *arg, const char *key, const char *id, int64_t started)
{
    struct prefix_uploads *u = arg;
    int64_t last;
    int rc = upload_last(u->c, key, id, started, &last, &u->err);
    if (rc < 0 && rc != -ENOENT)
        return rc;
    u->unknown |= started < 0;
    if (last > u->newest)
        u->newest = last;
    return 0;
}

struct live_ctx {
    size_t dl;      /* the length of the directory looked at */
    bool mark;      /* a push mark directly in it */
    int64_t newest; /* the newest key's time under it (-1: none) */
    bool unknown;
};

/* Only what is directly in the directory: a set pushed below it is another push's. */
static int see_live_key(void *arg, const char *key, uint64_t size, int64_t mtime)
{
    struct live_ctx *v = arg;
    (void)size;
    char id[33];
    if (xfer_dir_len(key) != v->dl)
        return 0;
    if (xfer_mark_name(xfer_key_base(key), id))
        v->mark = true;
    v->unknown |= mtime < 0;
    if (mtime > v->newest)
        v->newest = mtime;
    return 0;
}

struct live_uploads {
    struct prefix_uploads up;
    size_t dl;
};

static int see_live_upload(void *arg, const char *key, const char *id, int64_t started)
{
    struct live_uploads *u = arg;
    return xfer_dir_len(key) == u->dl ? xfer_see_upload(&u->up, key, id, started) : 0;
}

/* Is a set push running at the directory of `key`? Its mark is there, and something under that
 * directory (a key written, an upload's part) is younger than --older-than, or its age cannot be
 * told: gc then leaves that directory's uploads as it leaves the marks of a prefix that is not
 * quiet. */
static bool push_running_at(struct leftover_ctx *l, const char *key)
{
    size_t dl = xfer_dir_len(key);
    /* uploads come listed by key: a directory's are asked about once */
    if (l->live_dir && strlen(l->live_dir) == dl && !strncmp(l->live_dir, key, dl))
        return l->live;
    char *dir = strndup(key, dl);
    char *lp = dir ? xfer_join_key(dir, "") : NULL;
    if (!lp) {
        free(dir);
        return true;
    }
    struct live_ctx v = {.dl = dl, .newest = -1};
    struct live_uploads lu = {.up = {.c = l->c, .newest = -1}, .dl = dl};
    bool running = true;
    if (vmsnap_store_list(l->c, lp, see_live_key, &v, NULL) == 0) {
        running = v.mark;
        if (running && vmsnap_store_list_uploads(l->c, lp, see_live_upload, &lu, NULL) == 0) {
            int64_t newest = VMSNAP_MAX(v.newest, lu.up.newest);
            running = v.unknown || lu.up.unknown || newest < 0 ||
                      !xfer_old_enough(l->gc, xfer_age_of(l, newest));
        }
    }
    free(lp);
    free(l->live_dir);
    l->live_dir = dir;
    l->live = running;
    return running;
}

int xfer_abort_leftover(void *arg, const char *key, const char *id, int64_t started)
{
    struct leftover_ctx *l = arg;
    if (l->exact && strcmp(l->exact, key))
        return 0;
    if (!xfer_key_under(l->under, key))
        return 0;
    if (l->in && (strncmp(key, l->in, strlen(l->in)) || strchr(key + strlen(l->in), '/')))
        return 0; /* a set below this one: its pushes' uploads are theirs */
    const struct vmsnap_gc_opts *g = l->gc;
    int64_t age = xfer_age_of(l, started);
    bool go = xfer_old_enough(g, age);
    if (go && g && g->older_than > 0) { /* old by its start: and by its last part? */
        int64_t last;
        struct vmsnap_err e = {0};
        int rc = upload_last(l->c, key, id, started, &last, &e);
        if (rc == -ENOENT)
            return 0;
        if (rc < 0) {
            vlog(VMSNAP_LOG_WARN, "cannot list the parts of the unfinished upload of %s: %s", key,
                 e.msg);
            xfer_gc_failed(l, key, &e);
            return 0;
        }
        age = xfer_age_of(l, last);
        go = xfer_old_enough(g, age);
        /* idle but a running set push's: it keeps the uploads of the names of the set it
         * replaces open until its last file is uploaded (they are completed together) */
        if (go && push_running_at(l, key))
            go = false;
    }
    xfer_gc_report(l, VMSNAP_GC_UPLOAD, key, 0, age, go);
    if (!go) {
        l->kept++;
        l->unknown += age < 0;
        return 0;
    }
    if (g && g->dry_run) {
        l->n++;
        return 0;
    }
    struct vmsnap_err e = {0};
    if (vmsnap_store_mpu_abort(l->c, key, id, &e) == 0) {
        l->n++;
        vlog(VMSNAP_LOG_INFO, "aborted unfinished upload of %s", key);
    } else {
        vlog(VMSNAP_LOG_WARN, "cannot abort unfinished upload of %s: %s", key, e.msg);
        xfer_gc_failed(l, key, &e);
    }
    return 0;
}
