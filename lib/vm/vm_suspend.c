/* SPDX-License-Identifier: Apache-2.0 */
/* The dump side: vm pause (a local checkpoint) and vm suspend (a checkpoint pushed to a store),
 * both taking the device state of the running VM first (take_state). */
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
#include <time.h>
#include <unistd.h>

/* Stop the running VM after writing its device state into `sdir` (created). On failure the VM
 * runs again and `sdir` is removed. */
static int take_state(struct vmctx *c, json_object *cfg, struct vmsnap_vmm *v, const char *sdir,
                      struct vmsnap_vm_timing *t, double *t0, struct vmsnap_err *err)
{
    enum vmsnap_vmm_state st;
    int rc = vmsnap_vmm_state(v, &st, NULL, err);
    if (rc < 0)
        return rc;
    if (st == VMSNAP_VMM_DEAD) {
        const char *was = vm_cfg_str(cfg, "status") ? vm_cfg_str(cfg, "status") : "?";
        bool ran = vm_status_live(was);
        if (vm_exists(c->ckpt) || vm_stage_unsaved(c))
            return vmsnap_err_set(err, ESRCH,
                                  "VM '%s' has no running QEMU (%s): 'vmsnap vm resume %s' goes "
                                  "back to its last checkpoint",
                                  c->name, ran ? "it exited while the guest ran" : was, c->name);
        return vmsnap_err_set(err, ESRCH,
                              "VM '%s' has no running QEMU (%s), and no checkpoint here: resume "
                              "it from a store ('vmsnap vm resume %s URL') or remove it ('vmsnap "
                              "vm stop --rm %s')",
                              c->name, ran ? "it exited while the guest ran" : was, c->name,
                              c->name);
    }
    /* io-error: QEMU stopped the guest on a failed disk write (a full host filesystem); the
     * device state keeps the request, which the restored guest retries */
    if (st == VMSNAP_VMM_INCOMING) /* a resume killed while its QEMU waited for the state */
        return vmsnap_err_set(err, EINVAL,
                              "VM '%s' is incoming, not running (a resume was killed while its "
                              "QEMU waited for the state): 'vmsnap vm resume %s' starts it again",
                              c->name, c->name);
    if (st != VMSNAP_VMM_RUNNING && st != VMSNAP_VMM_PAUSED && st != VMSNAP_VMM_IO_ERROR)
        return vmsnap_err_set(err, EINVAL, "VM '%s' is %s, not running", c->name,
                              vmsnap_vmm_state_name(st));
    /* checked while the VM still runs: the checkpoint takes the RAM from c->ram */
    const char *rec = vm_cfg_str(cfg, "ram_path");
    if (vm_cfg_bool(cfg, "ram_shared") && rec && !vm_same_path(rec, c->ram))
        return vmsnap_err_set(err, EINVAL,
                              "VM '%s' keeps its RAM in %s, not %s: give the --ram-dir "
                              "(VMSNAP_RAM_DIR) it was started with",
                              c->name, rec, c->ram);
    if (st == VMSNAP_VMM_PAUSED) {
        /* frozen (a command on it killed with the guest stopped): after a completed migration
         * QEMU refuses another ("Can't migrate the vm that was paused due to previous
         * migration"), and the stage or checkpoint.new the killed command was writing must not
         * be taken for this state. The guest goes on first (vm_unfreeze), then is paused as a
         * running one: nothing of its state is lost, it runs for a moment longer. */
        if ((rc = vm_unfreeze(c, cfg, v, err)) < 0)
            return rc;
        st = VMSNAP_VMM_RUNNING;
    }
    vm_rm_snapshot_dir(sdir);
    if (mkdir(sdir, 0700) < 0)
        return err_sys(err, "mkdir %s", sdir);
    rc = vmsnap_vmm_pause(v, err);
    if (rc < 0)
        goto fail;
    sys_failpoint("take-stopped"); /* the guest stopped, no state taken: a frozen VM */
    vm_step(t, "pause", t0);
    rc = vmsnap_vmm_snapshot(v, sdir, err);
    if (rc < 0)
        goto fail;
    /* the migration completed: a frozen VM whose QEMU refuses to migrate again */
    sys_failpoint("take-migrated");
    vm_step(t, "snapshot", t0);
    /* every checkpoint of a VM's lineage (base_id) gets the next generation: a resume can tell
     * a stale snapshot from a newer local checkpoint */
    int64_t gen = vm_cfg_int(cfg, "generation");
    json_object_object_add(cfg, "generation",
                           json_object_new_int64(gen > 0 && gen < GEN_MAX ? gen + 1
                                                 : gen > 0                ? GEN_MAX
                                                                          : 1));
    /* From the stop on, `sdir` (the device state) and the RAM file and live disk are the VM's
     * newest state, until the checkpoint is complete: the config and a mark saying so go in
     * first, so a process killed meanwhile leaves what finish_taken() completes. */
    if ((rc = vm_write_taking(cfg, sdir, err)) < 0)
        goto fail;
    sys_failpoint("take-marked"); /* the taking mark written, QEMU not yet stopped */
    rc = vmsnap_vmm_stop(v, err);
    if (rc < 0)
        goto fail;
    vm_step(t, "teardown", t0);
    return 0;
fail:
    vm_rm_snapshot_dir(sdir);
    if (st == VMSNAP_VMM_RUNNING) {
        struct vmsnap_err e2;
        if (vmsnap_vmm_resume(v, &e2) < 0)
            vlog(VMSNAP_LOG_ERROR, "VM '%s': resume after a failed checkpoint: %s", c->name,
                 e2.msg);
    }
    return rc;
}

