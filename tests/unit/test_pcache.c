/* SPDX-License-Identifier: Apache-2.0 */
/* Page-cache hygiene: stat accuracy, preserve and staged eviction, release of a restore
 * directory, and the background retrier (stops when clean, when the schedule ends, never touches
 * a replaced or modified file, cancels cleanly). The staged walk leaves alone a file open or
 * mapped elsewhere, a symlink root and, as root, a bind mount below the root (found by mount id
 * and by the mountinfo fallback). Needs cachestat (Linux 6.5+) and a file system with a page cache
 * that tracks dirty pages (not tmpfs). */
#include "t.h"
#include "pcache/pcache_int.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define TMPFS_MAGIC_ 0x01021994

static uint64_t seed = 42;

static uint8_t *random_buf(size_t len)
{
    uint8_t *b = malloc(len);
    REQUIRE(b);
    for (size_t i = 0; i < len; i += 8) {
        uint64_t v = t_rand(&seed);
        memcpy(b + i, &v, VMSNAP_MIN(8, len - i));
    }
    return b;
}

/* Write `len` bytes to a new file; fsync when `sync`. */
static void write_file(const char *path, const uint8_t *buf, size_t len, bool sync)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    REQUIRE(fd >= 0);
    size_t done = 0;
    while (done < len) {
        ssize_t n = write(fd, buf + done, len - done);
        REQUIRE(n > 0);
        done += (size_t)n;
    }
    if (sync)
        REQUIRE(fsync(fd) == 0);
    close(fd);
}

static struct vmsnap_pcache_stat stat_of(const char *path)
{
    struct vmsnap_pcache_stat st;
    struct vmsnap_err err = {0};
    int fd = open(path, O_RDONLY);
    REQUIRE(fd >= 0);
    int rc = vmsnap_pcache_stat_fd(fd, &st, &err);
    CHECKF(rc == 0, "%s", err.msg);
    close(fd);
    return st;
}

static void read_all(const char *path)
{
    REQUIRE(t_sh("cat '%s' > /dev/null", path) == 0);
}

static bool content_is(const char *path, const uint8_t *buf, size_t len)
{
    size_t got;
    uint8_t *b = t_read_file(path, &got);
    bool ok = b && got == len && memcmp(b, buf, len) == 0;
    free(b);
    return ok;
}

static void sync_file(const char *path)
{
    int fd = open(path, O_RDONLY);
    REQUIRE(fd >= 0);
    REQUIRE(fsync(fd) == 0);
    close(fd);
}

static int evict(const char *path, const struct vmsnap_pcache_evict_opts *opts,
                 struct vmsnap_pcache_report *rep)
{
    struct vmsnap_err err = {0};
    memset(rep, 0, sizeof(*rep));
    int rc = vmsnap_pcache_evict(path, opts, rep, &err);
    CHECKF(rc == 0, "evict %s: %s", path, err.msg);
    return rc;
}

#define LEN (8u << 20)
#define PAGES (LEN / 4096u)

