/* SPDX-License-Identifier: Apache-2.0 */
/* A VM's context: its paths (state and RAM directories in canonical spelling), its lock, and
 * the sweep of what a killed command left; the step timings. */
#include "vm_int.h"

#include "sys/sys.h"
#include "util/util.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>
#include <unistd.h>

void vm_step(struct vmsnap_vm_timing *t, const char *name, double *t0)
{
    double t1 = mono_now();
    if (t && t->n < VMSNAP_VM_MAX_STEPS) {
        t->step[t->n].name = name;
        t->step[t->n].seconds = t1 - *t0;
        t->n++;
    }
    *t0 = t1;
}

int vm_pjoin(char *out, const char *a, const char *b, struct vmsnap_err *err)
{
    int w = snprintf(out, PATH_LEN, "%s/%s", a, b);
    if (w < 0 || w >= PATH_LEN)
        return vmsnap_err_set(err, ENAMETOOLONG, "path %s/%s too long", a, b);
    return 0;
}

/* out = a + b (a plain concatenation), checked. */
int vm_pcat(char *out, const char *a, const char *b)
{
    int w = snprintf(out, PATH_LEN, "%s%s", a, b);
    return w < 0 || w >= PATH_LEN ? -ENAMETOOLONG : 0;
}

bool vm_valid_name(const char *n)
{
    size_t len = strlen(n);
    if (len == 0 || len > VMSNAP_VM_NAME_MAX || n[0] == '.' || n[0] == '-')
        return false;
    for (const char *p = n; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
              *p == '.' || *p == '_' || *p == '-'))
            return false;
    return true;
}

int vm_mkdir_p(const char *path, struct vmsnap_err *err)
{
    char tmp[PATH_LEN];
    snprintf(tmp, sizeof(tmp), "%s", path);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = 0;
        if (mkdir(tmp, 0700) < 0 && errno != EEXIST)
            return err_sys(err, "mkdir %s", tmp);
        *p = '/';
    }
    if (mkdir(tmp, 0700) < 0 && errno != EEXIST)
        return err_sys(err, "mkdir %s", tmp);
    return 0;
}

/* A stage (in the RAM directory, often world-writable) or a VM's directory: removed through
 * descriptors, so a directory in it swapped for a link meanwhile removes nothing elsewhere. */
int vm_rm_rf(const char *path)
{
    return sys_rm_tree(path);
}

/* A checkpoint or on-demand directory is renamed aside before it is removed: a command killed
 * while removing it leaves no half directory (a checkpoint without its complete mark but with its
 * taking mark reads as an interrupted pause, which nothing but --force could then leave), only
 * PATH.discard, which the next command on the VM removes (sweep_temps). */
int vm_discard(const char *path)
{
    char aside[PATH_LEN];
    if (vm_pcat(aside, path, DISCARD_SUFFIX) < 0)
        return -ENAMETOOLONG;
    vm_rm_rf(aside);             /* one a killed command left */
    if (rename(path, aside) < 0) /* no room for the longer name, say: removed in place */
        return errno == ENOENT ? 0 : vm_rm_rf(path);
    sys_failpoint("vm-discarding"); /* renamed aside, not yet removed */
    return vm_rm_rf(aside);
}

bool vm_exists(const char *p)
{
    struct stat st;
    return lstat(p, &st) == 0;
}

static uint32_t fnv1a(const char *s)
{
    uint32_t h = 2166136261u;
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 16777619u;
    return h;
}

