/* SPDX-License-Identifier: Apache-2.0 */
/*
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
#include "vmm/vmm_int.h"

#include "sys/sys.h"
#include "util/util.h"
#include "vmsnap/disk.h"
#include "vmsnap/pcache.h"
#include "vmsnap/xfer.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/sysmacros.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <limits.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

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
#define PATH_LEN 4096

static void step(struct vmsnap_vm_timing *t, const char *name, double *t0)
{
    double t1 = mono_now();
    if (t && t->n < VMSNAP_VM_MAX_STEPS) {
        t->step[t->n].name = name;
        t->step[t->n].seconds = t1 - *t0;
        t->n++;
    }
    *t0 = t1;
}

/* ---- paths and context ---- */

struct vmctx {
    const struct vmsnap_vm_opts *o;
    const char *name;
    char state[PATH_LEN], vmdir[PATH_LEN], cfgpath[PATH_LEN], ckpt[PATH_LEN], disk[PATH_LEN];
    char ram_dir[PATH_LEN], ram[PATH_LEN], stage[PATH_LEN], ondemand[PATH_LEN];
    int lockfd;
    struct vmsnap_err rerr; /* why recover_interrupted() could not complete a checkpoint */
};

static int pjoin(char *out, const char *a, const char *b, struct vmsnap_err *err)
{
    int w = snprintf(out, PATH_LEN, "%s/%s", a, b);
    if (w < 0 || w >= PATH_LEN)
        return vmsnap_err_set(err, ENAMETOOLONG, "path %s/%s too long", a, b);
    return 0;
}

/* out = a + b (a plain concatenation), checked. */
static int pcat(char *out, const char *a, const char *b)
{
    int w = snprintf(out, PATH_LEN, "%s%s", a, b);
    return w < 0 || w >= PATH_LEN ? -ENAMETOOLONG : 0;
}

static bool valid_name(const char *n)
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

static int mkdir_p(const char *path, struct vmsnap_err *err)
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
static int rm_rf(const char *path)
{
    return sys_rm_tree(path);
}

static bool exists(const char *p)
{
    struct stat st;
    return lstat(p, &st) == 0;
}

/* The staging directory holds the only copy of a snapshot: from the moment a suspend has it
 * complete until the store has it (a suspend killed meanwhile, or one that could store it
 * neither in the store nor as a local checkpoint). Marked by a hidden file (a push skips
 * vmsnap's own ".vmsnap-" names). */
#define UNSAVED_MARK ".vmsnap-unsaved"
/* In a stage whose set the store has (its URL): only the record could not say so. */
#define STORED_MARK ".vmsnap-stored"
/* The stage lives in the RAM directory, often world-writable (/dev/shm), under a name anyone can
 * compute: only a directory of ours (not a link, owned by us, 0700) is ever taken for one. */
static bool stage_ok(const struct vmctx *c)
{
    struct stat sb;
    return lstat(c->stage, &sb) == 0 && S_ISDIR(sb.st_mode) && sb.st_uid == geteuid() &&
           (sb.st_mode & 077) == 0;
}

/* The stage's image now runs as guest RAM: its marks go (recovery must not take it for a
 * snapshot any more). */
static void stage_consumed(const struct vmctx *c)
{
    static const char *const marks[] = {"/" UNSAVED_MARK, "/" COMPLETE_MARK, "/" TAKING_MARK};
    char p[PATH_LEN];
    for (size_t i = 0; i < sizeof(marks) / sizeof(marks[0]); i++)
        if (pcat(p, c->stage, marks[i]) == 0)
            unlink(p);
}

/* Remove the stage, its unsaved mark first: a process killed half way leaves no marked stage
 * that lacks files. */
static void unstage(const struct vmctx *c)
{
    char p[PATH_LEN];
    if (pcat(p, c->stage, "/" UNSAVED_MARK) == 0)
        unlink(p);
    rm_rf(c->stage);
}

static bool stage_unsaved(const struct vmctx *c)
{
    char p[PATH_LEN];
    struct stat sb;
    return stage_ok(c) && pcat(p, c->stage, "/" UNSAVED_MARK) == 0 && lstat(p, &sb) == 0 &&
           S_ISREG(sb.st_mode);
}

/* Everything a snapshot directory needs to restore the VM. */
static const char *const snapshot_files[] = {"memory-ranges", "state", "config.json", DISK_CKPT};
#define N_SNAPSHOT_FILES (sizeof(snapshot_files) / sizeof(snapshot_files[0]))

/* NULL when `dir` holds every snapshot file, else the first missing one. */
static const char *snapshot_missing(const char *dir)
{
    char p[PATH_LEN];
    for (size_t i = 0; i < N_SNAPSHOT_FILES; i++)
        if (pjoin(p, dir, snapshot_files[i], NULL) < 0 || !exists(p))
            return snapshot_files[i];
    return NULL;
}

/* The text of a small mark file (not a link, a FIFO or a device: never blocks), or false. */
static bool read_mark(const char *path, char *buf, size_t len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    ssize_t n = fd >= 0 ? read(fd, buf, len - 1) : -1;
    if (fd >= 0)
        close(fd);
    if (n <= 0)
        return false;
    buf[n] = 0;
    return true;
}

/* The stage's set is stored at `url` (STORED_MARK). */
static bool stage_stored_at(const struct vmctx *c, const char *url)
{
    char p[PATH_LEN], have[PATH_LEN];
    return pcat(p, c->stage, "/" STORED_MARK) == 0 && read_mark(p, have, sizeof(have)) &&
           !strcmp(have, url);
}

static int mark_unsaved(const struct vmctx *c, struct vmsnap_err *err)
{
    char p[PATH_LEN];
    if (pcat(p, c->stage, "/" UNSAVED_MARK) < 0)
        return vmsnap_err_set(err, ENAMETOOLONG, "path %s too long", c->stage);
    int fd = open(p, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0)
        return err_sys(err, "create %s", p);
    close(fd);
    return 0;
}

static uint32_t fnv1a(const char *s)
{
    uint32_t h = 2166136261u;
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 16777619u;
    return h;
}

static int ctx_init(struct vmctx *c, const struct vmsnap_vm_opts *o, const char *name,
                    struct vmsnap_err *err)
{
    memset(c, 0, sizeof(*c));
    c->o = o;
    c->name = name;
    c->lockfd = -1;
    if (!valid_name(name))
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
    rc = pjoin(vms, c->state, "vms", err);
    if (rc == 0)
        rc = pjoin(c->vmdir, vms, name, err);
    if (rc == 0)
        rc = pjoin(c->cfgpath, c->vmdir, "vm.json", err);
    if (rc == 0)
        rc = pjoin(c->ckpt, c->vmdir, "checkpoint", err);
    if (rc == 0)
        rc = pjoin(c->disk, c->vmdir, DISK_LIVE, err);
    if (rc == 0)
        rc = pjoin(c->ondemand, c->vmdir, "ondemand", err);
    if (rc < 0)
        return rc;
    /* RAM and staging names are unique per VM directory, so several state directories can
     * share one tmpfs. The hash is of the canonical state path. */
    char base[PATH_LEN], leaf[128];
    snprintf(leaf, sizeof(leaf), "/vmsnap-%08x-%s", fnv1a(c->state), name);
    if (pcat(base, c->ram_dir, leaf) < 0 || pcat(c->ram, base, ".ram") < 0 ||
        pcat(c->stage, base, ".stage") < 0)
        return vmsnap_err_set(err, ENAMETOOLONG, "RAM directory %s too long", c->ram_dir);
    return 0;
}

static void ctx_fini(struct vmctx *c)
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
 * stage (in the RAM directory) only when it is ours (stage_ok). */
static void sweep_temps(const struct vmctx *c)
{
    const char *rb = strrchr(c->ram, '/');
    if (rb)
        sweep_dir(c->ram_dir, rb + 1, false);
    const char *const dirs[] = {c->vmdir, c->ckpt, c->ondemand};
    for (size_t i = 0; i < sizeof(dirs) / sizeof(dirs[0]); i++)
        sweep_dir(dirs[i], NULL, true);
    if (stage_ok(c))
        sweep_dir(c->stage, NULL, true);
    char p[PATH_LEN];
    if (pcat(p, c->ckpt, ".new") == 0)
        sweep_dir(p, NULL, true);
}

/* Lock the VM's directory against concurrent vmsnap commands on the same VM. */
static int ctx_lock(struct vmctx *c, struct vmsnap_err *err)
{
    c->lockfd = open(c->vmdir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (c->lockfd < 0) {
        if (errno == ENOENT)
            return vmsnap_err_set(err, ENOENT, "no VM named '%s' under %s", c->name, c->state);
        return err_sys(err, "open %s", c->vmdir);
    }
    if (flock(c->lockfd, LOCK_EX | LOCK_NB) < 0)
        return vmsnap_err_set(err, EBUSY, "VM '%s' is busy: another vmsnap command holds %s",
                              c->name, c->vmdir);
    sweep_temps(c);
    return 0;
}

static int check_ram_dir(struct vmctx *c, struct vmsnap_err *err)
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

/* ---- config ---- */

/* A record or config file larger than this is refused; a snapshot's config.json may take at
 * most SET_CFG_MAX, so that the record made from it (pretty-printed, with the node's fields)
 * always fits. */
#define CFG_MAX (1 << 20)
#define SET_CFG_MAX (64 << 10)
#define GEN_MAX (INT64_C(1) << 62) /* a snapshot's generation at most (never wraps) */
#define CMDLINE_MAX 4096           /* a kernel command line at most (vm run and resume) */

static int cfg_load(const char *path, json_object **out, struct vmsnap_err *err)
{
    *out = NULL;
    /* O_NONBLOCK and the type check: a FIFO or a device planted as a record must not hang the
     * command or be read as one */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0)
        return err_sys(err, "%s", path);
    struct stat fs;
    if (fstat(fd, &fs) < 0 || !S_ISREG(fs.st_mode)) {
        close(fd);
        return vmsnap_err_set(err, EINVAL, "%s: not a regular file", path);
    }
    if (fs.st_size >= CFG_MAX) {
        close(fd);
        return vmsnap_err_set(err, EFBIG, "%s: %lld bytes, larger than a VM's record (%d) can be",
                              path, (long long)fs.st_size, CFG_MAX);
    }
    char *buf = malloc(CFG_MAX);
    if (!buf) {
        close(fd);
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    }
    ssize_t n = sys_pread_full(fd, buf, CFG_MAX - 1, 0);
    close(fd);
    if (n < 0) {
        free(buf);
        return err_code(err, (int)-n, "read %s", path);
    }
    buf[n] = 0;
    json_tokener *tok = json_tokener_new();
    json_object *o = tok ? json_tokener_parse_ex(tok, buf, (int)n) : NULL;
    bool ok = tok && json_tokener_get_error(tok) == json_tokener_success && o &&
              json_object_is_type(o, json_type_object);
    /* one object and nothing after it but white space (as manifests are read) */
    for (size_t i = ok ? json_tokener_get_parse_end(tok) : 0; ok && i < (size_t)n; i++)
        ok = buf[i] == ' ' || buf[i] == '\n' || buf[i] == '\t' || buf[i] == '\r';
    json_tokener_free(tok);
    free(buf);
    if (!ok) {
        json_object_put(o);
        return vmsnap_err_set(err, EINVAL, "%s: not a JSON object", path);
    }
    *out = o;
    return 0;
}

static int cfg_save(const char *path, json_object *o, struct vmsnap_err *err)
{
    struct sys_atomic_file af;
    int rc = sys_atomic_open(&af, path, 0600, err);
    if (rc < 0)
        return rc;
    const char *s = json_object_to_json_string_ext(
        o, JSON_C_TO_STRING_PRETTY | JSON_C_TO_STRING_SPACED | JSON_C_TO_STRING_NOSLASHESCAPE);
    rc = sys_write_full(af.fd, s, strlen(s));
    if (rc == 0)
        rc = sys_write_full(af.fd, "\n", 1);
    if (rc < 0) {
        sys_atomic_abort(&af);
        return err_code(err, -rc, "write %s", path);
    }
    return sys_atomic_commit(&af, false, err);
}

static const char *cfg_str(json_object *o, const char *key)
{
    json_object *v;
    if (!json_object_object_get_ex(o, key, &v) || !json_object_is_type(v, json_type_string))
        return NULL;
    return json_object_get_string(v);
}

