/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Disk module through its API (no root needed): UUID parsing; create's geometry, label, UUID
 * and sparseness at 4 and 64 GiB; a file bigger than the write-back cache (the early-flush
 * path) read back byte for byte by debugfs; a sparse source stays sparse; error codes leave
 * nothing behind; set_uuid; clone keeps bytes and allocation. e2fsck -fn checks every image.
 */
#include "t.h"
#include "vmsnap/disk.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static bool fsck_clean(const char *img)
{
    return t_sh("e2fsck -fn '%s' >/dev/null 2>&1", img) == 0;
}

static void test_uuid_parse(void)
{
    uint8_t u[16];
    CHECK(vmsnap_disk_parse_uuid("0123abcd-4567-89ef-ABCD-0123456789ab", u) == 0);
    CHECK(u[0] == 0x01 && u[3] == 0xcd && u[10] == 0x01 && u[15] == 0xab);
    CHECK(vmsnap_disk_parse_uuid("0123abcd-4567-89ef-ABCD-0123456789a", u) == -EINVAL);
    CHECK(vmsnap_disk_parse_uuid("0123abcd+4567-89ef-ABCD-0123456789ab", u) == -EINVAL);
    CHECK(vmsnap_disk_parse_uuid("0123abcd-4567-89ef-ABCD-0123456789ag", u) == -EINVAL);
}

static void test_create_empty(void)
{
    const uint8_t uuid[16] = {0xde, 0xad, 0xbe, 0xef, 1, 2, 0x43, 4, 0x85, 6, 7, 8, 9, 10, 11, 12};
    struct vmsnap_disk_create_opts o = {.size = 4ull << 30, .label = "upper", .uuid = uuid};
    struct vmsnap_err err = {0};
    const char *img = t_path("e4.img");
    REQUIRE(vmsnap_disk_create(img, &o, &err) == 0);
    CHECK(fsck_clean(img));
    struct vmsnap_disk_info in;
    REQUIRE(vmsnap_disk_info(img, &in, &err) == 0);
    CHECK(in.virtual_size == 4ull << 30);
    CHECK(in.allocated < 256 * 1024); /* inode tables are holes */
    CHECK(in.block_size == 4096 && in.blocks_total == (4ull << 30) / 4096);
    CHECK(in.inodes_total == (4ull << 30) / 16384);
    CHECK(in.inodes_total - in.inodes_free == 11);
    CHECK(memcmp(in.uuid, uuid, 16) == 0);
    CHECK(strcmp(in.uuid_str, "deadbeef-0102-4304-8506-0708090a0b0c") == 0);
    CHECK(strcmp(in.label, "upper") == 0);
    CHECK(in.clean && in.has_csum_seed);
    CHECK(strstr(in.features, "metadata_csum_seed") && !strstr(in.features, "has_journal") &&
          !strstr(in.features, "resize_inode"));

    /* 64 GiB virtual costs under 2 MiB. */
    o = (struct vmsnap_disk_create_opts){.size = 64ull << 30};
    img = t_path("e64.img");
    REQUIRE(vmsnap_disk_create(img, &o, &err) == 0);
    CHECK(fsck_clean(img));
    CHECKF(t_allocated(img) < (2u << 20), "64 GiB image allocates %llu bytes",
           (unsigned long long)t_allocated(img));

    /* Existing destination: -EEXIST, untouched; --force replaces. */
    o = (struct vmsnap_disk_create_opts){.size = 8u << 20};
    CHECK(vmsnap_disk_create(img, &o, &err) == -EEXIST);
    CHECK(strstr(err.msg, img) && strstr(err.msg, "force"));
    struct stat st;
    CHECK(stat(img, &st) == 0 && st.st_size == (off_t)(64ull << 30));
    o.force = true;
    CHECK(vmsnap_disk_create(img, &o, &err) == 0);
    CHECK(stat(img, &st) == 0 && st.st_size == (off_t)(8u << 20));
    CHECK(vmsnap_disk_create(t_path("tiny.img"), &(struct vmsnap_disk_create_opts){.size = 4096},
                             &err) == -EINVAL);
    CHECK(!t_exists(t_path("tiny.img")));
}

