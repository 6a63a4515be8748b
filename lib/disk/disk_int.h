/* SPDX-License-Identifier: Apache-2.0 */
/* The disk module's private header. Its files depend one way: disk_ext2.c (error codes, UUIDs)
 * and disk_io.c (the io manager) <- disk_tree.c (seeding: the builder, host files) <-
 * disk_tree_write.c (the directories written at the end) <- disk.c (create, info, UUID) <-
 * disk_clone.c. */
#ifndef VMSNAP_DISK_INT_H
#define VMSNAP_DISK_INT_H

#include "vmsnap/disk.h"
#include "util/util.h"

#include <ext2fs/ext2fs.h>

/*
 * The write-back io manager (disk_io.c). The channel name is the decimal number of an
 * already open file descriptor, which the channel borrows (it never closes it). Every write
 * lands in an in-memory page cache, written out at flush in block order with one pwritev per
 * contiguous run; the cache is flushed early when it holds more than DISK_IO_CACHE_MAX bytes.
 * Option "fresh" (io_channel_set_options(io, "fresh")) declares the file a new sparse file:
 * blocks never written read as zeros without a syscall and all-zero pages are never written,
 * until the first early flush.
 */
#define DISK_IO_CACHE_MAX (64u << 20)
extern io_manager disk_io_manager;

/* Bytes written to the file by a disk_io channel so far (for tests and logs). */
uint64_t disk_io_bytes_written(io_channel ch);

/* Map a libext2fs error code to a positive errno and a short description (disk_ext2.c). */
int disk_ext2_errno(errcode_t code);
const char *disk_ext2_strerror(errcode_t code);

/* Fill 16 bytes with a random (version 4) UUID. Returns 0 or -errno. */
int disk_random_uuid(uint8_t uuid[16]);
/* Format 16 bytes as the canonical 36-character UUID string (buf >= 37 bytes). */
void disk_format_uuid(const uint8_t uuid[16], char *buf);

/*
 * Tree building (disk_tree.c). A builder keeps every directory made or changed during the
 * create in memory as a list of entries and writes each directory's blocks once at the end, so
 * adding N files to a directory costs O(N) instead of libext2fs's O(N^2) ext2fs_link scans.
 */
struct ddir;

struct dent {
    char *name;
    uint8_t len;
    uint8_t ftype;
    ext2_ino_t ino;
    struct ddir *sub; /* the directory, when this entry is one we can add into */
};

struct ddir {
    ext2_ino_t ino, parent;
    struct dent *ents;
    size_t n, cap;
    uint32_t nsubdirs;
    bool is_new;   /* inode created here, written at finish */
    bool changed;  /* blocks must be (re)written */
    bool has_meta; /* meta holds mode/owner/times to apply at finish */
    struct ext2_inode_large meta;
    struct ddir *next;
};

struct hlink {
    dev_t dev;
    ino_t ino;
    ext2_ino_t e2;
    uint32_t links;
};

struct disk_tree {
    ext2_filsys fs;
    const char *image;
    struct ddir *root;
    struct ddir *all;
    struct hlink *hl;
    size_t hl_cap, hl_n;
    uint8_t *buf;
    uint64_t files;
    unsigned depth; /* directories being copied, nested (copy_node recurses once per level) */
    dev_t self_dev; /* the image being written (its temporary file), never copied into itself */
    ino_t self_ino;
    uint64_t xattr_files; /* source files with extended attributes (not copied): said once */
    char *xattr_first;
};

/* The error of a libext2fs call while seeding, with what was done (`what`) to what (`where`):
 * out of inodes and out of space say which option to raise. */
int disk_tree_e2err(struct disk_tree *t, errcode_t e2, struct vmsnap_err *err, const char *what,
                    const char *where);
/* An empty in-inode extent tree (what the kernel writes for a new file). */
void disk_tree_init_extents(struct ext2_inode_large *in);

/* Start a builder on `fs` (root and lost+found already exist); `image` names errors. */
int disk_tree_new(ext2_filsys fs, const char *image, int image_fd, struct disk_tree **out,
                  struct vmsnap_err *err);
/* Copy the host directory `dir` into the image root (root takes dir's mode, owner, times). */
int disk_tree_from_dir(struct disk_tree *t, const char *dir, struct vmsnap_err *err);
/* Apply one --add / --mkdir step. */
int disk_tree_apply(struct disk_tree *t, const struct vmsnap_disk_entry *e, struct vmsnap_err *err);
/* Write every changed directory and link count (disk_tree_write.c). */
int disk_tree_finish(struct disk_tree *t, struct vmsnap_err *err);
void disk_tree_free(struct disk_tree *t);

/* vmsnap_disk_set_uuid() of the image at `path`, its messages naming `name` (a clone's
 * destination, while the image is still under its temporary name). */
int disk_set_uuid(const char *path, const char *name, const uint8_t *uuid, bool force,
                  struct vmsnap_err *err);

#endif
