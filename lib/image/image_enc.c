/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Image encoder.
 *
 * The source is cut into fixed ranges of `frame_size` bytes. Worker threads take the next range,
 * walk its extents with SEEK_DATA/SEEK_HOLE, pread each extent straight into a content buffer
 * laid out as the decoded stream ({off, len} header then data), drop all-zero pages by compacting
 * the buffer in place (a zero page frees 4 KiB, enough for the 16-byte header of the run after
 * it, so the write pointer never overtakes the read pointer), and compress the buffer as one zstd
 * frame with pinned parameters. The calling thread writes finished frames in range order and
 * builds the seek table. Range boundaries depend only on frame_size, so the output is the same
 * for every thread count.
 *
 * Memory: each worker owns one content buffer (<= frame_size + headers) and a window of
 * threads + 1 compressed frames waits for the writer, so at most about 2 x threads x frame_size.
 * Buffers are anonymous mappings kept across ranges. With a budget (opts->mem, a push's
 * --max-memory) every buffer is charged by its size: a range waits for the budget to take
 * more, unless it is the range the writer waits for next (that one never waits, so the output
 * always moves); a frame's buffer shrinks to the frame once compressed; and while more is
 * charged than the budget allows, buffers are given back after each use instead of kept.
 *
 * This file is the file-level pack: the options, vmsnap_image_pack_fd's phases (check the
 * source, plan against a base, pre-scan, head frames, workers, ordered writer, tail frames) and
 * the file/pipe sink of vmsnap_image_pack. Its parts, each using only those listed before it
 * (and none of them this file): image_enc_buf.c (buffers and the budget), image_enc_zstd.c (one
 * zstd frame), image_enc_range.c (the range encoder and its worker threads), image_enc_scan.c
 * (the base pre-scan), image_enc_write.c (the ordered writer, head and tail frames, seek table).
 */
#include "image_int.h"
#include "sys/sys.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

int vmsnap_image_check_pack_opts(const struct vmsnap_pack_opts *opts, struct vmsnap_err *err)
{
    uint64_t fs = opts->frame_size ? opts->frame_size : VMSNAP_IMAGE_DEFAULT_FRAME_SIZE;
    int level = opts->level ? opts->level : 1;
    if (fs % VMSNAP_IMAGE_PAGE || fs < VMSNAP_IMAGE_MIN_FRAME_SIZE ||
        fs > VMSNAP_IMAGE_MAX_FRAME_SIZE)
        return vmsnap_err_set(
            err, EINVAL, "frame size %llu: must be a multiple of 4 KiB between 1 MiB and 1 GiB",
            (unsigned long long)fs);
    if (level < ZSTD_minCLevel() || level > ZSTD_maxCLevel())
        return vmsnap_err_set(err, EINVAL, "zstd level %d out of range [%d, %d]", level,
                              ZSTD_minCLevel(), ZSTD_maxCLevel());
    return 0;
}

/* The source: a regular file whose size tells what it holds. */
static int check_source(int fd, const char *name, struct stat *st, struct vmsnap_err *err)
{
    if (fstat(fd, st) < 0)
        return err_sys(err, "stat %s", name);
    if (!S_ISREG(st->st_mode))
        return vmsnap_err_set(err, EINVAL, "%s: not a regular file", name);
    char probe;
    if (st->st_size == 0 && pread(fd, &probe, 1, 0) == 1) /* packed as empty, exit 0 */
        return vmsnap_err_set(err, EINVAL,
                              "%s reports a size of 0 but has data (a /proc or /sys file?): the "
                              "encoder reads a file by its size; copy it to a file first",
                              name);
    return 0;
}

