/* SPDX-License-Identifier: Apache-2.0 */
/* The cachestat fallback: under a seccomp filter that makes cachestat fail with ENOSYS, then
 * with EPERM (each in a child process, as filters cannot be lifted), the library and the CLI log
 * one line, do not crash, still truncate staged files, leave preserved files untouched (content
 * and cached pages) and stat through mincore. */
#include "t.h"
#include "pcache/pcache_int.h"

#include <errno.h>
#include <fcntl.h>
#include <seccomp.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define LEN (4u << 20)
#define PAGES (LEN / 4096u)
#define CACHESTAT_NR 451 /* the same on every architecture */

static int log_lines;
static char last_log[1024];

static void count_log(void *arg, enum vmsnap_log_level level, const char *msg)
{
    (void)arg;
    if (level <= VMSNAP_LOG_WARN) {
        log_lines++;
        snprintf(last_log, sizeof(last_log), "%s", msg);
    }
}

static void load_filter(int errnum)
{
    scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
    REQUIRE(ctx);
    REQUIRE(seccomp_rule_add(ctx, SCMP_ACT_ERRNO(errnum), CACHESTAT_NR, 0) == 0);
    REQUIRE(seccomp_load(ctx) == 0);
    seccomp_release(ctx);
}

static void write_file(const char *path, const uint8_t *buf, size_t len, bool sync)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    REQUIRE(fd >= 0);
    REQUIRE(write(fd, buf, len) == (ssize_t)len);
    if (sync)
        REQUIRE(fsync(fd) == 0);
    close(fd);
}

static uint64_t resident(const char *path)
{
    struct vmsnap_pcache_stat st;
    struct vmsnap_err err = {0};
    int fd = open(path, O_RDONLY);
    REQUIRE(fd >= 0);
    CHECKF(vmsnap_pcache_stat_fd(fd, &st, &err) == 0, "%s", err.msg);
    close(fd);
    CHECK(st.mincore); /* the fallback says so */
    CHECK(st.dirty == 0 && st.writeback == 0 && st.evicted == 0);
    return st.cached;
}

/* Runs in a child under the filter; returns the number of failed checks. */
static int child(int errnum, const char *dir, const uint8_t *buf)
{
    vmsnap_set_log(count_log, NULL, VMSNAP_LOG_WARN);
    load_filter(errnum);
    char stage[600], keep[600], dirty[600];
    REQUIRE(strlen(dir) < 512);
    snprintf(stage, sizeof(stage), "%s/stage", dir);
    snprintf(keep, sizeof(keep), "%s/stage/keep.img", dir);
    snprintf(dirty, sizeof(dirty), "%s/stage/dirty.img", dir);
    REQUIRE(t_sh("mkdir -p '%s/stage/sub'", dir) == 0);
    write_file(keep, buf, LEN, true);
    REQUIRE(t_sh("cat '%s' > /dev/null", keep) == 0);
    write_file(dirty, buf, LEN, false);
    char a[700], b[700];
    snprintf(a, sizeof(a), "%s/mem.img", stage);
    snprintf(b, sizeof(b), "%s/sub/disk.img", stage);
    write_file(a, buf, LEN, false);
    write_file(b, buf, LEN, true);

    CHECK(!vmsnap_pcache_cachestat_available());
    CHECK(resident(keep) == PAGES);

    struct vmsnap_pcache_retrier *r;
    struct vmsnap_err err = {0};
    REQUIRE(vmsnap_pcache_retrier_new(NULL, 0, &r, &err) == 0);
    const char *preserve[] = {"keep.img", "dirty.img", NULL};
    struct vmsnap_pcache_report rep = {0};
    CHECKF(vmsnap_pcache_release_dir(stage, preserve, r, &rep, &err) == 0, "%s", err.msg);
    /* Staged truncation works without cachestat. */
    CHECK(!t_exists(a) && !t_exists(b) && rep.removed_files == 2 && rep.removed_bytes == 2 * LEN);
    /* Preserved files: a no-op, counted as unknown, nothing scheduled. */
    CHECK(rep.unknown_files == 2 && rep.dropped_files == 0 && rep.scheduled == 0);
    CHECK(resident(keep) == PAGES);
    size_t got;
    uint8_t *k = t_read_file(keep, &got);
    CHECK(k && got == LEN && memcmp(k, buf, LEN) == 0);
    free(k);
    uint8_t *d = t_read_file(dirty, &got);
    CHECK(d && got == LEN && memcmp(d, buf, LEN) == 0);
    free(d);

    /* Preserve-mode evict and drop_written: no-ops again, no further log line. */
    memset(&rep, 0, sizeof(rep));
    CHECK(vmsnap_pcache_evict(stage, NULL, &rep, &err) == 0);
    CHECK(vmsnap_pcache_drop_written(keep, true, r, &rep, &err) == 0);
    CHECK(rep.unknown_files == 3 && rep.dropped_files == 0 && rep.kicked == 0);
    CHECK(resident(keep) == PAGES);
    struct vmsnap_pcache_stat total;
    CHECK(vmsnap_pcache_stat_path(stage, NULL, NULL, &total, &err) == 0);
    CHECK(total.mincore && total.files == 2 && total.cached == 2 * PAGES);
    vmsnap_pcache_retrier_free(r);

    CHECKF(log_lines == 1, "%d log lines (last: %s)", log_lines, last_log);
    CHECK(strstr(last_log, "cachestat") != NULL);
    CHECK(strstr(last_log, errnum == ENOSYS ? "not supported" : "denied") != NULL);
    return t_failures;
}

