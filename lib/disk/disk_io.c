/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A write-back libext2fs io manager for building images.
 *
 * libext2fs's unix io manager writes through an 8-block cache, so building an image costs one
 * pwrite per metadata block (and a read before each inode table update). Here every write goes
 * into a page cache (4 KiB pages, whatever block size the channel uses at the moment, so the
 * 1 KiB superblock writes of ext2fs_flush need no special path) and reaches the file at flush:
 * pages sorted by offset, one pwritev per contiguous run. On a fresh sparse file ("fresh"
 * option) a page that was never written is known to read as zeros, so reads need no syscall and
 * all-zero pages (untouched inode tables, zeroed ranges) are never written: they stay holes.
 * The cache is bounded (DISK_IO_CACHE_MAX); past it everything is flushed and the fresh
 * shortcuts end, since the file then holds data.
 */
#include "disk_int.h"
#include "sys/sys.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#define PAGE 4096u
#define EMPTY UINT64_MAX

struct page_ent {
    uint64_t idx;  /* page index (offset / PAGE), EMPTY for a free slot */
    uint8_t *data; /* PAGE bytes, or NULL: known to be all zeros on disk and in the cache */
};

struct cio {
    int fd;
    bool fresh;
    struct page_ent *tab;
    size_t cap;    /* slots, a power of two */
    size_t used;   /* occupied slots */
    size_t npages; /* slots holding data */
    struct struct_io_stats stats;
};

static size_t slot_of(uint64_t idx, size_t cap)
{
    return (size_t)((idx * 0x9E3779B97F4A7C15ull) >> 17) & (cap - 1);
}

static struct page_ent *find(struct cio *c, uint64_t idx)
{
    if (!c->cap)
        return NULL;
    for (size_t i = slot_of(idx, c->cap);; i = (i + 1) & (c->cap - 1)) {
        if (c->tab[i].idx == idx)
            return &c->tab[i];
        if (c->tab[i].idx == EMPTY)
            return NULL;
    }
}

static int grow(struct cio *c)
{
    size_t ncap = c->cap ? c->cap * 2 : 1024;
    struct page_ent *nt = malloc(ncap * sizeof(*nt));
    if (!nt)
        return ENOMEM;
    for (size_t i = 0; i < ncap; i++)
        nt[i] = (struct page_ent){EMPTY, NULL};
    for (size_t i = 0; i < c->cap; i++) {
        if (c->tab[i].idx == EMPTY)
            continue;
        size_t j = slot_of(c->tab[i].idx, ncap);
        while (nt[j].idx != EMPTY)
            j = (j + 1) & (ncap - 1);
        nt[j] = c->tab[i];
    }
    free(c->tab);
    c->tab = nt;
    c->cap = ncap;
    return 0;
}

static int insert(struct cio *c, uint64_t idx, struct page_ent **out)
{
    struct page_ent *e = find(c, idx);
    if (!e) {
        if ((c->used + 1) * 10 > c->cap * 7) {
            int rc = grow(c);
            if (rc)
                return rc;
        }
        size_t i = slot_of(idx, c->cap);
        while (c->tab[i].idx != EMPTY)
            i = (i + 1) & (c->cap - 1);
        e = &c->tab[i];
        e->idx = idx;
        e->data = NULL;
        c->used++;
    }
    *out = e;
    return 0;
}

static bool all_zero(const uint8_t *p, size_t n)
{
    static const uint8_t zeros[PAGE];
    return memcmp(p, zeros, n) == 0;
}

/* Read page `idx` from the file into buf (zeros past the end of the file). */
static errcode_t read_page_disk(struct cio *c, uint64_t idx, uint8_t *buf)
{
    ssize_t n = sys_pread_full(c->fd, buf, PAGE, idx * PAGE);
    if (n < 0)
        return (errcode_t)-n;
    if ((size_t)n < PAGE)
        memset(buf + n, 0, PAGE - (size_t)n);
    c->stats.bytes_read += (uint64_t)n;
    return 0;
}

/* The cached data of page idx, loading (or zero-filling) it on first use. */
static errcode_t page_for_write(struct cio *c, uint64_t idx, bool whole, uint8_t **out)
{
    struct page_ent *e = find(c, idx);
    if (e && e->data) {
        *out = e->data;
        return 0;
    }
    bool known_zero = e != NULL; /* a slot without data is a page known to be zeros */
    if (!e) {
        int rc = insert(c, idx, &e);
        if (rc)
            return rc;
    }
    uint8_t *p = malloc(PAGE);
    if (!p)
        return ENOMEM;
    if (!whole) {
        if (c->fresh || known_zero) {
            memset(p, 0, PAGE);
        } else {
            errcode_t r = read_page_disk(c, idx, p);
            if (r) {
                free(p);
                return r;
            }
        }
    }
    e->data = p;
    c->npages++;
    *out = p;
    return 0;
}

