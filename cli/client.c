/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The CLI's client mode (--socket PATH, VMSNAP_SOCKET): the verbs the daemon covers send their
 * request to vmsnapd (docs/daemon.md) instead of calling the library. Each cli_client_* has the
 * signature of the library call it stands for and fills the same result structures from the
 * operation's result (the daemon's result keys are the CLI's --json keys), so the verb prints
 * exactly what it prints after a direct call: text, --json and exit codes alike. A failure is the
 * daemon's error object turned back into the library's (errno from its name, the message as it
 * is). Ctrl-C while an operation runs cancels it through DELETE /v1/operations/{id}, and the run
 * waits for its clean-up, as a direct run does.
 *
 * HTTP over the unix socket is libcurl's (CURLOPT_UNIX_SOCKET_PATH), loaded with dlopen on the
 * first request, as the library loads it: a CLI that never talks to a daemon does not map it.
 * Paths and local store URLs are made absolute here (the daemon takes only absolute ones, under
 * its roots); the store's keys are the node's profiles: --profile names one.
 */
#include "cli.h"

#include "vmsnap/disk.h"
#include "vmsnap/objcache.h"
#include "vmsnap/pcache.h"
#include "vmsnap/vm.h"
#include "vmsnap/xfer.h"

#include <curl/curl.h>
#include <dlfcn.h>
#include <errno.h>
#include <json-c/json.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const char *cli_socket;

static struct {
    void *h;
    CURL *(*init)(void);
    CURLcode (*setopt)(CURL *, CURLoption, ...);
    CURLcode (*perform)(CURL *);
    CURLcode (*getinfo)(CURL *, CURLINFO, ...);
    void (*cleanup)(CURL *);
    struct curl_slist *(*slist_append)(struct curl_slist *, const char *);
    void (*slist_free_all)(struct curl_slist *);
    const char *(*strerror)(CURLcode);
    char *(*escape)(CURL *, const char *, int);
    void (*free)(void *);
} cu;

static int load_curl(struct vmsnap_err *err)
{
    if (cu.h)
        return 0;
    void *h = dlopen("libcurl.so.4", RTLD_NOW | RTLD_LOCAL);
    if (!h)
        return vmsnap_err_set(err, ENOSYS, "--socket: cannot load libcurl.so.4: %s", dlerror());
#define SYM(f, n) (*(void **)&cu.f = dlsym(h, n))
    if (!SYM(init, "curl_easy_init") || !SYM(setopt, "curl_easy_setopt") ||
        !SYM(perform, "curl_easy_perform") || !SYM(getinfo, "curl_easy_getinfo") ||
        !SYM(cleanup, "curl_easy_cleanup") || !SYM(slist_append, "curl_slist_append") ||
        !SYM(slist_free_all, "curl_slist_free_all") || !SYM(strerror, "curl_easy_strerror") ||
        !SYM(escape, "curl_easy_escape") || !SYM(free, "curl_free")) {
        dlclose(h);
        return vmsnap_err_set(err, ENOSYS, "--socket: libcurl.so.4 lacks a function");
    }
#undef SYM
    cu.h = h;
    return 0;
}

/* An answer's body, at most 16 MiB (a VM or set listing) */
struct buf {
    char *p;
    size_t n;
};

static size_t on_body(char *d, size_t sz, size_t nm, void *arg)
{
    struct buf *b = arg;
    size_t n = sz * nm;
    if (b->n + n > (16u << 20))
        return 0;
    char *p = realloc(b->p, b->n + n + 1);
    if (!p)
        return 0;
    memcpy(p + b->n, d, n);
    b->p = p;
    b->n += n;
    p[b->n] = 0;
    return n;
}

static int errno_of(const char *name)
{
    for (int e = 1; name && e < 256; e++) {
        const char *n = strerrorname_np(e);
        if (n && !strcmp(n, name))
            return e;
    }
    return 0;
}

/* The daemon's error object (`body`'s "error", or an operation's) as the library's: -errno with
 * its message. A refusal of the daemon's own with no errno (class usage) is EINVAL. */
static int from_error(json_object *e, struct vmsnap_err *err)
{
    json_object *m = NULL, *en = NULL, *cl = NULL;
    json_object_object_get_ex(e, "message", &m);
    json_object_object_get_ex(e, "errno", &en);
    json_object_object_get_ex(e, "class", &cl);
    int code = errno_of(json_object_get_string(en));
    if (!code)
        code = cl && !strcmp(json_object_get_string(cl), "interrupted") ? ECANCELED : EINVAL;
    return vmsnap_err_set(err, code, "%s", m ? json_object_get_string(m) : "the daemon failed");
}

/* METHOD PATH (query included) with the JSON `body` (NULL: none): the HTTP status and the
 * answer's JSON in *out (the caller's), or -errno when the daemon could not be asked. */
