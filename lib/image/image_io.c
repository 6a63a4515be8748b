/* SPDX-License-Identifier: Apache-2.0 */
/* File-level entry points of the codec: sources over fds and buffers, unpack, inspect. */
#include "image_int.h"
#include "sys/sys.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#define SEQ_CHUNK (1u << 20)

enum vmsnap_image_magic vmsnap_image_sniff(const void *buf, size_t len)
{
    const uint8_t *h = buf;
    if (len >= IMG_MAGIC_LEN && !memcmp(h, IMG_MAGIC, IMG_MAGIC_LEN))
        return VMSNAP_IMAGE_MAGIC_IMAGE;
    if (len < 4)
        return VMSNAP_IMAGE_MAGIC_NONE;
    uint32_t m = (uint32_t)h[0] | (uint32_t)h[1] << 8 | (uint32_t)h[2] << 16 | (uint32_t)h[3] << 24;
    return m == ZSTD_MAGICNUMBER || (m & ZSTD_MAGIC_SKIPPABLE_MASK) == ZSTD_MAGIC_SKIPPABLE_START
               ? VMSNAP_IMAGE_MAGIC_ZSTD
               : VMSNAP_IMAGE_MAGIC_NONE;
}

static int fd_pread(void *arg, void *buf, size_t len, uint64_t off, struct vmsnap_err *err)
{
    int fd = (int)(intptr_t)arg;
    ssize_t n = sys_pread_full(fd, buf, len, off);
    if (n < 0)
        return err_code(err, (int)-n, "read %zu bytes at offset %llu", len,
                        (unsigned long long)off);
    if ((size_t)n != len)
        return vmsnap_err_set(err, EBADMSG,
                              "truncated (did it shrink while read?): wanted %zu bytes at offset "
                              "%llu, got %zd",
                              len, (unsigned long long)off, n);
    return 0;
}

void vmsnap_source_fd(struct vmsnap_source *src, int fd, uint64_t size, const char *name)
{
    src->pread = fd_pread;
    src->arg = (void *)(intptr_t)fd;
    src->size = size;
    src->name = name;
}

int img_source_fd(const struct vmsnap_source *src)
{
    return src->pread == fd_pread ? (int)(intptr_t)src->arg : -1;
}

static int mem_pread(void *arg, void *buf, size_t len, uint64_t off, struct vmsnap_err *err)
{
    const struct vmsnap_membuf *mb = arg;
    if (off > mb->len || len > mb->len - off)
        return vmsnap_err_set(err, EINVAL, "read of %zu bytes at %llu outside a %zu-byte buffer",
                              len, (unsigned long long)off, mb->len);
    memcpy(buf, mb->data + off, len);
    return 0;
}

void vmsnap_source_mem(struct vmsnap_source *src, struct vmsnap_membuf *mb, const char *name)
{
    src->pread = mem_pread;
    src->arg = mb;
    src->size = mb->len;
    src->name = name;
}

/* Stream fd through the sequential decoder from `off` (reads until EOF). */
static int decode_sequential(int fd, uint64_t off, int dst_fd, uint64_t max_size, const char *name,
                             const char *dst_name, const struct vmsnap_unpack_opts *opts,
                             uint64_t total, struct vmsnap_image_stats *stats,
                             struct vmsnap_err *err)
{
    struct vmsnap_seqdec *sd = NULL;
    int rc = vmsnap_seqdec_new(dst_fd, max_size, name, &sd, err);
    if (rc < 0)
        return rc;
    vmsnap_seqdec_set_dst(sd, dst_name);
    vmsnap_seqdec_set_overlay(sd, opts && opts->overlay);
    uint8_t *buf = malloc(SEQ_CHUNK);
    if (!buf) {
        vmsnap_seqdec_free(sd);
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    }
    uint64_t done = 0;
    for (;;) {
        /* a pipe may block: wait for it in steps, so that a cancel is seen */
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        while (off == UINT64_MAX && !vmsnap_cancelled() && poll(&pfd, 1, 200) == 0)
            ;
        if ((rc = cancel_check(err)) < 0)
            break;
        ssize_t n = off == UINT64_MAX ? read(fd, buf, SEQ_CHUNK)
                                      : pread(fd, buf, SEQ_CHUNK, (off_t)(off + done));
        if (n < 0) {
            if (errno == EINTR)
                continue;
            rc = err_sys(err, "read %s at byte %llu", name, (unsigned long long)done);
            break;
        }
        if (n == 0)
            break;
        done += (uint64_t)n;
        if ((rc = vmsnap_seqdec_feed(sd, buf, (size_t)n, err)) < 0)
            break;
        if (opts && opts->progress)
            opts->progress(opts->progress_arg, done, total ? total : done);
    }
    if (rc == 0)
        rc = vmsnap_seqdec_finish(sd, stats, err);
    free(buf);
    vmsnap_seqdec_free(sd);
    return rc;
}

/* An input object: a file (its seek table read when it has one) or stdin. */
struct input {
    int fd;
    bool is_stdin;
    bool stream; /* read in order (stdin, a pipe, a socket): no pread */
    const char *name;
    uint64_t size; /* 0 for stdin and non-regular files */
    struct vmsnap_image *img;
};