static int64_t cfg_int(json_object *o, const char *key)
{
    json_object *v;
    if (!json_object_object_get_ex(o, key, &v) || !json_object_is_type(v, json_type_int))
        return -1;
    return json_object_get_int64(v);
}

static bool cfg_bool(json_object *o, const char *key)
{
    json_object *v;
    return json_object_object_get_ex(o, key, &v) && json_object_get_boolean(v);
}

static void cfg_set_str(json_object *o, const char *key, const char *val)
{
    json_object_object_add(o, key, val ? json_object_new_string(val) : NULL);
}

int vm_config_rewrite(json_object *cfg, const char *disk_path, const char *ram_path,
                      const char *run_dir, struct vmsnap_err *err)
{
    if (disk_path) {
        json_object *disks, *d0;
        if (!json_object_object_get_ex(cfg, "disks", &disks) ||
            !json_object_is_type(disks, json_type_array) || json_object_array_length(disks) < 1 ||
            !json_object_is_type(d0 = json_object_array_get_idx(disks, 0), json_type_object))
            return vmsnap_err_set(err, EINVAL, "config: no disks[0] object to rewrite");
        cfg_set_str(d0, "path", disk_path);
    }
    if (ram_path)
        cfg_set_str(cfg, "ram_path", ram_path);
    if (run_dir)
        cfg_set_str(cfg, "run_dir", run_dir);
    return 0;
}

static const char *cfg_disk(json_object *cfg)
{
    json_object *disks, *d0;
    if (!json_object_object_get_ex(cfg, "disks", &disks) ||
        !json_object_is_type(disks, json_type_array) || json_object_array_length(disks) < 1)
        return NULL;
    d0 = json_object_array_get_idx(disks, 0);
    return d0 ? cfg_str(d0, "path") : NULL;
}

/* A driver handle from a config object. */
/* Do `a` and `b` name one file: the same string, or the same device and inode. Records written
 * before the state and RAM directories were used in their canonical spelling name them as the
 * user spelled them ("S/vms/a", "/dev/shm//x"). */
/* A record status saying a QEMU was started for the VM (booting, restoring or running): with
 * no QEMU alive, the VM is dead. */
static bool status_live(const char *s)
{
    return s && (!strcmp(s, "running") || !strcmp(s, "restoring") || !strcmp(s, "starting"));
}

static bool same_path(const char *a, const char *b)
{
    struct stat sa, sb;
    return !strcmp(a, b) || (stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
                             sa.st_ino == sb.st_ino);
}

static int vmm_from_cfg(struct vmctx *c, json_object *cfg, struct vmsnap_vmm **out,
                        struct vmsnap_err *err)
{
    /* QEMU is recognised by the paths on its command line: a record's run_dir spelled another
     * way (written before the canonical spelling) is the one its QEMU was started with */
    const char *rd = cfg_str(cfg, "run_dir");
    const char *run_dir = rd && same_path(rd, c->vmdir) ? rd : c->vmdir;
    int64_t mem = cfg_int(cfg, "memory"), cpus = cfg_int(cfg, "cpus");
    struct vmsnap_vmm_config vc = {
        .kernel = cfg_str(cfg, "kernel"),
        .initrd = cfg_str(cfg, "initrd"),
        .cmdline = cfg_str(cfg, "cmdline"),
        .mem = mem > 0 ? (uint64_t)mem : 0,
        .cpus = cpus > 0 && cpus < 1000 ? (unsigned)cpus : 0,
        .disk = cfg_disk(cfg),
        .ram_path = cfg_str(cfg, "ram_path"),
        .ram_shared = cfg_bool(cfg, "ram_shared"),
        .state_has_ram = cfg_bool(cfg, "ram_in_state"),
        .accel = cfg_str(cfg, "accel"),
        .run_dir = run_dir,
        .qemu = c->o ? c->o->qemu : NULL,
    };
    int rc = vmsnap_vmm_new(cfg_str(cfg, "driver"), &vc, out, err);
    if (rc < 0)
        return vmsnap_err_wrap(err, "VM '%s': ", c->name);
    return 0;
}

/* A snapshot's config.json comes from a store another node (or tenant) wrote: before anything
 * is staged, its fields must be what a VM's config holds, each refusal naming the field and
 * `path` (the object's name: `file` is its staged copy). */
static int check_set_cfg(const char *file, const char *path, json_object *cfg,
                         struct vmsnap_err *err)
{
    struct stat sb;
    if (stat(file, &sb) == 0 && sb.st_size > SET_CFG_MAX)
        return vmsnap_err_set(err, EFBIG, "%s: %lld bytes, more than a VM's config takes (%d)",
                              path, (long long)sb.st_size, SET_CFG_MAX);
    static const struct {
        const char *key;
        int64_t min, max;
    } ints[] = {
        {"memory", 1 << 20, INT64_C(1) << 46}, /* 64 TiB: the codec's cap */
        {"cpus", 1, 64},
        {"generation", 0, GEN_MAX},
    };
    for (size_t i = 0; i < sizeof(ints) / sizeof(ints[0]); i++) {
        json_object *v;
        if (!json_object_object_get_ex(cfg, ints[i].key, &v))
            continue;
        int64_t x = json_object_get_int64(v);
        if (!json_object_is_type(v, json_type_int) || x < ints[i].min || x > ints[i].max)
            return vmsnap_err_set(err, EINVAL,
                                  "%s: \"%s\" is %s, not a whole number in [%lld, %lld]", path,
                                  ints[i].key, json_object_to_json_string(v),
                                  (long long)ints[i].min, (long long)ints[i].max);
    }
    if (cfg_int(cfg, "memory") % (1 << 20))
        return vmsnap_err_set(err, EINVAL, "%s: \"memory\" %lld is not a multiple of 1 MiB", path,
                              (long long)cfg_int(cfg, "memory"));
    json_object *disks;
    if (!json_object_object_get_ex(cfg, "disks", &disks) ||
        !json_object_is_type(disks, json_type_array) || json_object_array_length(disks) < 1 ||
        !json_object_is_type(json_object_array_get_idx(disks, 0), json_type_object))
        return vmsnap_err_set(err, EINVAL, "%s: \"disks\" is missing or not a list of disk objects",
                              path);
    const char *cmd = cfg_str(cfg, "cmdline");
    if (cmd && strlen(cmd) > CMDLINE_MAX)
        return vmsnap_err_set(err, EINVAL,
                              "%s: \"cmdline\" is %zu bytes, more than a kernel command line "
                              "takes (%d)",
                              path, strlen(cmd), CMDLINE_MAX);
    return 0;
}

/* ---- files ---- */

static int write_small(const char *path, const char *s, struct vmsnap_err *err)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        return err_sys(err, "create %s", path);
    int rc = sys_write_full(fd, s, strlen(s));
    close(fd);
    if (rc < 0)
        return err_code(err, -rc, "write %s", path);
    return 0;
}

/* Sparse copy (FICLONE when possible, else data extents only); dst appears when complete. */
static int sparse_copy(const char *src, const char *dst, struct vmsnap_err *err)
{
    struct vmsnap_disk_clone_opts co = {.force = true};
    return vmsnap_disk_clone(src, dst, &co, NULL, err);
}

/* Copy a memory image between the RAM tmpfs and a checkpoint on disk. With page-cache hygiene on
 * (the default) the disk side bypasses the page cache (O_DIRECT): a pause leaves no dirty pages
 * charged to the cgroup for the kernel to throttle on, and neither direction leaves clean ones
 * to evict. `--no-evict` keeps the buffered copy. */
static int image_copy(const struct vmctx *c, const char *src, const char *dst,
                      struct vmsnap_err *err)
{
    struct vmsnap_disk_clone_opts co = {.force = true, .direct = !(c->o && c->o->no_evict)};
    return vmsnap_disk_clone(src, dst, &co, NULL, err);
}

static int copy_small(const char *sdir, const char *ddir, const char *name, struct vmsnap_err *err)
{
    char s[PATH_LEN], d[PATH_LEN];
    int rc = pjoin(s, sdir, name, err);
    if (rc == 0)
        rc = pjoin(d, ddir, name, err);
    if (rc == 0)
        rc = sparse_copy(s, d, err);
    return rc;
}

static bool same_fs(const char *a, const char *b)
{
    struct stat sa, sb;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev;
}

/* fsync every regular file in `dir`, then `dir` itself. */
static int fsync_dir_files(const char *dir, struct vmsnap_err *err)
{
    DIR *d = opendir(dir);
    if (!d)
        return err_sys(err, "open %s", dir);
    int rc = 0;
    struct dirent *de;
    while (rc == 0 && (de = readdir(d))) {
        struct stat st;
        if (de->d_type != DT_REG &&
            (de->d_type != DT_UNKNOWN ||
             fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISREG(st.st_mode)))
            continue;
        int fd = openat(dirfd(d), de->d_name, O_RDONLY | O_CLOEXEC);
        if (fd < 0 || fsync(fd) < 0)
            rc = err_sys(err, "fsync %s/%s", dir, de->d_name);
        if (fd >= 0)
            close(fd);
    }
    if (rc == 0 && fsync(dirfd(d)) < 0)
        rc = err_sys(err, "fsync %s", dir);
    closedir(d);
    return rc;
}

/* Replace the local checkpoint with the complete directory `newdir`. The new checkpoint is made
 * durable first: once the VM is stopped it is the only copy of the guest, so a host crash right
 * after a pause must not leave a torn checkpoint in place of a good one. */
static int swap_checkpoint(struct vmctx *c, const char *newdir, struct vmsnap_err *err)
{
    char old[PATH_LEN];
    if (pcat(old, c->ckpt, ".old") < 0)
        return vmsnap_err_set(err, ENAMETOOLONG, "path %s too long", c->ckpt);
    int frc = fsync_dir_files(newdir, err);
    if (frc < 0)
        return frc;
    rm_rf(old);
    if (exists(c->ckpt)) {
        if (rename(c->ckpt, old) < 0)
            return err_sys(err, "rename %s", c->ckpt);
        sys_failpoint("checkpoint-swap-torn");
    }
    if (rename(newdir, c->ckpt) < 0) {
        int e = errno;
        if (rename(old, c->ckpt) < 0)
            vlog(VMSNAP_LOG_ERROR, "restore %s from %s: %s", c->ckpt, old, strerror(errno));
        return err_code(err, e, "rename %s to %s", newdir, c->ckpt);
    }
    sys_fsync_parent(c->ckpt, NULL);
    rm_rf(old);
    return 0;
}

/* This boot's id (a host that rebooted has lost its tmpfs, and what it was writing may be torn).
 */
static int boot_id(char out[64], struct vmsnap_err *err)
{
    int fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
    ssize_t n = fd >= 0 ? read(fd, out, 63) : -1;
    if (fd >= 0)
        close(fd);
    if (n <= 0)
        return vmsnap_err_set(err, errno ? errno : EIO, "read the boot id: %s", strerror(errno));
    out[n] = 0;
    return 0;
}

/* A mark file in `dir` holding this boot's id. */
static bool mark_this_boot(const char *dir, const char *mark)
{
    char p[PATH_LEN], want[64], have[64];
    return pjoin(p, dir, mark, NULL) == 0 && boot_id(want, NULL) == 0 &&
           read_mark(p, have, sizeof(have)) && !strcmp(have, want);
}

/* A checkpoint directory whose COMPLETE_MARK holds this boot's id: every file was written, by a
 * process of this boot (a later crash of that process lost nothing in the page cache). */
static bool complete_this_boot(const char *dir)
{
    return mark_this_boot(dir, COMPLETE_MARK) && !snapshot_missing(dir);
}

static int ckpt_meta(struct vmctx *c, json_object *cfg, const char *dir, bool link_disk,
                     struct vmsnap_err *err);
static int ckpt_ram(struct vmctx *c, json_object *cfg, const char *dst, bool *ram_in_state,
                    struct vmsnap_err *err);

/* The config a checkpoint of the VM described by `cfg` gets (without status and URL; whether its
 * RAM is in the device state). NULL on ENOMEM. */
static json_object *ckpt_config(json_object *cfg)
{
    json_object *ck = NULL;
    if (json_object_deep_copy(cfg, &ck, NULL) != 0 || !ck)
        return NULL;
    json_object_object_del(ck, "status");
    json_object_object_del(ck, "url");
    json_object_object_add(ck, "ram_in_state",
                           json_object_new_boolean(!cfg_bool(cfg, "ram_shared")));
    return ck;
}