int vm_ctx_init(struct vmctx *c, const struct vmsnap_vm_opts *o, const char *name,
                struct vmsnap_err *err)
{
    memset(c, 0, sizeof(*c));
    c->o = o;
    c->name = name;
    c->lockfd = -1;
    if (!vm_valid_name(name))
        return vmsnap_err_set(err, EINVAL,
                              "invalid VM name '%s' (letters, digits, '.', '_', '-', not starting "
                              "with '.' or '-'; at most %d)",
                              name, VMSNAP_VM_NAME_MAX);
    const char *sd = o && o->state_dir ? o->state_dir : getenv("VMSNAP_STATE_DIR");
    if (!sd || !*sd)
        sd = VMSNAP_VM_DEFAULT_STATE_DIR;
    const char *rd = o && o->ram_dir ? o->ram_dir : getenv("VMSNAP_RAM_DIR");
    if (!rd || !*rd)
        rd = VMSNAP_VM_DEFAULT_RAM_DIR;
    /* Canonical spellings: a VM's RAM file name hashes the state directory, and its QEMU is
     * recognised by the paths on its command line, so "S", "S/" and a relative or symlinked
     * spelling of S must give the same strings (else a second QEMU of one VM could start). */
    char canon[PATH_MAX];
    int rc = sys_canon_path(sd, canon);
    if (rc == 0 && snprintf(c->state, sizeof(c->state), "%s", canon) >= (int)sizeof(c->state))
        rc = -ENAMETOOLONG;
    if (rc < 0)
        return err_code(err, -rc, "state directory %s", sd);
    rc = sys_canon_path(rd, canon);
    if (rc == 0 && snprintf(c->ram_dir, sizeof(c->ram_dir), "%s", canon) >= (int)sizeof(c->ram_dir))
        rc = -ENAMETOOLONG;
    if (rc < 0)
        return err_code(err, -rc, "RAM directory %s", rd);
    char vms[PATH_LEN];
    rc = vm_pjoin(vms, c->state, "vms", err);
    if (rc == 0)
        rc = vm_pjoin(c->vmdir, vms, name, err);
    if (rc == 0)
        rc = vm_pjoin(c->cfgpath, c->vmdir, "vm.json", err);
    if (rc == 0)
        rc = vm_pjoin(c->ckpt, c->vmdir, "checkpoint", err);
    if (rc == 0)
        rc = vm_pjoin(c->disk, c->vmdir, DISK_LIVE, err);
    if (rc == 0)
        rc = vm_pjoin(c->ondemand, c->vmdir, "ondemand", err);
    if (rc < 0)
        return rc;
    /* RAM and staging names are unique per VM directory, so several state directories can
     * share one tmpfs. The hash is of the canonical state path. */
    char base[PATH_LEN], leaf[128];
    snprintf(leaf, sizeof(leaf), "/vmsnap-%08x-%s", fnv1a(c->state), name);
    if (vm_pcat(base, c->ram_dir, leaf) < 0 || vm_pcat(c->ram, base, ".ram") < 0 ||
        vm_pcat(c->stage, base, ".stage") < 0)
        return vmsnap_err_set(err, ENAMETOOLONG, "RAM directory %s too long", c->ram_dir);
    return 0;
}

void vm_ctx_fini(struct vmctx *c)
{
    if (c->lockfd >= 0)
        close(c->lockfd);
    c->lockfd = -1;
}

/* Is `name` a temporary of sys_atomic_open (".NAME.XXXXXX", or a pull's ".vmsnap-pull.PID.XXXXXX"),
 * for `base` when it is given? Not vmsnap's own marks and links (".vmsnap-..."). */
static bool atomic_temp(const char *name, const char *base)
{
    size_t n = strlen(name);
    if (name[0] != '.' || n < 9 || name[n - 7] != '.')
        return false;
    for (size_t i = n - 6; i < n; i++)
        if (!isalnum((unsigned char)name[i]))
            return false;
    if (base)
        return n == strlen(base) + 8 && !strncmp(name + 1, base, strlen(base));
    return strncmp(name, ".vmsnap-", 8) != 0 || !strncmp(name, ".vmsnap-tmp.", 12) ||
           !strncmp(name, ".vmsnap-pull.", 13); /* a pull's (sys_atomic_open_tagged) */
}

/* Unlink the temporaries in `dir`: regular files of this user only, never a directory's
 * content (the RAM directory is world-writable: a planted symlink or another user's tree must
 * not make vmsnap, run as root, delete anything). `nofollow` for a directory whose name others
 * could have made (the stage); the RAM and state directories are the user's own choice. */