/* The encoder's settings from the options, and how many workers it runs. */
static int enc_init(struct enc *e, int fd, const char *name, const struct stat *st,
                    const struct vmsnap_pack_opts *opts, unsigned *threads_out,
                    struct vmsnap_err *err)
{
    *e = (struct enc){
        .fd = fd,
        .name = name,
        .size = (uint64_t)st->st_size,
        .frame_size = opts->frame_size ? opts->frame_size : VMSNAP_IMAGE_DEFAULT_FRAME_SIZE,
        .level = opts->level ? opts->level : 1,
        .elide = !opts->keep_zero_pages,
        .drop_cache = !opts->keep_cache,
        .mem = opts->mem,
    };
    int crc = vmsnap_image_check_pack_opts(opts, err);
    if (crc < 0)
        return crc;
    if (opts->delta_parent && (opts->base || opts->keep_zero_pages))
        return vmsnap_err_set(err, EINVAL,
                              "%s: a delta layer (delta_parent) is encoded without %s: the "
                              "parent's page table decides which pages it stores",
                              name, opts->base ? "a base" : "keep_zero_pages");
    if (opts->delta_parent && (crc = img_pages_check(opts->delta_parent, name, err)) < 0)
        return crc;
    e->parent = opts->delta_parent;
    e->nranges = (e->size + e->frame_size - 1) / e->frame_size;
    if (e->nranges + 2 > SEEK_MAX_FRAMES)
        return vmsnap_err_set(err, EFBIG,
                              "%s: %llu bytes makes too many frames at frame size %llu; use a "
                              "larger --frame-size",
                              name, (unsigned long long)e->size, (unsigned long long)e->frame_size);
    unsigned threads = opts->threads ? opts->threads : sys_cpus();
    if (threads > 256)
        threads = 256;
    if ((uint64_t)threads > e->nranges)
        threads = e->nranges ? (unsigned)e->nranges : 1;
    e->window = threads + 1;
    *threads_out = threads;
    return 0;
}

/* With a base of the same frame size and level, and a sink that can copy its frames: which
 * base frame covers each range (the pre-scan then finds the unchanged ones). */
static int plan_base(struct enc *e, const struct vmsnap_pack_opts *opts,
                     const struct vmsnap_sink *sink, struct vmsnap_err *err)
{
    if (!opts->base || !sink->copy)
        return 0;
    struct vmsnap_image_stats bs;
    vmsnap_image_get_stats(opts->base, &bs);
    if (bs.frame_size != e->frame_size || bs.level != e->level || e->nranges == 0)
        return 0;
    e->base = opts->base;
    e->plan = calloc(e->nranges, sizeof(*e->plan));
    e->min_run = opts->base_min_run ? opts->base_min_run : VMSNAP_IMAGE_DEFAULT_MIN_RUN;
    if (!e->plan)
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    uint32_t nb = vmsnap_image_frame_count(e->base);
    for (uint32_t i = 0; i < nb; i++) {
        struct vmsnap_frame_info bf;
        vmsnap_image_frame(e->base, i, &bf);
        if (bf.src_end > bf.src_start && bf.src_start % e->frame_size == 0 &&
            bf.src_start / e->frame_size < e->nranges)
            e->plan[bf.src_start / e->frame_size].base_frame = i + 1;
    }
    return 0;
}

/* Header, info frame and the totalSize frame: out before any worker starts. */
static int emit_head(struct out *o, const struct enc *e, ZSTD_CCtx *cctx, struct table *t,
                     uint64_t *frames_start, struct vmsnap_err *err)
{
    uint8_t hdr[IMG_HEADER_LEN];
    memcpy(hdr, IMG_MAGIC, IMG_MAGIC_LEN);
    put_le32(hdr + 8, IMG_VERSION);
    int rc;
    if ((rc = img_emit(o, hdr, sizeof(hdr), err)) < 0 ||
        (rc = img_emit_info_frame(o, e->frame_size, err)) < 0)
        return rc;
    *frames_start = o->pos;
    return img_emit_word_frame(o, cctx, e->level, e->size, 0, t, err);
}

/* Start the workers; *started says how many run (the writer needs at least one). */
static int start_workers(struct worker *ws, pthread_t *tids, unsigned threads, unsigned *started,
                         struct vmsnap_err *err)
{
    for (; *started < threads; (*started)++) {
        unsigned i = *started;
        ws[i].cctx = ZSTD_createCCtx();
        if (!ws[i].cctx || thread_start(&tids[i], img_worker_main, &ws[i]) != 0) {
            ZSTD_freeCCtx(ws[i].cctx);
            return vmsnap_err_set(err, EAGAIN, "cannot start encoder thread %u", i);
        }
    }
    return 0;
}

/* Stop the workers, wait for them and give back the slots' and the writer's buffers. */
static void stop_workers(struct enc *e, struct worker *ws, pthread_t *tids, unsigned started,
                         struct worker *wk)
{
    pthread_mutex_lock(&e->mu);
    img_set_abort(e);
    pthread_mutex_unlock(&e->mu);
    for (unsigned i = 0; i < started; i++) {
        pthread_join(tids[i], NULL);
        ZSTD_freeCCtx(ws[i].cctx);
    }
    for (unsigned i = 0; i < e->window; i++)
        img_ebuf_trim(e, &e->slots[i].c, 0);
    img_ebuf_trim(e, &wk->b, 0);
    free(wk->ext);
}

