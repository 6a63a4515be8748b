/* SPDX-License-Identifier: Apache-2.0 */
/* Private declarations of the vmm module: the driver table, the handle, and the QMP helpers
 * (exposed for the unit test and the fuzzer). */
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
    int (*powerdown)(struct vmsnap_vmm *vmm, double seconds, bool *off, struct vmsnap_err *err);
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

/* ---- vmm_qmp.c: the QMP client ---- */

struct qmp {
    int fd;
    size_t len;
    char *buf;  /* QMP_LINE_MAX + 1 */
    char *line; /* the last line read */
    const char *sock;
    double timeout; /* seconds a reply may take (qmp_open: the VMM's qmp_wait, or qmp_timeout()) */
};

/* Connect to the VMM's QMP socket (retrying for `timeout` seconds while it is not there yet),
 * read the greeting and negotiate capabilities. Close with qmp_close(). */
int qmp_open(struct vmsnap_vmm *v, struct qmp *q, double timeout, struct vmsnap_err *err);
void qmp_close(struct qmp *q);
/* Run one command; `ret` (may be NULL) gets a new reference to its return value. */
int qmp_exec(struct qmp *q, const char *cmd, json_object *args, json_object **ret,
             struct vmsnap_err *err);
int qmp_exec_fd(struct qmp *q, const char *cmd, json_object *args, int pass_fd, json_object **ret,
                struct vmsnap_err *err);
int qmp_once(struct vmsnap_vmm *v, const char *cmd, json_object *args, json_object **ret,
             struct vmsnap_err *err);

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

#endif
