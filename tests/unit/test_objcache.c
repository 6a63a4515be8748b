/* SPDX-License-Identifier: Apache-2.0 */
/* The object cache: hit and miss, a size mismatch is a miss (and removed), invalid keys refused,
 * concurrent fills of one key (processes and threads: one fills, the others wait and read the
 * entry, the content is fetched once), a filler killed with SIGKILL (no entry, the next fill
 * proceeds, the temporary swept at the next open, never a live fill's), LRU order under a cap
 * decided by use, the just-filled entry kept, trim counts, a reader surviving eviction, no page
 * of an entry left in the page cache after a commit and after get + put, symlinked and foreign
 * directories refused, the environment's directory and size. */
#include "t.h"
#include "util/util.h"
#include "vmsnap/objcache.h"
#include "vmsnap/pcache.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define TMPFS_MAGIC_ 0x01021994
#define PAGE 4096

static struct vmsnap_objcache *open_cache(const char *dir, uint64_t cap)
{
    struct vmsnap_objcache_opts o = {dir, cap};
    struct vmsnap_objcache *c = NULL;
    struct vmsnap_err err = {0};
    int rc = vmsnap_objcache_open(&o, &c, &err);
    if (rc < 0)
        fprintf(stderr, "open %s: %s\n", dir, err.msg);
    REQUIRE(rc == 0 && c);
    return c;
}

/* The byte at `off` of object `seed`. */
static uint8_t content(uint64_t seed, uint64_t off)
{
    return (uint8_t)((off * 2654435761u + seed * 97) >> 7);
}

static void write_content(int fd, uint64_t seed, uint64_t size)
{
    uint8_t buf[8192];
    for (uint64_t off = 0; off < size;) { /* back to front: any offsets */
        uint64_t n = VMSNAP_MIN(sizeof(buf), size - off), at = size - off - n;
        for (uint64_t i = 0; i < n; i++)
            buf[i] = content(seed, at + i);
        REQUIRE(pwrite(fd, buf, n, (off_t)at) == (ssize_t)n);
        off += n;
    }
}

static bool has_content(int fd, uint64_t seed, uint64_t size)
{
    uint8_t buf[8192];
    for (uint64_t off = 0; off < size;) {
        size_t n = (size_t)VMSNAP_MIN(sizeof(buf), size - off);
        if (pread(fd, buf, n, (off_t)off) != (ssize_t)n)
            return false;
        for (size_t i = 0; i < n; i++)
            if (buf[i] != content(seed, off + i))
                return false;
        off += n;
    }
    char extra;
    return pread(fd, &extra, 1, (off_t)size) == 0;
}

/* Fill `key` with object `seed` (a miss expected). */
static void fill(struct vmsnap_objcache *c, const char *key, uint64_t size, uint64_t seed)
{
    struct vmsnap_objcache_fill *f = NULL;
    struct vmsnap_err err = {0};
    int fd = -2;
    int rc = vmsnap_objcache_fill_begin(c, key, size, &f, &fd, &err);
    CHECKF(rc == 1 && f && fd == -1, "fill_begin %s: %d %s", key, rc, err.msg);
    REQUIRE(rc == 1);
    write_content(vmsnap_objcache_fill_fd(f), seed, size);
    rc = vmsnap_objcache_fill_commit(f, &err);
    CHECKF(rc == 0, "commit %s: %s", key, err.msg);
}

static bool cached(struct vmsnap_objcache *c, const char *key, uint64_t size, uint64_t seed)
{
    int fd = -1;
    struct vmsnap_err err = {0};
    if (vmsnap_objcache_get(c, key, size, &fd, &err) != 0)
        return false;
    bool ok = has_content(fd, seed, size);
    vmsnap_objcache_put(c, fd);
    return ok;
}

static bool exists_in(const char *dir, const char *sub, const char *name)
{
    char p[1024];
    snprintf(p, sizeof(p), "%s/%s/%s", dir, sub, name);
    return t_exists(p);
}

static size_t count_dir(const char *dir, const char *sub)
{
    char p[1024];
    snprintf(p, sizeof(p), "%s/%s", dir, sub);
    DIR *d = opendir(p);
    REQUIRE(d);
    size_t n = 0;
    for (struct dirent *de; (de = readdir(d));)
        n += de->d_name[0] != '.';
    closedir(d);
    return n;
}

/* Set an entry's last use (its mtime) to `t` seconds. */
static void set_used(const char *dir, const char *key, time_t t)
{
    char p[1024];
    snprintf(p, sizeof(p), "%s/objects/%s", dir, key);
    struct timespec ts[2] = {{.tv_nsec = UTIME_OMIT}, {t, 0}};
    REQUIRE(utimensat(AT_FDCWD, p, ts, AT_SYMLINK_NOFOLLOW) == 0);
}

