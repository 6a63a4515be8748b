/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Seeding a new image with host files (what mke2fs -d does, in-process).
 *
 * Directories are kept in memory as entry lists while the tree is copied and written once at
 * the end (disk_tree_write.c): each directory's blocks are laid out in order (entries never
 * straddle a block, each block ends with the metadata_csum tail) and written through
 * ext2fs_write_dir_block4, which sets the checksum. This avoids ext2fs_link, which scans the whole
 * directory for every new name. Regular files are copied extent by extent (SEEK_DATA/SEEK_HOLE)
 * through the ext2fs_file API, skipping all-zero blocks, so holes stay holes. Hard links are found
 * by (st_dev, st_ino) and get one inode with the right link count. Symlinks go through
 * ext2fs_symlink (fast when the target fits in the inode, a block otherwise). Anything else is
 * refused.
 */
#include "disk_int.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#define COPY_BUF (1u << 20)

/* Deeper source trees are refused: the copy recurses (and holds a descriptor) per level. */
#define TREE_DEPTH_MAX 1000

/* ---- helpers ---------------------------------------------------------------------------- */

int disk_tree_e2err(struct disk_tree *t, errcode_t e2, struct vmsnap_err *err, const char *what,
                    const char *where)
{
    ext2_filsys fs = t->fs;
    if (e2 == EXT2_ET_INODE_ALLOC_FAIL)
        return vmsnap_err_set(
            err, ENOSPC,
            "disk create %s: out of inodes %s %s: all %u inodes of the image are in use "
            "(%llu entries copied); use a larger --inodes",
            t->image, what, where, fs->super->s_inodes_count, (unsigned long long)t->files);
    if (e2 == EXT2_ET_BLOCK_ALLOC_FAIL || e2 == EXT2_ET_DIR_NO_SPACE)
        return vmsnap_err_set(
            err, ENOSPC,
            "disk create %s: out of space %s %s: %llu of %llu blocks of %u bytes free; use "
            "a larger --size",
            t->image, what, where, (unsigned long long)ext2fs_free_blocks_count(fs->super),
            (unsigned long long)ext2fs_blocks_count(fs->super), fs->blocksize);
    return vmsnap_err_set(err, disk_ext2_errno(e2), "disk create %s: %s %s: %s", t->image, what,
                          where, disk_ext2_strerror(e2));
}

static void set_time(uint32_t *lo, uint32_t *extra, struct timespec ts)
{
    int64_t sec = ts.tv_sec;
    *lo = (uint32_t)sec;
    /* Bits 0-1 extend the seconds past 2038 (epoch bits); 2-31 hold the nanoseconds. */
    uint32_t epoch = (uint32_t)(((sec - (int64_t)(int32_t)(uint32_t)sec) >> 32) & 3);
    *extra = epoch | ((uint32_t)ts.tv_nsec << 2);
}

/* Fill the inode fields common to every new inode: type+mode, owner, times. */
static void init_inode(struct ext2_inode_large *in, uint16_t mode, uint32_t uid, uint32_t gid,
                       const struct stat *st)
{
    memset(in, 0, sizeof(*in));
    in->i_mode = mode;
    in->i_uid = (uint16_t)uid;
    in->osd2.linux2.l_i_uid_high = (uint16_t)(uid >> 16);
    in->i_gid = (uint16_t)gid;
    in->osd2.linux2.l_i_gid_high = (uint16_t)(gid >> 16);
    in->i_links_count = 1;
    in->i_extra_isize = sizeof(struct ext2_inode_large) - EXT2_GOOD_OLD_INODE_SIZE;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    set_time(&in->i_atime, &in->i_atime_extra, st ? st->st_atim : now);
    set_time(&in->i_mtime, &in->i_mtime_extra, st ? st->st_mtim : now);
    set_time(&in->i_ctime, &in->i_ctime_extra, st ? st->st_ctim : now);
    set_time(&in->i_crtime, &in->i_crtime_extra, now);
}

