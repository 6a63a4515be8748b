/* SPDX-License-Identifier: Apache-2.0 */
/* The restore side: vm resume from the local checkpoint, the stage, or a snapshot set at a URL. */
#include "vm_int.h"

#include "sys/sys.h"
#include "util/util.h"
#include "vmsnap/pcache.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <time.h>
#include <unistd.h>

/* A live VM that QEMU stopped on a failed disk write (io-error): continue it, so the guest
 * retries the write, once its disk's filesystem has room again. */
static int resume_io_error(struct vmctx *c, json_object *rec, struct vmsnap_vm_timing *t,
                           double *t0, struct vmsnap_err *err)
{
    struct vmsnap_vmm *v = NULL;
    enum vmsnap_vmm_state st = VMSNAP_VMM_RUNNING; /* after the cont, until seen otherwise */
    int rc = vm_vmm_from_cfg(c, rec, &v, err);
    if (rc == 0)
        rc = vmsnap_vmm_resume(v, err);
    /* a write that fails again stops it again (virtio-blk retries it at once): watched for
     * 0.5 s, in 50 ms steps */
    for (int i = 0; rc == 0 && i < 10 && st != VMSNAP_VMM_IO_ERROR; i++) {
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
        rc = vmsnap_vmm_state(v, &st, NULL, err);
    }
    vmsnap_vmm_free(v);
    if (rc == 0 && st == VMSNAP_VMM_IO_ERROR) {
        struct statfs sf;
        unsigned long long fk =
            statfs(c->vmdir, &sf) == 0 ? (unsigned long long)sf.f_bavail * sf.f_bsize >> 10 : 0;
        return vmsnap_err_set(err, ENOSPC,
                              "VM '%s' stopped again on a failed write to its disk %s (%llu KiB "
                              "free there): make room, then resume it again (or pause or suspend "
                              "it: the checkpoint keeps the write)",
                              c->name, c->disk, fk);
    }
    if (rc == 0 && st != VMSNAP_VMM_RUNNING)
        rc = vmsnap_err_set(err, EIO, "VM '%s' is %s after being continued from io-error", c->name,
                            vmsnap_vmm_state_name(st));
    if (rc < 0)
        return rc;
    vm_step(t, "resume", t0);
    vlog(VMSNAP_LOG_WARN, "VM '%s': continued after a failed disk write (io-error), retried now",
         c->name);
    vm_cfg_set_str(rec, "status", "running");
    return vm_cfg_save(c->cfgpath, rec, err);
}

/* `path` (absolute) resolved is a regular file under one of the colon-separated directories
 * `dirs`; its resolved form in rp (PATH_MAX bytes), which is what QEMU gets and vm.json keeps,
 * so no later change of a symlink on the way redirects it. */
static bool under_asset_dir(const char *path, const char *dirs, char *rp)
{
    char rd[PATH_MAX];
    struct stat sb;
    if (path[0] != '/' || !realpath(path, rp) || stat(rp, &sb) < 0 || !S_ISREG(sb.st_mode))
        return false;
    for (const char *d = dirs; d && *d;) {
        const char *e = strchr(d, ':');
        size_t n = e ? (size_t)(e - d) : strlen(d);
        char one[PATH_MAX];
        if (n > 0 && n < sizeof(one)) {
            memcpy(one, d, n);
            one[n] = 0;
            size_t l;
            if (realpath(one, rd) && (l = strlen(rd)) > 0 &&
                (!strcmp(rd, "/") || (!strncmp(rp, rd, l) && rp[l] == '/')))
                return true;
        }
        d = e ? e + 1 : d + n;
    }
    return false;
}

/* The kernel and initrd a VM resumed from a store runs with. The set's config.json may come
 * from anywhere the store's writers are: naming /etc/shadow as the initrd would hand that file
 * to the guest (QEMU serves it through fw_cfg). So: the caller's --kernel/--initrd, else this
 * node's own record of the VM, else the set's, only under the node's asset directories. */