static void drop_all(struct cio *c)
{
    for (size_t i = 0; i < c->cap; i++) {
        free(c->tab[i].data);
        c->tab[i] = (struct page_ent){EMPTY, NULL};
    }
    c->used = 0;
    c->npages = 0;
}

static int cmp_ent(const void *a, const void *b)
{
    const struct page_ent *x = *(const struct page_ent *const *)a;
    const struct page_ent *y = *(const struct page_ent *const *)b;
    return x->idx < y->idx ? -1 : x->idx > y->idx;
}

static errcode_t write_run(struct cio *c, struct page_ent **run, size_t n)
{
    struct iovec iov[64];
    for (size_t i = 0; i < n;) {
        size_t k = VMSNAP_MIN(n - i, (size_t)64);
        for (size_t j = 0; j < k; j++) {
            iov[j].iov_base = run[i + j]->data;
            iov[j].iov_len = PAGE;
        }
        uint64_t off = run[i]->idx * PAGE;
        ssize_t w = pwritev(c->fd, iov, (int)k, (off_t)off);
        if (w < 0 && errno != EINTR)
            return errno;
        if (w != (ssize_t)(k * PAGE)) {
            /* Short write or interrupted: redo the pages one by one (idempotent). */
            for (size_t j = 0; j < k; j++) {
                int rc = sys_pwrite_full(c->fd, run[i + j]->data, PAGE, off + j * PAGE);
                if (rc < 0)
                    return -rc;
            }
        }
        c->stats.bytes_written += k * PAGE;
        i += k;
    }
    return 0;
}

/* Write every cached page in offset order and empty the cache. */
static errcode_t cio_flush_all(struct cio *c)
{
    if (!c->npages) {
        drop_all(c);
        return 0;
    }
    struct page_ent **v = malloc(c->npages * sizeof(*v));
    if (!v)
        return ENOMEM;
    size_t n = 0;
    for (size_t i = 0; i < c->cap; i++) {
        struct page_ent *e = &c->tab[i];
        if (e->idx == EMPTY || !e->data)
            continue;
        if (c->fresh && all_zero(e->data, PAGE))
            continue; /* a hole already reads as zeros */
        v[n++] = e;
    }
    qsort(v, n, sizeof(*v), cmp_ent);
    errcode_t rc = 0;
    for (size_t i = 0; i < n && !rc;) {
        size_t j = i + 1;
        while (j < n && v[j]->idx == v[j - 1]->idx + 1)
            j++;
        rc = write_run(c, v + i, j - i);
        i = j;
    }
    free(v);
    if (!rc) {
        if (n)
            c->fresh = false;
        drop_all(c);
    }
    return rc;
}

static errcode_t cio_read(io_channel ch, uint64_t off, size_t len, void *buf)
{
    struct cio *c = ch->private_data;
    uint8_t *out = buf;
    uint8_t tmp[PAGE];
    while (len) {
        uint64_t idx = off / PAGE;
        size_t in = (size_t)(off % PAGE);
        size_t n = VMSNAP_MIN(len, (size_t)PAGE - in);
        struct page_ent *e = find(c, idx);
        if (e && e->data)
            memcpy(out, e->data + in, n);
        else if (e || c->fresh)
            memset(out, 0, n);
        else {
            errcode_t rc = read_page_disk(c, idx, tmp);
            if (rc)
                return rc;
            memcpy(out, tmp + in, n);
        }
        out += n;
        off += n;
        len -= n;
    }
    return 0;
}

static errcode_t cio_write(io_channel ch, uint64_t off, size_t len, const void *buf)
{
    struct cio *c = ch->private_data;
    const uint8_t *in = buf;
    while (len) {
        uint64_t idx = off / PAGE;
        size_t at = (size_t)(off % PAGE);
        size_t n = VMSNAP_MIN(len, (size_t)PAGE - at);
        uint8_t *p;
        errcode_t rc = page_for_write(c, idx, n == PAGE, &p);
        if (rc)
            return rc;
        memcpy(p + at, in, n);
        in += n;
        off += n;
        len -= n;
    }
    if ((uint64_t)c->npages * PAGE > DISK_IO_CACHE_MAX)
        return cio_flush_all(c);
    return 0;
}

static size_t req_len(io_channel ch, int count)
{
    return count < 0 ? (size_t) - (int64_t)count : (size_t)count * (size_t)ch->block_size;
}

