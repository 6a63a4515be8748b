/* SPDX-License-Identifier: Apache-2.0 */
/*
 * gc of layered sets' objects by reachability: every object any manifest names (every layer of
 * every chain, every page table) is live; an object of a layered push (a key under a
 * "vmsnap-objects/<pushId>/" directory) or an old-layout "<name>.zstd" directly in a set that
 * is now layered, that no manifest names and that is older than the grace period, is swept.
 *
 * Where the manifests are read from (the mark root): the whole bucket on S3 (a set may name
 * layers of a parent anywhere in its bucket), the gc's own URL on a local store (the directory
 * that holds every set sharing layers: docs/transfer.md). Objects are swept only under the gc's
 * URL. A manifest the store does not hand over stops the sweep (it may name anything); one
 * that is damaged (does not parse) is warned about: its set cannot be pulled anyway. Before
 * deleting, the manifests are listed again and any new or rewritten one is read too: a push that
 * committed meanwhile keeps what it names (what remains is one request's window between that
 * listing and the DELETEs, as for every other sweep of gc).
 */
#include "xfer_int.h"

#include <errno.h>
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>
#include <json-c/json.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct obj {
    char *key;
    uint64_t size;
    int64_t mtime;
};

struct reach {
    struct xfer *x;
    struct vmsnap_store_conn *c;
    const char *under; /* sweep only here */
    struct obj *mans;  /* manifests under the mark root (key, mtime) */
    size_t nm, cm;
    struct obj *objs; /* candidate objects under `under` */
    size_t no, co;
    char **live; /* keys some manifest names, sorted */
    size_t nl, cl;
    char **layered; /* prefixes ("P/") whose manifest is layered, sorted */
    size_t nlp, clp;
    bool collect_objs;
    int64_t newest; /* the newest mtime listed (the store's clock), 0 before any */
};

static int add_obj(struct obj **v, size_t *n, size_t *cap, const char *key, uint64_t size,
                   int64_t mtime)
{
    if (*n >= 4000000)
        return -E2BIG;
    if (grow_array(v, cap, *n + 1, sizeof(**v), 64) < 0)
        return -ENOMEM;
    if (!((*v)[*n].key = strdup(key)))
        return -ENOMEM;
    (*v)[*n].size = size;
    (*v)[*n].mtime = mtime;
    (*n)++;
    return 0;
}

static int add_str(char ***v, size_t *n, size_t *cap, const char *s)
{
    if (grow_array(v, cap, *n + 1, sizeof(**v), 64) < 0 || !((*v)[*n] = strdup(s)))
        return -ENOMEM;
    (*n)++;
    return 0;
}

/* The key as the local store's file system knows it (symlinked parents resolved: a set pushed
 * through /store/link and collected through /store/real names one object two ways), so that
 * named and listed keys compare; S3 keys as they are. In `out` (PATH_MAX). */
static const char *canon(const struct reach *r, const char *key, char *out)
{
    char p[PATH_MAX + 2];
    if (vmsnap_store_kind(r->x->st) != VMSNAP_STORE_LOCAL ||
        snprintf(p, sizeof(p), "/%s", key) >= (int)sizeof(p) || sys_canon_path(p, out) < 0)
        return key;
    return out[0] == '/' ? out + 1 : out;
}

static bool is_manifest(const char *key)
{
    return !strcmp(xfer_key_base(key), VMSNAP_XFER_MANIFEST);
}

