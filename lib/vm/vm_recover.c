/* SPDX-License-Identifier: Apache-2.0 */
/* Crash recovery: what a pause or suspend killed or failed after QEMU stopped left, completed
 * (a taken state made a checkpoint, a torn swap finished or undone), or refused with the reason. */
#include "vm_int.h"

#include "sys/sys.h"
#include "util/util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A taken state in `dir` that can never be completed: a file it needs went (`gone`). The taking
 * mark comes after the device state and the config, and the RAM file and the live disk go only
 * once a later state holds them (a checkpoint swapped in, a set stored, a guest running on the
 * stage's image), so this is a directory whose removal a killed command left half done (the
 * teardown of a suspend whose set is stored, a stage superseded, a removal in directory order
 * before the marks went first): nothing of the VM's newest state is in it. It goes, marks
 * first; it used to be refused until --force ("... is gone; fix that"). */
static void drop_torn(struct vmctx *c, const char *dir, const char *gone)
{
    vlog(VMSNAP_LOG_WARN,
         "VM '%s': removing %s, what a killed command left of a pause or suspend whose state a "
         "later one superseded (%s)",
         c->name, dir, gone);
    vm_rm_snapshot_dir(dir);
}

/* Why the taken state in `dir` can never be completed (drop_torn), or NULL; *ck_out (when not
 * NULL) then gets its config, which the caller puts. */
static const char *taken_torn(const struct vmctx *c, const char *dir, json_object **ck_out)
{
    char p[PATH_LEN], mr[PATH_LEN];
    json_object *ck = NULL;
    const char *why = NULL;
    if (vm_pjoin(p, dir, "config.json", NULL) < 0 || vm_cfg_load(p, &ck, NULL) < 0 ||
        vm_pjoin(p, dir, "state", NULL) < 0 || !vm_exists(p))
        why = "no readable config.json or no device state";
    else if (vm_pjoin(mr, dir, "memory-ranges", NULL) == 0 && !vm_cfg_bool(ck, "ram_in_state") &&
             !vm_exists(c->ram) && !vm_exists(mr))
        why = "neither the RAM file nor its memory image is there";
    else if (!vm_exists(c->disk))
        why = "the VM's disk is gone";
    if (why || !ck_out)
        json_object_put(ck);
    else
        *ck_out = ck;
    return why;
}

/*
 * A pause or suspend killed between stopping QEMU and completing its checkpoint in `dir`
 * (checkpoint.new, or the stage): the device state and config are there (TAKING_MARK, this
 * boot), the RAM is still the VM's RAM file (or already renamed into `dir`), the disk is the live
 * disk. Redo the rest (RAM into the directory, disk, base-id, COMPLETE_MARK), so the directory is
 * the snapshot it was meant to be. The caller holds the lock and found no QEMU. A directory
 * missing what it needs is a torn removal (drop_torn); a failure to write (a full or read-only
 * filesystem) keeps it, the reason in c->rerr.
 */
static void finish_taken(struct vmctx *c, const char *dir, bool link_disk)
{
    char p[PATH_LEN], mr[PATH_LEN];
    if (!vm_exists(dir) || !vm_mark_this_boot(dir, TAKING_MARK) ||
        vm_mark_this_boot(dir, COMPLETE_MARK))
        return;
    json_object *ck = NULL;
    struct vmsnap_err e = {0};
    const char *torn = taken_torn(c, dir, &ck);
    if (torn) {
        drop_torn(c, dir, torn);
        return;
    }
    int rc = vm_pjoin(mr, dir, "memory-ranges", &e);
    bool ris = false, in_state = vm_cfg_bool(ck, "ram_in_state");
    if (rc == 0 && (in_state || vm_exists(c->ram)))
        rc = vm_ckpt_ram(c, ck, mr, &ris, &e); /* again from the RAM file: a copy may be torn */
    if (rc == 0 && vm_pjoin(p, dir, DISK_CKPT, &e) == 0)
        unlink(p);
    if (rc == 0)
        rc = vm_ckpt_meta(c, ck, dir, link_disk, &e);
    if (rc == 0)
        vlog(VMSNAP_LOG_WARN,
             "VM '%s': completed the checkpoint in %s that an interrupted pause or suspend left "
             "(generation %lld)",
             c->name, dir, (long long)vm_cfg_int(ck, "generation"));
    else {
        vlog(VMSNAP_LOG_ERROR,
             "VM '%s': %s holds the state of an interrupted pause or suspend that cannot be "
             "completed: %s",
             c->name, dir, e.msg);
        c->rerr = e;
    }
    json_object_put(ck);
}

