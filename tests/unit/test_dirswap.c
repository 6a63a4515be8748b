/* SPDX-License-Identifier: Apache-2.0 */
/* sys_dir_swap (lib/sys/dirswap.c): several files of a directory replaced at once. The new state
 * has the replaced files new, the kept ones the same inodes, no temporaries and no sibling left;
 * a swap that cannot be done changes nothing; a process killed before or after the exchange
 * leaves the old directory or the new one, whole, and the sweep removes what it left beside. */
#include "sys/sys.h"
#include "t.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static void put(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    REQUIRE(f);
    fputs(text, f);
    fclose(f);
}

static bool holds(const char *path, const char *text)
{
    size_t n = 0;
    uint8_t *b = t_read_file(path, &n);
    bool ok = b && n == strlen(text) && !memcmp(b, text, n);
    free(b);
    return ok;
}

static ino_t ino(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 ? sb.st_ino : 0;
}

/* entries of `dir` whose name starts with `prefix` */
static int count(const char *dir, const char *prefix)
{
    DIR *d = opendir(dir);
    REQUIRE(d);
    int n = 0;
    for (struct dirent *de; (de = readdir(d));)
        n += !strncmp(de->d_name, prefix, strlen(prefix));
    closedir(d);
    return n;
}

static bool skip_set(const char *name, void *arg)
{
    (void)arg;
    return !strcmp(name, "a") || !strcmp(name, "b") || !strncmp(name, ".tmp", 4);
}

/* dir/{a,b,keep} old, dir/.tmp1 and .tmp2 the new a and b, dir/.tmp3 a new file d */
static void setup(char *dir, size_t len, const char *name)
{
    snprintf(dir, len, "%s/%s", t_tmpdir(), name);
    REQUIRE(mkdir(dir, 0750) == 0);
    char p[4200];
    const char *const files[][2] = {{"a", "old a"},       {"b", "old b"},     {"keep", "kept"},
                                    {".tmp1", "new a"},   {".tmp2", "new b"}, {".tmp3", "new d"},
                                    {".hidden", "theirs"}};
    for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
        snprintf(p, sizeof(p), "%s/%s", dir, files[i][0]);
        put(p, files[i][1]);
    }
}

static int swap_all(const char *dir, struct vmsnap_err *err)
{
    struct sys_dir_swap s;
    char from[4200];
    int rc = sys_dir_swap_begin(&s, dir, skip_set, NULL, err);
    const char *const add[][2] = {{".tmp1", "a"}, {".tmp2", "b"}, {".tmp3", "d"}};
    for (size_t i = 0; rc == 0 && i < 3; i++) {
        snprintf(from, sizeof(from), "%s/%s", dir, add[i][0]);
        rc = sys_dir_swap_add(&s, from, add[i][1], err);
    }
    if (rc == 0)
        rc = sys_dir_swap_commit(&s, true, err);
    else
        sys_dir_swap_abort(&s);
    return rc;
}

static void check_new(const char *dir, ino_t keep_ino)
{
    char p[4200];
    snprintf(p, sizeof(p), "%s/a", dir);
    CHECK(holds(p, "new a"));
    snprintf(p, sizeof(p), "%s/b", dir);
    CHECK(holds(p, "new b"));
    snprintf(p, sizeof(p), "%s/d", dir);
    CHECK(holds(p, "new d"));
    snprintf(p, sizeof(p), "%s/keep", dir);
    CHECK(holds(p, "kept"));
    CHECK(ino(p) == keep_ino); /* kept by a link: the same file */
    snprintf(p, sizeof(p), "%s/.hidden", dir);
    CHECK(holds(p, "theirs")); /* another program's hidden file is kept too */
    CHECK(count(dir, ".tmp") == 0);
}

static void check_old(const char *dir)
{
    char p[4200];
    snprintf(p, sizeof(p), "%s/a", dir);
    CHECK(holds(p, "old a"));
    snprintf(p, sizeof(p), "%s/b", dir);
    CHECK(holds(p, "old b"));
    snprintf(p, sizeof(p), "%s/d", dir);
    CHECK(!t_exists(p));
    snprintf(p, sizeof(p), "%s/.tmp1", dir);
    CHECK(holds(p, "new a")); /* the caller's temporaries are where they were */
}

/* a child swapping with VMSNAP_FAILPOINT=fp, killed there */
static void killed_at(const char *fp, const char *name, bool swapped)
{
    char dir[4096], p[4200];
    setup(dir, sizeof(dir), name);
    snprintf(p, sizeof(p), "%s/keep", dir);
    ino_t keep = ino(p);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        setenv("VMSNAP_FAILPOINT", fp, 1);
        struct vmsnap_err e = {0};
        swap_all(dir, &e);
        _exit(3); /* not reached: the failpoint kills */
    }
    int st = 0;
    REQUIRE(waitpid(pid, &st, 0) == pid);
    CHECKF(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "%s: not killed at the failpoint", fp);
    if (swapped)
        check_new(dir, keep);
    else
        check_old(dir);
    char side[4200];
    snprintf(side, sizeof(side), ".%s.vmsnap-swap.", name);
    CHECKF(count(t_tmpdir(), side) == 1, "%s: the killed swap's sibling is there", fp);
    sys_dir_swap_sweep(dir);
    CHECKF(count(t_tmpdir(), side) == 0, "%s: the sweep removed the sibling", fp);
    if (swapped)
        check_new(dir, keep);
    else
        check_old(dir);
}

