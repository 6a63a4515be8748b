/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The set-push transaction: scan the directory, store the mark, read the set it replaces,
 * upload the files (deferred for the old set's names), un-commit, complete, commit, check.
 */
#include "xfer_int.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#define MAX_PRODUCERS 2u

static void *producer(void *arg)
{
    struct set_push *s = arg;
    struct vmsnap_store_conn *ctl = NULL;
    struct vmsnap_err e = {0};
    int rc = vmsnap_store_conn_new(s->x->st, &ctl, &e);
    for (;;) {
        pthread_mutex_lock(&s->mu);
        if (rc < 0 && s->rc == 0) {
            s->rc = rc;
            s->err = e;
        }
        if (s->rc || s->next >= s->n) {
            pthread_mutex_unlock(&s->mu);
            break;
        }
        size_t i = s->order[s->next++];
        pthread_mutex_unlock(&s->mu);
        struct mf_file *f = &s->files[i];
        char path[4352];
        snprintf(path, sizeof(path), "%s/%s", s->dir, f->name);
        char *key = xfer_object_key(s->prefix, f->name);
        char *bkey = s->x->base_key ? xfer_object_key(s->x->base_key, f->name) : NULL;
        int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (!key || (s->x->base_key && !bkey))
            rc = vmsnap_err_set(&e, ENOMEM, "out of memory");
        else if (fd < 0)
            rc = err_sys(&e, "open %s", path);
        else
            rc = xfer_push_fd(s->x, ctl, fd, path, key, bkey, f,
                              s->in_old && s->in_old[i] ? &s->def[i] : NULL, &e);
        if (rc < 0)
            vmsnap_err_wrap(&e, "push %s: ", f->name);
        if (fd >= 0)
            close(fd);
        free(key);
        free(bkey);
    }
    vmsnap_store_conn_free(ctl);
    return NULL;
}

static int cmp_name(const void *a, const void *b)
{
    return strcmp(((const struct mf_file *)a)->name, ((const struct mf_file *)b)->name);
}

/* qsort_r comparators over indices into an array of manifest entries (the argument) */
int xfer_cmp_size_desc(const void *a, const void *b, void *files)
{
    const struct mf_file *f = files;
    uint64_t x = f[*(const size_t *)a].size, y = f[*(const size_t *)b].size;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* The regular files of a snapshot-set directory, sorted by name; sizes hold st_size. */
int xfer_scan_set(const char *dir, struct mf_file **out, size_t *n, struct vmsnap_err *err)
{
    *out = NULL;
    *n = 0;
    DIR *d = opendir(dir);
    if (!d)
        return err_sys(err, "open directory %s", dir);
    size_t cap = 0;
    struct mf_file *v = NULL;
    int rc = 0;
    struct dirent *de;
    while (rc == 0 && (de = readdir(d))) {
        const char *name = de->d_name;
        if (!strcmp(name, ".") || !strcmp(name, ".."))
            continue;
        if (name[0] == '.') { /* hidden: vmsnap's own marks (".vmsnap-*"), or a user's */
            if (strncmp(name, ".vmsnap-", 8))
                vlog(VMSNAP_LOG_WARN, "skipping %s/%s: hidden files are not part of a set", dir,
                     name);
            continue;
        }
        /* anything but a regular file is refused: a set pushed without a file it holds (it
         * was skipped with a warning, which -q hides, and the push reported success) is a lost
         * snapshot. Symlinks are not followed (the file is opened O_NOFOLLOW): a push run as
         * root must not carry off what a link in a directory points to. */
        struct stat sb;
        if (fstatat(dirfd(d), name, &sb, AT_SYMLINK_NOFOLLOW) < 0) {
            rc = err_sys(err, "stat %s/%s", dir, name);
            break;
        }
        if (!S_ISREG(sb.st_mode)) {
            rc = vmsnap_err_set(err, EINVAL,
                                "%s/%s: %s: a snapshot set is the regular files of one directory "
                                "(hidden names are skipped); move it out of the way",
                                dir, name,
                                S_ISDIR(sb.st_mode)   ? "a directory"
                                : S_ISLNK(sb.st_mode) ? "a symlink (not followed)"
                                                      : "not a regular file");
            break;
        }
        if (!manifest_name_ok(name, strlen(name))) {
            rc = vmsnap_err_set(err, EINVAL, "%s/%s: this name cannot be part of a snapshot set",
                                dir, name);
            break;
        }
        if (*n >= VMSNAP_XFER_MAX_FILES) {
            rc = vmsnap_err_set(err, EINVAL, "%s: more than %u files", dir, VMSNAP_XFER_MAX_FILES);
            break;
        }
        if (grow_array(&v, &cap, *n + 1, sizeof(*v), 16) < 0) {
            rc = vmsnap_err_set(err, ENOMEM, "out of memory");
            break;
        }
        memset(&v[*n], 0, sizeof(v[*n]));
        v[*n].name = strdup(name);
        v[*n].size = (uint64_t)sb.st_size;
        if (!v[*n].name) {
            rc = vmsnap_err_set(err, ENOMEM, "out of memory");
            break;
        }
        (*n)++;
    }
    closedir(d);
    if (rc == 0 && *n == 0)
        rc = vmsnap_err_set(err, ENOENT, "%s: no regular files to push", dir);
    if (rc < 0) {
        struct manifest m = {.files = v, .n = *n};
        manifest_fini(&m);
        *n = 0;
        return rc;
    }
    qsort(v, *n, sizeof(*v), cmp_name);
    *out = v;
    return 0;
}

int xfer_new_push_id(char out[33], struct vmsnap_err *err)
{
    uint8_t id[16];
    if (getrandom(id, sizeof(id), 0) != (ssize_t)sizeof(id))
        return vmsnap_err_set(err, EIO, "getrandom: %s", strerror(errno));
    for (size_t i = 0; i < sizeof(id); i++)
        snprintf(out + 2 * i, 3, "%02x", id[i]);
    return 0;
}

/* The completion (or abort) of one deferred upload, on a pool connection. */
struct def_task {
    struct xtask t;
    struct set_push *s;
    size_t i;
    bool abort;
    int rc;
    bool old_intact; /* failed, and the old set's object is still at the key */
    struct vmsnap_err err;
    pthread_mutex_t *mu;
    pthread_cond_t *cv;
    unsigned *left;
};

static void def_run(struct xtask *xt, struct vmsnap_store_conn *c)
{
    struct def_task *t = (struct def_task *)xt;
    cancel_hold(); /* per thread: once asked for, a completion runs to its answer */
    static atomic_flag stopped_once = ATOMIC_FLAG_INIT;
    if (!t->abort && !atomic_flag_test_and_set(&stopped_once))
        sys_failpoint("push-completion"); /* the first completion: a test's Ctrl-C here */
    struct deferred *d = &t->s->def[t->i];
    const struct mf_file *mine = &t->s->files[t->i], *old = &t->s->old_files[t->i];
    char *k = xfer_object_key(t->s->prefix, mine->name);
    int rc = k ? 0 : vmsnap_err_set(&t->err, ENOMEM, "out of memory");
    if (rc == 0 && !t->abort)
        rc = vmsnap_store_mpu_complete(c, k, d->upload_id, d->parts, d->nparts, &t->err);
    bool dead = false;               /* the upload can no longer complete */
    if (k && (t->abort || rc < 0)) { /* first, so that it cannot complete later */
        struct vmsnap_err ae = {0};
        int arc = vmsnap_store_mpu_abort(c, k, d->upload_id, &ae);
        dead = arc == 0 || arc == -ENOENT;
        if (!dead)
            vlog(VMSNAP_LOG_WARN, "cannot abort the upload of %s (run 'vmsnap gc'): %s", k, ae.msg);
    }
    /* the same content as the old set's object (an unchanged file): the key holds the old
     * object whatever happened */
    bool same = old->detail && old->table_digest && mine->object_size == old->object_size &&
                !strcmp(mine->sha256, old->sha256);
    if (k && !t->abort && rc < 0) {
        /* A failed completion (no such upload: aborted meanwhile, or completed by an attempt
         * whose answer was lost; RGW's 500 "already in progress" for an aborted one; a store
         * gone) is judged, once the upload is dead, by what the key holds: this push's object
         * (its tableSha256) means completed; the old set's object (or, for an old entry without
         * a table digest, any other object: this completion was this push's only write there)
         * means not stored over; anything else, or an upload that may still complete, stored
         * over. */
        struct vmsnap_err ce = {0};
        int mrc = xfer_check_object(t->s->x, c, k, mine, &ce);
        if (mrc == 0) {
            vmsnap_err_clear(&t->err);
            rc = 0;
        } else if (dead && old->detail && old->table_digest) {
            t->old_intact = xfer_check_object(t->s->x, c, k, old, &ce) == 0;
        } else if (dead) {
            t->old_intact = mrc == -ESTALE;
        }
        if (rc == -ENOENT)
            vmsnap_err_wrap(&t->err,
                            "the upload was aborted or removed while it completed (another push "
                            "to the same place at the same time?); NOT stored there: ");
        if (rc < 0)
            vmsnap_err_wrap(&t->err, "push %s: ", mine->name);
    }
    if (same && rc == 0)
        t->old_intact = true;
    if (k) { /* a retried CreateMultipartUpload may have left another upload of this key */
        struct leftover_ctx l = {.exact = k, .c = c};
        (void)vmsnap_store_list_uploads(c, k, xfer_abort_leftover, &l, NULL);
    }
    free(k);
    free(d->upload_id);
    free(d->parts);
    d->upload_id = NULL;
    d->parts = NULL;
    t->rc = rc;
    cancel_release();
    pthread_mutex_lock(t->mu);
    --*t->left;
    pthread_cond_signal(t->cv);
    pthread_mutex_unlock(t->mu);
}

/* Complete the uploads a set push left pending (in parallel on the pool; from the first request
 * on, the set it replaces is being overwritten), or abort them all (`abort`: the push failed).
 * Not cut short by a cancel once started. Returns the first failure. */
static int finish_deferred(struct set_push *s, bool abort, struct vmsnap_err *err)
{
    if (!s->def)
        return 0;
    size_t n = 0;
    for (size_t i = 0; i < s->n; i++)
        n += s->def[i].upload_id != NULL;
    if (n == 0)
        return 0;
    if (!abort)
        sys_failpoint("push-completing");
    int rc = abort ? 0 : cancel_check(err);
    if (rc < 0)
        abort = true;
    struct def_task *ts = calloc(n, sizeof(*ts));
    if (!ts)
        return rc < 0 ? rc : vmsnap_err_set(err, ENOMEM, "out of memory");
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
    unsigned left = (unsigned)n;
    if (!abort)
        s->overwrote = true;
    cancel_hold();
    for (size_t i = 0, j = 0; i < s->n; i++) {
        if (!s->def[i].upload_id)
            continue;
        ts[j] =
            (struct def_task){.s = s, .i = i, .abort = abort, .mu = &mu, .cv = &cv, .left = &left};
        ts[j].t.run = def_run;
        xpool_submit(&s->x->pool, &ts[j].t);
        j++;
    }
    pthread_mutex_lock(&mu);
    while (left)
        pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
    cancel_release();
    size_t intact = 0;
    for (size_t j = 0; j < n; j++) {
        intact += ts[j].old_intact;
        if (ts[j].rc < 0 && rc == 0) {
            rc = ts[j].rc;
            if (err)
                *err = ts[j].err;
        }
    }
    /* every key still holds the old set's object (its completion failed, or stored the same
     * content): none was stored over, the old set is whole and can be put back */
    if (!abort && rc < 0 && intact == n)
        s->overwrote = false;
    free(ts);
    pthread_mutex_destroy(&mu);
    pthread_cond_destroy(&cv);
    return rc;
}

/* The set a push replaces, read on the pool while the push stores its mark (one round trip
 * saved on every set push). */
struct old_set {
    struct xtask t;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    struct xfer *x;
    const char *mkey;
    int rc;
    struct manifest m;
    char *raw; /* its bytes, to store again when this push fails before replacing any object */
    size_t raw_len;
    const char *key;           /* the set's own key (its prefix) */
    bool obj_exists;           /* an object is stored at it */
    bool unusable;             /* its manifest was read but is no manifest vmsnap can use */
    struct prior_marks *prior; /* filled with the push marks there (a listing) */
    struct vmsnap_err err;
};

static void old_set_run(struct xtask *xt, struct vmsnap_store_conn *c)
{
    struct old_set *o = (struct old_set *)xt;
    char murl[URL_BUF];
    vmsnap_store_url(o->x->st, o->mkey, murl, sizeof(murl));
    bool unusable = false;
    /* without --max-size: that cap is a policy for what is pulled, not damage, and a set taken
     * for unusable is un-committed before the upload, its manifest not kept */
    int rc = xfer_read_manifest_x(c, o->mkey, murl, UINT64_MAX, &o->m, &o->raw, &o->raw_len,
                                  &unusable, &o->err);
    /* an object stored at the set's own key (S3; on the local store a file there is no
     * directory): pull of the URL would take the set and hide it */
    int obj = rc == -ENOENT && vmsnap_store_kind(o->x->st) == VMSNAP_STORE_S3 && *o->key
                  ? xfer_key_exists(c, o->key, NULL)
                  : 0;
    /* the marks there now (a killed push's): not "another push meanwhile" to a restore. Not
     * listed, none are ignored. */
    char *lp = rc == 0 ? xfer_join_key(o->key, "") : NULL;
    if (lp) {
        o->prior->lpn = strlen(lp);
        if (vmsnap_store_list(c, lp, xfer_see_prior, o->prior, NULL) < 0)
            xfer_prior_marks_fini(o->prior);
        free(lp);
    }
    pthread_mutex_lock(&o->mu);
    o->rc = rc;
    o->obj_exists = obj > 0;
    o->unusable = unusable;
    o->done = true;
    pthread_cond_signal(&o->cv);
    pthread_mutex_unlock(&o->mu);
}

/* The names of the set `o` read (the one this push replaces) that `s` does not have, into
 * s->replaces. A set that cannot be read leaves them unknown (a warning): the push goes on. */
static int find_replaced(struct set_push *s, struct old_set *o, struct vmsnap_err *err)
{
    pthread_mutex_lock(&o->mu);
    while (!o->done)
        pthread_cond_wait(&o->cv, &o->mu);
    pthread_mutex_unlock(&o->mu);
    if (o->rc == -ENOENT)
        return 0;
    if (o->rc == -ECANCELED)
        return vmsnap_err_set(err, ECANCELED, "%s", o->err.msg);
    if (o->rc < 0 && !o->unusable)
        /* the store did not answer: whatever is there is not replaced blind (its manifest,
         * deleted unread, could not be put back if this push failed) */
        return vmsnap_err_set(err, -o->rc,
                              "cannot read what is at the destination, which this push would "
                              "replace: %s (nothing was changed there)",
                              o->err.msg);
    if (o->rc < 0) {
        vlog(VMSNAP_LOG_WARN,
             "%s (replacing it; objects of names this push does not have may stay there)",
             o->err.msg);
        return 0;
    }
    s->replaces = calloc(o->m.n ? o->m.n : 1, sizeof(*s->replaces));
    s->in_old = calloc(s->n ? s->n : 1, sizeof(*s->in_old));
    s->def = calloc(s->n ? s->n : 1, sizeof(*s->def));
    s->old_files = calloc(s->n ? s->n : 1, sizeof(*s->old_files));
    int rc = s->replaces && s->in_old && s->def && s->old_files
                 ? 0
                 : vmsnap_err_set(err, ENOMEM, "out of memory");
    for (size_t i = 0; rc == 0 && i < o->m.n; i++) {
        struct mf_file key = {.name = o->m.files[i].name};
        struct mf_file *hit = bsearch(&key, s->files, s->n, sizeof(*s->files), cmp_name);
        if (hit) {
            size_t j = (size_t)(hit - s->files);
            s->in_old[j] = true;
            s->old_files[j] = o->m.files[i]; /* its digest, to tell the old object there */
            s->old_files[j].name = s->files[j].name;
            continue;
        }
        if (!(s->replaces[s->nr] = strdup(o->m.files[i].name)))
            rc = vmsnap_err_set(err, ENOMEM, "out of memory");
        else
            s->nr++;
    }
    if (rc == 0) {
        s->old_raw = o->raw;
        s->old_raw_len = o->raw_len;
        o->raw = NULL;
    }
    return rc;
}

/* Before a set push changes anything (it un-commits the set it replaces): every file opens and
 * every key fits, so the usual local failures leave the old set in place. */
static int set_ready(const struct xfer *x, const struct set_push *s, struct vmsnap_err *err)
{
    int dfd = open(s->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0)
        return err_sys(err, "open directory %s", s->dir);
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < s->n; i++) {
        const char *name = s->files[i].name;
        int fd = openat(dfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (fd < 0) {
            rc = err_sys(err, "open %s/%s", s->dir, name);
            break;
        }
        /* the read-back before the commit holds the set's objects to --max-size as a pull
         * does: a larger file failed there, after the set it replaced was stored over */
        struct stat sb;
        if (fstat(fd, &sb) == 0 && (uint64_t)sb.st_size > x->o.max_size)
            rc = vmsnap_err_set(err, EFBIG,
                                "%s/%s is %llu bytes, over the cap of %llu (--max-size; raise it "
                                "for a larger image)",
                                s->dir, name, (unsigned long long)sb.st_size,
                                (unsigned long long)x->o.max_size);
        close(fd);
        if (rc < 0)
            break;
        char *k = xfer_object_key(s->prefix, name);
        rc = k ? xfer_key_fits(x, k, err) : vmsnap_err_set(err, ENOMEM, "out of memory");
        free(k);
    }
    close(dfd);
    if (rc == 0) {
        char mname[64];
        snprintf(mname, sizeof(mname), PUSH_MARK_PREFIX "%s" PUSH_MARK_SUFFIX, s->push_id);
        char *k = xfer_join_key(s->prefix, mname);
        rc = k ? xfer_key_fits(x, k, err) : vmsnap_err_set(err, ENOMEM, "out of memory");
        free(k);
    }
    return rc;
}

/* The files, their upload order (largest first), the push id, and the checks that come before
 * anything changes (set_ready). */
static int set_begin(struct set_push *s, struct vmsnap_err *err)
{
    int rc = xfer_scan_set(s->dir, &s->files, &s->n, err);
    if (rc < 0)
        return rc;
    s->mkey = xfer_join_key(s->prefix, VMSNAP_XFER_MANIFEST);
    s->order = calloc(s->n, sizeof(*s->order));
    if (!s->mkey || !s->order)
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    for (size_t i = 0; i < s->n; i++)
        s->order[i] = i;
    qsort_r(s->order, s->n, sizeof(*s->order), xfer_cmp_size_desc, s->files);
    if ((rc = xfer_new_push_id(s->push_id, err)) < 0)
        return rc;
    return set_ready(s->x, s, err);
}

/* The mark before anything changes: a push killed from here on leaves it for gc (not once
 * cancelled: nothing happens then). Meanwhile the pool reads the set being replaced; when that
 * has names this push has not, the mark is stored again naming them, before the un-commit makes
 * them dead. A failure here changed nothing: the mark goes, whether its PUT was answered, lost
 * after it was stored, or cut short by a cancel (a DELETE runs through one). */
static int set_mark(struct set_push *s, struct vmsnap_err *err)
{
    struct old_set old = {.x = s->x, .mkey = s->mkey, .key = s->prefix, .prior = &s->prior};
    old.t.run = old_set_run;
    pthread_mutex_init(&old.mu, NULL);
    pthread_cond_init(&old.cv, NULL);
    xpool_submit(&s->x->pool, &old.t);
    char mname[64];
    snprintf(mname, sizeof(mname), PUSH_MARK_PREFIX "%s" PUSH_MARK_SUFFIX, s->push_id);
    s->mark_time = (int64_t)time(NULL);
    s->mark_key = xfer_join_key(s->prefix, mname);
    int rc = s->mark_key ? xfer_put_mark(s->ctl, s, s->mark_time, s->url, err)
                         : vmsnap_err_set(err, ENOMEM, "out of memory");
    if (rc == 0)
        sys_failpoint("push-marked");
    struct vmsnap_err oe = {0};
    int orc = find_replaced(s, &old, &oe);
    manifest_fini(&old.m);
    free(old.raw);
    pthread_mutex_destroy(&old.mu);
    pthread_cond_destroy(&old.cv);
    if (rc == 0 && orc < 0) {
        rc = orc;
        if (err)
            *err = oe;
    }
    if (rc == 0 && old.obj_exists)
        rc = vmsnap_err_set(err, EEXIST,
                            "%s holds a single object: a set pushed there would hide it (pull "
                            "takes the set); remove it first ('vmsnap rm %s') or push elsewhere",
                            s->url, s->url);
    s->had_old = old.rc != -ENOENT; /* a set was there (or it could not be told) */
    if (rc == 0 && s->nr)
        rc = xfer_put_mark(s->ctl, s, s->mark_time, s->url, err);
    if (rc < 0 && s->mark_key && vmsnap_store_delete(s->ctl, s->mark_key, NULL) < 0)
        vlog(VMSNAP_LOG_WARN, "%s: cannot remove this push's mark (gc will)", s->url);
    return rc;
}

/* A DELETE of the manifest failed: it may still have been carried out (its answer lost). When
 * the set this push replaces is gone, its objects are dead, as after a failure past the
 * un-commit; when that cannot be told, the mark (which names them) stays for gc. `ex`: 1 the
 * manifest is there, 0 it is gone, < 0 cannot tell. */
static void uncommit_failed(struct set_push *s, int ex)
{
    if (ex < 0)
        vlog(VMSNAP_LOG_WARN,
             "%s: cannot tell whether the set there is still committed: "
             "this push's mark stays for 'vmsnap gc'",
             s->url);
    else
        xfer_push_failed(s, ex == 0);
}

/*
 * Where a set push decides to un-commit (1 of 2). A set this push read stays committed while
 * the push uploads: the objects of its names are stored as uploads held open (deferred), so
 * nothing of that set changes until the push un-commits it, right before it completes them
 * (uncommit_late). A push failing before then (a store gone mid-upload, a kill) leaves that set
 * whole; the un-commit used to come first, and such a failure left the set invisible, its
 * manifest only in the dead push's memory, and gc then deleted its objects. A set whose manifest
 * is corrupt is un-committed here (nothing to protect); a push that found no set un-commits
 * nothing: a manifest there now is a set another push committed meanwhile (deleted, then its
 * objects by the clean-up).
 */
static int uncommit_early(struct set_push *s, struct vmsnap_err *err)
{
    s->late = s->in_old != NULL;
    int rc = cancel_check(err);
    if (rc == 0 && s->had_old && !s->late)
        rc = vmsnap_store_delete(s->ctl, s->mkey, err);
    if (rc < 0) {
        int ex = rc == -ECANCELED || !s->had_old ? 1 : xfer_key_exists(s->ctl, s->mkey, NULL);
        if (ex == 0)
            xfer_push_failed(s, true);
        else if (ex < 0)
            uncommit_failed(s, ex);
        else if (vmsnap_store_delete(s->ctl, s->mark_key, NULL) < 0)
            vlog(VMSNAP_LOG_WARN, "%s: cannot remove this push's mark (gc will)", s->url);
        return rc;
    }
    s->uncommitted = s->had_old && !s->late;
    return 0;
}

/* The leftovers of killed pushes at the prefix are cleared (not cut short). */
static int sweep_leftovers(struct set_push *s, struct vmsnap_err *err)
{
    char *lp = xfer_join_key(s->prefix, "");
    if (!lp)
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    struct leftover_ctx l = {.c = s->ctl, .in = lp};
    cancel_hold();
    int rc = vmsnap_store_list_uploads(s->ctl, lp, xfer_abort_leftover, &l, err);
    cancel_release();
    free(lp);
    if (rc < 0)
        xfer_push_failed(s, s->uncommitted);
    return rc;
}

/* Every file, by up to MAX_PRODUCERS producers. A failure leaves no manifest: the set is
 * incomplete; the old one stays or comes back, or what this push stored goes (best effort). */
static int upload_files(struct set_push *s, struct vmsnap_err *err)
{
    pthread_mutex_init(&s->mu, NULL);
    unsigned np = (unsigned)VMSNAP_MIN(s->n, (size_t)MAX_PRODUCERS);
    pthread_t tids[MAX_PRODUCERS];
    unsigned started = 0;
    for (; started < np; started++)
        if (thread_start(&tids[started], producer, s) != 0)
            break;
    if (started == 0)
        producer(s);
    for (unsigned i = 0; i < started; i++)
        pthread_join(tids[i], NULL);
    pthread_mutex_destroy(&s->mu);
    if (s->rc == 0)
        return 0;
    if (err)
        *err = s->err;
    finish_deferred(s, true, NULL);
    xfer_push_failed(s, s->uncommitted);
    return s->rc;
}

/* The un-commit's DELETE of the manifest, the set there checked to be the one this push
 * replaces right before (no back-off between the check and the DELETE). A DELETE answered with
 * an error may have been carried out (its answer lost) or not (a 503): the manifest gone, the
 * un-commit is done; still there and still that set, check and DELETE are tried again, up to
 * GUARDED_ATTEMPTS times (a single 503 failed the whole push). */
static int uncommit_delete(struct set_push *s, struct vmsnap_err *err)
{
    unsigned delay = 0;
    for (unsigned a = 1;; a++) {
        int rc = xfer_delete_once(s->ctl, s->mkey, err);
        if (rc == 0 || rc == -ECANCELED)
            return rc;
        int ex = xfer_key_exists(s->ctl, s->mkey, NULL);
        if (ex == 0) {
            vlog(VMSNAP_LOG_INFO,
                 "%s: the un-commit was carried out, though its answer was an error (%s)", s->url,
                 err ? err->msg : "?");
            vmsnap_err_clear(err);
            return 0;
        }
        if (ex < 0 || a >= GUARDED_ATTEMPTS)
            return rc;
        vlog(VMSNAP_LOG_INFO, "%s: retry %u of the un-commit (%s)", s->url, a,
             err ? err->msg : "?");
        xfer_guarded_backoff(&delay);
        struct vmsnap_err e2 = {0};
        int same = xfer_manifest_same(s->x, s->ctl, s->mkey, s, &e2);
        if ((rc = cancel_check(err)) < 0)
            return rc;
        if (same == 0)
            return vmsnap_err_set(err, EBUSY,
                                  "%s: another push to the same place ran at the same time: the "
                                  "set there is no longer the one this push replaces; this "
                                  "snapshot is NOT stored there",
                                  s->url);
        if (same < 0) {
            if (err)
                *err = e2;
            return same;
        }
    }
}

/*
 * Where a set push decides to un-commit (2 of 2): now that every object is uploaded, the set
 * this push read is un-committed, only when it is still the one there (a manifest another push
 * committed since is that push's set, not this one's to delete), its held uploads all still
 * there, and not once cancelled (the set stays). A failure undoes the push here.
 */
static int uncommit_late(struct set_push *s, struct vmsnap_err *err)
{
    int same = 0, held = 1, rc;
    sys_failpoint("push-uncommitting");
    if ((rc = cancel_check(err)) == 0 &&
        (held = xfer_held_intact(s->ctl, s->prefix, s, err)) <= 0) {
        rc = held < 0 ? held : -EBUSY;
        vmsnap_err_wrap(err, "%s: ", s->url);
    } else if (rc == 0 && (same = xfer_manifest_same(s->x, s->ctl, s->mkey, s, err)) == 0)
        rc = vmsnap_err_set(err, EBUSY,
                            "%s: another push to the same place ran at the same time: the "
                            "set there is no longer the one this push replaces; this "
                            "snapshot is NOT stored there",
                            s->url);
    else if (rc == 0 && same < 0)
        rc = same;
    if (rc == 0)
        rc = uncommit_delete(s, err);
    if (rc == 0) {
        s->uncommitted = true;
        return 0;
    }
    /* carried out with its answer lost? as for the early un-commit */
    int ex = same != 1 ? 0 : rc == -ECANCELED ? 1 : xfer_key_exists(s->ctl, s->mkey, NULL);
    finish_deferred(s, true, NULL);
    if (same == 1)
        uncommit_failed(s, ex);
    else
        xfer_push_failed(s, false);
    return rc;
}

/* Complete the deferred uploads (`rc` < 0: abort them); a failure undoes the push. */
static int complete_deferred(struct set_push *s, int rc, struct vmsnap_err *err)
{
    if (rc < 0)
        finish_deferred(s, true, NULL);
    else if ((rc = finish_deferred(s, false, err)) < 0)
        finish_deferred(s, true, NULL); /* those not completed */
    if (rc < 0)
        xfer_push_failed(s, s->uncommitted);
    return rc;
}

/* The commit: objects checked first (a push racing this one may have replaced some: then
 * nothing is committed over them), then the manifest, then all of it again; then the replaced
 * set's other objects and the mark go. */
static int commit_manifest(struct set_push *s, const struct manifest *m, const char *json,
                           struct vmsnap_err *err)
{
    int rc = xfer_check_committed(s->x, s->prefix, s->mkey, m, s->url, false, err);
    if (rc < 0)
        return rc;
    /* not after a cancel, unless the old set's objects are already stored over (then only the
     * commit keeps a set there); once asked for, it runs to its answer and is checked */
    if (s->overwrote && cancel_pending())
        vlog(VMSNAP_LOG_WARN,
             "%s: interrupted after the set there was stored over: committing this push's set "
             "(the only way to leave one there)",
             s->url);
    if (!s->overwrote && (rc = cancel_check(err)) < 0) {
        xfer_push_failed(s, s->uncommitted);
        return rc;
    }
    cancel_hold();
    rc = vmsnap_store_put(s->ctl, s->mkey, json, strlen(json), err);
    if (rc < 0 && xfer_manifest_is(s->x, s->ctl, s->mkey, s->push_id) == 1) {
        /* the PUT was carried out and its answer lost (every retry too): committed */
        vlog(VMSNAP_LOG_WARN,
             "%s: the commit's answer was lost, but the manifest there is this "
             "push's (%s)",
             s->url, err ? err->msg : "");
        vmsnap_err_clear(err);
        rc = 0;
    }
    if (rc < 0) {
        vmsnap_err_wrap(err, "commit %s/%s: ", s->url, VMSNAP_XFER_MANIFEST);
        /* not committed (a full store, a refused write): the objects are nobody's (or the old
         * set is back when none of its objects was stored over). When the answer was lost after
         * the manifest was stored, it exists and they stay. */
        xfer_push_failed(s, s->uncommitted);
    } else {
        rc = xfer_check_committed(s->x, s->prefix, s->mkey, m, s->url, true, err);
        /* committed and checked: the replaced set's other objects go, then the mark has done
         * its work (one left behind is gc's: the manifest names its push, the mark what it
         * replaced) */
        if (rc == 0)
            sys_failpoint("push-committed");
        /* the dead marks of earlier pushes first: while one is there, the guard of the
         * replaced objects' deletes (no other push's mark) leaves them for gc */
        char *lp = rc == 0 && s->prior.n ? xfer_join_key(s->prefix, "") : NULL;
        if (lp)
            xfer_tidy_marks(s, lp);
        free(lp);
        if (rc == 0 && xfer_remove_replaced(s) &&
            vmsnap_store_delete(s->ctl, s->mark_key, NULL) < 0)
            vlog(VMSNAP_LOG_WARN, "%s: cannot remove the push mark %s (gc will)", s->url,
                 s->mark_key);
    }
    cancel_release();
    return rc;
}

/* Every file uploaded: the late un-commit, the completions, the commit. */
static int commit_set(struct set_push *s, struct vmsnap_xfer_stats *stats, struct vmsnap_err *err)
{
    struct manifest m = {.files = s->files, .n = s->n, .format_version = 2};
    memcpy(m.push_id, s->push_id, sizeof(m.push_id));
    char *json = manifest_build(&m);
    int rc = json ? 0 : vmsnap_err_set(err, ENOMEM, "out of memory");
    if (rc == 0 && s->late && (rc = uncommit_late(s, err)) < 0) {
        free(json);
        return rc;
    }
    if ((rc = complete_deferred(s, rc, err)) == 0)
        rc = commit_manifest(s, &m, json, err);
    free(json);
    if (rc == 0 && stats) {
        stats->files = s->n;
        for (size_t i = 0; i < s->n; i++) {
            stats->logical += s->files[i].size;
            stats->populated += s->files[i].populated;
            stats->object_bytes += s->files[i].object_size;
            stats->copied_bytes += s->files[i].copied;
        }
    }
    return rc;
}

static void set_push_fini(struct set_push *s)
{
    free(s->mkey);
    free(s->mark_key);
    free(s->order);
    for (size_t i = 0; i < s->nr; i++)
        free(s->replaces[i]);
    free(s->replaces);
    free(s->old_raw);
    free(s->in_old);
    free(s->old_files);
    xfer_prior_marks_fini(&s->prior);
    free(s->def); /* every upload in it was completed or aborted */
    struct manifest m = {.files = s->files, .n = s->n};
    manifest_fini(&m);
}

/* The set-push transaction, phase by phase; each phase undoes what the push did when it fails. */
int xfer_push_set(struct xfer *x, struct vmsnap_store_conn *ctl, const char *dir,
                  const char *prefix, const char *url, struct vmsnap_xfer_stats *stats,
                  struct vmsnap_err *err)
{
    struct set_push s = {.x = x, .ctl = ctl, .dir = dir, .prefix = prefix, .url = url};
    int rc = set_begin(&s, err);
    if (rc == 0)
        rc = set_mark(&s, err);
    if (rc == 0)
        rc = uncommit_early(&s, err);
    if (rc == 0)
        rc = sweep_leftovers(&s, err);
    if (rc == 0)
        rc = upload_files(&s, err);
    if (rc == 0)
        rc = commit_set(&s, stats, err);
    set_push_fini(&s);
    return rc;
}