/* The record after a recovered checkpoint: its generation, the status it would have had. */
static void record_recovered(struct vmctx *c, const char *dir, const char *status)
{
    char p[PATH_LEN];
    json_object *rec = NULL, *ck = NULL;
    if (vm_cfg_load(c->cfgpath, &rec, NULL) == 0 && vm_pjoin(p, dir, "config.json", NULL) == 0 &&
        vm_cfg_load(p, &ck, NULL) == 0) {
        json_object_object_add(rec, "generation",
                               json_object_new_int64(vm_cfg_int(ck, "generation")));
        vm_cfg_set_str(rec, "status", status);
        vm_cfg_save(c->cfgpath, rec, NULL);
    }
    json_object_put(rec);
    json_object_put(ck);
}

/* checkpoint.new (`newdir`) is a later checkpoint of the VM than its checkpoint (or it has
 * none): same lineage, higher generation. *nc_out (if not NULL) gets its config, which the
 * caller puts; NULL when it cannot be read. */
static bool newer_than_ckpt(const struct vmctx *c, const char *newdir, json_object **nc_out)
{
    char p[PATH_LEN];
    json_object *nc = NULL, *oc = NULL;
    if (vm_pjoin(p, newdir, "config.json", NULL) < 0 || vm_cfg_load(p, &nc, NULL) < 0)
        return false;
    if (vm_exists(c->ckpt) && vm_pjoin(p, c->ckpt, "config.json", NULL) == 0)
        vm_cfg_load(p, &oc, NULL);
    const char *nb = vm_cfg_str(nc, "base_id"), *ob = oc ? vm_cfg_str(oc, "base_id") : NULL;
    bool newer = !oc || (nb && ob && !strcmp(nb, ob) &&
                         vm_cfg_int(nc, "generation") > vm_cfg_int(oc, "generation"));
    json_object_put(oc);
    if (nc_out)
        *nc_out = nc;
    else
        json_object_put(nc);
    return newer;
}

/* A pause killed after its checkpoint was complete and QEMU stopped, but before the swap:
 * checkpoint.new is the VM's latest state, newer than the checkpoint. Finish the swap (the
 * caller holds the lock and found no QEMU). Anything else there is a torn attempt: left for the
 * next checkpoint to replace.
 *
 * No checkpoint but a checkpoint.old: the process, or the host, died between vm_swap_checkpoint's
 * two renames. It renames the checkpoint away only after every file of checkpoint.new is on
 * disk, so checkpoint.new is the VM's newest state then, even when another boot wrote it (after
 * a host crash, the only case vm_complete_this_boot() cannot vouch for). Without a complete
 * checkpoint.new, checkpoint.old goes back: a VM never loses its checkpoint to a torn swap. */