static int request(const char *method, const char *path, json_object *body, long *status,
                   json_object **out, struct vmsnap_err *err)
{
    *out = NULL;
    int rc = load_curl(err);
    if (rc < 0)
        return rc;
    CURL *c = cu.init();
    if (!c)
        return vmsnap_err_set(err, ENOMEM, "--socket: curl_easy_init failed");
    char url[8192];
    snprintf(url, sizeof(url), "http://localhost%s", path);
    struct buf b = {0};
    struct curl_slist *h = cu.slist_append(NULL, "Content-Type: application/json");
    const char *data = body ? json_object_to_json_string_ext(body, JSON_C_TO_STRING_PLAIN) : NULL;
    cu.setopt(c, CURLOPT_UNIX_SOCKET_PATH, cli_socket);
    cu.setopt(c, CURLOPT_URL, url);
    cu.setopt(c, CURLOPT_CUSTOMREQUEST, method);
    cu.setopt(c, CURLOPT_HTTPHEADER, h);
    cu.setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    cu.setopt(c, CURLOPT_WRITEDATA, &b);
    cu.setopt(c, CURLOPT_NOSIGNAL, 1L);
    cu.setopt(c, CURLOPT_CONNECTTIMEOUT, 30L);
    cu.setopt(c, CURLOPT_TIMEOUT, 660L); /* a ?wait= is at most 600 s */
    if (data) {
        cu.setopt(c, CURLOPT_POSTFIELDS, data);
        cu.setopt(c, CURLOPT_POSTFIELDSIZE, (long)strlen(data));
    }
    CURLcode cc = cu.perform(c);
    if (cc != CURLE_OK) {
        rc = vmsnap_err_set(err, cc == CURLE_COULDNT_CONNECT ? ECONNREFUSED : EIO,
                            "daemon at %s: %s", cli_socket, cu.strerror(cc));
    } else {
        cu.getinfo(c, CURLINFO_RESPONSE_CODE, status);
        *out = b.p ? json_tokener_parse(b.p) : NULL;
        if (!*out)
            rc = vmsnap_err_set(err, EPROTO, "daemon at %s: %s %s: answer %ld is not JSON",
                                cli_socket, method, path, *status);
    }
    cu.slist_free_all(h);
    cu.cleanup(c);
    free(b.p);
    return rc;
}

static const char *jstr(json_object *o, const char *k)
{
    json_object *v;
    return o && json_object_object_get_ex(o, k, &v) && json_object_is_type(v, json_type_string)
               ? json_object_get_string(v)
               : NULL;
}

static uint64_t ju64(json_object *o, const char *k)
{
    json_object *v;
    return o && json_object_object_get_ex(o, k, &v) ? (uint64_t)json_object_get_int64(v) : 0;
}

/* An answer that is not `want`: its error, as the library's */
static int refused(long status, json_object *a, struct vmsnap_err *err)
{
    json_object *e;
    if (a && json_object_object_get_ex(a, "error", &e))
        return from_error(e, err);
    return vmsnap_err_set(err, EPROTO, "daemon at %s: unexpected answer %ld", cli_socket, status);
}

/* Submit an operation (POST path body, which is consumed) and wait for its end: its result in
 * *result (the caller's), or -errno with its error. Ctrl-C (vmsnap_cancelled) cancels it and
 * waits for it to end. */
static int run_op(const char *path, json_object *body, json_object **result, struct vmsnap_err *err)
{
    *result = NULL;
    long st = 0;
    json_object *a = NULL, *op;
    int rc = request("POST", path, body, &st, &a, err);
    json_object_put(body);
    if (rc < 0)
        return rc;
    if (st != 202 || !json_object_object_get_ex(a, "operation", &op) || !jstr(op, "id")) {
        rc = refused(st, a, err);
        json_object_put(a);
        return rc;
    }
    char id[64], q[128];
    snprintf(id, sizeof(id), "%s", jstr(op, "id"));
    bool cancel_sent = false;
    for (;;) {
        const char *state = jstr(op, "state");
        if (state && strcmp(state, "queued") && strcmp(state, "running"))
            break;
        if (vmsnap_cancelled() && !cancel_sent) {
            snprintf(q, sizeof(q), "/v1/operations/%s", id);
            json_object *x = NULL;
            request("DELETE", q, NULL, &st, &x, err);
            json_object_put(x);
            cancel_sent = true;
        }
        /* short waits while a Ctrl-C may come, so that it is passed on at once */
        snprintf(q, sizeof(q), "/v1/operations/%s?wait=%s", id, cancel_sent ? "60" : "0.5");
        json_object_put(a);
        if ((rc = request("GET", q, NULL, &st, &a, err)) < 0)
            return rc;
        if (st != 200 || !json_object_object_get_ex(a, "operation", &op)) {
            rc = refused(st, a, err);
            json_object_put(a);
            return rc;
        }
    }
    json_object *e, *r;
    if (!strcmp(jstr(op, "state"), "done")) {
        if (json_object_object_get_ex(op, "result", &r))
            *result = json_object_get(r);
        rc = 0;
    } else if (json_object_object_get_ex(op, "error", &e)) {
        rc = from_error(e, err);
    } else {
        rc = vmsnap_err_set(err, EIO, "operation %s: %s", id, jstr(op, "state"));
    }
    json_object_put(a);
    return rc;
}

/* A path the daemon can take: absolute, without "." or ".." (the existing part resolved; a
 * path that does not exist yet is its parent's resolved path and its name). */