static void test_hit_miss_keys(void)
{
    const char *dir = t_path("basic");
    struct vmsnap_objcache *c = open_cache(dir, 0);
    struct stat st;
    REQUIRE(stat(dir, &st) == 0);
    CHECK((st.st_mode & 0777) == 0700);
    struct vmsnap_err err = {0};
    int fd = -2;
    CHECK(vmsnap_objcache_get(c, "t-1", 10000, &fd, &err) == -ENOENT && fd == -1);
    fill(c, "t-1", 10000, 1);
    CHECK(cached(c, "t-1", 10000, 1));
    char p[1024];
    snprintf(p, sizeof(p), "%s/objects/t-1", dir);
    REQUIRE(stat(p, &st) == 0);
    CHECKF((st.st_mode & 0777) == 0400, "entry mode %o", st.st_mode & 0777);
    CHECK(count_dir(dir, "tmp") == 0 && count_dir(dir, "locks") == 0);

    /* fill_begin on an entry that exists: the entry, no fill */
    struct vmsnap_objcache_fill *f = (void *)1;
    CHECK(vmsnap_objcache_fill_begin(c, "t-1", 10000, &f, &fd, &err) == 0 && !f && fd >= 0);
    CHECK(has_content(fd, 1, 10000));
    vmsnap_objcache_put(c, fd);

    /* another size: a miss, and the entry is gone */
    CHECK(vmsnap_objcache_get(c, "t-1", 10001, &fd, &err) == -ENOENT);
    CHECK(!exists_in(dir, "objects", "t-1"));
    CHECK(vmsnap_objcache_get(c, "t-1", 10000, &fd, &err) == -ENOENT);
    /* and on the fill path: a wrong-sized entry is refilled */
    fill(c, "t-2", 100, 2);
    CHECK(vmsnap_objcache_fill_begin(c, "t-2", 200, &f, &fd, &err) == 1 && f);
    write_content(vmsnap_objcache_fill_fd(f), 3, 200);
    CHECK(vmsnap_objcache_fill_commit(f, &err) == 0);
    CHECK(cached(c, "t-2", 200, 3));

    /* a commit of a file grown past its size publishes nothing */
    CHECK(vmsnap_objcache_fill_begin(c, "t-3", 100, &f, &fd, &err) == 1);
    write_content(vmsnap_objcache_fill_fd(f), 3, 150);
    CHECK(vmsnap_objcache_fill_commit(f, &err) == -EINVAL && strstr(err.msg, "t-3"));
    CHECK(!exists_in(dir, "objects", "t-3") && count_dir(dir, "tmp") == 0);
    /* abort: nothing published, nothing left */
    CHECK(vmsnap_objcache_fill_begin(c, "t-3", 100, &f, &fd, &err) == 1);
    vmsnap_objcache_fill_abort(f);
    CHECK(!exists_in(dir, "objects", "t-3") && count_dir(dir, "tmp") == 0);
    CHECK(count_dir(dir, "locks") == 0);

    /* keys */
    char longest[VMSNAP_OBJCACHE_KEY_MAX + 2];
    memset(longest, 'a', VMSNAP_OBJCACHE_KEY_MAX);
    longest[VMSNAP_OBJCACHE_KEY_MAX] = '\0';
    CHECK(vmsnap_objcache_get(c, longest, 1, &fd, &err) == -ENOENT);
    strcat(longest, "a");
    const char *bad[] = {"", "T-1", "t.1", "t/1", "..", "t_1", "t 1", "t-\xc3\xa9", longest};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        vmsnap_err_clear(&err);
        CHECKF(vmsnap_objcache_get(c, bad[i], 1, &fd, &err) == -EINVAL, "get '%s'", bad[i]);
        CHECK(strstr(err.msg, "invalid key"));
        CHECKF(vmsnap_objcache_fill_begin(c, bad[i], 1, &f, &fd, &err) == -EINVAL, "fill '%s'",
               bad[i]);
        CHECK(vmsnap_objcache_drop(c, bad[i], &err) == -EINVAL);
    }
    CHECK(vmsnap_objcache_get(c, NULL, 1, &fd, &err) == -EINVAL);

    /* drop: gone for new readers, kept by one reading */
    CHECK(vmsnap_objcache_get(c, "t-2", 200, &fd, &err) == 0);
    CHECK(vmsnap_objcache_drop(c, "t-2", &err) == 0);
    CHECK(!exists_in(dir, "objects", "t-2"));
    CHECK(has_content(fd, 3, 200));
    vmsnap_objcache_put(c, fd);
    CHECK(vmsnap_objcache_drop(c, "t-2", &err) == 0); /* none: fine */

    /* a stray file in objects/ that is not a key is not an entry */
    snprintf(p, sizeof(p), "%s/objects/NOTES.txt", dir);
    REQUIRE(t_sh("echo x > '%s'", p) == 0);
    uint64_t n = 9, bytes = 9, cap = 0;
    CHECK(vmsnap_objcache_stat(c, &n, &bytes, &cap, &err) == 0);
    CHECK(n == 0 && bytes == 0 && cap == VMSNAP_OBJCACHE_DEFAULT_CAP);
    vmsnap_objcache_close(c);
}

