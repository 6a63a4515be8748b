/* SPDX-License-Identifier: Apache-2.0 */
/* Private declarations of the vmm module: the driver table, the QMP reply parser and the
 * lifecycle's config helpers (exposed for the unit test). */
#ifndef VMSNAP_VMM_INT_H
#define VMSNAP_VMM_INT_H

#include "vmsnap/vmm.h"

#include <json-c/json.h>

/* One VMM implementation. Every operation gets the handle; `boot` starts the process
 * (incoming: waiting for a snapshot, vCPUs stopped). */
struct vmm_driver {
    const char *name;
    int (*boot)(struct vmsnap_vmm *vmm, bool incoming, struct vmsnap_err *err);
    int (*restore)(struct vmsnap_vmm *vmm, const char *dir, struct vmsnap_err *err);
    int (*pause)(struct vmsnap_vmm *vmm, struct vmsnap_err *err);
    int (*snapshot)(struct vmsnap_vmm *vmm, const char *dir, struct vmsnap_err *err);
    int (*resume)(struct vmsnap_vmm *vmm, struct vmsnap_err *err);
    int (*stop)(struct vmsnap_vmm *vmm, struct vmsnap_err *err);
    int (*state)(struct vmsnap_vmm *vmm, enum vmsnap_vmm_state *st, pid_t *pid,
                 struct vmsnap_err *err);
};

struct vmsnap_vmm {
    const struct vmm_driver *drv;
    char *kernel, *initrd, *cmdline, *disk, *ram_path, *accel, *run_dir, *qemu;
    uint64_t mem;
    unsigned cpus;
    bool ram_shared;
    bool state_has_ram;
    double qmp_wait; /* > 0: seconds a QMP reply may take at most (a probe's); 0: the default;
                      * < 0: state() reads the pid file only, QEMU is not asked */
    char qmp_sock[108], con_sock[108];
    char console_log[4096], qemu_log[4096], pidfile[4096];
};

extern const struct vmm_driver vmm_qemu_driver;

/* Classify one QMP message (one JSON object). Returns 1 for {"return": ...} (*ret gets a new
 * reference to the value when ret is not NULL), 0 for an event or the greeting (ignored), or
 * -EIO/-EPROTO for {"error": ...} / anything malformed, with `err` holding the error's class
 * and desc. `what` names the command in messages. */
int qmp_parse_reply(const char *line, const char *what, json_object **ret, struct vmsnap_err *err);

/* Map a query-status "status" string (NULL: not a string) to a state. */
enum vmsnap_vmm_state qmp_status_state(const char *status);

/* Double every ',' of `s` into `out` (QEMU option values); -ENAMETOOLONG if it does not fit. */
int qemu_opt_escape(const char *s, char *out, size_t len);

/* Whether /proc/cpuinfo text `cpuinfo` has a vmx or svm flag. */
bool vmm_cpuinfo_has_virt(const char *cpuinfo);

/* Rewrite the node-local paths in a VM config object (kernel and initrd are kept) to the values
 * given (NULL: leave the key). Unknown keys and values are kept. */
int vm_config_rewrite(json_object *cfg, const char *disk_path, const char *ram_path,
                      const char *run_dir, struct vmsnap_err *err);

#endif