static const char *abs_path(const char *p, char *out, size_t cap)
{
    char *r = realpath(p, NULL);
    if (!r) {
        char parent[PATH_MAX];
        snprintf(parent, sizeof(parent), "%s", p);
        size_t n = strlen(parent);
        while (n > 1 && parent[n - 1] == '/')
            parent[--n] = 0;
        char *slash = strrchr(parent, '/');
        const char *name = slash ? slash + 1 : parent;
        if (slash == parent)
            r = strdup("/");
        else if (slash) {
            *slash = 0;
            r = realpath(parent, NULL);
        } else {
            r = realpath(".", NULL);
        }
        if (r && *name && strcmp(name, ".") && strcmp(name, "..")) {
            snprintf(out, cap, "%s%s%s", r, strcmp(r, "/") ? "/" : "", name);
            free(r);
            return out;
        }
        free(r);
        snprintf(out, cap, "%s", p); /* the daemon says why not */
        return out;
    }
    snprintf(out, cap, "%s", r);
    free(r);
    return out;
}

static bool is_remote(const char *url)
{
    return strstr(url, "://") && strncmp(url, "file://", 7);
}

static json_object *url_value(const char *url)
{
    char b[PATH_MAX];
    return json_object_new_string(
        is_remote(url) || !strncmp(url, "file://", 7) ? url : abs_path(url, b, sizeof(b)));
}

static json_object *path_value(const char *p)
{
    char b[PATH_MAX];
    return json_object_new_string(abs_path(p, b, sizeof(b)));
}

static void add_profile(json_object *o, const struct vmsnap_xfer_opts *x)
{
    if (x && x->store.profile)
        json_object_object_add(o, "profile", json_object_new_string(x->store.profile));
}

static void stats_from(json_object *r, struct vmsnap_xfer_stats *st)
{
    *st = (struct vmsnap_xfer_stats){
        .files = ju64(r, "files"),
        .logical = ju64(r, "logical_bytes"),
        .populated = ju64(r, "populated_bytes"),
        .object_bytes = ju64(r, "object_bytes"),
        .copied_bytes = ju64(r, "copied_bytes"),
        .deltas = ju64(r, "deltas"),
        .cached_bytes = ju64(r, "cached_bytes"),
    };
}

int cli_client_push(const char *from, const char *to, const struct vmsnap_xfer_opts *o,
                    struct vmsnap_xfer_stats *st, struct vmsnap_err *err)
{
    json_object *b = json_object_new_object(), *r;
    json_object_object_add(b, "path", path_value(from));
    json_object_object_add(b, "url", url_value(to));
    add_profile(b, o);
    if (o->parent)
        json_object_object_add(b, "parent", url_value(o->parent));
    if (o->base)
        json_object_object_add(b, "base", url_value(o->base));
    if (o->layout != VMSNAP_LAYOUT_AUTO)
        json_object_object_add(
            b, "layout",
            json_object_new_string(o->layout == VMSNAP_LAYOUT_REFERENCE ? "reference" : "layered"));
    if (o->level)
        json_object_object_add(b, "level", json_object_new_int(o->level));
    int rc = run_op("/v1/sets/push", b, &r, err);
    if (rc == 0)
        stats_from(r, st);
    json_object_put(r);
    return rc;
}

int cli_client_pull(const char *from, const char *to, const struct vmsnap_xfer_opts *o,
                    struct vmsnap_xfer_stats *st, struct vmsnap_err *err)
{
    json_object *b = json_object_new_object(), *r;
    json_object_object_add(b, "url", url_value(from));
    json_object_object_add(b, "path", path_value(to));
    add_profile(b, o);
    if (o->no_cache)
        json_object_object_add(b, "no_cache", json_object_new_boolean(1));
    json_object_object_add(b, "object", json_object_new_boolean(1)); /* as the CLI's pull */
    int rc = run_op("/v1/sets/pull", b, &r, err);
    if (rc == 0)
        stats_from(r, st);
    json_object_put(r);
    return rc;
}

/* "?k=v&k=v" with the values escaped */
static void query_add(char *q, size_t cap, const char *k, const char *v)
{
    if (!v || load_curl(NULL) < 0)
        return;
    char *e = cu.escape(NULL, v, 0);
    size_t n = strlen(q);
    snprintf(q + n, cap - n, "%s%s=%s", n ? "&" : "?", k, e ? e : "");
    cu.free(e);
}