/* Write `len` bytes of a deterministic pattern at `off` of the file at `path`. */
static void write_pattern(const char *path, uint64_t off, size_t len, uint64_t seed)
{
    int fd = open(path, O_WRONLY | O_CREAT, 0644);
    REQUIRE(fd >= 0);
    uint8_t buf[65536];
    while (len) {
        size_t n = len < sizeof(buf) ? len : sizeof(buf);
        for (size_t i = 0; i < n; i += 8) {
            uint64_t r = t_rand(&seed);
            memcpy(buf + i, &r, n - i < 8 ? n - i : 8);
        }
        REQUIRE(pwrite(fd, buf, n, (off_t)off) == (ssize_t)n);
        off += n;
        len -= n;
    }
    close(fd);
}

static void test_big_and_sparse_files(void)
{
    /* 96 MiB of data: more than the 64 MiB write-back cache, so it flushes early and then
     * works on a file that is no longer "fresh". */
    const char *big = t_path("big");
    write_pattern(big, 0, 96u << 20, 7);
    /* 64 MiB sparse: 1 MiB of data at 0, 8 KiB at 40 MiB, a hole to the end. */
    const char *sparse = t_path("sparse");
    write_pattern(sparse, 0, 1u << 20, 8);
    write_pattern(sparse, 40u << 20, 8192, 9);
    REQUIRE(truncate(sparse, 64u << 20) == 0);
    struct vmsnap_disk_entry ents[] = {
        {.op = VMSNAP_DISK_ADD, .src = big, .dest = "/data/big", .mode = -1, .uid = -1, .gid = -1},
        {.op = VMSNAP_DISK_ADD, .src = sparse, .dest = "/sparse", .mode = 0600, .uid = 5, .gid = 6},
        {.op = VMSNAP_DISK_MKDIR, .dest = "/data/empty", .mode = -1, .uid = -1, .gid = -1},
    };
    struct vmsnap_disk_create_opts o = {.size = 1ull << 30, .entries = ents, .n_entries = 3};
    struct vmsnap_err err = {0};
    const char *img = t_path("files.img");
    REQUIRE(vmsnap_disk_create(img, &o, &err) == 0);
    CHECK(fsck_clean(img));
    /* Allocation: the data, not the sparse file's virtual size. */
    uint64_t a = t_allocated(img);
    CHECKF(a < (96u << 20) + (1u << 20) + (2u << 20), "image allocates %llu bytes",
           (unsigned long long)a);
    CHECK(t_sh("debugfs -R 'dump /data/big %s' '%s' >/dev/null 2>&1", t_path("big.out"), img) == 0);
    CHECK(t_files_equal(big, t_path("big.out")));
    CHECK(t_sh("debugfs -R 'dump /sparse %s' '%s' >/dev/null 2>&1", t_path("sparse.out"), img) ==
          0);
    CHECK(t_files_equal(sparse, t_path("sparse.out")));
    /* In the image the sparse file holds only its 1 MiB + 8 KiB of data: debugfs reports the
     * inode's block count (in 512-byte sectors). */
    CHECK(t_sh("debugfs -R 'stat /sparse' '%s' 2>/dev/null | grep -q 'Blockcount: %u$'", img,
               ((1u << 20) + 8192) / 512) == 0);
    CHECK(t_sh("debugfs -R 'stat /sparse' '%s' 2>/dev/null | grep -q 'User: *5 *Group: *6'", img) ==
          0);

    /* Out of space: nothing at the destination. */
    o.size = 32u << 20;
    const char *small = t_path("small.img");
    CHECK(vmsnap_disk_create(small, &o, &err) == -ENOSPC);
    CHECK(strstr(err.msg, "out of space") && strstr(err.msg, big));
    CHECK(!t_exists(small));
    /* Missing source: -ENOENT naming it, nothing created. */
    ents[0].src = t_path("nope");
    o.size = 1ull << 30;
    CHECK(vmsnap_disk_create(small, &o, &err) == -ENOENT);
    CHECK(strstr(err.msg, "nope") != NULL);
    CHECK(!t_exists(small));
}