/* A file written while it was read is encoded as it never was (ranges of different moments; a
 * shrunk file's lost tail read as holes): refused before the object is whole. */
static int check_unchanged(int fd, const char *name, const struct stat *st, struct vmsnap_err *err)
{
    struct stat after;
    if (fstat(fd, &after) < 0 || after.st_size != st->st_size ||
        after.st_mtim.tv_sec != st->st_mtim.tv_sec || after.st_mtim.tv_nsec != st->st_mtim.tv_nsec)
        return vmsnap_err_set(err, EAGAIN,
                              "%s changed while being read (size or modification time): encode "
                              "it again when nothing writes to it",
                              name);
    return 0;
}

int vmsnap_image_pack_fd(int src_fd, const char *src_name, const struct vmsnap_sink *sink,
                         const struct vmsnap_pack_opts *opts, struct vmsnap_image_stats *stats,
                         struct vmsnap_err *err)
{
    static const struct vmsnap_pack_opts defaults;
    if (!opts)
        opts = &defaults;
    const char *name = src_name ? src_name : "source";
    struct stat st;
    struct enc e = {0};
    unsigned threads = 0;
    int rc = check_source(src_fd, name, &st, err);
    if (rc == 0)
        rc = enc_init(&e, src_fd, name, &st, opts, &threads, err);
    if (rc == 0)
        rc = plan_base(&e, opts, sink, err);
    struct vmsnap_pages *pages = NULL; /* the source's page table, computed as it is read */
    if (rc == 0 && (opts->pages_out || e.parent) &&
        (rc = vmsnap_pages_new(e.size, &pages, err)) == 0)
        e.ph = pages->h;
    if (rc < 0) {
        free(e.plan);
        return rc;
    }

    struct vmsnap_image_stats s = {.total_size = e.size,
                                   .frame_size = e.frame_size,
                                   .has_seek_table = true,
                                   .delta = e.parent != NULL};
    struct table t = {0};
    struct out o = {.sink = sink, .pos = 0};
    struct worker *ws = calloc(threads, sizeof(*ws));
    pthread_t *tids = calloc(threads, sizeof(*tids));
    e.slots = calloc(e.window, sizeof(*e.slots));
    ZSTD_CCtx *cctx = ZSTD_createCCtx();
    unsigned started = 0;
    if (!ws || !tids || !e.slots || !cctx) {
        rc = vmsnap_err_set(err, ENOMEM, "out of memory");
        goto out;
    }
    pthread_mutex_init(&e.mu, NULL);
    pthread_cond_init(&e.cv_work, NULL);
    pthread_cond_init(&e.cv_done, NULL);

    /* The pre-scan first: it writes nothing, so the sink holds no part being filled while its
     * threads wait for a shared budget (with two files at once, the other file's writer waited
     * for that part, and the part for this file's pre-scan: a deadlock found by review). */
    for (unsigned i = 0; i < threads; i++)
        ws[i] = (struct worker){.e = &e, .wait = true};
    if (e.base && (rc = img_prescan(&e, ws, threads, err)) < 0)
        goto out_sync;
    uint64_t frames_start = 0;
    if ((rc = emit_head(&o, &e, cctx, &t, &frames_start, err)) < 0)
        goto out_sync;

    /* The ordered writer (with a base it also shapes the runs of reused frames) runs here. */
    struct worker wk = {.e = &e, .cctx = cctx};
    rc = start_workers(ws, tids, threads, &started, err);
    if (rc == 0)
        rc = img_write_ranges(&wk, started, &o, &t, &s, opts, err);
    stop_workers(&e, ws, tids, started, &wk);
    if (rc < 0 || (rc = check_unchanged(src_fd, name, &st, err)) < 0)
        goto out_sync;

    if ((rc = img_emit_word_frame(&o, cctx, e.level, UINT64_MAX, e.size, &t, err)) < 0)
        goto out_sync;
    rc = img_emit_seek_table(
        &o, &t, &s, e.frame_size, frames_start, e.level,
        (e.elide ? SEEK_FLAG_ZERO_ELIDED : 0) | (e.parent ? SEEK_FLAG_DELTA : 0), err);
    s.object_size = o.pos;
out_sync:
    for (unsigned i = 0; ws && i < threads; i++) {
        img_ebuf_trim(&e, &ws[i].b, 0);
        free(ws[i].ext);
    }
    pthread_cond_destroy(&e.cv_done);
    pthread_cond_destroy(&e.cv_work);
    pthread_mutex_destroy(&e.mu);
out:
    ZSTD_freeCCtx(cctx);
    free(e.plan);
    free(e.slots);
    free(tids);
    free(ws);
    free(t.f);
    if (rc == 0 && stats)
        *stats = s;
    if (rc >= 0 && opts->pages_out) {
        for (uint64_t p = 0; p < pages->npages; p++)
            pages->populated += pages->h[p] != 0;
        *opts->pages_out = pages;
        pages = NULL;
    }
    vmsnap_pages_free(pages);
    return rc < 0 ? rc : 0;
}

