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

/*
 * vm resume is a sequence of phases over one struct resume (resume_phases below): open, pick
 * the stage, check the live QEMU, pick the source, load and check the config (lineage, image),
 * stage, restore, run. Each phase returns < 0 on failure, 0 to go on, 1 when the resume is done
 * early (a VM continued after io-error). How far it got is r->done: on failure resume_undo()
 * takes that back in reverse, and the snapshot the resume came from stays as it was.
 */

/* What a failed resume undoes, in the order it was done (resume_undo goes backwards). */
enum resume_done {
    RESUMED_NOTHING,  /* nothing of the VM was changed (a VM directory this resume made goes) */
    RESUMED_PULL_DIR, /* the directory the set is pulled into was made: it goes */
    RESUMED_DISK,     /* the disk is cloned out: it goes, and a live disk set aside comes back */
    RESUMED_RAM,      /* the guest RAM file is in place (eager): it goes */
    RESUMED_RECORD,   /* the record says "restoring": the old one comes back, or none is left */
    RESUMED_QEMU,     /* a QEMU holds the restored VM, paused: it is stopped */
};

/* Where the snapshot comes from. */
enum resume_from {
    FROM_CHECKPOINT, /* the local checkpoint */
    FROM_STAGE,      /* the stage: a snapshot its suspend could store nowhere */
    FROM_STORE,      /* the snapshot set at r->url, pulled into r->src */
};

struct resume {
    struct vmctx c;
    const struct vmsnap_vm_opts *o;
    const char *name;
    const char *url; /* the URL given, or (no local checkpoint) the one the record names */
    char *url_copy;  /* the record's URL, when url is that */
    struct vmsnap_vm_timing *t;
    double t0;
    bool on_demand;
    bool created; /* this resume made the VM's directory (a VM new to this node) */
    enum resume_from from;
    json_object *old; /* the node's record of the VM, or NULL */
    json_object *cfg; /* the snapshot's config, made this node's */
    struct vmsnap_vmm *v;
    char src[PATH_LEN];       /* the snapshot directory restored from */
    char cfgfile[PATH_LEN];   /* its config.json */
    char disk_prev[PATH_LEN]; /* the VM's live disk, set aside while this resume stages; "" */
    char mark[PATH_LEN];      /* the stage's unsaved mark, once removed for the guest to run */
    enum resume_done done;
};

/* The URL the record gets: where the VM is, should this resume be killed. */
static const char *resume_url(const struct resume *r)
{
    return r->url ? r->url : (r->old ? vm_cfg_str(r->old, "url") : NULL);
}

/* A pause or suspend killed or failed after QEMU stopped: completed, or refused (--force: its
 * state discarded). */
static int resume_recover(struct resume *r, struct vmsnap_err *err)
{
    struct vmctx *c = &r->c;
    json_object *rec = NULL;
    enum vmsnap_vmm_state st0;
    const char *pend = NULL;
    char p[PATH_LEN];
    if (vm_cfg_load(c->cfgpath, &rec, NULL) == 0 && vm_state(c, rec, 0, &st0, NULL, NULL) == 0 &&
        st0 == VMSNAP_VMM_DEAD)
        pend = vm_recover_interrupted(c, p);
    json_object_put(rec);
    if (pend && !(r->o && r->o->force))
        return vm_pending_error(c, pend,
                                ", or give --force to resume from the previous checkpoint and "
                                "discard it",
                                err);
    if (pend) { /* --force: the RAM file is about to be replaced, the state goes with it */
        vlog(VMSNAP_LOG_WARN, "VM '%s': discarding the incomplete state in %s (--force)", r->name,
             pend);
        if (!strcmp(pend, c->stage))
            vm_unstage(c);
        else
            vm_rm_snapshot_dir(pend);
        unlink(c->ram);
    }
    return 0;
}

/* Open: the RAM directory checked, the VM's directory made when this node does not know the VM
 * (a URL is needed then), its lock taken, and what an interrupted command left completed. */
