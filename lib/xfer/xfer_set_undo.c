/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The undo paths of a set push: remove what a failed push stored, put back the set it replaced,
 * remove the replaced set's other objects after a commit.
 */
#include "xfer_int.h"

#include "sys/sys.h"
#include "vmsnap/xfer.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

/* Delete the object of the set file `name` under `prefix` in one attempt (no back-off between
 * the caller's check that no other push is there and the DELETE). A missing one is fine; any
 * other failure is logged ("cannot remove NAME.zstd[what]") and returned. */
static int delete_set_object(struct vmsnap_store_conn *ctl, const char *prefix, const char *name,
                             const char *url, const char *what)
{
    char obj[300];
    snprintf(obj, sizeof(obj), "%s.zstd", name);
    char *k = join_key(prefix, obj);
    struct vmsnap_err e = {0};
    int drc = k ? delete_once(ctl, k, &e) : vmsnap_err_set(&e, ENOMEM, "out of memory");
    free(k);
    if (drc < 0 && drc != -ENOENT) {
        vlog(VMSNAP_LOG_WARN, "%s: cannot remove %s%s: %s", url, obj, what, e.msg);
        return drc;
    }
    return drc == -ENOENT ? 1 : 0;
}

/* A failed push's mark at the end of its clean-up: removed when everything it names went
 * (`left` false), else it stays, and says so, for gc. */
static void end_mark(struct vmsnap_store_conn *ctl, const struct set_push *s, const char *url,
                     bool left)
{
    if (left)
        vlog(VMSNAP_LOG_WARN, "%s: this push's mark stays for 'vmsnap gc' to finish", url);
    else if (s->mark_key && vmsnap_store_delete(ctl, s->mark_key, NULL) < 0)
        vlog(VMSNAP_LOG_WARN, "%s: cannot remove this push's mark (gc will)", url);
}

/* A failed push removes what it stored, unless another push committed a set there meanwhile
 * (the objects may be that push's now). Clean-up: runs after a cancel too. */
void remove_pushed(struct vmsnap_store_conn *ctl, const char *prefix, const char *mkey,
                   const struct set_push *s)
{
    cancel_hold();
    char url[URL_BUF];
    vmsnap_store_url(vmsnap_store_conn_store(ctl), prefix, url, sizeof(url));
    char *lp = join_key(prefix, "");
    /* Every object of the set's names, written by this push or not: what it did not replace yet
     * belongs to the set it un-committed (dead, and left unlisted it kept a full store full and
     * the next push failed the same way), or is an object the push would have replaced; and the
     * objects of that set's other names (its mark's "replaces"), dead as well. Objects of any
     * other name are left alone; so is everything once another push shows up there (its mark or
     * its manifest), checked before each delete, each in one attempt (no back-off between check
     * and delete). */
    bool left = !lp;
    for (size_t i = 0; i < s->n + s->nr && !left; i++) {
        int busy = prefix_busy(ctl, lp, mkey, s->mark_key);
        if (busy != 0) {
            vlog(VMSNAP_LOG_WARN, "%s: %s: leaving the objects this push stored in place", url,
                 busy > 0 ? "another push is or was there meanwhile"
                          : "cannot tell whether another push is there");
            left = true;
            break;
        }
        if (delete_set_object(ctl, prefix, i < s->n ? s->files[i].name : s->replaces[i - s->n], url,
                              "") < 0)
            left = true;
        if (i == 0)
            sys_failpoint("push-cleanup-deleted"); /* after its first delete */
    }
    /* the mark last, and only when every object went: while it stays, gc knows the objects may
     * be left */
    end_mark(ctl, s, url, left);
    if (!left && lp)
        vmsnap_store_tidy(ctl, lp);
    free(lp);
    cancel_release();
}

/* A push that fails after its un-commit, before it stored over any object of the set it
 * replaces (a cancel, a store gone, a file that cannot be read), removes what it stored under
 * names that set does not have, each after a listing that shows no other push there (as
 * remove_pushed does), then, after one more such listing, puts that set's manifest back byte
 * for byte: the set is visible again, whole. Not when another push is there meanwhile (its mark,
 * or a manifest): that one owns the prefix. True when the set is back. Runs after a cancel too.
 * What remains is one request's window between the last listing and the PUT. */
