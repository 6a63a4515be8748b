/* SPDX-License-Identifier: Apache-2.0 */
/* The VMM driver layer: accelerator choice, handle construction and dispatch to a driver. */
#include "vmm_int.h"

#include "util/util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const struct vmm_driver *const drivers[] = {&vmm_qemu_driver};

const char *vmsnap_vmm_state_name(enum vmsnap_vmm_state st)
{
    switch (st) {
    case VMSNAP_VMM_DEAD:
        return "dead";
    case VMSNAP_VMM_RUNNING:
        return "running";
    case VMSNAP_VMM_PAUSED:
        return "paused";
    case VMSNAP_VMM_INCOMING:
        return "incoming";
    case VMSNAP_VMM_IO_ERROR:
        return "io-error";
    default:
        return "other";
    }
}

bool vmm_cpuinfo_has_virt(const char *cpuinfo)
{
    /* Only the "flags" lines count, and only whole words. */
    for (const char *l = cpuinfo; l && *l;) {
        const char *nl = strchr(l, '\n');
        size_t n = nl ? (size_t)(nl - l) : strlen(l);
        if (n > 5 && strncmp(l, "flags", 5) == 0) {
            const char *c = memchr(l, ':', n);
            for (const char *p = c ? c + 1 : l + n; p < l + n;) {
                while (p < l + n && *p == ' ')
                    p++;
                const char *e = p;
                while (e < l + n && *e != ' ')
                    e++;
                if ((e - p == 3) && (!strncmp(p, "vmx", 3) || !strncmp(p, "svm", 3)))
                    return true;
                p = e;
            }
        }
        l = nl ? nl + 1 : NULL;
    }
    return false;
}

int vmsnap_vmm_pick_accel(const char *want, const char **out, struct vmsnap_err *err)
{
    if (want && !strcmp(want, "tcg")) {
        *out = "tcg";
        return 0;
    }
    if (want && !strcmp(want, "kvm")) {
        if (access("/dev/kvm", R_OK | W_OK) < 0)
            return vmsnap_err_set(err, ENODEV, "accelerator kvm: /dev/kvm: %s", strerror(errno));
        *out = "kvm";
        return 0;
    }
    if (want && strcmp(want, "auto"))
        return vmsnap_err_set(err, EINVAL, "unknown accelerator '%s' (auto, kvm, tcg)", want);
    *out = "tcg";
    FILE *f = fopen("/proc/cpuinfo", "re");
    if (!f)
        return 0;
    /* Bounded read: the flags of the first CPUs are enough (all CPUs share them). */
    char *buf = malloc(1 << 16);
    if (!buf) {
        fclose(f);
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    }
    size_t n = fread(buf, 1, (1 << 16) - 1, f);
    fclose(f);
    buf[n] = 0;
    if (vmm_cpuinfo_has_virt(buf) && access("/dev/kvm", R_OK | W_OK) == 0)
        *out = "kvm";
    free(buf);
    return 0;
}

static char *dup_or_null(const char *s, bool *oom)
{
    if (!s)
        return NULL;
    char *d = strdup(s);
    if (!d)
        *oom = true;
    return d;
}

void vmsnap_vmm_free(struct vmsnap_vmm *v)
{
    if (!v)
        return;
    free(v->kernel);
    free(v->initrd);
    free(v->cmdline);
    free(v->disk);
    free(v->ram_path);
    free(v->accel);
    free(v->run_dir);
    free(v->qemu);
    free(v);
}