static int resume_open(struct resume *r, struct vmsnap_err *err)
{
    struct vmctx *c = &r->c;
    int rc = vm_check_ram_dir(c, err);
    if (rc < 0)
        return rc;
    if (!vm_exists(c->vmdir)) {
        if (!r->url)
            return vmsnap_err_set(err, ENOENT,
                                  "no VM named '%s' under %s (give the URL it was "
                                  "suspended to)",
                                  r->name, c->state);
        char vms[PATH_LEN];
        if (vm_pcat(vms, c->state, "/vms") < 0)
            return vmsnap_err_set(err, ENAMETOOLONG, "path %s too long", c->state);
        rc = vm_mkdir_p(vms, err);
        if (rc == 0 && mkdir(c->vmdir, 0700) < 0)
            rc = err_sys(err, "mkdir %s", c->vmdir);
        if (rc < 0)
            return rc;
        r->created = true;
    }
    rc = vm_ctx_lock(c, err);
    if (rc == 0 && !r->created && vm_exists(c->cfgpath))
        rc = resume_recover(r, err);
    return rc;
}

/* Pick the stage: a snapshot only in the stage (its suspend could store it nowhere) is the VM's
 * latest: a resume without a URL restores it (its image renamed into place as RAM), one with a
 * URL would lose it. Decided first, before the record is read. */
static int resume_pick_stage(struct resume *r, struct vmsnap_err *err)
{
    struct vmctx *c = &r->c;
    bool from_stage = vm_stage_unsaved(c);
    if (from_stage && r->url && vm_stage_stored_at(c, r->url)) {
        vlog(VMSNAP_LOG_INFO, "VM '%s': the snapshot in %s is stored at %s: resuming from there",
             r->name, c->stage, r->url);
        from_stage = false; /* the pull replaces the stage */
    }
    if (from_stage && (r->url || r->on_demand))
        return vmsnap_err_set(err, EEXIST,
                              "VM '%s' has a snapshot that its last suspend could not store, only "
                              "in %s: resume it from there ('vmsnap vm resume %s', eagerly) or "
                              "store it with 'vmsnap vm suspend %s URL' (or remove that directory "
                              "to discard it)",
                              r->name, c->stage, r->name, r->name);
    if (from_stage)
        r->from = FROM_STAGE;
    return 0;
}

/* Check the live QEMU: the node's record of the VM read, and its QEMU, if any, asked. A VM that
 * runs, is frozen or does not answer is not resumed; one that QEMU stopped on a failed disk
 * write is continued (1: done). */