/* An empty in-inode extent tree (what the kernel writes for a new file). */
void disk_tree_init_extents(struct ext2_inode_large *in)
{
    struct ext3_extent_header *eh = (struct ext3_extent_header *)in->i_block;
    in->i_flags |= EXT4_EXTENTS_FL;
    eh->eh_magic = EXT3_EXT_MAGIC;
    eh->eh_entries = 0;
    eh->eh_max = (sizeof(in->i_block) - sizeof(*eh)) / sizeof(struct ext3_extent);
    eh->eh_depth = 0;
    eh->eh_generation = 0;
}

static int add_dent(struct disk_tree *t, struct ddir *d, const char *name, ext2_ino_t ino,
                    uint8_t ftype, struct ddir *sub, struct vmsnap_err *err)
{
    if (grow_array(&d->ents, &d->cap, d->n + 1, sizeof(*d->ents), 8) < 0)
        return vmsnap_err_set(err, ENOMEM, "disk create %s: out of memory", t->image);
    char *nm = strdup(name);
    if (!nm)
        return vmsnap_err_set(err, ENOMEM, "disk create %s: out of memory", t->image);
    d->ents[d->n++] = (struct dent){nm, (uint8_t)strlen(name), ftype, ino, sub};
    d->changed = true;
    t->files++;
    return 0;
}

static struct dent *lookup(struct ddir *d, const char *name)
{
    for (size_t i = 0; i < d->n; i++)
        if (strcmp(d->ents[i].name, name) == 0)
            return &d->ents[i];
    return NULL;
}

static struct ddir *ddir_new(struct disk_tree *t, ext2_ino_t ino, ext2_ino_t parent)
{
    struct ddir *d = calloc(1, sizeof(*d));
    if (!d)
        return NULL;
    d->ino = ino;
    d->parent = parent;
    d->next = t->all;
    t->all = d;
    return d;
}

static int check_name(struct disk_tree *t, const char *name, const char *where,
                      struct vmsnap_err *err)
{
    size_t n = strlen(name);
    if (n == 0 || n > EXT2_NAME_LEN)
        return vmsnap_err_set(err, ENAMETOOLONG, "disk create %s: %s: name longer than %d bytes",
                              t->image, where, EXT2_NAME_LEN);
    return 0;
}

/* ---- hard links ------------------------------------------------------------------------- */

static struct hlink *hl_find(struct disk_tree *t, dev_t dev, ino_t ino, bool insert)
{
    if (insert && (t->hl_n + 1) * 2 > t->hl_cap) {
        size_t nc = t->hl_cap ? t->hl_cap * 2 : 256;
        struct hlink *nt = calloc(nc, sizeof(*nt));
        if (!nt)
            return NULL;
        for (size_t i = 0; i < t->hl_cap; i++) {
            if (!t->hl[i].e2)
                continue;
            size_t j = (size_t)((t->hl[i].ino * 0x9E3779B97F4A7C15ull) ^ t->hl[i].dev) & (nc - 1);
            while (nt[j].e2)
                j = (j + 1) & (nc - 1);
            nt[j] = t->hl[i];
        }
        free(t->hl);
        t->hl = nt;
        t->hl_cap = nc;
    }
    if (!t->hl_cap)
        return NULL;
    size_t i = (size_t)((ino * 0x9E3779B97F4A7C15ull) ^ dev) & (t->hl_cap - 1);
    for (;; i = (i + 1) & (t->hl_cap - 1)) {
        if (!t->hl[i].e2) {
            if (!insert)
                return NULL;
            t->hl[i].dev = dev;
            t->hl[i].ino = ino;
            t->hl_n++;
            return &t->hl[i];
        }
        if (t->hl[i].dev == dev && t->hl[i].ino == ino)
            return &t->hl[i];
    }
}

/* ---- regular files and symlinks ---------------------------------------------------------- */

static bool zero_block(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i])
            return false;
    return true;
}

