/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Helpers every file of the disk module may use and that use none of them: libext2fs error codes
 * mapped to an errno and a message, and random/formatted UUIDs. The module's files depend one way:
 * disk_ext2.c, disk_io.c <- disk_tree.c <- disk_tree_write.c <- disk.c <- disk_clone.c.
 */
#include "disk_int.h"

#include <errno.h>
#include <et/com_err.h>
#include <ext2fs/ext2_err.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>

int disk_ext2_errno(errcode_t code)
{
    if (code > 0 && code < 4096)
        return (int)code; /* libext2fs passes system errors through as errno values */
    switch (code) {
    case EXT2_ET_BLOCK_ALLOC_FAIL:
    case EXT2_ET_INODE_ALLOC_FAIL:
    case EXT2_ET_DIR_NO_SPACE:
    case EXT2_ET_TOOSMALL:
    case EXT2_ET_RES_GDT_BLOCKS:
        return ENOSPC;
    case EXT2_ET_NO_MEMORY:
        return ENOMEM;
    case EXT2_ET_FILE_EXISTS:
    case EXT2_ET_DIR_EXISTS:
        return EEXIST;
    case EXT2_ET_FILE_NOT_FOUND:
        return ENOENT;
    case EXT2_ET_BAD_MAGIC:
    case EXT2_ET_UNSUPP_FEATURE:
    case EXT2_ET_RO_UNSUPP_FEATURE:
    case EXT2_ET_CORRUPT_SUPERBLOCK:
    case EXT2_ET_SB_CSUM_INVALID:
    case EXT2_ET_UNKNOWN_CSUM:
    case EXT2_ET_BAD_DESC_SIZE:
    case EXT2_ET_GDESC_BAD_BLOCK_MAP:
    case EXT2_ET_GDESC_BAD_INODE_MAP:
    case EXT2_ET_GDESC_BAD_INODE_TABLE:
    case EXT2_ET_INVALID_ARGUMENT:
        return EINVAL;
    default:
        return EIO;
    }
}

const char *disk_ext2_strerror(errcode_t code)
{
    static _Thread_local char buf[160];
    if (code > 0 && code < 4096)
        return strerror((int)code);
    switch (code) {
    case EXT2_ET_BLOCK_ALLOC_FAIL:
        return "no free blocks";
    case EXT2_ET_INODE_ALLOC_FAIL:
        return "no free inodes";
    case EXT2_ET_DIR_NO_SPACE:
        return "no space in directory";
    case EXT2_ET_TOOSMALL:
        return "filesystem too small";
    case EXT2_ET_NO_MEMORY:
        return "out of memory";
    case EXT2_ET_FILE_EXISTS:
        return "file exists";
    case EXT2_ET_FILE_NOT_FOUND:
        return "file not found";
    case EXT2_ET_BAD_MAGIC:
        return "not an ext2/3/4 filesystem (bad superblock magic)";
    case EXT2_ET_UNSUPP_FEATURE:
    case EXT2_ET_RO_UNSUPP_FEATURE:
        return "filesystem has features libext2fs does not support";
    case EXT2_ET_CORRUPT_SUPERBLOCK:
        return "corrupt superblock";
    case EXT2_ET_SB_CSUM_INVALID:
        return "superblock checksum does not match";
    case EXT2_ET_UNKNOWN_CSUM:
        return "unknown checksum algorithm";
    case EXT2_ET_SHORT_READ:
        return "short read (image truncated?)";
    case EXT2_ET_SHORT_WRITE:
        return "short write";
    case EXT2_ET_INVALID_ARGUMENT:
        return "invalid argument";
    default: {
        /* libext2fs's own text for the rest (its com_err table, registered once) */
        static pthread_once_t once = PTHREAD_ONCE_INIT;
        pthread_once(&once, initialize_ext2_error_table);
        snprintf(buf, sizeof(buf), "%s (libext2fs error %ld)", error_message(code), (long)code);
        return buf;
    }
    }
}

int disk_random_uuid(uint8_t uuid[16])
{
    size_t got = 0;
    while (got < 16) {
        ssize_t n = getrandom(uuid + got, 16 - got, 0);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        got += (size_t)n;
    }
    uuid[6] = (uint8_t)((uuid[6] & 0x0f) | 0x40); /* version 4 */
    uuid[8] = (uint8_t)((uuid[8] & 0x3f) | 0x80); /* RFC 4122 variant */
    return 0;
}

void disk_format_uuid(const uint8_t u[16], char *buf)
{
    snprintf(buf, 37, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0],
             u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13],
             u[14], u[15]);
}
