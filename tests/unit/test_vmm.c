/* SPDX-License-Identifier: Apache-2.0 */
/* Unit test of the vmm module's pure helpers: QMP reply classification, status mapping, QEMU
 * option escaping, the accelerator's cpuinfo check, config path rewriting (unknown keys and
 * numbers survive), and handle validation; the removal of stages and VM directories
 * (sys_rm_tree) against a directory swapped for a link while it runs. The QEMU paths
 * themselves are covered by the vm_* integration tests with a real guest. */
#include "sys/sys.h"
#include "t.h"
#include "vm/vm_int.h"
#include "vmm/vmm_int.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
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

static void test_qmp_parse(void)
{
    struct vmsnap_err e = {0};
    json_object *ret = NULL;
    CHECK(qmp_parse_reply("{\"return\": {\"status\": \"running\"}}", "query-status", &ret, &e) ==
          1);
    json_object *st = NULL;
    CHECK(ret && json_object_object_get_ex(ret, "status", &st) &&
          !strcmp(json_object_get_string(st), "running"));
    json_object_put(ret);
    CHECK(qmp_parse_reply("{\"return\": {}}", "stop", NULL, &e) == 1);
    CHECK(qmp_parse_reply("{\"QMP\": {\"version\": {}}}", "greeting", &ret, &e) == 0);
    CHECK(ret == NULL);
    CHECK(qmp_parse_reply("{\"event\": \"STOP\", \"timestamp\": {}}", "stop", &ret, &e) == 0);
    int rc =
        qmp_parse_reply("{\"error\": {\"class\": \"GenericError\", \"desc\": \"no such file\"}}",
                        "migrate", &ret, &e);
    CHECK(rc == -EIO && e.code == EIO);
    CHECKF(strstr(e.msg, "migrate") && strstr(e.msg, "GenericError") &&
               strstr(e.msg, "no such file"),
           "%s", e.msg);
    CHECK(qmp_parse_reply("{\"return\": ", "cont", &ret, &e) == -EPROTO);
    CHECKF(strstr(e.msg, "cont") != NULL, "%s", e.msg);
    CHECK(qmp_parse_reply("[1, 2]", "cont", &ret, &e) == -EPROTO);
    CHECK(qmp_parse_reply("{\"id\": 1}", "cont", &ret, &e) == -EPROTO);
    CHECK(qmp_parse_reply("", "cont", &ret, &e) == -EPROTO);
}

static void test_status(void)
{
    CHECK(qmp_status_state("running") == VMSNAP_VMM_RUNNING);
    CHECK(qmp_status_state("paused") == VMSNAP_VMM_PAUSED);
    CHECK(qmp_status_state("postmigrate") == VMSNAP_VMM_PAUSED);
    CHECK(qmp_status_state("inmigrate") == VMSNAP_VMM_INCOMING);
    CHECK(qmp_status_state("internal-error") == VMSNAP_VMM_OTHER);
    CHECK(qmp_status_state("io-error") == VMSNAP_VMM_IO_ERROR);
    CHECK(!strcmp(vmsnap_vmm_state_name(VMSNAP_VMM_IO_ERROR), "io-error"));
    CHECK(!strcmp(vmsnap_vmm_state_name(VMSNAP_VMM_DEAD), "dead"));
}

static void test_escape(void)
{
    char out[16];
    CHECK(qemu_opt_escape("/a,b,,c", out, sizeof(out)) == 0 && !strcmp(out, "/a,,b,,,,c"));
    CHECK(qemu_opt_escape("", out, sizeof(out)) == 0 && !strcmp(out, ""));
    CHECK(qemu_opt_escape("0123456789abcde", out, sizeof(out)) == -ENAMETOOLONG);
    CHECK(qemu_opt_escape(",,,,,,,,", out, sizeof(out)) == -ENAMETOOLONG);
}

static void test_cpuinfo(void)
{
    CHECK(vmm_cpuinfo_has_virt("processor\t: 0\nflags\t\t: fpu vme vmx sse\n"));
    CHECK(vmm_cpuinfo_has_virt("flags\t\t: fpu svm\n"));
    CHECK(!vmm_cpuinfo_has_virt("flags\t\t: fpu vmxx svm_lock hypervisor\n"));
    CHECK(!vmm_cpuinfo_has_virt("model name\t: vmx svm\nflags\t\t: fpu\n"));
    CHECK(!vmm_cpuinfo_has_virt(""));
    const char *a = NULL;
    struct vmsnap_err e = {0};
    CHECK(vmsnap_vmm_pick_accel("tcg", &a, &e) == 0 && !strcmp(a, "tcg"));
    CHECK(vmsnap_vmm_pick_accel("bogus", &a, &e) == -EINVAL);
    CHECKF(strstr(e.msg, "bogus") != NULL, "%s", e.msg);
    CHECK(vmsnap_vmm_pick_accel(NULL, &a, &e) == 0 && (!strcmp(a, "tcg") || !strcmp(a, "kvm")));
}