static int resume_check_live(struct resume *r, struct vmsnap_err *err)
{
    struct vmctx *c = &r->c;
    int rc;
    if (!r->created && vm_exists(c->cfgpath) && (rc = vm_cfg_load(c->cfgpath, &r->old, err)) < 0) {
        /* without the record it cannot tell whether the VM's QEMU still runs */
        vmsnap_err_wrap(err, "VM '%s' has an unreadable record (restore or remove %s): ", r->name,
                        c->vmdir);
        return rc;
    }
    if (!r->old)
        return 0;
    enum vmsnap_vmm_state st;
    /* 1: the record cannot describe a QEMU (nothing to ask); < 0: its QEMU runs and did
     * not answer */
    struct vmsnap_vmm *sv = NULL;
    int vrc = vm_vmm_from_cfg(c, r->old, &sv, NULL) == 0 ? vmsnap_vmm_state(sv, &st, NULL, err) : 1;
    if (vrc == 0 && st == VMSNAP_VMM_INCOMING) {
        /* a resume killed while its QEMU waited for the state (nothing else makes one: the
         * lock says no resume runs now): the guest never ran there, so that QEMU goes and this
         * resume starts from the same source again */
        vlog(VMSNAP_LOG_WARN,
             "VM '%s': stopping the QEMU a killed resume left waiting for its state", r->name);
        rc = vmsnap_vmm_stop(sv, err);
        vmsnap_vmm_free(sv);
        if (rc < 0)
            return vmsnap_err_wrap(err, "VM '%s': stop the QEMU a killed resume left: ", r->name);
        return 0;
    }
    vmsnap_vmm_free(sv);
    if (vrc < 0) {
        /* its QEMU runs but does not answer (its monitor busy with another client, or the
         * process stopped): resuming would remove the RAM file that QEMU still runs on */
        vmsnap_err_wrap(err,
                        "VM '%s': cannot tell whether its QEMU still runs the guest, so it is "
                        "not resumed ('vmsnap vm stop %s' ends that QEMU): ",
                        r->name, r->name);
        return vrc;
    }
    if (vrc == 0 && st == VMSNAP_VMM_IO_ERROR && !r->url && !r->on_demand) {
        rc = resume_io_error(c, r->old, r->t, &r->t0, err);
        return rc < 0 ? rc : 1;
    }
    if (vrc == 0 && st == VMSNAP_VMM_PAUSED && !r->url && !r->on_demand) {
        /* frozen: a resume killed after the restore, or a pause or suspend killed after it
         * stopped the guest (before or after its migration: QEMU then refuses another, so the
         * pause this used to advise failed). That QEMU holds the VM's newest state: the guest
         * goes on there (1: done). */
        rc = vm_vmm_from_cfg(c, r->old, &sv, err);
        if (rc == 0)
            rc = vm_unfreeze(c, r->old, sv, err);
        vmsnap_vmm_free(sv);
        if (rc < 0)
            return rc;
        vm_step(r->t, "resume", &r->t0);
        return 1;
    }
    if (vrc == 0 && st == VMSNAP_VMM_PAUSED)
        return vmsnap_err_set(err, EBUSY,
                              "VM '%s' is frozen: its QEMU holds the guest stopped (a command "
                              "on it was killed), the VM's newest state: 'vmsnap vm resume %s' "
                              "(no URL) lets it run on; or 'vmsnap vm stop %s' (that state is "
                              "lost) and resume again",
                              r->name, r->name, r->name);
    if (vrc == 0 && st != VMSNAP_VMM_DEAD)
        return vmsnap_err_set(err, EBUSY, "VM '%s' is %s: pause, suspend or stop it first", r->name,
                              vmsnap_vmm_state_name(st));
    return 0;
}

/* Pull the set at r->url into r->src. Eager: decode straight into tmpfs, where memory-ranges
 * becomes guest RAM by a rename. On demand: the image stays mapped for the VM's life, so it
 * goes to disk. */
static int resume_pull(struct resume *r, struct vmsnap_err *err)
{
    snprintf(r->src, sizeof(r->src), "%s", r->on_demand ? r->c.ondemand : r->c.stage);
    /* An old on-demand image there belongs to a dead process: replacing it is safe. The
     * directory is made here, 0700: the stage's name in a world-writable RAM directory is
     * predictable, and a directory someone else made in its place is refused. */
    vm_rm_snapshot_dir(r->src);
    if (mkdir(r->src, 0700) < 0)
        return err_sys(err, "mkdir %s", r->src);
    r->done = RESUMED_PULL_DIR;
    struct vmsnap_xfer_opts xo = {0};
    if (r->o && r->o->xfer)
        xo = *r->o->xfer;
    xo.set_only = true; /* a VM is a set (a single object pulled here failed at a rename) */
    struct vmsnap_xfer_stats xs = {0};
    int rc = vmsnap_xfer_pull(r->url, r->src, &xo, &xs, err);
    if (rc == 0 && r->t) {
        r->t->object_bytes = xs.object_bytes;
        r->t->cached_bytes = xs.cached_bytes;
    }
    if (rc < 0) {
        vmsnap_err_wrap(err, "pull %s (the snapshot there is untouched): ", r->url);
        return rc;
    }
    vm_step(r->t, "download", &r->t0);
    return 0;
}

/* Pick the source: the stage (resume_pick_stage chose it), else the local checkpoint, else the
 * snapshot set at the URL, given or, with no local checkpoint, the one the record names. This
 * is where a resume's source is picked. */