static void test_stat_clean_and_evict(void)
{
    const char *p = t_path("clean.img");
    uint8_t *buf = random_buf(LEN);
    write_file(p, buf, LEN, true);
    struct vmsnap_pcache_report rep;
    evict(p, NULL, &rep);
    struct vmsnap_pcache_stat st = stat_of(p);
    CHECKF(st.cached <= 2, "after evict of a synced file: %llu pages cached",
           (unsigned long long)st.cached);
    CHECK(rep.files == 1 && rep.dropped_files == 1 && rep.dirty_files == 0);

    read_all(p);
    st = stat_of(p);
    CHECK(!st.mincore);
    CHECK(st.files == 1 && st.size == LEN && st.pages == PAGES);
    CHECKF(st.cached == PAGES, "read fully: %llu of %u pages cached", (unsigned long long)st.cached,
           PAGES);
    CHECK(st.dirty == 0 && st.writeback == 0);

    evict(p, NULL, &rep);
    CHECKF(rep.dropped_files == 1 && rep.dropped_pages >= PAGES - 2, "dropped %llu pages",
           (unsigned long long)rep.dropped_pages);
    st = stat_of(p);
    CHECKF(st.cached <= 2, "after evict: %llu pages cached", (unsigned long long)st.cached);
    /* (DONTNEED leaves no shadow entries, so cachestat's evicted count need not grow.) */
    CHECK(content_is(p, buf, LEN));

    /* Tree stat: the directory walk finds the file and sums. */
    read_all(p);
    struct vmsnap_pcache_stat total;
    struct vmsnap_err err = {0};
    CHECK(vmsnap_pcache_stat_path(t_tmpdir(), NULL, NULL, &total, &err) == 0);
    CHECK(total.files >= 1 && total.cached >= PAGES);
    CHECK(vmsnap_pcache_stat_path(t_path("missing"), NULL, NULL, &total, &err) == -ENOENT);
    CHECK(strstr(err.msg, "missing") != NULL);
    free(buf);
}

static void test_dirty_preserve(void)
{
    const char *p = t_path("dirty.img");
    uint8_t *buf = random_buf(LEN);
    struct vmsnap_pcache_report rep;
    struct vmsnap_pcache_stat st;
    /* Background writeback may clean a page between the write and the evict (another test's
     * sync): retry the scenario a few times before judging. */
    int tries = 0;
    for (;;) {
        write_file(p, buf, LEN, false);
        st = stat_of(p);
        evict(p, NULL, &rep);
        if (st.dirty == PAGES && rep.dropped_pages == 0)
            break;
        REQUIRE(++tries < 4);
    }
    CHECK(rep.files == 1 && rep.dirty_files == 1 && rep.dirty_pages > 0 && rep.scheduled == 0);
    struct vmsnap_pcache_stat after = stat_of(p);
    CHECKF(after.cached == PAGES, "preserve evict of a dirty file dropped pages: %llu cached",
           (unsigned long long)after.cached);
    /* And no writeback was started (DONTNEED on dirty pages would have started it). */
    CHECKF(after.dirty == PAGES, "dirty pages after preserve evict: %llu of %u",
           (unsigned long long)after.dirty, PAGES);
    CHECK(content_is(p, buf, LEN));

    sync_file(p);
    st = stat_of(p);
    CHECK(st.dirty == 0 && st.writeback == 0 && st.cached == PAGES);
    evict(p, NULL, &rep);
    CHECK(rep.dropped_files == 1 && rep.dirty_files == 0);
    st = stat_of(p);
    CHECKF(st.cached <= 2, "after sync + evict: %llu cached", (unsigned long long)st.cached);
    CHECK(content_is(p, buf, LEN));
    free(buf);
}

