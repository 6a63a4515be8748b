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

/*
 * A pause or suspend killed between stopping QEMU and completing its checkpoint in `dir`
 * (checkpoint.new, or the stage): the device state and config are there (TAKING_MARK, this
 * boot), the RAM is still the VM's RAM file (or already renamed into `dir`), the disk is the live
 * disk. Redo the rest (RAM into the directory, disk, base-id, COMPLETE_MARK), so the directory is
 * the snapshot it was meant to be. The caller holds the lock and found no QEMU.
 */
static void finish_taken(struct vmctx *c, const char *dir, bool link_disk)
{
    char p[PATH_LEN];
    if (!exists(dir) || !mark_this_boot(dir, TAKING_MARK) || mark_this_boot(dir, COMPLETE_MARK))
        return;
    json_object *ck = NULL;
    struct vmsnap_err e = {0};
    if (pjoin(p, dir, "config.json", NULL) < 0 || cfg_load(p, &ck, NULL) < 0 ||
        pjoin(p, dir, "state", NULL) < 0 || !exists(p)) {
        json_object_put(ck);
        return;
    }
    int rc = pjoin(p, dir, "memory-ranges", &e);
    bool ris = false;
    if (rc == 0 && (cfg_bool(ck, "ram_in_state") || exists(c->ram)))
        rc = ckpt_ram(c, ck, p, &ris, &e); /* again from the RAM file: a copy may be torn */
    else if (rc == 0 && !exists(p))
        rc = vmsnap_err_set(&e, ENOENT, "neither %s nor %s exists", c->ram, p);
    if (rc == 0 && !exists(c->disk))
        rc = vmsnap_err_set(&e, ENOENT, "%s is gone", c->disk);
    if (rc == 0 && pjoin(p, dir, DISK_CKPT, &e) == 0)
        unlink(p);
    if (rc == 0)
        rc = ckpt_meta(c, ck, dir, link_disk, &e);
    if (rc == 0)
        vlog(VMSNAP_LOG_WARN,
             "VM '%s': completed the checkpoint in %s that an interrupted pause or suspend left "
             "(generation %lld)",
             c->name, dir, (long long)cfg_int(ck, "generation"));
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
    if (cfg_load(c->cfgpath, &rec, NULL) == 0 && pjoin(p, dir, "config.json", NULL) == 0 &&
        cfg_load(p, &ck, NULL) == 0) {
        json_object_object_add(rec, "generation", json_object_new_int64(cfg_int(ck, "generation")));
        cfg_set_str(rec, "status", status);
        cfg_save(c->cfgpath, rec, NULL);
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
    if (pjoin(p, newdir, "config.json", NULL) < 0 || cfg_load(p, &nc, NULL) < 0)
        return false;
    if (exists(c->ckpt) && pjoin(p, c->ckpt, "config.json", NULL) == 0)
        cfg_load(p, &oc, NULL);
    const char *nb = cfg_str(nc, "base_id"), *ob = oc ? cfg_str(oc, "base_id") : NULL;
    bool newer = !oc || (nb && ob && !strcmp(nb, ob) &&
                         cfg_int(nc, "generation") > cfg_int(oc, "generation"));
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
 * No checkpoint but a checkpoint.old: the process, or the host, died between swap_checkpoint's
 * two renames. It renames the checkpoint away only after every file of checkpoint.new is on
 * disk, so checkpoint.new is the VM's newest state then, even when another boot wrote it (after
 * a host crash, the only case complete_this_boot() cannot vouch for). Without a complete
 * checkpoint.new, checkpoint.old goes back: a VM never loses its checkpoint to a torn swap. */
static void recover_new_checkpoint(struct vmctx *c)
{
    char newdir[PATH_LEN], old[PATH_LEN], p[PATH_LEN];
    if (pcat(newdir, c->ckpt, ".new") < 0 || pcat(old, c->ckpt, ".old") < 0)
        return;
    bool torn = !exists(c->ckpt) && exists(old);
    if (exists(newdir))
        finish_taken(c, newdir, true);
    bool whole = exists(newdir) && (complete_this_boot(newdir) ||
                                    (torn && pjoin(p, newdir, COMPLETE_MARK, NULL) == 0 &&
                                     exists(p) && !snapshot_missing(newdir)));
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
        /* the swap's second rename, then the old one goes: swap_checkpoint would remove
         * checkpoint.old first, the only fallback while the rename has not happened */
        if (rename(newdir, c->ckpt) == 0) {
            sys_fsync_parent(c->ckpt, NULL);
            rm_rf(old);
            src = 0;
        } else {
            err_sys(&e, "rename %s to %s", newdir, c->ckpt);
        }
    } else if (newer) {
        src = swap_checkpoint(c, newdir, &e);
    }
    if (src == 0) {
        vlog(VMSNAP_LOG_WARN,
             "VM '%s': completed a checkpoint whose pause was interrupted (generation %lld)",
             c->name, (long long)cfg_int(nc, "generation"));
        /* as finish_local would have: the checkpoint holds the disk and the RAM now */
        unlink(c->disk);
        if (!cfg_bool(nc, "ram_in_state"))
            unlink(c->ram);
        rm_rf(c->ondemand);
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
 * and not swapped in (after recover_interrupted: it could not), with the RAM file the VM's
 * newest state. Nothing may replace that RAM file or resume an older checkpoint over it. NULL
 * when there is none (`buf` holds the path otherwise). */
const char *taken_pending(const struct vmctx *c, char *buf)
{
    if (pcat(buf, c->ckpt, ".new") == 0 && exists(buf) && mark_this_boot(buf, TAKING_MARK) &&
        (!mark_this_boot(buf, COMPLETE_MARK) || newer_than_ckpt(c, buf, NULL)))
        return buf;
    if (stage_ok(c) && mark_this_boot(c->stage, TAKING_MARK) &&
        !mark_this_boot(c->stage, COMPLETE_MARK))
        return strcpy(buf, c->stage);
    return NULL;
}

/* Everything a killed or failed pause or suspend may have left, completed (the caller holds the
 * lock and found no QEMU): checkpoint.new swapped in when newer, a taken stage made a marked
 * snapshot. Returns what could not be (taken_pending, path in `pend`), or NULL. */
const char *recover_interrupted(struct vmctx *c, char *pend)
{
    recover_new_checkpoint(c);
    if (stage_ok(c) && !stage_unsaved(c)) {
        finish_taken(c, c->stage, false);
        if (mark_this_boot(c->stage, COMPLETE_MARK) && !snapshot_missing(c->stage) &&
            mark_unsaved(c, NULL) == 0)
            record_recovered(c, c->stage, "stopped");
    }
    return taken_pending(c, pend);
}

/* The error for a command that would go past a taken_pending() directory. */
int pending_error(const struct vmctx *c, const char *dir, const char *what, struct vmsnap_err *err)
{
    return vmsnap_err_set(err, EBUSY,
                          "VM '%s': the state its last pause or suspend took is in %s, but its "
                          "checkpoint could not be completed (%s); fix that and run 'vmsnap vm "
                          "resume %s', which completes it first%s",
                          c->name, dir, c->rerr.code ? c->rerr.msg : "see the log above", c->name,
                          what);
}