/* Copy the data extents of fd into the image file, skipping holes and all-zero blocks. */
static int copy_data(struct disk_tree *t, int fd, ext2_file_t f, uint64_t size, const char *where,
                     struct vmsnap_err *err)
{
    const size_t bs = t->fs->blocksize;
    off_t pos = 0;
    while ((uint64_t)pos < size) {
        off_t data = lseek(fd, pos, SEEK_DATA);
        if (data < 0) {
            if (errno == ENXIO)
                break;
            if (errno != EINVAL && errno != EOPNOTSUPP)
                return err_sys(err, "disk create %s: read %s", t->image, where);
            data = pos; /* no SEEK_DATA: treat everything as data (zero blocks still skipped) */
        }
        off_t hole = lseek(fd, data, SEEK_HOLE);
        if (hole < 0)
            hole = (off_t)size;
        if ((uint64_t)hole > size)
            hole = (off_t)size;
        data -= data % (off_t)bs; /* block-align; the bytes before data in that block are zero */
        for (off_t at = data; at < hole;) {
            size_t want = (size_t)VMSNAP_MIN((uint64_t)(hole - at), (uint64_t)COPY_BUF);
            ssize_t n = pread(fd, t->buf, want, at);
            if (n < 0) {
                if (errno == EINTR)
                    continue;
                return err_sys(err, "disk create %s: read %s", t->image, where);
            }
            if (n == 0) /* shorter than its size: it is being changed */
                return vmsnap_err_set(err, EAGAIN,
                                      "disk create %s: source %s changed while being copied "
                                      "(%llu bytes read of %llu)",
                                      t->image, where, (unsigned long long)at,
                                      (unsigned long long)size);
            /* Write runs of non-zero blocks. */
            size_t i = 0;
            while (i < (size_t)n) {
                size_t len = VMSNAP_MIN(bs, (size_t)n - i);
                if (zero_block(t->buf + i, len)) {
                    i += len;
                    continue;
                }
                size_t j = i + len;
                while (j < (size_t)n) {
                    size_t l2 = VMSNAP_MIN(bs, (size_t)n - j);
                    if (zero_block(t->buf + j, l2))
                        break;
                    j += l2;
                }
                errcode_t e2 = ext2fs_file_llseek(f, (uint64_t)at + i, EXT2_SEEK_SET, NULL);
                unsigned got = 0;
                if (!e2)
                    e2 = ext2fs_file_write(f, t->buf + i, (unsigned)(j - i), &got);
                if (!e2 && got != j - i)
                    e2 = EXT2_ET_SHORT_WRITE;
                if (e2)
                    return disk_tree_e2err(t, e2, err, "writing", where);
                i = j;
            }
            at += n;
        }
        pos = hole;
    }
    return 0;
}

static int add_regular(struct disk_tree *t, struct ddir *parent, const char *name, int fd,
                       const struct stat *st, uint16_t mode, uint32_t uid, uint32_t gid,
                       const char *where, ext2_ino_t *out, struct vmsnap_err *err)
{
    ext2_filsys fs = t->fs;
    ext2_ino_t ino;
    errcode_t e2 = ext2fs_new_inode(fs, parent->ino, LINUX_S_IFREG | mode, NULL, &ino);
    if (e2)
        return disk_tree_e2err(t, e2, err, "adding", where);
    ext2fs_inode_alloc_stats2(fs, ino, +1, 0);
    struct ext2_inode_large in;
    init_inode(&in, (uint16_t)(LINUX_S_IFREG | mode), uid, gid, st);
    disk_tree_init_extents(&in);
    e2 = ext2fs_write_inode_full(fs, ino, (struct ext2_inode *)&in, sizeof(in));
    if (e2)
        return disk_tree_e2err(t, e2, err, "writing inode of", where);
    if (st->st_size > 0) {
        ext2_file_t f;
        e2 = ext2fs_file_open(fs, ino, EXT2_FILE_WRITE, &f);
        if (e2)
            return disk_tree_e2err(t, e2, err, "opening", where);
        int rc = copy_data(t, fd, f, (uint64_t)st->st_size, where, err);
        if (rc == 0) {
            e2 = ext2fs_file_set_size2(f, (uint64_t)st->st_size);
            if (e2)
                rc = disk_tree_e2err(t, e2, err, "sizing", where);
        }
        e2 = ext2fs_file_close(f);
        if (rc == 0 && e2)
            rc = disk_tree_e2err(t, e2, err, "writing", where);
        if (rc < 0)
            return rc;
    }
    *out = ino;
    return add_dent(t, parent, name, ino, EXT2_FT_REG_FILE, NULL, err);
}