static void test_staged(void)
{
    REQUIRE(t_sh("mkdir -p '%s' '%s'", t_path("st/keep/sub"), t_path("other")) == 0);
    uint8_t *buf = random_buf(LEN);
    write_file(t_path("st/single.img"), buf, LEN, false); /* dirty: dropped without writeback */
    write_file(t_path("st/linked.img"), buf, LEN, true);
    REQUIRE(link(t_path("st/linked.img"), t_path("other/link2.img")) == 0);
    write_file(t_path("st/keep/a.img"), buf, LEN / 2, false);
    write_file(t_path("st/keep/sub/b.img"), buf, LEN / 4, true);
    read_all(t_path("st/linked.img"));
    REQUIRE(t_sh("cd '%s' && find st/keep -type f | sort | xargs sha256sum > keep.sum",
                 t_tmpdir()) == 0);

    const char *preserve[] = {t_path("st/keep"), NULL};
    struct vmsnap_pcache_evict_opts opts = {.staged = true, .preserve = preserve};
    struct vmsnap_pcache_report rep;
    evict(t_path("st"), &opts, &rep);
    CHECK(!t_exists(t_path("st/single.img")));
    CHECK(rep.removed_files == 1 && rep.removed_bytes == LEN);
    CHECKF(rep.removed_pages == PAGES, "removed pages %llu", (unsigned long long)rep.removed_pages);
    CHECK(rep.files == 4);
    /* The hard-linked file keeps its bytes and both links; its clean pages went. */
    CHECK(content_is(t_path("st/linked.img"), buf, LEN));
    CHECK(content_is(t_path("other/link2.img"), buf, LEN));
    struct stat sb;
    CHECK(stat(t_path("st/linked.img"), &sb) == 0 && sb.st_nlink == 2);
    /* The preserved tree is byte-identical. */
    CHECK(t_sh("cd '%s' && sha256sum --quiet -c keep.sum", t_tmpdir()) == 0);
    CHECK(t_exists(t_path("st/keep/sub")));

    /* A preserved path that does not exist is an error naming it, and nothing is touched. */
    write_file(t_path("st/single.img"), buf, 4096, true);
    const char *bad[] = {t_path("st/nope"), NULL};
    opts.preserve = bad;
    struct vmsnap_err err = {0};
    CHECK(vmsnap_pcache_evict(t_path("st"), &opts, &rep, &err) == -ENOENT);
    CHECK(strstr(err.msg, "nope") != NULL);
    CHECK(t_exists(t_path("st/single.img")));

    /* Staged on a single file given directly. */
    opts.preserve = NULL;
    evict(t_path("st/single.img"), &opts, &rep);
    CHECK(!t_exists(t_path("st/single.img")) && rep.removed_files == 1);

    /* Preserve mode (not staged) on the whole tree never modifies: all hashes equal. */
    REQUIRE(t_sh("cd '%s' && find st other -type f | sort | xargs sha256sum > all.sum",
                 t_tmpdir()) == 0);
    evict(t_path("st"), NULL, &rep);
    CHECK(rep.removed_files == 0);
    CHECK(t_sh("cd '%s' && sha256sum --quiet -c all.sum", t_tmpdir()) == 0);
    free(buf);
}

static void test_release_dir(void)
{
    REQUIRE(t_sh("mkdir -p '%s' '%s'", t_path("rel/a/b"), t_path("rel/c")) == 0);
    uint8_t *buf = random_buf(LEN / 4);
    write_file(t_path("rel/mem.img"), buf, LEN / 4, false);
    write_file(t_path("rel/a/b/disk.img"), buf, LEN / 4, false);
    write_file(t_path("rel/c/ckpt.img"), buf, LEN / 4, true);
    const char *preserve[] = {"c/ckpt.img", NULL};
    struct vmsnap_pcache_report rep = {0};
    struct vmsnap_err err = {0};
    CHECKF(vmsnap_pcache_release_dir(t_path("rel"), preserve, NULL, &rep, &err) == 0, "%s",
           err.msg);
    CHECK(!t_exists(t_path("rel/mem.img")) && !t_exists(t_path("rel/a")));
    CHECK(content_is(t_path("rel/c/ckpt.img"), buf, LEN / 4));
    CHECK(rep.removed_files == 2 && rep.removed_dirs == 2);
    /* Nothing preserved: the directory itself goes. */
    memset(&rep, 0, sizeof(rep));
    CHECK(vmsnap_pcache_release_dir(t_path("rel"), NULL, NULL, &rep, &err) == 0);
    CHECK(!t_exists(t_path("rel")) && rep.removed_files == 1 && rep.removed_dirs == 2);
    CHECK(vmsnap_pcache_release_dir(t_path("rel"), NULL, NULL, &rep, &err) == -ENOENT);
    free(buf);
}

/* A preserved directory replaced by a new, empty one while the release walks (a checkpoint
 * writer's mkdir + rename, the walk frozen at its failpoint in a child) is the checkpoint now:
 * kept, and so is the directory holding it. The empty one was removed, then its parent. */