static int trust_assets(const struct vmctx *c, json_object *cfg, json_object *old,
                        struct vmsnap_err *err)
{
    const struct vmsnap_vm_opts *o = c->o;
    const char *dirs = o && o->asset_dirs ? o->asset_dirs : getenv("VMSNAP_ASSET_DIRS");
    static const char *const keys[] = {"kernel", "initrd"};
    for (int k = 0; k < 2; k++) {
        const char *mine = !o ? NULL : k ? o->initrd : o->kernel;
        if (mine) {
            vm_cfg_set_str(cfg, keys[k], mine);
            continue;
        }
        if (old && vm_cfg_str(old, "kernel")) { /* a VM this node ran or resumed before */
            vm_cfg_set_str(cfg, keys[k], vm_cfg_str(old, keys[k]));
            continue;
        }
        const char *theirs = vm_cfg_str(cfg, keys[k]);
        if (!theirs)
            continue;
        if (!dirs || !*dirs)
            return vmsnap_err_set(err, EPERM,
                                  "the snapshot names %s %s, and this node has no asset directory "
                                  "to trust it under: set VMSNAP_ASSET_DIRS (or --asset-dir), or "
                                  "give --kernel and --initrd",
                                  keys[k], theirs);
        char rp[PATH_MAX];
        if (!under_asset_dir(theirs, dirs, rp))
            return vmsnap_err_set(err, EPERM,
                                  "the snapshot names %s %s, which is not a file under the asset "
                                  "directories %s: refusing it",
                                  keys[k], theirs, dirs);
        vm_cfg_set_str(cfg, keys[k], rp);
    }
    return 0;
}