/* Turn a stopped VM's state directory `sdir` (on any filesystem) into the local checkpoint. */
static int finish_local(struct vmctx *c, json_object *cfg, const char *sdir, bool evict,
                        struct vmsnap_vm_timing *t, double *t0, struct vmsnap_err *err)
{
    char newdir[PATH_LEN], p[PATH_LEN];
    if (vm_pcat(newdir, c->ckpt, ".new") < 0)
        return vmsnap_err_set(err, ENAMETOOLONG, "path %s too long", c->ckpt);
    bool in_place = !strcmp(sdir, newdir);
    int rc = 0;
    if (!in_place) {
        vm_rm_snapshot_dir(newdir);
        if (mkdir(newdir, 0700) < 0)
            return err_sys(err, "mkdir %s", newdir);
        rc = vm_copy_small(sdir, newdir, "state", err);
        if (rc == 0)
            rc = vm_pjoin(p, sdir, "memory-ranges", err);
        char dst[PATH_LEN];
        if (rc == 0)
            rc = vm_pjoin(dst, newdir, "memory-ranges", err);
        if (rc == 0)
            rc = vm_image_copy(c, p, dst, err);
    } else {
        bool ram_in_state = false;
        rc = vm_pjoin(p, newdir, "memory-ranges", err);
        if (rc == 0)
            rc = vm_ckpt_ram(c, cfg, p, &ram_in_state, err);
        json_object_object_add(cfg, "ram_in_state", json_object_new_boolean(ram_in_state));
    }
    if (rc == 0) {
        json_object *ck = vm_ckpt_config(cfg);
        rc = ck ? vm_ckpt_meta(c, ck, newdir, true, err) : vmsnap_err_set(err, ENOMEM, "oom");
        json_object_put(ck);
    }
    if (rc == 0)
        sys_failpoint("checkpoint-before-swap");
    if (rc == 0)
        rc = vm_swap_checkpoint(c, newdir, err);
    if (rc < 0) {
        /* In place, checkpoint.new holds the state the pause took (the device state, maybe the
         * RAM): with the RAM file and the live disk, the VM's newest state. It stays for
         * vm_recover_interrupted() to complete; from a stage, the stage still has it all. */
        if (!in_place)
            vm_rm_snapshot_dir(newdir);
        return rc;
    }
    /* The live disk lives on as the checkpoint's hard link; resume clones it out again. */
    unlink(c->disk);
    if (vm_cfg_bool(cfg, "ram_shared"))
        unlink(c->ram);
    vm_discard(c->ondemand);
    vm_step(t, "checkpoint", t0);
    if (evict) {
        /* The checkpoint was just written: start its writeback and drop what is clean, so it
         * does not stay charged to this cgroup next to the next guest's RAM. */
        struct vmsnap_pcache_evict_opts eo = {.kick_writeback = true};
        struct vmsnap_pcache_report rep = {0};
        struct vmsnap_err e2;
        if (vmsnap_pcache_evict(c->ckpt, &eo, &rep, &e2) < 0)
            vlog(VMSNAP_LOG_WARN, "evict %s: %s", c->ckpt, e2.msg);
        vm_step(t, "evict", t0);
    }
    return 0;
}