static int input_open(struct input *in, const char *src, uint64_t max_size, struct vmsnap_err *err)
{
    *in = (struct input){.is_stdin = strcmp(src, "-") == 0};
    in->name = in->is_stdin ? "stdin" : src;
    in->fd = in->is_stdin ? STDIN_FILENO : open(src, O_RDONLY | O_CLOEXEC);
    if (in->fd < 0)
        return err_sys(err, "open %s", src);
    in->stream = in->is_stdin;
    if (in->is_stdin)
        return 0;
    struct stat st;
    if (fstat(in->fd, &st) < 0) {
        int rc = err_sys(err, "stat %s", src);
        close(in->fd);
        return rc;
    }
    if (!S_ISREG(st.st_mode)) {
        /* a FIFO or socket path (`unpack <(cmd) out`) is a stream; a block device reads at
         * offsets */
        in->stream = !S_ISBLK(st.st_mode);
        return 0;
    }
    in->size = (uint64_t)st.st_size;
    struct vmsnap_source s;
    vmsnap_source_fd(&s, in->fd, in->size, in->name);
    int rc = vmsnap_image_open(&s, max_size, &in->img, err);
    if (rc < 0)
        close(in->fd);
    return rc < 0 ? rc : 0;
}

static void input_close(struct input *in)
{
    vmsnap_image_free(in->img);
    if (!in->is_stdin)
        close(in->fd);
}

/* Decode `in` into dst_fd (-1: verify only): in parallel with a seek table, else sequentially. */
static int input_decode(struct input *in, int dst_fd, const char *dst_name, uint64_t max_size,
                        const struct vmsnap_unpack_opts *opts, struct vmsnap_image_stats *stats,
                        struct vmsnap_err *err)
{
    if (!in->img)
        return decode_sequential(in->fd, in->stream ? UINT64_MAX : 0, dst_fd, max_size, in->name,
                                 dst_name, opts, in->size, stats, err);
    struct vmsnap_source s;
    vmsnap_source_fd(&s, in->fd, in->size, in->name);
    struct vmsnap_unpack_opts o = {0};
    if (opts)
        o = *opts;
    o.dst_name = dst_name;
    return vmsnap_image_decode_parallel(in->img, &s, dst_fd, &o, stats, err);
}

/* Overlay: the layer applied to `dst` in place (created when missing), fsynced when asked. */
static int unpack_overlay(struct input *in, const char *dst, uint64_t max_size,
                          const struct vmsnap_unpack_opts *opts, struct vmsnap_image_stats *stats,
                          struct vmsnap_err *err)
{
    int fd = open(dst, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0)
        return err_sys(err, "open %s", dst);
    struct stat st;
    int rc = 0;
    if (fstat(fd, &st) < 0)
        rc = err_sys(err, "stat %s", dst);
    else if (!S_ISREG(st.st_mode))
        rc = vmsnap_err_set(err, EINVAL, "%s: not a regular file (a layer is applied to a file)",
                            dst);
    if (rc == 0)
        rc = input_decode(in, fd, dst, max_size, opts, stats, err);
    if (rc == 0 && opts->fsync && fsync(fd) < 0)
        rc = err_sys(err, "fsync %s", dst);
    if (close(fd) < 0 && rc == 0)
        rc = err_sys(err, "close %s", dst);
    return rc;
}

int vmsnap_image_unpack(const char *src, const char *dst, const struct vmsnap_unpack_opts *opts,
                        struct vmsnap_image_stats *stats, struct vmsnap_err *err)
{
    static const struct vmsnap_unpack_opts defaults;
    if (!opts)
        opts = &defaults;
    const uint64_t max_size = opts->max_size ? opts->max_size : VMSNAP_IMAGE_DEFAULT_MAX_SIZE;
    struct input in;
    int rc = input_open(&in, src, max_size, err);
    if (rc < 0)
        return rc;
    struct sys_atomic_file af;
    if (sys_same_file(in.fd, dst))
        rc = vmsnap_err_set(err, EINVAL, "%s: the destination is the source", dst);
    else if (opts->overlay)
        rc = unpack_overlay(&in, dst, max_size, opts, stats, err);
    else if ((rc = sys_atomic_open(&af, dst, 0600, err)) == 0) {
        rc = input_decode(&in, af.fd, dst, max_size, opts, stats, err);
        if (rc < 0)
            sys_atomic_abort(&af);
        else
            rc = sys_atomic_commit(&af, opts->fsync, err);
    }
    input_close(&in);
    return rc;
}

int vmsnap_image_inspect(const char *src, bool verify, unsigned threads, uint64_t max_size,
                         struct vmsnap_image_stats *stats, struct vmsnap_err *err)
{
    struct input in;
    if (!max_size)
        max_size = VMSNAP_IMAGE_DEFAULT_MAX_SIZE;
    int rc = input_open(&in, src, max_size, err);
    if (rc < 0)
        return rc;
    if (in.img && !verify) {
        if (stats)
            vmsnap_image_get_stats(in.img, stats);
    } else {
        struct vmsnap_unpack_opts o = {.threads = threads};
        rc = input_decode(&in, -1, NULL, max_size, &o, stats, err);
    }
    input_close(&in);
    return rc < 0 ? rc : 0;
}