int vmsnap_vm_resume(const struct vmsnap_vm_opts *o, const char *name, const char *url,
                     struct vmsnap_vm_timing *t, struct vmsnap_err *err)
{
    double t0 = mono_now(), tstart = t0;
    struct vmctx c;
    json_object *cfg = NULL, *old = NULL;
    struct vmsnap_vmm *v = NULL;
    bool created = false, ram_made = false, disk_made = false, restored = false, had_prev = false;
    bool provisional = false, replaced_record = false;
    char disk_prev[PATH_LEN] = "";
    bool on_demand = o && o->on_demand;
    char src[PATH_LEN] = "", p[PATH_LEN];
    char mark[PATH_LEN] = ""; /* the stage's unsaved mark, once removed for the guest to run */
    char *url_copy = NULL;
    int rc = vm_ctx_init(&c, o, name, err);
    if (rc < 0)
        return rc;
    rc = vm_check_ram_dir(&c, err);
    if (rc < 0)
        goto out;
    if (!vm_exists(c.vmdir)) {
        if (!url) {
            rc = vmsnap_err_set(err, ENOENT,
                                "no VM named '%s' under %s (give the URL it was "
                                "suspended to)",
                                name, c.state);
            goto out;
        }
        char vms[PATH_LEN];
        if (vm_pcat(vms, c.state, "/vms") < 0)
            return vmsnap_err_set(err, ENAMETOOLONG, "path %s too long", c.state);
        rc = vm_mkdir_p(vms, err);
        if (rc == 0 && mkdir(c.vmdir, 0700) < 0)
            rc = err_sys(err, "mkdir %s", c.vmdir);
        if (rc < 0)
            goto out;
        created = true;
    }
    rc = vm_ctx_lock(&c, err);
    if (rc < 0)
        goto out;
    if (!created && vm_exists(c.cfgpath)) {
        /* a pause or suspend killed or failed after QEMU stopped: completed, or refused */
        json_object *rec = NULL;
        enum vmsnap_vmm_state st0;
        const char *pend = NULL;
        if (vm_cfg_load(c.cfgpath, &rec, NULL) == 0 &&
            vm_state(&c, rec, 0, &st0, NULL, NULL) == 0 && st0 == VMSNAP_VMM_DEAD)
            pend = vm_recover_interrupted(&c, p);
        json_object_put(rec);
        if (pend && !(o && o->force)) {
            rc = vm_pending_error(&c, pend,
                                  ", or give --force to resume from the previous checkpoint and "
                                  "discard it",
                                  err);
            goto out;
        }
        if (pend) { /* --force: the RAM file is about to be replaced, the state goes with it */
            vlog(VMSNAP_LOG_WARN, "VM '%s': discarding the incomplete state in %s (--force)", name,
                 pend);
            if (!strcmp(pend, c.stage))
                vm_unstage(&c);
            else
                vm_rm_rf(pend);
            unlink(c.ram);
        }
    }
    /* A snapshot only in the stage (its suspend could store it nowhere) is the VM's latest:
     * a resume without a URL restores it (its image renamed into place as RAM), one with a URL
     * would lose it. */
    bool from_stage = vm_stage_unsaved(&c);
    if (from_stage && url && vm_stage_stored_at(&c, url)) {
        vlog(VMSNAP_LOG_INFO, "VM '%s': the snapshot in %s is stored at %s: resuming from there",
             name, c.stage, url);
        from_stage = false; /* the pull replaces the stage */
    }
    if (from_stage && (url || on_demand)) {
        rc = vmsnap_err_set(err, EEXIST,
                            "VM '%s' has a snapshot that its last suspend could not store, only "
                            "in %s: resume it from there ('vmsnap vm resume %s', eagerly) or store "
                            "it with 'vmsnap vm suspend %s URL' (or remove that directory to "
                            "discard it)",
                            name, c.stage, name, name);
        goto out;
    }
    if (!created && vm_exists(c.cfgpath) && (rc = vm_cfg_load(c.cfgpath, &old, err)) < 0) {
        /* without the record it cannot tell whether the VM's QEMU still runs */
        vmsnap_err_wrap(err, "VM '%s' has an unreadable record (restore or remove %s): ", name,
                        c.vmdir);
        goto out;
    }
    if (old) {
        enum vmsnap_vmm_state st;
        /* 1: the record cannot describe a QEMU (nothing to ask); < 0: its QEMU runs and did
         * not answer */
        struct vmsnap_vmm *sv = NULL;
        int vrc =
            vm_vmm_from_cfg(&c, old, &sv, NULL) == 0 ? vmsnap_vmm_state(sv, &st, NULL, err) : 1;
        vmsnap_vmm_free(sv);
        if (vrc < 0) {
            /* its QEMU runs but does not answer (its monitor busy with another client, or the
             * process stopped): resuming would remove the RAM file that QEMU still runs on */
            rc = vrc;
            vmsnap_err_wrap(err,
                            "VM '%s': cannot tell whether its QEMU still runs the guest, so it is "
                            "not resumed ('vmsnap vm stop %s' ends that QEMU): ",
                            name, name);
            goto out;
        }
        if (vrc == 0 && st == VMSNAP_VMM_IO_ERROR && !url && !on_demand) {
            rc = resume_io_error(&c, old, t, &t0, err);
            goto out;
        }
        if (vrc == 0 && st == VMSNAP_VMM_PAUSED) {
            rc = vmsnap_err_set(err, EBUSY,
                                "VM '%s' is frozen: its QEMU holds the guest stopped (a resume "
                                "killed after the restore, or a pause killed after it stopped "
                                "the guest): 'vmsnap vm pause %s' checkpoints that state, then "
                                "resume it; or 'vmsnap vm stop %s' and resume again",
                                name, name, name);
            goto out;
        }
        if (vrc == 0 && st != VMSNAP_VMM_DEAD) {
            rc = vmsnap_err_set(err, EBUSY, "VM '%s' is %s: pause, suspend or stop it first", name,
                                vmsnap_vmm_state_name(st));
            goto out;
        }
        /* No local checkpoint but a known store URL (suspended, or resumed from a store): the
         * last checkpoint is there. */
        if (!url && !from_stage && !vm_exists(c.ckpt) && vm_cfg_str(old, "url")) {
            url_copy = strdup(vm_cfg_str(old, "url"));
            url = url_copy;
        }
    }
    if (from_stage) {
        snprintf(src, sizeof(src), "%s", c.stage);
        const char *missing = vm_snapshot_missing(c.stage);
        if (missing) {
            rc = vmsnap_err_set(err, EIO,
                                "VM '%s': the snapshot kept in %s is incomplete (no %s): it "
                                "cannot be restored",
                                name, c.stage, missing);
            goto out;
        }
    } else if (!url) {
        snprintf(src, sizeof(src), "%s", c.ckpt);
        if (!vm_exists(c.ckpt)) {
            rc = vmsnap_err_set(err, ENOENT,
                                "VM '%s' has no local checkpoint in %s: resume it from a store "
                                "('vmsnap vm resume %s URL') or remove it ('vmsnap vm stop "
                                "--rm %s')",
                                name, c.ckpt, name, name);
            goto out;
        }
    } else {
        /* Eager: decode straight into tmpfs, where memory-ranges becomes guest RAM by a rename.
         * On demand: the image stays mapped for the VM's life, so it goes to disk. */
        snprintf(src, sizeof(src), "%s", on_demand ? c.ondemand : c.stage);
        /* An old on-demand image there belongs to a dead process: replacing it is safe. The
         * directory is made here, 0700: the stage's name in a world-writable RAM directory is
         * predictable, and a directory someone else made in its place is refused. */
        vm_rm_rf(src);
        if (mkdir(src, 0700) < 0) {
            rc = err_sys(err, "mkdir %s", src);
            goto out;
        }
        struct vmsnap_xfer_opts xo = {0};
        if (o && o->xfer)
            xo = *o->xfer;
        xo.set_only = true; /* a VM is a set (a single object pulled here failed at a rename) */
        rc = vmsnap_xfer_pull(url, src, &xo, NULL, err);
        if (rc < 0) {
            vm_rm_rf(src);
            vmsnap_err_wrap(err, "pull %s (the snapshot there is untouched): ", url);
            goto out;
        }
        vm_step(t, "download", &t0);
    }
    rc = vm_pjoin(p, src, "config.json", err);
    if (rc == 0)
        rc = vm_cfg_load(p, &cfg, err);
    if (rc == 0 && url) {
        char shown[PATH_LEN];
        snprintf(shown, sizeof(shown), "%s/config.json", url);
        rc = vm_check_set_cfg(p, shown, cfg, err);
    }
    if (rc < 0)
        goto out_src;
    if (vm_cfg_int(cfg, "memory") <= 0 || !vm_cfg_str(cfg, "kernel")) {
        rc = vmsnap_err_set(err, EINVAL, "%s: no memory size or kernel", p);
        goto out_src;
    }
    if (url && (rc = trust_assets(&c, cfg, old, err)) < 0)
        goto out_src;
    if (url && vm_exists(c.ckpt) && !(o && o->force)) {
        /* the local checkpoint is superseded (removed) by this resume: not if it is newer */
        json_object *lc = NULL;
        char lp[PATH_LEN];
        if (vm_pjoin(lp, c.ckpt, "config.json", NULL) == 0 && vm_cfg_load(lp, &lc, NULL) == 0) {
            const char *lb = vm_cfg_str(lc, "base_id"), *sb = vm_cfg_str(cfg, "base_id");
            int64_t lg = vm_cfg_int(lc, "generation"), sg = vm_cfg_int(cfg, "generation");
            if (lb && sb && !strcmp(lb, sb) && lg > sg)
                rc = vmsnap_err_set(err, EEXIST,
                                    "the local checkpoint %s is newer than the snapshot at %s "
                                    "(generation %lld > %lld of the same VM) and this resume "
                                    "would replace it: resume without a URL, or give --force",
                                    c.ckpt, url, (long long)lg, (long long)(sg > 0 ? sg : 0));
            else if (lb && sb && strcmp(lb, sb))
                rc = vmsnap_err_set(err, EEXIST,
                                    "the local checkpoint %s is of another VM (base id %s) than "
                                    "the snapshot at %s (base id %s) and this resume would "
                                    "replace it: resume '%s' without a URL, resume the snapshot "
                                    "under another name, or give --force",
                                    c.ckpt, lb, url, sb, name);
        }
        json_object_put(lc);
        if (rc < 0)
            goto out_src;
    }
    if (url && old && !(o && o->force)) {
        /* the node's record of this VM names a later checkpoint of the same lineage (it was
         * suspended or paused after the snapshot at `url` was taken): resuming would go back */
        const char *rb = vm_cfg_str(old, "base_id"), *sb = vm_cfg_str(cfg, "base_id");
        int64_t rg = vm_cfg_int(old, "generation"), sg = vm_cfg_int(cfg, "generation");
        const char *ru = vm_cfg_str(old, "url");
        if (rb && sb && !strcmp(rb, sb) && rg > sg) {
            rc = vmsnap_err_set(err, EEXIST,
                                "VM '%s' has a later checkpoint (generation %lld%s%s) than the "
                                "snapshot at %s (generation %lld): resuming it would go back; "
                                "resume %s, or give --force",
                                name, (long long)rg, ru ? ", at " : "", ru ? ru : "", url,
                                (long long)(sg > 0 ? sg : 0),
                                ru ? "from that URL" : "without a URL");
            goto out_src;
        }
    }
    const char *sacc = vm_cfg_str(cfg, "accel");
    if (sacc && strcmp(sacc, "kvm") && strcmp(sacc, "tcg")) {
        rc = vmsnap_err_set(err, EINVAL, "%s: accelerator '%s' is neither kvm nor tcg", p, sacc);
        goto out_src;
    }
    {
        /* the memory image is the guest RAM file: exactly the VM's memory, or a set could
         * leave a RAM file of any size on the tmpfs for the VM's life */
        char mr[PATH_LEN];
        struct stat ms;
        rc = vm_pjoin(mr, src, "memory-ranges", err);
        if (rc == 0 && stat(mr, &ms) < 0)
            rc = err_sys(err, "%s", mr);
        if (rc == 0 && (uint64_t)ms.st_size != (uint64_t)vm_cfg_int(cfg, "memory"))
            rc = vmsnap_err_set(err, EINVAL,
                                "%s: the memory image holds %llu bytes, the VM's memory is %llu: "
                                "refusing it",
                                mr, (unsigned long long)ms.st_size,
                                (unsigned long long)vm_cfg_int(cfg, "memory"));
        if (rc < 0)
            goto out_src;
    }