/* The record of a VM whose local checkpoint was just swapped in (its generation is cfg's). */
static int record_paused(struct vmctx *c, json_object *cfg, struct vmsnap_err *err)
{
    vm_cfg_set_str(cfg, "status", "paused");
    json_object_object_del(cfg, "ram_in_state");
    int rc = vm_cfg_save(c->cfgpath, cfg, err);
    if (rc < 0)
        vmsnap_err_wrap(
            err, "the checkpoint %s is complete, but the VM's record is not updated: ", c->ckpt);
    return rc;
}

int vmsnap_vm_pause(const struct vmsnap_vm_opts *o, const char *name, struct vmsnap_vm_timing *t,
                    struct vmsnap_err *err)
{
    double t0 = mono_now(), tstart = t0;
    struct vmctx c;
    json_object *cfg = NULL;
    struct vmsnap_vmm *v = NULL;
    int rc = vm_open_record(&c, o, name, &cfg, err);
    if (rc == 0)
        rc = vm_vmm_from_cfg(&c, cfg, &v, err);
    char newdir[PATH_LEN];
    if (vm_pcat(newdir, c.ckpt, ".new") < 0)
        newdir[0] = 0;
    if (rc == 0)
        rc = take_state(&c, cfg, v, newdir, t, &t0, err);
    if (rc == 0)
        sys_failpoint("pause-taken");
    if (rc == 0) {
        rc = finish_local(&c, cfg, newdir, !(o && o->no_evict), t, &t0, err);
        if (rc < 0)
            vmsnap_err_wrap(err,
                            "VM stopped; the state it took is kept in %s and becomes its "
                            "checkpoint at the next 'vmsnap vm resume %s' once this is fixed: ",
                            newdir, name);
    }
    if (rc == 0)
        rc = record_paused(&c, cfg, err);
    /* A stage next to a live QEMU is the snapshot that QEMU was restored from (a resume from it
     * killed before or after the guest ran; its image may be the RAM file's inode, which it
     * would keep on the tmpfs): this checkpoint supersedes it. */
    if (rc == 0 && vm_stage_ok(&c))
        vm_unstage(&c);
    return vm_op_end(&c, cfg, v, rc, "pause", t, tstart, err);
}

/* Transfer options for a suspend: the caller's, with the codec frame size derived from the
 * guest's memory when the caller left it at 0 (for every file of the set; the disk image and
 * the small files do not care): memory / 64, a power of two in [8, 64] MiB
 * (512 MiB -> 8 MiB, 4 GiB and more -> 64 MiB). A guest's populated RAM bunches up in a few
 * 64 MiB ranges, so the codec default leaves a small guest with a handful of frames: one thread
 * compresses the last big one alone, and each thread holds two 64 MiB buffers (push peaked at
 * 270 MiB for a 512 MiB guest, 120 MiB with 8 MiB frames, same output size +-0.2%). The size
 * depends on the guest alone, so the object stays byte-identical for any thread count. */
