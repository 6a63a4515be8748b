/* SPDX-License-Identifier: Apache-2.0 */
/* The checkpoint format: the files of a snapshot directory, the marks of a stage (unsaved,
 * stored, complete, taking), the copies of the memory image and the disk, and the swap of a
 * complete checkpoint.new in place of the checkpoint. */
#include "vm_int.h"

#include "sys/sys.h"
#include "util/util.h"
#include "vmsnap/disk.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The stage lives in the RAM directory, often world-writable (/dev/shm), under a name anyone can
 * compute: only a directory of ours (not a link, owned by us, 0700) is ever taken for one. */
bool vm_stage_ok(const struct vmctx *c)
{
    struct stat sb;
    return lstat(c->stage, &sb) == 0 && S_ISDIR(sb.st_mode) && sb.st_uid == geteuid() &&
           (sb.st_mode & 077) == 0;
}

/* The marks of a snapshot directory in the order they go: the unsaved mark (no longer the only
 * copy), then the taking mark (no longer a state to complete), then the complete mark. A
 * process killed between two of them leaves a directory that recovery either ignores or takes
 * for what it still is: with the taking mark and without the complete one it would be an
 * interrupted checkpoint to complete (from a RAM file that is newer, or gone: the state needed
 * --force); with only the complete mark it is ignored (recovery marks a stage unsaved again
 * only while it has both). */
static void unmark(const char *dir)
{
    static const char *const marks[] = {"/" UNSAVED_MARK, "/" TAKING_MARK, "/" COMPLETE_MARK,
                                        "/" STORED_MARK};
    char p[PATH_LEN];
    for (size_t i = 0; i < sizeof(marks) / sizeof(marks[0]); i++)
        if (vm_pcat(p, dir, marks[i]) == 0)
            unlink(p);
}

/* The stage's image now runs as guest RAM: its marks go (recovery must not take it for a
 * snapshot any more). */
void vm_stage_consumed(const struct vmctx *c)
{
    unmark(c->stage);
}

/* Remove a snapshot directory (a stage, checkpoint.new, an on-demand or pulled directory), its
 * marks first (unmark): it went file by file, in directory order, and a process killed half way
 * left a taking mark over a directory without its config or state, an interrupted checkpoint
 * that nothing but --force could leave. */
int vm_rm_snapshot_dir(const char *dir)
{
    unmark(dir);
    return vm_rm_rf(dir);
}

void vm_unstage(const struct vmctx *c)
{
    vm_rm_snapshot_dir(c->stage);
}

bool vm_stage_unsaved(const struct vmctx *c)
{
    char p[PATH_LEN];
    struct stat sb;
    return vm_stage_ok(c) && vm_pcat(p, c->stage, "/" UNSAVED_MARK) == 0 && lstat(p, &sb) == 0 &&
           S_ISREG(sb.st_mode);
}

/* Everything a snapshot directory needs to restore the VM. */
static const char *const snapshot_files[] = {"memory-ranges", "state", "config.json", DISK_CKPT};
#define N_SNAPSHOT_FILES (sizeof(snapshot_files) / sizeof(snapshot_files[0]))