static int write_taking(json_object *cfg, const char *sdir, struct vmsnap_err *err)
{
    char p[PATH_LEN], boot[64];
    json_object *ck = ckpt_config(cfg);
    int rc = ck ? pjoin(p, sdir, "config.json", err) : vmsnap_err_set(err, ENOMEM, "out of memory");
    if (rc == 0)
        rc = cfg_save(p, ck, err);
    json_object_put(ck);
    if (rc == 0)
        rc = pjoin(p, sdir, TAKING_MARK, err);
    if (rc == 0)
        rc = boot_id(boot, err);
    if (rc == 0)
        rc = write_small(p, boot, err);
    return rc;
}

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

static bool stage_ok(const struct vmctx *c);

/* The directory (checkpoint.new or the stage) holding the state a pause or suspend of this boot
 * took whose checkpoint is not complete, or a complete checkpoint.new newer than the checkpoint
 * and not swapped in (after recover_interrupted: it could not), with the RAM file the VM's
 * newest state. Nothing may replace that RAM file or resume an older checkpoint over it. NULL
 * when there is none (`buf` holds the path otherwise). */
static const char *taken_pending(const struct vmctx *c, char *buf)
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
static const char *recover_interrupted(struct vmctx *c, char *pend)
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
static int pending_error(const struct vmctx *c, const char *dir, const char *what,
                         struct vmsnap_err *err)
{
    return vmsnap_err_set(err, EBUSY,
                          "VM '%s': the state its last pause or suspend took is in %s, but its "
                          "checkpoint could not be completed (%s); fix that and run 'vmsnap vm "
                          "resume %s', which completes it first%s",
                          c->name, dir, c->rerr.code ? c->rerr.msg : "see the log above", c->name,
                          what);
}

/* Fill `dir` with config.json, base-id and the disk (hard link from the live disk when
 * `link_disk`, else a sparse copy). memory-ranges and state are the caller's. */
static int ckpt_meta(struct vmctx *c, json_object *cfg, const char *dir, bool link_disk,
                     struct vmsnap_err *err)
{
    char p[PATH_LEN];
    int rc = pjoin(p, dir, "config.json", err);
    if (rc == 0)
        rc = cfg_save(p, cfg, err);
    if (rc == 0)
        rc = pjoin(p, dir, "base-id", err);
    if (rc == 0) {
        char line[80];
        const char *b = cfg_str(cfg, "base_id");
        snprintf(line, sizeof(line), "%s\n", b ? b : "");
        rc = write_small(p, line, err);
    }
    if (rc == 0)
        rc = pjoin(p, dir, DISK_CKPT, err);
    if (rc < 0)
        return rc;
    if (link_disk) {
        if (link(c->disk, p) < 0)
            return err_sys(err, "link %s to %s", c->disk, p);
    } else if ((rc = sparse_copy(c->disk, p, err)) < 0) {
        return rc;
    }
    /* last: the directory is a whole snapshot, written during this boot */
    char boot[64];
    if ((rc = pjoin(p, dir, COMPLETE_MARK, err)) == 0 && (rc = boot_id(boot, err)) == 0)
        rc = write_small(p, boot, err);
    return rc;
}

/* Put the RAM image at `dst`: a rename when on the same filesystem (zero copy), else a sparse
 * copy and unlink. A VM mapping its image privately has its RAM in `state`; its memory-ranges
 * is then an empty sparse file of the RAM size (restores load the RAM from the state). */
static int ckpt_ram(struct vmctx *c, json_object *cfg, const char *dst, bool *ram_in_state,
                    struct vmsnap_err *err)
{
    *ram_in_state = !cfg_bool(cfg, "ram_shared");
    if (*ram_in_state) {
        int fd = open(dst, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        if (fd < 0)
            return err_sys(err, "create %s", dst);
        int rc = ftruncate(fd, (off_t)cfg_int(cfg, "memory")) < 0 ? -errno : 0;
        close(fd);
        if (rc < 0)
            return err_code(err, -rc, "truncate %s", dst);
        return 0;
    }
    /* the VM's own RAM file, whatever its record says (a record is not trusted to name a
     * file to move into a snapshot) */
    const char *ram = c->ram;
    const char *rec = cfg_str(cfg, "ram_path");
    if (rec && !same_path(rec, ram))
        return vmsnap_err_set(err, EINVAL, "VM '%s': its record names %s as its RAM, not %s",
                              c->name, rec, ram);
    char dir[PATH_LEN];
    snprintf(dir, sizeof(dir), "%s", dst);
    char *slash = strrchr(dir, '/');
    if (slash)
        *slash = 0;
    if (same_fs(ram, dir)) {
        if (rename(ram, dst) < 0)
            return err_sys(err, "rename %s to %s", ram, dst);
        return 0;
    }
    int rc = image_copy(c, ram, dst, err);
    if (rc < 0)
        return vmsnap_err_wrap(err, "copy guest RAM: ");
    /* the RAM file stays until the checkpoint holding its copy is in place (finish_local) */
    return 0;
}

/* The VM's VMM state; `wait` > 0: seconds its QEMU may take to answer, at most (vm ls), 0: the
 * QMP timeout, < 0: QEMU is not asked (its pid only, a live one's state "other"). */
static int vm_state(struct vmctx *c, json_object *cfg, double wait, enum vmsnap_vmm_state *st,
                    pid_t *pid, struct vmsnap_err *err)
{
    struct vmsnap_vmm *v = NULL;
    int rc = vmm_from_cfg(c, cfg, &v, err);
    if (rc == 0) {
        v->qmp_wait = wait;
        rc = vmsnap_vmm_state(v, st, pid, err);
    }
    vmsnap_vmm_free(v);
    return rc;
}

/* ---- run ---- */

/* A guest's RAM file grows as the guest touches its memory; when its tmpfs has no room left the
 * guest dies (SIGBUS) with its newest state. Refused before QEMU starts, unless --ram-overcommit
 * (the check sees this VM alone: several VMs starting at once share the room). */
static int ram_room(const struct vmctx *c, int64_t mem, struct vmsnap_err *err)
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

int vmsnap_vm_run(const struct vmsnap_vm_opts *o, const char *name,
                  const struct vmsnap_vm_run_args *a, struct vmsnap_vm_timing *t,
                  struct vmsnap_err *err)
{
    double t0 = mono_now(), tstart = t0;
    struct vmctx c;
    json_object *cfg = NULL;
    struct vmsnap_vmm *v = NULL;
    bool created = false;
    int rc = ctx_init(&c, o, name, err);
    if (rc < 0)
        return rc;
    if (!a || !a->kernel) {
        rc = vmsnap_err_set(err, EINVAL, "vm run %s: a kernel is required", name);
        goto out;
    }
    if (a->append && strlen(a->append) > CMDLINE_MAX) { /* (a resume would refuse its snapshot) */
        rc = vmsnap_err_set(err, EINVAL,
                            "--append is %zu bytes, more than a kernel command line takes (%d)",
                            strlen(a->append), CMDLINE_MAX);
        goto out;
    }
    const char *accel;
    rc = vmsnap_vmm_pick_accel(o ? o->accel : NULL, &accel, err);
    if (rc == 0)
        rc = check_ram_dir(&c, err);
    if (rc < 0)
        goto out;
    char vms[PATH_LEN];
    if (pcat(vms, c.state, "/vms") < 0)
        return vmsnap_err_set(err, ENAMETOOLONG, "path %s too long", c.state);
    rc = mkdir_p(vms, err);
    if (rc < 0)
        goto out;
    if (mkdir(c.vmdir, 0700) < 0) {
        rc = errno == EEXIST ? vmsnap_err_set(err, EEXIST, "a VM named '%s' already exists in %s",
                                              name, c.state)
                             : err_sys(err, "mkdir %s", c.vmdir);
        goto out;
    }
    created = true;
    rc = ctx_lock(&c, err);
    if (rc < 0)
        goto out;
    uint8_t id[16];
    char base_id[33];
    if (getrandom(id, sizeof(id), 0) != (ssize_t)sizeof(id)) {
        rc = vmsnap_err_set(err, EIO, "getrandom: %s", strerror(errno));
        goto out;
    }
    for (int i = 0; i < 16; i++)
        snprintf(base_id + 2 * i, 3, "%02x", id[i]);

    struct vmsnap_disk_create_opts dco = {.size = a->disk_size, .label = "vmsnap-upper"};
    rc = vmsnap_disk_create(c.disk, &dco, err);
    if (rc < 0)
        goto out;
    step(t, "disk", &t0);

    uint64_t mem = a->mem ? a->mem : (512ull << 20);
    cfg = json_object_new_object();
    cfg_set_str(cfg, "name", name);
    cfg_set_str(cfg, "driver", "qemu");
    cfg_set_str(cfg, "kernel", a->kernel);
    if (a->initrd)
        cfg_set_str(cfg, "initrd", a->initrd);
    if (a->append)
        cfg_set_str(cfg, "cmdline", a->append);
    json_object_object_add(cfg, "memory", json_object_new_int64((int64_t)mem));
    json_object_object_add(cfg, "cpus", json_object_new_int64(a->cpus ? a->cpus : 1));
    cfg_set_str(cfg, "accel", accel);
    cfg_set_str(cfg, "base_id", base_id);
    json_object *disks = json_object_new_array(), *d0 = json_object_new_object();
    cfg_set_str(d0, "cid", CID);
    cfg_set_str(d0, "path", c.disk);
    json_object_array_add(disks, d0);
    json_object_object_add(cfg, "disks", disks);
    cfg_set_str(cfg, "ram_path", c.ram);
    json_object_object_add(cfg, "ram_shared", json_object_new_boolean(1));
    cfg_set_str(cfg, "run_dir", c.vmdir);