int cli_client_list(const char *url, const struct vmsnap_xfer_opts *o, vmsnap_xfer_list_fn fn,
                    void *arg, struct vmsnap_err *err)
{
    char q[8192] = "", path[8300], b[PATH_MAX];
    query_add(q, sizeof(q), "url",
              is_remote(url) || !strncmp(url, "file://", 7) ? url : abs_path(url, b, sizeof(b)));
    query_add(q, sizeof(q), "profile", o->store.profile);
    snprintf(path, sizeof(path), "/v1/sets%s", q);
    long st = 0;
    json_object *a = NULL, *sets;
    int rc = request("GET", path, NULL, &st, &a, err);
    if (rc == 0 && (st != 200 || !json_object_object_get_ex(a, "sets", &sets)))
        rc = refused(st, a, err);
    for (size_t i = 0; rc == 0 && i < json_object_array_length(sets); i++) {
        json_object *s = json_object_array_get_idx(sets, i), *v;
        struct vmsnap_xfer_set set = {
            .url = jstr(s, "url"),
            .files = ju64(s, "files"),
            .logical = ju64(s, "logical_bytes"),
            .object_bytes = ju64(s, "object_bytes"),
            .valid = json_object_object_get_ex(s, "valid", &v) && json_object_get_boolean(v),
        };
        rc = fn(arg, &set);
    }
    json_object_put(a);
    return rc;
}

int cli_client_remove(const char *url, bool force, const struct vmsnap_xfer_opts *o,
                      struct vmsnap_rm_result *res, struct vmsnap_err *err)
{
    json_object *b = json_object_new_object(), *r;
    json_object_object_add(b, "url", url_value(url));
    if (force)
        json_object_object_add(b, "force", json_object_new_boolean(1));
    add_profile(b, o);
    int rc = run_op("/v1/sets/remove", b, &r, err);
    if (rc == 0) {
        const char *what = jstr(r, "removed");
        *res = (struct vmsnap_rm_result){
            .set = what && !strcmp(what, "set"),
            .object = what && !strcmp(what, "object"),
            .empty_dir = what && !strcmp(what, "empty_dir"),
            .objects = (unsigned)ju64(r, "objects"),
            .uploads = (unsigned)ju64(r, "uploads"),
            .pushes = (unsigned)ju64(r, "pushes"),
            .kept = (unsigned)ju64(r, "kept"),
        };
        snprintf(res->kept_key, sizeof(res->kept_key), "%s",
                 jstr(r, "kept_url") ? jstr(r, "kept_url") : "");
    }
    json_object_put(r);
    return rc;
}

int cli_client_export(const char *from, const char *to, const struct vmsnap_xfer_opts *o,
                      struct vmsnap_xfer_stats *st, struct vmsnap_err *err)
{
    json_object *b = json_object_new_object(), *r;
    json_object_object_add(b, "source_url", url_value(from));
    json_object_object_add(b, "url", url_value(to));
    add_profile(b, o);
    if (o->level)
        json_object_object_add(b, "level", json_object_new_int(o->level));
    int rc = run_op("/v1/sets/export", b, &r, err);
    if (rc == 0)
        stats_from(r, st);
    json_object_put(r);
    return rc;
}

/* An item of the daemon's gc result passed to the caller's report, as the library reports it */
static void gc_report(const struct vmsnap_gc_opts *g, json_object *it)
{
    const char *kind = jstr(it, "kind"), *action = jstr(it, "action"), *url = jstr(it, "url");
    json_object *age;
    if (!kind || !action || !url)
        return;
    enum vmsnap_gc_kind k = !strcmp(kind, "upload")      ? VMSNAP_GC_UPLOAD
                            : !strcmp(kind, "push_mark") ? VMSNAP_GC_PUSH
                                                         : VMSNAP_GC_OBJECT;
    int64_t a =
        json_object_object_get_ex(it, "age_seconds", &age) && age ? json_object_get_int64(age) : -1;
    g->report(g->report_arg, k, url, ju64(it, "object_bytes"), a, strcmp(action, "keep") != 0);
}

int cli_client_gc(const char *url, const struct vmsnap_gc_opts *g, const struct vmsnap_xfer_opts *o,
                  struct vmsnap_gc_result *res, struct vmsnap_err *err)
{
    json_object *b = json_object_new_object(), *r, *items;
    json_object_object_add(b, "url", url_value(url));
    json_object_object_add(b, "older_than_seconds", json_object_new_int64(g->older_than));
    if (g->dry_run)
        json_object_object_add(b, "dry_run", json_object_new_boolean(1));
    add_profile(b, o);
    int rc = run_op("/v1/sets/gc", b, &r, err);
    if (rc < 0)
        return rc;
    if (g->report && json_object_object_get_ex(r, "items", &items))
        for (size_t i = 0; i < json_object_array_length(items); i++)
            gc_report(g, json_object_array_get_idx(items, i));
    if (ju64(r, "items_left_out"))
        fprintf(stderr, "vmsnap gc: the daemon listed the first items only (%llu left out)\n",
                (unsigned long long)ju64(r, "items_left_out"));
    unsigned unreachable = (unsigned)ju64(r, "unreachable_objects");
    *res = (struct vmsnap_gc_result){
        .aborted = (unsigned)ju64(r, "aborted_uploads"),
        .pushes = (unsigned)ju64(r, "cleaned_pushes"),
        .objects = (unsigned)ju64(r, "objects") - unreachable,
        .kept = (unsigned)ju64(r, "kept"),
        .unknown_age = (unsigned)ju64(r, "unknown_age"),
        .unreachable = unreachable,
        .unreachable_bytes = ju64(r, "unreachable_bytes"),
    };
    json_object_put(r);
    return 0;
}

/* ---- VMs ---- */