static void test_uuid_and_clone(void)
{
    struct vmsnap_err err = {0};
    const char *src = t_path("files.img");
    if (!t_exists(src))
        return;
    struct vmsnap_disk_info a, b;
    REQUIRE(vmsnap_disk_info(src, &a, &err) == 0);

    enum vmsnap_disk_clone_how how;
    const char *dst = t_path("clone.img");
    struct vmsnap_disk_clone_opts co = {0};
    REQUIRE(vmsnap_disk_clone(src, dst, &co, &how, &err) == 0);
    CHECK(how == VMSNAP_DISK_CLONE_FICLONE || how == VMSNAP_DISK_CLONE_EXTENTS);
    CHECK(t_files_equal(src, dst));
    if (how == VMSNAP_DISK_CLONE_EXTENTS) {
        uint64_t x = t_allocated(src), y = t_allocated(dst);
        CHECKF(y <= x + 65536 && y + 65536 >= x, "clone allocates %llu, source %llu",
               (unsigned long long)y, (unsigned long long)x);
    }
    CHECK(vmsnap_disk_clone(src, dst, &co, &how, &err) == -EEXIST);

    const uint8_t nu[16] = {1, 2, 3, 4, 5, 6, 0x47, 8, 0x89, 10, 11, 12, 13, 14, 15, 16};
    CHECK(vmsnap_disk_set_uuid(dst, nu, false, &err) == 0);
    REQUIRE(vmsnap_disk_info(dst, &b, &err) == 0);
    CHECK(memcmp(b.uuid, nu, 16) == 0);
    CHECK(fsck_clean(dst));
    /* The source is untouched. */
    struct vmsnap_disk_info a2;
    REQUIRE(vmsnap_disk_info(src, &a2, &err) == 0);
    CHECK(memcmp(a.uuid, a2.uuid, 16) == 0);
    /* Backup superblocks carry the new UUID too (e2fsck from a backup would see it). */
    CHECK(t_sh("dumpe2fs -o superblock=32768 -o blocksize=4096 -h '%s' 2>/dev/null | "
               "grep -q 01020304-0506-4708-890a-0b0c0d0e0f10",
               dst) == 0);

    /* Not an ext4 image: a clear error. */
    CHECK(vmsnap_disk_set_uuid(t_path("big"), NULL, true, &err) == -EINVAL);
    CHECK(strstr(err.msg, "not an ext2/3/4") != NULL);
    CHECK(vmsnap_disk_clone(t_path("none"), t_path("c2.img"), &co, &how, &err) == -ENOENT);
    co.link = co.new_uuid = true;
    CHECK(vmsnap_disk_clone(src, t_path("c2.img"), &co, &how, &err) == -EINVAL);
    CHECK(!t_exists(t_path("c2.img")));
}

/* The library refuses what the CLI refuses as usage (callers other than the CLI). */
static void test_create_limits(void)
{
    struct vmsnap_err err = {0};
    const char *p = t_path("lim.img");
    struct vmsnap_disk_create_opts o = {.size = 1024};
    CHECK(vmsnap_disk_create(p, &o, &err) == -EINVAL && strstr(err.msg, "too small"));
    o.size = VMSNAP_DISK_MAX_SIZE + 4096;
    CHECK(vmsnap_disk_create(p, &o, &err) == -EFBIG && strstr(err.msg, "too large"));
    o = (struct vmsnap_disk_create_opts){.size = VMSNAP_DISK_MIN_SIZE,
                                         .label = "12345678901234567"};
    CHECK(vmsnap_disk_create(p, &o, &err) == -EINVAL && strstr(err.msg, "longer than 16"));
    CHECK(!t_exists(p));
    o.label = "1234567890123456";
    CHECK(vmsnap_disk_create(p, &o, &err) == 0 && fsck_clean(p));
}

int main(void)
{
    if (t_sh("command -v e2fsck >/dev/null && command -v debugfs >/dev/null") != 0)
        t_skip("e2fsprogs (e2fsck, debugfs) not installed");
    test_uuid_parse();
    test_create_empty();
    test_big_and_sparse_files();
    test_uuid_and_clone();
    test_create_limits();
    return t_done();
}