static int add_symlink(struct disk_tree *t, struct ddir *parent, const char *name,
                       const char *target, const struct stat *st, uint32_t uid, uint32_t gid,
                       const char *where, ext2_ino_t *out, struct vmsnap_err *err)
{
    ext2_filsys fs = t->fs;
    if (strlen(target) >= fs->blocksize)
        return vmsnap_err_set(err, ENAMETOOLONG,
                              "disk create %s: symlink %s: target longer than %u bytes", t->image,
                              where, fs->blocksize - 1);
    ext2_ino_t ino;
    errcode_t e2 = ext2fs_new_inode(fs, parent->ino, LINUX_S_IFLNK | 0777, NULL, &ino);
    if (!e2)
        e2 = ext2fs_symlink(fs, parent->ino, ino, NULL, target);
    if (e2)
        return disk_tree_e2err(t, e2, err, "adding symlink", where);
    struct ext2_inode_large in;
    e2 = ext2fs_read_inode_full(fs, ino, (struct ext2_inode *)&in, sizeof(in));
    if (e2)
        return disk_tree_e2err(t, e2, err, "reading inode of", where);
    struct ext2_inode_large meta;
    init_inode(&meta, in.i_mode, uid, gid, st);
    in.i_uid = meta.i_uid;
    in.i_gid = meta.i_gid;
    in.osd2.linux2.l_i_uid_high = meta.osd2.linux2.l_i_uid_high;
    in.osd2.linux2.l_i_gid_high = meta.osd2.linux2.l_i_gid_high;
    in.i_extra_isize = meta.i_extra_isize;
    in.i_atime = meta.i_atime;
    in.i_mtime = meta.i_mtime;
    in.i_ctime = meta.i_ctime;
    in.i_crtime = meta.i_crtime;
    in.i_atime_extra = meta.i_atime_extra;
    in.i_mtime_extra = meta.i_mtime_extra;
    in.i_ctime_extra = meta.i_ctime_extra;
    in.i_crtime_extra = meta.i_crtime_extra;
    e2 = ext2fs_write_inode_full(fs, ino, (struct ext2_inode *)&in, sizeof(in));
    if (e2)
        return disk_tree_e2err(t, e2, err, "writing inode of", where);
    *out = ino;
    return add_dent(t, parent, name, ino, EXT2_FT_SYMLINK, NULL, err);
}

static int new_dir(struct disk_tree *t, struct ddir *parent, const char *name, uint16_t mode,
                   uint32_t uid, uint32_t gid, const struct stat *st, const char *where,
                   struct ddir **out, struct vmsnap_err *err)
{
    ext2_ino_t ino;
    errcode_t e2 = ext2fs_new_inode(t->fs, parent->ino, LINUX_S_IFDIR | mode, NULL, &ino);
    if (e2)
        return disk_tree_e2err(t, e2, err, "adding directory", where);
    ext2fs_inode_alloc_stats2(t->fs, ino, +1, 1);
    struct ddir *d = ddir_new(t, ino, parent->ino);
    if (!d)
        return vmsnap_err_set(err, ENOMEM, "disk create %s: out of memory", t->image);
    d->is_new = true;
    d->changed = true;
    d->has_meta = true;
    init_inode(&d->meta, (uint16_t)(LINUX_S_IFDIR | mode), uid, gid, st);
    int rc = add_dent(t, parent, name, ino, EXT2_FT_DIR, d, err);
    if (rc < 0)
        return rc;
    parent->nsubdirs++;
    *out = d;
    return 0;
}