static void timing_from(json_object *r, struct vmsnap_vm_timing *t)
{
    *t = (struct vmsnap_vm_timing){0};
    json_object *steps;
    if (r && json_object_object_get_ex(r, "steps", &steps)) {
        /* the library's step names are static strings: the JSON's live as long as `r`, so
         * they are interned in a small table that lasts the run */
        static char names[VMSNAP_VM_MAX_STEPS * 4][32];
        static unsigned n_names;
        json_object_object_foreach(steps, k, v)
        {
            if (t->n >= VMSNAP_VM_MAX_STEPS)
                break;
            const char *name = NULL;
            for (unsigned i = 0; i < n_names && !name; i++)
                if (!strcmp(names[i], k))
                    name = names[i];
            if (!name && n_names < sizeof(names) / sizeof(names[0])) {
                snprintf(names[n_names], sizeof(names[0]), "%s", k);
                name = names[n_names++];
            }
            t->step[t->n].name = name ? name : "step";
            t->step[t->n].seconds = json_object_get_double(v);
            t->n++;
        }
    }
    json_object *s;
    if (r && json_object_object_get_ex(r, "seconds", &s))
        t->total = json_object_get_double(s);
    t->object_bytes = ju64(r, "object_bytes");
    t->copied_bytes = ju64(r, "copied_bytes");
    t->deltas = ju64(r, "deltas");
    t->cached_bytes = ju64(r, "cached_bytes");
}

/* Options of the VM verbs the daemon does not take (its configuration sets them) */
static int vm_refused(const struct vmsnap_vm_opts *o, struct vmsnap_err *err)
{
    const char *what = o->state_dir             ? "--state-dir"
                       : o->ram_dir             ? "--ram-dir"
                       : o->accel               ? "--accel"
                       : o->qemu                ? "--qemu"
                       : o->asset_dirs          ? "--asset-dir"
                       : o->no_evict            ? "--no-evict"
                       : o->no_base             ? "--no-base"
                       : o->ram_overcommit      ? "--ram-overcommit"
                       : o->kernel || o->initrd ? "--kernel/--initrd on resume"
                       : o->xfer && (o->xfer->base || o->xfer->connections || o->xfer->threads)
                           ? "--base, -j, -T"
                       : o->xfer && (o->xfer->store.endpoint || o->xfer->store.region ||
                                     o->xfer->store.path_style || o->xfer->store.ca_bundle ||
                                     o->xfer->store.max_attempts)
                           ? "--endpoint, --region, --path-style, --ca-bundle, --retries (the "
                             "node's profiles name the store; --profile picks one)"
                           : NULL;
    if (!what)
        return 0;
    return vmsnap_err_set(err, EINVAL,
                          "%s: not through the daemon (--socket): the node's configuration sets "
                          "it",
                          what);
}

static int vm_op(const char *name, const char *action, json_object *b, struct vmsnap_vm_timing *t,
                 struct vmsnap_err *err)
{
    char path[256];
    if (!strcmp(action, "run"))
        snprintf(path, sizeof(path), "/v1/vms");
    else
        snprintf(path, sizeof(path), "/v1/vms/%s/%s", name, action);
    json_object *r;
    int rc = run_op(path, b, &r, err);
    if (rc == 0 && t)
        timing_from(r, t);
    json_object_put(r);
    return rc;
}

/* run, resume: the readiness wait (the daemon's operation waits, as the library does) */
static void add_ready(json_object *b, const struct vmsnap_vm_opts *o)
{
    if (o->ready)
        json_object_object_add(b, "ready", json_object_new_string(o->ready));
    if (o->ready_timeout)
        json_object_object_add(b, "ready_timeout_seconds",
                               json_object_new_int((int)o->ready_timeout));
}

int cli_client_vm_run(const struct vmsnap_vm_opts *o, const char *name,
                      const struct vmsnap_vm_run_args *a, struct vmsnap_vm_timing *t,
                      struct vmsnap_err *err)
{
    int rc = vm_refused(o, err);
    if (rc < 0)
        return rc;
    json_object *b = json_object_new_object();
    json_object_object_add(b, "name", json_object_new_string(name));
    json_object_object_add(b, "kernel", path_value(a->kernel));
    if (a->initrd)
        json_object_object_add(b, "initrd", path_value(a->initrd));
    if (a->append)
        json_object_object_add(b, "append", json_object_new_string(a->append));
    if (a->mem)
        json_object_object_add(b, "memory_bytes", json_object_new_int64((int64_t)a->mem));
    if (a->cpus)
        json_object_object_add(b, "cpus", json_object_new_int((int)a->cpus));
    if (a->disk_size)
        json_object_object_add(b, "disk_size_bytes", json_object_new_int64((int64_t)a->disk_size));
    add_ready(b, o);
    return vm_op(name, "run", b, t, err);
}

int cli_client_vm_pause(const struct vmsnap_vm_opts *o, const char *name,
                        struct vmsnap_vm_timing *t, struct vmsnap_err *err)
{
    int rc = vm_refused(o, err);
    return rc < 0 ? rc : vm_op(name, "pause", json_object_new_object(), t, err);
}