static void test_release_dir_renamed(void)
{
    REQUIRE(t_sh("mkdir -p '%s' '%s'", t_path("rr2/ckpt"), t_path("rr2/tmp")) == 0);
    uint8_t *buf = random_buf(LEN / 8);
    write_file(t_path("rr2/ckpt/mem"), buf, LEN / 8, true);
    free(buf);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        setenv("VMSNAP_FAILPOINT", "evict-preserved:stop", 1);
        const char *preserve[] = {"ckpt", NULL};
        struct vmsnap_err err = {0};
        _exit(vmsnap_pcache_release_dir(t_path("rr2"), preserve, NULL, NULL, &err) == 0 ? 0 : 1);
    }
    int st = 0;
    REQUIRE(waitpid(pid, &st, WUNTRACED) == pid && WIFSTOPPED(st));
    REQUIRE(t_sh("mkdir '%s' && mv '%s' '%s' && mv '%s' '%s' && rm -rf '%s'", t_path("rr2/tmp/new"),
                 t_path("rr2/ckpt"), t_path("rr2/tmp/old"), t_path("rr2/tmp/new"),
                 t_path("rr2/ckpt"), t_path("rr2/tmp/old")) == 0);
    kill(pid, SIGCONT);
    REQUIRE(waitpid(pid, &st, 0) == pid);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    struct stat sb;
    CHECKF(stat(t_path("rr2/ckpt"), &sb) == 0 && S_ISDIR(sb.st_mode),
           "a directory renamed onto a preserved path during a release was removed");
    REQUIRE(t_sh("rm -rf '%s'", t_path("rr2")) == 0);
}

/* A file with another descriptor or a mapping open on it is not ours alone: only evicted. */
static void test_staged_busy(void)
{
    REQUIRE(t_sh("mkdir -p '%s'", t_path("busy")) == 0);
    uint8_t *buf = random_buf(LEN / 8);
    const char *p = t_path("busy/mem.img");
    write_file(p, buf, LEN / 8, true);
    struct vmsnap_pcache_evict_opts opts = {.staged = true};
    struct vmsnap_pcache_report rep;

    int fd = open(p, O_RDONLY);
    REQUIRE(fd >= 0);
    evict(t_path("busy"), &opts, &rep);
    CHECK(rep.files == 1 && rep.removed_files == 0 && rep.busy_files == 1);
    CHECK(content_is(p, buf, LEN / 8));

    void *map = mmap(NULL, LEN / 8, PROT_READ, MAP_SHARED, fd, 0);
    REQUIRE(map != MAP_FAILED);
    close(fd);
    evict(t_path("busy"), &opts, &rep);
    CHECK(rep.removed_files == 0 && rep.busy_files == 1);
    CHECK(content_is(p, buf, LEN / 8));
    munmap(map, LEN / 8);

    /* Nothing else holds it any more: removed. */
    evict(t_path("busy"), &opts, &rep);
    CHECK(rep.removed_files == 1 && rep.busy_files == 0 && !t_exists(p));
    free(buf);
}

/* A symlink given as the root of a staged walk is refused, trailing slashes or not. */
static void test_symlink_root(void)
{
    REQUIRE(t_sh("mkdir -p '%s' && echo precious > '%s' && ln -s '%s' '%s'", t_path("sl-target"),
                 t_path("sl-target/keep"), t_path("sl-target"), t_path("sl-link")) == 0);
    char slash[600];
    snprintf(slash, sizeof(slash), "%s/", t_path("sl-link"));
    const char *roots[] = {t_path("sl-link"), slash};
    struct vmsnap_pcache_evict_opts opts = {.staged = true};
    for (size_t i = 0; i < 2; i++) {
        struct vmsnap_pcache_report rep = {0};
        struct vmsnap_err err = {0};
        CHECKF(vmsnap_pcache_evict(roots[i], &opts, &rep, &err) == -ELOOP, "evict %s: %s", roots[i],
               err.msg);
        CHECK(strstr(err.msg, "symbolic link") != NULL);
        CHECKF(vmsnap_pcache_release_dir(roots[i], NULL, NULL, &rep, &err) == -ELOOP,
               "release %s: %s", roots[i], err.msg);
        CHECK(rep.files == 0 && t_exists(t_path("sl-target/keep")));
        CHECK(t_exists(t_path("sl-link")));
    }
    /* A regular file is not a restore directory. */
    struct vmsnap_err err = {0};
    CHECK(vmsnap_pcache_release_dir(t_path("sl-target/keep"), NULL, NULL, NULL, &err) == -ENOTDIR);
    CHECK(t_exists(t_path("sl-target/keep")));
}