/* ---- copying host trees ------------------------------------------------------------------ */

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int copy_node(struct disk_tree *t, struct ddir *parent, int dirfd, const char *name,
                     const char *hostpath, const char *imgname, int32_t mode_ovr, int64_t uid_ovr,
                     int64_t gid_ovr, struct vmsnap_err *err);

/* Copy the entries of the open host directory dfd (path hostpath) into d. Takes dfd. */
static int copy_dir_contents(struct disk_tree *t, struct ddir *d, int dfd, const char *hostpath,
                             bool at_root, struct vmsnap_err *err)
{
    DIR *dir = fdopendir(dfd);
    if (!dir) {
        int e = errno;
        close(dfd);
        return err_code(err, e, "disk create %s: open directory %s", t->image, hostpath);
    }
    char **names = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;
    struct dirent *de;
    errno = 0;
    while ((de = readdir(dir)) != NULL) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        if (at_root && !strcmp(de->d_name, "lost+found"))
            continue; /* the image has its own */
        if (grow_array(&names, &cap, n + 1, sizeof(*names), 64) < 0) {
            rc = vmsnap_err_set(err, ENOMEM, "disk create %s: out of memory", t->image);
            goto out;
        }
        if (!(names[n] = strdup(de->d_name))) {
            rc = vmsnap_err_set(err, ENOMEM, "disk create %s: out of memory", t->image);
            goto out;
        }
        n++;
        errno = 0;
    }
    if (errno) {
        rc = err_sys(err, "disk create %s: read directory %s", t->image, hostpath);
        goto out;
    }
    /* Sorted names: the same tree always gives the same image layout. */
    if (n > 1)
        qsort(names, n, sizeof(*names), cmp_str);
    size_t hl = strlen(hostpath);
    for (size_t i = 0; i < n && rc == 0; i++) {
        size_t plen = hl + 1 + strlen(names[i]) + 1;
        char *child = malloc(plen);
        if (!child) {
            rc = vmsnap_err_set(err, ENOMEM, "disk create %s: out of memory", t->image);
            break;
        }
        snprintf(child, plen, "%s/%s", hostpath, names[i]);
        rc = copy_node(t, d, dirfd(dir), names[i], child, names[i], -1, -1, -1, err);
        free(child);
    }
out:
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
    closedir(dir);
    return rc;
}

/* Copy the host object `name` (relative to dirfd; hostpath for messages) into `parent` under
 * the name imgname. */
