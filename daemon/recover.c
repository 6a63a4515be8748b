/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The journal of operations in flight and the start-up recovery of what a killed daemon left
 * (docs/daemon.md, "Service life").
 *
 * Under <state_dir>/vmsnapd/: `ops/<id>.json` for each operation running now ({id, kind, target,
 * started, pid, body}: written under a temporary name and renamed before the worker calls the
 * library, removed once the operation ended and its last operation is kept), so at most
 * `workers` entries; `last/<vm>.json`, the last operation of each VM (the API's object), one file
 * a VM, those of VMs gone removed at the next start; `alive`, touched every second, whose mtime
 * tells a restarted daemon when its predecessor died (a gc then takes only what is older: what
 * others stored since stays); `lock`, held while the daemon runs (one daemon per state
 * directory; a record lock, which a forked child does not share). The files are not fsynced: they
 * outlive the daemon, not the host (a host crash ends the guests too; the library's boot ids cover
 * that).
 *
 * Recovery, before the socket serves: each entry's kind gets the sweeps the library has (a VM's
 * next command completes or uses what its marks say, a gc removes a killed push's marks, uploads
 * and objects, the object cache's open sweeps dead fills) and the daemon's own of the temporaries
 * named with the dead daemon's pid (pulls) or the target's name (disk create, clone). A VM a
 * pause, suspend or resume was changing ends running, paused or suspended: one whose guest is
 * neither running nor saved (frozen, interrupted, unsaved, dead) is resumed from what the node
 * has (else from the URL), as the CLI's crash matrix does. Each is reported as an operation in
 * the state failed, class interrupted, its result {"recovery": ...} saying what was done.
 */
#include "daemon.h"

#include "vmsnap/objcache.h"
#include "vmsnap/vm.h"
#include "vmsnap/xfer.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MAX_ENTRIES 4096 /* entries read at a start (at most `workers` are ever written) */

struct d_journal {
    char dir[PATH_MAX]; /* <state_dir>/vmsnapd */
    char state[PATH_MAX];
    int lockfd, opsfd, lastfd;
    pthread_t hb;
    bool hb_up, quit;
    pthread_mutex_t mu;
    pthread_cond_t cv;
};

static double wall(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* `o` as dir/name, through a temporary and a rename (never half written) */
static int put_json(int dfd, const char *name, json_object *o)
{
    char tmp[NAME_MAX + 8];
    if (snprintf(tmp, sizeof(tmp), ".%s.tmp", name) >= (int)sizeof(tmp))
        return -ENAMETOOLONG;
    const char *s = json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN);
    int fd = openat(dfd, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0)
        return -errno;
    size_t n = strlen(s), done = 0;
    while (done < n) {
        ssize_t w = write(fd, s + done, n - done);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            int e = w < 0 ? errno : EIO;
            close(fd);
            unlinkat(dfd, tmp, 0);
            return -e;
        }
        done += (size_t)w;
    }
    close(fd);
    if (renameat(dfd, tmp, dfd, name) < 0) {
        int e = errno;
        unlinkat(dfd, tmp, 0);
        return -e;
    }
    return 0;
}