/* Release of a directory with a bind mount of an outside directory below it: the mount is not
 * entered, by statx mount id and by the /proc/self/mountinfo fallback. */
static void test_bind_mount(void)
{
    if (geteuid() != 0) {
        CHECKF(!getenv("VMSNAP_REQUIRE_ALL") || strcmp(getenv("VMSNAP_REQUIRE_ALL"), "1") != 0,
               "bind mount test needs root");
        fprintf(stderr, "SKIP part: bind mount test needs root\n");
        return;
    }
    for (int pass = 0; pass < 2; pass++) {
        pcache_force_mountinfo(pass == 1);
        REQUIRE(t_sh("mkdir -p '%s' '%s' && echo precious > '%s' && echo mine > '%s'",
                     t_path("bm-out"), t_path("bm-rel/sub"), t_path("bm-out/keep"),
                     t_path("bm-rel/own")) == 0);
        if (t_sh("mount --bind '%s' '%s'", t_path("bm-out"), t_path("bm-rel/sub")) != 0) {
            CHECKF(!getenv("VMSNAP_REQUIRE_ALL") || strcmp(getenv("VMSNAP_REQUIRE_ALL"), "1") != 0,
                   "cannot bind mount");
            fprintf(stderr, "SKIP part: cannot bind mount\n");
            break;
        }
        struct vmsnap_pcache_report rep = {0};
        struct vmsnap_err err = {0};
        int rc = vmsnap_pcache_release_dir(t_path("bm-rel"), NULL, NULL, &rep, &err);
        REQUIRE(t_sh("umount '%s'", t_path("bm-rel/sub")) == 0);
        CHECKF(rc == 0, "pass %d: %s", pass, err.msg);
        CHECKF(t_exists(t_path("bm-out/keep")), "pass %d: deleted through a bind mount", pass);
        CHECK(!t_exists(t_path("bm-rel/own")) && t_exists(t_path("bm-rel/sub")));
        CHECK(rep.skipped_mounts == 1 && rep.removed_files == 1 && rep.removed_dirs == 0);
        REQUIRE(t_sh("rm -rf '%s' '%s'", t_path("bm-out"), t_path("bm-rel")) == 0);
    }
    pcache_force_mountinfo(false);
}

static struct vmsnap_pcache_retrier *retrier(const double *d, size_t n)
{
    struct vmsnap_pcache_retrier *r;
    struct vmsnap_err err = {0};
    REQUIRE(vmsnap_pcache_retrier_new(d, n, &r, &err) == 0);
    return r;
}

static struct vmsnap_pcache_retrier_stats rstats(struct vmsnap_pcache_retrier *r)
{
    struct vmsnap_pcache_retrier_stats s;
    vmsnap_pcache_retrier_get_stats(r, &s);
    return s;
}

/* Write a dirty file and hand it to `r` through a preserve evict; false if it was not dirty. */
static bool schedule_dirty(struct vmsnap_pcache_retrier *r, const char *p, const uint8_t *buf,
                           size_t len)
{
    write_file(p, buf, len, false);
    struct vmsnap_pcache_evict_opts opts = {.retrier = r};
    struct vmsnap_pcache_report rep;
    evict(p, &opts, &rep);
    return rep.scheduled == 1;
}