    unlink(c.ram);
    if ((rc = ram_room(&c, (int64_t)mem, err)) < 0)
        goto out;
    int fd = open(c.ram, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0 || ftruncate(fd, (off_t)mem) < 0) {
        rc = err_sys(err, "create guest RAM file %s", c.ram);
        if (fd >= 0)
            close(fd);
        goto out;
    }
    close(fd);
    /* the record before QEMU starts: a run killed meanwhile (it is not cancellable) leaves a
     * VM that ls shows and stop --rm removes, not an orphan QEMU no command knows */
    cfg_set_str(cfg, "status", "starting");
    rc = cfg_save(c.cfgpath, cfg, err);
    if (rc == 0)
        rc = vmm_from_cfg(&c, cfg, &v, err);
    if (rc == 0)
        rc = vmsnap_vmm_boot(v, err);
    if (rc < 0)
        goto out;
    step(t, "boot", &t0);
    cfg_set_str(cfg, "status", "running");
    rc = cfg_save(c.cfgpath, cfg, err);
    if (rc < 0)
        vmsnap_vmm_stop(v, NULL);
out:
    if (rc < 0 && created) {
        unlink(c.ram);
        rm_rf(c.vmdir);
    }
    if (rc < 0)
        vmsnap_err_wrap(err, "vm run %s: ", name);
    if (t)
        t->total = mono_now() - tstart;
    vmsnap_vmm_free(v);
    json_object_put(cfg);
    ctx_fini(&c);
    return rc;
}

/* ---- pause / suspend ---- */

/* Stop the running VM after writing its device state into `sdir` (created). On failure the VM
 * runs again and `sdir` is removed. */
static int take_state(struct vmctx *c, json_object *cfg, struct vmsnap_vmm *v, const char *sdir,
                      struct vmsnap_vm_timing *t, double *t0, struct vmsnap_err *err)
{
    enum vmsnap_vmm_state st;
    int rc = vmsnap_vmm_state(v, &st, NULL, err);
    if (rc < 0)
        return rc;
    if (st == VMSNAP_VMM_DEAD) {
        const char *was = cfg_str(cfg, "status") ? cfg_str(cfg, "status") : "?";
        bool ran = status_live(was);
        if (exists(c->ckpt) || stage_unsaved(c))
            return vmsnap_err_set(err, ESRCH,
                                  "VM '%s' has no running QEMU (%s): 'vmsnap vm resume %s' goes "
                                  "back to its last checkpoint",
                                  c->name, ran ? "it exited while the guest ran" : was, c->name);
        return vmsnap_err_set(err, ESRCH,
                              "VM '%s' has no running QEMU (%s), and no checkpoint here: resume "
                              "it from a store ('vmsnap vm resume %s URL') or remove it ('vmsnap "
                              "vm stop --rm %s')",
                              c->name, ran ? "it exited while the guest ran" : was, c->name,
                              c->name);
    }
    /* io-error: QEMU stopped the guest on a failed disk write (a full host filesystem); the
     * device state keeps the request, which the restored guest retries */
    if (st != VMSNAP_VMM_RUNNING && st != VMSNAP_VMM_PAUSED && st != VMSNAP_VMM_IO_ERROR)
        return vmsnap_err_set(err, EINVAL, "VM '%s' is %s, not running", c->name,
                              vmsnap_vmm_state_name(st));
    /* checked while the VM still runs: the checkpoint takes the RAM from c->ram */
    const char *rec = cfg_str(cfg, "ram_path");
    if (cfg_bool(cfg, "ram_shared") && rec && !same_path(rec, c->ram))
        return vmsnap_err_set(err, EINVAL,
                              "VM '%s' keeps its RAM in %s, not %s: give the --ram-dir "
                              "(VMSNAP_RAM_DIR) it was started with",
                              c->name, rec, c->ram);
    rm_rf(sdir);
    if (mkdir(sdir, 0700) < 0)
        return err_sys(err, "mkdir %s", sdir);
    rc = vmsnap_vmm_pause(v, err);
    if (rc < 0)
        goto fail;
    step(t, "pause", t0);
    rc = vmsnap_vmm_snapshot(v, sdir, err);
    if (rc < 0)
        goto fail;
    step(t, "snapshot", t0);
    /* every checkpoint of a VM's lineage (base_id) gets the next generation: a resume can tell
     * a stale snapshot from a newer local checkpoint */
    int64_t gen = cfg_int(cfg, "generation");
    json_object_object_add(cfg, "generation",
                           json_object_new_int64(gen > 0 && gen < GEN_MAX ? gen + 1
                                                 : gen > 0                ? GEN_MAX
                                                                          : 1));
    /* From the stop on, `sdir` (the device state) and the RAM file and live disk are the VM's
     * newest state, until the checkpoint is complete: the config and a mark saying so go in
     * first, so a process killed meanwhile leaves what finish_taken() completes. */
    if ((rc = write_taking(cfg, sdir, err)) < 0)
        goto fail;
    rc = vmsnap_vmm_stop(v, err);
    if (rc < 0)
        goto fail;
    step(t, "teardown", t0);
    return 0;
fail:
    rm_rf(sdir);
    if (st == VMSNAP_VMM_RUNNING) {
        struct vmsnap_err e2;
        if (vmsnap_vmm_resume(v, &e2) < 0)
            vlog(VMSNAP_LOG_ERROR, "VM '%s': resume after a failed checkpoint: %s", c->name,
                 e2.msg);
    }
    return rc;
}

/* Turn a stopped VM's state directory `sdir` (on any filesystem) into the local checkpoint. */
static int finish_local(struct vmctx *c, json_object *cfg, const char *sdir, bool evict,
                        struct vmsnap_vm_timing *t, double *t0, struct vmsnap_err *err)
{
    char newdir[PATH_LEN], p[PATH_LEN];
    if (pcat(newdir, c->ckpt, ".new") < 0)
        return vmsnap_err_set(err, ENAMETOOLONG, "path %s too long", c->ckpt);
    bool in_place = !strcmp(sdir, newdir);
    int rc = 0;
    if (!in_place) {
        rm_rf(newdir);
        if (mkdir(newdir, 0700) < 0)
            return err_sys(err, "mkdir %s", newdir);
        rc = copy_small(sdir, newdir, "state", err);
        if (rc == 0)
            rc = pjoin(p, sdir, "memory-ranges", err);
        char dst[PATH_LEN];
        if (rc == 0)
            rc = pjoin(dst, newdir, "memory-ranges", err);
        if (rc == 0)
            rc = image_copy(c, p, dst, err);
    } else {
        bool ram_in_state = false;
        rc = pjoin(p, newdir, "memory-ranges", err);
        if (rc == 0)
            rc = ckpt_ram(c, cfg, p, &ram_in_state, err);
        json_object_object_add(cfg, "ram_in_state", json_object_new_boolean(ram_in_state));
    }
    if (rc == 0) {
        json_object *ck = ckpt_config(cfg);
        rc = ck ? ckpt_meta(c, ck, newdir, true, err) : vmsnap_err_set(err, ENOMEM, "oom");
        json_object_put(ck);
    }
    if (rc == 0)
        sys_failpoint("checkpoint-before-swap");
    if (rc == 0)
        rc = swap_checkpoint(c, newdir, err);
    if (rc < 0) {
        /* In place, checkpoint.new holds the state the pause took (the device state, maybe the
         * RAM): with the RAM file and the live disk, the VM's newest state. It stays for
         * recover_interrupted() to complete; from a stage, the stage still has it all. */
        if (!in_place)
            rm_rf(newdir);
        return rc;
    }
    /* The live disk lives on as the checkpoint's hard link; resume clones it out again. */
    unlink(c->disk);
    if (cfg_bool(cfg, "ram_shared"))
        unlink(c->ram);
    rm_rf(c->ondemand);
    step(t, "checkpoint", t0);
    if (evict) {
        /* The checkpoint was just written: start its writeback and drop what is clean, so it
         * does not stay charged to this cgroup next to the next guest's RAM. */
        struct vmsnap_pcache_evict_opts eo = {.kick_writeback = true};
        struct vmsnap_pcache_report rep = {0};
        struct vmsnap_err e2;
        if (vmsnap_pcache_evict(c->ckpt, &eo, &rep, &e2) < 0)
            vlog(VMSNAP_LOG_WARN, "evict %s: %s", c->ckpt, e2.msg);
        step(t, "evict", t0);
    }
    return 0;
}

/* The record of a VM whose local checkpoint was just swapped in (its generation is cfg's). */
static int record_paused(struct vmctx *c, json_object *cfg, struct vmsnap_err *err)
{
    cfg_set_str(cfg, "status", "paused");
    json_object_object_del(cfg, "ram_in_state");
    int rc = cfg_save(c->cfgpath, cfg, err);
    if (rc < 0)
        vmsnap_err_wrap(
            err, "the checkpoint %s is complete, but the VM's record is not updated: ", c->ckpt);
    return rc;
}

static int load_vm(struct vmctx *c, json_object **cfg, struct vmsnap_err *err)
{
    int rc = ctx_lock(c, err);
    if (rc == 0)
        rc = cfg_load(c->cfgpath, cfg, err);
    return rc;
}

int vmsnap_vm_pause(const struct vmsnap_vm_opts *o, const char *name, struct vmsnap_vm_timing *t,
                    struct vmsnap_err *err)
{
    double t0 = mono_now(), tstart = t0;
    struct vmctx c;
    json_object *cfg = NULL;
    struct vmsnap_vmm *v = NULL;
    int rc = ctx_init(&c, o, name, err);
    if (rc == 0)
        rc = load_vm(&c, &cfg, err);
    if (rc == 0)
        rc = vmm_from_cfg(&c, cfg, &v, err);
    char newdir[PATH_LEN];
    if (pcat(newdir, c.ckpt, ".new") < 0)
        newdir[0] = 0;
    if (rc == 0)
        rc = take_state(&c, cfg, v, newdir, t, &t0, err);
    if (rc == 0)
        sys_failpoint("pause-taken");
    if (rc == 0) {
        rc = finish_local(&c, cfg, newdir, !(o && o->no_evict), t, &t0, err);
        if (rc < 0)
            vmsnap_err_wrap(err,
                            "VM stopped; the state it took is kept in %s and becomes its "
                            "checkpoint at the next 'vmsnap vm resume %s' once this is fixed: ",
                            newdir, name);
    }
    if (rc == 0)
        rc = record_paused(&c, cfg, err);
    /* A stage next to a live QEMU is the snapshot that QEMU was restored from (a resume from it
     * killed before or after the guest ran; its image may be the RAM file's inode, which it
     * would keep on the tmpfs): this checkpoint supersedes it. */
    if (rc == 0 && stage_ok(&c))
        unstage(&c);
    if (rc < 0)
        vmsnap_err_wrap(err, "vm pause %s: ", name);
    if (t)
        t->total = mono_now() - tstart;
    vmsnap_vmm_free(v);
    json_object_put(cfg);
    ctx_fini(&c);
    return rc;
}

/* Transfer options for a suspend: the caller's, with the codec frame size derived from the
 * guest's memory when the caller left it at 0 (for every file of the set; the disk image and
 * the small files do not care): memory / 64, a power of two in [8, 64] MiB
 * (512 MiB -> 8 MiB, 4 GiB and more -> 64 MiB). A guest's populated RAM bunches up in a few
 * 64 MiB ranges, so the codec default leaves a small guest with a handful of frames: one thread
 * compresses the last big one alone, and each thread holds two 64 MiB buffers (push peaked at
 * 270 MiB for a 512 MiB guest, 120 MiB with 8 MiB frames, same output size +-0.2%). The size
 * depends on the guest alone, so the object stays byte-identical for any thread count. */
static struct vmsnap_xfer_opts suspend_xfer_opts(const struct vmsnap_vm_opts *o, json_object *cfg)
{
    static const struct vmsnap_xfer_opts zero;
    struct vmsnap_xfer_opts x = o && o->xfer ? *o->xfer : zero;
    if (x.frame_size == 0) {
        int64_t mem = cfg_int(cfg, "memory");
        uint64_t fs = 8ull << 20;
        while (fs < (64ull << 20) && mem > 0 && fs * 64 < (uint64_t)mem)
            fs <<= 1;
        x.frame_size = fs;
    }
    return x;
}

/* True when two snapshot URLs are in the same S3 bucket (the endpoint and credentials come from
 * the same options). Local stores are left out: an object's frames are not block-aligned, so
 * copying them is a data copy (no reflink), which costs about what compressing them from tmpfs
 * costs (measured: no faster); S3 copies cost the node nothing. gs:// is left out too: Cloud
 * Storage's XML multipart API takes no preconditions, so a copy could not be guarded by the
 * base's ETag. */
static bool same_bucket(const char *a, const char *b)
{
    if (strncmp(a, "s3://", 5) || strncmp(b, "s3://", 5))
        return false;
    const char *ea = strchr(a + 5, '/'), *eb = strchr(b + 5, '/');
    size_t la = ea ? (size_t)(ea - a) : strlen(a), lb = eb ? (size_t)(eb - b) : strlen(b);
    return la == lb && !strncmp(a, b, la);
}

/* The push options of a suspend to `url`: frames sized to the guest, and the store URL the VM
 * last came from or went to as the base when it is in the same bucket (frames that did not
 * change since are copied by the store instead of uploaded). */
static struct vmsnap_xfer_opts suspend_push_opts(const struct vmsnap_vm_opts *o, json_object *cfg,
                                                 const char *url)
{
    struct vmsnap_xfer_opts x = suspend_xfer_opts(o, cfg);
    const char *prev = cfg_str(cfg, "url");
    if (!x.base && !(o && o->no_base) && prev && same_bucket(prev, url))
        x.base = prev;
    x.base_implicit = true;
    return x;
}

/* A suspend could store its staged snapshot neither in the store nor as a local checkpoint
 * (`why`): the stage is the only copy of the VM. Complete (memory image, device state, config),
 * it is marked (UNSAVED_MARK), so that nothing removes it and the next suspend pushes it;
 * incomplete, it is only left in place. Either way the error says where it is. */
static void keep_stage(struct vmctx *c, json_object *cfg, const char *why, struct vmsnap_err *err)
{
    const char *missing = snapshot_missing(c->stage);
    bool complete = !missing;
    struct vmsnap_err me = {0};
    bool marked = complete && (stage_unsaved(c) || mark_unsaved(c, &me) == 0);
    if (!complete) { /* not a snapshot: nothing may take it for one */
        char p[PATH_LEN];
        if (pcat(p, c->stage, "/" UNSAVED_MARK) == 0)
            unlink(p);
    }
    cfg_set_str(cfg, "status", "stopped");
    cfg_save(c->cfgpath, cfg, NULL);
    if (marked)
        vmsnap_err_wrap(err,
                        "the local checkpoint failed too (%s); the snapshot is left in %s (run "
                        "'vmsnap vm suspend %s URL' again to store it): ",
                        why, c->stage, c->name);
    else if (complete)
        vmsnap_err_wrap(err,
                        "the local checkpoint failed too (%s); the snapshot is left in %s but "
                        "could not be marked as unsaved (%s): copy it away before any 'vmsnap vm "
                        "stop' or resume of this VM, which would remove it: ",
                        why, c->stage, me.msg);
    else
        vmsnap_err_wrap(err,
                        "the local checkpoint failed too (%s); what was taken of the VM is left "
                        "in %s, incomplete (no %s), for the next 'vmsnap vm resume %s' to "
                        "complete once this is fixed: ",
                        why, c->stage, missing, c->name);
}

static bool path_under(const char *p, const char *dir)
{
    size_t n = strlen(dir);
    return !strncmp(p, dir, n) && (p[n] == '\0' || p[n] == '/');
}

/* A local store URL inside the VMs' directories, a VM's stage or RAM file would be removed by
 * the suspend's own teardown (or another VM's): the snapshot stored, then deleted. Compared in
 * canonical spellings (symlinked directories resolved). */
static int dest_outside_vms(const struct vmctx *c, const char *url, struct vmsnap_err *err)
{
    if (strstr(url, "://") && strncmp(url, "file://", 7))
        return 0; /* s3://, gs:// */
    char text[PATH_MAX], canon[PATH_MAX], vms[PATH_LEN], cvms[PATH_MAX], cvm[PATH_MAX];
    /* the path the local store will use (".." resolved as text), then its canonical form */
    int rc = sys_lexical_path(strncmp(url, "file://", 7) ? url : url + 7, text, sizeof(text));
    if (rc == 0)
        rc = sys_canon_path(text, canon);
    if (rc == 0 && (rc = pjoin(vms, c->state, "vms", err)) == 0)
        rc = sys_canon_path(vms, cvms);
    if (rc == 0)
        rc = sys_canon_path(c->vmdir, cvm);
    if (rc < 0)
        return err_code(err, -rc, "%s", url);
    const char *inside = path_under(canon, cvms) ? cvms : path_under(canon, cvm) ? cvm : NULL;
    if (!inside && path_under(canon, c->ram_dir)) {
        /* a VM's RAM file or stage (any VM's: vmsnap-<hash>-<name>.ram|.stage) */
        const char *leaf = canon + strlen(c->ram_dir);
        leaf += *leaf == '/';
        size_t n = strcspn(leaf, "/");
        if (!strncmp(leaf, "vmsnap-", 7) && ((n > 4 && !strncmp(leaf + n - 4, ".ram", 4)) ||
                                             (n > 6 && !strncmp(leaf + n - 6, ".stage", 6))))
            inside = c->ram_dir;
    }
    if (inside)
        return vmsnap_err_set(err, EINVAL,
                              "%s is inside %s, which vmsnap manages (a suspend or stop removes "
                              "what is there): store the snapshot elsewhere",
                              url, inside);
    return 0;
}

int vmsnap_vm_suspend(const struct vmsnap_vm_opts *o, const char *name, const char *url,
                      struct vmsnap_vm_timing *t, struct vmsnap_err *err)
{
    double t0 = mono_now(), tstart = t0;
    struct vmctx c;
    json_object *cfg = NULL;
    struct vmsnap_vmm *v = NULL;
    int rc = ctx_init(&c, o, name, err);
    if (rc == 0)
        rc = load_vm(&c, &cfg, err);
    if (rc == 0) {
        /* a URL the store refuses (a typo, a local path under a file or in a directory this
         * process cannot write) fails here, before the VM stops for nothing */
        struct vmsnap_xfer_opts xo = suspend_push_opts(o, cfg, url);
        rc = vmsnap_xfer_check_dest(url, true, &xo, err);
    }
    if (rc == 0)
        rc = dest_outside_vms(&c, url, err);
    if (rc == 0)
        rc = check_ram_dir(&c, err);
    if (rc == 0)
        rc = vmm_from_cfg(&c, cfg, &v, err);
    if (rc == 0) {
        /* A stopped VM with a local checkpoint (paused, or a suspend whose upload failed), or
         * with a snapshot only in its staging directory (a suspend that could store it
         * nowhere): push that as it is. */
        enum vmsnap_vmm_state st;
        rc = vmsnap_vmm_state(v, &st, NULL, err);
        char pend[PATH_LEN];
        if (rc == 0 && st == VMSNAP_VMM_DEAD && recover_interrupted(&c, pend)) {
            rc = pending_error(&c, pend, "", err);
            goto out;
        }
        const bool unsaved = rc == 0 && st == VMSNAP_VMM_DEAD && stage_unsaved(&c);
        const char *missing = unsaved ? snapshot_missing(c.stage) : NULL;
        if (missing) {
            rc = vmsnap_err_set(err, EIO,
                                "the snapshot kept in %s is incomplete (no %s): not pushing it",
                                c.stage, missing);
            goto out;
        }
        if (rc == 0 && st == VMSNAP_VMM_DEAD && (unsaved || exists(c.ckpt))) {
            struct vmsnap_xfer_stats xs = {0};
            struct vmsnap_xfer_opts xo = suspend_push_opts(o, cfg, url);
            const char *from = unsaved ? c.stage : c.ckpt;
            const char *was = cfg_str(cfg, "status");
            if (status_live(was)) {
                /* QEMU died under a running guest (it crashed, or was killed): what the guest
                 * did since the snapshot pushed here is gone; say so rather than succeed
                 * quietly */
                struct stat cs;
                char when[64] = "?";
                if (stat(from, &cs) == 0)
                    strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S %Z",
                             localtime(&cs.st_mtim.tv_sec));
                vlog(VMSNAP_LOG_WARN,
                     "VM '%s' is dead (its QEMU exited while the guest ran): suspending its "
                     "last %s, %s, of %s; what the guest did after it is lost",
                     name, unsaved ? "snapshot" : "checkpoint", from, when);
            }
            rc = vmsnap_xfer_push(from, url, &xo, &xs, err);
            step(t, "upload", &t0);
            if (t) {
                t->object_bytes = xs.object_bytes;
                t->copied_bytes = xs.copied_bytes;
            }
            if (rc < 0) {
                vmsnap_err_wrap(err, "upload failed; the %s %s is kept: ",
                                unsaved ? "snapshot in" : "local checkpoint", from);
                goto out;
            }
            /* the record first: a suspend killed during the teardown leaves a record naming the
             * snapshot just stored, not the previous one */
            cfg_set_str(cfg, "status", "suspended");
            cfg_set_str(cfg, "url", url);
            rc = cfg_save(c.cfgpath, cfg, err);
            if (rc < 0)
                goto out;
            unlink(c.disk);
            unlink(c.ram); /* a dead QEMU's guest RAM (tmpfs: memory): not a state to keep */
            const char *rp = cfg_str(cfg, "ram_path");
            struct stat rs;
            if (rp && strcmp(rp, c.ram) && lstat(rp, &rs) == 0) /* not followed: see vm stop */
                vlog(VMSNAP_LOG_WARN,
                     "VM '%s': its dead QEMU's RAM file %s stays (it ran with another "
                     "--ram-dir): 'vmsnap vm stop %s --ram-dir DIR' with that directory removes it",
                     name, rp, name);
            rm_rf(c.ckpt);
            rm_rf(c.ondemand);
            if (unsaved)
                unstage(&c);
            step(t, "teardown-local", &t0);
            goto out;
        }
    }
    /* Stage on the RAM tmpfs: the RAM file is renamed in (no copy) and packed from there. */
    if (rc == 0)
        rc = take_state(&c, cfg, v, c.stage, t, &t0, err);
    if (rc < 0)
        goto out;
    sys_failpoint("suspend-taken");
    char p[PATH_LEN];
    bool ram_in_state = false;
    rc = pjoin(p, c.stage, "memory-ranges", err);
    if (rc == 0)
        rc = ckpt_ram(&c, cfg, p, &ram_in_state, err);
    json_object_object_add(cfg, "ram_in_state", json_object_new_boolean(ram_in_state));
    if (rc == 0) {
        json_object *ck = ckpt_config(cfg);
        rc = ck ? ckpt_meta(&c, ck, c.stage, false, err) : vmsnap_err_set(err, ENOMEM, "oom");
        json_object_put(ck);
    }
    if (rc < 0) {
        /* Nothing was uploaded; keep what exists as a local checkpoint if the RAM made it, and
         * if even that fails, the stage holds the only copy of the VM's memory: keep it. */
        struct vmsnap_err e2;
        if (exists(p)) {
            if (finish_local(&c, cfg, c.stage, false, NULL, &t0, &e2) == 0) {
                record_paused(&c, cfg, NULL);
                vmsnap_err_wrap(err, "the VM is stopped with a local checkpoint in %s: ", c.ckpt);
                goto out_stage;
            }
            keep_stage(&c, cfg, e2.msg, err);
            goto out;
        }
        /* the RAM is still the RAM file (or in the device state): the stage's device state is
         * half of the VM's newest state, completed by the next resume (recover_interrupted) */
        cfg_set_str(cfg, "status", "stopped");
        cfg_save(c.cfgpath, cfg, NULL);
        vmsnap_err_wrap(err,
                        "the VM is stopped; the state it took is kept in %s and becomes its "
                        "checkpoint at the next 'vmsnap vm resume %s' once this is fixed: ",
                        c.stage, name);
        goto out;
    }
    /* From here until the store has it, the stage is the VM's only copy: marked, so that a
     * suspend killed during the upload leaves a snapshot the next command finds (a resume
     * restores it, a suspend pushes it, a stop keeps it) instead of an older checkpoint. */
    if ((rc = mark_unsaved(&c, err)) < 0) {
        struct vmsnap_err e2;
        if (finish_local(&c, cfg, c.stage, false, NULL, &t0, &e2) == 0) {
            record_paused(&c, cfg, NULL);
            vmsnap_err_wrap(err, "the VM is stopped with a local checkpoint in %s: ", c.ckpt);
            goto out_stage;
        }
        keep_stage(&c, cfg, e2.msg, err);
        goto out;
    }
    sys_failpoint("suspend-staged");
    step(t, "stage", &t0);
    struct vmsnap_xfer_stats xs = {0};
    struct vmsnap_xfer_opts xo = suspend_push_opts(o, cfg, url);
    rc = vmsnap_xfer_push(c.stage, url, &xo, &xs, err);
    step(t, "upload", &t0);
    if (t) {
        t->object_bytes = xs.object_bytes;
        t->copied_bytes = xs.copied_bytes;
    }
    if (rc < 0) {
        struct vmsnap_err e2;
        int lrc = finish_local(&c, cfg, c.stage, !(o && o->no_evict), t, &t0, &e2);
        if (lrc == 0) {
            record_paused(&c, cfg, NULL);
            vmsnap_err_wrap(err,
                            "upload failed; the VM is stopped and its checkpoint kept locally in "
                            "%s (run 'vmsnap vm suspend %s URL' again, or 'vmsnap vm resume "
                            "%s'): ",
                            c.ckpt, name, name);
        } else {
            vmsnap_err_wrap(err, "upload failed: ");
            keep_stage(&c, cfg, e2.msg, err);
            goto out;
        }
        goto out_stage;
    }
    /* The manifest is written: only now remove the VM's local state, the record first (a
     * suspend killed during the teardown leaves a record naming the snapshot just stored). */
    cfg_set_str(cfg, "status", "suspended");
    cfg_set_str(cfg, "url", url);
    json_object_object_del(cfg, "ram_in_state");
    rc = cfg_save(c.cfgpath, cfg, err);
    if (rc < 0) {
        /* the stage stays marked (resume NAME restores it, the newest state the record does not
         * know) and says where its set is stored (resume NAME URL may go there) */
        if (pcat(p, c.stage, "/" STORED_MARK) == 0)
            write_small(p, url, NULL);
        vmsnap_err_wrap(err,
                        "the snapshot is stored at %s, but the VM's record could not be "
                        "updated (its stage %s is kept: 'vmsnap vm resume %s' restores it, as "
                        "does 'vmsnap vm resume %s %s'): ",
                        url, c.stage, name, name, url);
        goto out;
    }
    if (pcat(p, c.stage, "/" UNSAVED_MARK) == 0)
        unlink(p);
    unlink(c.disk);
    unlink(c.ram);
    rm_rf(c.ckpt);
    rm_rf(c.ondemand);
    step(t, "teardown-local", &t0);
out_stage:
    unstage(&c);
out:
    if (rc < 0)
        vmsnap_err_wrap(err, "vm suspend %s: ", name);
    if (t)
        t->total = mono_now() - tstart;
    vmsnap_vmm_free(v);
    json_object_put(cfg);
    ctx_fini(&c);
    return rc;
}

