/* SPDX-License-Identifier: Apache-2.0 */
/* File-level entry points of the codec: sources over fds and buffers, unpack, inspect. */
#include "image_int.h"
#include "sys/sys.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SEQ_CHUNK (1u << 20)

static int fd_pread(void *arg, void *buf, size_t len, uint64_t off, struct vmsnap_err *err)
{
    int fd = (int)(intptr_t)arg;
    ssize_t n = sys_pread_full(fd, buf, len, off);
    if (n < 0)
        return vmsnap_err_set(err, (int)-n, "read %zu bytes at offset %llu: %s", len,
                              (unsigned long long)off, strerror((int)-n));
    if ((size_t)n != len)
        return vmsnap_err_set(err, EBADMSG, "truncated: wanted %zu bytes at offset %llu, got %zd",
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
    uint8_t *buf = malloc(SEQ_CHUNK);
    if (!buf) {
        vmsnap_seqdec_free(sd);
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    }
    uint64_t done = 0;
    for (;;) {
        ssize_t n = off == UINT64_MAX ? read(fd, buf, SEQ_CHUNK)
                                      : pread(fd, buf, SEQ_CHUNK, (off_t)(off + done));
        if (n < 0) {
            if (errno == EINTR)
                continue;
            rc = vmsnap_err_set(err, errno, "read %s at byte %llu: %s", name,
                                (unsigned long long)done, strerror(errno));
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
    if (rc < 0 && err && strstr(err->msg, "write") && dst_name)
        vmsnap_err_wrap(err, "%s: ", dst_name);
    free(buf);
    vmsnap_seqdec_free(sd);
    return rc;
}

int vmsnap_image_unpack(const char *src, const char *dst, const struct vmsnap_unpack_opts *opts,
                        struct vmsnap_image_stats *stats, struct vmsnap_err *err)
{
    static const struct vmsnap_unpack_opts defaults;
    if (!opts)
        opts = &defaults;
    const uint64_t max_size = opts->max_size ? opts->max_size : VMSNAP_IMAGE_DEFAULT_MAX_SIZE;
    bool from_stdin = strcmp(src, "-") == 0;
    int fd = from_stdin ? STDIN_FILENO : open(src, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return vmsnap_err_set(err, errno, "open %s: %s", src, strerror(errno));
    const char *name = from_stdin ? "stdin" : src;
    struct vmsnap_image *img = NULL;
    uint64_t size = 0;
    int rc = 0;
    if (!from_stdin) {
        struct stat st;
        if (fstat(fd, &st) < 0) {
            rc = vmsnap_err_set(err, errno, "stat %s: %s", src, strerror(errno));
            goto out_src;
        }
        if (S_ISREG(st.st_mode)) {
            size = (uint64_t)st.st_size;
            struct vmsnap_source s;
            vmsnap_source_fd(&s, fd, size, name);
            if ((rc = vmsnap_image_open(&s, max_size, &img, err)) < 0)
                goto out_src;
        }
    }

    struct sys_atomic_file af;
    if ((rc = sys_atomic_open(&af, dst, 0600, err)) < 0)
        goto out_src;
    if (img) {
        struct vmsnap_source s;
        vmsnap_source_fd(&s, fd, size, name);
        rc = vmsnap_image_decode_parallel(img, &s, af.fd, opts, stats, err);
        if (rc < 0 && err && strstr(err->msg, "write"))
            vmsnap_err_wrap(err, "%s: ", dst);
    } else {
        rc = decode_sequential(fd, from_stdin ? UINT64_MAX : 0, af.fd, max_size, name, dst, opts,
                               size, stats, err);
    }
    if (rc < 0)
        sys_atomic_abort(&af);
    else
        rc = sys_atomic_commit(&af, opts->fsync, err);
out_src:
    vmsnap_image_free(img);
    if (!from_stdin)
        close(fd);
    return rc;
}

int vmsnap_image_inspect(const char *src, bool verify, unsigned threads,
                         struct vmsnap_image_stats *stats, struct vmsnap_err *err)
{
    bool from_stdin = strcmp(src, "-") == 0;
    int fd = from_stdin ? STDIN_FILENO : open(src, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return vmsnap_err_set(err, errno, "open %s: %s", src, strerror(errno));
    const char *name = from_stdin ? "stdin" : src;
    struct vmsnap_image *img = NULL;
    int rc = 0;
    uint64_t size = 0;
    if (!from_stdin) {
        struct stat st;
        if (fstat(fd, &st) < 0) {
            rc = vmsnap_err_set(err, errno, "stat %s: %s", src, strerror(errno));
            goto out;
        }
        size = (uint64_t)st.st_size;
        struct vmsnap_source s;
        vmsnap_source_fd(&s, fd, size, name);
        if (S_ISREG(st.st_mode) &&
            (rc = vmsnap_image_open(&s, VMSNAP_IMAGE_DEFAULT_MAX_SIZE, &img, err)) < 0)
            goto out;
    }
    if (img) {
        if (verify) {
            struct vmsnap_source s;
            vmsnap_source_fd(&s, fd, size, name);
            struct vmsnap_unpack_opts o = {.threads = threads};
            rc = vmsnap_image_decode_parallel(img, &s, -1, &o, stats, err);
        } else if (stats) {
            vmsnap_image_get_stats(img, stats);
        }
    } else {
        rc = decode_sequential(fd, from_stdin ? UINT64_MAX : 0, -1, VMSNAP_IMAGE_DEFAULT_MAX_SIZE,
                               name, NULL, NULL, size, stats, err);
    }
out:
    vmsnap_image_free(img);
    if (!from_stdin)
        close(fd);
    return rc < 0 ? rc : 0;
}
