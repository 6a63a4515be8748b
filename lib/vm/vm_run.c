/* SPDX-License-Identifier: Apache-2.0 */
/* vm run: a new VM cold-booted (fresh upper disk, RAM file, base id, record before QEMU). */
#include "vm_int.h"

#include "util/util.h"
#include "vmsnap/disk.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

/* A new lineage's id: 16 random bytes in hex. */
static int new_base_id(char out[33], struct vmsnap_err *err)
{
    uint8_t id[16];
    if (getrandom(id, sizeof(id), 0) != (ssize_t)sizeof(id))
        return vmsnap_err_set(err, EIO, "getrandom: %s", strerror(errno));
    for (int i = 0; i < 16; i++)
        snprintf(out + 2 * i, 3, "%02x", id[i]);
    return 0;
}

/* The record of a new VM (the schema of a checkpoint's config.json, without status). */
static json_object *run_config(const struct vmctx *c, const struct vmsnap_vm_run_args *a,
                               const char *accel, const char *base_id, uint64_t mem)
{
    json_object *cfg = json_object_new_object();
    vm_cfg_set_str(cfg, "name", c->name);
    vm_cfg_set_str(cfg, "driver", "qemu");
    vm_cfg_set_str(cfg, "kernel", a->kernel);
    if (a->initrd)
        vm_cfg_set_str(cfg, "initrd", a->initrd);
    if (a->append)
        vm_cfg_set_str(cfg, "cmdline", a->append);
    json_object_object_add(cfg, "memory", json_object_new_int64((int64_t)mem));
    json_object_object_add(cfg, "cpus", json_object_new_int64(a->cpus ? a->cpus : 1));
    vm_cfg_set_str(cfg, "accel", accel);
    vm_cfg_set_str(cfg, "base_id", base_id);
    json_object *disks = json_object_new_array(), *d0 = json_object_new_object();
    vm_cfg_set_str(d0, "cid", CID);
    vm_cfg_set_str(d0, "path", c->disk);
    json_object_array_add(disks, d0);
    json_object_object_add(cfg, "disks", disks);
    vm_cfg_set_str(cfg, "ram_path", c->ram);
    json_object_object_add(cfg, "ram_shared", json_object_new_boolean(1));
    vm_cfg_set_str(cfg, "run_dir", c->vmdir);
    return cfg;
}

/* The guest RAM file, `mem` bytes (sparse), when the RAM directory has room for it. */
static int make_ram_file(const struct vmctx *c, uint64_t mem, struct vmsnap_err *err)
{
    unlink(c->ram);
    int rc = vm_ram_room(c, (int64_t)mem, err);
    if (rc < 0)
        return rc;
    int fd = open(c->ram, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0 || ftruncate(fd, (off_t)mem) < 0) {
        rc = err_sys(err, "create guest RAM file %s", c->ram);
        if (fd >= 0)
            close(fd);
        return rc;
    }
    close(fd);
    return 0;
}

int vmsnap_vm_run(const struct vmsnap_vm_opts *o, const char *name,
                  const struct vmsnap_vm_run_args *a, struct vmsnap_vm_timing *t,
                  struct vmsnap_err *err)
{
    double t0 = mono_now(), tstart = t0;
    struct vmctx c;
    json_object *cfg = NULL;
    struct vmsnap_vmm *v = NULL;
    bool created = false;
    int rc = vm_ctx_init(&c, o, name, err);
    if (rc < 0)
        return rc;
    if (!a || !a->kernel) {
        rc = vmsnap_err_set(err, EINVAL, "vm run %s: a kernel is required", name);
        goto out;
    }
    if (a->append && strlen(a->append) > CMDLINE_MAX) { /* (a resume would refuse its snapshot) */
        rc = vmsnap_err_set(err, EINVAL,
                            "--append is %zu bytes, more than a kernel command line takes (%d)",
                            strlen(a->append), CMDLINE_MAX);
        goto out;
    }
    const char *accel;
    rc = vmsnap_vmm_pick_accel(o ? o->accel : NULL, &accel, err);
    if (rc == 0)
        rc = vm_check_ram_dir(&c, err);
    if (rc < 0)
        goto out;
    char vms[PATH_LEN];
    if (vm_pcat(vms, c.state, "/vms") < 0)
        return vmsnap_err_set(err, ENAMETOOLONG, "path %s too long", c.state);
    rc = vm_mkdir_p(vms, err);
    if (rc < 0)
        goto out;
    if (mkdir(c.vmdir, 0700) < 0) {
        rc = errno == EEXIST ? vmsnap_err_set(err, EEXIST, "a VM named '%s' already exists in %s",
                                              name, c.state)
                             : err_sys(err, "mkdir %s", c.vmdir);
        goto out;
    }
    created = true;
    rc = vm_ctx_lock(&c, err);
    if (rc < 0)
        goto out;
    char base_id[33];
    if ((rc = new_base_id(base_id, err)) < 0)
        goto out;

    struct vmsnap_disk_create_opts dco = {.size = a->disk_size, .label = "vmsnap-upper"};
    rc = vmsnap_disk_create(c.disk, &dco, err);
    if (rc < 0)
        goto out;
    vm_step(t, "disk", &t0);

    uint64_t mem = a->mem ? a->mem : (512ull << 20);
    cfg = run_config(&c, a, accel, base_id, mem);
    if ((rc = make_ram_file(&c, mem, err)) < 0)
        goto out;
    /* the record before QEMU starts: a run killed meanwhile (it is not cancellable) leaves a
     * VM that ls shows and stop --rm removes, not an orphan QEMU no command knows */
    vm_cfg_set_str(cfg, "status", "starting");
    rc = vm_cfg_save(c.cfgpath, cfg, err);
    if (rc == 0)
        rc = vm_vmm_from_cfg(&c, cfg, &v, err);
    struct vm_console_mark mark = vm_console_mark(&c);
    if (rc == 0)
        rc = vmsnap_vmm_boot(v, err);
    if (rc < 0)
        goto out;
    vm_step(t, "boot", &t0);
    vm_cfg_set_str(cfg, "status", "running");
    rc = vm_cfg_save(c.cfgpath, cfg, err);
    if (rc < 0) {
        vmsnap_vmm_stop(v, NULL);
        goto out;
    }
    /* a guest that is not ready is not undone: it runs, as the error says */
    rc = vm_wait_ready(&c, cfg, mark, t, &t0, err);
    return vm_op_end(&c, cfg, v, rc, "run", t, tstart, err);
out:
    if (rc < 0 && created) {
        unlink(c.ram);
        vm_rm_rf(c.vmdir);
    }
    return vm_op_end(&c, cfg, v, rc, "run", t, tstart, err);
}
