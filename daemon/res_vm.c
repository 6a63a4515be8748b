/* SPDX-License-Identifier: Apache-2.0 */
/* VMs through lib/vm (vm.h): list and info answer at once; run, pause, suspend, resume and stop
 * are operations on "vm:NAME", so one runs at a time per VM (the library's flock of the VM's
 * directory stays the guard across processes). Resumes go before everything else in the queue.
 * Kernels and initrds come only from the node's asset directories; a resume from a store is
 * held to them too (vmsnap_vm_opts.asset_dirs). */
#include "daemon.h"

#include "vmsnap/vm.h"
#include "vmsnap/xfer.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int vm_opts(const struct d_config *cfg, struct vmsnap_vm_opts *vo, char *assets, size_t alen)
{
    *vo = (struct vmsnap_vm_opts){
        .state_dir = cfg->state_dir,
        .ram_dir = cfg->ram_dir,
        .accel = cfg->accel,
        .qemu = cfg->qemu,
    };
    size_t n = 0;
    assets[0] = '\0';
    for (size_t i = 0; i < cfg->n_asset_dirs; i++) {
        int w = snprintf(assets + n, alen - n, "%s%s", i ? ":" : "", cfg->asset_dirs[i]);
        if (w < 0 || (size_t)w >= alen - n)
            return -ENAMETOOLONG;
        n += (size_t)w;
    }
    /* no asset directory configured: nothing a store names is trusted */
    vo->asset_dirs = cfg->n_asset_dirs ? assets : "/nonexistent/vmsnapd-no-asset-dirs";
    return 0;
}

static bool name_ok(struct d_response *rs, const char *name)
{
    size_t n = strlen(name);
    bool ok = n > 0 && n <= VMSNAP_VM_NAME_MAX && name[0] != '.';
    for (size_t i = 0; ok && i < n; i++)
        ok = (name[i] >= 'a' && name[i] <= 'z') || (name[i] >= 'A' && name[i] <= 'Z') ||
             (name[i] >= '0' && name[i] <= '9') || strchr("._-", name[i]);
    if (!ok)
        d_error_msg(rs, -D_EUSAGE,
                    "VM name: 1 to %d letters, digits, '.', '_', '-' (not starting with '.')",
                    VMSNAP_VM_NAME_MAX);
    return ok;
}

static void timing_json(json_object *r, const char *name, const char *op,
                        const struct vmsnap_vm_timing *t)
{
    json_object_object_add(r, "name", json_object_new_string(name));
    json_object_object_add(r, "op", json_object_new_string(op));
    json_object *s = json_object_new_object();
    for (unsigned i = 0; i < t->n; i++)
        json_object_object_add(s, t->step[i].name, d_seconds(t->step[i].seconds));
    json_object_object_add(r, "steps", s);
    json_object_object_add(r, "seconds", d_seconds(t->total));
    json_object_object_add(r, "object_bytes", json_object_new_int64((int64_t)t->object_bytes));
    json_object_object_add(r, "copied_bytes", json_object_new_int64((int64_t)t->copied_bytes));
    json_object_object_add(r, "deltas", json_object_new_int64((int64_t)t->deltas));
    json_object_object_add(r, "cached_bytes", json_object_new_int64((int64_t)t->cached_bytes));
}

/* What a VM takes on the node's disk, from its directory (the layout of docs/vm.md): the upper
 * disks' apparent sizes (disk-*.ext4), the bytes allocated by the whole directory (a file
 * hard-linked into the checkpoint counted once) and by its checkpoint. Read without the VM's
 * lock: a figure of the moment. */
struct sizes {
    uint64_t disk, allocated, checkpoint;
    ino_t seen[64];
    unsigned n_seen;
};

static bool seen_before(struct sizes *z, ino_t ino)
{
    for (unsigned i = 0; i < z->n_seen; i++)
        if (z->seen[i] == ino)
            return true;
    if (z->n_seen < sizeof(z->seen) / sizeof(z->seen[0]))
        z->seen[z->n_seen++] = ino;
    return false;
}