int main(void)
{
    struct vmsnap_err err = {0};
    struct sys_dir_swap s;
    char dir[4096], p[4200];

    /* the whole swap: new files in, kept files kept, mode kept, nothing left beside */
    setup(dir, sizeof(dir), "set");
    snprintf(p, sizeof(p), "%s/keep", dir);
    ino_t keep = ino(p);
    ino_t dir_before = ino(dir);
    CHECKF(swap_all(dir, &err) == 0, "%s", err.msg);
    check_new(dir, keep);
    struct stat sb;
    REQUIRE(stat(dir, &sb) == 0);
    CHECK((sb.st_mode & 07777) == 0750);
    CHECK(sb.st_ino != dir_before); /* it is a new directory */
    CHECK(count(t_tmpdir(), ".set.vmsnap-swap.") == 0);

    /* a subdirectory: refused before anything, nothing changed */
    setup(dir, sizeof(dir), "withsub");
    snprintf(p, sizeof(p), "%s/sub", dir);
    REQUIRE(mkdir(p, 0700) == 0);
    vmsnap_err_clear(&err);
    CHECK(swap_all(dir, &err) == -EOPNOTSUPP);
    CHECKF(strstr(err.msg, "holds a directory (sub)"), "%s", err.msg);
    check_old(dir);
    CHECK(count(t_tmpdir(), ".withsub.vmsnap-swap.") == 0);

    /* an abort after the adds: nothing in the directory changed, the sibling is gone */
    setup(dir, sizeof(dir), "aborted");
    REQUIRE(sys_dir_swap_begin(&s, dir, skip_set, NULL, &err) == 0);
    snprintf(p, sizeof(p), "%s/.tmp1", dir);
    REQUIRE(sys_dir_swap_add(&s, p, "a", &err) == 0);
    CHECK(count(t_tmpdir(), ".aborted.vmsnap-swap.") == 1);
    sys_dir_swap_abort(&s);
    check_old(dir);
    CHECK(count(t_tmpdir(), ".aborted.vmsnap-swap.") == 0);

    /* through a symlink to the directory (with a trailing slash too): the directory is swapped
     * where it is, the link stays a link (the link itself was swapped for a directory) */
    setup(dir, sizeof(dir), "real");
    snprintf(p, sizeof(p), "%s/lnk", t_tmpdir());
    REQUIRE(symlink("real", p) == 0);
    snprintf(p, sizeof(p), "%s/keep", dir);
    keep = ino(p);
    char via[4200];
    snprintf(via, sizeof(via), "%s/lnk/", t_tmpdir());
    vmsnap_err_clear(&err);
    CHECKF(swap_all(via, &err) == 0, "%s", err.msg);
    check_new(dir, keep);
    snprintf(p, sizeof(p), "%s/lnk", t_tmpdir());
    struct stat lb;
    CHECK(lstat(p, &lb) == 0 && S_ISLNK(lb.st_mode));
    CHECK(count(t_tmpdir(), ".lnk.vmsnap-swap.") == 0 &&
          count(t_tmpdir(), ".real.vmsnap-swap.") == 0);

    /* an entry made in the directory after the new state was built: not swapped (that entry
     * would be lost), nothing changed, the sibling gone */
    setup(dir, sizeof(dir), "changed");
    vmsnap_err_clear(&err);
    REQUIRE(sys_dir_swap_begin(&s, dir, skip_set, NULL, &err) == 0);
    snprintf(p, sizeof(p), "%s/.tmp1", dir);
    REQUIRE(sys_dir_swap_add(&s, p, "a", &err) == 0);
    snprintf(p, sizeof(p), "%s/late", dir);
    put(p, "late");
    CHECK(sys_dir_swap_commit(&s, false, &err) < 0 && !s.swapped);
    CHECKF(strstr(err.msg, "changed while"), "%s", err.msg);
    check_old(dir);
    CHECK(holds(p, "late"));
    CHECK(count(t_tmpdir(), ".changed.vmsnap-swap.") == 0);

    /* killed before and after the exchange */
    killed_at("dir-swap-exchange", "k1", false);
    killed_at("dir-swap-exchanged", "k2", true);

    /* a sibling of a live process (this one) is not swept */
    setup(dir, sizeof(dir), "live");
    REQUIRE(sys_dir_swap_begin(&s, dir, skip_set, NULL, &err) == 0);
    sys_dir_swap_sweep(dir);
    CHECK(count(t_tmpdir(), ".live.vmsnap-swap.") == 1);
    sys_dir_swap_abort(&s);
    return t_done();
}