static int resume_pick_source(struct resume *r, struct vmsnap_err *err)
{
    struct vmctx *c = &r->c;
    /* No local checkpoint but a known store URL (suspended, or resumed from a store): the
     * last checkpoint is there. */
    if (r->old && !r->url && r->from != FROM_STAGE && !vm_exists(c->ckpt) &&
        vm_cfg_str(r->old, "url")) {
        r->url_copy = strdup(vm_cfg_str(r->old, "url"));
        r->url = r->url_copy;
    }
    if (r->from == FROM_STAGE) {
        snprintf(r->src, sizeof(r->src), "%s", c->stage);
        const char *missing = vm_snapshot_missing(c->stage);
        if (missing)
            return vmsnap_err_set(err, EIO,
                                  "VM '%s': the snapshot kept in %s is incomplete (no %s): it "
                                  "cannot be restored",
                                  r->name, c->stage, missing);
        return 0;
    }
    if (!r->url) {
        r->from = FROM_CHECKPOINT;
        snprintf(r->src, sizeof(r->src), "%s", c->ckpt);
        if (!vm_exists(c->ckpt))
            return vmsnap_err_set(err, ENOENT,
                                  "VM '%s' has no local checkpoint in %s: resume it from a store "
                                  "('vmsnap vm resume %s URL') or remove it ('vmsnap vm stop "
                                  "--rm %s')",
                                  r->name, c->ckpt, r->name, r->name);
        return 0;
    }
    r->from = FROM_STORE;
    return resume_pull(r, err);
}

/* Load the config: the snapshot's config.json, checked as a VM's config when it comes from a
 * store, with the kernel and initrd this node trusts. */
static int resume_load_config(struct resume *r, struct vmsnap_err *err)
{
    const char *p = r->cfgfile;
    int rc = vm_pjoin(r->cfgfile, r->src, "config.json", err);
    if (rc == 0)
        rc = vm_cfg_load(p, &r->cfg, err);
    if (rc == 0 && r->from == FROM_STORE) {
        char shown[PATH_LEN];
        snprintf(shown, sizeof(shown), "%s/config.json", r->url);
        rc = vm_check_set_cfg(p, shown, r->cfg, err);
    }
    if (rc < 0)
        return rc;
    if (vm_cfg_int(r->cfg, "memory") <= 0 || !vm_cfg_str(r->cfg, "kernel"))
        return vmsnap_err_set(err, EINVAL, "%s: no memory size or kernel", p);
    if (r->from == FROM_STORE)
        return trust_assets(&r->c, r->cfg, r->old, err);
    return 0;
}

/* Check the lineage: a snapshot from a store must not replace a newer local checkpoint of the
 * VM, or one of another VM, nor go back past a later checkpoint the record names (--force
 * does all three). */
static int resume_check_lineage(struct resume *r, struct vmsnap_err *err)
{
    struct vmctx *c = &r->c;
    json_object *cfg = r->cfg;
    int rc = 0;
    if (r->from != FROM_STORE || (r->o && r->o->force))
        return 0;
    if (vm_exists(c->ckpt)) {
        /* the local checkpoint is superseded (removed) by this resume: not if it is newer */
        json_object *lc = NULL;
        char lp[PATH_LEN];
        if (vm_pjoin(lp, c->ckpt, "config.json", NULL) == 0 && vm_cfg_load(lp, &lc, NULL) == 0) {
            const char *lb = vm_cfg_str(lc, "base_id"), *sb = vm_cfg_str(cfg, "base_id");
            int64_t lg = vm_cfg_int(lc, "generation"), sg = vm_cfg_int(cfg, "generation");
            if (lb && sb && !strcmp(lb, sb) && lg > sg)
                rc = vmsnap_err_set(err, EEXIST,
                                    "the local checkpoint %s is newer than the snapshot at %s "
                                    "(generation %lld > %lld of the same VM) and this resume "
                                    "would replace it: resume without a URL, or give --force",
                                    c->ckpt, r->url, (long long)lg, (long long)(sg > 0 ? sg : 0));
            else if (lb && sb && strcmp(lb, sb))
                rc = vmsnap_err_set(err, EEXIST,
                                    "the local checkpoint %s is of another VM (base id %s) than "
                                    "the snapshot at %s (base id %s) and this resume would "
                                    "replace it: resume '%s' without a URL, resume the snapshot "
                                    "under another name, or give --force",
                                    c->ckpt, lb, r->url, sb, r->name);
        }
        json_object_put(lc);
        if (rc < 0)
            return rc;
    }
    if (r->old) {
        /* the node's record of this VM names a later checkpoint of the same lineage (it was
         * suspended or paused after the snapshot at `url` was taken): resuming would go back */
        const char *rb = vm_cfg_str(r->old, "base_id"), *sb = vm_cfg_str(cfg, "base_id");
        int64_t rg = vm_cfg_int(r->old, "generation"), sg = vm_cfg_int(cfg, "generation");
        const char *ru = vm_cfg_str(r->old, "url");
        if (rb && sb && !strcmp(rb, sb) && rg > sg && ru && !strcmp(ru, r->url)) {
            /* the later checkpoint is not where the record says: the URL is that place. It was
             * never stored (a VM resumed from a stage its suspend could not store, then stopped
             * or its QEMU gone), and refusing advised this very resume */
            vlog(VMSNAP_LOG_WARN,
                 "VM '%s' was at generation %lld, but %s holds generation %lld: the later state "
                 "was never stored there (lost with the QEMU that ran it); resuming from %s",
                 r->name, (long long)rg, ru, (long long)(sg > 0 ? sg : 0), ru);
            return 0;
        }
        if (rb && sb && !strcmp(rb, sb) && rg > sg)
            return vmsnap_err_set(err, EEXIST,
                                  "VM '%s' has a later checkpoint (generation %lld%s%s) than the "
                                  "snapshot at %s (generation %lld): resuming it would go back; "
                                  "resume %s, or give --force",
                                  r->name, (long long)rg, ru ? ", at " : "", ru ? ru : "", r->url,
                                  (long long)(sg > 0 ? sg : 0),
                                  ru ? "from that URL" : "without a URL");
    }
    return 0;
}