/* NULL when `dir` holds every snapshot file, else the first missing one. */
const char *vm_snapshot_missing(const char *dir)
{
    char p[PATH_LEN];
    for (size_t i = 0; i < N_SNAPSHOT_FILES; i++)
        if (vm_pjoin(p, dir, snapshot_files[i], NULL) < 0 || !vm_exists(p))
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
bool vm_stage_stored_at(const struct vmctx *c, const char *url)
{
    char p[PATH_LEN], have[PATH_LEN];
    return vm_pcat(p, c->stage, "/" STORED_MARK) == 0 && read_mark(p, have, sizeof(have)) &&
           !strcmp(have, url);
}

int vm_mark_unsaved(const struct vmctx *c, struct vmsnap_err *err)
{
    char p[PATH_LEN];
    if (vm_pcat(p, c->stage, "/" UNSAVED_MARK) < 0)
        return vmsnap_err_set(err, ENAMETOOLONG, "path %s too long", c->stage);
    int fd = open(p, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0)
        return err_sys(err, "create %s", p);
    close(fd);
    return 0;
}

int vm_write_small(const char *path, const char *s, struct vmsnap_err *err)
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
int vm_sparse_copy(const char *src, const char *dst, struct vmsnap_err *err)
{
    struct vmsnap_disk_clone_opts co = {.force = true};
    return vmsnap_disk_clone(src, dst, &co, NULL, err);
}

/* Copy a memory image between the RAM tmpfs and a checkpoint on disk. With page-cache hygiene on
 * (the default) the disk side bypasses the page cache (O_DIRECT): a pause leaves no dirty pages
 * charged to the cgroup for the kernel to throttle on, and neither direction leaves clean ones
 * to evict. `--no-evict` keeps the buffered copy. */
int vm_image_copy(const struct vmctx *c, const char *src, const char *dst, struct vmsnap_err *err)
{
    struct vmsnap_disk_clone_opts co = {.force = true, .direct = !(c->o && c->o->no_evict)};
    return vmsnap_disk_clone(src, dst, &co, NULL, err);
}

int vm_copy_small(const char *sdir, const char *ddir, const char *name, struct vmsnap_err *err)
{
    char s[PATH_LEN], d[PATH_LEN];
    int rc = vm_pjoin(s, sdir, name, err);
    if (rc == 0)
        rc = vm_pjoin(d, ddir, name, err);
    if (rc == 0)
        rc = vm_sparse_copy(s, d, err);
    return rc;
}

bool vm_same_fs(const char *a, const char *b)
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
int vm_swap_checkpoint(struct vmctx *c, const char *newdir, struct vmsnap_err *err)
{
    char old[PATH_LEN];
    if (vm_pcat(old, c->ckpt, ".old") < 0)
        return vmsnap_err_set(err, ENAMETOOLONG, "path %s too long", c->ckpt);
    int frc = fsync_dir_files(newdir, err);
    if (frc < 0)
        return frc;
    vm_rm_rf(old);
    if (vm_exists(c->ckpt)) {
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
    vm_rm_rf(old);
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
bool vm_mark_this_boot(const char *dir, const char *mark)
{
    char p[PATH_LEN], want[64], have[64];
    return vm_pjoin(p, dir, mark, NULL) == 0 && boot_id(want, NULL) == 0 &&
           read_mark(p, have, sizeof(have)) && !strcmp(have, want);
}

/* A checkpoint directory whose COMPLETE_MARK holds this boot's id: every file was written, by a
 * process of this boot (a later crash of that process lost nothing in the page cache). */
bool vm_complete_this_boot(const char *dir)
{
    return vm_mark_this_boot(dir, COMPLETE_MARK) && !vm_snapshot_missing(dir);
}

/* The config a checkpoint of the VM described by `cfg` gets (without status and URL; whether its
 * RAM is in the device state). NULL on ENOMEM. */
json_object *vm_ckpt_config(json_object *cfg)
{
    json_object *ck = NULL;
    if (json_object_deep_copy(cfg, &ck, NULL) != 0 || !ck)
        return NULL;
    json_object_object_del(ck, "status");
    json_object_object_del(ck, "url");
    json_object_object_add(ck, "ram_in_state",
                           json_object_new_boolean(!vm_cfg_bool(cfg, "ram_shared")));
    return ck;
}

int vm_write_taking(json_object *cfg, const char *sdir, struct vmsnap_err *err)
{
    char p[PATH_LEN], boot[64];
    json_object *ck = vm_ckpt_config(cfg);
    int rc =
        ck ? vm_pjoin(p, sdir, "config.json", err) : vmsnap_err_set(err, ENOMEM, "out of memory");
    if (rc == 0)
        rc = vm_cfg_save(p, ck, err);
    json_object_put(ck);
    if (rc == 0)
        rc = vm_pjoin(p, sdir, TAKING_MARK, err);
    if (rc == 0)
        rc = boot_id(boot, err);
    if (rc == 0)
        rc = vm_write_small(p, boot, err);
    return rc;
}

/* Fill `dir` with config.json, base-id and the disk (hard link from the live disk when
 * `link_disk`, else a sparse copy). memory-ranges and state are the caller's. */
int vm_ckpt_meta(struct vmctx *c, json_object *cfg, const char *dir, bool link_disk,
                 struct vmsnap_err *err)
{
    char p[PATH_LEN];
    int rc = vm_pjoin(p, dir, "config.json", err);
    if (rc == 0)
        rc = vm_cfg_save(p, cfg, err);
    if (rc == 0)
        rc = vm_pjoin(p, dir, "base-id", err);
    if (rc == 0) {
        char line[80];
        const char *b = vm_cfg_str(cfg, "base_id");
        snprintf(line, sizeof(line), "%s\n", b ? b : "");
        rc = vm_write_small(p, line, err);
    }
    if (rc == 0)
        rc = vm_pjoin(p, dir, DISK_CKPT, err);
    if (rc < 0)
        return rc;
    if (link_disk) {
        if (link(c->disk, p) < 0)
            return err_sys(err, "link %s to %s", c->disk, p);
    } else if ((rc = vm_sparse_copy(c->disk, p, err)) < 0) {
        return rc;
    }
    /* last: the directory is a whole snapshot, written during this boot */
    char boot[64];
    if ((rc = vm_pjoin(p, dir, COMPLETE_MARK, err)) == 0 && (rc = boot_id(boot, err)) == 0)
        rc = vm_write_small(p, boot, err);
    return rc;
}

/* Put the RAM image at `dst`: a rename when on the same filesystem (zero copy), else a sparse
 * copy and unlink. A VM mapping its image privately has its RAM in `state`; its memory-ranges
 * is then an empty sparse file of the RAM size (restores load the RAM from the state). */
int vm_ckpt_ram(struct vmctx *c, json_object *cfg, const char *dst, bool *ram_in_state,
                struct vmsnap_err *err)
{
    *ram_in_state = !vm_cfg_bool(cfg, "ram_shared");
    if (*ram_in_state) {
        int fd = open(dst, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        if (fd < 0)
            return err_sys(err, "create %s", dst);
        int rc = ftruncate(fd, (off_t)vm_cfg_int(cfg, "memory")) < 0 ? -errno : 0;
        close(fd);
        if (rc < 0)
            return err_code(err, -rc, "truncate %s", dst);
        return 0;
    }
    /* the VM's own RAM file, whatever its record says (a record is not trusted to name a
     * file to move into a snapshot) */
    const char *ram = c->ram;
    const char *rec = vm_cfg_str(cfg, "ram_path");
    if (rec && !vm_same_path(rec, ram))
        return vmsnap_err_set(err, EINVAL, "VM '%s': its record names %s as its RAM, not %s",
                              c->name, rec, ram);
    char dir[PATH_LEN];
    snprintf(dir, sizeof(dir), "%s", dst);
    char *slash = strrchr(dir, '/');
    if (slash)
        *slash = 0;
    if (vm_same_fs(ram, dir)) {
        if (rename(ram, dst) < 0)
            return err_sys(err, "rename %s to %s", ram, dst);
        return 0;
    }
    int rc = vm_image_copy(c, ram, dst, err);
    if (rc < 0)
        return vmsnap_err_wrap(err, "copy guest RAM: ");
    /* the RAM file stays until the checkpoint holding its copy is in place (finish_local) */
    return 0;
}
