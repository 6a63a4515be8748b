/* SPDX-License-Identifier: Apache-2.0 */
/*
 * vmsnap disk: writable upper disks for micro-VMs. A disk is a sparse, journal-less ext4 image
 * made in-process through libext2fs (no mke2fs binary), seeded with files, cloned without
 * densifying (FICLONE, else a hole-keeping extent walk), and re-identified by patching only the
 * superblocks (metadata_csum_seed keeps every other checksum valid).
 *
 * All functions are safe to call from several threads on different images; none is safe to
 * call concurrently on the same image path. Errors: a negative errno and `err` naming the image
 * and the cause (ENOSPC for out of space / out of inodes, with the numbers; ENOENT for a missing
 * source; EEXIST for an existing destination without `force`).
 */
#ifndef VMSNAP_DISK_H
#define VMSNAP_DISK_H

#include "vmsnap/common.h"

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Default virtual size of `vmsnap disk create`: 4 GiB (costs ~150 KiB allocated). */
#define VMSNAP_DISK_DEFAULT_SIZE (4ull << 30)
/* The sizes disk create takes: from 1 MiB to 16 TiB less one 4 KiB block (libext2fs's layout
 * fails from 2^32 blocks on); a label of at most 16 bytes. */
#define VMSNAP_DISK_MIN_SIZE (1ull << 20)
#define VMSNAP_DISK_MAX_SIZE ((1ull << 44) - 4096)
#define VMSNAP_DISK_LABEL_MAX 16

/* What to put into a new image, applied in order after --from-dir. */
enum vmsnap_disk_op {
    VMSNAP_DISK_ADD = 0,   /* copy `src` (file, symlink or directory tree) to `dest` */
    VMSNAP_DISK_MKDIR = 1, /* create directory `dest` (and missing parents) */
};

/* One seeding step. Strings are borrowed for the duration of the call. */
struct vmsnap_disk_entry {
    enum vmsnap_disk_op op;
    const char *src;  /* host path (ADD only) */
    const char *dest; /* absolute path inside the image, e.g. "/etc/resolv.conf" */
    int32_t mode;     /* permission bits (07777), or -1: from the source (ADD) / 0755 (MKDIR) */
    int64_t uid, gid; /* owner, or -1: from the source (ADD) / 0 (MKDIR) */
};

/* Options for vmsnap_disk_create. Zero-initialise, then set what you need. */
struct vmsnap_disk_create_opts {
    uint64_t size; /* virtual size in bytes (0: VMSNAP_DISK_DEFAULT_SIZE), rounded down to 4 KiB */
    uint64_t inodes;      /* inode count (0: one per 16 KiB); rounded up to fill whole groups */
    const char *label;    /* volume label, at most 16 bytes, or NULL */
    const uint8_t *uuid;  /* 16 bytes, or NULL for a random UUID */
    const char *from_dir; /* host directory copied to the image root (like mke2fs -d), or NULL */
    const struct vmsnap_disk_entry *entries;
    size_t n_entries;
    bool force; /* replace an existing image */
    bool fsync; /* fsync the image and its directory before returning */
};

/*
 * Create the ext4 image `path` (features: extents, 64bit, flex_bg, huge_file, dir_nlink,
 * extra_isize, metadata_csum, metadata_csum_seed, dir_index, ext_attr, sparse_super, no
 * journal). Inode tables are left as holes and marked zeroed. Regular files are written sparse
 * (holes and all-zero blocks of the source are not stored); directories, fast and slow symlinks
 * and hard links are kept with modes, owners and nanosecond times; other file types are refused.
 * The image is built under a temporary name in the same directory and renamed onto `path` only
 * on success: on any error nothing is left at `path` (an existing file there is untouched).
 */
VMSNAP_API int vmsnap_disk_create(const char *path, const struct vmsnap_disk_create_opts *opts,
                                  struct vmsnap_err *err);

/* How vmsnap_disk_clone made the copy. */
enum vmsnap_disk_clone_how {
    VMSNAP_DISK_CLONE_LINK = 0,    /* hard link */
    VMSNAP_DISK_CLONE_FICLONE = 1, /* reflink of the whole file */
    VMSNAP_DISK_CLONE_EXTENTS = 2, /* copy_file_range of each data extent, holes kept */
    VMSNAP_DISK_CLONE_RW = 3,      /* read/write of each data extent, holes kept */
    VMSNAP_DISK_CLONE_DIRECT = 4,  /* O_DIRECT read/write of each data extent, holes kept */
};

struct vmsnap_disk_clone_opts {
    bool link;     /* hard-link when on the same filesystem (else copy) */
    bool new_uuid; /* give the copy a fresh random UUID (not with `link`) */
    bool force;    /* replace an existing `dst`; allow a UUID change that adds metadata_csum_seed */
    bool direct;   /* when copying (no link, no FICLONE), leave no cached or dirty pages of
                    * either file behind (for large one-shot copies such as a memory image
                    * between tmpfs and a checkpoint on disk): extents of 256 KiB and more with
                    * O_DIRECT, the rest buffered, then written out and dropped. The data has
                    * been written when this returns; fsync for durability. */
};

/*
 * Copy the image `src` to `dst`: FICLONE when the filesystem supports it, else a
 * SEEK_DATA/SEEK_HOLE walk that copies only data extents (copy_file_range, falling back to
 * read/write), so the copy allocates what the source allocates. With `new_uuid` the copy's
 * superblocks get a new UUID before it appears at `dst`. `how` (may be NULL) tells which method
 * was used. `dst` appears only when complete.
 */
VMSNAP_API int vmsnap_disk_clone(const char *src, const char *dst,
                                 const struct vmsnap_disk_clone_opts *opts,
                                 enum vmsnap_disk_clone_how *how, struct vmsnap_err *err);

/*
 * Set the UUID of the ext4 image `path` in place (`uuid` 16 bytes, or NULL for a random one) by
 * rewriting only the primary and backup superblocks. Needs metadata_csum_seed (or no metadata
 * checksums at all); with `force`, an image with metadata_csum but no seed gets the seed feature
 * added (kernels before 4.4 cannot mount it). Images with only gdt_csum are refused.
 */
VMSNAP_API int vmsnap_disk_set_uuid(const char *path, const uint8_t *uuid, bool force,
                                    struct vmsnap_err *err);

/* What vmsnap_disk_info reports. Caller-owned; no pointers inside. */
struct vmsnap_disk_info {
    uint64_t virtual_size; /* file size in bytes */
    uint64_t allocated;    /* bytes allocated on the host (st_blocks * 512) */
    uint32_t block_size;
    uint64_t blocks_total, blocks_free;
    uint64_t inodes_total, inodes_free;
    uint8_t uuid[16];
    char uuid_str[37];
    char label[17];
    char features[512]; /* space-separated names, e.g. "ext_attr dir_index filetype extent ..." */
    bool clean;         /* cleanly unmounted, no errors recorded */
    bool has_csum_seed; /* metadata_csum_seed: a clone's UUID can be changed cheaply */
    uint32_t mount_count;
    int64_t mkfs_time, write_time; /* seconds since the epoch (0: never) */
};

/* Read the superblock of the ext4 image `path` (read-only) into `info`. */
VMSNAP_API int vmsnap_disk_info(const char *path, struct vmsnap_disk_info *info,
                                struct vmsnap_err *err);

/* Parse "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" into 16 bytes. Returns 0 or -EINVAL. */
VMSNAP_API int vmsnap_disk_parse_uuid(const char *s, uint8_t out[16]);

#ifdef __cplusplus
}
#endif
#endif