static void sizes_dir(struct sizes *z, int dfd, bool top, bool in_checkpoint, unsigned depth)
{
    DIR *d = fdopendir(dfd);
    if (!d) {
        close(dfd);
        return;
    }
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        struct stat st;
        if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0)
            continue;
        if (S_ISDIR(st.st_mode) && depth < 3) {
            int sub = openat(dirfd(d), e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (sub >= 0)
                sizes_dir(z, sub, false, in_checkpoint || (top && !strcmp(e->d_name, "checkpoint")),
                          depth + 1);
            continue;
        }
        if (!S_ISREG(st.st_mode))
            continue;
        uint64_t alloc = (uint64_t)st.st_blocks * 512;
        if (in_checkpoint)
            z->checkpoint += alloc;
        if (!seen_before(z, st.st_ino) || st.st_nlink == 1)
            z->allocated += alloc;
        size_t n = strlen(e->d_name);
        if (top && !strncmp(e->d_name, "disk-", 5) && n > 5 && !strcmp(e->d_name + n - 5, ".ext4"))
            z->disk += (uint64_t)st.st_size;
    }
    closedir(d);
}

static json_object *sizes_json(const struct vmsnap_vm_info *i)
{
    struct sizes z = {0};
    int fd = open(i->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0)
        sizes_dir(&z, fd, true, false, 0);
    json_object *j = json_object_new_object();
    json_object_object_add(j, "memory_bytes", json_object_new_int64((int64_t)i->mem));
    json_object_object_add(j, "disk_bytes", json_object_new_int64((int64_t)z.disk));
    json_object_object_add(j, "allocated_bytes", json_object_new_int64((int64_t)z.allocated));
    json_object_object_add(j, "checkpoint_bytes", json_object_new_int64((int64_t)z.checkpoint));
    return j;
}

static json_object *info_json(const struct vmsnap_vm_info *i)
{
    json_object *j = json_object_new_object();
    json_object_object_add(j, "name", json_object_new_string(i->name));
    json_object_object_add(j, "status", json_object_new_string(i->status));
    json_object_object_add(j, "pid", json_object_new_int(i->pid));
    json_object_object_add(j, "accel", i->accel ? json_object_new_string(i->accel) : NULL);
    json_object_object_add(j, "memory_bytes", json_object_new_int64((int64_t)i->mem));
    json_object_object_add(j, "checkpoint", json_object_new_boolean(i->checkpoint));
    json_object_object_add(j, "url", i->url ? json_object_new_string(i->url) : NULL);
    json_object_object_add(j, "path", json_object_new_string(i->dir));
    json_object_object_add(j, "busy_pid", json_object_new_int(i->busy_pid));
    return j;
}

struct listing {
    json_object *a;
    const char *only;
};

static int list_one(void *arg, const struct vmsnap_vm_info *i)
{
    struct listing *l = arg;
    if (!l->only || !strcmp(l->only, i->name)) {
        json_object *j = info_json(i);
        if (l->only)
            json_object_object_add(j, "sizes", sizes_json(i));
        json_object_array_add(l->a, j);
    }
    return 0;
}

static int list(struct d_request *rq, struct d_response *rs, const char *only, json_object *a)
{
    struct vmsnap_vm_opts vo;
    char assets[PATH_MAX * 2];
    vm_opts(d_ctx_config(rq->ctx), &vo, assets, sizeof(assets));
    struct listing l = {a, only};
    struct vmsnap_err err = {0};
    int rc = vmsnap_vm_list(&vo, list_one, &l, &err);
    if (rc < 0)
        d_error(rs, rc, &err, false);
    return rc;
}

void r_vm_list(struct d_request *rq, struct d_response *rs)
{
    json_object *a = json_object_new_array();
    if (list(rq, rs, NULL, a) == 0)
        rs->body = d_obj();
    json_object_object_add(rs->body, "vms", a);
}

void r_vm_info(struct d_request *rq, struct d_response *rs)
{
    const char *name = rq->params[0];
    if (!name_ok(rs, name))
        return;
    json_object *a = json_object_new_array();
    if (list(rq, rs, name, a) == 0) {
        if (json_object_array_length(a) == 0) {
            d_error_msg(rs, -ENOENT, "VM %s: no such VM", name);
        } else {
            /* the operation on it now and the last one that ended, with its step timings */
            json_object *vm = json_object_get(json_object_array_get_idx(a, 0)), *cur, *last;
            char target[VMSNAP_VM_NAME_MAX + 8];
            snprintf(target, sizeof(target), "vm:%s", name);
            d_op_target(rq->ctx, target, &cur, &last);
            json_object_object_add(vm, "operation", cur);
            json_object_object_add(vm, "last_operation", last);
            rs->body = d_obj();
            json_object_object_add(rs->body, "vm", vm);
        }
    }
    json_object_put(a);
}

