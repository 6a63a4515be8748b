/* SPDX-License-Identifier: Apache-2.0 */
/* Unit test of the sys module's path helpers: sys_canon_path and sys_lexical_path give one
 * string for every spelling of a path; the removal of stages and VM directories (sys_rm_tree)
 * against a directory swapped for a link while it runs. */
#include "sys/sys.h"
#include "t.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

/* The attacker of test_rm_tree_race, run inside the first removal of a file named "f*" in the
 * tree: the directory being emptied is renamed away and a link to the victim put in its place
 * (what a local user can do to a stage in /dev/shm). unlink and unlinkat of this program
 * replace libc's for the library code linked into it. */
static const char *race_dir, *race_moved, *race_victim;
static int race_armed;

static void race_fire(const char *name)
{
    const char *base = strrchr(name, '/');
    base = base ? base + 1 : name;
    if (race_armed && base[0] == 'f') {
        race_armed = 0;
        if (rename(race_dir, race_moved) == 0 && symlink(race_victim, race_dir) != 0)
            perror("symlink");
    }
}

int unlinkat(int dfd, const char *name, int flags)
{
    race_fire(name);
    return (int)syscall(SYS_unlinkat, dfd, name, flags);
}

int unlink(const char *name)
{
    race_fire(name);
    return (int)syscall(SYS_unlinkat, AT_FDCWD, name, 0);
}

static void mkfile(const char *dir, const char *name)
{
    char p[700];
    snprintf(p, sizeof(p), "%s/%s", dir, name);
    int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    REQUIRE(fd >= 0);
    close(fd);
}

static int count_files(const char *dir)
{
    int n = 0;
    char p[700];
    for (int i = 0; i < 50; i++) {
        snprintf(p, sizeof(p), "%s/f%02d", dir, i);
        n += access(p, F_OK) == 0;
    }
    return n;
}

static void test_rm_tree_race(void)
{
    char tree[512], d[600], moved[600], victim[600], link[600];
    snprintf(tree, sizeof(tree), "%s/stage", t_tmpdir());
    snprintf(d, sizeof(d), "%s/d", tree);
    snprintf(moved, sizeof(moved), "%s/moved", t_tmpdir());
    snprintf(victim, sizeof(victim), "%s/victim", t_tmpdir());
    snprintf(link, sizeof(link), "%s/link", tree);
    REQUIRE(mkdir(tree, 0700) == 0 && mkdir(d, 0700) == 0 && mkdir(victim, 0700) == 0);
    for (int i = 0; i < 50; i++) {
        char n[8];
        snprintf(n, sizeof(n), "f%02d", i);
        mkfile(d, n);
        mkfile(victim, n);
    }
    REQUIRE(symlink(victim, link) == 0); /* a link in the tree: removed, never followed */
    race_dir = d;
    race_moved = moved;
    race_victim = victim;
    race_armed = 1;
    int rc = sys_rm_tree(tree);
    CHECKF(race_armed == 0, "the race never ran");
    CHECKF(count_files(victim) == 50, "%d of 50 files outside the tree are left",
           count_files(victim));
    CHECKF(rc == 0 && access(tree, F_OK) != 0, "rc %d, tree %s", rc,
           access(tree, F_OK) ? "gone" : "still there");
    /* the directory renamed away was emptied where it went (its descriptor was held) */
    CHECKF(count_files(moved) == 0, "%d files left in the renamed directory", count_files(moved));
    /* a root that is a link: the link goes, not its target */
    char l2[600];
    snprintf(l2, sizeof(l2), "%s/l2", t_tmpdir());
    REQUIRE(symlink(victim, l2) == 0);
    CHECK(sys_rm_tree(l2) == 0 && access(l2, F_OK) != 0 && count_files(victim) == 50);
    /* a path ending in ".." is refused (never give this function a system path here: a
     * regression must only ever reach the test's own directory) */
    char up[600];
    snprintf(up, sizeof(up), "%s/nothere/..", t_tmpdir());
    CHECK(sys_rm_tree(up) == -EINVAL && access(t_tmpdir(), F_OK) == 0);
}