bool vmsnap_image_is_seek_table(const void *buf, size_t len)
{
    const uint8_t *p = buf;
    if (len < 8 + SEEK_HDR_LEN + SEEK_FOOTER_LEN)
        return false;
    uint32_t magic =
        (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    uint32_t size =
        (uint32_t)p[4] | (uint32_t)p[5] << 8 | (uint32_t)p[6] << 16 | (uint32_t)p[7] << 24;
    return magic == SEEK_SKIP_MAGIC && (uint64_t)size + 8 == len &&
           !memcmp(p + len - 8, SEEK_FOOTER_MAGIC, 8);
}

/* Write to a pipe without blocking on a stalled reader: wait for room in 0.2 s steps (a cancel
 * is seen there) and write at most what fits. */
static int pipe_write_full(int fd, const uint8_t *p, size_t len)
{
    while (len > 0) {
        struct pollfd pfd = {.fd = fd, .events = POLLOUT};
        int pr = poll(&pfd, 1, 200);
        if (vmsnap_cancelled())
            return -ECANCELED;
        if (pr < 0 && errno != EINTR)
            return -errno;
        if (pr <= 0)
            continue;
        int used = 0, cap = fcntl(fd, F_GETPIPE_SZ);
        if (ioctl(fd, FIONREAD, &used) < 0 || cap <= used)
            used = cap = 0;
        size_t n = VMSNAP_MIN(len, cap > used ? (size_t)(cap - used) : (size_t)PIPE_BUF);
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno != EINTR && errno != EAGAIN)
            return -errno;
        if (w > 0) {
            p += w;
            len -= (size_t)w;
        }
    }
    return 0;
}

static int fd_sink_write(void *arg, const void *buf, size_t len, struct vmsnap_err *err)
{
    const struct sys_atomic_file *af = arg;
    struct stat sb;
    int rc = !af->path && fstat(af->fd, &sb) == 0 && S_ISFIFO(sb.st_mode)
                 ? pipe_write_full(af->fd, buf, len)
                 : sys_write_full(af->fd, buf, len);
    if (rc == -ECANCELED)
        return cancel_check(err);
    if (rc < 0)
        return err_code(err, -rc, "write %s", af->path ? af->path : "stdout");
    return 0;
}

int vmsnap_image_pack(const char *src, const char *dst, const struct vmsnap_pack_opts *opts,
                      struct vmsnap_image_stats *stats, struct vmsnap_err *err)
{
    /* O_NONBLOCK: a FIFO given as the source must not block the open (where no signal stops
     * it); the encoder refuses anything but a regular file */
    int fd = open(src, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return err_sys(err, "open %s", src);
    (void)fcntl(fd, F_SETFL, 0);
    struct stat sst;
    if (fstat(fd, &sst) < 0 || !S_ISREG(sst.st_mode)) {
        close(fd);
        return vmsnap_err_set(err, EINVAL, "%s: not a regular file (pack reads a file)", src);
    }
    struct sys_atomic_file af = {.fd = STDOUT_FILENO};
    bool to_stdout = strcmp(dst, "-") == 0;
    int rc = 0;
    struct stat so, si;
    bool self = to_stdout ? fstat(STDOUT_FILENO, &so) == 0 && fstat(fd, &si) == 0 &&
                                so.st_dev == si.st_dev && so.st_ino == si.st_ino
                          : sys_same_file(fd, dst);
    if (self) { /* pack X X, or pack X - >> X */
        close(fd);
        return vmsnap_err_set(err, EINVAL, "%s: the destination is the source",
                              to_stdout ? "stdout" : dst);
    }
    if (!to_stdout && (rc = sys_atomic_open(&af, dst, 0600, err)) < 0) {
        close(fd);
        return rc;
    }
    struct vmsnap_sink sink = {.write = fd_sink_write, .arg = &af};
    rc = vmsnap_image_pack_fd(fd, src, &sink, opts, stats, err);
    close(fd);
    if (to_stdout)
        return rc;
    if (rc < 0) {
        sys_atomic_abort(&af);
        return rc;
    }
    return sys_atomic_commit(&af, opts && opts->fsync, err);
}