static int copy_node(struct disk_tree *t, struct ddir *parent, int dirfd, const char *name,
                     const char *hostpath, const char *imgname, int32_t mode_ovr, int64_t uid_ovr,
                     int64_t gid_ovr, struct vmsnap_err *err)
{
    int rc = check_name(t, imgname, hostpath, err);
    if (rc < 0)
        return rc;
    struct stat st;
    if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
        return err_sys(err, "disk create %s: source %s", t->image, hostpath);
    if (S_ISREG(st.st_mode) && t->self_ino && st.st_ino == t->self_ino && st.st_dev == t->self_dev)
        return 0; /* --from-dir holding the destination: the image's own temporary file */
    uint16_t mode = (uint16_t)(mode_ovr >= 0 ? (uint32_t)mode_ovr : (st.st_mode & 07777));
    uint32_t uid = (uint32_t)(uid_ovr >= 0 ? (uint64_t)uid_ovr : st.st_uid);
    uint32_t gid = (uint32_t)(gid_ovr >= 0 ? (uint64_t)gid_ovr : st.st_gid);

    if (S_ISDIR(st.st_mode)) {
        int dfd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (dfd < 0)
            return err_sys(err, "disk create %s: open directory %s", t->image, hostpath);
        if (t->depth >= TREE_DEPTH_MAX) {
            close(dfd);
            return vmsnap_err_set(err, ELOOP,
                                  "disk create %s: the source tree is more than %u directories "
                                  "deep (at %s)",
                                  t->image, TREE_DEPTH_MAX, hostpath);
        }
        struct ddir *d;
        rc = new_dir(t, parent, imgname, mode, uid, gid, &st, hostpath, &d, err);
        if (rc < 0) {
            close(dfd);
            return rc;
        }
        t->depth++;
        rc = copy_dir_contents(t, d, dfd, hostpath, false, err);
        t->depth--;
        return rc;
    }
    if (!S_ISREG(st.st_mode) && !S_ISLNK(st.st_mode)) {
        const char *kind = S_ISFIFO(st.st_mode)   ? "a FIFO"
                           : S_ISSOCK(st.st_mode) ? "a socket"
                           : S_ISCHR(st.st_mode)  ? "a character device"
                           : S_ISBLK(st.st_mode)  ? "a block device"
                                                  : "an unknown file type";
        return vmsnap_err_set(
            err, EINVAL,
            "disk create %s: source %s is %s; only regular files, directories and "
            "symlinks can be copied into an image",
            t->image, hostpath, kind);
    }
    /* An --add with its own mode or owner gets an inode of its own: linked to another name of
     * the same source file it would share (and change, or lose) that one's. */
    bool own = mode_ovr >= 0 || uid_ovr >= 0 || gid_ovr >= 0;
    if (st.st_nlink > 1 && !own) {
        struct hlink *h = hl_find(t, st.st_dev, st.st_ino, false);
        if (h) {
            if (h->links >= EXT2_LINK_MAX)
                return vmsnap_err_set(err, EMLINK,
                                      "disk create %s: %s: more than %u hard links to one file "
                                      "(ext4's limit)",
                                      t->image, hostpath, (unsigned)EXT2_LINK_MAX);
            h->links++;
            return add_dent(t, parent, imgname, h->e2,
                            S_ISLNK(st.st_mode) ? EXT2_FT_SYMLINK : EXT2_FT_REG_FILE, NULL, err);
        }
    }
    ext2_ino_t ino = 0;
    if (S_ISLNK(st.st_mode)) {
        char *target = malloc(PATH_MAX + 1); /* not on the stack: copy_node recurses */
        if (!target)
            return vmsnap_err_set(err, ENOMEM, "disk create %s: out of memory", t->image);
        ssize_t n = readlinkat(dirfd, name, target, PATH_MAX);
        if (n < 0) {
            free(target);
            return err_sys(err, "disk create %s: read symlink %s", t->image, hostpath);
        }
        target[n] = '\0';
        rc = add_symlink(t, parent, imgname, target, &st, uid, gid, hostpath, &ino, err);
        free(target);
    } else {
        /* O_NONBLOCK, then the opened file must be the one looked at: a file swapped for a
         * FIFO (or anything else) in between is refused, not waited on */
        int fd = openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
        if (fd < 0)
            return err_sys(err, "disk create %s: open %s", t->image, hostpath);
        struct stat ost;
        if (fstat(fd, &ost) < 0 || !S_ISREG(ost.st_mode) || ost.st_ino != st.st_ino ||
            ost.st_dev != st.st_dev) {
            close(fd);
            return vmsnap_err_set(err, EAGAIN,
                                  "disk create %s: source %s changed while being copied", t->image,
                                  hostpath);
        }
        rc = add_regular(t, parent, imgname, fd, &st, mode, uid, gid, hostpath, &ino, err);
        /* extended attributes (file capabilities, SELinux labels) are not copied: counted,
         * said at the end, so a binary that needs its capability is not broken silently */
        if (rc == 0 && flistxattr(fd, NULL, 0) > 0 && !t->xattr_files++)
            t->xattr_first = strdup(hostpath);
        /* a file written meanwhile would be in the image as it never was */
        struct stat after;
        if (rc == 0 && (fstat(fd, &after) < 0 || after.st_size != st.st_size ||
                        after.st_mtim.tv_sec != st.st_mtim.tv_sec ||
                        after.st_mtim.tv_nsec != st.st_mtim.tv_nsec))
            rc = vmsnap_err_set(err, EAGAIN,
                                "disk create %s: source %s changed while being copied (size or "
                                "modification time); copy it again when it is not being written",
                                t->image, hostpath);
        close(fd);
    }
    if (rc == 0 && st.st_nlink > 1 && !own) {
        struct hlink *h = hl_find(t, st.st_dev, st.st_ino, true);
        if (!h)
            return vmsnap_err_set(err, ENOMEM, "disk create %s: out of memory", t->image);
        h->e2 = ino;
        h->links = 1;
    }
    return rc;
}