/* Check the image: the accelerator is one QEMU takes, and the memory image is exactly the VM's
 * memory (it becomes the guest RAM file: a set could otherwise leave a RAM file of any size on
 * the tmpfs for the VM's life). */
static int resume_check_image(struct resume *r, struct vmsnap_err *err)
{
    const char *sacc = vm_cfg_str(r->cfg, "accel");
    if (sacc && strcmp(sacc, "kvm") && strcmp(sacc, "tcg"))
        return vmsnap_err_set(err, EINVAL, "%s: accelerator '%s' is neither kvm nor tcg",
                              r->cfgfile, sacc);
    char mr[PATH_LEN];
    struct stat ms;
    int rc = vm_pjoin(mr, r->src, "memory-ranges", err);
    if (rc == 0 && stat(mr, &ms) < 0)
        rc = err_sys(err, "%s", mr);
    if (rc == 0 && (uint64_t)ms.st_size != (uint64_t)vm_cfg_int(r->cfg, "memory"))
        rc = vmsnap_err_set(err, EINVAL,
                            "%s: the memory image holds %llu bytes, the VM's memory is %llu: "
                            "refusing it",
                            mr, (unsigned long long)ms.st_size,
                            (unsigned long long)vm_cfg_int(r->cfg, "memory"));
    return rc;
}

/* Clone the disk out of the snapshot. A live disk already there (a stopped VM's) is set aside
 * (r->disk_prev) and put back if this resume fails. */
static int resume_stage_disk(struct resume *r, struct vmsnap_err *err)
{
    struct vmctx *c = &r->c;
    char prev[PATH_LEN], p[PATH_LEN];
    int rc = vm_pcat(prev, c->disk, ".prev") < 0
                 ? vmsnap_err_set(err, ENAMETOOLONG, "path too long")
                 : vm_pjoin(p, r->src, DISK_CKPT, err);
    if (rc < 0)
        return rc;
    if (vm_exists(prev) && rename(prev, c->disk) < 0) /* left by a crashed resume */
        return err_sys(err, "rename %s to %s", prev, c->disk);
    if (vm_exists(c->disk)) {
        if (rename(c->disk, prev) < 0)
            return err_sys(err, "rename %s to %s", c->disk, prev);
        snprintf(r->disk_prev, sizeof(r->disk_prev), "%s", prev);
    }
    r->done = RESUMED_DISK;
    return vm_sparse_copy(p, c->disk, err);
}