static void recover_new_checkpoint(struct vmctx *c)
{
    char newdir[PATH_LEN], old[PATH_LEN], p[PATH_LEN];
    if (vm_pcat(newdir, c->ckpt, ".new") < 0 || vm_pcat(old, c->ckpt, ".old") < 0)
        return;
    bool torn = !vm_exists(c->ckpt) && vm_exists(old);
    if (vm_exists(newdir))
        finish_taken(c, newdir, true);
    bool whole = vm_exists(newdir) && (vm_complete_this_boot(newdir) ||
                                       (torn && vm_pjoin(p, newdir, COMPLETE_MARK, NULL) == 0 &&
                                        vm_exists(p) && !vm_snapshot_missing(newdir)));
    json_object *nc = NULL;
    bool newer = whole && newer_than_ckpt(c, newdir, &nc);
    if (!whole || !nc) { /* (a config that cannot be read: not the VM's newest state either) */
        if (torn && rename(old, c->ckpt) == 0) {
            sys_fsync_parent(c->ckpt, NULL);
            vlog(VMSNAP_LOG_WARN,
                 "VM '%s': put %s back as its checkpoint (a checkpoint swap was interrupted)",
                 c->name, old);
        } else if (torn) {
            vlog(VMSNAP_LOG_ERROR, "VM '%s': cannot put %s back as its checkpoint: %s", c->name,
                 old, strerror(errno));
        }
        json_object_put(nc);
        return;
    }
    struct vmsnap_err e = {0};
    int src = -1;
    if (torn) {
        /* the swap's second rename, then the old one goes: vm_swap_checkpoint would remove
         * checkpoint.old first, the only fallback while the rename has not happened */
        if (rename(newdir, c->ckpt) == 0) {
            sys_fsync_parent(c->ckpt, NULL);
            vm_rm_rf(old);
            src = 0;
        } else {
            err_sys(&e, "rename %s to %s", newdir, c->ckpt);
        }
    } else if (newer) {
        src = vm_swap_checkpoint(c, newdir, &e);
    }
    if (src == 0) {
        vlog(VMSNAP_LOG_WARN,
             "VM '%s': completed a checkpoint whose pause was interrupted (generation %lld)",
             c->name, (long long)vm_cfg_int(nc, "generation"));
        /* as finish_local would have: the checkpoint holds the disk and the RAM now */
        unlink(c->disk);
        if (!vm_cfg_bool(nc, "ram_in_state"))
            unlink(c->ram);
        vm_discard(c->ondemand);
        record_recovered(c, c->ckpt, "paused");
    } else if (newer || torn) {
        vlog(VMSNAP_LOG_ERROR, "VM '%s': cannot complete the interrupted checkpoint %s: %s",
             c->name, newdir, e.msg);
        c->rerr = e;
    }
    json_object_put(nc);
}

/* The directory (checkpoint.new or the stage) holding the state a pause or suspend of this boot
 * took whose checkpoint is not complete, or a complete checkpoint.new newer than the checkpoint
 * and not swapped in (after vm_recover_interrupted: it could not), with the RAM file the VM's
 * newest state. Nothing may replace that RAM file or resume an older checkpoint over it. NULL
 * when there is none (`buf` holds the path otherwise). */
const char *vm_taken_pending(const struct vmctx *c, char *buf)
{
    /* (a torn one is not: the next command removes it, drop_torn) */
    if (vm_pcat(buf, c->ckpt, ".new") == 0 && vm_exists(buf) &&
        vm_mark_this_boot(buf, TAKING_MARK) &&
        (vm_mark_this_boot(buf, COMPLETE_MARK) ? newer_than_ckpt(c, buf, NULL)
                                               : !taken_torn(c, buf, NULL)))
        return buf;
    if (vm_stage_ok(c) && vm_mark_this_boot(c->stage, TAKING_MARK) &&
        !vm_mark_this_boot(c->stage, COMPLETE_MARK) && !taken_torn(c, c->stage, NULL))
        return strcpy(buf, c->stage);
    return NULL;
}

/* The stage's snapshot is the set the record says the VM was suspended to: a suspend killed
 * during its teardown (teardown_local: the record saved "suspended" with the URL and the
 * stage's generation, then the stage's unsaved mark removed, then the disk, the RAM file, the
 * checkpoint, the stage). The generation is the one the suspend's take gave the stage, so a
 * stage of another take (earlier or later) never matches. */
static bool stage_stored(const struct vmctx *c)
{
    char p[PATH_LEN];
    json_object *rec = NULL, *ck = NULL;
    bool stored = false;
    if (vm_cfg_load(c->cfgpath, &rec, NULL) == 0 &&
        vm_pjoin(p, c->stage, "config.json", NULL) == 0 && vm_cfg_load(p, &ck, NULL) == 0) {
        const char *st = vm_cfg_str(rec, "status"), *url = vm_cfg_str(rec, "url");
        const char *rb = vm_cfg_str(rec, "base_id"), *sb = vm_cfg_str(ck, "base_id");
        stored = st && !strcmp(st, "suspended") && url && *url && rb && sb && !strcmp(rb, sb) &&
                 vm_cfg_int(rec, "generation") > 0 &&
                 vm_cfg_int(rec, "generation") == vm_cfg_int(ck, "generation");
    }
    json_object_put(rec);
    json_object_put(ck);
    return stored;
}