static struct vmsnap_xfer_opts suspend_xfer_opts(const struct vmsnap_vm_opts *o, json_object *cfg)
{
    static const struct vmsnap_xfer_opts zero;
    struct vmsnap_xfer_opts x = o && o->xfer ? *o->xfer : zero;
    if (x.frame_size == 0) {
        int64_t mem = vm_cfg_int(cfg, "memory");
        uint64_t fs = 8ull << 20;
        while (fs < (64ull << 20) && mem > 0 && fs * 64 < (uint64_t)mem)
            fs <<= 1;
        x.frame_size = fs;
    }
    return x;
}

/* True when two snapshot URLs are in the same S3 bucket (the endpoint and credentials come from
 * the same options). Local stores are left out: an object's frames are not block-aligned, so
 * copying them is a data copy (no reflink), which costs about what compressing them from tmpfs
 * costs (measured: no faster); S3 copies cost the node nothing. gs:// is left out too: Cloud
 * Storage's XML multipart API takes no preconditions, so a copy could not be guarded by the
 * base's ETag. */
static bool same_bucket(const char *a, const char *b)
{
    if (strncmp(a, "s3://", 5) || strncmp(b, "s3://", 5))
        return false;
    const char *ea = strchr(a + 5, '/'), *eb = strchr(b + 5, '/');
    size_t la = ea ? (size_t)(ea - a) : strlen(a), lb = eb ? (size_t)(eb - b) : strlen(b);
    return la == lb && !strncmp(a, b, la);
}

/* The push options of a suspend to `url`: frames sized to the guest, and the store URL the VM
 * last came from or went to as the base when it is in the same bucket (frames that did not
 * change since are copied by the store instead of uploaded); the layers it stores written
 * through into the node's object cache. */
static struct vmsnap_xfer_opts suspend_push_opts(const struct vmsnap_vm_opts *o, json_object *cfg,
                                                 const char *url)
{
    struct vmsnap_xfer_opts x = suspend_xfer_opts(o, cfg);
    const char *prev = vm_cfg_str(cfg, "url");
    if (!x.base && !(o && o->no_base) && prev && same_bucket(prev, url))
        x.base = prev;
    x.base_implicit = true;
    x.write_cache = true; /* this node is the likeliest to resume it: keep its layers */
    return x;
}

/* A suspend could store its staged snapshot neither in the store nor as a local checkpoint
 * (`why`): the stage is the only copy of the VM. Complete (memory image, device state, config),
 * it is marked (UNSAVED_MARK), so that nothing removes it and the next suspend pushes it;
 * incomplete, it is only left in place. Either way the error says where it is. */
static void keep_stage(struct vmctx *c, json_object *cfg, const char *why, struct vmsnap_err *err)
{
    const char *missing = vm_snapshot_missing(c->stage);
    bool complete = !missing;
    struct vmsnap_err me = {0};
    bool marked = complete && (vm_stage_unsaved(c) || vm_mark_unsaved(c, &me) == 0);
    if (!complete) { /* not a snapshot: nothing may take it for one */
        char p[PATH_LEN];
        if (vm_pcat(p, c->stage, "/" UNSAVED_MARK) == 0)
            unlink(p);
    }
    vm_cfg_set_str(cfg, "status", "stopped");
    vm_cfg_save(c->cfgpath, cfg, NULL);
    if (marked)
        vmsnap_err_wrap(err,
                        "the local checkpoint failed too (%s); the snapshot is left in %s (run "
                        "'vmsnap vm suspend %s URL' again to store it): ",
                        why, c->stage, c->name);
    else if (complete)
        vmsnap_err_wrap(err,
                        "the local checkpoint failed too (%s); the snapshot is left in %s but "
                        "could not be marked as unsaved (%s): copy it away before any 'vmsnap vm "
                        "stop' or resume of this VM, which would remove it: ",
                        why, c->stage, me.msg);
    else
        vmsnap_err_wrap(err,
                        "the local checkpoint failed too (%s); what was taken of the VM is left "
                        "in %s, incomplete (no %s), for the next 'vmsnap vm resume %s' to "
                        "complete once this is fixed: ",
                        why, c->stage, missing, c->name);
}