int cli_client_vm_suspend(const struct vmsnap_vm_opts *o, const char *name, const char *url,
                          struct vmsnap_vm_timing *t, struct vmsnap_err *err)
{
    int rc = vm_refused(o, err);
    if (rc < 0)
        return rc;
    json_object *b = json_object_new_object();
    json_object_object_add(b, "url", url_value(url));
    add_profile(b, o->xfer);
    return vm_op(name, "suspend", b, t, err);
}

int cli_client_vm_resume(const struct vmsnap_vm_opts *o, const char *name, const char *url,
                         struct vmsnap_vm_timing *t, struct vmsnap_err *err)
{
    int rc = vm_refused(o, err);
    if (rc < 0)
        return rc;
    json_object *b = json_object_new_object();
    if (url)
        json_object_object_add(b, "url", url_value(url));
    add_profile(b, o->xfer);
    if (o->on_demand)
        json_object_object_add(b, "on_demand", json_object_new_boolean(1));
    if (o->force)
        json_object_object_add(b, "force", json_object_new_boolean(1));
    add_ready(b, o);
    return vm_op(name, "resume", b, t, err);
}

int cli_client_vm_shutdown(const struct vmsnap_vm_opts *o, const char *name, bool remove,
                           unsigned timeout, bool *graceful, struct vmsnap_err *err)
{
    int rc = vm_refused(o, err);
    if (rc < 0)
        return rc;
    json_object *b = json_object_new_object(), *r;
    if (remove)
        json_object_object_add(b, "remove", json_object_new_boolean(1));
    if (timeout)
        json_object_object_add(b, "timeout_seconds", json_object_new_int((int)timeout));
    char path[256];
    snprintf(path, sizeof(path), "/v1/vms/%s/stop", name);
    rc = run_op(path, b, &r, err);
    json_object *g;
    if (rc == 0 && graceful && json_object_object_get_ex(r, "graceful", &g))
        *graceful = json_object_get_boolean(g);
    json_object_put(r);
    return rc;
}

int cli_client_vm_list(const struct vmsnap_vm_opts *o, vmsnap_vm_list_fn fn, void *arg,
                       struct vmsnap_err *err)
{
    int rc = vm_refused(o, err);
    if (rc < 0)
        return rc;
    long st = 0;
    json_object *a = NULL, *vms;
    rc = request("GET", "/v1/vms", NULL, &st, &a, err);
    if (rc == 0 && (st != 200 || !json_object_object_get_ex(a, "vms", &vms)))
        rc = refused(st, a, err);
    for (size_t i = 0; rc == 0 && i < json_object_array_length(vms); i++) {
        json_object *v = json_object_array_get_idx(vms, i), *c;
        struct vmsnap_vm_info in = {
            .name = jstr(v, "name"),
            .status = jstr(v, "status"),
            .pid = (pid_t)ju64(v, "pid"),
            .accel = jstr(v, "accel"),
            .mem = ju64(v, "memory_bytes"),
            .checkpoint =
                json_object_object_get_ex(v, "checkpoint", &c) && json_object_get_boolean(c),
            .url = jstr(v, "url"),
            .dir = jstr(v, "path"),
            .busy_pid = (pid_t)ju64(v, "busy_pid"),
        };
        if (!in.name || !in.status || !in.dir)
            rc = vmsnap_err_set(err, EPROTO,
                                "daemon at %s: a VM row without its name, status "
                                "or path",
                                cli_socket);
        else
            rc = fn(arg, &in);
    }
    json_object_put(a);
    return rc;
}

/* ---- disks ---- */

int cli_client_disk_create(const char *path, const struct vmsnap_disk_create_opts *o,
                           struct vmsnap_err *err)
{
    json_object *b = json_object_new_object(), *r;
    json_object_object_add(b, "path", path_value(path));
    if (o->size)
        json_object_object_add(b, "size_bytes", json_object_new_int64((int64_t)o->size));
    if (o->inodes)
        json_object_object_add(b, "inodes", json_object_new_int64((int64_t)o->inodes));
    if (o->label)
        json_object_object_add(b, "label", json_object_new_string(o->label));
    if (o->uuid) {
        const uint8_t *u = o->uuid;
        char us[40];
        snprintf(us, sizeof(us),
                 "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1],
                 u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14],
                 u[15]);
        json_object_object_add(b, "uuid", json_object_new_string(us));
    }
    if (o->from_dir)
        json_object_object_add(b, "from_dir", path_value(o->from_dir));
    if (o->n_entries) {
        json_object *a = json_object_new_array();
        for (size_t i = 0; i < o->n_entries; i++) {
            const struct vmsnap_disk_entry *e = &o->entries[i];
            json_object *j = json_object_new_object();
            json_object_object_add(
                j, "op", json_object_new_string(e->op == VMSNAP_DISK_ADD ? "add" : "mkdir"));
            if (e->src)
                json_object_object_add(j, "src", path_value(e->src));
            json_object_object_add(j, "dest", json_object_new_string(e->dest));
            if (e->mode >= 0)
                json_object_object_add(j, "mode", json_object_new_int(e->mode));
            if (e->uid >= 0)
                json_object_object_add(j, "uid", json_object_new_int64(e->uid));
            if (e->gid >= 0)
                json_object_object_add(j, "gid", json_object_new_int64(e->gid));
            json_object_array_add(a, j);
        }
        json_object_object_add(b, "entries", a);
    }
    if (o->force)
        json_object_object_add(b, "force", json_object_new_boolean(1));
    if (o->fsync)
        json_object_object_add(b, "fsync", json_object_new_boolean(1));
    int rc = run_op("/v1/disks/create", b, &r, err);
    json_object_put(r);
    return rc;
}