/* ---- concurrent fills ---- */

static void note_fill(const char *counter)
{
    int fd = open(counter, O_WRONLY | O_APPEND | O_CREAT, 0600);
    REQUIRE(fd >= 0 && write(fd, "f", 1) == 1);
    close(fd);
}

/* A child: fill `key` (counting in `counter`) or read it; exit 0 when it ends with the right
 * content, 2 when it filled, 3 when it waited and read. Writes its result to `res` after
 * fill_begin returns. */
static _Noreturn void child_fill(const char *dir, const char *counter, int go, int res,
                                 uint64_t size)
{
    struct vmsnap_objcache *c = open_cache(dir, 0);
    struct vmsnap_objcache_fill *f = NULL;
    struct vmsnap_err err = {0};
    int fd = -1;
    int rc = vmsnap_objcache_fill_begin(c, "t-shared", size, &f, &fd, &err);
    char r = rc == 1 ? 'F' : rc == 0 ? 'R' : 'E';
    if (write(res, &r, 1) != 1)
        _exit(1);
    if (rc == 1) {
        note_fill(counter);
        if (go >= 0 && read(go, &r, 1) != 1) /* hold the fill until the parent says */
            _exit(1);
        write_content(vmsnap_objcache_fill_fd(f), 7, size);
        if (vmsnap_objcache_fill_commit(f, &err) < 0)
            _exit(1);
        bool ok = cached(c, "t-shared", size, 7);
        vmsnap_objcache_close(c);
        _exit(ok ? 2 : 1);
    }
    bool ok = rc == 0 && has_content(fd, 7, size);
    vmsnap_objcache_put(c, fd);
    vmsnap_objcache_close(c);
    _exit(ok ? 3 : 1);
}

static size_t file_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (size_t)st.st_size : 0;
}