static int do_vm(struct d_op *op, const struct d_config *cfg, const struct d_grant *g,
                 json_object *r, struct vmsnap_err *err)
{
    json_object *o = d_op_body(op);
    const char *name = d_jstr(o, "name"), *action = d_jstr(o, "_action"), *url = d_jstr(o, "url");
    struct vmsnap_vm_opts vo;
    char assets[PATH_MAX * 2];
    int rc = vm_opts(cfg, &vo, assets, sizeof(assets));
    if (rc < 0)
        return vmsnap_err_set(err, -rc, "asset directories: too long");
    struct vmsnap_xfer_opts x;
    d_xfer_opts(cfg, o, g, &x);
    vo.xfer = &x;
    vo.on_demand = d_jbool(o, "on_demand");
    vo.force = d_jbool(o, "force");
    vo.ready = d_jstr(o, "ready");
    vo.ready_timeout = (unsigned)d_jint(o, "ready_timeout_seconds", 0);
    struct vmsnap_vm_timing t = {0};
    if (!strcmp(action, "run")) {
        struct vmsnap_vm_run_args a = {
            .kernel = d_jstr(o, "kernel"),
            .initrd = d_jstr(o, "initrd"),
            .append = d_jstr(o, "append"),
            .mem = (uint64_t)d_jint(o, "memory_bytes", 0),
            .cpus = (unsigned)d_jint(o, "cpus", 0),
            .disk_size = (uint64_t)d_jint(o, "disk_size_bytes", 0),
        };
        rc = vmsnap_vm_run(&vo, name, &a, &t, err);
    } else if (!strcmp(action, "pause")) {
        rc = vmsnap_vm_pause(&vo, name, &t, err);
    } else if (!strcmp(action, "suspend")) {
        rc = vmsnap_vm_suspend(&vo, name, url, &t, err);
    } else if (!strcmp(action, "resume")) {
        rc = vmsnap_vm_resume(&vo, name, url, &t, err);
    } else {
        bool graceful = false;
        rc = vmsnap_vm_shutdown(&vo, name, d_jbool(o, "remove"),
                                (unsigned)d_jint(o, "timeout_seconds", 0), &graceful, err);
        if (rc == 0) {
            json_object_object_add(r, "name", json_object_new_string(name));
            json_object_object_add(r, "op", json_object_new_string("stop"));
            json_object_object_add(r, "removed", json_object_new_boolean(d_jbool(o, "remove")));
            json_object_object_add(r, "graceful", json_object_new_boolean(graceful));
        }
        return rc;
    }
    if (rc == 0) {
        timing_json(r, name, action, &t);
        if (url)
            json_object_object_add(r, "url", json_object_new_string(url));
    }
    return rc;
}

static void submit_vm(struct d_request *rq, struct d_response *rs, json_object *o, const char *name,
                      const char *action)
{
    json_object_object_add(o, "name", json_object_new_string(name));
    json_object_object_add(o, "_action", json_object_new_string(action));
    char kind[32], target[VMSNAP_VM_NAME_MAX + 8];
    snprintf(kind, sizeof(kind), "vm.%s", action);
    snprintf(target, sizeof(target), "vm:%s", name);
    int prio = !strcmp(action, "resume") ? 2 : !strcmp(action, "run") ? 1 : 0;
    bool budget = !strcmp(action, "suspend") || !strcmp(action, "resume");
    d_submit_body(rq, rs, kind, target, prio, budget, do_vm, o);
}

static int asset(struct d_request *rq, struct d_response *rs, json_object *o, const char *key)
{
    const struct d_config *cfg = d_ctx_config(rq->ctx);
    const char *v = d_jstr(o, key);
    if (!v)
        return 0;
    char out[PATH_MAX];
    struct vmsnap_err err = {0};
    int rc = d_path_check(v, cfg->asset_dirs, cfg->n_asset_dirs, key, out, sizeof(out), &err);
    if (rc < 0) {
        if (rc == -EACCES)
            vmsnap_err_wrap(&err, "(kernels and initrds only from the asset directories) ");
        d_error(rs, rc, &err, false);
    }
    return rc;
}

/* run, resume: "ready" 1 to VMSNAP_VM_READY_MAX bytes, "ready_timeout_seconds" 1 to
 * VMSNAP_VM_READY_TIMEOUT_MAX and only with it (the CLI's --ready, --ready-timeout); false after
 * the 400 */