static json_object *get_json(int dfd, const char *name)
{
    int fd = openat(dfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return NULL;
    char buf[65536];
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return NULL;
    buf[n] = '\0';
    json_object *o = json_tokener_parse(buf);
    if (o && !json_object_is_type(o, json_type_object)) {
        json_object_put(o);
        o = NULL;
    }
    return o;
}

void d_journal_begin(struct d_journal *j, const char *id, const char *kind, const char *target,
                     double started, json_object *body)
{
    json_object *e = json_object_new_object();
    json_object_object_add(e, "id", json_object_new_string(id));
    json_object_object_add(e, "kind", json_object_new_string(kind));
    json_object_object_add(e, "target", json_object_new_string(target));
    json_object_object_add(e, "started", json_object_new_double(started));
    json_object_object_add(e, "pid", json_object_new_int((int)getpid()));
    json_object_object_add(e, "body", body ? json_object_get(body) : NULL);
    char name[D_REQ_ID_LEN + 8];
    snprintf(name, sizeof(name), "%s.json", id);
    int rc = put_json(j->opsfd, name, e);
    if (rc < 0) /* the operation runs anyway: only a later recovery would miss it */
        d_log(VMSNAP_LOG_WARN, NULL, "journal %s/ops/%s: %s", j->dir, name, strerror(-rc));
    json_object_put(e);
}

void d_journal_end(struct d_journal *j, const char *id)
{
    char name[D_REQ_ID_LEN + 8];
    snprintf(name, sizeof(name), "%s.json", id);
    unlinkat(j->opsfd, name, 0);
}

/* "vm:NAME" -> NAME when it is a VM's target (the names res_vm.c admits) */
static const char *vm_of(const char *target)
{
    if (strncmp(target, "vm:", 3) || !target[3] || target[3] == '.' ||
        strlen(target + 3) > VMSNAP_VM_NAME_MAX)
        return NULL;
    for (const char *p = target + 3; *p; p++)
        if (!isalnum((unsigned char)*p) && !strchr("._-", *p))
            return NULL;
    return target + 3;
}

void d_journal_last(struct d_journal *j, const char *target, json_object *op)
{
    const char *vm = vm_of(target);
    if (!vm)
        return;
    char name[VMSNAP_VM_NAME_MAX + 8];
    snprintf(name, sizeof(name), "%s.json", vm);
    int rc = put_json(j->lastfd, name, op);
    if (rc < 0)
        d_log(VMSNAP_LOG_WARN, NULL, "journal %s/last/%s: %s", j->dir, name, strerror(-rc));
}

static void *heartbeat(void *arg)
{
    struct d_journal *j = arg;
    char p[PATH_MAX + 8];
    snprintf(p, sizeof(p), "%s/alive", j->dir);
    pthread_mutex_lock(&j->mu);
    while (!j->quit) {
        utimensat(AT_FDCWD, p, NULL, 0);
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_sec += 1;
        pthread_cond_timedwait(&j->cv, &j->mu, &ts);
    }
    pthread_mutex_unlock(&j->mu);
    return NULL;
}

void d_journal_close(struct d_journal *j)
{
    if (!j)
        return;
    if (j->hb_up) { /* a clean stop: no entry left; a journal holding no last operation goes */
        char p[PATH_MAX + 16];
        const char *const names[] = {"ops", "last", "alive", NULL};
        bool empty = true;
        for (size_t i = 0; names[i]; i++) {
            snprintf(p, sizeof(p), "%s/%s", j->dir, names[i]);
            if (i < 2)
                empty = rmdir(p) == 0 && empty;
            else if (empty)
                unlink(p);
        }
        if (empty) {
            snprintf(p, sizeof(p), "%s/lock", j->dir);
            unlink(p);
            rmdir(j->dir);
            char *sl = strrchr(j->dir, '/');
            if (sl)
                *sl = '\0';
            rmdir(j->dir); /* <state_dir>/vmsnapd, when it was the only one */
        }
    }
    if (j->hb_up) {
        pthread_mutex_lock(&j->mu);
        j->quit = true;
        pthread_cond_broadcast(&j->cv);
        pthread_mutex_unlock(&j->mu);
        pthread_join(j->hb, NULL);
    }
    const int fds[] = {j->opsfd, j->lastfd, j->lockfd};
    for (size_t i = 0; i < sizeof(fds) / sizeof(fds[0]); i++)
        if (fds[i] >= 0)
            close(fds[i]);
    pthread_cond_destroy(&j->cv);
    pthread_mutex_destroy(&j->mu);
    free(j);
}

/* ---- what recovery did, for the report ---- */

struct rec {
    json_object *r; /* {"pid", "status_before", "actions": [...], "status", "ok"} */
    char summary[1024];
    size_t n;
    bool ok;
};

static void did(struct rec *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void did(struct rec *r, const char *fmt, ...)
{
    char line[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    json_object *a;
    json_object_object_get_ex(r->r, "actions", &a);
    json_object_array_add(a, json_object_new_string(line));
    int w = snprintf(r->summary + r->n, sizeof(r->summary) - r->n, "%s%s", r->n ? "; " : "", line);
    if (w > 0)
        r->n = r->n + (size_t)w < sizeof(r->summary) ? r->n + (size_t)w : sizeof(r->summary) - 1;
}

static void failed(struct rec *r, const char *what, const struct vmsnap_err *e)
{
    r->ok = false;
    did(r, "%s failed: %s", what, e->msg);
}

/* ---- VMs ---- */

static void vm_opts(const struct d_config *cfg, struct vmsnap_vm_opts *vo, char *assets, size_t n)
{
    *vo = (struct vmsnap_vm_opts){
        .state_dir = cfg->state_dir,
        .ram_dir = cfg->ram_dir,
        .accel = cfg->accel,
        .qemu = cfg->qemu,
    };
    size_t o = 0;
    assets[0] = '\0';
    for (size_t i = 0; i < cfg->n_asset_dirs && o < n; i++) {
        int w = snprintf(assets + o, n - o, "%s%s", i ? ":" : "", cfg->asset_dirs[i]);
        o = w > 0 ? o + (size_t)w : o;
    }
    vo->asset_dirs = cfg->n_asset_dirs && o < n ? assets : "/nonexistent/vmsnapd-no-asset-dirs";
}

struct vm_look {
    const char *name;
    char status[32], url[PATH_MAX], dir[PATH_MAX];
    pid_t busy;
    bool found;
};

static int look_one(void *arg, const struct vmsnap_vm_info *i)
{
    struct vm_look *l = arg;
    if (strcmp(i->name, l->name))
        return 0;
    l->found = true;
    snprintf(l->status, sizeof(l->status), "%s", i->status);
    snprintf(l->url, sizeof(l->url), "%s", i->url ? i->url : "");
    snprintf(l->dir, sizeof(l->dir), "%s", i->dir ? i->dir : "");
    l->busy = i->busy_pid;
    return 0;
}

static void vm_look(const struct vmsnap_vm_opts *vo, const char *name, struct vm_look *l)
{
    *l = (struct vm_look){.name = name};
    struct vmsnap_err e = {0};
    if (vmsnap_vm_list(vo, look_one, l, &e) < 0)
        snprintf(l->status, sizeof(l->status), "unknown");
}

/* The grant of one operation (ops.c's share of the node's budget), for recovery's resumes. */
static struct d_grant share(const struct d_config *cfg)
{
    unsigned w = cfg->workers ? cfg->workers : 1;
    struct d_grant g = {
        .threads = cfg->op_threads ? cfg->op_threads : cfg->codec_threads / w,
        .memory = cfg->op_memory ? cfg->op_memory : cfg->memory / w,
        .connections = cfg->op_connections ? cfg->op_connections : cfg->connections / w,
    };
    g.threads = g.threads ? g.threads : 1;
    g.connections = g.connections ? g.connections : 1;
    return g;
}

static bool settled(const char *s)
{
    return !strcmp(s, "running") || !strcmp(s, "paused") || !strcmp(s, "suspended");
}

/* A pause, suspend or resume killed: the VM's guest ends running, or saved (paused, suspended).
 * A VM with no QEMU that is saved gets a stop (its lock's sweep of temporaries and the
 * completion of an interrupted checkpoint); one neither running nor saved then (frozen,
 * interrupted, unsaved, dead; a suspend killed in its teardown reads unsaved after that sweep:
 * its stage is marked the VM's newest state again) is resumed from what the node has, else from
 * the URL. */
static void settle_vm(const struct d_config *cfg, struct vmsnap_vm_opts *vo, const char *name,
                      const char *url, struct vm_look *l, struct rec *r)
{
    struct vmsnap_err e = {0};
    if (!strcmp(l->status, "running")) {
        did(r, "the VM runs: left as it is");
        return;
    }
    if (!strcmp(l->status, "paused") || !strcmp(l->status, "suspended")) {
        if (vmsnap_vm_stop(vo, name, false, &e) < 0) {
            failed(r, "the sweep (vm stop)", &e);
            return;
        }
        did(r, "the VM is %s: what the killed operation left swept (vm stop)", l->status);
        vm_look(vo, name, l);
        if (settled(l->status))
            return;
    }
    struct d_grant g = share(cfg);
    json_object *none = json_object_new_object();
    struct vmsnap_xfer_opts x;
    d_xfer_opts(cfg, none, &g, &x);
    vo->xfer = &x;
    if (vmsnap_vm_resume(vo, name, NULL, NULL, &e) == 0) {
        did(r, "the VM was %s: resumed from the node's state", l->status);
    } else {
        const char *u = url && *url ? url : l->url[0] ? l->url : NULL;
        struct vmsnap_err e2 = {0};
        if (u && vmsnap_vm_resume(vo, name, u, NULL, &e2) == 0)
            did(r, "the VM was %s: resumed from %s (from the node's state: %s)", l->status, u,
                e.msg);
        else
            failed(r, "resume", u ? &e2 : &e);
    }
    vo->xfer = NULL;
    json_object_put(none);
}

static void gc_url(const struct d_config *cfg, json_object *body, const char *url, double death,
                   struct rec *r);
static void sweep_store_temps(const char *dir, double death, struct rec *r);

/* The VM's lock (the library's flock of its directory) held by no live process: a child of the
 * dead daemon, forked and not yet exec'd (QEMU's), shares it until it execs or exits. Waited
 * for, up to 10 s (then recovery fails as busy, the VM left to the next command). */
static void wait_orphan_lock(const struct vmsnap_vm_opts *vo, const char *name, struct vm_look *l,
                             struct rec *r)
{
    if (!l->found || !l->dir[0] || (l->busy > 0 && !(kill(l->busy, 0) < 0 && errno == ESRCH)))
        return;
    int fd = open(l->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return;
    int i;
    for (i = 0; i < 100 && flock(fd, LOCK_EX | LOCK_NB) < 0 && errno == EWOULDBLOCK; i++) {
        struct timespec ts = {0, 100 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    close(fd); /* (the lock, if taken, goes with it) */
    if (i > 0) {
        did(r, "the VM's lock was held by a process of the dead daemon's: waited %.1f s", i / 10.0);
        vm_look(vo, name, l);
    }
}

static void recover_vm(const struct d_config *cfg, const char *kind, const char *name,
                       json_object *body, double death, struct rec *r)
{
    struct vmsnap_vm_opts vo;
    char assets[PATH_MAX * 2];
    vm_opts(cfg, &vo, assets, sizeof(assets));
    struct vm_look l;
    vm_look(&vo, name, &l);
    wait_orphan_lock(&vo, name, &l, r);
    json_object_object_add(r->r, "status_before",
                           l.found ? json_object_new_string(l.status) : NULL);
    struct vmsnap_err e = {0};
    const char *url = d_jstr(body, "url");
    if (!l.found) {
        did(r, "no VM of that name");
    } else if (l.busy) {
        r->ok = false;
        did(r, "the VM is held by process %d: left to it", (int)l.busy);
    } else if (!strcmp(kind, "vm.stop")) {
        bool rm = d_jbool(body, "remove");
        if (vmsnap_vm_stop(&vo, name, rm, &e) < 0)
            failed(r, "vm stop", &e);
        else
            did(r, "the stop done again%s", rm ? " (and the VM removed)" : "");
    } else if (!strcmp(kind, "vm.run") && strcmp(l.status, "running")) {
        if (vmsnap_vm_stop(&vo, name, false, &e) < 0)
            failed(r, "the sweep (vm stop)", &e);
        else
            did(r, "a run killed before its guest ran: the VM is stopped (remove it, or run "
                   "it again)");
    } else {
        settle_vm(cfg, &vo, name, url, &l, r);
    }
    if (!strcmp(kind, "vm.suspend") && url)
        gc_url(cfg, body, url, death, r);
    vm_look(&vo, name, &l);
    json_object_object_add(r->r, "status", l.found ? json_object_new_string(l.status) : NULL);
    if (l.found && strcmp(kind, "vm.stop") && strcmp(kind, "vm.run") && !settled(l.status))
        r->ok = false;
}

/* ---- stores: what a killed push left ---- */

/* Where a gc finds every manifest that may name the URL's objects: the URL itself on S3 (gc reads
 * the whole bucket's manifests), on a local store the configured root holding it (the directory
 * that holds the sets sharing layers: docs/transfer.md). */
static const char *gc_where(const struct d_config *cfg, const char *url, char *buf, size_t len)
{
    if (!strncmp(url, "s3://", 5) || !strncmp(url, "gs://", 5))
        return url;
    const char *p = !strncmp(url, "file://", 7) ? url + 7 : url;
    const char *best = NULL;
    size_t bl = 0;
    for (size_t i = 0; i < cfg->n_roots; i++) {
        size_t n = strlen(cfg->roots[i]);
        while (n > 1 && cfg->roots[i][n - 1] == '/')
            n--;
        if (!strncmp(p, cfg->roots[i], n) && (p[n] == '/' || p[n] == '\0') && n > bl) {
            best = cfg->roots[i];
            bl = n;
        }
    }
    snprintf(buf, len, "%.*s", best ? (int)bl : (int)strlen(p), best ? best : p);
    return buf;
}

static void gc_url(const struct d_config *cfg, json_object *body, const char *url, double death,
                   struct rec *r)
{
    char where[PATH_MAX];
    const char *w = gc_where(cfg, url, where, sizeof(where));
    /* what the dead daemon stored is at least this old; what others stored since is younger */
    double age = death > 0 ? wall() - death - 1 : 0;
    struct vmsnap_gc_opts g = {.older_than = age > 0 ? (int64_t)age : 0};
    struct d_grant gr = share(cfg);
    struct vmsnap_xfer_opts x;
    d_xfer_opts(cfg, body, &gr, &x);
    struct vmsnap_gc_result res = {0};
    struct vmsnap_err e = {0};
    if (strncmp(url, "s3://", 5) && strncmp(url, "gs://", 5)) /* a local store's set directory */
        sweep_store_temps(!strncmp(url, "file://", 7) ? url + 7 : url, death, r);
    if (vmsnap_xfer_gc(w, &g, &x, &res, &e) < 0) {
        failed(r, "gc", &e);
        return;
    }
    did(r,
        "gc of %s (older than %llds): %u uploads aborted, %u push marks and %u of their objects "
        "removed, %u unreachable objects removed, %u kept",
        w, (long long)g.older_than, res.aborted, res.pushes, res.objects, res.unreachable,
        res.kept);
}

/* ---- the daemon's own sweeps of temporaries ---- */

static bool dead(long pid)
{
    return pid > 0 && kill((pid_t)pid, 0) < 0 && errno == ESRCH;
}

/* a directory of files only (a killed swap's sibling), removed without following links */
static bool rm_flat(int pfd, const char *name)
{
    int fd = openat(pfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        if (fd >= 0)
            close(fd);
        return false;
    }
    if (flock(dirfd(d), LOCK_EX | LOCK_NB) < 0) { /* a live swap holds it */
        closedir(d);
        return false;
    }
    for (struct dirent *de; (de = readdir(d));)
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
            unlinkat(dirfd(d), de->d_name, 0);
    closedir(d);
    return unlinkat(pfd, name, AT_REMOVEDIR) == 0;
}

/* In `dir`: the temporaries `.vmsnap-pull.PID.XXXXXX` and links `.vmsnap-old.PID.N` of a pull of
 * process `pid`, and the swap siblings `.BASE.vmsnap-swap.PID.XXXXXX` of `base` (NULL: none).
 * Regular files (and swap directories) of this user only. */
static unsigned sweep_pid(const char *dir, long pid, const char *base)
{
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = dfd >= 0 ? fdopendir(dfd) : NULL;
    if (!d) {
        if (dfd >= 0)
            close(dfd);
        return 0;
    }
    char pull[64], old[64], swap[NAME_MAX + 64];
    snprintf(pull, sizeof(pull), ".vmsnap-pull.%ld.", pid);
    snprintf(old, sizeof(old), ".vmsnap-old.%ld.", pid);
    snprintf(swap, sizeof(swap), ".%s.vmsnap-swap.%ld.", base ? base : "/", pid);
    unsigned n = 0;
    for (struct dirent *de; (de = readdir(d));) {
        struct stat sb;
        bool file =
            !strncmp(de->d_name, pull, strlen(pull)) || !strncmp(de->d_name, old, strlen(old));
        bool side = base && !strncmp(de->d_name, swap, strlen(swap));
        if ((!file && !side) || fstatat(dirfd(d), de->d_name, &sb, AT_SYMLINK_NOFOLLOW) < 0 ||
            sb.st_uid != geteuid())
            continue;
        if (file && S_ISREG(sb.st_mode) && unlinkat(dirfd(d), de->d_name, 0) == 0)
            n++;
        else if (side && S_ISDIR(sb.st_mode) && rm_flat(dirfd(d), de->d_name))
            n++;
    }
    closedir(d);
    return n;
}

/* `path` and its parent, for what a pull of process `pid` left there */
static void sweep_pull(const char *path, long pid, struct rec *r)
{
    if (!path || !dead(pid)) {
        did(r, "no pull temporaries looked for (%s)", path ? "its process lives" : "no path");
        return;
    }
    char parent[PATH_MAX], base[NAME_MAX + 1];
    snprintf(parent, sizeof(parent), "%s", path);
    char *sl = strrchr(parent, '/');
    snprintf(base, sizeof(base), "%.*s", NAME_MAX, sl ? sl + 1 : parent);
    if (sl)
        sl[sl == parent] = '\0';
    unsigned n = sweep_pid(path, pid, NULL) + sweep_pid(sl ? parent : ".", pid, base);
    did(r, "%u temporar%s of the pull removed", n, n == 1 ? "y" : "ies");
}

/* `.BASE.XXXXXX` beside `path` (sys_atomic_open's temporaries of a disk create or clone), of this
 * user and last written before the daemon died */
static void sweep_atomic(const char *path, double death, struct rec *r)
{
    if (!path)
        return;
    char parent[PATH_MAX];
    snprintf(parent, sizeof(parent), "%s", path);
    char *sl = strrchr(parent, '/');
    if (!sl)
        return;
    const char *base = path + (sl - parent) + 1;
    sl[sl == parent] = '\0';
    size_t bl = strlen(base);
    unsigned n = 0;
    DIR *d = opendir(parent);
    for (struct dirent *de; d && (de = readdir(d));) {
        const char *nm = de->d_name;
        struct stat sb;
        bool match =
            nm[0] == '.' && strlen(nm) == bl + 8 && !strncmp(nm + 1, base, bl) && nm[bl + 1] == '.';
        for (size_t i = bl + 2; match && i < bl + 8; i++)
            match = isalnum((unsigned char)nm[i]);
        if (match && fstatat(dirfd(d), nm, &sb, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(sb.st_mode) &&
            sb.st_uid == geteuid() && (death <= 0 || (double)sb.st_mtime <= death + 1) &&
            unlinkat(dirfd(d), nm, 0) == 0)
            n++;
    }
    if (d)
        closedir(d);
    did(r, "%u temporar%s of %s removed", n, n == 1 ? "y" : "ies", path);
}

/* In a local store's set directory `dir`: the temporaries `.manifest.json.XXXXXX` and
 * `.vmsnap-push-ID.json.XXXXXX` of a manifest or push mark being written (renamed into place once
 * written), of this user and last written before the daemon died (a live writer's are younger) */
static void sweep_store_temps(const char *dir, double death, struct rec *r)
{
    static const char mark[] = "vmsnap-push-", json[] = ".json";
    unsigned n = 0;
    DIR *d = opendir(dir);
    for (struct dirent *de; d && (de = readdir(d));) {
        const char *nm = de->d_name;
        size_t l = strlen(nm), ml = l > 8 ? l - 8 : 0; /* the name between '.' and ".XXXXXX" */
        struct stat sb;
        bool match = nm[0] == '.' && ml > 0 && nm[ml + 1] == '.' &&
                     ((ml == strlen("manifest.json") && !strncmp(nm + 1, "manifest.json", ml)) ||
                      (ml > strlen(mark) + strlen(json) && !strncmp(nm + 1, mark, strlen(mark)) &&
                       !strncmp(nm + 1 + ml - strlen(json), json, strlen(json))));
        for (size_t i = ml + 2; match && i < l; i++)
            match = isalnum((unsigned char)nm[i]);
        if (match && fstatat(dirfd(d), nm, &sb, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(sb.st_mode) &&
            sb.st_uid == geteuid() && (death <= 0 || (double)sb.st_mtime <= death + 1) &&
            unlinkat(dirfd(d), nm, 0) == 0)
            n++;
    }
    if (d)
        closedir(d);
    if (n)
        did(r, "%u temporar%s of a manifest or push mark removed in %s", n, n == 1 ? "y" : "ies",
            dir);
}

/* ---- one entry ---- */

static void recover_one(struct d_ctx *c, const struct d_config *cfg, json_object *e, double death)
{
    const char *id = d_jstr(e, "id"), *kind = d_jstr(e, "kind"), *target = d_jstr(e, "target");
    if (!id || !kind || !target)
        return;
    json_object *body = NULL, *v;
    if (json_object_object_get_ex(e, "body", &v) && json_object_is_type(v, json_type_object))
        body = v;
    long pid = (long)d_jint(e, "pid", 0);
    double started = json_object_object_get_ex(e, "started", &v) ? json_object_get_double(v) : 0;
    struct rec r = {.r = json_object_new_object(), .ok = true};
    json_object_object_add(r.r, "pid", json_object_new_int((int)pid));
    json_object_object_add(r.r, "actions", json_object_new_array());
    const char *vm = vm_of(target);
    if (!strncmp(kind, "vm.", 3) && vm)
        recover_vm(cfg, kind, vm, body, death, &r);
    else if (!strcmp(kind, "set.push") && d_jstr(body, "url"))
        gc_url(cfg, body, d_jstr(body, "url"), death, &r);
    else if (!strcmp(kind, "set.pull"))
        sweep_pull(d_jstr(body, "path"), pid, &r);
    else if (!strcmp(kind, "disk.create") || !strcmp(kind, "disk.clone"))
        sweep_atomic(d_jstr(body, "path"), death, &r);
    else
        did(&r, "nothing to recover for a %s (run it again if it is still wanted)", kind);
    json_object_object_add(r.r, "ok", json_object_new_boolean(r.ok));
    json_object *result = json_object_new_object();
    json_object_object_add(result, "recovery", r.r);
    struct d_recovered op = {
        .id = id, .kind = kind, .target = target, .started = started, .result = result};
    vmsnap_err_set(&op.err, EINTR,
                   "interrupted: vmsnapd (pid %ld) ended while it ran; recovery%s: %s", pid,
                   r.ok ? "" : " incomplete", r.summary);
    d_log(r.ok ? VMSNAP_LOG_WARN : VMSNAP_LOG_ERROR, NULL, "operation %s %s %s: %s", id, kind,
          target, op.err.msg);
    d_op_recovered(c, &op);
    json_object_put(result);
}

/* ---- start-up ---- */

static int mkdirs(const char *path, struct vmsnap_err *err)
{
    char tmp[PATH_MAX];
    snprintf(tmp, sizeof(tmp), "%s", path);
    for (char *p = tmp + 1;; p++) {
        if (*p && *p != '/')
            continue;
        char was = *p;
        *p = '\0';
        if (mkdir(tmp, 0700) < 0 && errno != EEXIST)
            return vmsnap_err_set(err, errno, "mkdir %s: %s", tmp, strerror(errno));
        if (!(*p = was))
            return 0;
    }
}

static int cmp_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* the names of `dfd`'s entries ending in ".json" (not temporaries: those are removed) */
static char **json_names(int dfd, size_t *n)
{
    *n = 0;
    int fd = dup(dfd);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        if (fd >= 0)
            close(fd);
        return NULL;
    }
    char **v = calloc(MAX_ENTRIES, sizeof(*v));
    for (struct dirent *de; v && *n < MAX_ENTRIES && (de = readdir(d));) {
        size_t l = strlen(de->d_name);
        if (de->d_name[0] == '.') {
            if (l > 4 && !strcmp(de->d_name + l - 4, ".tmp"))
                unlinkat(dfd, de->d_name, 0);
            continue;
        }
        if (l > 5 && !strcmp(de->d_name + l - 5, ".json") && (v[*n] = strdup(de->d_name)))
            (*n)++;
    }
    closedir(d);
    if (v && *n)
        qsort(v, *n, sizeof(*v), cmp_name);
    return v;
}

static void free_names(char **v, size_t n)
{
    for (size_t i = 0; v && i < n; i++)
        free(v[i]);
    free(v);
}

/* the VMs' last operations; those of VMs that are gone removed */
static void load_last(struct d_ctx *c, struct d_journal *j)
{
    size_t n;
    char **v = json_names(j->lastfd, &n);
    for (size_t i = 0; i < n; i++) {
        char target[VMSNAP_VM_NAME_MAX + 16], rec[PATH_MAX + 2 * NAME_MAX];
        snprintf(target, sizeof(target), "vm:%.*s", (int)(strlen(v[i]) - 5), v[i]);
        const char *vm = vm_of(target);
        struct stat sb;
        json_object *o = vm ? get_json(j->lastfd, v[i]) : NULL;
        snprintf(rec, sizeof(rec), "%s/vms/%s/vm.json", j->state, vm ? vm : ".");
        if (o && stat(rec, &sb) == 0)
            d_op_set_last(c, target, o);
        else
            unlinkat(j->lastfd, v[i], 0);
        json_object_put(o);
    }
    free_names(v, n);
}

static uint32_t fnv1a(const char *s)
{
    uint32_t h = 2166136261u;
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 16777619u;
    return h;
}

static int journal_open(const struct d_config *cfg, struct d_journal *j, struct vmsnap_err *err)
{
    const char *sd = cfg->state_dir ? cfg->state_dir : getenv("VMSNAP_STATE_DIR");
    if (!sd || !*sd)
        sd = VMSNAP_VM_DEFAULT_STATE_DIR;
    snprintf(j->state, sizeof(j->state), "%s", sd);
    /* one journal per socket: the daemon restarted on it finds its own */
    if (snprintf(j->dir, sizeof(j->dir), "%s/vmsnapd/%08x", sd, fnv1a(cfg->socket)) >=
        (int)sizeof(j->dir) - 16)
        return vmsnap_err_set(err, ENAMETOOLONG, "state directory %s: too long", sd);
    char p[PATH_MAX + 16];
    int rc = mkdirs(j->dir, err);
    for (const char *sub = "ops"; rc == 0 && sub; sub = strcmp(sub, "ops") ? NULL : "last") {
        snprintf(p, sizeof(p), "%s/%s", j->dir, sub);
        rc = mkdirs(p, err);
    }
    if (rc < 0)
        return rc;
    snprintf(p, sizeof(p), "%s/lock", j->dir);
    j->lockfd = open(p, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (j->lockfd < 0)
        return vmsnap_err_set(err, errno, "%s: %s", p, strerror(errno));
    /* A POSIX record lock, not flock(): a child forked and not yet exec'd (QEMU's) shares a
     * flock with the daemon, and holds it past a kill -9 of the daemon, while a record lock is
     * the process's own (not inherited by fork) and goes with it. Only this descriptor opens
     * the file (closing any other would drop the lock). */
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
    for (int tries = 0; fcntl(j->lockfd, F_SETLK, &fl) < 0; tries++) {
        if (errno == EINTR)
            continue;
        if (errno != EACCES && errno != EAGAIN)
            return vmsnap_err_set(err, errno, "%s: lock: %s", p, strerror(errno));
        struct flock h = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
        if (fcntl(j->lockfd, F_GETLK, &h) == 0 && h.l_type == F_UNLCK && tries < 100)
            continue; /* its holder just went */
        return vmsnap_err_set(err, EBUSY,
                              "%s: another vmsnapd (pid %ld) on %s uses the state directory %s "
                              "(stop it first)",
                              p, (long)h.l_pid, cfg->socket, sd);
    }
    snprintf(p, sizeof(p), "%s/ops", j->dir);
    j->opsfd = open(p, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
    snprintf(p, sizeof(p), "%s/last", j->dir);
    j->lastfd = open(p, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
    if (j->opsfd < 0 || j->lastfd < 0)
        return vmsnap_err_set(err, errno, "%s: %s", p, strerror(errno));
    return 0;
}

int d_recover(struct d_ctx *c, const struct d_config *cfg, struct d_journal **out,
              struct vmsnap_err *err)
{
    *out = NULL;
    struct d_journal *j = calloc(1, sizeof(*j));
    if (!j)
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    j->lockfd = j->opsfd = j->lastfd = -1;
    pthread_mutex_init(&j->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&j->cv, &ca);
    pthread_condattr_destroy(&ca);
    int rc = journal_open(cfg, j, err);
    if (rc < 0) {
        d_journal_close(j);
        return rc;
    }
    char p[PATH_MAX + 16];
    snprintf(p, sizeof(p), "%s/alive", j->dir);
    struct stat sb;
    double death = stat(p, &sb) == 0 ? (double)sb.st_mtim.tv_sec + sb.st_mtim.tv_nsec / 1e9 : 0;
    load_last(c, j);
    d_ctx_set_journal(c, j); /* the recovered operations are their VMs' last ones */
    size_t n;
    char **v = json_names(j->opsfd, &n);
    for (size_t i = 0; i < n; i++) {
        json_object *e = get_json(j->opsfd, v[i]);
        if (e)
            recover_one(c, cfg, e, death);
        json_object_put(e);
        unlinkat(j->opsfd, v[i], 0);
    }
    free_names(v, n);
    if (n) { /* the object cache's fills a killed pull, resume or suspend left */
        struct vmsnap_objcache_opts co = {.dir = cfg->cache_dir, .max_bytes = cfg->cache_size};
        struct vmsnap_objcache *oc = NULL;
        struct vmsnap_err e = {0};
        if (vmsnap_objcache_open(&co, &oc, &e) == 0)
            vmsnap_objcache_close(oc);
        d_log(VMSNAP_LOG_INFO, NULL, "recovered %zu operation%s a killed daemon left", n,
              n == 1 ? "" : "s");
    }
    int fd = open(p, O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd >= 0)
        close(fd);
    if ((rc = pthread_create(&j->hb, NULL, heartbeat, j)) != 0) {
        vmsnap_err_set(err, rc, "heartbeat thread: %s", strerror(rc));
        d_ctx_set_journal(c, NULL);
        d_journal_close(j);
        return -rc;
    }
    j->hb_up = true;
    *out = j;
    return 0;
}