static void test_rewrite(void)
{
    struct vmsnap_err e = {0};
    json_object *cfg = json_tokener_parse(
        "{\"kernel\": \"/k\", \"memory\": 9007199254740993, \"ram_path\": \"/old/ram\","
        "\"disks\": [{\"cid\": \"vda\", \"path\": \"/old/disk\", \"x-extra\": [1, 2.5]}],"
        "\"run_dir\": \"/old\", \"unknown\": {\"nested\": true}}");
    REQUIRE(cfg);
    CHECK(vm_config_rewrite(cfg, "/new/disk", "/new/ram", "/new", &e) == 0);
    const char *s = json_object_to_json_string_ext(cfg, JSON_C_TO_STRING_PLAIN);
    CHECKF(strstr(s, "\"path\":\"\\/new\\/disk\"") && strstr(s, "\"ram_path\":\"\\/new\\/ram\"") &&
               strstr(s, "\"run_dir\":\"\\/new\"") && strstr(s, "\"kernel\":\"\\/k\"") &&
               strstr(s, "9007199254740993") && strstr(s, "\"x-extra\":[1,2.5]") &&
               strstr(s, "\"unknown\":{\"nested\":true}") && !strstr(s, "/old"),
           "%s", s);
    json_object_put(cfg);
    cfg = json_tokener_parse("{\"disks\": []}");
    CHECK(vm_config_rewrite(cfg, "/d", NULL, NULL, &e) == -EINVAL);
    CHECK(vm_config_rewrite(cfg, NULL, "/r", NULL, &e) == 0);
    json_object_put(cfg);
}

static void test_new(void)
{
    struct vmsnap_err e = {0};
    struct vmsnap_vmm *v = NULL;
    struct vmsnap_vmm_config c = {.kernel = "/k",
                                  .mem = 256ull << 20,
                                  .cpus = 1,
                                  .ram_path = "/dev/shm/r",
                                  .accel = "tcg",
                                  .run_dir = "/tmp/x"};
    CHECK(vmsnap_vmm_new(NULL, &c, &v, &e) == 0 && v);
    vmsnap_vmm_free(v);
    CHECK(vmsnap_vmm_new("firecracker", &c, &v, &e) == -EINVAL && !v);
    c.mem = (256ull << 20) + 4096;
    CHECK(vmsnap_vmm_new(NULL, &c, &v, &e) == -EINVAL);
    c.mem = 256ull << 20;
    c.cpus = 0;
    CHECK(vmsnap_vmm_new(NULL, &c, &v, &e) == -EINVAL);
    c.cpus = 1;
    char longdir[200];
    memset(longdir, 'd', sizeof(longdir) - 1);
    longdir[0] = '/';
    longdir[sizeof(longdir) - 1] = 0;
    c.run_dir = longdir;
    CHECK(vmsnap_vmm_new(NULL, &c, &v, &e) == -ENAMETOOLONG && !v);
    CHECKF(strstr(e.msg, "--state-dir") != NULL, "%s", e.msg);
    vmsnap_vmm_free(NULL);
}

/* Errors wrapped many times (vm -> xfer -> store) keep the outermost context and the root
 * cause when they outgrow the message: the middle goes. */
static void test_err_wrap(void)
{
    struct vmsnap_err e = {0};
    vmsnap_err_set(&e, ENOSPC, "write /x/memory-ranges: No space left on device");
    vmsnap_err_wrap(&e, "short: ");
    CHECKF(!strcmp(e.msg, "short: write /x/memory-ranges: No space left on device"), "%s", e.msg);
    char pre[200];
    for (int i = 0; i < 20; i++) {
        snprintf(pre, sizeof(pre), "level %02d %0150d: ", i, 0);
        vmsnap_err_wrap(&e, "%s", pre);
    }
    size_t n = strlen(e.msg);
    CHECKF(n == sizeof(e.msg) - 1, "length %zu", n);
    CHECKF(!strncmp(e.msg, "level 19 ", 9), "%.40s", e.msg);
    const char *cause = "No space left on device";
    CHECKF(!strcmp(e.msg + n - strlen(cause), cause), "%s", e.msg + n - 40);
    CHECK(strstr(e.msg, " ... ") != NULL);
    CHECK(e.code == ENOSPC);
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
    test_err_wrap();
    test_qmp_parse();
    test_status();
    test_escape();
    test_cpuinfo();
    test_rewrite();
    test_new();
    test_rm_tree_race();
    return t_done();
}