int cli_client_disk_clone(const char *src, const char *dst, const struct vmsnap_disk_clone_opts *o,
                          enum vmsnap_disk_clone_how *how, struct vmsnap_err *err)
{
    json_object *b = json_object_new_object(), *r;
    json_object_object_add(b, "source_path", path_value(src));
    json_object_object_add(b, "path", path_value(dst));
    if (o->link)
        json_object_object_add(b, "link", json_object_new_boolean(1));
    if (o->new_uuid)
        json_object_object_add(b, "new_uuid", json_object_new_boolean(1));
    if (o->force)
        json_object_object_add(b, "force", json_object_new_boolean(1));
    if (o->direct)
        json_object_object_add(b, "direct", json_object_new_boolean(1));
    int rc = run_op("/v1/disks/clone", b, &r, err);
    if (rc == 0) {
        static const char *const names[] = {"link", "ficlone", "extents", "read-write", "direct"};
        const char *m = jstr(r, "method");
        *how = VMSNAP_DISK_CLONE_RW;
        for (unsigned i = 0; m && i < sizeof(names) / sizeof(names[0]); i++)
            if (!strcmp(m, names[i]))
                *how = (enum vmsnap_disk_clone_how)i;
    }
    json_object_put(r);
    return rc;
}

/* GET path?key=value: the answer's object when it is 200, else -errno with its error */
static int get_one(const char *path, const char *key, const char *value, json_object **out,
                   struct vmsnap_err *err)
{
    char q[8192] = "", url[8300];
    query_add(q, sizeof(q), key, value);
    snprintf(url, sizeof(url), "%s%s", path, q);
    long st = 0;
    int rc = request("GET", url, NULL, &st, out, err);
    if (rc == 0 && st != 200)
        rc = refused(st, *out, err);
    return rc;
}

int cli_client_disk_info(const char *path, struct vmsnap_disk_info *in, struct vmsnap_err *err)
{
    char b[PATH_MAX];
    json_object *a = NULL, *c;
    int rc = get_one("/v1/disks/info", "path", abs_path(path, b, sizeof(b)), &a, err);
    if (rc == 0) {
        *in = (struct vmsnap_disk_info){
            .virtual_size = ju64(a, "logical_bytes"),
            .allocated = ju64(a, "allocated_bytes"),
            .block_size = (uint32_t)ju64(a, "block_bytes"),
            .blocks_total = ju64(a, "blocks_total"),
            .blocks_free = ju64(a, "blocks_free"),
            .inodes_total = ju64(a, "inodes_total"),
            .inodes_free = ju64(a, "inodes_free"),
            .clean = json_object_object_get_ex(a, "clean", &c) && json_object_get_boolean(c),
            .mount_count = (uint32_t)ju64(a, "mount_count"),
            .mkfs_time = (int64_t)ju64(a, "mkfs_time"),
            .write_time = (int64_t)ju64(a, "write_time"),
        };
        snprintf(in->uuid_str, sizeof(in->uuid_str), "%s", jstr(a, "uuid") ? jstr(a, "uuid") : "");
        snprintf(in->label, sizeof(in->label), "%s", jstr(a, "label") ? jstr(a, "label") : "");
        snprintf(in->features, sizeof(in->features), "%s",
                 jstr(a, "features") ? jstr(a, "features") : "");
        vmsnap_disk_parse_uuid(in->uuid_str, in->uuid);
    }
    json_object_put(a);
    return rc;
}

/* ---- the page cache ---- */

static void pstat_from(json_object *j, struct vmsnap_pcache_stat *st)
{
    json_object *m;
    *st = (struct vmsnap_pcache_stat){
        .files = ju64(j, "files"),
        .size = ju64(j, "logical_bytes"),
        .pages = ju64(j, "pages"),
        .cached = ju64(j, "cached"),
        .dirty = ju64(j, "dirty"),
        .writeback = ju64(j, "writeback"),
        .evicted = ju64(j, "evicted"),
        .recently_evicted = ju64(j, "recently_evicted"),
        .mincore = json_object_object_get_ex(j, "method", &m) &&
                   !strcmp(json_object_get_string(m), "mincore"),
    };
}

