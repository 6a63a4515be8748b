/* SPDX-License-Identifier: Apache-2.0 */
/* vm stop: the VM's QEMU stopped (its guest asked to power off first: --timeout) and its RAM
 * file freed, or (--rm) its whole record removed. */
#include "vm_int.h"

#include "util/util.h"

#include <errno.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A running guest asked to power off, `timeout` seconds at most (*off: it did); a failure is
 * the wait's (interrupted) or QMP's: the caller stops the VM hard all the same. */
static int ask_guest(struct vmctx *c, struct vmsnap_vmm *v, unsigned timeout, bool *off,
                     struct vmsnap_err *err)
{
    enum vmsnap_vmm_state st;
    struct vmsnap_err se = {0};
    vmsnap_vmm_set_reply_wait(v, 5); /* a QEMU that does not answer is stopped hard */
    int rc = vmsnap_vmm_state(v, &st, NULL, &se);
    vmsnap_vmm_set_reply_wait(v, 0);
    if (rc < 0 || st != VMSNAP_VMM_RUNNING) {
        vlog(VMSNAP_LOG_INFO, "VM '%s' is %s: stopped hard (only a running guest can power off)",
             c->name, rc < 0 ? "not answering" : vmsnap_vmm_state_name(st));
        return 0;
    }
    double t0 = mono_now();
    if ((rc = vmsnap_vmm_powerdown(v, timeout, off, err)) < 0)
        return rc;
    if (*off)
        vlog(VMSNAP_LOG_INFO, "VM '%s': the guest powered off (%.1f s)", c->name, mono_now() - t0);
    else
        vlog(VMSNAP_LOG_WARN,
             "VM '%s': the guest did not power off within %u s of its power button: stopped hard",
             c->name, timeout);
    return 0;
}

int vmsnap_vm_stop(const struct vmsnap_vm_opts *o, const char *name, bool remove,
                   struct vmsnap_err *err)
{
    return vmsnap_vm_shutdown(o, name, remove, 0, NULL, err);
}

int vmsnap_vm_shutdown(const struct vmsnap_vm_opts *o, const char *name, bool remove,
                       unsigned timeout, bool *graceful, struct vmsnap_err *err)
{
    bool off = false;
    if (graceful)
        *graceful = false;
    if (timeout > VMSNAP_VM_SHUTDOWN_MAX)
        return vmsnap_err_set(err, EINVAL, "vm stop %s: a timeout of at most %d s, not %u", name,
                              VMSNAP_VM_SHUTDOWN_MAX, timeout);
    struct vmctx c;
    json_object *cfg = NULL;
    struct vmsnap_vmm *v = NULL;
    int rc = vm_open_record(&c, o, name, &cfg, err);
    struct stat rs, cs;
    if (rc == 0 && remove && vm_cfg_bool(cfg, "ram_shared") && vm_cfg_str(cfg, "ram_path") &&
        lstat(vm_cfg_str(cfg, "ram_path"), &rs) == 0 &&
        !(stat(c.ram, &cs) == 0 && cs.st_dev == rs.st_dev && cs.st_ino == rs.st_ino))
        /* --rm would drop the record that says where the RAM file is, and leave the file
         * (tmpfs: memory) for good; a VM without one (paused, suspended) has nothing there */
        rc = vmsnap_err_set(err, EINVAL,
                            "VM '%s' keeps its RAM in %s, not %s: give the --ram-dir "
                            "(VMSNAP_RAM_DIR) it was started with, so that --rm removes it",
                            name, vm_cfg_str(cfg, "ram_path"), c.ram);
    if (rc == 0)
        rc = vm_vmm_from_cfg(&c, cfg, &v, err);
    struct vmsnap_err ae = {0};
    if (rc == 0 && timeout && ask_guest(&c, v, timeout, &off, &ae) < 0)
        /* the wait interrupted (Ctrl-C, the daemon's deadline or shutdown), or QEMU gone or
         * mute meanwhile: the stop goes on, hard, rather than leave a VM half-stopped */
        vlog(VMSNAP_LOG_WARN, "VM '%s': %s: stopped hard", name, ae.msg);
    if (rc == 0) /* (gone already when the guest powered off: its files are removed) */
        rc = vmsnap_vmm_stop(v, err);
    if (rc == 0 && graceful)
        *graceful = off;
    char pend[PATH_LEN];
    bool pending = false;
    if (rc == 0 && !remove) { /* before the RAM file goes: it may be the newest state */
        pending = vm_recover_interrupted(&c, pend) != NULL;
        /* the record as the recovery left it (the generation of a checkpoint it completed: the
         * one read before was saved over it, and a resume then took the store's older set for
         * the newest) */
        json_object *now = NULL;
        if (vm_cfg_load(c.cfgpath, &now, NULL) == 0) {
            json_object_put(cfg);
            cfg = now;
        }
    }
    if (rc == 0) {
        /* the RAM file is always the one this VM's name gives (c.ram): a record naming
         * another path is not followed (an on-demand VM maps its image from its directory) */
        const char *rec = vm_cfg_str(cfg, "ram_path");
        if (vm_cfg_bool(cfg, "ram_shared") && rec && !vm_same_path(rec, c.ram))
            vlog(VMSNAP_LOG_WARN,
                 "VM '%s': its record names %s as its RAM; not removed (give the --ram-dir it "
                 "was started with)",
                 name, rec);
        if (pending) { /* the RAM file, and the stage if that is where the state is, stay */
            vlog(VMSNAP_LOG_WARN,
                 "VM '%s': keeping %s and %s, the state of a pause or suspend whose checkpoint "
                 "could not be completed (%s): 'vmsnap vm resume %s' completes it once that is "
                 "fixed",
                 name, pend, c.ram, c.rerr.code ? c.rerr.msg : "see above", name);
        } else {
            unlink(c.ram);
            if (remove || !vm_stage_unsaved(&c))
                vm_unstage(&c);
            else
                vlog(VMSNAP_LOG_WARN, "VM '%s': keeping %s, the only copy of its last snapshot",
                     name, c.stage);
        }
        const char *s = vm_cfg_str(cfg, "status");
        if (vm_status_live(s)) {
            vm_cfg_set_str(cfg, "status", "stopped");
            rc = vm_cfg_save(c.cfgpath, cfg, err);
        }
        if (remove) {
            int r = vm_rm_rf(c.vmdir);
            rc = r < 0 ? err_code(err, -r, "remove %s", c.vmdir) : 0;
        }
    }
    if (rc < 0)
        vmsnap_err_wrap(err, "vm stop %s: ", name);
    vmsnap_vmm_free(v);
    json_object_put(cfg);
    vm_ctx_fini(&c);
    return rc;
}