    /* Stage: clone the disk out, place the RAM, rewrite the node-local paths. A live disk
     * already there (a stopped VM's) is set aside and put back if this resume fails. */
    rc = vm_pcat(disk_prev, c.disk, ".prev") < 0
             ? vmsnap_err_set(err, ENAMETOOLONG, "path too long")
             : vm_pjoin(p, src, DISK_CKPT, err);
    if (rc < 0)
        goto out_src;
    if (vm_exists(disk_prev) && rename(disk_prev, c.disk) < 0) { /* left by a crashed resume */
        rc = err_sys(err, "rename %s to %s", disk_prev, c.disk);
        goto out_src;
    }
    if (vm_exists(c.disk)) {
        if (rename(c.disk, disk_prev) < 0) {
            rc = err_sys(err, "rename %s to %s", c.disk, disk_prev);
            goto out_src;
        }
        had_prev = true;
    }
    disk_made = true;
    rc = vm_sparse_copy(p, c.disk, err);
    if (rc < 0)
        goto out_src;
    char ram[PATH_LEN], img[PATH_LEN];
    rc = vm_pjoin(img, src, "memory-ranges", err);
    if (rc < 0)
        goto out_src;
    unlink(c.ram);
    if (on_demand) {
        snprintf(ram, sizeof(ram), "%s", img);
    } else {
        snprintf(ram, sizeof(ram), "%s", c.ram);
        if (from_stage && vm_same_fs(img, c.ram_dir)) {
            /* a second name: the stage stays whole (its only copy) until the VM runs */
            if (link(img, c.ram) < 0) {
                rc = err_sys(err, "link %s to %s", img, c.ram);
                goto out_src;
            }
        } else if (url && vm_same_fs(img, c.ram_dir)) {
            if (rename(img, c.ram) < 0) {
                rc = err_sys(err, "rename %s to %s", img, c.ram);
                goto out_src;
            }
        } else {
            /* room first: a copy that fills the RAM directory fails half way with ENOSPC
             * instead of saying what the guest needs there */
            rc = vm_ram_room(&c, vm_cfg_int(cfg, "memory"), err);
            if (rc == 0)
                rc = vm_image_copy(&c, img, c.ram, err);
            if (rc < 0)
                goto out_src;
        }
        ram_made = true;
    }
    rc = vm_config_rewrite(cfg, c.disk, ram, c.vmdir, err);
    if (rc < 0)
        goto out_src;
    json_object_object_add(cfg, "ram_shared", json_object_new_boolean(!on_demand));
    vm_cfg_set_str(cfg, "name", name);
    if (!vm_cfg_str(cfg, "accel") || (o && o->accel)) {
        const char *accel;
        rc = vmsnap_vmm_pick_accel(o ? o->accel : NULL, &accel, err);
        if (rc < 0)
            goto out_src;
        vm_cfg_set_str(cfg, "accel", accel);
    }
    if (!on_demand && (rc = vm_ram_room(&c, vm_cfg_int(cfg, "memory"), err)) < 0)
        goto out_src;
    vm_step(t, "stage", &t0);