static bool ready_ok(struct d_response *rs, json_object *o)
{
    const char *r = d_jstr(o, "ready");
    int64_t to = d_jint(o, "ready_timeout_seconds", 0);
    json_object *tv = NULL;
    bool has_to = json_object_object_get_ex(o, "ready_timeout_seconds", &tv);
    if ((r && (!*r || strlen(r) > VMSNAP_VM_READY_MAX)) ||
        (has_to && (to < 1 || to > VMSNAP_VM_READY_TIMEOUT_MAX)) || (has_to && !r)) {
        d_error_msg(rs, -D_EUSAGE,
                    "ready: 1 to %d bytes; ready_timeout_seconds: 1 to %d, and only with ready",
                    VMSNAP_VM_READY_MAX, VMSNAP_VM_READY_TIMEOUT_MAX);
        return false;
    }
    return true;
}

void r_vm_run(struct d_request *rq, struct d_response *rs)
{
    static const struct d_field f[] = {
        {"name", D_STR, true},
        {"kernel", D_STR, true},
        {"initrd", D_STR, false},
        {"append", D_STR, false},
        {"memory_bytes", D_INT, false},
        {"cpus", D_INT, false},
        {"disk_size_bytes", D_INT, false},
        {"ready", D_STR, false},
        {"ready_timeout_seconds", D_INT, false},
        {"deadline_seconds", D_INT, false},
        {0},
    };
    json_object *o = d_req_body(rq, rs, f);
    if (!o)
        return;
    char name[VMSNAP_VM_NAME_MAX + 1];
    snprintf(name, sizeof(name), "%s", d_jstr(o, "name"));
    if (!name_ok(rs, d_jstr(o, "name")) || asset(rq, rs, o, "kernel") < 0 ||
        asset(rq, rs, o, "initrd") < 0 || !ready_ok(rs, o)) {
        json_object_put(o);
        return;
    }
    if (d_jint(o, "memory_bytes", 0) < 0 || d_jint(o, "cpus", 0) < 0 || d_jint(o, "cpus", 0) > 64 ||
        d_jint(o, "disk_size_bytes", 0) < 0) {
        json_object_put(o);
        d_error_msg(rs, -D_EUSAGE,
                    "memory_bytes, cpus (at most 64), disk_size_bytes: not negative");
        return;
    }
    submit_vm(rq, rs, o, name, "run");
}

void r_vm_action(struct d_request *rq, struct d_response *rs)
{
    static const struct d_field f_plain[] = {{"deadline_seconds", D_INT, false}, {0}};
    static const struct d_field f_stop[] = {{"remove", D_BOOL, false},
                                            {"timeout_seconds", D_INT, false},
                                            {"deadline_seconds", D_INT, false},
                                            {0}};
    static const struct d_field f_suspend[] = {
        {"url", D_STR, true}, {"profile", D_STR, false}, {"deadline_seconds", D_INT, false}, {0}};
    static const struct d_field f_resume[] = {
        {"url", D_STR, false},
        {"profile", D_STR, false},
        {"on_demand", D_BOOL, false},
        {"force", D_BOOL, false},
        {"ready", D_STR, false},
        {"ready_timeout_seconds", D_INT, false},
        {"deadline_seconds", D_INT, false},
        {0},
    };
    const char *name = rq->params[0], *action = rq->params[1];
    const struct d_field *f = !strcmp(action, "pause")     ? f_plain
                              : !strcmp(action, "stop")    ? f_stop
                              : !strcmp(action, "suspend") ? f_suspend
                              : !strcmp(action, "resume")  ? f_resume
                                                           : NULL;
    if (!f) {
        d_error_msg(rs, -ENOENT, "%s: no such action (pause, suspend, resume, stop)", rq->path);
        return;
    }
    if (!name_ok(rs, name))
        return;
    json_object *o = d_req_body(rq, rs, f);
    if (!o)
        return;
    int64_t to = d_jint(o, "timeout_seconds", 0);
    if (to < 0 || to > VMSNAP_VM_SHUTDOWN_MAX) {
        json_object_put(o);
        d_error_msg(rs, -D_EUSAGE, "timeout_seconds: 0 to %d", VMSNAP_VM_SHUTDOWN_MAX);
        return;
    }
    if (d_req_url(rq, rs, o, "url", false) < 0 || d_req_profile(rq, rs, o) < 0 ||
        !ready_ok(rs, o)) {
        json_object_put(o);
        return;
    }
    char n[VMSNAP_VM_NAME_MAX + 1], a[16];
    snprintf(n, sizeof(n), "%s", name);
    snprintf(a, sizeof(a), "%s", action);
    submit_vm(rq, rs, o, n, a);
}