/* The CLI under the filter: exactly one warning line, staged removal, preserved file intact. */
static void cli_child(int errnum, const char *dir, const char *bin)
{
    char errpath[600];
    snprintf(errpath, sizeof(errpath), "%s/cli.err", dir);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        int fd = open(errpath, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0 || dup2(fd, 2) < 0)
            _exit(126);
        load_filter(errnum);
        char stage[512], keep[512];
        snprintf(stage, sizeof(stage), "%s/cli", dir);
        snprintf(keep, sizeof(keep), "%s/cli/keep.img", dir);
        execl(bin, bin, "cache", "evict", "--staged", "--preserve", keep, stage, (char *)NULL);
        _exit(127);
    }
    int status;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0, "CLI status %d", status);
    CHECK(t_sh("test \"$(grep -c . '%s')\" = 1 && grep -q cachestat '%s'", errpath, errpath) == 0);
    CHECK(!t_exists(t_path("cli/gone.img")));
    CHECK(t_sh("cmp -s '%s' '%s'", t_path("cli/keep.img"), t_path("orig.img")) == 0);
}

int main(void)
{
    const char *bin = getenv("VMSNAP_BIN");
    if (seccomp_api_get() < 1)
        t_skip("seccomp filters are not supported here");
    uint8_t *buf = malloc(LEN);
    REQUIRE(buf);
    uint64_t s = 7;
    for (size_t i = 0; i < LEN; i += 8) {
        uint64_t v = t_rand(&s);
        memcpy(buf + i, &v, 8);
    }
    static const int errs[] = {ENOSYS, EPERM};
    for (int i = 0; i < 2; i++) {
        char dir[512];
        snprintf(dir, sizeof(dir), "%s/%s", t_tmpdir(), errs[i] == ENOSYS ? "enosys" : "eperm");
        REQUIRE(t_sh("mkdir -p '%s'", dir) == 0);
        fflush(NULL);
        pid_t pid = fork();
        REQUIRE(pid >= 0);
        if (pid == 0)
            _exit(child(errs[i], dir, buf) ? 1 : 0);
        int status;
        REQUIRE(waitpid(pid, &status, 0) == pid);
        CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0, "%s child: status %d",
               strerror(errs[i]), status);

        if (!bin)
            continue;
        write_file(t_path("orig.img"), buf, LEN, true);
        REQUIRE(t_sh("mkdir -p '%s' && cp '%s' '%s' && cp '%s' '%s'", t_path("cli"),
                     t_path("orig.img"), t_path("cli/keep.img"), t_path("orig.img"),
                     t_path("cli/gone.img")) == 0);
        cli_child(errs[i], t_tmpdir(), bin);
    }
    free(buf);
    return t_done();
}