/* ---- public (module) entry points --------------------------------------------------------- */

int disk_tree_new(ext2_filsys fs, const char *image, int image_fd, struct disk_tree **out,
                  struct vmsnap_err *err)
{
    struct disk_tree *t = calloc(1, sizeof(*t));
    if (!t || !(t->buf = malloc(COPY_BUF))) {
        free(t);
        return vmsnap_err_set(err, ENOMEM, "disk create %s: out of memory", image);
    }
    t->fs = fs;
    t->image = image;
    struct stat ist;
    if (image_fd >= 0 && fstat(image_fd, &ist) == 0) {
        t->self_dev = ist.st_dev;
        t->self_ino = ist.st_ino;
    }
    t->root = ddir_new(t, EXT2_ROOT_INO, EXT2_ROOT_INO);
    ext2_ino_t lpf;
    errcode_t e2 = ext2fs_lookup(fs, EXT2_ROOT_INO, "lost+found", 10, NULL, &lpf);
    int rc = 0;
    if (!t->root)
        rc = vmsnap_err_set(err, ENOMEM, "disk create %s: out of memory", image);
    else if (e2)
        rc = vmsnap_err_set(err, disk_ext2_errno(e2), "disk create %s: look up /lost+found: %s",
                            image, disk_ext2_strerror(e2));
    else
        rc = add_dent(t, t->root, "lost+found", lpf, EXT2_FT_DIR, NULL, err);
    if (rc < 0) {
        disk_tree_free(t);
        return rc;
    }
    t->root->nsubdirs = 1;
    t->root->changed = false;
    t->files = 0;
    *out = t;
    return 0;
}

int disk_tree_from_dir(struct disk_tree *t, const char *dir, struct vmsnap_err *err)
{
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    struct stat st;
    if (dfd < 0 || fstat(dfd, &st) < 0) {
        int e = errno;
        if (dfd >= 0)
            close(dfd);
        return err_code(err, e, "disk create %s: --from-dir %s", t->image, dir);
    }
    /* Like mke2fs -d, the image root takes the source directory's mode, owner and times. */
    init_inode(&t->root->meta, (uint16_t)(LINUX_S_IFDIR | (st.st_mode & 07777)), st.st_uid,
               st.st_gid, &st);
    t->root->has_meta = true;
    t->root->changed = true;
    return copy_dir_contents(t, t->root, dfd, dir, true, err);
}

/* --mkdir of a directory that exists (the root, lost+found, one made as a parent): set the
 * mode and owner asked for, starting from its inode as it is when it has no pending meta. */
static int mkdir_meta(struct disk_tree *t, struct ddir *x, const struct vmsnap_disk_entry *e,
                      struct vmsnap_err *err)
{
    if (e->mode < 0 && e->uid < 0 && e->gid < 0)
        return 0;
    if (!x->has_meta) {
        errcode_t e2 =
            ext2fs_read_inode_full(t->fs, x->ino, (struct ext2_inode *)&x->meta, sizeof(x->meta));
        if (e2)
            return disk_tree_e2err(t, e2, err, "reading", e->dest);
        x->has_meta = true;
    }
    x->changed = true;
    if (e->mode >= 0)
        x->meta.i_mode = (uint16_t)(LINUX_S_IFDIR | (uint32_t)e->mode);
    if (e->uid >= 0) {
        x->meta.i_uid = (uint16_t)e->uid;
        x->meta.osd2.linux2.l_i_uid_high = (uint16_t)((uint64_t)e->uid >> 16);
    }
    if (e->gid >= 0) {
        x->meta.i_gid = (uint16_t)e->gid;
        x->meta.osd2.linux2.l_i_gid_high = (uint16_t)((uint64_t)e->gid >> 16);
    }
    return 0;
}