static void sweep_dir(const char *dir, const char *base, bool nofollow)
{
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC | (nofollow ? O_NOFOLLOW : 0));
    DIR *d = dfd >= 0 ? fdopendir(dfd) : NULL;
    if (!d) {
        if (dfd >= 0)
            close(dfd);
        return;
    }
    struct dirent *de;
    struct stat sb;
    while ((de = readdir(d))) {
        if (!atomic_temp(de->d_name, base) ||
            fstatat(dfd, de->d_name, &sb, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISREG(sb.st_mode) ||
            sb.st_uid != geteuid())
            continue;
        if (unlinkat(dfd, de->d_name, 0) == 0)
            vlog(VMSNAP_LOG_INFO, "removed %s/%s, left by a vmsnap command that was killed", dir,
                 de->d_name);
    }
    closedir(d);
}

/* What a command on this VM left when it was killed (SIGKILL, a second Ctrl-C) before its
 * clean-up: the RAM image being copied into the RAM directory (hundreds of MiB of tmpfs, that
 * is memory, that nothing else would ever remove), files being staged, a checkpoint file half
 * written. Called with the VM's lock held: no other command on it runs, so none is in use. The
 * stage (in the RAM directory) only when it is ours (vm_stage_ok). */
static void sweep_temps(const struct vmctx *c)
{
    const char *rb = strrchr(c->ram, '/');
    if (rb)
        sweep_dir(c->ram_dir, rb + 1, false);
    const char *const dirs[] = {c->vmdir, c->ckpt, c->ondemand};
    for (size_t i = 0; i < sizeof(dirs) / sizeof(dirs[0]); i++)
        sweep_dir(dirs[i], NULL, true);
    if (vm_stage_ok(c))
        sweep_dir(c->stage, NULL, true);
    char p[PATH_LEN];
    if (vm_pcat(p, c->ckpt, ".new") == 0)
        sweep_dir(p, NULL, true);
    /* what a killed vm_discard() left: in the VM's own directory, the user's */
    const char *const aside[] = {c->ckpt, c->ondemand};
    for (size_t i = 0; i < sizeof(aside) / sizeof(aside[0]); i++)
        if (vm_pcat(p, aside[i], DISCARD_SUFFIX) == 0 && vm_exists(p) && vm_rm_rf(p) == 0)
            vlog(VMSNAP_LOG_INFO, "removed %s, left by a vmsnap command that was killed", p);
}

pid_t vm_lock_holder(const char *path, bool self)
{
    struct stat sb;
    if (stat(path, &sb) < 0)
        return 0;
    FILE *f = fopen("/proc/locks", "re");
    if (!f)
        return 0;
    char line[256];
    pid_t holder = 0;
    while (!holder && fgets(line, sizeof(line), f)) {
        /* "1: FLOCK  ADVISORY  WRITE 1234 fd:01:5678 0 EOF" (major:minor in hex) */
        char kind[16];
        int pid;
        unsigned maj, min;
        unsigned long long ino;
        if (sscanf(line, "%*d: %15s %*s %*s %d %x:%x:%llu", kind, &pid, &maj, &min, &ino) == 5 &&
            !strcmp(kind, "FLOCK") && ino == (unsigned long long)sb.st_ino &&
            maj == major(sb.st_dev) && min == minor(sb.st_dev) && pid > 0 &&
            (pid == getpid()) == self)
            holder = pid;
    }
    fclose(f);
    return holder;
}

/* How long a lock this process took, still held after its release, is waited for: a child this
 * process forked at that moment (QEMU's start for another VM, in vmsnapd) holds copies of every
 * descriptor until it closes them, and an flock lives as long as any copy. */
#define LOCK_OWN_WAIT_MS 2000

