/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Disk images: create, info and UUID change (clone lives in disk_clone.c, seeding in
 * disk_tree.c).
 *
 * create follows what mke2fs does for "-t ext4 -O ^has_journal,^resize_inode,metadata_csum_seed
 * -E lazy_itable_init=1,assume_storage_prezeroed=1", but in-process and on a file we know is a
 * fresh sparse file: ext2fs_initialize + ext2fs_allocate_tables, every group marked
 * EXT4_BG_INODE_ZEROED (the inode tables are holes, which read as zeros, so neither mke2fs nor
 * the kernel's lazyinit thread has to write them), root, a 16 KiB lost+found, the reserved
 * inodes with valid checksums. All writes go through the write-back io manager (disk_io.c),
 * which writes each metadata run once at close and never writes an all-zero block.
 */
#include "disk_int.h"
#include "sys/sys.h"

#include <errno.h>
#include <ext2fs/ext2_err.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define DISK_BLOCK_SIZE 4096u
#define DISK_INODE_SIZE 256u
#define DISK_BYTES_PER_INODE 16384u
#define DISK_MIN_SIZE VMSNAP_DISK_MIN_SIZE

int vmsnap_disk_parse_uuid(const char *s, uint8_t out[16])
{
    if (!s || strlen(s) != 36)
        return -EINVAL;
    size_t k = 0;
    for (size_t i = 0; i < 36;) {
        if (i == 8 || i == 13 || i == 18 || i == 23) {
            if (s[i] != '-')
                return -EINVAL;
            i++;
            continue;
        }
        unsigned v = 0;
        for (int j = 0; j < 2; j++, i++) {
            char c = s[i];
            v <<= 4;
            if (c >= '0' && c <= '9')
                v |= (unsigned)(c - '0');
            else if (c >= 'a' && c <= 'f')
                v |= (unsigned)(c - 'a' + 10);
            else if (c >= 'A' && c <= 'F')
                v |= (unsigned)(c - 'A' + 10);
            else
                return -EINVAL;
        }
        out[k++] = (uint8_t)v;
    }
    return 0;
}

/* Check the seeding steps before anything is created, so a typo fails fast and cleanly. */
static int check_sources(const char *path, const struct vmsnap_disk_create_opts *o,
                         struct vmsnap_err *err)
{
    struct stat st;
    if (o->from_dir) {
        if (stat(o->from_dir, &st) < 0)
            return err_sys(err, "disk create %s: --from-dir %s", path, o->from_dir);
        if (!S_ISDIR(st.st_mode))
            return vmsnap_err_set(err, ENOTDIR, "disk create %s: --from-dir %s: not a directory",
                                  path, o->from_dir);
    }
    for (size_t i = 0; i < o->n_entries; i++) {
        const struct vmsnap_disk_entry *e = &o->entries[i];
        if (!e->dest || e->dest[0] != '/')
            return vmsnap_err_set(err, EINVAL,
                                  "disk create %s: destination '%s' must be an absolute path "
                                  "inside the image",
                                  path, e->dest ? e->dest : "");
        if (e->mode > 07777)
            return vmsnap_err_set(err, EINVAL, "disk create %s: %s: mode %o out of range", path,
                                  e->dest, (unsigned)e->mode);
        if (e->op == VMSNAP_DISK_ADD && !e->src)
            return vmsnap_err_set(err, EINVAL, "disk create %s: %s: no source", path, e->dest);
        if (e->op == VMSNAP_DISK_ADD && lstat(e->src, &st) < 0)
            return err_sys(err, "disk create %s: source %s", path, e->src);
    }
    return 0;
}

static void set_features(struct ext2_super_block *s)
{
    ext2fs_set_feature_xattr(s);
    ext2fs_set_feature_dir_index(s);
    ext2fs_set_feature_filetype(s);
    ext2fs_set_feature_extents(s);
    ext2fs_set_feature_64bit(s);
    ext2fs_set_feature_flex_bg(s);
    ext2fs_set_feature_csum_seed(s);
    ext2fs_set_feature_sparse_super(s);
    ext2fs_set_feature_large_file(s);
    ext2fs_set_feature_huge_file(s);
    ext2fs_set_feature_dir_nlink(s);
    ext2fs_set_feature_extra_isize(s);
    ext2fs_set_feature_metadata_csum(s);
}

#define E2(call, what)                                                                             \
    do {                                                                                           \
        errcode_t e2_ = (call);                                                                    \
        if (e2_) {                                                                                 \
            rc = vmsnap_err_set(err, disk_ext2_errno(e2_), "disk create %s: %s: %s", path, what,   \
                                disk_ext2_strerror(e2_));                                          \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)

/* Root, lost+found (16 KiB, like mke2fs, so e2fsck can reconnect files without allocating) and
 * the reserved inodes, written zeroed with valid checksums. */
static int make_skeleton(ext2_filsys fs, const char *path, struct vmsnap_err *err)
{
    int rc = 0;
    uint8_t zero[DISK_INODE_SIZE] = {0};
    for (ext2_ino_t i = 1; i < EXT2_FIRST_INODE(fs->super); i++) {
        E2(ext2fs_write_inode_full(fs, i, (struct ext2_inode *)zero, sizeof(zero)),
           "write reserved inode");
        if (i != EXT2_ROOT_INO)
            ext2fs_inode_alloc_stats2(fs, i, +1, 0);
    }
    E2(ext2fs_mkdir(fs, EXT2_ROOT_INO, EXT2_ROOT_INO, NULL), "create root directory");
    fs->umask = 077;
    E2(ext2fs_mkdir(fs, EXT2_ROOT_INO, 0, "lost+found"), "create /lost+found");
    fs->umask = 022;
    ext2_ino_t lpf;
    E2(ext2fs_lookup(fs, EXT2_ROOT_INO, "lost+found", 10, NULL, &lpf), "look up /lost+found");
    for (unsigned sz = fs->blocksize; sz < 16384; sz += fs->blocksize)
        E2(ext2fs_expand_dir(fs, lpf), "expand /lost+found");
out:
    return rc;
}

/* The size, inode count, label and destination asked for, checked before anything is created;
 * *blocks and *inodes are what the image gets. */
static int check_create(const char *path, const struct vmsnap_disk_create_opts *o,
                        uint64_t *size_out, uint64_t *blocks_out, uint64_t *inodes_out,
                        struct vmsnap_err *err)
{
    const uint64_t asked = o->size ? o->size : VMSNAP_DISK_DEFAULT_SIZE;
    uint64_t size = asked & ~(uint64_t)(DISK_BLOCK_SIZE - 1);
    if (size < DISK_MIN_SIZE)
        return vmsnap_err_set(err, EINVAL, "disk create %s: size %llu too small (minimum 1 MiB)",
                              path, (unsigned long long)asked);
    uint64_t blocks = size / DISK_BLOCK_SIZE;
    /* libext2fs's layout fails from 2^32 blocks on for some sizes (16 TiB, 32 TiB: "invalid
     * argument"); an ext4 host filesystem holds no larger file anyway */
    if (blocks >= (1ull << 32))
        return vmsnap_err_set(err, EFBIG,
                              "disk create %s: size %llu too large (at most 16 TiB less 4 KiB)",
                              path, (unsigned long long)asked);
    /* the default (one per 16 KiB) stops at 2^31: per-group rounding takes more up past ext4's
     * 2^32 (mke2fs caps it too) */
    uint64_t inodes = o->inodes ? o->inodes : VMSNAP_MIN(size / DISK_BYTES_PER_INODE, 1ull << 31);
    if (inodes < 32)
        inodes = 32;
    if (inodes > 0xFFFFFFF0ull)
        return vmsnap_err_set(err, EINVAL,
                              "disk create %s: %llu inodes requested, ext4 allows at most "
                              "4294967280",
                              path, (unsigned long long)inodes);
    if (o->label && strlen(o->label) > VMSNAP_DISK_LABEL_MAX)
        return vmsnap_err_set(err, EINVAL, "disk create %s: label '%s' longer than 16 bytes", path,
                              o->label);
    struct stat st;
    if (lstat(path, &st) == 0) {
        if (!o->force)
            return vmsnap_err_set(err, EEXIST,
                                  "disk create %s: already exists (use --force to replace)", path);
        if (S_ISDIR(st.st_mode))
            return vmsnap_err_set(err, EISDIR, "disk create %s: is a directory", path);
    }
    *size_out = size;
    *blocks_out = blocks;
    *inodes_out = inodes;
    return check_sources(path, o, err);
}

/* The superblock's identity and policy: UUID, checksum seed, hash seed, label, no fsck
 * schedule, no root reserve; every group's inode table marked zeroed. */
static int init_super(ext2_filsys fs, const char *path, const struct vmsnap_disk_create_opts *o,
                      struct vmsnap_err *err)
{
    int rc;
    struct ext2_super_block *sb = fs->super;
    if (o->uuid)
        memcpy(sb->s_uuid, o->uuid, 16);
    else if ((rc = disk_random_uuid(sb->s_uuid)) < 0)
        return err_code(err, -rc, "disk create %s: random UUID", path);
    sb->s_checksum_type = EXT2_CRC32C_CHKSUM;
    sb->s_checksum_seed = ext2fs_crc32c_le(~0U, sb->s_uuid, sizeof(sb->s_uuid));
    ext2fs_init_csum_seed(fs);
    if ((rc = disk_random_uuid((uint8_t *)sb->s_hash_seed)) < 0)
        return err_code(err, -rc, "disk create %s: random hash seed", path);
    sb->s_def_hash_version = EXT2_HASH_HALF_MD4;
    if (o->label)
        strncpy((char *)sb->s_volume_name, o->label, sizeof(sb->s_volume_name));
    sb->s_max_mnt_count = -1;
    sb->s_checkinterval = 0;
    ext2fs_r_blocks_count_set(sb, 0); /* no root reserve: the guest writes as any user */
    sb->s_kbytes_written = 1;
    time_t now = time(NULL);
    sb->s_mkfs_time = sb->s_lastcheck = (uint32_t)now;
    for (dgrp_t g = 0; g < fs->group_desc_count; g++)
        ext2fs_bg_flags_set(fs, g, EXT2_BG_INODE_ZEROED);
    return 0;
}

/* The file system on the open file `fd`: layout, group tables and superblock (*fs is set as soon
 * as it exists: the caller frees it on failure). */
static int init_fs(int fd, const char *path, uint64_t blocks, uint64_t inodes,
                   const struct vmsnap_disk_create_opts *o, ext2_filsys *fs, struct vmsnap_err *err)
{
    int rc = 0;
    struct ext2_super_block param;
    memset(&param, 0, sizeof(param));
    ext2fs_blocks_count_set(&param, blocks);
    param.s_log_block_size = 2; /* 1024 << 2 = 4096 */
    param.s_rev_level = EXT2_DYNAMIC_REV;
    param.s_inode_size = DISK_INODE_SIZE;
    param.s_log_groups_per_flex = 4;
    param.s_inodes_count = (uint32_t)inodes;
    param.s_desc_size = EXT2_MIN_DESC_SIZE_64BIT;
    set_features(&param);

    char name[32];
    snprintf(name, sizeof(name), "%d", fd);
    E2(ext2fs_initialize(name, EXT2_FLAG_64BITS, &param, disk_io_manager, fs), "initialize");
    E2(io_channel_set_options((*fs)->io, "fresh"), "set io options");
    E2(ext2fs_allocate_tables(*fs), "allocate group tables");
    rc = init_super(*fs, path, o, err);
out:
    return rc;
}

/* --from-dir, then the --add / --mkdir steps in order, into the image. */
static int seed(ext2_filsys fs, const char *path, int fd, const struct vmsnap_disk_create_opts *o,
                struct vmsnap_err *err)
{
    if (!o->from_dir && !o->n_entries)
        return 0;
    struct disk_tree *tree = NULL;
    int rc = disk_tree_new(fs, path, fd, &tree, err);
    if (rc == 0 && o->from_dir)
        rc = disk_tree_from_dir(tree, o->from_dir, err);
    for (size_t i = 0; rc == 0 && i < o->n_entries; i++)
        rc = disk_tree_apply(tree, &o->entries[i], err);
    if (rc == 0)
        rc = disk_tree_finish(tree, err);
    disk_tree_free(tree);
    return rc;
}

int vmsnap_disk_create(const char *path, const struct vmsnap_disk_create_opts *o,
                       struct vmsnap_err *err)
{
    uint64_t size = 0, blocks = 0, inodes = 0;
    int rc = check_create(path, o, &size, &blocks, &inodes, err);
    if (rc < 0)
        return rc;

    struct sys_atomic_file af;
    rc = sys_atomic_open(&af, path, 0600, err);
    if (rc < 0)
        return vmsnap_err_wrap(err, "disk create %s: ", path);
    ext2_filsys fs = NULL;
    if (ftruncate(af.fd, (off_t)size) < 0) {
        rc = err_sys(err, "disk create %s: set size %llu", path, (unsigned long long)size);
        goto out;
    }
    if ((rc = init_fs(af.fd, path, blocks, inodes, o, &fs, err)) < 0 ||
        (rc = make_skeleton(fs, path, err)) < 0 || (rc = seed(fs, path, af.fd, o, err)) < 0)
        goto out;
    E2(ext2fs_set_gdt_csum(fs), "update group descriptors");
    vlog(VMSNAP_LOG_DEBUG, "disk create %s: %u groups, %u inodes, %llu blocks", path,
         fs->group_desc_count, fs->super->s_inodes_count,
         (unsigned long long)ext2fs_blocks_count(fs->super));
    E2(ext2fs_close_free(&fs), "write the image (its buffered blocks)");
    rc = sys_atomic_commit_ex(&af, o->fsync, !o->force, err);
    if (rc < 0)
        return vmsnap_err_wrap(err, "disk create %s: ", path);
    return 0;
out:
    if (fs)
        ext2fs_free(fs);
    sys_atomic_abort(&af);
    return rc < 0 ? rc : -EIO;
}

/* Feature names as e2fsprogs spells them. */
struct feat {
    int kind; /* 0 compat, 1 incompat, 2 ro_compat */
    uint32_t mask;
    const char *name;
};
static const struct feat feats[] = {
    {0, 0x0001, "dir_prealloc"},    {0, 0x0002, "imagic_inodes"},
    {0, 0x0004, "has_journal"},     {0, 0x0008, "ext_attr"},
    {0, 0x0010, "resize_inode"},    {0, 0x0020, "dir_index"},
    {0, 0x0040, "lazy_bg"},         {0, 0x0100, "exclude_bitmap"},
    {0, 0x0200, "sparse_super2"},   {0, 0x0400, "fast_commit"},
    {0, 0x0800, "stable_inodes"},   {0, 0x1000, "orphan_file"},
    {1, 0x0001, "compression"},     {1, 0x0002, "filetype"},
    {1, 0x0004, "needs_recovery"},  {1, 0x0008, "journal_dev"},
    {1, 0x0010, "meta_bg"},         {1, 0x0040, "extent"},
    {1, 0x0080, "64bit"},           {1, 0x0100, "mmp"},
    {1, 0x0200, "flex_bg"},         {1, 0x0400, "ea_inode"},
    {1, 0x1000, "dirdata"},         {1, 0x2000, "metadata_csum_seed"},
    {1, 0x4000, "large_dir"},       {1, 0x8000, "inline_data"},
    {1, 0x10000, "encrypt"},        {1, 0x20000, "casefold"},
    {2, 0x0001, "sparse_super"},    {2, 0x0002, "large_file"},
    {2, 0x0008, "huge_file"},       {2, 0x0010, "uninit_bg"},
    {2, 0x0020, "dir_nlink"},       {2, 0x0040, "extra_isize"},
    {2, 0x0100, "quota"},           {2, 0x0200, "bigalloc"},
    {2, 0x0400, "metadata_csum"},   {2, 0x0800, "replica"},
    {2, 0x1000, "read-only"},       {2, 0x2000, "project"},
    {2, 0x4000, "shared_blocks"},   {2, 0x8000, "verity"},
    {2, 0x10000, "orphan_present"},
};

static void feature_string(const struct ext2_super_block *s, char *buf, size_t len)
{
    const uint32_t words[3] = {s->s_feature_compat, s->s_feature_incompat, s->s_feature_ro_compat};
    static const char kinds[3] = {'C', 'I', 'R'};
    size_t at = 0;
    buf[0] = '\0';
    for (int k = 0; k < 3; k++) {
        for (int bit = 0; bit < 32; bit++) {
            uint32_t m = 1u << bit;
            if (!(words[k] & m))
                continue;
            const char *nm = NULL;
            for (size_t i = 0; i < sizeof(feats) / sizeof(feats[0]); i++)
                if (feats[i].kind == k && feats[i].mask == m)
                    nm = feats[i].name;
            char unk[24];
            if (!nm) {
                snprintf(unk, sizeof(unk), "FEATURE_%c%d", kinds[k], bit);
                nm = unk;
            }
            int n = snprintf(buf + at, len - at, "%s%s", at ? " " : "", nm);
            if (n < 0 || (size_t)n >= len - at)
                return;
            at += (size_t)n;
        }
    }
}

/* Open an image (read-only, or read-write for the caller's own writes) and read its superblock
 * through the write-back io manager on our own descriptor (libext2fs's unix io manager fsyncs
 * the file on open, which costs milliseconds we don't need). *fd is closed by the caller after
 * ext2fs_free. */
static int open_img(const char *path, bool rw, ext2_filsys *fs, int *fd, struct vmsnap_err *err,
                    const char *verb)
{
    /* O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused just below). The
     * caller reads and writes through this same descriptor: what was checked is what changes. */
    *fd = open(path, (rw ? O_RDWR : O_RDONLY) | O_NONBLOCK | O_CLOEXEC);
    struct stat st;
    if (*fd < 0 || fstat(*fd, &st) < 0) {
        int e = errno;
        if (*fd >= 0)
            close(*fd);
        *fd = -1;
        return err_code(err, e, "disk %s %s", verb, path);
    }
    if (!S_ISREG(st.st_mode) && !S_ISBLK(st.st_mode)) {
        close(*fd);
        *fd = -1;
        return vmsnap_err_set(err, EINVAL, "disk %s %s: not a regular file", verb, path);
    }
    char name[32];
    snprintf(name, sizeof(name), "%d", *fd);
    errcode_t e2 = ext2fs_open2(name, NULL, EXT2_FLAG_64BITS | EXT2_FLAG_SUPER_ONLY, 0, 0,
                                disk_io_manager, fs);
    if (e2) {
        close(*fd);
        *fd = -1;
        return vmsnap_err_set(err, disk_ext2_errno(e2), "disk %s %s: %s", verb, path,
                              disk_ext2_strerror(e2));
    }
    /* Only the superblock was read: a truncated image (or a superblock claiming more than the
     * file holds) would otherwise pass, and a new UUID's backup superblocks would be written
     * wherever its geometry says, far past the end of the file. */
    struct ext2_super_block *sb = (*fs)->super;
    if (ext2fs_free_blocks_count(sb) > ext2fs_blocks_count(sb) ||
        sb->s_free_inodes_count > sb->s_inodes_count) {
        ext2fs_free(*fs);
        close(*fd);
        *fd = -1;
        return vmsnap_err_set(err, EINVAL,
                              "disk %s %s: corrupt superblock (more free blocks or inodes than "
                              "the filesystem has)",
                              verb, path);
    }
    off_t end = lseek(*fd, 0, SEEK_END);
    const uint64_t blocks = ext2fs_blocks_count(sb);
    const unsigned bsize = (*fs)->blocksize;
    uint64_t span;
    if (__builtin_mul_overflow(blocks, (uint64_t)bsize, &span))
        span = UINT64_MAX;
    if (end < 0 || span > (uint64_t)end) {
        ext2fs_free(*fs);
        *fs = NULL;
        close(*fd);
        *fd = -1;
        return vmsnap_err_set(err, EINVAL,
                              "disk %s %s: the filesystem claims %llu blocks of %u bytes but the "
                              "image holds %lld bytes: truncated, or not this filesystem's image",
                              verb, path, (unsigned long long)blocks, bsize, (long long)end);
    }
    return 0;
}

int vmsnap_disk_info(const char *path, struct vmsnap_disk_info *info, struct vmsnap_err *err)
{
    memset(info, 0, sizeof(*info));
    struct stat st;
    if (stat(path, &st) < 0)
        return err_sys(err, "disk info %s", path);
    ext2_filsys fs;
    int rofd;
    int rc = open_img(path, false, &fs, &rofd, err, "info");
    if (rc < 0)
        return rc;
    struct ext2_super_block *s = fs->super;
    info->virtual_size = (uint64_t)st.st_size;
    info->allocated = (uint64_t)st.st_blocks * 512;
    info->block_size = fs->blocksize;
    info->blocks_total = ext2fs_blocks_count(s);
    info->blocks_free = ext2fs_free_blocks_count(s);
    info->inodes_total = s->s_inodes_count;
    info->inodes_free = s->s_free_inodes_count;
    memcpy(info->uuid, s->s_uuid, 16);
    disk_format_uuid(s->s_uuid, info->uuid_str);
    memcpy(info->label, s->s_volume_name, 16);
    info->label[16] = '\0';
    feature_string(s, info->features, sizeof(info->features));
    info->clean = (s->s_state & EXT2_VALID_FS) && !(s->s_state & EXT2_ERROR_FS) &&
                  !ext2fs_has_feature_journal_needs_recovery(s);
    info->has_csum_seed = ext2fs_has_feature_csum_seed(s);
    info->mount_count = s->s_mnt_count;
    info->mkfs_time = s->s_mkfs_time;
    info->write_time = s->s_wtime;
    ext2fs_free(fs);
    close(rofd);
    return 0;
}

/* At most this many superblock copies are rewritten by a UUID change: sparse_super puts them in
 * groups 0, 1 and powers of 3, 5 and 7 (under 100 for any size); a 64 GiB image without it, at
 * mke2fs's 32768 blocks per group, has 512. */
#define SET_UUID_MAX_SUPERBLOCKS 2048

int disk_set_uuid(const char *path, const char *name, const uint8_t *uuid, bool force,
                  struct vmsnap_err *err)
{
    ext2_filsys fs;
    int rofd;
    int rc = open_img(path, true, &fs, &rofd, err, "set-uuid");
    if (rc < 0)
        return rc;
    /* The primary superblock exactly as on disk: only the UUID (and, when forced, the seed
     * feature) changes; everything else is copied to the backups unchanged. */
    struct ext2_super_block sb;
    _Static_assert(sizeof(sb) == SUPERBLOCK_SIZE, "superblock size");
    int fd = rofd;
    ssize_t n = sys_pread_full(fd, &sb, sizeof(sb), SUPERBLOCK_OFFSET);
    if (n != (ssize_t)sizeof(sb)) {
        rc = vmsnap_err_set(err, n < 0 ? (int)-n : EIO, "new UUID for %s: read superblock: %s",
                            name, n < 0 ? strerror((int)-n) : "short read");
        goto out;
    }
    if (!ext2fs_has_feature_csum_seed(&sb)) {
        if (ext2fs_has_feature_gdt_csum(&sb) && !ext2fs_has_feature_metadata_csum(&sb)) {
            rc = vmsnap_err_set(err, EINVAL,
                                "new UUID for %s: the group descriptor checksums (uninit_bg) "
                                "depend on the UUID; use 'tune2fs -U' to rewrite them",
                                name);
            goto out;
        }
        /* without metadata checksums nothing else depends on the UUID */
        if (!force && ext2fs_has_feature_metadata_csum(&sb)) {
            rc = vmsnap_err_set(
                err, EINVAL,
                "new UUID for %s: metadata checksums without the metadata_csum_seed feature, so a "
                "new UUID would need every metadata checksum rewritten; --force adds the feature "
                "(kernel 4.4+) instead",
                name);
            goto out;
        }
        if (ext2fs_has_feature_metadata_csum(&sb)) {
            sb.s_checksum_seed = ext2fs_crc32c_le(~0U, sb.s_uuid, sizeof(sb.s_uuid));
            ext2fs_set_feature_csum_seed(&sb);
        }
    }
    if (uuid) {
        memcpy(sb.s_uuid, uuid, 16);
    } else if ((rc = disk_random_uuid(sb.s_uuid)) < 0) {
        rc = err_code(err, -rc, "new UUID for %s: random UUID", name);
        goto out;
    }
    /* The geometry is the image's: a crafted one (8 blocks per group, no sparse_super) in a
     * sparse file that costs nothing would have a superblock written every 32 KiB of its
     * claimed size, filling this node's disk. Images mke2fs or vmsnap make have a few dozen. */
    uint64_t copies = 0;
    for (dgrp_t g = 0; g < fs->group_desc_count; g++)
        copies += ext2fs_bg_has_super(fs, g) != 0;
    if (copies > SET_UUID_MAX_SUPERBLOCKS) {
        rc = vmsnap_err_set(err, EINVAL,
                            "new UUID for %s: %llu superblock copies to rewrite (%u block groups "
                            "of %u blocks%s): not a geometry mke2fs makes; refusing it",
                            name, (unsigned long long)copies, (unsigned)fs->group_desc_count,
                            (unsigned)fs->super->s_blocks_per_group,
                            ext2fs_has_feature_sparse_super(fs->super) ? "" : ", no sparse_super");
        goto out;
    }
    for (dgrp_t g = 0; g < fs->group_desc_count; g++) {
        if (!ext2fs_bg_has_super(fs, g))
            continue;
        uint64_t off =
            g == 0 ? SUPERBLOCK_OFFSET : ext2fs_group_first_block2(fs, g) * (uint64_t)fs->blocksize;
        sb.s_block_group_nr = (uint16_t)g;
        ext2fs_superblock_csum_set(fs, &sb);
        int w = sys_pwrite_full(fd, &sb, sizeof(sb), off);
        if (w < 0) {
            rc = err_code(err, -w, "new UUID for %s: write superblock of group %u", name,
                          (unsigned)g);
            goto out;
        }
    }
    rc = 0;
out:
    ext2fs_free(fs);
    if (close(rofd) < 0 && rc == 0)
        rc = err_sys(err, "new UUID for %s: close", name);
    return rc;
}

int vmsnap_disk_set_uuid(const char *path, const uint8_t *uuid, bool force, struct vmsnap_err *err)
{
    return disk_set_uuid(path, path, uuid, force, err);
}