static bool path_under(const char *p, const char *dir)
{
    size_t n = strlen(dir);
    return !strncmp(p, dir, n) && (p[n] == '\0' || p[n] == '/');
}

/* A local store URL inside the VMs' directories, a VM's stage or RAM file would be removed by
 * the suspend's own teardown (or another VM's): the snapshot stored, then deleted. Compared in
 * canonical spellings (symlinked directories resolved). */
static int dest_outside_vms(const struct vmctx *c, const char *url, struct vmsnap_err *err)
{
    if (strstr(url, "://") && strncmp(url, "file://", 7))
        return 0; /* s3://, gs:// */
    char text[PATH_MAX], canon[PATH_MAX], vms[PATH_LEN], cvms[PATH_MAX], cvm[PATH_MAX];
    /* the path the local store will use (".." resolved as text), then its canonical form */
    int rc = sys_lexical_path(strncmp(url, "file://", 7) ? url : url + 7, text, sizeof(text));
    if (rc == 0)
        rc = sys_canon_path(text, canon);
    if (rc == 0 && (rc = vm_pjoin(vms, c->state, "vms", err)) == 0)
        rc = sys_canon_path(vms, cvms);
    if (rc == 0)
        rc = sys_canon_path(c->vmdir, cvm);
    if (rc < 0)
        return err_code(err, -rc, "%s", url);
    const char *inside = path_under(canon, cvms) ? cvms : path_under(canon, cvm) ? cvm : NULL;
    if (!inside && path_under(canon, c->ram_dir)) {
        /* a VM's RAM file or stage (any VM's: vmsnap-<hash>-<name>.ram|.stage) */
        const char *leaf = canon + strlen(c->ram_dir);
        leaf += *leaf == '/';
        size_t n = strcspn(leaf, "/");
        if (!strncmp(leaf, "vmsnap-", 7) && ((n > 4 && !strncmp(leaf + n - 4, ".ram", 4)) ||
                                             (n > 6 && !strncmp(leaf + n - 6, ".stage", 6))))
            inside = c->ram_dir;
    }
    if (inside)
        return vmsnap_err_set(err, EINVAL,
                              "%s is inside %s, which vmsnap manages (a suspend or stop removes "
                              "what is there): store the snapshot elsewhere",
                              url, inside);
    return 0;
}

/*
 * vm suspend is a sequence of phases over one struct suspend (suspend_phases below): open (the
 * destination checked before the VM stops), push a stopped VM's snapshot as it is, else take
 * the running VM's state into the stage, then upload it. Once the VM is stopped, a failure
 * falls back to the local checkpoint in one place (fall_back_local), and once the store has
 * the snapshot the VM's local state goes in one place (teardown_local).
 */

/* What a suspend pushes. */
enum suspend_from {
    PUSH_CHECKPOINT, /* a stopped VM's local checkpoint (paused, or its upload failed) */
    PUSH_UNSAVED,    /* a stopped VM's snapshot only in the stage (stored nowhere) */
    PUSH_TAKEN,      /* the state this suspend took from the running VM, in the stage */
};

struct suspend {
    struct vmctx c;
    const struct vmsnap_vm_opts *o;
    const char *name, *url;
    struct vmsnap_vm_timing *t;
    double t0;
    json_object *cfg; /* the VM's record (with the taken checkpoint's generation) */
    struct vmsnap_vmm *v;
    enum suspend_from from;
};

/* Open: the VM locked and its record read; a URL the store refuses (a typo, a local path under
 * a file or in a directory this process cannot write, a remote store that does not answer, takes
 * not the credentials or cannot be written in) fails here, before the VM stops for nothing, as
 * does one inside what vmsnap manages or a RAM directory that is not tmpfs. */