static int see(void *arg, const char *key, uint64_t size, int64_t mtime)
{
    struct reach *r = arg;
    if (mtime > r->newest)
        r->newest = mtime;
    if (is_manifest(key))
        return add_obj(&r->mans, &r->nm, &r->cm, key, size, mtime);
    size_t kl = strlen(key), zl = strlen(OBJECT_SUFFIX);
    bool zstd = kl > zl && !strcmp(key + kl - zl, OBJECT_SUFFIX);
    if (r->collect_objs && xfer_key_under(r->under, key) && (layer_key_ok(key) || zstd))
        return add_obj(&r->objs, &r->no, &r->co, key, size, mtime);
    return 0;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* (qsort wants a non-NULL array even for no element: an empty list is NULL here) */
static void sort_strs(char **v, size_t n)
{
    if (n)
        qsort(v, n, sizeof(*v), cmp_str);
}

static bool in_sorted(char **v, size_t n, const char *s)
{
    return n && bsearch(&s, v, n, sizeof(*v), cmp_str) != NULL;
}

/* Could the manifest at `mkey`, which vmsnap cannot use, name layers: not JSON (a layered
 * manifest cut short or damaged), or JSON whose "formatVersion" is 3 or more (a newer writer's,
 * or one this version refuses)? False only for the reference layout's (it names only
 * <set>/<name>.zstd, never candidates where it is). Read again, raw. True when it cannot be
 * read. */
static bool may_name_layers(struct reach *r, const char *mkey)
{
    char *buf = NULL;
    size_t len = 0;
    bool too_large = false, two = false;
    if (xfer_read_small(r->c, mkey, mkey, "manifest", &buf, &len, &too_large, &two, NULL) < 0)
        return true;
    json_tokener *tok = json_tokener_new();
    json_object *root = tok ? json_tokener_parse_ex(tok, buf, (int)len) : NULL, *fv;
    bool may =
        !tok || !root ||
        (root && (!json_object_is_type(root, json_type_object) ||
                  !json_object_object_get_ex(root, "formatVersion", &fv) ||
                  !json_object_is_type(fv, json_type_int) || json_object_get_int64(fv) >= 3));
    /* a JSON object without formatVersion, or one below 3: the reference layout */
    if (root && json_object_is_type(root, json_type_object) &&
        !json_object_object_get_ex(root, "formatVersion", &fv))
        may = json_object_object_get_ex(root, "files", &fv) &&
              json_object_is_type(fv, json_type_object) &&
              !json_object_object_get_ex(root, "snapshotFiles", &fv);
    json_object_put(root);
    if (tok)
        json_tokener_free(tok);
    free(buf);
    return may;
}

/* Mark what one manifest names. */
static int mark_manifest(struct reach *r, const char *mkey, struct vmsnap_err *err)
{
    char murl[URL_BUF];
    vmsnap_store_url(r->x->st, mkey, murl, sizeof(murl));
    struct manifest m = {0};
    int rc = xfer_read_manifest(r->c, mkey, murl, UINT64_MAX, &m, err);
    if (rc == -ENOENT) /* removed since the listing: it names nothing any more */
        return 0;
    if ((rc == -EBADMSG || rc == -EINVAL) && !may_name_layers(r, mkey)) {
        /* a reference-layout manifest vmsnap refuses (hostile names): its set cannot be
         * pulled, and it names no layer */
        vlog(VMSNAP_LOG_WARN, "%s (it names no layer: the sweep goes on)", err ? err->msg : murl);
        vmsnap_err_clear(err);
        return 0;
    }
    if (rc < 0) {
        vmsnap_err_wrap(err,
                        "the manifest %s cannot be read, so what it names cannot be told "
                        "(nothing swept; 'vmsnap rm --force' removes a corrupt one): ",
                        murl);
        return rc;
    }
    size_t dl = xfer_dir_len(mkey);
    char *dir = strndup(mkey, dl);
    if (!dir)
        rc = -ENOMEM;
    for (size_t i = 0; rc == 0 && i < m.n; i++) {
        const struct mf_file *f = &m.files[i];
        char cb[PATH_MAX];
        for (size_t j = 0; rc == 0 && j < f->nlayers; j++) {
            rc = add_str(&r->live, &r->nl, &r->cl, canon(r, f->layers[j].key, cb));
            if (rc == 0 && f->layers[j].pages_key)
                rc = add_str(&r->live, &r->nl, &r->cl, canon(r, f->layers[j].pages_key, cb));
        }
        if (rc == 0 && f->pages.key)
            rc = add_str(&r->live, &r->nl, &r->cl, canon(r, f->pages.key, cb));
        if (rc == 0 && m.format_version != 3) { /* the fixed names of the old layout */
            char *k = xfer_object_key(dir, f->name);
            rc = k ? add_str(&r->live, &r->nl, &r->cl, canon(r, k, cb)) : -ENOMEM;
            free(k);
        }
    }
    if (rc == 0 && m.format_version == 3) {
        char cb[PATH_MAX];
        char *lp = xfer_join_key(canon(r, dir, cb), "");
        rc = lp ? add_str(&r->layered, &r->nlp, &r->clp, lp) : -ENOMEM;
        free(lp);
    }
    free(dir);
    manifest_fini(&m);
    return rc == -ENOMEM ? vmsnap_err_set(err, ENOMEM, "out of memory") : rc;
}

/* Is this candidate dead: no manifest names it, and it is a layered push's object or an old
 * object directly in a set that is layered now (anything else may be an old-layout push in
 * flight, or a single object pushed there). */
static bool dead(const struct reach *r, const char *lkey)
{
    char cb[PATH_MAX];
    const char *key = canon(r, lkey, cb);
    if (in_sorted(r->live, r->nl, key))
        return false;
    if (layer_key_ok(key))
        return true;
    size_t dl = xfer_dir_len(key);
    char lp[URL_BUF];
    if (dl + 2 > sizeof(lp))
        return false;
    memcpy(lp, key, dl);
    lp[dl] = dl ? '/' : '\0';
    lp[dl + (dl ? 1 : 0)] = '\0';
    return in_sorted(r->layered, r->nlp, lp);
}

static void reach_free(struct reach *r)
{
    for (size_t i = 0; i < r->nm; i++)
        free(r->mans[i].key);
    for (size_t i = 0; i < r->no; i++)
        free(r->objs[i].key);
    for (size_t i = 0; i < r->nl; i++)
        free(r->live[i]);
    for (size_t i = 0; i < r->nlp; i++)
        free(r->layered[i]);
    free(r->mans);
    free(r->objs);
    free(r->live);
    free(r->layered);
}

/* The manifests again: any that is new or was rewritten since the first listing is read too.
 * A listing's mtime has a resolution of one second, so a manifest rewritten within the second
 * of its first listing, with the same size, lists the same: every manifest whose mtime is within
 * two seconds of the newest one the first listing saw (the store's own clock: no skew) is read
 * again whatever it lists, the older ones only when they changed. */
static int remark(struct reach *r, const char *root, struct vmsnap_err *err)
{
    struct reach again = {.x = r->x, .c = r->c};
    int rc = vmsnap_store_list(r->c, root, see, &again, err);
    for (size_t i = 0; rc == 0 && i < again.nm; i++) {
        bool seen = false;
        for (size_t j = 0; j < r->nm && !seen; j++)
            seen = !strcmp(r->mans[j].key, again.mans[i].key) &&
                   r->mans[j].mtime == again.mans[i].mtime && r->mans[j].mtime >= 0 &&
                   r->mans[j].mtime < r->newest - 2 && r->mans[j].size == again.mans[i].size;
        if (!seen)
            rc = mark_manifest(r, again.mans[i].key, err);
    }
    reach_free(&again);
    if (rc == 0) {
        sort_strs(r->live, r->nl);
        sort_strs(r->layered, r->nlp);
    }
    return rc;
}

/* A push's emptied directories (local store): its "<pushId>/", then "vmsnap-objects/" when
 * that is empty too. */
static void tidy_up(struct vmsnap_store_conn *c, const char *key)
{
    char *dir = strdup(key);
    for (int up = 0; dir && up < 2; up++) {
        size_t dl = xfer_dir_len(dir);
        if (!dl)
            break;
        dir[dl + 1] = '\0';
        vmsnap_store_tidy(c, dir);
        dir[dl] = '\0';
    }
    free(dir);
}

/* Local store: the temporaries (".<name>.XXXXXX") a killed push's PUT left in its
 * vmsnap-objects/<pushId>/ directory, never listed as objects, older than the grace period. */
static struct leftover_ctx *tmp_l;
static int tmp_visit(const char *path, const struct stat *sb, int type, struct FTW *ftw)
{
    const char *base = path + ftw->base;
    if (type != FTW_F || base[0] != '.' || !S_ISREG(sb->st_mode) || sb->st_uid != geteuid())
        return 0;
    /* .../vmsnap-objects/<hex>/.<name> */
    char dir[PATH_MAX];
    size_t dl = (size_t)ftw->base;
    if (dl < 2 || dl >= sizeof(dir))
        return 0;
    memcpy(dir, path, dl - 1);
    dir[dl - 1] = '\0';
    char *id = strrchr(dir, '/');
    if (!id || strspn(id + 1, "0123456789abcdef") != strlen(id + 1) || !id[1])
        return 0;
    *id = '\0';
    const char *ld = strrchr(dir, '/');
    if (!ld || strcmp(ld + 1, LAYER_DIR))
        return 0;
    int64_t age = xfer_age_of(tmp_l, (int64_t)sb->st_mtime);
    bool act = xfer_old_enough(tmp_l->gc, age);
    xfer_gc_report(tmp_l, VMSNAP_GC_OBJECT, path + 1, (uint64_t)sb->st_size, age, act);
    if (act && (tmp_l->gc->dry_run || unlink(path) == 0)) {
        tmp_l->unreachable++;
        tmp_l->unreachable_bytes += (uint64_t)sb->st_size;
    }
    return 0;
}

static void sweep_local_tmp(const struct xfer *x, const char *under, struct leftover_ctx *l)
{
    char p[PATH_MAX + 2];
    if (vmsnap_store_kind(x->st) != VMSNAP_STORE_LOCAL ||
        snprintf(p, sizeof(p), "/%s", under) >= (int)sizeof(p))
        return;
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&mu); /* nftw passes no argument: one sweep at a time per process */
    tmp_l = l;
    (void)nftw(p, tmp_visit, 16, FTW_PHYS);
    tmp_l = NULL;
    pthread_mutex_unlock(&mu);
}