static errcode_t m_open(const char *name, int flags, io_channel *out)
{
    (void)flags;
    char *end;
    errno = 0;
    long fd = strtol(name, &end, 10);
    if (errno || *end || fd < 0 || fd > INT_MAX)
        return EXT2_ET_BAD_DEVICE_NAME;
    struct stat st;
    if (fstat((int)fd, &st) < 0)
        return errno;
    io_channel ch = calloc(1, sizeof(*ch));
    struct cio *c = calloc(1, sizeof(*c));
    char *nm = strdup(name);
    if (!ch || !c || !nm) {
        free(ch);
        free(c);
        free(nm);
        return ENOMEM;
    }
    c->fd = (int)fd;
    c->stats.num_fields = 2;
    ch->magic = EXT2_ET_MAGIC_IO_CHANNEL;
    ch->manager = disk_io_manager;
    ch->name = nm;
    ch->block_size = 1024;
    ch->refcount = 1;
    ch->private_data = c;
    *out = ch;
    return 0;
}

static errcode_t m_close(io_channel ch)
{
    if (--ch->refcount > 0)
        return 0;
    struct cio *c = ch->private_data;
    errcode_t rc = cio_flush_all(c);
    drop_all(c);
    free(c->tab);
    free(c);
    free(ch->name);
    free(ch);
    return rc;
}

static errcode_t m_set_blksize(io_channel ch, int blksize)
{
    if (blksize <= 0)
        return EXT2_ET_INVALID_ARGUMENT;
    ch->block_size = blksize; /* the cache works in bytes: nothing to flush */
    return 0;
}

static errcode_t m_read_blk64(io_channel ch, unsigned long long block, int count, void *data)
{
    return cio_read(ch, block * (uint64_t)ch->block_size, req_len(ch, count), data);
}

static errcode_t m_write_blk64(io_channel ch, unsigned long long block, int count, const void *data)
{
    return cio_write(ch, block * (uint64_t)ch->block_size, req_len(ch, count), data);
}

static errcode_t m_read_blk(io_channel ch, unsigned long block, int count, void *data)
{
    return m_read_blk64(ch, block, count, data);
}

static errcode_t m_write_blk(io_channel ch, unsigned long block, int count, const void *data)
{
    return m_write_blk64(ch, block, count, data);
}

static errcode_t m_write_byte(io_channel ch, unsigned long offset, int count, const void *data)
{
    if (count < 0)
        return EXT2_ET_INVALID_ARGUMENT;
    return cio_write(ch, offset, (size_t)count, data);
}

static errcode_t m_flush(io_channel ch)
{
    return cio_flush_all(ch->private_data);
}

static errcode_t m_set_option(io_channel ch, const char *option, const char *arg)
{
    (void)arg;
    struct cio *c = ch->private_data;
    if (strcmp(option, "fresh") == 0) {
        c->fresh = true;
        return 0;
    }
    return EXT2_ET_INVALID_ARGUMENT;
}

static errcode_t m_get_stats(io_channel ch, io_stats *stats)
{
    struct cio *c = ch->private_data;
    if (stats)
        *stats = &c->stats;
    return 0;
}

/* Zero a block range: cached pages become known-zero; on a non-fresh file the range is also
 * punched (or written with zeros where punching is not supported). */
static errcode_t m_zeroout(io_channel ch, unsigned long long block, unsigned long long count)
{
    struct cio *c = ch->private_data;
    uint64_t off = block * (uint64_t)ch->block_size;
    uint64_t len = count * (uint64_t)ch->block_size;
    if (off % PAGE || len % PAGE) {
        static const uint8_t zeros[PAGE];
        while (len) {
            size_t n = (size_t)VMSNAP_MIN(len, (uint64_t)PAGE - off % PAGE);
            errcode_t rc = cio_write(ch, off, n, zeros);
            if (rc)
                return rc;
            off += n;
            len -= n;
        }
        return 0;
    }
    for (uint64_t p = off / PAGE; p < (off + len) / PAGE; p++) {
        struct page_ent *e = find(c, p);
        if (e && e->data) {
            free(e->data);
            e->data = NULL;
            c->npages--;
        }
    }
    if (!c->fresh &&
        fallocate(c->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)off, (off_t)len) < 0)
        return errno;
    return 0;
}

static errcode_t m_discard(io_channel ch, unsigned long long block, unsigned long long count)
{
    return m_zeroout(ch, block, count);
}

static struct struct_io_manager manager = {
    .magic = EXT2_ET_MAGIC_IO_MANAGER,
    .name = "vmsnap write-back I/O manager",
    .open = m_open,
    .close = m_close,
    .set_blksize = m_set_blksize,
    .read_blk = m_read_blk,
    .write_blk = m_write_blk,
    .flush = m_flush,
    .write_byte = m_write_byte,
    .set_option = m_set_option,
    .get_stats = m_get_stats,
    .read_blk64 = m_read_blk64,
    .write_blk64 = m_write_blk64,
    .discard = m_discard,
    .zeroout = m_zeroout,
};

io_manager disk_io_manager = &manager;

uint64_t disk_io_bytes_written(io_channel ch)
{
    struct cio *c = ch->private_data;
    return c->stats.bytes_written;
}