static int suspend_open(struct suspend *s, struct vmsnap_err *err)
{
    struct vmctx *c = &s->c;
    int rc = vm_open_record(c, s->o, s->name, &s->cfg, err);
    if (rc == 0) {
        /* a remote store that does not answer, refuses the credentials or cannot be written in
         * fails here too, with the VM as it was */
        struct vmsnap_xfer_opts xo = suspend_push_opts(s->o, s->cfg, s->url);
        if ((rc = vmsnap_xfer_check_dest(s->url, true, &xo, err)) < 0 &&
            vmsnap_store_url_remote(s->url))
            vmsnap_err_wrap(err, "nothing was stopped or changed: ");
    }
    if (rc == 0)
        rc = dest_outside_vms(c, s->url, err);
    if (rc == 0)
        rc = vm_check_ram_dir(c, err);
    if (rc == 0)
        rc = vm_vmm_from_cfg(c, s->cfg, &s->v, err);
    return rc;
}

/* Push `dir` to the URL, its upload timed and its byte counts in the timing. */
static int suspend_push(struct suspend *s, const char *dir, struct vmsnap_err *err)
{
    struct vmsnap_xfer_stats xs = {0};
    struct vmsnap_xfer_opts xo = suspend_push_opts(s->o, s->cfg, s->url);
    int rc = vmsnap_xfer_push(dir, s->url, &xo, &xs, err);
    vm_step(s->t, "upload", &s->t0);
    if (s->t) {
        s->t->object_bytes = xs.object_bytes;
        s->t->copied_bytes = xs.copied_bytes;
        s->t->deltas = xs.deltas;
    }
    return rc;
}

/* The record first, before the VM's local state goes: a suspend killed during the teardown
 * leaves a record naming the snapshot just stored, not the previous one. */
static int record_suspended(struct suspend *s, struct vmsnap_err *err)
{
    vm_cfg_set_str(s->cfg, "status", "suspended");
    vm_cfg_set_str(s->cfg, "url", s->url);
    return vm_cfg_save(s->c.cfgpath, s->cfg, err);
}

/* The store has the snapshot and the record says so: the VM's local state goes, the stage's
 * unsaved mark first (the stage is no longer the only copy), then the disk, the RAM file, the
 * checkpoint, an on-demand image, and the stage when it was what was pushed. */
static void teardown_local(struct suspend *s)
{
    struct vmctx *c = &s->c;
    char p[PATH_LEN];
    if (s->from != PUSH_CHECKPOINT && vm_pcat(p, c->stage, "/" UNSAVED_MARK) == 0)
        unlink(p);
    unlink(c->disk);
    unlink(c->ram); /* a dead QEMU's guest RAM (tmpfs: memory): not a state to keep */
    /* a dead QEMU's RAM file elsewhere is not followed (see vm stop) */
    const char *rp = vm_cfg_str(s->cfg, "ram_path");
    struct stat rs;
    if (s->from != PUSH_TAKEN && rp && strcmp(rp, c->ram) && lstat(rp, &rs) == 0)
        vlog(VMSNAP_LOG_WARN,
             "VM '%s': its dead QEMU's RAM file %s stays (it ran with another "
             "--ram-dir): 'vmsnap vm stop %s --ram-dir DIR' with that directory removes it",
             s->name, rp, s->name);
    sys_failpoint("suspend-teardown"); /* the disk and RAM gone, the checkpoint not yet */
    vm_discard(c->ckpt);
    vm_discard(c->ondemand);
    if (s->from != PUSH_CHECKPOINT)
        vm_unstage(c);
    vm_step(s->t, "teardown-local", &s->t0);
}

/* A stopped VM with a local checkpoint (paused, or a suspend whose upload failed), or with a
 * snapshot only in its staging directory (a suspend that could store it nowhere): push that as
 * it is (1: done). 0: the VM runs, its state is to be taken. */
