/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Push marks: their names, the marks present when a push began, whether another push is at a
 * prefix, storing and reading a mark.
 */
#include "xfer_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void xfer_prior_marks_fini(struct prior_marks *p)
{
    for (size_t i = 0; i < p->n; i++)
        free(p->keys[i]);
    free(p->keys);
    free(p->mtimes);
    memset(p, 0, sizeof(*p));
}

/* A mark there before this push, unchanged since, and older than gc's default --older-than: a
 * killed push's. A younger one may be a push running now (started just before this one: its
 * mark changes only when it names what it replaces), so it still counts. */
#define PRIOR_MARK_DEAD_SECONDS 3600

static bool prior_mark(const struct prior_marks *p, const char *key, int64_t mtime)
{
    int64_t now = (int64_t)time(NULL);
    for (size_t i = 0; p && i < p->n; i++)
        if (!strcmp(p->keys[i], key) && p->mtimes[i] == mtime && mtime >= 0 &&
            now - mtime >= PRIOR_MARK_DEAD_SECONDS)
            return true;
    return false;
}

bool xfer_mark_name(const char *base, char id[33])
{
    size_t pl = strlen(PUSH_MARK_PREFIX);
    if (strlen(base) != pl + 32 + strlen(PUSH_MARK_SUFFIX) || strncmp(base, PUSH_MARK_PREFIX, pl) ||
        strcmp(base + pl + 32, PUSH_MARK_SUFFIX))
        return false;
    for (size_t i = 0; i < 32; i++) {
        char ch = base[pl + i];
        if (!((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f')))
            return false;
        id[i] = ch;
    }
    id[32] = '\0';
    return true;
}

/* Is another push at `lp` ("P/"): its manifest there, or a push mark other than `own`? (One
 * listing; < 0 when it cannot tell.) A failed push's clean-up asks before each delete: the
 * objects of its names may be a racing push's now, and that push stores its mark before any
 * object and its manifest before removing the mark. */
struct busy_ctx {
    const char *lp, *mkey, *own;
    const struct prior_marks *prior;
    bool busy;
    char *const *skip; /* marks known dead (xfer_tidy_marks) */
    size_t nskip;
};

static bool skipped(const struct busy_ctx *b, const char *key)
{
    for (size_t i = 0; i < b->nskip; i++)
        if (!strcmp(b->skip[i], key))
            return true;
    return false;
}

static int see_busy(void *arg, const char *key, uint64_t size, int64_t mtime)
{
    (void)size;
    struct busy_ctx *b = arg;
    char id[33];
    if (strchr(key + strlen(b->lp), '/'))
        return 0; /* below the set */
    if ((b->mkey && !strcmp(key, b->mkey)) ||
        (xfer_mark_name(xfer_key_base(key), id) && (!b->own || strcmp(key, b->own)) &&
         !prior_mark(b->prior, key, mtime) && !skipped(b, key)))
        b->busy = true;
    return b->busy ? -ECANCELED : 0;
}

int xfer_prefix_busy_but(struct vmsnap_store_conn *c, const char *lp, const char *mkey,
                         const char *own, const struct prior_marks *prior)
{
    struct busy_ctx b = {lp, mkey, own, prior, false, NULL, 0};
    int rc = vmsnap_store_list(c, lp, see_busy, &b, NULL);
    return b.busy ? 1 : rc < 0 ? rc : 0;
}

/*
 * After its commit, a push tidies the marks earlier pushes to the prefix left that are provably
 * dead, so that they do not pile up until a gc runs: the mark of the push whose set this one
 * replaced (it committed, so it had finished: it was killed, or failed to remove its mark,
 * after its commit), and a mark that was there when this push began, unchanged since and
 * started more than PRIOR_MARK_DEAD_SECONDS ago (what gc's default --older-than takes for a
 * killed push's). What such a mark names that this push's set does not is nobody's object:
 * deleted, after a check that the manifest there is this push's and that no other push's mark
 * is there; then the mark. Anything that cannot be told stays for gc.
 */
struct dead_mark {
    char *key;
    struct push_mark pm;
};

static bool in_set(const struct set_push *s, const char *name)
{
    for (size_t i = 0; i < s->n; i++)
        if (!strcmp(s->files[i].name, name))
            return true;
    return false;
}

/* The prior marks that are dead, read (at most s->prior.n). */
static size_t dead_marks(const struct set_push *s, const char *old_id, struct dead_mark *d)
{
    int64_t now = (int64_t)time(NULL);
    size_t nd = 0;
    for (size_t i = 0; i < s->prior.n; i++) {
        char id[33], murl[URL_BUF];
        if (!xfer_mark_name(xfer_key_base(s->prior.keys[i]), id))
            continue;
        vmsnap_store_url(s->x->st, s->prior.keys[i], murl, sizeof(murl));
        struct push_mark pm = {0};
        if (xfer_read_mark(s->ctl, s->prior.keys[i], murl, &pm, NULL) < 0)
            continue; /* unreadable, or gone: gc's to judge */
        bool finished = old_id[0] && !strcmp(id, old_id);
        bool old = s->prior.mtimes[i] >= 0 && now - s->prior.mtimes[i] >= PRIOR_MARK_DEAD_SECONDS &&
                   now - pm.started >= PRIOR_MARK_DEAD_SECONDS;
        if (!(finished || old) || !(d[nd].key = strdup(s->prior.keys[i]))) {
            push_mark_fini(&pm);
            continue;
        }
        d[nd++].pm = pm;
    }
    return nd;
}

void xfer_tidy_marks(const struct set_push *s, const char *lp)
{
    char old_id[33] = "";
    struct manifest m0 = {0};
    if (s->old_raw &&
        manifest_parse(s->old_raw, s->old_raw_len, s->url, UINT64_MAX, &m0, NULL) == 0)
        memcpy(old_id, m0.push_id, sizeof(old_id));
    manifest_fini(&m0);
    struct dead_mark *d = s->prior.n ? calloc(s->prior.n, sizeof(*d)) : NULL;
    size_t nd = d ? dead_marks(s, old_id, d) : 0, tidied = 0, removed = 0;
    char **keys = nd ? calloc(nd, sizeof(*keys)) : NULL;
    for (size_t i = 0; keys && i < nd; i++)
        keys[i] = d[i].key;
    for (size_t i = 0; keys && i < nd; i++) {
        struct busy_ctx b = {lp, NULL, s->mark_key, NULL, false, keys, nd};
        int lrc = vmsnap_store_list(s->ctl, lp, see_busy, &b, NULL);
        if (b.busy || lrc < 0 || xfer_manifest_is(s->x, s->ctl, s->mkey, s->push_id) != 1)
            break; /* another push is there, or this push's set no longer: gc's */
        bool left = false;
        for (size_t j = 0; j < d[i].pm.n && !left; j++) {
            if (in_set(s, d[i].pm.names[j]))
                continue;
            char *k = xfer_object_key(s->prefix, d[i].pm.names[j]);
            int drc = k ? xfer_delete_once(s->ctl, k, NULL) : -ENOMEM;
            left = drc < 0 && drc != -ENOENT;
            removed += drc == 0;
            free(k);
        }
        if (!left && vmsnap_store_delete(s->ctl, d[i].key, NULL) == 0)
            tidied++;
    }
    if (tidied)
        vlog(VMSNAP_LOG_INFO,
             "%s: removed %zu mark%s of earlier pushes that had finished or died, and %zu "
             "object%s they named that no set has",
             s->url, tidied, tidied == 1 ? "" : "s", removed, removed == 1 ? "" : "s");
    else if (nd)
        vlog(VMSNAP_LOG_INFO, "%s: %zu mark%s of earlier pushes stay for 'vmsnap gc'", s->url, nd,
             nd == 1 ? "" : "s");
    for (size_t i = 0; d && i < nd; i++) {
        free(d[i].key);
        push_mark_fini(&d[i].pm);
    }
    free(keys);
    free(d);
}

int xfer_prefix_busy(struct vmsnap_store_conn *c, const char *lp, const char *mkey, const char *own)
{
    return xfer_prefix_busy_but(c, lp, mkey, own, NULL);
}

int xfer_see_prior(void *arg, const char *key, uint64_t size, int64_t mtime)
{
    (void)size;
    struct prior_marks *p = arg;
    char id[33];
    if (strchr(key + p->lpn, '/') || !xfer_mark_name(xfer_key_base(key), id))
        return 0;
    size_t kc = p->cap, mc = p->cap; /* the two arrays grow alike: p->cap once both did */
    if (grow_array(&p->keys, &kc, p->n + 1, sizeof(*p->keys), 8) < 0 ||
        grow_array(&p->mtimes, &mc, p->n + 1, sizeof(*p->mtimes), 8) < 0)
        return -ENOMEM;
    p->cap = kc;
    if (!(p->keys[p->n] = strdup(key)))
        return -ENOMEM;
    p->mtimes[p->n++] = mtime;
    return 0;
}

/* Store the push mark (again, with what it replaces, once that is known). */
int xfer_put_mark(struct vmsnap_store_conn *ctl, const struct set_push *s, int64_t started,
                  const char *url, struct vmsnap_err *err)
{
    char *mark = push_mark_build(s->push_id, started, s->files, s->n, s->replaces, s->nr);
    int rc = mark ? cancel_check(err) : vmsnap_err_set(err, ENOMEM, "out of memory");
    if (rc == 0 && (rc = vmsnap_store_put(ctl, s->mark_key, mark, strlen(mark), err)) < 0)
        vmsnap_err_wrap(err, "store the push mark %s/%s: ", url, xfer_key_base(s->mark_key));
    free(mark);
    return rc;
}

/* A push mark, read whole (capped like a manifest) and parsed. */
int xfer_read_mark(struct vmsnap_store_conn *c, const char *key, const char *murl,
                   struct push_mark *pm, struct vmsnap_err *err)
{
    char id[33];
    if (!xfer_mark_name(xfer_key_base(key), id))
        return vmsnap_err_set(err, EINVAL, "%s: not a push mark name", murl);
    char *buf = NULL;
    size_t len = 0;
    bool too_large, two_gets;
    int rc = xfer_read_small(c, key, murl, "push mark", &buf, &len, &too_large, &two_gets, err);
    if (rc == 0)
        rc = push_mark_parse(buf, len, murl, id, pm, err);
    free(buf);
    return rc;
}