    /* The record before QEMU starts: for a VM the node did not know, a resume killed from here
     * on leaves a VM that 'vm ls' shows and 'vm stop' can stop (the record goes if the resume
     * fails); for a known VM it describes the QEMU about to start (an on-demand restore has no
     * RAM file: a resume killed after the restore left the old eager record, and the documented
     * 'vm pause' of that frozen VM looked for a RAM file that was not there), and the old record
     * comes back if the resume fails. The URL says where the VM is, should this be killed. */
    vm_cfg_set_str(cfg, "status", "restoring");
    vm_cfg_set_str(cfg, "url", url ? url : (old ? vm_cfg_str(old, "url") : NULL));
    if ((rc = vm_cfg_save(c.cfgpath, cfg, err)) < 0)
        goto out_src;
    if (created || !old)
        provisional = true;
    else
        replaced_record = true;
    /* a cancel (SIGINT) before the restore: the ordinary failure path undoes the staging */
    if ((rc = cancel_check(err)) < 0)
        goto out_src;
    sys_failpoint("resume-before-restore");
    rc = vm_vmm_from_cfg(&c, cfg, &v, err);
    if (rc == 0)
        rc = vmsnap_vmm_restore(v, src, err);
    if (rc < 0)
        goto out_src;
    restored = true;
    sys_failpoint("resume-restored");
    vm_step(t, "restore", &t0);