static int suspend_stopped(struct suspend *s, struct vmsnap_err *err)
{
    struct vmctx *c = &s->c;
    enum vmsnap_vmm_state st;
    char pend[PATH_LEN];
    int rc = vmsnap_vmm_state(s->v, &st, NULL, err);
    if (rc < 0 || st != VMSNAP_VMM_DEAD)
        return rc;
    if (vm_recover_interrupted(c, pend))
        return vm_pending_error(c, pend, "", err);
    const bool unsaved = vm_stage_unsaved(c);
    const char *missing = unsaved ? vm_snapshot_missing(c->stage) : NULL;
    if (missing)
        return vmsnap_err_set(err, EIO,
                              "the snapshot kept in %s is incomplete (no %s): not pushing it",
                              c->stage, missing);
    if (!unsaved && !vm_exists(c->ckpt))
        return 0; /* (take_state says why there is nothing to suspend) */
    s->from = unsaved ? PUSH_UNSAVED : PUSH_CHECKPOINT;
    const char *from = unsaved ? c->stage : c->ckpt;
    if (vm_status_live(vm_cfg_str(s->cfg, "status"))) {
        /* QEMU died under a running guest (it crashed, or was killed): what the guest did
         * since the snapshot pushed here is gone; say so rather than succeed quietly */
        struct stat cs;
        char when[64] = "?";
        if (stat(from, &cs) == 0)
            strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S %Z", localtime(&cs.st_mtim.tv_sec));
        vlog(VMSNAP_LOG_WARN,
             "VM '%s' is dead (its QEMU exited while the guest ran): suspending its "
             "last %s, %s, of %s; what the guest did after it is lost",
             s->name, unsaved ? "snapshot" : "checkpoint", from, when);
    }
    rc = suspend_push(s, from, err);
    if (rc < 0) {
        vmsnap_err_wrap(err, "upload failed; the %s %s is kept: ",
                        unsaved ? "snapshot in" : "local checkpoint", from);
        return rc;
    }
    if ((rc = record_suspended(s, err)) < 0)
        return rc;
    teardown_local(s);
    return 1;
}

/* The fall-back to the local checkpoint, once the VM is stopped: the stage could not be made a
 * snapshot to push, or its push failed (`upload_failed`). The stage becomes the local
 * checkpoint and goes; if even that fails it stays (keep_stage), the only copy of the VM. The
 * caller's error says which. */
static void fall_back_local(struct suspend *s, bool upload_failed, struct vmsnap_err *err)
{
    struct vmctx *c = &s->c;
    struct vmsnap_err e2;
    bool evict = upload_failed && !(s->o && s->o->no_evict);
    if (finish_local(c, s->cfg, c->stage, evict, upload_failed ? s->t : NULL, &s->t0, &e2) < 0) {
        if (upload_failed)
            vmsnap_err_wrap(err, "upload failed: ");
        keep_stage(c, s->cfg, e2.msg, err);
        return;
    }
    record_paused(c, s->cfg, NULL);
    if (upload_failed)
        vmsnap_err_wrap(err,
                        "upload failed; the VM is stopped and its checkpoint kept locally in "
                        "%s (run 'vmsnap vm suspend %s URL' again, or 'vmsnap vm resume "
                        "%s'): ",
                        c->ckpt, s->name, s->name);
    else
        vmsnap_err_wrap(err, "the VM is stopped with a local checkpoint in %s: ", c->ckpt);
    vm_unstage(c);
}

/* Take the state: the running VM stopped with its device state in the stage, on the RAM tmpfs
 * (the RAM file is renamed in, no copy, and packed from there), made a whole snapshot and
 * marked unsaved. */