static void test_two_processes(void)
{
    const char *dir = t_path("procs"), *counter = t_path("procs.count");
    int go[2], res[2];
    REQUIRE(pipe(go) == 0 && pipe(res) == 0);
    const uint64_t size = 3 << 20;
    pid_t a = fork();
    REQUIRE(a >= 0);
    if (a == 0)
        child_fill(dir, counter, go[0], res[1], size);
    char r = 0;
    REQUIRE(read(res[0], &r, 1) == 1);
    CHECKF(r == 'F', "first fill_begin: %c", r);
    /* a holds the key; b must wait in fill_begin until a commits */
    pid_t b = fork();
    REQUIRE(b >= 0);
    if (b == 0)
        child_fill(dir, counter, -1, res[1], size);
    for (int i = 0; i < 20; i++) { /* time for b to reach the lock; never a pass condition */
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    REQUIRE(fcntl(res[0], F_SETFL, O_NONBLOCK) == 0);
    CHECKF(read(res[0], &r, 1) < 0 && errno == EAGAIN,
           "second fill_begin returned (%c) while "
           "the first filled",
           r);
    REQUIRE(fcntl(res[0], F_SETFL, 0) == 0);
    REQUIRE(write(go[1], "g", 1) == 1);
    int sa, sb;
    REQUIRE(waitpid(a, &sa, 0) == a && waitpid(b, &sb, 0) == b);
    CHECKF(WIFEXITED(sa) && WEXITSTATUS(sa) == 2, "filler: %d", sa);
    CHECKF(WIFEXITED(sb) && WEXITSTATUS(sb) == 3, "waiter: %d (3: waited and read)", sb);
    CHECKF(file_size(counter) == 1, "fills: %zu", file_size(counter));
    close(go[0]), close(go[1]), close(res[0]), close(res[1]);

    /* four at once, none held back: one fill */
    REQUIRE(t_sh("rm -rf '%s' '%s'", dir, counter) == 0);
    REQUIRE(pipe(res) == 0);
    pid_t kids[4];
    for (int i = 0; i < 4; i++) {
        REQUIRE((kids[i] = fork()) >= 0);
        if (kids[i] == 0)
            child_fill(dir, counter, -1, res[1], size);
    }
    int fillers = 0, readers = 0;
    for (int i = 0; i < 4; i++) {
        int s;
        REQUIRE(waitpid(kids[i], &s, 0) == kids[i]);
        fillers += WIFEXITED(s) && WEXITSTATUS(s) == 2;
        readers += WIFEXITED(s) && WEXITSTATUS(s) == 3;
    }
    CHECKF(fillers == 1 && readers == 3, "fillers %d readers %d", fillers, readers);
    CHECKF(file_size(counter) == 1, "fills: %zu", file_size(counter));
    close(res[0]), close(res[1]);
}

struct thr {
    struct vmsnap_objcache *c;
    int rc;
    int fd;
};

static void *thread_fill(void *arg)
{
    struct thr *t = arg;
    struct vmsnap_objcache_fill *f = NULL;
    struct vmsnap_err err = {0};
    t->rc = vmsnap_objcache_fill_begin(t->c, "t-thr", 5000, &f, &t->fd, &err);
    return NULL;
}

static void test_threads(void)
{
    struct vmsnap_objcache *c = open_cache(t_path("thr"), 0);
    struct vmsnap_objcache_fill *f = NULL;
    struct vmsnap_err err = {0};
    int fd;
    REQUIRE(vmsnap_objcache_fill_begin(c, "t-thr", 5000, &f, &fd, &err) == 1);
    struct thr t = {c, -99, -1};
    pthread_t th;
    REQUIRE(pthread_create(&th, NULL, thread_fill, &t) == 0);
    struct timespec ts = {0, 100 * 1000 * 1000};
    nanosleep(&ts, NULL);
    CHECKF(__atomic_load_n(&t.rc, __ATOMIC_SEQ_CST) == -99,
           "a second thread's fill_begin returned %d while the first filled", t.rc);
    write_content(vmsnap_objcache_fill_fd(f), 9, 5000);
    CHECK(vmsnap_objcache_fill_commit(f, &err) == 0);
    pthread_join(th, NULL);
    CHECKF(t.rc == 0 && t.fd >= 0, "waiting thread: %d", t.rc);
    CHECK(has_content(t.fd, 9, 5000));
    vmsnap_objcache_put(c, t.fd);
    vmsnap_objcache_close(c);
}

static void test_killed_filler(void)
{
    const char *dir = t_path("killed");
    int res[2];
    REQUIRE(pipe(res) == 0);
    pid_t p = fork();
    REQUIRE(p >= 0);
    if (p == 0) {
        struct vmsnap_objcache *c = open_cache(dir, 0);
        struct vmsnap_objcache_fill *f = NULL;
        struct vmsnap_err err = {0};
        int fd;
        if (vmsnap_objcache_fill_begin(c, "t-k", 1 << 20, &f, &fd, &err) != 1)
            _exit(1);
        write_content(vmsnap_objcache_fill_fd(f), 4, 1 << 19); /* half */
        if (write(res[1], "w", 1) != 1)
            _exit(1);
        for (;;)
            pause();
    }
    char r;
    REQUIRE(read(res[0], &r, 1) == 1);
    REQUIRE(kill(p, SIGKILL) == 0);
    int s;
    REQUIRE(waitpid(p, &s, 0) == p && WIFSIGNALED(s));
    CHECK(!exists_in(dir, "objects", "t-k"));
    CHECK(count_dir(dir, "tmp") == 1);

    /* the next fill takes the dead one's lock at once (alarm: a hang fails the test) */
    alarm(60);
    struct vmsnap_objcache *c = open_cache(dir, 0);
    CHECK(count_dir(dir, "tmp") == 0); /* swept by the open */
    struct vmsnap_objcache_fill *f = NULL;
    struct vmsnap_err err = {0};
    int fd;
    CHECK(vmsnap_objcache_fill_begin(c, "t-k", 1 << 20, &f, &fd, &err) == 1);
    alarm(0);
    /* while this fill runs, another open sweeps nothing of it */
    struct vmsnap_objcache *c2 = open_cache(dir, 0);
    CHECK(count_dir(dir, "tmp") == 1);
    vmsnap_objcache_close(c2);
    write_content(vmsnap_objcache_fill_fd(f), 4, 1 << 20);
    CHECK(vmsnap_objcache_fill_commit(f, &err) == 0);
    CHECK(cached(c, "t-k", 1 << 20, 4));
    vmsnap_objcache_close(c);

    /* killed again, then the temporary swept by the next open (not the next fill) */
    REQUIRE((p = fork()) >= 0);
    if (p == 0) {
        struct vmsnap_objcache *ck = open_cache(dir, 0);
        struct vmsnap_objcache_fill *fk = NULL;
        int fdk;
        if (vmsnap_objcache_fill_begin(ck, "t-k2", 4096, &fk, &fdk, NULL) != 1)
            _exit(1);
        if (write(res[1], "w", 1) != 1)
            _exit(1);
        for (;;)
            pause();
    }
    REQUIRE(read(res[0], &r, 1) == 1);
    REQUIRE(kill(p, SIGKILL) == 0 && waitpid(p, &s, 0) == p);
    CHECK(count_dir(dir, "tmp") == 1 && count_dir(dir, "locks") == 1);
    c = open_cache(dir, 0);
    CHECK(count_dir(dir, "tmp") == 0 && count_dir(dir, "locks") == 0);
    CHECK(!exists_in(dir, "objects", "t-k2"));
    vmsnap_objcache_close(c);
    close(res[0]), close(res[1]);
}

/* ---- LRU ---- */

static bool has(const char *dir, const char *keys)
{
    char k[8];
    for (const char *p = keys; *p; p++) {
        snprintf(k, sizeof(k), "t-%c", *p);
        if (!exists_in(dir, "objects", k))
            return false;
    }
    return true;
}

static void test_lru(void)
{
    const char *dir = t_path("lru");
    struct vmsnap_objcache *c = open_cache(dir, 3 * PAGE);
    struct vmsnap_err err = {0};
    const time_t t0 = time(NULL) - 1000;
    fill(c, "t-a", PAGE, 'a');
    fill(c, "t-b", PAGE, 'b');
    fill(c, "t-c", PAGE, 'c');
    CHECK(has(dir, "abc"));
    set_used(dir, "t-a", t0), set_used(dir, "t-b", t0 + 1), set_used(dir, "t-c", t0 + 2);
    /* a used: b is now the least recently used */
    CHECK(cached(c, "t-a", PAGE, 'a'));
    fill(c, "t-d", PAGE, 'd');
    CHECKF(has(dir, "acd") && !has(dir, "b"), "after d: b should have gone");
    set_used(dir, "t-a", t0 + 10), set_used(dir, "t-c", t0 + 11), set_used(dir, "t-d", t0 + 12);
    CHECK(cached(c, "t-a", PAGE, 'a'));
    fill(c, "t-e", PAGE, 'e');
    CHECKF(has(dir, "ade") && !has(dir, "c"), "after e: c should have gone");
    /* untouched, the oldest goes: a */
    set_used(dir, "t-a", t0 + 20), set_used(dir, "t-d", t0 + 21), set_used(dir, "t-e", t0 + 22);
    fill(c, "t-f", PAGE, 'f');
    CHECKF(has(dir, "def") && !has(dir, "a"), "after f: a should have gone");

    /* an object above the cap: everything else goes, it stays */
    fill(c, "t-g", 5 * PAGE, 'g');
    uint64_t n, bytes, cap;
    CHECK(vmsnap_objcache_stat(c, &n, &bytes, &cap, &err) == 0);
    CHECKF(n == 1 && bytes == 5 * PAGE && cap == 3 * PAGE, "n %llu bytes %llu",
           (unsigned long long)n, (unsigned long long)bytes);
    CHECK(cached(c, "t-g", 5 * PAGE, 'g'));
    vmsnap_objcache_close(c);

    /* trim, with a large cap: counts, oldest first */
    c = open_cache(dir, 1ull << 40);
    uint64_t ev = 9, fr = 9;
    CHECK(vmsnap_objcache_trim(c, 0, &ev, &fr, &err) == 0 && ev == 1 && fr == 5 * PAGE);
    const char *keys = "hijk";
    for (int i = 0; i < 4; i++) {
        char k[8];
        snprintf(k, sizeof(k), "t-%c", keys[i]);
        fill(c, k, (uint64_t)(i + 1) * PAGE, (uint64_t)keys[i]);
    }
    /* used order, oldest first: j, h, k, i */
    set_used(dir, "t-j", t0), set_used(dir, "t-h", t0 + 1), set_used(dir, "t-k", t0 + 2),
        set_used(dir, "t-i", t0 + 3);
    CHECK(vmsnap_objcache_trim(c, 10 * PAGE, &ev, &fr, &err) == 0 && ev == 0 && fr == 0);
    CHECK(vmsnap_objcache_trim(c, 6 * PAGE, &ev, &fr, &err) == 0);
    CHECKF(ev == 2 && fr == 4 * PAGE && has(dir, "ki") && !has(dir, "j") && !has(dir, "h"),
           "trim to 6 pages: %llu evicted, %llu freed", (unsigned long long)ev,
           (unsigned long long)fr);

    /* a reader keeps an evicted entry */
    int fd;
    CHECK(vmsnap_objcache_get(c, "t-k", 4 * PAGE, &fd, &err) == 0);
    CHECK(vmsnap_objcache_trim(c, 0, &ev, &fr, &err) == 0 && ev == 2 && fr == 6 * PAGE);
    CHECK(!has(dir, "k") && !has(dir, "i"));
    CHECK(has_content(fd, 'k', 4 * PAGE));
    vmsnap_objcache_put(c, fd);
    vmsnap_objcache_close(c);
}

/* More entries than one eviction pass keeps as candidates. */
static void test_many(void)
{
    const char *dir = t_path("many");
    struct vmsnap_objcache *c = open_cache(dir, 1ull << 40);
    struct vmsnap_err err = {0};
    const time_t t0 = time(NULL) - 100000;
    for (int i = 0; i < 700; i++) {
        char k[16];
        snprintf(k, sizeof(k), "t-%d", i);
        fill(c, k, 10, (uint64_t)i);
        set_used(dir, k, t0 + (i * 7919) % 700); /* a permutation of the order */
    }
    uint64_t ev, fr, n, bytes;
    CHECK(vmsnap_objcache_trim(c, 50 * 10, &ev, &fr, &err) == 0 && ev == 650 && fr == 6500);
    CHECK(vmsnap_objcache_stat(c, &n, &bytes, NULL, &err) == 0 && n == 50 && bytes == 500);
    int wrong = 0;
    for (int i = 0; i < 700; i++) {
        char k[16];
        snprintf(k, sizeof(k), "t-%d", i);
        wrong += exists_in(dir, "objects", k) != ((i * 7919) % 700 >= 650);
    }
    CHECKF(wrong == 0, "%d entries kept or evicted out of LRU order", wrong);
    vmsnap_objcache_close(c);
}

/* ---- page cache ---- */

static uint64_t pages_cached(const char *path)
{
    int fd = open(path, O_RDONLY);
    REQUIRE(fd >= 0);
    struct vmsnap_pcache_stat st;
    struct vmsnap_err err = {0};
    REQUIRE(vmsnap_pcache_stat_fd(fd, &st, &err) == 0);
    close(fd);
    return st.cached;
}

static void test_page_cache(void)
{
    struct statfs sf;
    if (statfs(t_tmpdir(), &sf) == 0 && sf.f_type == TMPFS_MAGIC_) {
        fprintf(stderr, "page cache part skipped: %s is tmpfs (set TMPDIR)\n", t_tmpdir());
        return;
    }
    const char *dir = t_path("pc");
    struct vmsnap_objcache *c = open_cache(dir, 0);
    struct vmsnap_err err = {0};
    const uint64_t size = 8 << 20;
    char p[1024];
    snprintf(p, sizeof(p), "%s/objects/t-pc", dir);

    struct vmsnap_objcache_fill *f;
    int fd;
    REQUIRE(vmsnap_objcache_fill_begin(c, "t-pc", size, &f, &fd, &err) == 1);
    write_content(vmsnap_objcache_fill_fd(f), 5, size);
    struct vmsnap_pcache_stat st;
    REQUIRE(vmsnap_pcache_stat_fd(vmsnap_objcache_fill_fd(f), &st, &err) == 0);
    CHECKF(st.cached >= size / PAGE / 2, "the test wrote through the cache: %llu pages",
           (unsigned long long)st.cached);
    CHECK(vmsnap_objcache_fill_commit(f, &err) == 0);
    CHECKF(pages_cached(p) == 0, "after commit: %llu pages cached",
           (unsigned long long)pages_cached(p));

    CHECK(vmsnap_objcache_get(c, "t-pc", size, &fd, &err) == 0);
    CHECK(has_content(fd, 5, size));
    CHECKF(pages_cached(p) >= size / PAGE / 2, "read: %llu pages cached",
           (unsigned long long)pages_cached(p));
    vmsnap_objcache_put(c, fd);
    CHECKF(pages_cached(p) == 0, "after put: %llu pages cached",
           (unsigned long long)pages_cached(p));

    /* fill_written: a range's write-out started; at the next call it is waited for and
     * dropped (the writer does not stall on what it just wrote) */
    REQUIRE(vmsnap_objcache_fill_begin(c, "t-pc2", size, &f, &fd, &err) == 1);
    write_content(vmsnap_objcache_fill_fd(f), 6, size);
    CHECK(vmsnap_objcache_fill_written(f, 0, size / 2, &err) == 0);
    CHECK(vmsnap_objcache_fill_written(f, size / 2, 0, &err) == 0);
    REQUIRE(vmsnap_pcache_stat_fd(vmsnap_objcache_fill_fd(f), &st, &err) == 0);
    CHECKF(st.cached <= size / PAGE / 2 + 1, "after fill_written of both halves: %llu pages",
           (unsigned long long)st.cached);
    CHECK(vmsnap_objcache_fill_commit(f, &err) == 0);
    CHECK(cached(c, "t-pc2", size, 6));
    vmsnap_objcache_close(c);
}

/* ---- unnamed fills (a push's write-through: the key is its digest, known at the end) ---- */

static void test_unnamed(void)
{
    const char *dir = t_path("unnamed");
    struct vmsnap_objcache *c = open_cache(dir, 0);
    struct vmsnap_err err = {0};
    struct vmsnap_objcache_fill *f = NULL;
    /* written, then named: the entry, nothing left in tmp/ or locks/ */
    REQUIRE(vmsnap_objcache_fill_begin_unnamed(c, &f, &err) == 0 && f);
    write_content(vmsnap_objcache_fill_fd(f), 11, 300000);
    CHECK(vmsnap_objcache_fill_written(f, 0, 100000, &err) == 0);
    CHECKF(vmsnap_objcache_fill_commit_as(f, "t-u1", 300000, &err) == 1, "commit_as: %s", err.msg);
    CHECK(cached(c, "t-u1", 300000, 11));
    CHECK(count_dir(dir, "tmp") == 0 && count_dir(dir, "locks") == 0);
    /* the wrong size: refused, nothing published */
    REQUIRE(vmsnap_objcache_fill_begin_unnamed(c, &f, &err) == 0);
    write_content(vmsnap_objcache_fill_fd(f), 12, 5000);
    CHECK(vmsnap_objcache_fill_commit_as(f, "t-u2", 6000, &err) == -EINVAL);
    int fd = -1;
    CHECK(vmsnap_objcache_get(c, "t-u2", 6000, &fd, &err) == -ENOENT);
    CHECK(count_dir(dir, "tmp") == 0);
    /* the entry there already: ours dropped (0), the entry kept as it was */
    REQUIRE(vmsnap_objcache_fill_begin_unnamed(c, &f, &err) == 0);
    write_content(vmsnap_objcache_fill_fd(f), 13, 300000);
    CHECK(vmsnap_objcache_fill_commit_as(f, "t-u1", 300000, &err) == 0);
    CHECK(cached(c, "t-u1", 300000, 11));
    CHECK(count_dir(dir, "tmp") == 0);
    /* another fill of the key under way: ours dropped (0) without waiting, theirs published */
    struct vmsnap_objcache_fill *g = NULL;
    REQUIRE(vmsnap_objcache_fill_begin(c, "t-u3", 4096, &g, &fd, &err) == 1);
    REQUIRE(vmsnap_objcache_fill_begin_unnamed(c, &f, &err) == 0);
    write_content(vmsnap_objcache_fill_fd(f), 14, 4096);
    CHECK(vmsnap_objcache_fill_commit_as(f, "t-u3", 4096, &err) == 0);
    write_content(vmsnap_objcache_fill_fd(g), 15, 4096);
    CHECK(vmsnap_objcache_fill_commit(g, &err) == 0);
    CHECK(cached(c, "t-u3", 4096, 15));
    /* a bad key: refused, the fill freed (ASan: no leak) */
    REQUIRE(vmsnap_objcache_fill_begin_unnamed(c, &f, &err) == 0);
    CHECK(vmsnap_objcache_fill_commit_as(f, "../x", 0, &err) == -EINVAL);
    /* aborted: nothing left */
    REQUIRE(vmsnap_objcache_fill_begin_unnamed(c, &f, &err) == 0);
    vmsnap_objcache_fill_abort(f);
    CHECK(count_dir(dir, "tmp") == 0 && count_dir(dir, "locks") == 0);
    vmsnap_objcache_close(c);
}

/* ---- the directory ---- */

static void test_dir_checks(void)
{
    struct vmsnap_objcache_opts o = {0};
    struct vmsnap_objcache *c = NULL;
    struct vmsnap_err err = {0};
    const char *real = t_path("real"), *lnk = t_path("lnk");
    REQUIRE(mkdir(real, 0700) == 0 && symlink(real, lnk) == 0);
    const char *spell[] = {lnk, t_path("lnk/"), t_path("lnk//")};
    for (size_t i = 0; i < 3; i++) {
        o.dir = spell[i];
        CHECKF(vmsnap_objcache_open(&o, &c, &err) == -ELOOP && !c, "%s", spell[i]);
        CHECK(strstr(err.msg, "symbolic link"));
    }
    o.dir = t_path("lnk/.");
    CHECK(vmsnap_objcache_open(&o, &c, &err) == -EINVAL);
    CHECK(count_dir(real, ".") == 0); /* nothing created through the link */

    const char *gw = t_path("groupw");
    REQUIRE(mkdir(gw, 0770) == 0 && chmod(gw, 0770) == 0);
    o.dir = gw;
    CHECK(vmsnap_objcache_open(&o, &c, &err) == -EPERM && strstr(err.msg, "writable"));

    /* a subdirectory that is a link */
    const char *sub = t_path("sub");
    REQUIRE(mkdir(sub, 0700) == 0);
    REQUIRE(t_sh("ln -s '%s' '%s/objects'", real, sub) == 0);
    o.dir = sub;
    CHECK(vmsnap_objcache_open(&o, &c, &err) < 0 && !c);

    if (geteuid() == 0) {
        const char *foreign = t_path("foreign");
        REQUIRE(mkdir(foreign, 0700) == 0 && chown(foreign, 65534, 65534) == 0);
        o.dir = foreign;
        CHECK(vmsnap_objcache_open(&o, &c, &err) == -EPERM && strstr(err.msg, "owned by uid"));
        CHECK(count_dir(foreign, ".") == 0);
    } else {
        o.dir = "/";
        CHECK(vmsnap_objcache_open(&o, &c, &err) == -EPERM && strstr(err.msg, "owned by uid"));
    }

    /* created with missing parents */
    o.dir = t_path("a/b/c");
    CHECK(vmsnap_objcache_open(&o, &c, &err) == 0 && c);
    vmsnap_objcache_close(c);
}

static void test_env(void)
{
    struct vmsnap_objcache *c = NULL;
    struct vmsnap_err err = {0};
    const char *dir = t_path("envdir");
    setenv("VMSNAP_CACHE_DIR", dir, 1);
    setenv("VMSNAP_CACHE_SIZE", "1.5M", 1);
    CHECK(vmsnap_objcache_open(NULL, &c, &err) == 0 && c);
    uint64_t cap = 0;
    CHECK(c && !strcmp(vmsnap_objcache_dir(c), dir));
    CHECK(c && vmsnap_objcache_stat(c, NULL, NULL, &cap, &err) == 0 && cap == 1572864);
    vmsnap_objcache_close(c);
    CHECK(t_exists(t_path("envdir/objects")));
    struct vmsnap_objcache_opts o = {NULL, 12345};
    CHECK(vmsnap_objcache_open(&o, &c, &err) == 0);
    CHECK(vmsnap_objcache_stat(c, NULL, NULL, &cap, &err) == 0 && cap == 12345);
    vmsnap_objcache_close(c);
    const char *sizes[][2] = {
        {"8G", "8589934592"}, {"512MiB", "536870912"}, {"4096", "4096"}, {"2k", "2048"}};
    for (size_t i = 0; i < 4; i++) {
        setenv("VMSNAP_CACHE_SIZE", sizes[i][0], 1);
        CHECK(vmsnap_objcache_open(NULL, &c, &err) == 0);
        CHECK(vmsnap_objcache_stat(c, NULL, NULL, &cap, &err) == 0 &&
              cap == strtoull(sizes[i][1], NULL, 10));
        vmsnap_objcache_close(c);
    }
    const char *bad[] = {"lots", "0", "-1G", "1.2.3G", "8X", "0x10", " 8G", "8iB"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        setenv("VMSNAP_CACHE_SIZE", bad[i], 1);
        CHECKF(vmsnap_objcache_open(NULL, &c, &err) == -EINVAL && !c, "'%s'", bad[i]);
        CHECK(strstr(err.msg, "VMSNAP_CACHE_SIZE"));
    }
    unsetenv("VMSNAP_CACHE_SIZE");
    unsetenv("VMSNAP_CACHE_DIR");
}

int main(void)
{
    test_hit_miss_keys();
    test_two_processes();
    test_threads();
    test_killed_filler();
    test_lru();
    test_many();
    test_page_cache();
    test_unnamed();
    test_dir_checks();
    test_env();
    return t_done();
}
