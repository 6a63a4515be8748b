/* SPDX-License-Identifier: Apache-2.0 */
/* vm ls: every VM under the state directory with the status its files and its QEMU give. */
#include "vm_int.h"

#include "util/util.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int vmsnap_vm_list(const struct vmsnap_vm_opts *o, vmsnap_vm_list_fn fn, void *arg,
                   struct vmsnap_err *err)
{
    struct vmctx c;
    int rc = vm_ctx_init(&c, o, "x", err);
    if (rc < 0)
        return rc;
    char vms[PATH_LEN];
    if (vm_pcat(vms, c.state, "/vms") < 0)
        return vmsnap_err_set(err, ENAMETOOLONG, "path %s too long", c.state);
    DIR *d = opendir(vms);
    if (!d)
        return errno == ENOENT ? 0 : err_sys(err, "%s", vms);
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (!vm_valid_name(de->d_name))
            continue;
        if (grow_array(&names, &cap, n + 1, sizeof(*names), 16) < 0) {
            rc = vmsnap_err_set(err, ENOMEM, "out of memory");
            break;
        }
        if (!(names[n] = strdup(de->d_name))) {
            rc = vmsnap_err_set(err, ENOMEM, "out of memory");
            break;
        }
        n++;
    }
    closedir(d);
    if (rc == 0 && n) /* qsort of NULL is undefined, also for 0 elements (UBSan) */
        qsort(names, n, sizeof(*names), cmp_str);
    for (size_t i = 0; rc == 0 && i < n; i++) {
        struct vmctx vc;
        json_object *cfg = NULL;
        if (vm_ctx_init(&vc, o, names[i], NULL) < 0 || vm_cfg_load(vc.cfgpath, &cfg, NULL) < 0)
            continue;
        enum vmsnap_vmm_state st = VMSNAP_VMM_DEAD;
        pid_t pid = 0;
        struct vmsnap_err e2;
        const char *status = vm_cfg_str(cfg, "status");
        if (!status)
            status = "?";
        /* a VM a command holds is not asked: its QEMU may be that command's QMP client (one
         * at a time), and ls waited for it, up to the QMP timeout per VM */
        pid_t busy = vm_lock_holder(vc.vmdir, false);
        int src = vm_state(&vc, cfg, busy ? -1 : LS_QMP_WAIT, &st, &pid, &e2);
        if (src < 0)
            st = VMSNAP_VMM_OTHER;
        char pend[PATH_LEN];
        if (busy)
            status = "busy"; /* changing: what the files say now is half of it */
        else if (st == VMSNAP_VMM_DEAD && vm_taken_pending(&vc, pend))
            status = "interrupted"; /* its newest state waits for its checkpoint (resume) */
        else if (st == VMSNAP_VMM_DEAD && vm_stage_unsaved(&vc))
            status = "unsaved"; /* its snapshot is only in the stage */
        else if (st == VMSNAP_VMM_DEAD && vm_status_live(status))
            status = "dead"; /* gone, or a run or resume killed before its QEMU ran */
        else if (src == -ETIMEDOUT)
            status = "unresponsive"; /* a live QEMU that did not answer in LS_QMP_WAIT */
        else if (st == VMSNAP_VMM_PAUSED)
            status = "frozen"; /* a QEMU holding a stopped guest, no command at work: a resume
                                * killed after the restore, or a pause killed after the stop
                                * (a paused VM of vmsnap's has no QEMU) */
        else if (st != VMSNAP_VMM_DEAD)
            status = vmsnap_vmm_state_name(st);
        int64_t mem = vm_cfg_int(cfg, "memory");
        struct vmsnap_vm_info info = {
            .name = names[i],
            .status = status,
            .pid = pid,
            .accel = vm_cfg_str(cfg, "accel"),
            .mem = mem > 0 ? (uint64_t)mem : 0,
            .checkpoint = vm_exists(vc.ckpt),
            .url = vm_cfg_str(cfg, "url"),
            .dir = vc.vmdir,
            .busy_pid = busy,
        };
        rc = fn(arg, &info);
        json_object_put(cfg);
    }
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
    return rc;
}