    /* Release the restore files: pulled ones are truncated (the privately mapped image of an
     * on-demand VM excepted), the local checkpoint is only evicted (it stays the latest). */
    if (url) {
        const char *keep[] = {"memory-ranges", NULL};
        struct vmsnap_err e2;
        if (!on_demand || !(o && o->no_evict)) {
            if (vmsnap_pcache_release_dir(src, on_demand ? keep : NULL, NULL, NULL, &e2) < 0)
                vlog(VMSNAP_LOG_WARN, "release %s: %s", src, e2.msg);
        }
        if (!on_demand)
            vm_rm_rf(src);
    } else if (!from_stage && !(o && o->no_evict)) { /* the stage is tmpfs: nothing to evict */
        struct vmsnap_err e2;
        if (vmsnap_pcache_evict(c.ckpt, NULL, NULL, &e2) < 0)
            vlog(VMSNAP_LOG_WARN, "evict %s: %s", c.ckpt, e2.msg);
    }
    if (!on_demand || !url)
        vm_rm_rf(c.ondemand);
    vm_step(t, "evict", &t0);

    /* The guest is about to run on the stage's image: from here the stage is no snapshot. */
    if (from_stage && vm_pcat(mark, c.stage, "/" UNSAVED_MARK) == 0)
        unlink(mark);
    /* The record describes the QEMU that now holds the VM (RAM file, on-demand or not): it is
     * saved before the guest runs, so a resume killed from here on leaves a record that a later
     * pause can trust (an old record of an eager VM would make it look for a RAM file an
     * on-demand one does not have, after QEMU was stopped). */
    json_object_object_del(cfg, "ram_in_state");
    vm_cfg_set_str(cfg, "status", "running");
    vm_cfg_set_str(cfg, "url", url ? url : (old ? vm_cfg_str(old, "url") : NULL));
    if ((rc = vm_cfg_save(c.cfgpath, cfg, err)) < 0)
        goto out_src;
    rc = vmsnap_vmm_resume(v, err);
    if (rc < 0 && from_stage) {
        /* 'cont' may have reached QEMU with its answer lost: a guest that runs, or may run, on
         * the stage's image makes the stage no snapshot (its memory newer than its device
         * state), so it is not marked unsaved again */
        enum vmsnap_vmm_state st;
        struct vmsnap_err e2;
        int src2 = vmsnap_vmm_state(v, &st, NULL, &e2);
        if (src2 == 0 && st == VMSNAP_VMM_RUNNING) {
            vlog(VMSNAP_LOG_WARN, "VM '%s': 'cont' failed (%s) but the guest runs: resumed", name,
                 err ? err->msg : "?");
            rc = 0;
        } else if (src2 < 0 || st != VMSNAP_VMM_PAUSED) {
            mark[0] = '\0';
            vm_stage_consumed(&c);
            vmsnap_err_wrap(err,
                            "the guest may have run on the snapshot in %s, which is no longer "
                            "one (kept for inspection): ",
                            c.stage);
        }
    }
    if (rc < 0)
        goto out_src; /* (the old record comes back there) */
    /* The guest runs on the stage's image: its complete and taking marks go at once (a resume
     * killed before the stage was removed left one that the next command's recovery marked
     * unsaved again: memory newer than its device state, a torn set that QEMU refused to load
     * and a suspend pushed). Before 'cont' they must stay: a resume killed there leaves a
     * frozen QEMU and the stage, still the snapshot, that 'vm stop' must keep. */
    if (from_stage)
        vm_stage_consumed(&c);
    vm_step(t, "resume", &t0);
    sys_failpoint("resume-running"); /* the guest runs; nothing cleaned up yet */
    if (url)
        vm_rm_rf(c.ckpt); /* superseded by the store's snapshot, now that the VM runs from it */
    if (from_stage)
        vm_rm_rf(c.stage); /* its image is the RAM file now; the VM runs */
    if (had_prev)
        unlink(disk_prev);
    goto out;
out_src:
    if (restored && v)
        vmsnap_vmm_stop(v, NULL);
    if (mark[0])
        vm_mark_unsaved(&c, NULL); /* the guest did not run: the stage is the snapshot again */
    if (ram_made) /* from the stage, a second name of its image, which stays there */
        unlink(c.ram);
    if (disk_made) { /* the live disk that was there before, if any, comes back */
        unlink(c.disk);
        if (had_prev && rename(disk_prev, c.disk) < 0)
            vlog(VMSNAP_LOG_WARN, "put back %s as %s: %s", disk_prev, c.disk, strerror(errno));
    }
    if (url)
        vm_rm_rf(src);
    if (provisional && !created)
        unlink(c.cfgpath);
    if (replaced_record && vm_cfg_save(c.cfgpath, old, NULL) < 0)
        vlog(VMSNAP_LOG_WARN, "VM '%s': could not put its record %s back", name, c.cfgpath);
out:
    if (rc < 0 && created)
        vm_rm_rf(c.vmdir);
    if (rc < 0)
        vmsnap_err_wrap(err, "vm resume %s: ", name);
    if (t)
        t->total = mono_now() - tstart;
    free(url_copy);
    vmsnap_vmm_free(v);
    json_object_put(cfg);
    json_object_put(old);
    vm_ctx_fini(&c);
    return rc;
}