/* Lock the VM's directory against concurrent vmsnap commands on the same VM. */
int vm_ctx_lock(struct vmctx *c, struct vmsnap_err *err)
{
    c->lockfd = open(c->vmdir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (c->lockfd < 0) {
        if (errno == ENOENT)
            return vmsnap_err_set(err, ENOENT, "no VM named '%s' under %s", c->name, c->state);
        return err_sys(err, "open %s", c->vmdir);
    }
    for (unsigned waited = 0; flock(c->lockfd, LOCK_EX | LOCK_NB) < 0; waited += 10) {
        /* a lock another process took is that command's: busy at once */
        if (errno != EWOULDBLOCK || waited >= LOCK_OWN_WAIT_MS || !vm_lock_holder(c->vmdir, true))
            return vmsnap_err_set(err, EBUSY, "VM '%s' is busy: another vmsnap command holds %s",
                                  c->name, c->vmdir);
        sys_sleep_ms(10);
    }
    sweep_temps(c);
    return 0;
}

int vm_check_ram_dir(struct vmctx *c, struct vmsnap_err *err)
{
    struct statfs sf;
    if (statfs(c->ram_dir, &sf) < 0)
        return err_sys(err, "RAM directory %s", c->ram_dir);
    if ((unsigned long)sf.f_type != TMPFS_MAGIC_ && (unsigned long)sf.f_type != HUGETLBFS_MAGIC_)
        return vmsnap_err_set(err, EINVAL,
                              "RAM directory %s is not tmpfs or hugetlbfs: guest RAM there would "
                              "be written back to disk (use --ram-dir or VMSNAP_RAM_DIR)",
                              c->ram_dir);
    return 0;
}

/* A guest's RAM file grows as the guest touches its memory; when its tmpfs has no room left the
 * guest dies (SIGBUS) with its newest state. Refused before QEMU starts, unless --ram-overcommit
 * (the check sees this VM alone: several VMs starting at once share the room). */
int vm_ram_room(const struct vmctx *c, int64_t mem, struct vmsnap_err *err)
{
    struct statfs sf;
    struct stat sb;
    if ((c->o && c->o->ram_overcommit) || mem <= 0 || statfs(c->ram_dir, &sf) < 0)
        return 0;
    uint64_t free_b = (uint64_t)sf.f_bavail * (uint64_t)sf.f_bsize;
    uint64_t have = stat(c->ram, &sb) == 0 ? (uint64_t)sb.st_blocks * 512 : 0;
    if (have >= (uint64_t)mem || free_b >= (uint64_t)mem - have)
        return 0;
    return vmsnap_err_set(
        err, ENOSPC,
        "the RAM directory %s has %llu MiB free, and the guest's RAM (%llu MiB, "
        "%llu MiB of it written) would grow there by up to %llu MiB: a guest "
        "whose RAM cannot grow dies. Make room, use another --ram-dir, or give "
        "--ram-overcommit",
        c->ram_dir, (unsigned long long)(free_b >> 20), (unsigned long long)((uint64_t)mem >> 20),
        (unsigned long long)(have >> 20), (unsigned long long)(((uint64_t)mem - have) >> 20));
}

int vm_open_record(struct vmctx *c, const struct vmsnap_vm_opts *o, const char *name,
                   json_object **cfg, struct vmsnap_err *err)
{
    int rc = vm_ctx_init(c, o, name, err);
    return rc == 0 ? vm_load(c, cfg, err) : rc;
}

int vm_op_end(struct vmctx *c, json_object *cfg, struct vmsnap_vmm *v, int rc, const char *verb,
              struct vmsnap_vm_timing *t, double tstart, struct vmsnap_err *err)
{
    if (rc < 0)
        vmsnap_err_wrap(err, "vm %s %s: ", verb, c->name);
    if (t)
        t->total = mono_now() - tstart;
    vmsnap_vmm_free(v);
    json_object_put(cfg);
    vm_ctx_fini(c);
    return rc;
}

int vm_load(struct vmctx *c, json_object **cfg, struct vmsnap_err *err)
{
    int rc = vm_ctx_lock(c, err);
    if (rc == 0)
        rc = vm_cfg_load(c->cfgpath, cfg, err);
    return rc;
}