int disk_tree_apply(struct disk_tree *t, const struct vmsnap_disk_entry *e, struct vmsnap_err *err)
{
    /* Walk dest's parents, creating missing ones (0755 root:root, like mkdir -p). */
    char *path = strdup(e->dest);
    if (!path)
        return vmsnap_err_set(err, ENOMEM, "disk create %s: out of memory", t->image);
    struct ddir *d = t->root;
    int rc = 0;
    char *save = NULL, *comp = strtok_r(path, "/", &save);
    char *last = NULL;
    while (comp) {
        char *nextc = strtok_r(NULL, "/", &save);
        if (!strcmp(comp, ".") || !strcmp(comp, "..")) {
            rc = vmsnap_err_set(err, EINVAL,
                                "disk create %s: destination %s: '.' and '..' not allowed",
                                t->image, e->dest);
            goto out;
        }
        if ((rc = check_name(t, comp, e->dest, err)) < 0)
            goto out;
        if (!nextc) {
            last = comp;
            break;
        }
        struct dent *de = lookup(d, comp);
        if (de && !de->sub) {
            rc = vmsnap_err_set(err, de->ftype == EXT2_FT_DIR ? EPERM : ENOTDIR,
                                "disk create %s: destination %s: component '%s' is %s", t->image,
                                e->dest, comp,
                                de->ftype == EXT2_FT_DIR ? "a directory vmsnap cannot add into"
                                                         : "not a directory");
            goto out;
        }
        if (de) {
            d = de->sub;
        } else if ((rc = new_dir(t, d, comp, 0755, 0, 0, NULL, e->dest, &d, err)) < 0) {
            goto out;
        }
        comp = nextc;
    }
    if (!last) {
        /* "/" itself: only mkdir is meaningful; apply mode/owner to the root. */
        if (e->op == VMSNAP_DISK_ADD) {
            rc = vmsnap_err_set(err, EINVAL,
                                "disk create %s: destination %s: cannot replace the root", t->image,
                                e->dest);
            goto out;
        }
        rc = mkdir_meta(t, t->root, e, err);
        goto out;
    }
    struct dent *de = lookup(d, last);
    if (e->op == VMSNAP_DISK_MKDIR) {
        if (de && de->sub) /* already there (e.g. made as a parent): set what was asked */
        {
            rc = mkdir_meta(t, de->sub, e, err);
            goto out;
        }
        if (de) {
            rc = vmsnap_err_set(err, EEXIST,
                                de->ftype == EXT2_FT_DIR
                                    ? "disk create %s: --mkdir %s: a directory vmsnap keeps as "
                                      "made (lost+found) cannot be changed"
                                    : "disk create %s: --mkdir %s: exists and is not a directory",
                                t->image, e->dest);
            goto out;
        }
        struct ddir *nd;
        rc = new_dir(t, d, last, (uint16_t)(e->mode >= 0 ? e->mode : 0755),
                     (uint32_t)(e->uid >= 0 ? e->uid : 0), (uint32_t)(e->gid >= 0 ? e->gid : 0),
                     NULL, e->dest, &nd, err);
        goto out;
    }
    if (de) {
        rc = vmsnap_err_set(err, EEXIST,
                            "disk create %s: --add %s:%s: %s already exists in the image", t->image,
                            e->src, e->dest, e->dest);
        goto out;
    }
    rc = copy_node(t, d, AT_FDCWD, e->src, e->src, last, e->mode, e->uid, e->gid, err);
out:
    free(path);
    return rc;
}

void disk_tree_free(struct disk_tree *t)
{
    if (!t)
        return;
    for (struct ddir *d = t->all, *next; d; d = next) {
        next = d->next;
        for (size_t i = 0; i < d->n; i++)
            free(d->ents[i].name);
        free(d->ents);
        free(d);
    }
    free(t->hl);
    free(t->buf);
    free(t->xattr_first);
    free(t);
}
