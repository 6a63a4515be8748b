/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The undo paths of a set push: remove what a failed push stored, put back the set it replaced,
 * remove the replaced set's other objects after a commit.
 */
#include "xfer_int.h"

#include <errno.h>
#include <stdlib.h>

/* What must hold right before each delete of the undo paths, and before a restore's PUT. */
enum guard {
    NO_PUSH,       /* no other push's mark there and no manifest (remove_pushed) */
    NO_NEW_PUSH,   /* the same, a mark there when this push began being a killed push's */
    OLD_SET_THERE, /* no new push's mark, and the manifest is the set this push replaces */
    OWN_SET_THERE, /* no other push's mark, and the manifest is this push's (after its commit) */
};

/* 0 when `g` holds now (one listing of `lp`, then a read of the manifest for the last two),
 * > 0 when it does not, < 0 when that cannot be told. */
static int guard_fails(const struct set_push *s, const char *lp, enum guard g)
{
    struct vmsnap_store_conn *c = s->ctl;
    switch (g) {
    case NO_PUSH:
        return xfer_prefix_busy(c, lp, s->mkey, s->mark_key);
    case NO_NEW_PUSH:
        return xfer_prefix_busy_but(c, lp, s->mkey, s->mark_key, &s->prior);
    case OLD_SET_THERE:
        return xfer_prefix_busy_but(c, lp, NULL, s->mark_key, &s->prior) != 0 ||
               xfer_manifest_same(s->x, c, s->mkey, s, NULL) != 1;
    case OWN_SET_THERE:
        return xfer_prefix_busy(c, lp, NULL, s->mark_key) != 0 ||
               xfer_manifest_is(s->x, c, s->mkey, s->push_id) != 1;
    }
    return 1;
}

enum deleted { DELETED, MISSING, GUARDED, FAILED };

/* The guarded delete of the undo paths: the object of the set file `name`, right after a check
 * that `g` holds (*why: the check's answer when it did not), in one attempt: no back-off between
 * the check and the DELETE. A DELETE that fails (a 503, a reset) is tried again, check first,
 * up to GUARDED_ATTEMPTS times. A missing object is fine; a failure left is logged ("cannot
 * remove NAME.zstd[what]"). */
static enum deleted guarded_delete(const struct set_push *s, const char *lp, enum guard g,
                                   const char *name, const char *url, const char *what, int *why)
{
    char *k = xfer_object_key(s->prefix, name);
    struct vmsnap_err e = {0};
    int drc = k ? 0 : vmsnap_err_set(&e, ENOMEM, "out of memory");
    unsigned delay = 0;
    for (unsigned a = 1; k; a++) {
        int busy = guard_fails(s, lp, g);
        if (why)
            *why = busy;
        if (busy != 0) {
            free(k);
            return GUARDED;
        }
        drc = xfer_delete_once(s->ctl, k, &e);
        if (drc == 0 || drc == -ENOENT || drc == -ENOMEM || a >= GUARDED_ATTEMPTS)
            break;
        vlog(VMSNAP_LOG_INFO, "%s: retry %u of the delete of %s.zstd%s (%s)", url, a, name, what,
             e.msg);
        xfer_guarded_backoff(&delay);
    }
    if (drc < 0 && drc != -ENOENT)
        vlog(VMSNAP_LOG_WARN, "%s: cannot remove %s.zstd%s: %s", url, name, what, e.msg);
    free(k);
    return drc == -ENOENT ? MISSING : drc < 0 ? FAILED : DELETED;
}

/* A failed push's mark at the end of its clean-up: removed when everything it names went
 * (`left` false), else it stays, and says so, for gc. */
static void end_mark(const struct set_push *s, const char *url, bool left)
{
    if (left)
        vlog(VMSNAP_LOG_WARN, "%s: this push's mark stays for 'vmsnap gc' to finish", url);
    else if (s->mark_key && vmsnap_store_delete(s->ctl, s->mark_key, NULL) < 0)
        vlog(VMSNAP_LOG_WARN, "%s: cannot remove this push's mark (gc will)", url);
}

/* A failed push removes what it stored, unless another push committed a set there meanwhile
 * (the objects may be that push's now). Clean-up: runs after a cancel too. */
static void remove_pushed(const struct set_push *s, const char *lp, const char *url)
{
    /* Every object of the set's names, written by this push or not: what it did not replace yet
     * belongs to the set it un-committed (dead, and left unlisted it kept a full store full and
     * the next push failed the same way), or is an object the push would have replaced; and the
     * objects of that set's other names (its mark's "replaces"), dead as well. Objects of any
     * other name are left alone; so is everything once another push shows up there (its mark or
     * its manifest), checked before each delete, each in one attempt (no back-off between check
     * and delete). */
    bool left = !lp;
    for (size_t i = 0; i < s->n + s->nr && !left; i++) {
        int busy = 0;
        enum deleted d = guarded_delete(
            s, lp, NO_PUSH, i < s->n ? s->files[i].name : s->replaces[i - s->n], url, "", &busy);
        if (d == GUARDED) {
            vlog(VMSNAP_LOG_WARN, "%s: %s: leaving the objects this push stored in place", url,
                 busy > 0 ? "another push is or was there meanwhile"
                          : "cannot tell whether another push is there");
            left = true;
            break;
        }
        left = d == FAILED;
        if (i == 0)
            sys_failpoint("push-cleanup-deleted"); /* after its first delete */
    }
    /* the mark last, and only when every object went: while it stays, gc knows the objects may
     * be left */
    end_mark(s, url, left);
    if (!left && lp)
        vmsnap_store_tidy(s->ctl, lp);
}