/* ---- resume ---- */

/* A live VM that QEMU stopped on a failed disk write (io-error): continue it, so the guest
 * retries the write, once its disk's filesystem has room again. */
static int resume_io_error(struct vmctx *c, json_object *rec, struct vmsnap_vm_timing *t,
                           double *t0, struct vmsnap_err *err)
{
    struct vmsnap_vmm *v = NULL;
    enum vmsnap_vmm_state st = VMSNAP_VMM_RUNNING; /* after the cont, until seen otherwise */
    int rc = vmm_from_cfg(c, rec, &v, err);
    if (rc == 0)
        rc = vmsnap_vmm_resume(v, err);
    /* a write that fails again stops it again (virtio-blk retries it at once): watched for
     * 0.5 s, in 50 ms steps */
    for (int i = 0; rc == 0 && i < 10 && st != VMSNAP_VMM_IO_ERROR; i++) {
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
        rc = vmsnap_vmm_state(v, &st, NULL, err);
    }
    vmsnap_vmm_free(v);
    if (rc == 0 && st == VMSNAP_VMM_IO_ERROR) {
        struct statfs sf;
        unsigned long long fk =
            statfs(c->vmdir, &sf) == 0 ? (unsigned long long)sf.f_bavail * sf.f_bsize >> 10 : 0;
        return vmsnap_err_set(err, ENOSPC,
                              "VM '%s' stopped again on a failed write to its disk %s (%llu KiB "
                              "free there): make room, then resume it again (or pause or suspend "
                              "it: the checkpoint keeps the write)",
                              c->name, c->disk, fk);
    }
    if (rc == 0 && st != VMSNAP_VMM_RUNNING)
        rc = vmsnap_err_set(err, EIO, "VM '%s' is %s after being continued from io-error", c->name,
                            vmsnap_vmm_state_name(st));
    if (rc < 0)
        return rc;
    step(t, "resume", t0);
    vlog(VMSNAP_LOG_WARN, "VM '%s': continued after a failed disk write (io-error), retried now",
         c->name);
    cfg_set_str(rec, "status", "running");
    return cfg_save(c->cfgpath, rec, err);
}

