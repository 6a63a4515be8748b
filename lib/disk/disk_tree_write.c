/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The end of seeding: every directory made or changed is laid out in blocks ("." and ".." first,
 * entries never straddling a block, each block ending with the metadata_csum tail) and written
 * once through ext2fs_write_dir_block4, then its inode; then the link counts of hard links.
 * Uses disk_tree.c's builder (the structures in disk_int.h); disk_tree.c does not use this file.
 */
#include "disk_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The path of directory d inside the image, for messages ("/" for the root; only on error
 * paths: found by walking up through the parents' entries). */
static void dir_path(const struct disk_tree *t, const struct ddir *d, char *out, size_t n)
{
    char buf[1024];
    size_t len = 0; /* the path is built backwards at the end of buf */
    buf[sizeof(buf) - 1] = 0;
    for (int depth = 0; d && d->ino != EXT2_ROOT_INO && depth < 256; depth++) {
        const struct ddir *p = t->all;
        while (p && p->ino != d->parent)
            p = p->next;
        const char *nm = NULL;
        for (size_t i = 0; p && i < p->n && !nm; i++)
            if (p->ents[i].ino == d->ino)
                nm = p->ents[i].name;
        size_t k = nm ? strlen(nm) : 0;
        if (!nm || len + k + 2 >= sizeof(buf))
            break;
        memcpy(buf + sizeof(buf) - 1 - len - k, nm, k);
        buf[sizeof(buf) - 2 - len - k] = '/';
        len += k + 1;
        d = p;
    }
    snprintf(out, n, "%s", len ? buf + sizeof(buf) - 1 - len : "/");
}

static const char *dir_where(const struct disk_tree *t, const struct ddir *d, char *out, size_t n)
{
    char dp[1024];
    dir_path(t, d, dp, sizeof(dp));
    snprintf(out, n, "directory %s", dp);
    return out;
}

