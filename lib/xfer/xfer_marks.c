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
};

static int see_busy(void *arg, const char *key, uint64_t size, int64_t mtime)
{
    (void)size;
    struct busy_ctx *b = arg;
    char id[33];
    if (strchr(key + strlen(b->lp), '/'))
        return 0; /* below the set */
    if ((b->mkey && !strcmp(key, b->mkey)) ||
        (xfer_mark_name(xfer_key_base(key), id) && (!b->own || strcmp(key, b->own)) &&
         !prior_mark(b->prior, key, mtime)))
        b->busy = true;
    return b->busy ? -ECANCELED : 0;
}

int xfer_prefix_busy_but(struct vmsnap_store_conn *c, const char *lp, const char *mkey,
                         const char *own, const struct prior_marks *prior)
{
    struct busy_ctx b = {lp, mkey, own, prior, false};
    int rc = vmsnap_store_list(c, lp, see_busy, &b, NULL);
    return b.busy ? 1 : rc < 0 ? rc : 0;
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