/* `path` (absolute) resolved is a regular file under one of the colon-separated directories
 * `dirs`; its resolved form in rp (PATH_MAX bytes), which is what QEMU gets and vm.json keeps,
 * so no later change of a symlink on the way redirects it. */
static bool under_asset_dir(const char *path, const char *dirs, char *rp)
{
    char rd[PATH_MAX];
    struct stat sb;
    if (path[0] != '/' || !realpath(path, rp) || stat(rp, &sb) < 0 || !S_ISREG(sb.st_mode))
        return false;
    for (const char *d = dirs; d && *d;) {
        const char *e = strchr(d, ':');
        size_t n = e ? (size_t)(e - d) : strlen(d);
        char one[PATH_MAX];
        if (n > 0 && n < sizeof(one)) {
            memcpy(one, d, n);
            one[n] = 0;
            size_t l;
            if (realpath(one, rd) && (l = strlen(rd)) > 0 &&
                (!strcmp(rd, "/") || (!strncmp(rp, rd, l) && rp[l] == '/')))
                return true;
        }
        d = e ? e + 1 : d + n;
    }
    return false;
}

/* The kernel and initrd a VM resumed from a store runs with. The set's config.json may come
 * from anywhere the store's writers are: naming /etc/shadow as the initrd would hand that file
 * to the guest (QEMU serves it through fw_cfg). So: the caller's --kernel/--initrd, else this
 * node's own record of the VM, else the set's, only under the node's asset directories. */
static int trust_assets(const struct vmctx *c, json_object *cfg, json_object *old,
                        struct vmsnap_err *err)
{
    const struct vmsnap_vm_opts *o = c->o;
    const char *dirs = o && o->asset_dirs ? o->asset_dirs : getenv("VMSNAP_ASSET_DIRS");
    static const char *const keys[] = {"kernel", "initrd"};
    for (int k = 0; k < 2; k++) {
        const char *mine = !o ? NULL : k ? o->initrd : o->kernel;
        if (mine) {
            cfg_set_str(cfg, keys[k], mine);
            continue;
        }
        if (old && cfg_str(old, "kernel")) { /* a VM this node ran or resumed before */
            cfg_set_str(cfg, keys[k], cfg_str(old, keys[k]));
            continue;
        }
        const char *theirs = cfg_str(cfg, keys[k]);
        if (!theirs)
            continue;
        if (!dirs || !*dirs)
            return vmsnap_err_set(err, EPERM,
                                  "the snapshot names %s %s, and this node has no asset directory "
                                  "to trust it under: set VMSNAP_ASSET_DIRS (or --asset-dir), or "
                                  "give --kernel and --initrd",
                                  keys[k], theirs);
        char rp[PATH_MAX];
        if (!under_asset_dir(theirs, dirs, rp))
            return vmsnap_err_set(err, EPERM,
                                  "the snapshot names %s %s, which is not a file under the asset "
                                  "directories %s: refusing it",
                                  keys[k], theirs, dirs);
        cfg_set_str(cfg, keys[k], rp);
    }
    return 0;
}

int vmsnap_vm_resume(const struct vmsnap_vm_opts *o, const char *name, const char *url,
                     struct vmsnap_vm_timing *t, struct vmsnap_err *err)
{
    double t0 = mono_now(), tstart = t0;
    struct vmctx c;
    json_object *cfg = NULL, *old = NULL;
    struct vmsnap_vmm *v = NULL;
    bool created = false, ram_made = false, disk_made = false, restored = false, had_prev = false;
    bool provisional = false, replaced_record = false;
    char disk_prev[PATH_LEN] = "";
    bool on_demand = o && o->on_demand;
    char src[PATH_LEN] = "", p[PATH_LEN];
    char mark[PATH_LEN] = ""; /* the stage's unsaved mark, once removed for the guest to run */
    char *url_copy = NULL;
    int rc = ctx_init(&c, o, name, err);
    if (rc < 0)
        return rc;
    rc = check_ram_dir(&c, err);
    if (rc < 0)
        goto out;
    if (!exists(c.vmdir)) {
        if (!url) {
            rc = vmsnap_err_set(err, ENOENT,
                                "no VM named '%s' under %s (give the URL it was "
                                "suspended to)",
                                name, c.state);
            goto out;
        }
        char vms[PATH_LEN];
        if (pcat(vms, c.state, "/vms") < 0)
            return vmsnap_err_set(err, ENAMETOOLONG, "path %s too long", c.state);
        rc = mkdir_p(vms, err);
        if (rc == 0 && mkdir(c.vmdir, 0700) < 0)
            rc = err_sys(err, "mkdir %s", c.vmdir);
        if (rc < 0)
            goto out;
        created = true;
    }
    rc = ctx_lock(&c, err);
    if (rc < 0)
        goto out;
    if (!created && exists(c.cfgpath)) {
        /* a pause or suspend killed or failed after QEMU stopped: completed, or refused */
        json_object *rec = NULL;
        enum vmsnap_vmm_state st0;
        const char *pend = NULL;
        if (cfg_load(c.cfgpath, &rec, NULL) == 0 && vm_state(&c, rec, 0, &st0, NULL, NULL) == 0 &&
            st0 == VMSNAP_VMM_DEAD)
            pend = recover_interrupted(&c, p);
        json_object_put(rec);
        if (pend && !(o && o->force)) {
            rc = pending_error(&c, pend,
                               ", or give --force to resume from the previous checkpoint and "
                               "discard it",
                               err);
            goto out;
        }
        if (pend) { /* --force: the RAM file is about to be replaced, the state goes with it */
            vlog(VMSNAP_LOG_WARN, "VM '%s': discarding the incomplete state in %s (--force)", name,
                 pend);
            if (!strcmp(pend, c.stage))
                unstage(&c);
            else
                rm_rf(pend);
            unlink(c.ram);
        }
    }
    /* A snapshot only in the stage (its suspend could store it nowhere) is the VM's latest:
     * a resume without a URL restores it (its image renamed into place as RAM), one with a URL
     * would lose it. */
    bool from_stage = stage_unsaved(&c);
    if (from_stage && url && stage_stored_at(&c, url)) {
        vlog(VMSNAP_LOG_INFO, "VM '%s': the snapshot in %s is stored at %s: resuming from there",
             name, c.stage, url);
        from_stage = false; /* the pull replaces the stage */
    }
    if (from_stage && (url || on_demand)) {
        rc = vmsnap_err_set(err, EEXIST,
                            "VM '%s' has a snapshot that its last suspend could not store, only "
                            "in %s: resume it from there ('vmsnap vm resume %s', eagerly) or store "
                            "it with 'vmsnap vm suspend %s URL' (or remove that directory to "
                            "discard it)",
                            name, c.stage, name, name);
        goto out;
    }
    if (!created && exists(c.cfgpath) && (rc = cfg_load(c.cfgpath, &old, err)) < 0) {
        /* without the record it cannot tell whether the VM's QEMU still runs */
        vmsnap_err_wrap(err, "VM '%s' has an unreadable record (restore or remove %s): ", name,
                        c.vmdir);
        goto out;
    }
    if (old) {
        enum vmsnap_vmm_state st;
        /* 1: the record cannot describe a QEMU (nothing to ask); < 0: its QEMU runs and did
         * not answer */
        struct vmsnap_vmm *sv = NULL;
        int vrc = vmm_from_cfg(&c, old, &sv, NULL) == 0 ? vmsnap_vmm_state(sv, &st, NULL, err) : 1;
        vmsnap_vmm_free(sv);
        if (vrc < 0) {
            /* its QEMU runs but does not answer (its monitor busy with another client, or the
             * process stopped): resuming would remove the RAM file that QEMU still runs on */
            rc = vrc;
            vmsnap_err_wrap(err,
                            "VM '%s': cannot tell whether its QEMU still runs the guest, so it is "
                            "not resumed ('vmsnap vm stop %s' ends that QEMU): ",
                            name, name);
            goto out;
        }
        if (vrc == 0 && st == VMSNAP_VMM_IO_ERROR && !url && !on_demand) {
            rc = resume_io_error(&c, old, t, &t0, err);
            goto out;
        }
        if (vrc == 0 && st == VMSNAP_VMM_PAUSED) {
            rc = vmsnap_err_set(err, EBUSY,
                                "VM '%s' is frozen: its QEMU holds the guest stopped (a resume "
                                "killed after the restore, or a pause killed after it stopped "
                                "the guest): 'vmsnap vm pause %s' checkpoints that state, then "
                                "resume it; or 'vmsnap vm stop %s' and resume again",
                                name, name, name);
            goto out;
        }
        if (vrc == 0 && st != VMSNAP_VMM_DEAD) {
            rc = vmsnap_err_set(err, EBUSY, "VM '%s' is %s: pause, suspend or stop it first", name,
                                vmsnap_vmm_state_name(st));
            goto out;
        }
        /* No local checkpoint but a known store URL (suspended, or resumed from a store): the
         * last checkpoint is there. */
        if (!url && !from_stage && !exists(c.ckpt) && cfg_str(old, "url")) {
            url_copy = strdup(cfg_str(old, "url"));
            url = url_copy;
        }
    }
    if (from_stage) {
        snprintf(src, sizeof(src), "%s", c.stage);
        const char *missing = snapshot_missing(c.stage);
        if (missing) {
            rc = vmsnap_err_set(err, EIO,
                                "VM '%s': the snapshot kept in %s is incomplete (no %s): it "
                                "cannot be restored",
                                name, c.stage, missing);
            goto out;
        }
    } else if (!url) {
        snprintf(src, sizeof(src), "%s", c.ckpt);
        if (!exists(c.ckpt)) {
            rc = vmsnap_err_set(err, ENOENT,
                                "VM '%s' has no local checkpoint in %s: resume it from a store "
                                "('vmsnap vm resume %s URL') or remove it ('vmsnap vm stop "
                                "--rm %s')",
                                name, c.ckpt, name, name);
            goto out;
        }
    } else {
        /* Eager: decode straight into tmpfs, where memory-ranges becomes guest RAM by a rename.
         * On demand: the image stays mapped for the VM's life, so it goes to disk. */
        snprintf(src, sizeof(src), "%s", on_demand ? c.ondemand : c.stage);
        /* An old on-demand image there belongs to a dead process: replacing it is safe. The
         * directory is made here, 0700: the stage's name in a world-writable RAM directory is
         * predictable, and a directory someone else made in its place is refused. */
        rm_rf(src);
        if (mkdir(src, 0700) < 0) {
            rc = err_sys(err, "mkdir %s", src);
            goto out;
        }
        struct vmsnap_xfer_opts xo = {0};
        if (o && o->xfer)
            xo = *o->xfer;
        xo.set_only = true; /* a VM is a set (a single object pulled here failed at a rename) */
        rc = vmsnap_xfer_pull(url, src, &xo, NULL, err);
        if (rc < 0) {
            rm_rf(src);
            vmsnap_err_wrap(err, "pull %s (the snapshot there is untouched): ", url);
            goto out;
        }
        step(t, "download", &t0);
    }
    rc = pjoin(p, src, "config.json", err);
    if (rc == 0)
        rc = cfg_load(p, &cfg, err);
    if (rc == 0 && url) {
        char shown[PATH_LEN];
        snprintf(shown, sizeof(shown), "%s/config.json", url);
        rc = check_set_cfg(p, shown, cfg, err);
    }
    if (rc < 0)
        goto out_src;
    if (cfg_int(cfg, "memory") <= 0 || !cfg_str(cfg, "kernel")) {
        rc = vmsnap_err_set(err, EINVAL, "%s: no memory size or kernel", p);
        goto out_src;
    }
    if (url && (rc = trust_assets(&c, cfg, old, err)) < 0)
        goto out_src;
    if (url && exists(c.ckpt) && !(o && o->force)) {
        /* the local checkpoint is superseded (removed) by this resume: not if it is newer */
        json_object *lc = NULL;
        char lp[PATH_LEN];
        if (pjoin(lp, c.ckpt, "config.json", NULL) == 0 && cfg_load(lp, &lc, NULL) == 0) {
            const char *lb = cfg_str(lc, "base_id"), *sb = cfg_str(cfg, "base_id");
            int64_t lg = cfg_int(lc, "generation"), sg = cfg_int(cfg, "generation");
            if (lb && sb && !strcmp(lb, sb) && lg > sg)
                rc = vmsnap_err_set(err, EEXIST,
                                    "the local checkpoint %s is newer than the snapshot at %s "
                                    "(generation %lld > %lld of the same VM) and this resume "
                                    "would replace it: resume without a URL, or give --force",
                                    c.ckpt, url, (long long)lg, (long long)(sg > 0 ? sg : 0));
            else if (lb && sb && strcmp(lb, sb))
                rc = vmsnap_err_set(err, EEXIST,
                                    "the local checkpoint %s is of another VM (base id %s) than "
                                    "the snapshot at %s (base id %s) and this resume would "
                                    "replace it: resume '%s' without a URL, resume the snapshot "
                                    "under another name, or give --force",
                                    c.ckpt, lb, url, sb, name);
        }
        json_object_put(lc);
        if (rc < 0)
            goto out_src;
    }
    if (url && old && !(o && o->force)) {
        /* the node's record of this VM names a later checkpoint of the same lineage (it was
         * suspended or paused after the snapshot at `url` was taken): resuming would go back */
        const char *rb = cfg_str(old, "base_id"), *sb = cfg_str(cfg, "base_id");
        int64_t rg = cfg_int(old, "generation"), sg = cfg_int(cfg, "generation");
        const char *ru = cfg_str(old, "url");
        if (rb && sb && !strcmp(rb, sb) && rg > sg) {
            rc = vmsnap_err_set(err, EEXIST,
                                "VM '%s' has a later checkpoint (generation %lld%s%s) than the "
                                "snapshot at %s (generation %lld): resuming it would go back; "
                                "resume %s, or give --force",
                                name, (long long)rg, ru ? ", at " : "", ru ? ru : "", url,
                                (long long)(sg > 0 ? sg : 0),
                                ru ? "from that URL" : "without a URL");
            goto out_src;
        }
    }
    const char *sacc = cfg_str(cfg, "accel");
    if (sacc && strcmp(sacc, "kvm") && strcmp(sacc, "tcg")) {
        rc = vmsnap_err_set(err, EINVAL, "%s: accelerator '%s' is neither kvm nor tcg", p, sacc);
        goto out_src;
    }
    {
        /* the memory image is the guest RAM file: exactly the VM's memory, or a set could
         * leave a RAM file of any size on the tmpfs for the VM's life */
        char mr[PATH_LEN];
        struct stat ms;
        rc = pjoin(mr, src, "memory-ranges", err);
        if (rc == 0 && stat(mr, &ms) < 0)
            rc = err_sys(err, "%s", mr);
        if (rc == 0 && (uint64_t)ms.st_size != (uint64_t)cfg_int(cfg, "memory"))
            rc = vmsnap_err_set(err, EINVAL,
                                "%s: the memory image holds %llu bytes, the VM's memory is %llu: "
                                "refusing it",
                                mr, (unsigned long long)ms.st_size,
                                (unsigned long long)cfg_int(cfg, "memory"));
        if (rc < 0)
            goto out_src;
    }