bool restore_old(struct vmsnap_store_conn *ctl, const char *prefix, const char *mkey,
                 const struct set_push *s)
{
    if (!s->old_raw || !s->in_old || s->overwrote)
        return false;
    cancel_hold();
    char url[URL_BUF];
    vmsnap_store_url(vmsnap_store_conn_store(ctl), prefix, url, sizeof(url));
    char *lp = join_key(prefix, "");
    bool ok = lp != NULL, back = false, left = false;
    struct vmsnap_err e = {0};
    /* a failed delete stops the deletes, not the restore: the mark names what is left, the
     * manifest put back does not, so gc removes exactly that */
    for (size_t i = 0; ok && !left && i < s->n; i++) {
        if (s->in_old[i])
            continue;
        if (prefix_busy_but(ctl, lp, mkey, s->mark_key, &s->prior) != 0) {
            ok = false;
            break;
        }
        if (delete_set_object(ctl, prefix, s->files[i].name, url, "") < 0)
            left = true;
    }
    /* a few tries, each right after a listing (no back-off between listing and PUT): one
     * transient failure must not turn into the loss of the set */
    for (unsigned a = 0; ok && !back && a < 4; a++) {
        if (a)
            sys_sleep_ms(250u << a);
        if (prefix_busy_but(ctl, lp, mkey, s->mark_key, &s->prior) != 0)
            break;
        vmsnap_err_clear(&e);
        vmsnap_store_conn_one_attempt(ctl, true);
        back = vmsnap_store_put(ctl, mkey, s->old_raw, s->old_raw_len, &e) == 0;
        vmsnap_store_conn_one_attempt(ctl, false);
        if (!back)
            vlog(VMSNAP_LOG_WARN, "%s: cannot put back the set this push was replacing: %s", url,
                 e.msg);
    }
    if (back) {
        vlog(VMSNAP_LOG_WARN, "%s: the set this push was replacing is in place again", url);
        end_mark(ctl, s, url, left);
    }
    free(lp);
    cancel_release();
    return back;
}

/* After its commit, a push removes the objects of the set it replaced that it did not
 * overwrite (names that set had and this one has not): nothing lists them any more. Each delete
 * follows a listing that shows no other push's mark and a read of the manifest that shows this
 * push's (a push that started since, or finished whole since, owns the prefix: those names may
 * be its objects now). True when none of them is left. */
bool remove_replaced(struct vmsnap_store_conn *ctl, const char *prefix, const char *mkey,
                     const struct set_push *s, const char *url)
{
    char *lp = join_key(prefix, "");
    size_t gone = 0, removed = 0;
    for (size_t i = 0; lp && i < s->nr; i++) {
        if (prefix_busy(ctl, lp, NULL, s->mark_key) != 0 ||
            manifest_is(s->x, ctl, mkey, s->push_id) != 1)
            break;
        int drc = delete_set_object(ctl, prefix, s->replaces[i], url, " of the replaced set");
        if (drc < 0)
            break;
        gone++;
        removed += drc == 0;
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
static void remove_new_names(struct xfer *x, struct vmsnap_store_conn *ctl, const char *prefix,
                             const char *mkey, const struct set_push *s)
{
    cancel_hold();
    char url[URL_BUF];
    vmsnap_store_url(vmsnap_store_conn_store(ctl), prefix, url, sizeof(url));
    char *lp = join_key(prefix, "");
    bool left = !lp;
    for (size_t i = 0; i < s->n && !left; i++) {
        if (s->in_old[i])
            continue;
        if (prefix_busy_but(ctl, lp, NULL, s->mark_key, &s->prior) != 0 ||
            manifest_same(x, ctl, mkey, s, NULL) != 1) {
            left = true;
            break;
        }
        if (delete_set_object(ctl, prefix, s->files[i].name, url, "") < 0)
            left = true;
    }
    end_mark(ctl, s, url, left);
    free(lp);
    cancel_release();
}

/* After a failure: a set this push read and has not un-committed yet stays, and what this push
 * stored under new names goes; else the set it replaces back (restore_old) or what it stored
 * goes (no set there, or one un-committed unread: a corrupt manifest). */
void push_failed(struct xfer *x, struct vmsnap_store_conn *ctl, const char *prefix,
                 const char *mkey, const struct set_push *s, bool uncommitted)
{
    if (!uncommitted && s->in_old)
        remove_new_names(x, ctl, prefix, mkey, s);
    else if (!restore_old(ctl, prefix, mkey, s))
        remove_pushed(ctl, prefix, mkey, s);
}