/* Place the guest RAM: the image itself for an on-demand VM (mapped privately), else the RAM
 * file on the tmpfs: a second name of the stage's image, the pulled image renamed, or a copy.
 * `ram` gets the path the config names. */
static int resume_stage_ram(struct resume *r, char *ram, struct vmsnap_err *err)
{
    struct vmctx *c = &r->c;
    char img[PATH_LEN];
    int rc = vm_pjoin(img, r->src, "memory-ranges", err);
    if (rc < 0)
        return rc;
    unlink(c->ram);
    if (r->on_demand) {
        snprintf(ram, PATH_LEN, "%s", img);
        return 0;
    }
    snprintf(ram, PATH_LEN, "%s", c->ram);
    if (r->from == FROM_STAGE && vm_same_fs(img, c->ram_dir)) {
        /* a second name: the stage stays whole (its only copy) until the VM runs */
        if (link(img, c->ram) < 0)
            return err_sys(err, "link %s to %s", img, c->ram);
    } else if (r->from == FROM_STORE && vm_same_fs(img, c->ram_dir)) {
        if (rename(img, c->ram) < 0)
            return err_sys(err, "rename %s to %s", img, c->ram);
    } else {
        /* room first: a copy that fills the RAM directory fails half way with ENOSPC
         * instead of saying what the guest needs there */
        rc = vm_ram_room(c, vm_cfg_int(r->cfg, "memory"), err);
        if (rc == 0)
            rc = vm_image_copy(c, img, c->ram, err);
        if (rc < 0)
            return rc;
    }
    r->done = RESUMED_RAM;
    return 0;
}

/* Stage: clone the disk out, place the RAM, rewrite the node-local paths. */
static int resume_stage(struct resume *r, struct vmsnap_err *err)
{
    struct vmctx *c = &r->c;
    const struct vmsnap_vm_opts *o = r->o;
    char ram[PATH_LEN];
    int rc = resume_stage_disk(r, err);
    if (rc == 0)
        rc = resume_stage_ram(r, ram, err);
    if (rc == 0)
        rc = vm_config_rewrite(r->cfg, c->disk, ram, c->vmdir, err);
    if (rc < 0)
        return rc;
    json_object_object_add(r->cfg, "ram_shared", json_object_new_boolean(!r->on_demand));
    vm_cfg_set_str(r->cfg, "name", r->name);
    if (!vm_cfg_str(r->cfg, "accel") || (o && o->accel)) {
        const char *accel;
        rc = vmsnap_vmm_pick_accel(o ? o->accel : NULL, &accel, err);
        if (rc < 0)
            return rc;
        vm_cfg_set_str(r->cfg, "accel", accel);
    }
    if (!r->on_demand && (rc = vm_ram_room(c, vm_cfg_int(r->cfg, "memory"), err)) < 0)
        return rc;
    vm_step(r->t, "stage", &r->t0);
    return 0;
}

/* Restore: the record first, then QEMU loads the snapshot and holds the VM paused.
 *
 * The record before QEMU starts: for a VM the node did not know, a resume killed from here on
 * leaves a VM that 'vm ls' shows and 'vm stop' can stop (the record goes if the resume fails);
 * for a known VM it describes the QEMU about to start (an on-demand restore has no RAM file: a
 * resume killed after the restore left the old eager record, and the documented 'vm pause' of
 * that frozen VM looked for a RAM file that was not there), and the old record comes back if
 * the resume fails. The URL says where the VM is, should this be killed. */
static int resume_restore(struct resume *r, struct vmsnap_err *err)
{
    vm_cfg_set_str(r->cfg, "status", "restoring");
    vm_cfg_set_str(r->cfg, "url", resume_url(r));
    int rc = vm_cfg_save(r->c.cfgpath, r->cfg, err);
    if (rc < 0)
        return rc;
    r->done = RESUMED_RECORD;
    /* a cancel (SIGINT) before the restore: the ordinary failure path undoes the staging */
    if ((rc = cancel_check(err)) < 0)
        return rc;
    sys_failpoint("resume-before-restore");
    rc = vm_vmm_from_cfg(&r->c, r->cfg, &r->v, err);
    if (rc == 0)
        rc = vmsnap_vmm_restore(r->v, r->src, err);
    if (rc < 0)
        return rc;
    r->done = RESUMED_QEMU;
    sys_failpoint("resume-restored");
    vm_step(r->t, "restore", &r->t0);
    return 0;
}