    /* Stage: clone the disk out, place the RAM, rewrite the node-local paths. A live disk
     * already there (a stopped VM's) is set aside and put back if this resume fails. */
    rc = pcat(disk_prev, c.disk, ".prev") < 0 ? vmsnap_err_set(err, ENAMETOOLONG, "path too long")
                                              : pjoin(p, src, DISK_CKPT, err);
    if (rc < 0)
        goto out_src;
    if (exists(disk_prev) && rename(disk_prev, c.disk) < 0) { /* left by a crashed resume */
        rc = err_sys(err, "rename %s to %s", disk_prev, c.disk);
        goto out_src;
    }
    if (exists(c.disk)) {
        if (rename(c.disk, disk_prev) < 0) {
            rc = err_sys(err, "rename %s to %s", c.disk, disk_prev);
            goto out_src;
        }
        had_prev = true;
    }
    disk_made = true;
    rc = sparse_copy(p, c.disk, err);
    if (rc < 0)
        goto out_src;
    char ram[PATH_LEN], img[PATH_LEN];
    rc = pjoin(img, src, "memory-ranges", err);
    if (rc < 0)
        goto out_src;
    unlink(c.ram);
    if (on_demand) {
        snprintf(ram, sizeof(ram), "%s", img);
    } else {
        snprintf(ram, sizeof(ram), "%s", c.ram);
        if (from_stage && same_fs(img, c.ram_dir)) {
            /* a second name: the stage stays whole (its only copy) until the VM runs */
            if (link(img, c.ram) < 0) {
                rc = err_sys(err, "link %s to %s", img, c.ram);
                goto out_src;
            }
        } else if (url && same_fs(img, c.ram_dir)) {
            if (rename(img, c.ram) < 0) {
                rc = err_sys(err, "rename %s to %s", img, c.ram);
                goto out_src;
            }
        } else {
            /* room first: a copy that fills the RAM directory fails half way with ENOSPC
             * instead of saying what the guest needs there */
            rc = ram_room(&c, cfg_int(cfg, "memory"), err);
            if (rc == 0)
                rc = image_copy(&c, img, c.ram, err);
            if (rc < 0)
                goto out_src;
        }
        ram_made = true;
    }
    rc = vm_config_rewrite(cfg, c.disk, ram, c.vmdir, err);
    if (rc < 0)
        goto out_src;
    json_object_object_add(cfg, "ram_shared", json_object_new_boolean(!on_demand));
    cfg_set_str(cfg, "name", name);
    if (!cfg_str(cfg, "accel") || (o && o->accel)) {
        const char *accel;
        rc = vmsnap_vmm_pick_accel(o ? o->accel : NULL, &accel, err);
        if (rc < 0)
            goto out_src;
        cfg_set_str(cfg, "accel", accel);
    }
    if (!on_demand && (rc = ram_room(&c, cfg_int(cfg, "memory"), err)) < 0)
        goto out_src;
    step(t, "stage", &t0);

    /* The record before QEMU starts: for a VM the node did not know, a resume killed from here
     * on leaves a VM that 'vm ls' shows and 'vm stop' can stop (the record goes if the resume
     * fails); for a known VM it describes the QEMU about to start (an on-demand restore has no
     * RAM file: a resume killed after the restore left the old eager record, and the documented
     * 'vm pause' of that frozen VM looked for a RAM file that was not there), and the old record
     * comes back if the resume fails. The URL says where the VM is, should this be killed. */
    cfg_set_str(cfg, "status", "restoring");
    cfg_set_str(cfg, "url", url ? url : (old ? cfg_str(old, "url") : NULL));
    if ((rc = cfg_save(c.cfgpath, cfg, err)) < 0)
        goto out_src;
    if (created || !old)
        provisional = true;
    else
        replaced_record = true;
    /* a cancel (SIGINT) before the restore: the ordinary failure path undoes the staging */
    if ((rc = cancel_check(err)) < 0)
        goto out_src;
    sys_failpoint("resume-before-restore");
    rc = vmm_from_cfg(&c, cfg, &v, err);
    if (rc == 0)
        rc = vmsnap_vmm_restore(v, src, err);
    if (rc < 0)
        goto out_src;
    restored = true;
    sys_failpoint("resume-restored");
    step(t, "restore", &t0);

    /* Release the restore files: pulled ones are truncated (the privately mapped image of an
     * on-demand VM excepted), the local checkpoint is only evicted (it stays the latest). */
    if (url) {
        const char *keep[] = {"memory-ranges", NULL};
        struct vmsnap_err e2;
        if (!on_demand || !(o && o->no_evict)) {
            if (vmsnap_pcache_release_dir(src, on_demand ? keep : NULL, NULL, NULL, &e2) < 0)
                vlog(VMSNAP_LOG_WARN, "release %s: %s", src, e2.msg);
        }
        if (!on_demand)
            rm_rf(src);
    } else if (!from_stage && !(o && o->no_evict)) { /* the stage is tmpfs: nothing to evict */
        struct vmsnap_err e2;
        if (vmsnap_pcache_evict(c.ckpt, NULL, NULL, &e2) < 0)
            vlog(VMSNAP_LOG_WARN, "evict %s: %s", c.ckpt, e2.msg);
    }
    if (!on_demand || !url)
        rm_rf(c.ondemand);
    step(t, "evict", &t0);

