/* SPDX-License-Identifier: Apache-2.0 */
/*
 * vmsnap vmm: micro-VMs driven by a VMM process (the driver layer).
 *
 * A struct vmsnap_vmm is one VM process behind a small table of operations (boot, restore,
 * pause, snapshot, resume, stop, state). The "qemu" driver runs qemu-system-x86_64 (microvm
 * machine, guest RAM in a memory-backend-file on tmpfs) in the background with stderr in a log
 * file, and speaks QMP over its unix socket. A snapshot is the device state written by a
 * migration with x-ignore-shared to `<dir>/state`: the guest RAM stays in the RAM file, which is
 * itself the memory image. A handle holds no connection, so a process may create one for a VM
 * another process booted. The lifecycle of named VMs on a node (run, pause, suspend, resume, ...)
 * is built on it in include/vmsnap/vm.h.
 *
 * Errors: negative errno with `err` naming the file or QMP command.
 *
 * Thread safety: a handle is used by one thread at a time; handles of different VMs are
 * independent.
 */
#ifndef VMSNAP_VMM_H
#define VMSNAP_VMM_H

#include "vmsnap/common.h"

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

enum vmsnap_vmm_state {
    VMSNAP_VMM_DEAD = 0,     /* no process */
    VMSNAP_VMM_RUNNING = 1,  /* vCPUs running */
    VMSNAP_VMM_PAUSED = 2,   /* vCPUs stopped (paused, or after a snapshot) */
    VMSNAP_VMM_INCOMING = 3, /* waiting for or loading a snapshot */
    VMSNAP_VMM_OTHER = 4,    /* alive, in some other state (shutdown, internal error) */
    VMSNAP_VMM_IO_ERROR = 5, /* stopped by the VMM after a disk write failed (the host
                              * filesystem under the disk image is full): a checkpoint keeps
                              * the failed request, a resume retries it */
};

/* Name of a state: "dead", "running", "paused", "incoming", "io-error", "other". */
VMSNAP_API const char *vmsnap_vmm_state_name(enum vmsnap_vmm_state st);

/* What a driver needs to start a VM. Strings are copied by vmsnap_vmm_new(). */
struct vmsnap_vmm_config {
    const char *kernel;   /* uncompressed kernel with a PVH note (vmlinux) */
    const char *initrd;   /* initramfs, or NULL */
    const char *cmdline;  /* kernel command line, or NULL */
    uint64_t mem;         /* guest RAM in bytes, a multiple of 1 MiB */
    unsigned cpus;        /* vCPUs (1..64) */
    const char *disk;     /* raw upper disk image attached as virtio-blk (/dev/vda), or NULL */
    const char *ram_path; /* guest RAM file; must be on tmpfs/hugetlbfs unless ram_shared is off */
    bool ram_shared;      /* share=on: guest writes go to ram_path, snapshots leave RAM out.
                           * Off: ram_path is mapped privately (restore on demand); snapshots
                           * then carry the RAM in the state file. */
    bool state_has_ram;   /* restore: the state carries the RAM (it was taken from a VM whose
                           * RAM was not shared); ram_path then only gives the starting content */
    const char *accel;    /* "kvm" or "tcg" (see vmsnap_vmm_pick_accel) */
    const char *run_dir;  /* directory for qmp.sock, console.sock, console.log, qemu.log, pid */
    const char *qemu;     /* VMM binary; NULL: $VMSNAP_QEMU or qemu-system-x86_64 */
};

struct vmsnap_vmm;

/* Resolve an accelerator request: "auto" (or NULL) gives "kvm" only when /proc/cpuinfo shows
 * vmx or svm and /dev/kvm exists, else "tcg"; "kvm" and "tcg" are returned as given (kvm
 * without /dev/kvm fails with ENODEV). *out points to a static string. */
VMSNAP_API int vmsnap_vmm_pick_accel(const char *want, const char **out, struct vmsnap_err *err);

/* A handle for the VM described by `cfg` with the driver `driver` ("qemu"; NULL: "qemu").
 * Nothing is started. Free with vmsnap_vmm_free(). Errors: EINVAL (bad config, unknown driver,
 * a socket path longer than a unix socket allows), ENOMEM. */
VMSNAP_API int vmsnap_vmm_new(const char *driver, const struct vmsnap_vmm_config *cfg,
                              struct vmsnap_vmm **out, struct vmsnap_err *err);
/* Free the handle (the VM process, if any, keeps running). Accepts NULL. */
VMSNAP_API void vmsnap_vmm_free(struct vmsnap_vmm *vmm);

/* Cold-boot: start the VMM in the background (its own session, stderr to run_dir/qemu.log) and
 * wait until its control socket answers. The guest runs. Fails with the log's last lines in
 * `err` if the VMM exits early. */
VMSNAP_API int vmsnap_vmm_boot(struct vmsnap_vmm *vmm, struct vmsnap_err *err);
/* Start the VMM waiting for a snapshot, load `dir`/state into it (the RAM comes from
 * cfg->ram_path) and leave the VM paused; vmsnap_vmm_resume() runs it. On failure the process is
 * stopped and `dir` is untouched. */
VMSNAP_API int vmsnap_vmm_restore(struct vmsnap_vmm *vmm, const char *dir, struct vmsnap_err *err);
/* Stop the vCPUs (no-op when already paused). */
VMSNAP_API int vmsnap_vmm_pause(struct vmsnap_vmm *vmm, struct vmsnap_err *err);
/* Write the device state of the paused VM to `dir`/state (created 0600; replaced). With
 * cfg->ram_shared the RAM stays in cfg->ram_path and is not in the state. */
VMSNAP_API int vmsnap_vmm_snapshot(struct vmsnap_vmm *vmm, const char *dir, struct vmsnap_err *err);
/* Run the vCPUs. */
VMSNAP_API int vmsnap_vmm_resume(struct vmsnap_vmm *vmm, struct vmsnap_err *err);
/* Stop the VMM process: ask it to quit, then SIGTERM, then SIGKILL, and wait until it is gone
 * (at most about 10 s). Succeeds when there is no process. The RAM file is left in place. */
VMSNAP_API int vmsnap_vmm_stop(struct vmsnap_vmm *vmm, struct vmsnap_err *err);
/* Ask the guest to power off (the ACPI power button: QEMU's system_powerdown) and wait up to
 * `seconds` for the VMM process to exit, as it does once the guest powered off; *off says
 * whether it did (false, and 0, when there was no process or the guest did not power off in
 * time: vmsnap_vmm_stop() then stops it hard). A guest that ignores the button (no ACPI, nothing
 * listening) just runs on. Cancellable (vmsnap_cancel). */
VMSNAP_API int vmsnap_vmm_powerdown(struct vmsnap_vmm *vmm, double seconds, bool *off,
                                    struct vmsnap_err *err);
/* The VM's state; *pid (may be NULL) gets the process id or 0. */
VMSNAP_API int vmsnap_vmm_state(struct vmsnap_vmm *vmm, enum vmsnap_vmm_state *st, pid_t *pid,
                                struct vmsnap_err *err);
/* How long the VMM may take to answer this handle's control commands: `seconds` > 0 caps the
 * wait below the default (60 s, or $VMSNAP_QMP_TIMEOUT), 0 restores the default, < 0 means the
 * VMM is not asked at all: vmsnap_vmm_state() then reads the process id only and reports a live
 * process as VMSNAP_VMM_OTHER. For probes that must not hang on a busy or hung VMM (vm ls). */
VMSNAP_API void vmsnap_vmm_set_reply_wait(struct vmsnap_vmm *vmm, double seconds);

#ifdef __cplusplus
}
#endif
#endif