/* Release the restore files: pulled ones are truncated (the privately mapped image of an
 * on-demand VM excepted), the local checkpoint is only evicted (it stays the latest). */
static void resume_release(struct resume *r)
{
    const struct vmsnap_vm_opts *o = r->o;
    if (r->from == FROM_STORE) {
        const char *keep[] = {"memory-ranges", NULL};
        struct vmsnap_err e2;
        if (!r->on_demand || !(o && o->no_evict)) {
            if (vmsnap_pcache_release_dir(r->src, r->on_demand ? keep : NULL, NULL, NULL, &e2) < 0)
                vlog(VMSNAP_LOG_WARN, "release %s: %s", r->src, e2.msg);
        }
        if (!r->on_demand)
            vm_rm_snapshot_dir(r->src);
    } else if (r->from == FROM_CHECKPOINT && !(o && o->no_evict)) {
        /* (the stage is tmpfs: nothing to evict) */
        struct vmsnap_err e2;
        if (vmsnap_pcache_evict(r->c.ckpt, NULL, NULL, &e2) < 0)
            vlog(VMSNAP_LOG_WARN, "evict %s: %s", r->c.ckpt, e2.msg);
    }
    if (!r->on_demand || r->from != FROM_STORE)
        vm_rm_rf(r->c.ondemand);
    vm_step(r->t, "evict", &r->t0);
}

/* Let the guest run ('cont'). From the stage, a failed 'cont' may have reached QEMU with its
 * answer lost: a guest that runs, or may run, on the stage's image makes the stage no snapshot
 * (its memory newer than its device state), so it is not marked unsaved again. */
static int resume_cont(struct resume *r, struct vmsnap_err *err)
{
    int rc = vmsnap_vmm_resume(r->v, err);
    if (rc < 0 && r->from == FROM_STAGE) {
        enum vmsnap_vmm_state st;
        struct vmsnap_err e2;
        int src2 = vmsnap_vmm_state(r->v, &st, NULL, &e2);
        if (src2 == 0 && st == VMSNAP_VMM_RUNNING) {
            vlog(VMSNAP_LOG_WARN, "VM '%s': 'cont' failed (%s) but the guest runs: resumed",
                 r->name, err ? err->msg : "?");
            rc = 0;
        } else if (src2 < 0 || st != VMSNAP_VMM_PAUSED) {
            r->mark[0] = '\0';
            vm_stage_consumed(&r->c);
            vmsnap_err_wrap(err,
                            "the guest may have run on the snapshot in %s, which is no longer "
                            "one (kept for inspection): ",
                            r->c.stage);
        }
    }
    return rc;
}

/* Run: the restore files released, the record of the QEMU that now holds the VM saved, the
 * guest let run; then what the running VM supersedes goes. */
static int resume_run(struct resume *r, struct vmsnap_err *err)
{
    struct vmctx *c = &r->c;
    resume_release(r);
    /* The guest is about to run on the stage's image: from here the stage is no snapshot. */
    if (r->from == FROM_STAGE && vm_pcat(r->mark, c->stage, "/" UNSAVED_MARK) == 0)
        unlink(r->mark);
    /* The record describes the QEMU that now holds the VM (RAM file, on-demand or not): it is
     * saved before the guest runs, so a resume killed from here on leaves a record that a later
     * pause can trust (an old record of an eager VM would make it look for a RAM file an
     * on-demand one does not have, after QEMU was stopped). */
    json_object_object_del(r->cfg, "ram_in_state");
    vm_cfg_set_str(r->cfg, "status", "running");
    vm_cfg_set_str(r->cfg, "url", resume_url(r));
    int rc = vm_cfg_save(c->cfgpath, r->cfg, err);
    if (rc == 0)
        rc = resume_cont(r, err);
    if (rc < 0)
        return rc; /* (the old record comes back in resume_undo) */
    /* The guest runs on the stage's image: its complete and taking marks go at once (a resume
     * killed before the stage was removed left one that the next command's recovery marked
     * unsaved again: memory newer than its device state, a torn set that QEMU refused to load
     * and a suspend pushed). Before 'cont' they must stay: a resume killed there leaves a
     * frozen QEMU and the stage, still the snapshot, that 'vm stop' must keep. */
    if (r->from == FROM_STAGE)
        vm_stage_consumed(c);
    vm_step(r->t, "resume", &r->t0);
    sys_failpoint("resume-running"); /* the guest runs; nothing cleaned up yet */
    if (r->from == FROM_STORE)
        vm_discard(c->ckpt); /* superseded by the store's snapshot, now that the VM runs from it */
    if (r->from == FROM_STAGE)
        vm_rm_rf(c->stage); /* its image is the RAM file now; the VM runs */
    if (r->disk_prev[0])
        unlink(r->disk_prev);
    return 0;
}

