/* SPDX-License-Identifier: Apache-2.0 */
#include "t.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

int t_failures;
static char tmpdir[256];

void t_skip(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    const char *req = getenv("VMSNAP_REQUIRE_ALL");
    bool required = req && strcmp(req, "1") == 0;
    fprintf(stderr, required ? "FAIL (skip not allowed, VMSNAP_REQUIRE_ALL=1): " : "SKIP: ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    t_cleanup();
    exit(required ? 1 : 77);
}

int t_done(void)
{
    t_cleanup();
    if (t_failures) {
        fprintf(stderr, "FAILED: %d check(s)\n", t_failures);
        return 1;
    }
    fprintf(stderr, "ok\n");
    return 0;
}

const char *t_tmpdir(void)
{
    if (!tmpdir[0]) {
        const char *base = getenv("TMPDIR");
        snprintf(tmpdir, sizeof(tmpdir), "%s/vmsnap-test.XXXXXX", base ? base : "/tmp");
        REQUIRE(mkdtemp(tmpdir) != NULL);
    }
    return tmpdir;
}

void t_cleanup(void)
{
    if (tmpdir[0] && !getenv("VMSNAP_KEEP_TMP")) {
        char cmd[300];
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
        if (system(cmd) != 0)
            fprintf(stderr, "warning: could not remove %s\n", tmpdir);
    }
    tmpdir[0] = '\0';
}

const char *t_path(const char *name)
{
    static char bufs[8][512];
    static int next;
    char *b = bufs[next++ % 8];
    snprintf(b, 512, "%s/%s", t_tmpdir(), name);
    return b;
}

uint64_t t_rand(uint64_t *s)
{
    uint64_t x = *s ? *s : 0x9E3779B97F4A7C15ull;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 0x2545F4914F6CDD1Dull;
}

int t_sh(const char *fmt, ...)
{
    char cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof(cmd), fmt, ap);
    va_end(ap);
    int st = system(cmd);
    if (st < 0)
        return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

uint8_t *t_read_file(const char *path, size_t *len)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return NULL;
    struct stat st;
    if (fstat(fd, &st) < 0) {
        close(fd);
        return NULL;
    }
    uint8_t *buf = malloc((size_t)st.st_size + 1);
    size_t got = 0;
    while (buf && got < (size_t)st.st_size) {
        ssize_t n = read(fd, buf + got, (size_t)st.st_size - got);
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    close(fd);
    if (len)
        *len = got;
    return buf;
}

bool t_files_equal(const char *a, const char *b)
{
    return t_sh("cmp -s '%s' '%s'", a, b) == 0;
}

uint64_t t_allocated(const char *path)
{
    struct stat st;
    if (stat(path, &st) < 0)
        return UINT64_MAX;
    return (uint64_t)st.st_blocks * 512;
}

bool t_exists(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0;
}
