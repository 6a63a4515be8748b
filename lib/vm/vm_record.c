/* SPDX-License-Identifier: Apache-2.0 */
/* The VM's JSON record (vm.json) and a snapshot's config.json: reading, writing, fields, the
 * refusal of a config from a store that is not what a VM's holds, and a driver handle from one. */
#include "vm_int.h"

#include "util/util.h"
#include "sys/sys.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int vm_cfg_load(const char *path, json_object **out, struct vmsnap_err *err)
{
    *out = NULL;
    /* O_NONBLOCK and the type check: a FIFO or a device planted as a record must not hang the
     * command or be read as one */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0)
        return err_sys(err, "%s", path);
    struct stat fs;
    if (fstat(fd, &fs) < 0 || !S_ISREG(fs.st_mode)) {
        close(fd);
        return vmsnap_err_set(err, EINVAL, "%s: not a regular file", path);
    }
    if (fs.st_size >= CFG_MAX) {
        close(fd);
        return vmsnap_err_set(err, EFBIG, "%s: %lld bytes, larger than a VM's record (%d) can be",
                              path, (long long)fs.st_size, CFG_MAX);
    }
    char *buf = malloc(CFG_MAX);
    if (!buf) {
        close(fd);
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    }
    ssize_t n = sys_pread_full(fd, buf, CFG_MAX - 1, 0);
    close(fd);
    if (n < 0) {
        free(buf);
        return err_code(err, (int)-n, "read %s", path);
    }
    buf[n] = 0;
    json_tokener *tok = json_tokener_new();
    json_object *o = tok ? json_tokener_parse_ex(tok, buf, (int)n) : NULL;
    bool ok = tok && json_tokener_get_error(tok) == json_tokener_success && o &&
              json_object_is_type(o, json_type_object);
    /* one object and nothing after it but white space (as manifests are read) */
    for (size_t i = ok ? json_tokener_get_parse_end(tok) : 0; ok && i < (size_t)n; i++)
        ok = buf[i] == ' ' || buf[i] == '\n' || buf[i] == '\t' || buf[i] == '\r';
    json_tokener_free(tok);
    free(buf);
    if (!ok) {
        json_object_put(o);
        return vmsnap_err_set(err, EINVAL, "%s: not a JSON object", path);
    }
    *out = o;
    return 0;
}

int vm_cfg_save(const char *path, json_object *o, struct vmsnap_err *err)
{
    struct sys_atomic_file af;
    int rc = sys_atomic_open(&af, path, 0600, err);
    if (rc < 0)
        return rc;
    const char *s = json_object_to_json_string_ext(
        o, JSON_C_TO_STRING_PRETTY | JSON_C_TO_STRING_SPACED | JSON_C_TO_STRING_NOSLASHESCAPE);
    rc = sys_write_full(af.fd, s, strlen(s));
    if (rc == 0)
        rc = sys_write_full(af.fd, "\n", 1);
    if (rc < 0) {
        sys_atomic_abort(&af);
        return err_code(err, -rc, "write %s", path);
    }
    return sys_atomic_commit(&af, false, err);
}

const char *vm_cfg_str(json_object *o, const char *key)
{
    json_object *v;
    if (!json_object_object_get_ex(o, key, &v) || !json_object_is_type(v, json_type_string))
        return NULL;
    return json_object_get_string(v);
}

int64_t vm_cfg_int(json_object *o, const char *key)
{
    json_object *v;
    if (!json_object_object_get_ex(o, key, &v) || !json_object_is_type(v, json_type_int))
        return -1;
    return json_object_get_int64(v);
}

bool vm_cfg_bool(json_object *o, const char *key)
{
    json_object *v;
    return json_object_object_get_ex(o, key, &v) && json_object_get_boolean(v);
}

void vm_cfg_set_str(json_object *o, const char *key, const char *val)
{
    json_object_object_add(o, key, val ? json_object_new_string(val) : NULL);
}

int vm_config_rewrite(json_object *cfg, const char *disk_path, const char *ram_path,
                      const char *run_dir, struct vmsnap_err *err)
{
    if (disk_path) {
        json_object *disks, *d0;
        if (!json_object_object_get_ex(cfg, "disks", &disks) ||
            !json_object_is_type(disks, json_type_array) || json_object_array_length(disks) < 1 ||
            !json_object_is_type(d0 = json_object_array_get_idx(disks, 0), json_type_object))
            return vmsnap_err_set(err, EINVAL, "config: no disks[0] object to rewrite");
        vm_cfg_set_str(d0, "path", disk_path);
    }
    if (ram_path)
        vm_cfg_set_str(cfg, "ram_path", ram_path);
    if (run_dir)
        vm_cfg_set_str(cfg, "run_dir", run_dir);
    return 0;
}

static const char *cfg_disk(json_object *cfg)
{
    json_object *disks, *d0;
    if (!json_object_object_get_ex(cfg, "disks", &disks) ||
        !json_object_is_type(disks, json_type_array) || json_object_array_length(disks) < 1)
        return NULL;
    d0 = json_object_array_get_idx(disks, 0);
    return d0 ? vm_cfg_str(d0, "path") : NULL;
}

/* A record status saying a QEMU was started for the VM (booting, restoring or running): with
 * no QEMU alive, the VM is dead. */
bool vm_status_live(const char *s)
{
    return s && (!strcmp(s, "running") || !strcmp(s, "restoring") || !strcmp(s, "starting"));
}