/* Undo a failed resume from how far it got, backwards: the VM is left as it was before, and the
 * snapshot it came from untouched. */
static void resume_undo(struct resume *r)
{
    struct vmctx *c = &r->c;
    if (r->done >= RESUMED_QEMU)
        vmsnap_vmm_stop(r->v, NULL);
    if (r->mark[0])
        vm_mark_unsaved(c, NULL); /* the guest did not run: the stage is the snapshot again */
    if (r->done >= RESUMED_RAM && !r->on_demand) /* from the stage, a second name of its image,
                                                  * which stays there */
        unlink(c->ram);
    if (r->done >= RESUMED_DISK) { /* the live disk that was there before, if any, comes back */
        unlink(c->disk);
        if (r->disk_prev[0] && rename(r->disk_prev, c->disk) < 0)
            vlog(VMSNAP_LOG_WARN, "put back %s as %s: %s", r->disk_prev, c->disk, strerror(errno));
    }
    if (r->done >= RESUMED_PULL_DIR && r->from == FROM_STORE)
        vm_rm_snapshot_dir(r->src);
    if (r->done >= RESUMED_RECORD && !r->old && !r->created)
        unlink(c->cfgpath);
    if (r->done >= RESUMED_RECORD && r->old && vm_cfg_save(c->cfgpath, r->old, NULL) < 0)
        vlog(VMSNAP_LOG_WARN, "VM '%s': could not put its record %s back", r->name, c->cfgpath);
    if (r->created)
        vm_rm_rf(c->vmdir);
}

static int (*const resume_phases[])(struct resume *, struct vmsnap_err *) = {
    resume_open,        resume_pick_stage,    resume_check_live,  resume_pick_source,
    resume_load_config, resume_check_lineage, resume_check_image, resume_stage,
    resume_restore,     resume_run,
};

int vmsnap_vm_resume(const struct vmsnap_vm_opts *o, const char *name, const char *url,
                     struct vmsnap_vm_timing *t, struct vmsnap_err *err)
{
    struct resume r = {
        .o = o, .name = name, .url = url, .t = t, .t0 = mono_now(), .on_demand = o && o->on_demand};
    const double tstart = r.t0;
    int rc = vm_ctx_init(&r.c, o, name, err);
    if (rc < 0)
        return rc;
    /* (the guest prints nothing before the resume lets it run: a QEMU that holds it stopped
     * does not run it) */
    struct vm_console_mark mark = vm_console_mark(&r.c);
    for (size_t i = 0; rc == 0 && i < sizeof(resume_phases) / sizeof(resume_phases[0]); i++)
        rc = resume_phases[i](&r, err);
    if (rc < 0)
        resume_undo(&r);
    else /* the guest runs: not undone if it does not say it is ready (the error says it runs) */
        rc = vm_wait_ready(&r.c, r.cfg ? r.cfg : r.old, mark, t, &r.t0, err);
    if (rc < 0)
        vmsnap_err_wrap(err, "vm resume %s: ", name);
    if (t)
        t->total = mono_now() - tstart;
    free(r.url_copy);
    vmsnap_vmm_free(r.v);
    json_object_put(r.cfg);
    json_object_put(r.old);
    vm_ctx_fini(&r.c);
    return rc < 0 ? rc : 0;
}