/* sys_canon_path: one string for every spelling of a directory, existing or not yet */
static void test_canon_path(void)
{
    char base[512], real[PATH_MAX], sp[700], lnk[600], out[PATH_MAX], want[PATH_MAX + 16];
    snprintf(base, sizeof(base), "%s/canon", t_tmpdir());
    REQUIRE(mkdir(base, 0700) == 0 && realpath(base, real));
    snprintf(lnk, sizeof(lnk), "%s/via", t_tmpdir());
    REQUIRE(symlink(base, lnk) == 0);
    /* existing: trailing and doubled slashes, ".", a symlinked spelling */
    const char *sfx[] = {"", "/", "//", "/."};
    for (size_t i = 0; i < sizeof(sfx) / sizeof(sfx[0]); i++) {
        snprintf(sp, sizeof(sp), "%s%s", base, sfx[i]);
        CHECKF(sys_canon_path(sp, out) == 0 && !strcmp(out, real), "%s -> %s", sp, out);
        snprintf(sp, sizeof(sp), "%s%s", lnk, sfx[i]);
        CHECKF(sys_canon_path(sp, out) == 0 && !strcmp(out, real), "%s -> %s", sp, out);
    }
    /* not there yet: the existing part resolved, the rest appended cleanly */
    snprintf(want, sizeof(want), "%s/new/state", real);
    snprintf(sp, sizeof(sp), "%s//new/./state/", lnk);
    CHECKF(sys_canon_path(sp, out) == 0 && !strcmp(out, want), "%s -> %s", sp, out);
    snprintf(sp, sizeof(sp), "%s/new/state", base);
    CHECKF(sys_canon_path(sp, out) == 0 && !strcmp(out, want), "%s -> %s", sp, out);
    /* a relative spelling */
    char cwd[PATH_MAX];
    REQUIRE(getcwd(cwd, sizeof(cwd)) && chdir(base) == 0);
    CHECKF(sys_canon_path("new/state", out) == 0 && !strcmp(out, want), "new/state -> %s", out);
    CHECKF(sys_canon_path(".", out) == 0 && !strcmp(out, real), ". -> %s", out);
    REQUIRE(chdir(cwd) == 0);
    /* ".." after a missing part cannot be resolved: refused */
    snprintf(sp, sizeof(sp), "%s/nothere/../x", base);
    CHECK(sys_canon_path(sp, out) == -EINVAL);
    CHECK(sys_canon_path("", out) == -EINVAL);
    CHECK(sys_canon_path("/", out) == 0 && !strcmp(out, "/"));
    /* sys_lexical_path: ".." resolved as text, as the local store names keys */
    CHECK(sys_lexical_path("/a/./b/../c/", out, sizeof(out)) == 0 && !strcmp(out, "/a/c"));
    CHECK(sys_lexical_path("/..", out, sizeof(out)) == 0 && !strcmp(out, "/"));
    CHECK(sys_lexical_path("//", out, sizeof(out)) == 0 && !strcmp(out, "/"));
    CHECK(sys_lexical_path("/a/missing/../b", out, sizeof(out)) == 0 && !strcmp(out, "/a/b"));
    REQUIRE(chdir(base) == 0);
    snprintf(want, sizeof(want), "%s/y", real);
    CHECKF(sys_lexical_path("x/../y", out, sizeof(out)) == 0 && !strcmp(out, want), "-> %s", out);
    snprintf(want, sizeof(want), "%s", real);
    char *sl = strrchr(want, '/');
    if (sl)
        *sl = '\0'; /* the parent of the working directory */
    CHECKF(sys_lexical_path("../", out, sizeof(out)) == 0 && !strcmp(out, want), "-> %s", out);
    REQUIRE(chdir(cwd) == 0);
    CHECK(sys_lexical_path("/abcdef", out, 4) == -ENAMETOOLONG);
}

int main(void)
{
    test_canon_path();
    test_rm_tree_race();
    return t_done();
}