/* The local checkpoint is older than the stage's snapshot (same lineage, lower generation), or
 * unreadable as a checkpoint of it: what the teardown of a suspend from the stage removes. */
static bool ckpt_superseded(const struct vmctx *c)
{
    char p[PATH_LEN];
    json_object *oc = NULL, *ck = NULL;
    bool older = false;
    if (vm_pjoin(p, c->stage, "config.json", NULL) == 0 && vm_cfg_load(p, &ck, NULL) == 0 &&
        vm_pjoin(p, c->ckpt, "config.json", NULL) == 0 && vm_cfg_load(p, &oc, NULL) == 0) {
        const char *ob = vm_cfg_str(oc, "base_id"), *sb = vm_cfg_str(ck, "base_id");
        older = ob && sb && !strcmp(ob, sb) &&
                vm_cfg_int(oc, "generation") < vm_cfg_int(ck, "generation");
    }
    json_object_put(oc);
    json_object_put(ck);
    return older;
}

/* A suspend killed during its teardown, after the record said where its set is stored: the
 * teardown finished (the stage was marked unsaved again, the record said "stopped", and a
 * resume from the URL was refused: "a snapshot that its last suspend could not store"). */
static void finish_teardown(struct vmctx *c)
{
    vlog(VMSNAP_LOG_WARN,
         "VM '%s': removing %s, the stage of a suspend killed after its set was stored (the "
         "record names it)",
         c->name, c->stage);
    unlink(c->disk);
    unlink(c->ram);
    if (vm_exists(c->ckpt) && ckpt_superseded(c))
        vm_discard(c->ckpt);
    vm_discard(c->ondemand);
    vm_unstage(c);
}

/* Everything a killed or failed pause or suspend may have left, completed (the caller holds the
 * lock and found no QEMU): checkpoint.new swapped in when newer, a taken stage made a marked
 * snapshot. Returns what could not be (vm_taken_pending, path in `pend`), or NULL. */
const char *vm_recover_interrupted(struct vmctx *c, char *pend)
{
    recover_new_checkpoint(c);
    /* A taken stage is completed whatever other marks it has: an unsaved mark beside a taking
     * mark without a complete one is no snapshot (the unsaved mark comes after the complete
     * one), and skipping it left the stage pending for good (needing --force). */
    if (vm_stage_ok(c))
        finish_taken(c, c->stage, false);
    if (vm_stage_ok(c) && !vm_stage_unsaved(c) && vm_mark_this_boot(c->stage, TAKING_MARK) &&
        vm_mark_this_boot(c->stage, COMPLETE_MARK) && stage_stored(c))
        finish_teardown(c);
    /* Marked unsaved again only with both marks: what a suspend killed after its stage was
     * complete left, or a resume from it killed before the guest ran. A complete mark alone is
     * a stage on its way out (vm_rm_snapshot_dir), already superseded. */
    if (vm_stage_ok(c) && !vm_stage_unsaved(c) && vm_mark_this_boot(c->stage, TAKING_MARK) &&
        vm_mark_this_boot(c->stage, COMPLETE_MARK) && !vm_snapshot_missing(c->stage) &&
        vm_mark_unsaved(c, NULL) == 0)
        record_recovered(c, c->stage, "stopped");
    return vm_taken_pending(c, pend);
}

/* The error for a command that would go past a vm_taken_pending() directory. */
int vm_pending_error(const struct vmctx *c, const char *dir, const char *what,
                     struct vmsnap_err *err)
{
    return vmsnap_err_set(err, EBUSY,
                          "VM '%s': the state its last pause or suspend took is in %s, but its "
                          "checkpoint could not be completed (%s); fix that and run 'vmsnap vm "
                          "resume %s', which completes it first%s",
                          c->name, dir, c->rerr.code ? c->rerr.msg : "see the log above", c->name,
                          what);
}