static int suspend_take(struct suspend *s, struct vmsnap_err *err)
{
    struct vmctx *c = &s->c;
    s->from = PUSH_TAKEN;
    int rc = take_state(c, s->cfg, s->v, c->stage, s->t, &s->t0, err);
    if (rc < 0)
        return rc;
    sys_failpoint("suspend-taken");
    char p[PATH_LEN];
    bool ram_in_state = false;
    rc = vm_pjoin(p, c->stage, "memory-ranges", err);
    if (rc == 0)
        rc = vm_ckpt_ram(c, s->cfg, p, &ram_in_state, err);
    json_object_object_add(s->cfg, "ram_in_state", json_object_new_boolean(ram_in_state));
    if (rc == 0) {
        json_object *ck = vm_ckpt_config(s->cfg);
        rc = ck ? vm_ckpt_meta(c, ck, c->stage, false, err) : vmsnap_err_set(err, ENOMEM, "oom");
        json_object_put(ck);
    }
    if (rc < 0) {
        /* Nothing was uploaded; keep what exists as a local checkpoint if the RAM made it, and
         * if even that fails, the stage holds the only copy of the VM's memory: keep it. */
        if (vm_exists(p)) {
            fall_back_local(s, false, err);
            return rc;
        }
        /* the RAM is still the RAM file (or in the device state): the stage's device state is
         * half of the VM's newest state, completed by the next resume (vm_recover_interrupted) */
        vm_cfg_set_str(s->cfg, "status", "stopped");
        vm_cfg_save(c->cfgpath, s->cfg, NULL);
        vmsnap_err_wrap(err,
                        "the VM is stopped; the state it took is kept in %s and becomes its "
                        "checkpoint at the next 'vmsnap vm resume %s' once this is fixed: ",
                        c->stage, s->name);
        return rc;
    }
    /* From here until the store has it, the stage is the VM's only copy: marked, so that a
     * suspend killed during the upload leaves a snapshot the next command finds (a resume
     * restores it, a suspend pushes it, a stop keeps it) instead of an older checkpoint. */
    if ((rc = vm_mark_unsaved(c, err)) < 0) {
        fall_back_local(s, false, err);
        return rc;
    }
    sys_failpoint("suspend-staged");
    vm_step(s->t, "stage", &s->t0);
    return 0;
}

/* Upload the stage; the manifest written, the record says so and the VM's local state goes. */
static int suspend_upload(struct suspend *s, struct vmsnap_err *err)
{
    struct vmctx *c = &s->c;
    int rc = suspend_push(s, c->stage, err);
    if (rc < 0) {
        fall_back_local(s, true, err);
        return rc;
    }
    json_object_object_del(s->cfg, "ram_in_state");
    if ((rc = record_suspended(s, err)) < 0) {
        /* the stage stays marked (resume NAME restores it, the newest state the record does not
         * know) and says where its set is stored (resume NAME URL may go there) */
        char p[PATH_LEN];
        if (vm_pcat(p, c->stage, "/" STORED_MARK) == 0)
            vm_write_small(p, s->url, NULL);
        vmsnap_err_wrap(err,
                        "the snapshot is stored at %s, but the VM's record could not be "
                        "updated (its stage %s is kept: 'vmsnap vm resume %s' restores it, as "
                        "does 'vmsnap vm resume %s %s'): ",
                        s->url, c->stage, s->name, s->name, s->url);
        return rc;
    }
    teardown_local(s);
    return 0;
}

static int (*const suspend_phases[])(struct suspend *, struct vmsnap_err *) = {
    suspend_open,
    suspend_stopped,
    suspend_take,
    suspend_upload,
};

int vmsnap_vm_suspend(const struct vmsnap_vm_opts *o, const char *name, const char *url,
                      struct vmsnap_vm_timing *t, struct vmsnap_err *err)
{
    struct suspend s = {.o = o, .name = name, .url = url, .t = t, .t0 = mono_now()};
    const double tstart = s.t0;
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < sizeof(suspend_phases) / sizeof(suspend_phases[0]); i++)
        rc = suspend_phases[i](&s, err);
    if (rc < 0)
        vmsnap_err_wrap(err, "vm suspend %s: ", name);
    if (t)
        t->total = mono_now() - tstart;
    vmsnap_vmm_free(s.v);
    json_object_put(s.cfg);
    vm_ctx_fini(&s.c);
    return rc < 0 ? rc : 0;
}