static void test_retry_stops_when_clean(void)
{
    uint8_t *buf = random_buf(LEN);
    struct vmsnap_pcache_retrier *r = retrier(NULL, 0); /* 0.5 s, 1.5 s, 3 s */
    const char *p = t_path("retry-clean.img");
    REQUIRE(schedule_dirty(r, p, buf, LEN));
    sync_file(p); /* clean before the first retry at 0.5 s */
    CHECK(vmsnap_pcache_retrier_wait(r, 10) == 0);
    struct vmsnap_pcache_retrier_stats s = rstats(r);
    CHECKF(s.attempts == 1 && s.dropped_files == 1 && s.gave_up == 0 && s.pending == 0,
           "attempts %llu dropped %llu", (unsigned long long)s.attempts,
           (unsigned long long)s.dropped_files);
    CHECK(s.dropped_pages >= PAGES - 2);
    CHECK(stat_of(p).cached <= 2);
    CHECK(content_is(p, buf, LEN));
    vmsnap_pcache_retrier_free(r);
    free(buf);
}

static void test_retry_schedule_ends(void)
{
    uint8_t *buf = random_buf(LEN);
    static const double quick[] = {0.05, 0.1, 0.2};
    struct vmsnap_pcache_retrier *r = retrier(quick, 3);
    const char *p = t_path("retry-dirty.img");
    REQUIRE(schedule_dirty(r, p, buf, LEN));
    CHECK(vmsnap_pcache_retrier_wait(r, 10) == 0);
    struct vmsnap_pcache_retrier_stats s = rstats(r);
    /* Still dirty after 0.2 s (the kernel's expiry is 30 s): three attempts, then it gave up. */
    CHECKF(s.attempts == 3 && s.gave_up == 1 && s.dropped_files == 0, "attempts %llu gave_up %llu",
           (unsigned long long)s.attempts, (unsigned long long)s.gave_up);
    CHECK(content_is(p, buf, LEN));
    vmsnap_pcache_retrier_free(r);
    free(buf);
}

static void test_retry_replaced(void)
{
    uint8_t *buf = random_buf(LEN);
    static const double d[] = {0.3, 0.6};
    struct vmsnap_pcache_retrier *r = retrier(d, 2);
    /* Replaced: a new clean, cached file of the same size renamed over the scheduled name. */
    const char *p = t_path("retry-a.img");
    REQUIRE(schedule_dirty(r, p, buf, LEN));
    write_file(t_path("retry-b.img"), buf, LEN, true);
    read_all(t_path("retry-b.img"));
    REQUIRE(rename(t_path("retry-b.img"), p) == 0);
    /* Modified in place: same inode, grown by a page. */
    const char *q = t_path("retry-c.img");
    REQUIRE(schedule_dirty(r, q, buf, LEN));
    REQUIRE(t_sh("head -c 4096 /dev/zero >> '%s' && sync '%s'", q, q) == 0);
    read_all(q);
    CHECK(vmsnap_pcache_retrier_wait(r, 10) == 0);
    struct vmsnap_pcache_retrier_stats s = rstats(r);
    CHECKF(s.replaced == 2 && s.dropped_files == 0 && s.dropped_pages == 0,
           "replaced %llu dropped %llu", (unsigned long long)s.replaced,
           (unsigned long long)s.dropped_files);
    /* Untouched: the clean pages of both files are all still cached. */
    CHECK(stat_of(p).cached == PAGES);
    CHECK(stat_of(q).cached == PAGES + 1);
    /* Deleted: left alone too. */
    REQUIRE(schedule_dirty(r, t_path("retry-d.img"), buf, 4096));
    REQUIRE(unlink(t_path("retry-d.img")) == 0);
    CHECK(vmsnap_pcache_retrier_wait(r, 10) == 0);
    CHECK(rstats(r).replaced == 3);
    vmsnap_pcache_retrier_free(r);
    free(buf);
}