/* 'cont' until the guest is seen running twice, UNFREEZE_SETTLE_MS apart: a pause or suspend
 * killed during its migration leaves QEMU migrating (it holds the state file's descriptor), and
 * the migration stops the guest again when it completes ('cont' is refused while it finalizes).
 * With the RAM shared that takes milliseconds; a VM restored on demand sends its whole RAM. */
#define UNFREEZE_SETTLE_MS 100
#define UNFREEZE_TRIES 300 /* 30 s */
static int cont_settled(struct vmctx *c, struct vmsnap_vmm *v, struct vmsnap_err *err)
{
    enum vmsnap_vmm_state st = VMSNAP_VMM_PAUSED;
    struct vmsnap_err ce = {0};
    int seen = 0;
    for (int i = 0; i < UNFREEZE_TRIES && seen < 2; i++) {
        if (st != VMSNAP_VMM_RUNNING && vmsnap_vmm_resume(v, &ce) == 0)
            ce.code = 0;
        sys_sleep_ms(UNFREEZE_SETTLE_MS);
        int rc = vmsnap_vmm_state(v, &st, NULL, err);
        if (rc < 0)
            return vmsnap_err_wrap(err, "VM '%s': its frozen QEMU after 'cont': ", c->name);
        if (st != VMSNAP_VMM_RUNNING && st != VMSNAP_VMM_PAUSED)
            return vmsnap_err_set(err, EIO, "VM '%s': its frozen QEMU is %s after 'cont'", c->name,
                                  vmsnap_vmm_state_name(st));
        seen = st == VMSNAP_VMM_RUNNING ? seen + 1 : 0;
    }
    if (seen < 2)
        return vmsnap_err_set(err, EIO,
                              "VM '%s': its frozen QEMU does not let the guest run (%s): 'vmsnap "
                              "vm stop %s' ends it, then resume the VM",
                              c->name, ce.code ? ce.msg : "it stopped again", c->name);
    return 0;
}

int vm_unfreeze(struct vmctx *c, json_object *rec, struct vmsnap_vmm *v, struct vmsnap_err *err)
{
    char newdir[PATH_LEN], prev[PATH_LEN], p[PATH_LEN];
    /* a pause's partial take: the QEMU holds all of it (a complete checkpoint.new is never made
     * while QEMU lives) */
    if (vm_pcat(newdir, c->ckpt, ".new") == 0 && vm_exists(newdir) &&
        !vm_complete_this_boot(newdir))
        vm_rm_snapshot_dir(newdir);
    /* The stage: complete, the snapshot a resume restored this QEMU from (the RAM file is its
     * image's second name): its unsaved mark goes before the guest runs, the others once it
     * runs (as resume_run does: killed in between, a stop keeps it as the snapshot). Anything
     * else there (a suspend's partial take, a pull's remains) is superseded by the QEMU. */
    bool from_stage = vm_stage_ok(c) && vm_mark_this_boot(c->stage, COMPLETE_MARK) &&
                      !vm_snapshot_missing(c->stage);
    if (from_stage && vm_pcat(p, c->stage, "/" UNSAVED_MARK) == 0)
        unlink(p);
    else if (vm_stage_ok(c))
        vm_unstage(c);
    int rc = cont_settled(c, v, err);
    if (rc < 0)
        return rc;
    vlog(VMSNAP_LOG_WARN,
         "VM '%s': let run the guest that a killed command left stopped in its QEMU (frozen)",
         c->name);
    /* what the resume that made this QEMU would have removed once the guest ran */
    if (from_stage) {
        vm_stage_consumed(c);
        vm_rm_rf(c->stage);
    }
    if (vm_pcat(prev, c->disk, ".prev") == 0)
        unlink(prev); /* (the QEMU runs on c->disk) */
    if (vm_cfg_bool(rec, "ram_shared"))
        vm_discard(c->ondemand);
    vm_cfg_set_str(rec, "status", "running");
    return vm_cfg_save(c->cfgpath, rec, err);
}