int cli_client_pcache_stat_path(const char *path, vmsnap_pcache_stat_fn fn, void *arg,
                                struct vmsnap_pcache_stat *total, struct vmsnap_err *err)
{
    char b[PATH_MAX];
    json_object *a = NULL, *files, *t;
    *total = (struct vmsnap_pcache_stat){0};
    int rc = get_one("/v1/pcache/stat", "path", abs_path(path, b, sizeof(b)), &a, err);
    if (rc < 0 && !a)
        return rc;
    /* a failure keeps what was counted before it, as the library's walk does */
    if (json_object_object_get_ex(a, "files", &files))
        for (size_t i = 0; fn && i < json_object_array_length(files); i++) {
            json_object *f = json_object_array_get_idx(files, i);
            struct vmsnap_pcache_stat st;
            pstat_from(f, &st);
            st.files = 1;
            st.page_size = (uint32_t)ju64(a, "page_bytes");
            int frc = jstr(f, "path") ? fn(arg, jstr(f, "path"), &st) : 0;
            if (frc < 0 && rc == 0)
                rc = frc;
        }
    if (json_object_object_get_ex(a, "total", &t))
        pstat_from(t, total);
    total->page_size = (uint32_t)ju64(a, "page_bytes");
    json_object_put(a);
    return rc;
}

int cli_client_pcache_evict(const char *path, const struct vmsnap_pcache_evict_opts *o,
                            struct vmsnap_pcache_report *rep, struct vmsnap_err *err)
{
    if (o->retrier)
        return vmsnap_err_set(err, EINVAL,
                              "--wait: not through the daemon (--socket): its retrier is the "
                              "node's");
    json_object *b = json_object_new_object(), *r;
    json_object_object_add(b, "path", path_value(path));
    if (o->staged)
        json_object_object_add(b, "staged", json_object_new_boolean(1));
    if (o->kick_writeback)
        json_object_object_add(b, "kick_writeback", json_object_new_boolean(1));
    if (o->preserve) {
        json_object *a = json_object_new_array();
        for (const char *const *p = o->preserve; *p; p++)
            json_object_array_add(a, path_value(*p));
        json_object_object_add(b, "preserve", a);
    }
    int rc = run_op("/v1/pcache/evict", b, &r, err);
    if (rc == 0) { /* added to what the earlier paths did, as the library adds */
        rep->dropped_pages += ju64(r, "dropped_pages");
        rep->dropped_files += ju64(r, "dropped_files");
        rep->removed_files += ju64(r, "removed_files");
        rep->removed_bytes += ju64(r, "removed_bytes");
        rep->removed_pages += ju64(r, "removed_pages");
        rep->dirty_files += ju64(r, "dirty_files");
        rep->kicked += ju64(r, "writeback_started_files");
        rep->busy_files += ju64(r, "busy_files");
        rep->readonly_files += ju64(r, "readonly_files");
        rep->unknown_files += ju64(r, "unknown_files");
        rep->skipped_mounts += ju64(r, "skipped_mounts");
    }
    json_object_put(r);
    return rc;
}

/* ---- the node's object cache: the handle is the daemon's (c is NULL) ---- */

static char objcache_path[PATH_MAX];

int cli_client_objcache_stat(struct vmsnap_objcache *c, uint64_t *entries, uint64_t *bytes,
                             uint64_t *cap, struct vmsnap_err *err)
{
    (void)c;
    json_object *a = NULL;
    int rc = get_one("/v1/objcache", NULL, NULL, &a, err);
    if (rc == 0) {
        snprintf(objcache_path, sizeof(objcache_path), "%s",
                 jstr(a, "path") ? jstr(a, "path") : "");
        if (entries)
            *entries = ju64(a, "objects");
        if (bytes)
            *bytes = ju64(a, "object_bytes");
        if (cap)
            *cap = ju64(a, "cap_bytes");
    }
    json_object_put(a);
    return rc;
}

const char *cli_client_objcache_dir(const struct vmsnap_objcache *c)
{
    (void)c;
    return objcache_path;
}

int cli_client_objcache_list(struct vmsnap_objcache *c,
                             int (*fn)(void *arg, const struct vmsnap_objcache_entry *e), void *arg,
                             struct vmsnap_err *err)
{
    (void)c;
    json_object *a = NULL, *list;
    int rc = get_one("/v1/objcache", "entries", "true", &a, err);
    if (rc == 0 && json_object_object_get_ex(a, "entries", &list))
        for (size_t i = 0; rc == 0 && i < json_object_array_length(list); i++) {
            json_object *j = json_object_array_get_idx(list, i);
            struct vmsnap_objcache_entry e = {
                .key = jstr(j, "key"),
                .size = ju64(j, "bytes"),
                .last_used = (int64_t)ju64(j, "last_used"),
            };
            if (e.key)
                rc = fn(arg, &e);
        }
    json_object_put(a);
    return rc;
}

int cli_client_objcache_trim(struct vmsnap_objcache *c, uint64_t max_bytes, uint64_t *evicted,
                             uint64_t *freed, struct vmsnap_err *err)
{
    (void)c;
    json_object *b = json_object_new_object(), *r;
    json_object_object_add(b, "max_bytes", json_object_new_int64((int64_t)max_bytes));
    int rc = run_op("/v1/objcache/trim", b, &r, err);
    if (rc == 0) {
        if (evicted)
            *evicted = ju64(r, "evicted");
        if (freed)
            *freed = ju64(r, "freed_bytes");
    }
    json_object_put(r);
    return rc;
}