int vmsnap_vmm_new(const char *driver, const struct vmsnap_vmm_config *cfg, struct vmsnap_vmm **out,
                   struct vmsnap_err *err)
{
    *out = NULL;
    const struct vmm_driver *drv = NULL;
    for (size_t i = 0; i < sizeof(drivers) / sizeof(drivers[0]); i++)
        if (!driver || !strcmp(driver, drivers[i]->name))
            drv = drivers[i];
    if (!drv)
        return vmsnap_err_set(err, EINVAL, "unknown VMM driver '%s' (qemu)", driver);
    if (!cfg->kernel || !cfg->ram_path || !cfg->run_dir || !cfg->accel)
        return vmsnap_err_set(err, EINVAL, "VM config needs kernel, ram_path, run_dir, accel");
    if (cfg->mem == 0 || cfg->mem % (1u << 20))
        return vmsnap_err_set(err, EINVAL, "guest memory %llu is not a positive multiple of 1M",
                              (unsigned long long)cfg->mem);
    if (strcmp(cfg->accel, "kvm") && strcmp(cfg->accel, "tcg"))
        return vmsnap_err_set(err, EINVAL, "accelerator '%s' is neither kvm nor tcg", cfg->accel);
    if (cfg->cpus < 1 || cfg->cpus > 64)
        return vmsnap_err_set(err, EINVAL, "vCPUs %u out of range 1..64", cfg->cpus);
    struct vmsnap_vmm *v = calloc(1, sizeof(*v));
    if (!v)
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    bool oom = false;
    v->drv = drv;
    v->kernel = dup_or_null(cfg->kernel, &oom);
    v->initrd = dup_or_null(cfg->initrd, &oom);
    v->cmdline = dup_or_null(cfg->cmdline, &oom);
    v->disk = dup_or_null(cfg->disk, &oom);
    v->ram_path = dup_or_null(cfg->ram_path, &oom);
    v->accel = dup_or_null(cfg->accel, &oom);
    v->run_dir = dup_or_null(cfg->run_dir, &oom);
    const char *q = cfg->qemu ? cfg->qemu : getenv("VMSNAP_QEMU");
    v->qemu = dup_or_null(q ? q : "qemu-system-x86_64", &oom);
    v->mem = cfg->mem;
    v->cpus = cfg->cpus;
    v->ram_shared = cfg->ram_shared;
    v->state_has_ram = cfg->state_has_ram;
    if (oom) {
        vmsnap_vmm_free(v);
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    }
    int a = snprintf(v->qmp_sock, sizeof(v->qmp_sock), "%s/qmp.sock", cfg->run_dir);
    int b = snprintf(v->con_sock, sizeof(v->con_sock), "%s/console.sock", cfg->run_dir);
    if (a < 0 || b < 0 || (size_t)a >= sizeof(v->qmp_sock) || (size_t)b >= sizeof(v->con_sock)) {
        vmsnap_vmm_free(v);
        return vmsnap_err_set(err, ENAMETOOLONG,
                              "run directory %s is too long for a unix socket path (at most %zu "
                              "bytes with /console.sock): use a shorter --state-dir",
                              cfg->run_dir, sizeof(v->con_sock) - 14);
    }
    snprintf(v->console_log, sizeof(v->console_log), "%s/console.log", cfg->run_dir);
    snprintf(v->qemu_log, sizeof(v->qemu_log), "%s/qemu.log", cfg->run_dir);
    snprintf(v->pidfile, sizeof(v->pidfile), "%s/pid", cfg->run_dir);
    *out = v;
    return 0;
}

int vmsnap_vmm_boot(struct vmsnap_vmm *v, struct vmsnap_err *err)
{
    return v->drv->boot(v, false, err);
}

int vmsnap_vmm_restore(struct vmsnap_vmm *v, const char *dir, struct vmsnap_err *err)
{
    return v->drv->restore(v, dir, err);
}

int vmsnap_vmm_pause(struct vmsnap_vmm *v, struct vmsnap_err *err)
{
    return v->drv->pause(v, err);
}

int vmsnap_vmm_snapshot(struct vmsnap_vmm *v, const char *dir, struct vmsnap_err *err)
{
    return v->drv->snapshot(v, dir, err);
}

int vmsnap_vmm_resume(struct vmsnap_vmm *v, struct vmsnap_err *err)
{
    return v->drv->resume(v, err);
}

int vmsnap_vmm_stop(struct vmsnap_vmm *v, struct vmsnap_err *err)
{
    return v->drv->stop(v, err);
}

int vmsnap_vmm_powerdown(struct vmsnap_vmm *v, double seconds, bool *off, struct vmsnap_err *err)
{
    return v->drv->powerdown(v, seconds, off, err);
}

int vmsnap_vmm_state(struct vmsnap_vmm *v, enum vmsnap_vmm_state *st, pid_t *pid,
                     struct vmsnap_err *err)
{
    return v->drv->state(v, st, pid, err);
}

void vmsnap_vmm_set_reply_wait(struct vmsnap_vmm *v, double seconds)
{
    v->qmp_wait = seconds;
}