/* Lay out d's entries ("." and ".." first) in blocks and write them; then its inode. */
static int write_dir(struct disk_tree *t, struct ddir *d, uint8_t *blk, struct vmsnap_err *err)
{
    ext2_filsys fs = t->fs;
    const unsigned bs = fs->blocksize;
    const unsigned usable = bs - (unsigned)sizeof(struct ext2_dir_entry_tail);
    struct ext2_inode_large in;
    errcode_t e2;
    char where[1100]; /* filled only for an error (dir_path walks the tree) */
    if (d->is_new) {
        in = d->meta;
        disk_tree_init_extents(&in);
        e2 = ext2fs_write_inode_full(fs, d->ino, (struct ext2_inode *)&in, sizeof(in));
        if (e2)
            return disk_tree_e2err(t, e2, err, "writing", dir_where(t, d, where, sizeof(where)));
    }
    e2 = ext2fs_read_inode_full(fs, d->ino, (struct ext2_inode *)&in, sizeof(in));
    if (e2)
        return disk_tree_e2err(t, e2, err, "reading", dir_where(t, d, where, sizeof(where)));

    blk64_t lblk = 0;
    size_t i = 0; /* entry index; -2 and -1 are "." and ".." */
    size_t total = d->n + 2;
    while (i < total) {
        memset(blk, 0, bs);
        unsigned off = 0, last_off = 0;
        while (i < total) {
            const char *nm = i == 0 ? "." : i == 1 ? ".." : d->ents[i - 2].name;
            unsigned nl = (unsigned)strlen(nm);
            unsigned rec = EXT2_DIR_REC_LEN(nl);
            if (off + rec > usable)
                break;
            struct ext2_dir_entry *de = (struct ext2_dir_entry *)(blk + off);
            de->inode = i == 0 ? d->ino : i == 1 ? d->parent : d->ents[i - 2].ino;
            de->rec_len = (uint16_t)rec;
            ext2fs_dirent_set_name_len(de, (int)nl);
            ext2fs_dirent_set_file_type(de, i < 2 ? EXT2_FT_DIR : d->ents[i - 2].ftype);
            memcpy(de->name, nm, nl);
            last_off = off;
            off += rec;
            i++;
        }
        /* The last entry spans the rest of the block, up to the checksum tail. */
        ((struct ext2_dir_entry *)(blk + last_off))->rec_len = (uint16_t)(usable - last_off);
        ext2fs_initialize_dirent_tail(fs, (struct ext2_dir_entry_tail *)(blk + usable));
        blk64_t pblk = 0;
        e2 =
            ext2fs_bmap2(fs, d->ino, (struct ext2_inode *)&in, NULL, BMAP_ALLOC, lblk, NULL, &pblk);
        if (!e2)
            e2 = ext2fs_write_dir_block4(fs, pblk, blk, 0, d->ino);
        if (e2)
            return disk_tree_e2err(t, e2, err, "writing", dir_where(t, d, where, sizeof(where)));
        lblk++;
    }
    /* bmap wrote the 128-byte inode; re-read the full one and finish it. */
    e2 = ext2fs_read_inode_full(fs, d->ino, (struct ext2_inode *)&in, sizeof(in));
    if (e2)
        return disk_tree_e2err(t, e2, err, "reading", dir_where(t, d, where, sizeof(where)));
    if (d->has_meta) {
        in.i_mode = d->meta.i_mode;
        in.i_uid = d->meta.i_uid;
        in.i_gid = d->meta.i_gid;
        in.osd2.linux2.l_i_uid_high = d->meta.osd2.linux2.l_i_uid_high;
        in.osd2.linux2.l_i_gid_high = d->meta.osd2.linux2.l_i_gid_high;
        in.i_atime = d->meta.i_atime;
        in.i_mtime = d->meta.i_mtime;
        in.i_ctime = d->meta.i_ctime;
        in.i_atime_extra = d->meta.i_atime_extra;
        in.i_mtime_extra = d->meta.i_mtime_extra;
        in.i_ctime_extra = d->meta.i_ctime_extra;
        if (d->is_new) {
            in.i_crtime = d->meta.i_crtime;
            in.i_crtime_extra = d->meta.i_crtime_extra;
        }
    }
    uint32_t links = 2 + d->nsubdirs;
    in.i_links_count = (uint16_t)(links >= EXT2_LINK_MAX ? 1 : links);
    e2 = ext2fs_inode_size_set(fs, (struct ext2_inode *)&in, (ext2_off64_t)lblk * bs);
    if (!e2)
        e2 = ext2fs_write_inode_full(fs, d->ino, (struct ext2_inode *)&in, sizeof(in));
    if (e2)
        return disk_tree_e2err(t, e2, err, "writing", dir_where(t, d, where, sizeof(where)));
    return 0;
}

int disk_tree_finish(struct disk_tree *t, struct vmsnap_err *err)
{
    uint8_t *blk = malloc(t->fs->blocksize);
    if (!blk)
        return vmsnap_err_set(err, ENOMEM, "disk create %s: out of memory", t->image);
    int rc = 0;
    for (struct ddir *d = t->all; d && rc == 0; d = d->next)
        if (d->changed || d->is_new)
            rc = write_dir(t, d, blk, err);
    free(blk);
    if (rc == 0 && t->xattr_files)
        vlog(VMSNAP_LOG_WARN,
             "disk create %s: %llu source file%s extended attributes (file capabilities, "
             "security labels), which are not copied (the first: %s)",
             t->image, (unsigned long long)t->xattr_files, t->xattr_files == 1 ? " has" : "s have",
             t->xattr_first ? t->xattr_first : "?");
    for (size_t i = 0; i < t->hl_cap && rc == 0; i++) {
        struct hlink *h = &t->hl[i];
        if (!h->e2 || h->links < 2)
            continue;
        struct ext2_inode in;
        errcode_t e2 = ext2fs_read_inode(t->fs, h->e2, &in);
        if (!e2) {
            in.i_links_count = (uint16_t)VMSNAP_MIN(h->links, (uint32_t)EXT2_LINK_MAX);
            e2 = ext2fs_write_inode(t->fs, h->e2, &in);
        }
        if (e2)
            rc = disk_tree_e2err(t, e2, err, "updating link count of", "a hard-linked file");
    }
    return rc;
}