static void test_retry_cancel(void)
{
    uint8_t *buf = random_buf(4096);
    static const double d[] = {100.0};
    struct vmsnap_pcache_retrier *r = retrier(d, 1);
    REQUIRE(schedule_dirty(r, t_path("cancel.img"), buf, 4096));
    CHECK(rstats(r).pending == 1);
    CHECK(vmsnap_pcache_retrier_wait(r, 0.05) == -ETIMEDOUT);
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    vmsnap_pcache_retrier_free(r); /* must not wait 100 s; ASan checks nothing leaks */
    clock_gettime(CLOCK_MONOTONIC, &b);
    CHECK(b.tv_sec - a.tv_sec < 5);
    vmsnap_pcache_retrier_free(NULL);
    /* Bad schedules are refused. */
    struct vmsnap_err err = {0};
    static const double bad[] = {1.0, 0.5};
    CHECK(vmsnap_pcache_retrier_new(bad, 2, &r, &err) == -EINVAL && r == NULL);
    CHECK(vmsnap_pcache_retrier_new(bad, 0, &r, &err) == -EINVAL);
    free(buf);
}

struct worker {
    struct vmsnap_pcache_retrier *r;
    char path[512];
    uint8_t *buf;
    bool scheduled;
};

static void *worker_run(void *arg)
{
    struct worker *w = arg;
    w->scheduled = schedule_dirty(w->r, w->path, w->buf, LEN / 8);
    return NULL;
}

/* Several threads evicting with one retrier; kick-writeback lets the retries find clean pages. */
static void test_threads_and_drop_written(void)
{
    uint8_t *buf = random_buf(LEN);
    struct vmsnap_pcache_retrier *r = retrier(NULL, 0);
    struct worker w[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        w[i] = (struct worker){.r = r, .buf = buf};
        snprintf(w[i].path, sizeof(w[i].path), "%s/thread-%d.img", t_tmpdir(), i);
        REQUIRE(pthread_create(&th[i], NULL, worker_run, &w[i]) == 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        CHECK(w[i].scheduled);
    }
    CHECK(rstats(r).scheduled == 4);

    const char *p = t_path("written.img");
    write_file(p, buf, LEN, false);
    struct vmsnap_pcache_report rep = {0};
    struct vmsnap_err err = {0};
    CHECK(vmsnap_pcache_drop_written(p, true, r, &rep, &err) == 0);
    CHECK(rep.files == 1 && (rep.kicked == 1 || rep.dirty_files == 0));
    CHECK(vmsnap_pcache_retrier_wait(r, 10) == 0);
    /* 8 MiB whose writeback was started is clean within 3 s on any disk. */
    CHECKF(stat_of(p).cached <= 2, "drop_written + kick: %llu pages still cached",
           (unsigned long long)stat_of(p).cached);
    CHECK(content_is(p, buf, LEN));
    CHECK(vmsnap_pcache_drop_written(t_tmpdir(), false, NULL, NULL, &err) == -EINVAL);
    vmsnap_pcache_retrier_free(r);
    free(buf);
}

int main(void)
{
    struct statfs fs;
    REQUIRE(statfs(t_tmpdir(), &fs) == 0);
    if (fs.f_type == TMPFS_MAGIC_)
        t_skip("%s is tmpfs: no dirty page tracking to test (set TMPDIR)", t_tmpdir());
    if (!vmsnap_pcache_cachestat_available())
        t_skip("cachestat(2) unavailable (Linux 6.5+ needed); the fallback has its own test");
    test_stat_clean_and_evict();
    test_dirty_preserve();
    test_staged();
    test_release_dir();
    test_release_dir_renamed();
    test_staged_busy();
    test_symlink_root();
    test_bind_mount();
    test_retry_stops_when_clean();
    test_retry_schedule_ends();
    test_retry_replaced();
    test_retry_cancel();
    test_threads_and_drop_written();
    return t_done();
}