int xfer_gc_layers(struct xfer *x, struct vmsnap_store_conn *c, const char *key,
                   struct leftover_ctx *l, struct vmsnap_err *err)
{
    /* the mark root: the bucket (S3), the gc's URL (local) */
    char *under = *key ? xfer_join_key(key, "") : strdup("");
    const char *root = vmsnap_store_kind(x->st) == VMSNAP_STORE_S3 ? "" : under;
    struct reach r = {.x = x, .c = c, .under = under, .collect_objs = true};
    if (!under)
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    int rc = vmsnap_store_list(c, root, see, &r, err);
    if (rc < 0 && (!err || !err->code))
        rc = err_code(err, -rc, "list %s", *root ? root : "the bucket");
    if (rc == 0 && vmsnap_store_conn_list_skipped(c)) {
        char u[URL_BUF];
        rc = vmsnap_err_set(err, EACCES,
                            "some directories under %s could not be read (skipped: see the "
                            "warnings above): a manifest there may name any layer, so no layer "
                            "object is removed",
                            *root ? vmsnap_store_url(x->st, key, u, sizeof(u)) : "the bucket");
    }
    for (size_t i = 0; rc == 0 && i < r.nm; i++)
        rc = mark_manifest(&r, r.mans[i].key, err);
    if (rc == 0) {
        sort_strs(r.live, r.nl);
        sort_strs(r.layered, r.nlp);
    }
    bool any = false;
    for (size_t i = 0; rc == 0 && i < r.no && !any; i++)
        any = dead(&r, r.objs[i].key);
    if (rc == 0 && any && !l->gc->dry_run) {
        sys_failpoint("gc-marked");
        rc = remark(&r, root, err);
    }
    for (size_t i = 0; rc == 0 && i < r.no; i++) {
        const struct obj *o = &r.objs[i];
        if (!dead(&r, o->key))
            continue;
        int64_t age = xfer_age_of(l, o->mtime);
        bool act = xfer_old_enough(l->gc, age);
        xfer_gc_report(l, VMSNAP_GC_OBJECT, o->key, o->size, age, act);
        if (!act) {
            l->kept++;
            l->unknown += age < 0;
            continue;
        }
        struct vmsnap_err de = {0};
        if (!l->gc->dry_run && vmsnap_store_delete(c, o->key, &de) < 0) {
            xfer_gc_failed(l, o->key, &de);
            continue;
        }
        l->unreachable++;
        l->unreachable_bytes += o->size;
        if (!l->gc->dry_run)
            tidy_up(c, o->key);
    }
    if (rc == 0)
        sweep_local_tmp(x, under, l);
    reach_free(&r);
    free(under);
    return rc;
}
