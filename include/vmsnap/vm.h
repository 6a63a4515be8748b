/* SPDX-License-Identifier: Apache-2.0 */
/*
 * vmsnap vm: the lifecycle of micro-VMs on a node, on top of the VMM driver (vmsnap/vmm.h).
 *
 * Named VMs under a state directory (default /var/lib/vmsnap, or $VMSNAP_STATE_DIR): run, pause
 * to a local checkpoint, suspend to an object store (include/vmsnap/xfer.h), resume from either,
 * list, stop, console. A checkpoint directory holds memory-ranges (guest RAM image, sparse),
 * state (device state), config.json (everything needed to start the VM elsewhere), base-id
 * (lineage) and rootfs-disk-<cid>.ext4 (the upper disk). docs/vm.md describes the layout and how
 * the RAM image moves.
 *
 * Errors: negative errno with `err` naming the VM, file or QMP command. Failure guarantees: a VM
 * is left either running or with its latest complete checkpoint intact; a failed suspend upload
 * keeps the local checkpoint; a failed resume keeps the snapshot it came from.
 *
 * Thread safety: calls on different VMs are independent; calls on the same VM must not overlap
 * (the lifecycle layer takes an flock on the VM's directory and fails with EBUSY otherwise).
 */
#ifndef VMSNAP_VM_H
#define VMSNAP_VM_H

#include "vmsnap/common.h"
#include "vmsnap/xfer.h"

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

#define VMSNAP_VM_DEFAULT_STATE_DIR "/var/lib/vmsnap"
#define VMSNAP_VM_DEFAULT_RAM_DIR "/dev/shm"
#define VMSNAP_VM_NAME_MAX 64
#define VMSNAP_VM_MAX_STEPS 16

/* Options shared by the lifecycle calls. Zeroed means defaults. */
struct vmsnap_vm_opts {
    const char *state_dir; /* NULL: $VMSNAP_STATE_DIR, else /var/lib/vmsnap */
    const char *ram_dir;   /* guest RAM files; NULL: $VMSNAP_RAM_DIR, else /dev/shm. Must be
                            * tmpfs or hugetlbfs (checked). */
    const char *accel;     /* "auto" (NULL), "kvm", "tcg" */
    const char *qemu;      /* VMM binary (NULL: $VMSNAP_QEMU or qemu-system-x86_64) */
    bool on_demand;        /* resume: map the memory image privately instead of loading it */
    bool no_evict;         /* resume/pause: skip page-cache hygiene (for benchmarks) */
    bool no_base;          /* suspend: do not use the set the VM came from as the push's base
                            * (see vmsnap_xfer_opts.base); an explicit xfer->base still applies */
    const struct vmsnap_xfer_opts *xfer; /* suspend/resume with a URL; NULL: defaults */
    /* resume from a URL: a snapshot set comes from a store and is not trusted to name node
     * files. Its kernel and initrd are used only when they resolve (symlinks followed) to
     * regular files under one of `asset_dirs` (colon-separated; NULL: $VMSNAP_ASSET_DIRS).
     * `kernel` / `initrd` override the set's (the caller vouches for them); a VM this node
     * already has keeps the kernel and initrd of its own record. */
    const char *asset_dirs;
    const char *kernel, *initrd;
    /* resume: replace a local checkpoint even when it is newer than the snapshot at the URL (a
     * later generation of the same VM), or go back to the previous checkpoint past the state of
     * an interrupted pause; without it such a resume is refused */
    bool force;
    /* run/resume: start the guest even when its RAM directory has less room than its memory
     * (a guest whose RAM file cannot grow dies of SIGBUS) */
    bool ram_overcommit;
    /* run/resume: readiness. Once the guest runs, wait until its serial console prints a line
     * holding `ready` (1 to VMSNAP_VM_READY_MAX bytes; only what it prints after this call made
     * it run counts) for at most `ready_timeout` seconds (0: VMSNAP_VM_READY_TIMEOUT): the step
     * "ready" of the timing. A guest that does not print it in time fails the call with
     * ETIMEDOUT, one whose QEMU exits meanwhile with ESRCH; either way the VM is left as the
     * run or resume made it (running). NULL: no wait. */
    const char *ready;
    unsigned ready_timeout;
};
#define VMSNAP_VM_READY_MAX 256
#define VMSNAP_VM_READY_TIMEOUT 60
#define VMSNAP_VM_READY_TIMEOUT_MAX 3600 /* what the CLI and the daemon take */

/* Step timings of one lifecycle call, in call order. */
struct vmsnap_vm_timing {
    unsigned n;
    struct {
        const char *name; /* static: "pause", "snapshot", "teardown", "checkpoint", "upload",
                           * "download", "stage", "restore", "evict", "resume", "boot", ... */
        double seconds;
    } step[VMSNAP_VM_MAX_STEPS];
    double total;
    uint64_t object_bytes; /* suspend: bytes of the pushed objects; resume from a URL: of the
                            * pulled set's objects */
    uint64_t copied_bytes; /* suspend: of those, copied by the store from the base snapshot */
    uint64_t deltas;       /* suspend of a layered set: files stored as a delta */
    uint64_t cached_bytes; /* resume: of object_bytes, read from the node's object cache */
};