    /* The guest is about to run on the stage's image: from here the stage is no snapshot. */
    if (from_stage && pcat(mark, c.stage, "/" UNSAVED_MARK) == 0)
        unlink(mark);
    /* The record describes the QEMU that now holds the VM (RAM file, on-demand or not): it is
     * saved before the guest runs, so a resume killed from here on leaves a record that a later
     * pause can trust (an old record of an eager VM would make it look for a RAM file an
     * on-demand one does not have, after QEMU was stopped). */
    json_object_object_del(cfg, "ram_in_state");
    cfg_set_str(cfg, "status", "running");
    cfg_set_str(cfg, "url", url ? url : (old ? cfg_str(old, "url") : NULL));
    if ((rc = cfg_save(c.cfgpath, cfg, err)) < 0)
        goto out_src;
    rc = vmsnap_vmm_resume(v, err);
    if (rc < 0 && from_stage) {
        /* 'cont' may have reached QEMU with its answer lost: a guest that runs, or may run, on
         * the stage's image makes the stage no snapshot (its memory newer than its device
         * state), so it is not marked unsaved again */
        enum vmsnap_vmm_state st;
        struct vmsnap_err e2;
        int src2 = vmsnap_vmm_state(v, &st, NULL, &e2);
        if (src2 == 0 && st == VMSNAP_VMM_RUNNING) {
            vlog(VMSNAP_LOG_WARN, "VM '%s': 'cont' failed (%s) but the guest runs: resumed", name,
                 err ? err->msg : "?");
            rc = 0;
        } else if (src2 < 0 || st != VMSNAP_VMM_PAUSED) {
            mark[0] = '\0';
            stage_consumed(&c);
            vmsnap_err_wrap(err,
                            "the guest may have run on the snapshot in %s, which is no longer "
                            "one (kept for inspection): ",
                            c.stage);
        }
    }
    if (rc < 0)
        goto out_src; /* (the old record comes back there) */
    /* The guest runs on the stage's image: its complete and taking marks go at once (a resume
     * killed before the stage was removed left one that the next command's recovery marked
     * unsaved again: memory newer than its device state, a torn set that QEMU refused to load
     * and a suspend pushed). Before 'cont' they must stay: a resume killed there leaves a
     * frozen QEMU and the stage, still the snapshot, that 'vm stop' must keep. */
    if (from_stage)
        stage_consumed(&c);
    step(t, "resume", &t0);
    sys_failpoint("resume-running"); /* the guest runs; nothing cleaned up yet */
    if (url)
        rm_rf(c.ckpt); /* superseded by the store's snapshot, now that the VM runs from it */
    if (from_stage)
        rm_rf(c.stage); /* its image is the RAM file now; the VM runs */
    if (had_prev)
        unlink(disk_prev);
    goto out;
out_src:
    if (restored && v)
        vmsnap_vmm_stop(v, NULL);
    if (mark[0])
        mark_unsaved(&c, NULL); /* the guest did not run: the stage is the snapshot again */
    if (ram_made)               /* from the stage, a second name of its image, which stays there */
        unlink(c.ram);
    if (disk_made) { /* the live disk that was there before, if any, comes back */
        unlink(c.disk);
        if (had_prev && rename(disk_prev, c.disk) < 0)
            vlog(VMSNAP_LOG_WARN, "put back %s as %s: %s", disk_prev, c.disk, strerror(errno));
    }
    if (url)
        rm_rf(src);
    if (provisional && !created)
        unlink(c.cfgpath);
    if (replaced_record && cfg_save(c.cfgpath, old, NULL) < 0)
        vlog(VMSNAP_LOG_WARN, "VM '%s': could not put its record %s back", name, c.cfgpath);
out:
    if (rc < 0 && created)
        rm_rf(c.vmdir);
    if (rc < 0)
        vmsnap_err_wrap(err, "vm resume %s: ", name);
    if (t)
        t->total = mono_now() - tstart;
    free(url_copy);
    vmsnap_vmm_free(v);
    json_object_put(cfg);
    json_object_put(old);
    ctx_fini(&c);
    return rc;
}

/* ---- stop, list, console ---- */

int vmsnap_vm_stop(const struct vmsnap_vm_opts *o, const char *name, bool remove,
                   struct vmsnap_err *err)
{
    struct vmctx c;
    json_object *cfg = NULL;
    struct vmsnap_vmm *v = NULL;
    int rc = ctx_init(&c, o, name, err);
    if (rc == 0)
        rc = load_vm(&c, &cfg, err);
    struct stat rs, cs;
    if (rc == 0 && remove && cfg_bool(cfg, "ram_shared") && cfg_str(cfg, "ram_path") &&
        lstat(cfg_str(cfg, "ram_path"), &rs) == 0 &&
        !(stat(c.ram, &cs) == 0 && cs.st_dev == rs.st_dev && cs.st_ino == rs.st_ino))
        /* --rm would drop the record that says where the RAM file is, and leave the file
         * (tmpfs: memory) for good; a VM without one (paused, suspended) has nothing there */
        rc = vmsnap_err_set(err, EINVAL,
                            "VM '%s' keeps its RAM in %s, not %s: give the --ram-dir "
                            "(VMSNAP_RAM_DIR) it was started with, so that --rm removes it",
                            name, cfg_str(cfg, "ram_path"), c.ram);
    if (rc == 0)
        rc = vmm_from_cfg(&c, cfg, &v, err);
    if (rc == 0)
        rc = vmsnap_vmm_stop(v, err);
    char pend[PATH_LEN];
    bool pending = false;
    if (rc == 0 && !remove) /* before the RAM file goes: it may be the newest state */
        pending = recover_interrupted(&c, pend) != NULL;
    if (rc == 0) {
        /* the RAM file is always the one this VM's name gives (c.ram): a record naming
         * another path is not followed (an on-demand VM maps its image from its directory) */
        const char *rec = cfg_str(cfg, "ram_path");
        if (cfg_bool(cfg, "ram_shared") && rec && !same_path(rec, c.ram))
            vlog(VMSNAP_LOG_WARN,
                 "VM '%s': its record names %s as its RAM; not removed (give the --ram-dir it "
                 "was started with)",
                 name, rec);
        if (pending) { /* the RAM file, and the stage if that is where the state is, stay */
            vlog(VMSNAP_LOG_WARN,
                 "VM '%s': keeping %s and %s, the state of a pause or suspend whose checkpoint "
                 "could not be completed (%s): 'vmsnap vm resume %s' completes it once that is "
                 "fixed",
                 name, pend, c.ram, c.rerr.code ? c.rerr.msg : "see above", name);
        } else {
            unlink(c.ram);
            if (remove || !stage_unsaved(&c))
                unstage(&c);
            else
                vlog(VMSNAP_LOG_WARN, "VM '%s': keeping %s, the only copy of its last snapshot",
                     name, c.stage);
        }
        const char *s = cfg_str(cfg, "status");
        if (status_live(s)) {
            cfg_set_str(cfg, "status", "stopped");
            rc = cfg_save(c.cfgpath, cfg, err);
        }
        if (remove) {
            int r = rm_rf(c.vmdir);
            rc = r < 0 ? err_code(err, -r, "remove %s", c.vmdir) : 0;
        }
    }
    if (rc < 0)
        vmsnap_err_wrap(err, "vm stop %s: ", name);
    vmsnap_vmm_free(v);
    json_object_put(cfg);
    ctx_fini(&c);
    return rc;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The pid of the process holding an flock on `path` (a VM directory: ctx_lock), from
 * /proc/locks, or 0. vm ls only looks: taking the lock, even shared for a moment, could make a
 * command starting then fail as busy. */
static pid_t lock_holder(const char *path)
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
            maj == major(sb.st_dev) && min == minor(sb.st_dev) && pid > 0 && pid != getpid())
            holder = pid;
    }
    fclose(f);
    return holder;
}

int vmsnap_vm_list(const struct vmsnap_vm_opts *o, vmsnap_vm_list_fn fn, void *arg,
                   struct vmsnap_err *err)
{
    struct vmctx c;
    int rc = ctx_init(&c, o, "x", err);
    if (rc < 0)
        return rc;
    char vms[PATH_LEN];
    if (pcat(vms, c.state, "/vms") < 0)
        return vmsnap_err_set(err, ENAMETOOLONG, "path %s too long", c.state);
    DIR *d = opendir(vms);
    if (!d)
        return errno == ENOENT ? 0 : err_sys(err, "%s", vms);
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (!valid_name(de->d_name))
            continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 16;
            char **nn = realloc(names, cap * sizeof(*names));
            if (!nn) {
                rc = vmsnap_err_set(err, ENOMEM, "out of memory");
                break;
            }
            names = nn;
        }
        if (!(names[n] = strdup(de->d_name))) {
            rc = vmsnap_err_set(err, ENOMEM, "out of memory");
            break;
        }
        n++;
    }
    closedir(d);
    if (rc == 0)
        qsort(names, n, sizeof(*names), cmp_str);
    for (size_t i = 0; rc == 0 && i < n; i++) {
        struct vmctx vc;
        json_object *cfg = NULL;
        if (ctx_init(&vc, o, names[i], NULL) < 0 || cfg_load(vc.cfgpath, &cfg, NULL) < 0)
            continue;
        enum vmsnap_vmm_state st = VMSNAP_VMM_DEAD;
        pid_t pid = 0;
        struct vmsnap_err e2;
        const char *status = cfg_str(cfg, "status");
        if (!status)
            status = "?";
        /* a VM a command holds is not asked: its QEMU may be that command's QMP client (one
         * at a time), and ls waited for it, up to the QMP timeout per VM */
        pid_t busy = lock_holder(vc.vmdir);
        int src = vm_state(&vc, cfg, busy ? -1 : LS_QMP_WAIT, &st, &pid, &e2);
        if (src < 0)
            st = VMSNAP_VMM_OTHER;
        char pend[PATH_LEN];
        if (busy)
            status = "busy"; /* changing: what the files say now is half of it */
        else if (st == VMSNAP_VMM_DEAD && taken_pending(&vc, pend))
            status = "interrupted"; /* its newest state waits for its checkpoint (resume) */
        else if (st == VMSNAP_VMM_DEAD && stage_unsaved(&vc))
            status = "unsaved"; /* its snapshot is only in the stage */
        else if (st == VMSNAP_VMM_DEAD && status_live(status))
            status = "dead"; /* gone, or a run or resume killed before its QEMU ran */
        else if (src == -ETIMEDOUT)
            status = "unresponsive"; /* a live QEMU that did not answer in LS_QMP_WAIT */
        else if (st == VMSNAP_VMM_PAUSED)
            status = "frozen"; /* a QEMU holding a stopped guest, no command at work: a resume
                                * killed after the restore, or a pause killed after the stop
                                * (a paused VM of vmsnap's has no QEMU) */
        else if (st != VMSNAP_VMM_DEAD)
            status = vmsnap_vmm_state_name(st);
        int64_t mem = cfg_int(cfg, "memory");
        struct vmsnap_vm_info info = {
            .name = names[i],
            .status = status,
            .pid = pid,
            .accel = cfg_str(cfg, "accel"),
            .mem = mem > 0 ? (uint64_t)mem : 0,
            .checkpoint = exists(vc.ckpt),
            .url = cfg_str(cfg, "url"),
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

int vmsnap_vm_console_path(const struct vmsnap_vm_opts *o, const char *name, char *buf, size_t len,
                           struct vmsnap_err *err)
{
    struct vmctx c;
    int rc = ctx_init(&c, o, name, err);
    if (rc < 0)
        return rc;
    if (!exists(c.vmdir))
        return vmsnap_err_set(err, ENOENT, "no VM named '%s' under %s", name, c.state);
    int w = snprintf(buf, len, "%s/console.log", c.vmdir);
    if (w < 0 || (size_t)w >= len)
        return vmsnap_err_set(err, ENAMETOOLONG, "console path too long");
    return 0;
}

int vmsnap_vm_console_send(const struct vmsnap_vm_opts *o, const char *name, const char *line,
                           struct vmsnap_err *err)
{
    struct vmctx c;
    int rc = ctx_init(&c, o, name, err);
    if (rc < 0)
        return rc;
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    int w = snprintf(sa.sun_path, sizeof(sa.sun_path), "%s/console.sock", c.vmdir);
    if (w < 0 || (size_t)w >= sizeof(sa.sun_path))
        return vmsnap_err_set(err, ENAMETOOLONG, "console socket path too long");
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return err_sys(err, "socket");
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
        rc = vmsnap_err_set(err, errno, "VM '%s' console %s: %s (is it running?)", name,
                            sa.sun_path, strerror(errno));
        close(fd);
        return rc;
    }
    rc = sys_write_full(fd, line, strlen(line));
    if (rc == 0)
        rc = sys_write_full(fd, "\n", 1);
    if (rc < 0)
        rc = err_code(err, -rc, "VM '%s' console", name);
    /* Closed right after the write, the line could be lost: QEMU's socket chardev accepts one
     * client at a time and reads only while the serial port takes bytes, and a hang-up it saw
     * first dropped what was unread (a busy guest under load: a test's command went unanswered).
     * So the write side is shut and the socket held until QEMU, having read everything, closes
     * its end (its EOF), 5 s at most. */
    if (rc == 0 && shutdown(fd, SHUT_WR) == 0) {
        struct pollfd p = {fd, POLLIN, 0};
        char sink[256];
        for (int waited = 0; waited < 5000 && poll(&p, 1, 100) >= 0; waited += 100) {
            if (!(p.revents & (POLLIN | POLLHUP)))
                continue;
            if (read(fd, sink, sizeof(sink)) <= 0)
                break; /* EOF: QEMU read the line and let go */
        }
    }
    close(fd);
    return rc;
}
