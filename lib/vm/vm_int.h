/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Private declarations of the vm module (the VM lifecycle on a node).
 *
 * The VM lifecycle on a node: named VMs under <state>/vms/<name>/ with
 *   vm.json          the live config (the same schema as a checkpoint's config.json) + status
 *   disk-vda.ext4    the upper disk the VM writes (absent while paused: it lives on, hard-linked,
 *                    as the checkpoint's rootfs-disk-vda.ext4)
 *   checkpoint/      the local checkpoint: memory-ranges, state, config.json, base-id,
 *                    rootfs-disk-vda.ext4
 *   ondemand/        a pulled memory image mapped privately by an on-demand VM
 *   qmp.sock console.sock console.log qemu.log pid
 * and the guest RAM file on tmpfs: <ram_dir>/vmsnap-<hash of the state dir>-<name>.ram.
 *
 * How the RAM image moves (docs/vm.md): the RAM file is the memory image (share=on,
 * x-ignore-shared). Pause copies it sparsely to checkpoint/memory-ranges on disk (the one copy
 * that frees the tmpfs memory). Suspend renames it into a staging directory on the same tmpfs
 * and the codec packs straight from there; nothing goes through the disk's page cache. Eager
 * resume from a store pulls into a tmpfs staging directory, so the decoder writes straight into
 * the file that is renamed into place as guest RAM; from a local checkpoint it is one sparse
 * copy to tmpfs. On-demand resume maps the image (checkpoint or pulled to disk) privately.
 *
 * Every step that can fail leaves either the running VM or the latest complete checkpoint: a new
 * checkpoint is built under checkpoint.new and swapped in by renames only once complete.
 */
#ifndef VMSNAP_VM_INT_H
#define VMSNAP_VM_INT_H

#include "vmsnap/vm.h"
#include "vmsnap/vmm.h"

#include <json-c/json.h>

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#define TMPFS_MAGIC_ 0x01021994
#define HUGETLBFS_MAGIC_ 0x958458f6
#define CID "vda"
#define DISK_CKPT "rootfs-disk-" CID ".ext4"
#define DISK_LIVE "disk-" CID ".ext4"
#define COMPLETE_MARK ".vmsnap-complete"
/* vm ls: seconds a VM's QEMU may take to say its state before it is shown `unresponsive` (a
 * hung QEMU held ls for the whole QMP timeout, 60 s, for each such VM) */
#define LS_QMP_WAIT 3.0
#define TAKING_MARK ".vmsnap-taking"
/* A directory being removed (vm_discard): CHECKPOINT.discard, ONDEMAND.discard */
#define DISCARD_SUFFIX ".discard"
#define PATH_LEN 4096
/* The staging directory holds the only copy of a snapshot: from the moment a suspend has it
 * complete until the store has it (a suspend killed meanwhile, or one that could store it
 * neither in the store nor as a local checkpoint). Marked by a hidden file (a push skips
 * vmsnap's own ".vmsnap-" names). */
#define UNSAVED_MARK ".vmsnap-unsaved"
/* In a stage whose set the store has (its URL): only the record could not say so. */
#define STORED_MARK ".vmsnap-stored"
/* A record or config file larger than this is refused; a snapshot's config.json may take at
 * most SET_CFG_MAX, so that the record made from it (pretty-printed, with the node's fields)
 * always fits. */
#define CFG_MAX (1 << 20)
#define SET_CFG_MAX (64 << 10)
#define GEN_MAX (INT64_C(1) << 62) /* a snapshot's generation at most (never wraps) */
#define CMDLINE_MAX 4096           /* a kernel command line at most (vm run and resume) */

struct vmctx {
    const struct vmsnap_vm_opts *o;
    const char *name;
    char state[PATH_LEN], vmdir[PATH_LEN], cfgpath[PATH_LEN], ckpt[PATH_LEN], disk[PATH_LEN];
    char ram_dir[PATH_LEN], ram[PATH_LEN], stage[PATH_LEN], ondemand[PATH_LEN];
    int lockfd;
    struct vmsnap_err rerr; /* why vm_recover_interrupted() could not complete a checkpoint */
};

/* ---- vm_ctx.c: paths and context ---- */
void vm_step(struct vmsnap_vm_timing *t, const char *name, double *t0);
int vm_pjoin(char *out, const char *a, const char *b, struct vmsnap_err *err);
int vm_pcat(char *out, const char *a, const char *b);
bool vm_valid_name(const char *n);
int vm_mkdir_p(const char *path, struct vmsnap_err *err);
int vm_rm_rf(const char *path);
int vm_discard(const char *path);
bool vm_exists(const char *p);
int vm_ctx_init(struct vmctx *c, const struct vmsnap_vm_opts *o, const char *name,
                struct vmsnap_err *err);
void vm_ctx_fini(struct vmctx *c);
int vm_ctx_lock(struct vmctx *c, struct vmsnap_err *err);
/* The pid of a process holding an flock on `path` (a VM directory: vm_ctx_lock), from
 * /proc/locks, or 0: another process's, or (`self`) one this process took. vm ls only looks:
 * taking the lock, even shared for a moment, could make a command starting then fail as busy. */
pid_t vm_lock_holder(const char *path, bool self);
int vm_check_ram_dir(struct vmctx *c, struct vmsnap_err *err);
int vm_ram_room(const struct vmctx *c, int64_t mem, struct vmsnap_err *err);
int vm_load(struct vmctx *c, json_object **cfg, struct vmsnap_err *err);
/* The start of a command on a known VM: the context (locked) and its record. */
int vm_open_record(struct vmctx *c, const struct vmsnap_vm_opts *o, const char *name,
                   json_object **cfg, struct vmsnap_err *err);
/* The end of a command: `rc` wrapped with "vm VERB NAME: " on failure, the total time in `t`,
 * the driver handle, the record and the context released. Returns rc. */
int vm_op_end(struct vmctx *c, json_object *cfg, struct vmsnap_vmm *v, int rc, const char *verb,
              struct vmsnap_vm_timing *t, double tstart, struct vmsnap_err *err);

/* ---- vm_record.c: the JSON record and config ---- */
int vm_cfg_load(const char *path, json_object **out, struct vmsnap_err *err);
int vm_cfg_save(const char *path, json_object *o, struct vmsnap_err *err);
const char *vm_cfg_str(json_object *o, const char *key);
int64_t vm_cfg_int(json_object *o, const char *key);
bool vm_cfg_bool(json_object *o, const char *key);
void vm_cfg_set_str(json_object *o, const char *key, const char *val);
/* Rewrite the node-local paths in a VM config object (kernel and initrd are kept) to the values
 * given (NULL: leave the key). Unknown keys and values are kept. */
int vm_config_rewrite(json_object *cfg, const char *disk_path, const char *ram_path,
                      const char *run_dir, struct vmsnap_err *err);
bool vm_status_live(const char *s);
bool vm_same_path(const char *a, const char *b);
int vm_vmm_from_cfg(struct vmctx *c, json_object *cfg, struct vmsnap_vmm **out,
                    struct vmsnap_err *err);
int vm_check_set_cfg(const char *file, const char *path, json_object *cfg, struct vmsnap_err *err);
int vm_state(struct vmctx *c, json_object *cfg, double wait, enum vmsnap_vmm_state *st, pid_t *pid,
             struct vmsnap_err *err);

/* ---- vm_console.c: readiness ---- */
/* Where the console log ends now: what a guest made to run after this prints comes past it
 * (QEMU appends to the log; a log made anew meanwhile, another file, is read whole). */
struct vm_console_mark {
    dev_t dev;
    ino_t ino; /* 0: no log yet */
    int64_t size;
};
struct vm_console_mark vm_console_mark(const struct vmctx *c);
/* c->o->ready (none: 0 at once): wait for a console line past `from` holding it, the step "ready"
 * of `t` (from *t0); ETIMEDOUT after the timeout, ESRCH when the QEMU of `cfg` (the VM's record)
 * exits first, EINVAL for a `ready` that is empty or longer than VMSNAP_VM_READY_MAX. */
int vm_wait_ready(struct vmctx *c, json_object *cfg, struct vm_console_mark from,
                  struct vmsnap_vm_timing *t, double *t0, struct vmsnap_err *err);

/* ---- vm_checkpoint.c: the checkpoint format ---- */
bool vm_stage_ok(const struct vmctx *c);
void vm_stage_consumed(const struct vmctx *c);
/* Remove the stage (vm_rm_snapshot_dir). */
void vm_unstage(const struct vmctx *c);
int vm_rm_snapshot_dir(const char *dir);
bool vm_stage_unsaved(const struct vmctx *c);
const char *vm_snapshot_missing(const char *dir);
bool vm_stage_stored_at(const struct vmctx *c, const char *url);
int vm_mark_unsaved(const struct vmctx *c, struct vmsnap_err *err);
int vm_write_small(const char *path, const char *s, struct vmsnap_err *err);
int vm_sparse_copy(const char *src, const char *dst, struct vmsnap_err *err);
int vm_image_copy(const struct vmctx *c, const char *src, const char *dst, struct vmsnap_err *err);
int vm_copy_small(const char *sdir, const char *ddir, const char *name, struct vmsnap_err *err);
bool vm_same_fs(const char *a, const char *b);
int vm_swap_checkpoint(struct vmctx *c, const char *newdir, struct vmsnap_err *err);
bool vm_mark_this_boot(const char *dir, const char *mark);
bool vm_complete_this_boot(const char *dir);
json_object *vm_ckpt_config(json_object *cfg);
int vm_write_taking(json_object *cfg, const char *sdir, struct vmsnap_err *err);
int vm_ckpt_meta(struct vmctx *c, json_object *cfg, const char *dir, bool link_disk,
                 struct vmsnap_err *err);
int vm_ckpt_ram(struct vmctx *c, json_object *cfg, const char *dst, bool *ram_in_state,
                struct vmsnap_err *err);

/* ---- vm_recover.c: crash recovery ---- */
const char *vm_taken_pending(const struct vmctx *c, char *buf);
const char *vm_recover_interrupted(struct vmctx *c, char *pend);
int vm_pending_error(const struct vmctx *c, const char *dir, const char *what,
                     struct vmsnap_err *err);
/* A frozen VM (its QEMU alive with the guest stopped, no command at work: a pause or suspend
 * killed after it stopped the guest, before or after its migration, or a resume killed after the
 * restore) let run on: what the killed command took or staged removed (the QEMU holds the
 * VM's newest state), 'cont' until the guest runs, then what the run supersedes removed as a
 * resume would, and the record (`rec`, saved) says running. The caller holds the lock. */
int vm_unfreeze(struct vmctx *c, json_object *rec, struct vmsnap_vmm *v, struct vmsnap_err *err);

#endif