/* How to cold-boot a new VM. */
struct vmsnap_vm_run_args {
    const char *kernel; /* required */
    const char *initrd; /* may be NULL */
    const char *append; /* kernel command line, may be NULL */
    uint64_t mem;       /* 0: 512 MiB */
    unsigned cpus;      /* 0: 1 */
    uint64_t disk_size; /* upper disk; 0: 4 GiB */
};

/* Create the VM `name` (letters, digits, '.', '_', '-'; at most VMSNAP_VM_NAME_MAX) under the
 * state directory: a fresh upper disk (vmsnap_disk_create), a RAM file on the RAM directory, a
 * new base-id, and boot it. EEXIST if the name is taken. On failure nothing is left. */
VMSNAP_API int vmsnap_vm_run(const struct vmsnap_vm_opts *o, const char *name,
                             const struct vmsnap_vm_run_args *a, struct vmsnap_vm_timing *t,
                             struct vmsnap_err *err);
/* Checkpoint the running VM to its local checkpoint directory (replacing the previous one only
 * once the new one is complete), stop it and free its RAM file. On failure the VM is resumed. */
VMSNAP_API int vmsnap_vm_pause(const struct vmsnap_vm_opts *o, const char *name,
                               struct vmsnap_vm_timing *t, struct vmsnap_err *err);
/* Checkpoint the running VM, stop it and push the checkpoint to `url` (manifest last); a
 * stopped VM with a local checkpoint (paused, or after a failed upload) has that pushed. Only
 * after the push succeeded is the VM's local checkpoint, disk and RAM removed (its record stays,
 * status "suspended"). If the push fails the checkpoint is kept locally (as after a pause; the
 * error says so) and a later suspend or resume can use it. */
VMSNAP_API int vmsnap_vm_suspend(const struct vmsnap_vm_opts *o, const char *name, const char *url,
                                 struct vmsnap_vm_timing *t, struct vmsnap_err *err);
/* Resume `name` from its local checkpoint (`url` NULL) or from the snapshot set at `url`
 * (creating the VM's record when this node has none): clone the disk out, rewrite config
 * paths, restore (eager: the image becomes the tmpfs RAM file; o->on_demand: the image is
 * mapped privately), release the restore files' page cache (pulled files truncated, the local
 * checkpoint only evicted) and run. The source snapshot is never modified. EBUSY if the VM is
 * running. */
VMSNAP_API int vmsnap_vm_resume(const struct vmsnap_vm_opts *o, const char *name, const char *url,
                                struct vmsnap_vm_timing *t, struct vmsnap_err *err);
/* Stop the VM's process and free its RAM file. With `remove`, delete the VM's whole record
 * (disk and checkpoint included). */
VMSNAP_API int vmsnap_vm_stop(const struct vmsnap_vm_opts *o, const char *name, bool remove,
                              struct vmsnap_err *err);
/* vmsnap_vm_stop with the guest asked first: a running guest gets the ACPI power button and up
 * to `timeout` seconds to power off (a guest that syncs and unmounts first leaves its disks
 * clean) before the hard stop; *graceful (may be NULL) says whether it powered off itself. 0:
 * the hard stop at once (vmsnap_vm_stop). A paused, frozen or dead VM is stopped hard (its guest
 * cannot answer); so is one whose wait is interrupted (vmsnap_cancel: the stop is not left
 * half-done). */
VMSNAP_API int vmsnap_vm_shutdown(const struct vmsnap_vm_opts *o, const char *name, bool remove,
                                  unsigned timeout, bool *graceful, struct vmsnap_err *err);
#define VMSNAP_VM_SHUTDOWN_MAX 3600

/* One VM as vmsnap_vm_list() sees it. Strings are valid during the callback. */
struct vmsnap_vm_info {
    const char *name;
    const char *status; /* "running", "paused" (checkpointed), "suspended", "stopped", "dead"
                         * (the process vanished without a checkpoint being taken since),
                         * "unsaved" (its last snapshot is only in the staging directory: a
                         * suspend could store it nowhere), "interrupted" (a pause or suspend
                         * stopped it but could not complete its checkpoint: the next resume
                         * does, or refuses until it can), "busy" (a vmsnap command holds the
                         * VM: pause, suspend, resume, run or stop is changing it; see
                         * busy_pid), or the VMM's own state when it is alive but not running */
    pid_t pid;          /* 0 when no process */
    const char *accel;
    uint64_t mem;
    bool checkpoint; /* a local checkpoint exists */
    const char *url; /* where it was suspended to, or NULL */
    const char *dir; /* the VM's directory */
    pid_t busy_pid;  /* the vmsnap command holding the VM ("busy"), else 0 */
};
typedef int (*vmsnap_vm_list_fn)(void *arg, const struct vmsnap_vm_info *info);
/* Call `fn` for every VM under the state directory, sorted by name. */
VMSNAP_API int vmsnap_vm_list(const struct vmsnap_vm_opts *o, vmsnap_vm_list_fn fn, void *arg,
                              struct vmsnap_err *err);
/* Path of the VM's serial console log into `buf`. */
VMSNAP_API int vmsnap_vm_console_path(const struct vmsnap_vm_opts *o, const char *name, char *buf,
                                      size_t len, struct vmsnap_err *err);
/* Send `line` (a newline is added) to the VM's serial console. */
VMSNAP_API int vmsnap_vm_console_send(const struct vmsnap_vm_opts *o, const char *name,
                                      const char *line, struct vmsnap_err *err);

#ifdef __cplusplus
}
#endif
#endif