/* A push that fails after its un-commit, before it stored over any object of the set it
 * replaces (a cancel, a store gone, a file that cannot be read), removes what it stored under
 * names that set does not have, each after a listing that shows no other push there (as
 * remove_pushed does), then, after one more such listing, puts that set's manifest back byte
 * for byte: the set is visible again, whole. Not when another push is there meanwhile (its mark,
 * or a manifest): that one owns the prefix. True when the set is back. Runs after a cancel too.
 * What remains is one request's window between the last listing and the PUT. */
static bool restore_old(const struct set_push *s, const char *lp, const char *url)
{
    if (!s->old_raw || !s->in_old || s->overwrote)
        return false;
    bool ok = lp != NULL, back = false, left = false;
    struct vmsnap_err e = {0};
    /* a failed delete stops the deletes, not the restore: the mark names what is left, the
     * manifest put back does not, so gc removes exactly that */
    for (size_t i = 0; ok && !left && i < s->n; i++) {
        if (s->in_old[i])
            continue;
        enum deleted d = guarded_delete(s, lp, NO_NEW_PUSH, s->files[i].name, url, "", NULL);
        ok = d != GUARDED;
        left = d == FAILED;
    }
    /* a few tries, each right after a listing (no back-off between listing and PUT): one
     * transient failure must not turn into the loss of the set */
    for (unsigned a = 0; ok && !back && a < 4; a++) {
        if (a)
            sys_sleep_ms(250u << a);
        if (guard_fails(s, lp, NO_NEW_PUSH) != 0)
            break;
        vmsnap_err_clear(&e);
        vmsnap_store_conn_one_attempt(s->ctl, true);
        back = vmsnap_store_put(s->ctl, s->mkey, s->old_raw, s->old_raw_len, &e) == 0;
        vmsnap_store_conn_one_attempt(s->ctl, false);
        if (!back)
            vlog(VMSNAP_LOG_WARN, "%s: cannot put back the set this push was replacing: %s", url,
                 e.msg);
    }
    if (back) {
        vlog(VMSNAP_LOG_WARN, "%s: the set this push was replacing is in place again", url);
        end_mark(s, url, left);
    }
    return back;
}

/* After its commit, a push removes the objects of the set it replaced that it did not
 * overwrite (names that set had and this one has not): nothing lists them any more. Each delete
 * follows a listing that shows no other push's mark and a read of the manifest that shows this
 * push's (a push that started since, or finished whole since, owns the prefix: those names may
 * be its objects now). True when none of them is left. */
bool xfer_remove_replaced(const struct set_push *s)
{
    const char *url = s->url;
    char *lp = xfer_join_key(s->prefix, "");
    size_t gone = 0, removed = 0;
    for (size_t i = 0; lp && i < s->nr; i++) {
        enum deleted d =
            guarded_delete(s, lp, OWN_SET_THERE, s->replaces[i], url, " of the replaced set", NULL);
        if (d == GUARDED || d == FAILED)
            break;
        gone++;
        removed += d == DELETED;
    }
    free(lp);
    if (gone < s->nr)
        vlog(VMSNAP_LOG_WARN,
             "%s: %zu object%s of the replaced set that this push does not have stay for "
             "'vmsnap gc' (this push's mark names them)",
             url, s->nr - gone, s->nr - gone == 1 ? "" : "s");
    else if (s->nr)
        vlog(VMSNAP_LOG_INFO,
             "%s: removed %zu object%s of the replaced set that this push does not have", url,
             removed, removed == 1 ? "" : "s");
    return gone == s->nr;
}

/* A push over a set that fails before its un-commit: that set is still committed and none of
 * its objects was stored over (the caller aborted the deferred uploads). What this push stored
 * under names that set does not have goes, each after a check that the set there is still that
 * one and no other push is there; then the mark. Otherwise both stay for gc (a mark beside a
 * committed set: gc removes only what that set does not name). Runs after a cancel too. */
static void remove_new_names(const struct set_push *s, const char *lp, const char *url)
{
    bool left = !lp;
    for (size_t i = 0; i < s->n && !left; i++)
        if (!s->in_old[i])
            left = guarded_delete(s, lp, OLD_SET_THERE, s->files[i].name, url, "", NULL) >= GUARDED;
    end_mark(s, url, left);
}

/* After a failure: a set this push read and has not un-committed yet stays, and what this push
 * stored under new names goes; else the set it replaces back (restore_old) or what it stored
 * goes (no set there, or one un-committed unread: a corrupt manifest). */
void xfer_push_failed(const struct set_push *s, bool uncommitted)
{
    cancel_hold(); /* the clean-up runs after a cancel too */
    char url[URL_BUF];
    vmsnap_store_url(s->x->st, s->prefix, url, sizeof(url));
    char *lp = xfer_join_key(s->prefix, ""); /* NULL (out of memory): everything stays for gc */
    if (!uncommitted && s->in_old)
        remove_new_names(s, lp, url);
    else if (!restore_old(s, lp, url))
        remove_pushed(s, lp, url);
    free(lp);
    cancel_release();
}