/* Do `a` and `b` name one file: the same string, or the same device and inode. Records written
 * before the state and RAM directories were used in their canonical spelling name them as the
 * user spelled them ("S/vms/a", "/dev/shm//x"). */
bool vm_same_path(const char *a, const char *b)
{
    struct stat sa, sb;
    return !strcmp(a, b) || (stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
                             sa.st_ino == sb.st_ino);
}

/* A driver handle from a config object. */
int vm_vmm_from_cfg(struct vmctx *c, json_object *cfg, struct vmsnap_vmm **out,
                    struct vmsnap_err *err)
{
    /* QEMU is recognised by the paths on its command line: a record's run_dir spelled another
     * way (written before the canonical spelling) is the one its QEMU was started with */
    const char *rd = vm_cfg_str(cfg, "run_dir");
    const char *run_dir = rd && vm_same_path(rd, c->vmdir) ? rd : c->vmdir;
    int64_t mem = vm_cfg_int(cfg, "memory"), cpus = vm_cfg_int(cfg, "cpus");
    struct vmsnap_vmm_config vc = {
        .kernel = vm_cfg_str(cfg, "kernel"),
        .initrd = vm_cfg_str(cfg, "initrd"),
        .cmdline = vm_cfg_str(cfg, "cmdline"),
        .mem = mem > 0 ? (uint64_t)mem : 0,
        .cpus = cpus > 0 && cpus < 1000 ? (unsigned)cpus : 0,
        .disk = cfg_disk(cfg),
        .ram_path = vm_cfg_str(cfg, "ram_path"),
        .ram_shared = vm_cfg_bool(cfg, "ram_shared"),
        .state_has_ram = vm_cfg_bool(cfg, "ram_in_state"),
        .accel = vm_cfg_str(cfg, "accel"),
        .run_dir = run_dir,
        .qemu = c->o ? c->o->qemu : NULL,
    };
    int rc = vmsnap_vmm_new(vm_cfg_str(cfg, "driver"), &vc, out, err);
    if (rc < 0)
        return vmsnap_err_wrap(err, "VM '%s': ", c->name);
    return 0;
}

/* A snapshot's config.json comes from a store another node (or tenant) wrote: before anything
 * is staged, its fields must be what a VM's config holds, each refusal naming the field and
 * `path` (the object's name: `file` is its staged copy). */
int vm_check_set_cfg(const char *file, const char *path, json_object *cfg, struct vmsnap_err *err)
{
    struct stat sb;
    if (stat(file, &sb) == 0 && sb.st_size > SET_CFG_MAX)
        return vmsnap_err_set(err, EFBIG, "%s: %lld bytes, more than a VM's config takes (%d)",
                              path, (long long)sb.st_size, SET_CFG_MAX);
    static const struct {
        const char *key;
        int64_t min, max;
    } ints[] = {
        {"memory", 1 << 20, INT64_C(1) << 46}, /* 64 TiB: the codec's cap */
        {"cpus", 1, 64},
        {"generation", 0, GEN_MAX},
    };
    for (size_t i = 0; i < sizeof(ints) / sizeof(ints[0]); i++) {
        json_object *v;
        if (!json_object_object_get_ex(cfg, ints[i].key, &v))
            continue;
        int64_t x = json_object_get_int64(v);
        if (!json_object_is_type(v, json_type_int) || x < ints[i].min || x > ints[i].max)
            return vmsnap_err_set(err, EINVAL,
                                  "%s: \"%s\" is %s, not a whole number in [%lld, %lld]", path,
                                  ints[i].key, json_object_to_json_string(v),
                                  (long long)ints[i].min, (long long)ints[i].max);
    }
    if (vm_cfg_int(cfg, "memory") % (1 << 20))
        return vmsnap_err_set(err, EINVAL, "%s: \"memory\" %lld is not a multiple of 1 MiB", path,
                              (long long)vm_cfg_int(cfg, "memory"));
    json_object *disks;
    if (!json_object_object_get_ex(cfg, "disks", &disks) ||
        !json_object_is_type(disks, json_type_array) || json_object_array_length(disks) < 1 ||
        !json_object_is_type(json_object_array_get_idx(disks, 0), json_type_object))
        return vmsnap_err_set(err, EINVAL, "%s: \"disks\" is missing or not a list of disk objects",
                              path);
    const char *cmd = vm_cfg_str(cfg, "cmdline");
    if (cmd && strlen(cmd) > CMDLINE_MAX)
        return vmsnap_err_set(err, EINVAL,
                              "%s: \"cmdline\" is %zu bytes, more than a kernel command line "
                              "takes (%d)",
                              path, strlen(cmd), CMDLINE_MAX);
    return 0;
}

/* The VM's VMM state; `wait` > 0: seconds its QEMU may take to answer, at most (vm ls), 0: the
 * QMP timeout, < 0: QEMU is not asked (its pid only, a live one's state "other"). */
int vm_state(struct vmctx *c, json_object *cfg, double wait, enum vmsnap_vmm_state *st, pid_t *pid,
             struct vmsnap_err *err)
{
    struct vmsnap_vmm *v = NULL;
    int rc = vm_vmm_from_cfg(c, cfg, &v, err);
    if (rc == 0) {
        vmsnap_vmm_set_reply_wait(v, wait);
        rc = vmsnap_vmm_state(v, st, pid, err);
    }
    vmsnap_vmm_free(v);
    return rc;
}
