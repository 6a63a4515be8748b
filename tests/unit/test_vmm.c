/* SPDX-License-Identifier: Apache-2.0 */
/* Unit test of the vmm module's pure helpers: QMP reply classification, status mapping, QEMU
 * option escaping, the accelerator's cpuinfo check, config path rewriting (unknown keys and
 * numbers survive), handle validation, and a state probe that does not ask the VMM. The QEMU paths
 * themselves are covered by the vm_* integration tests with a real guest. */
#include "t.h"
#include "vm/vm_int.h"
#include "vmm/vmm_int.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

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

/* The VM lock: a copy of this process's lock descriptor in a child it forked (QEMU's start for
 * another VM, in vmsnapd) outlives the lock's release for a moment; the next command of this
 * process on that VM waits for it (it failed as busy: a density run's resume, 6 ms after the
 * suspend before it). A lock another process holds is busy at once. */
static void test_lock(void)
{
    char sd[512], rd[512], vd[600];
    snprintf(sd, sizeof(sd), "%s/lock-state", t_tmpdir());
    snprintf(rd, sizeof(rd), "%s/lock-ram", t_tmpdir());
    snprintf(vd, sizeof(vd), "%s/vms/x", sd);
    REQUIRE(mkdir(sd, 0700) == 0 && mkdir(rd, 0700) == 0);
    char vms[560];
    snprintf(vms, sizeof(vms), "%s/vms", sd);
    REQUIRE(mkdir(vms, 0700) == 0 && mkdir(vd, 0700) == 0);
    struct vmsnap_vm_opts o = {.state_dir = sd, .ram_dir = rd};
    struct vmsnap_err e = {0};
    struct vmctx c;
    REQUIRE(vm_ctx_init(&c, &o, "x", &e) == 0);
    CHECKF(vm_ctx_lock(&c, &e) == 0, "%s", e.msg);
    pid_t kid = fork();
    REQUIRE(kid >= 0);
    if (kid == 0) { /* holds a copy of the lock's descriptor for a moment, as a forked child does */
        usleep(300 * 1000);
        _exit(0);
    }
    vm_ctx_fini(&c);
    struct vmctx c2;
    REQUIRE(vm_ctx_init(&c2, &o, "x", &e) == 0);
    CHECKF(vm_ctx_lock(&c2, &e) == 0, "a lock our child still held for a moment: %s", e.msg);
    int st;
    REQUIRE(waitpid(kid, &st, 0) == kid);
    vm_ctx_fini(&c2);
    /* another process's lock */
    int p[2];
    REQUIRE(pipe(p) == 0);
    kid = fork();
    REQUIRE(kid >= 0);
    if (kid == 0) {
        int fd = open(vd, O_RDONLY | O_DIRECTORY);
        char b = fd >= 0 && flock(fd, LOCK_EX) == 0 ? 'y' : 'n';
        if (write(p[1], &b, 1) != 1)
            _exit(1);
        pause();
        _exit(0);
    }
    char b = 0;
    REQUIRE(read(p[0], &b, 1) == 1 && b == 'y');
    struct vmctx c3;
    REQUIRE(vm_ctx_init(&c3, &o, "x", &e) == 0);
    CHECK(vm_ctx_lock(&c3, &e) == -EBUSY);
    CHECKF(strstr(e.msg, "is busy: another vmsnap command holds") != NULL, "%s", e.msg);
    CHECK(vm_lock_holder(vd, false) == kid && vm_lock_holder(vd, true) == 0);
    vm_ctx_fini(&c3);
    kill(kid, SIGKILL);
    REQUIRE(waitpid(kid, &st, 0) == kid);
    close(p[0]);
    close(p[1]);
}

/* vmsnap_vmm_set_reply_wait(< 0): the state of a live VMM comes from its pid alone (vm ls of a
 * VM another command holds), the VMM is not asked; by default it is. A shell whose command line
 * names the handle's QMP socket as QEMU's does stands in for QEMU (nothing listens there). */
static void test_reply_wait(void)
{
    char dir[600], opt[700], pidfile[700];
    snprintf(dir, sizeof(dir), "%s/rw", t_tmpdir());
    REQUIRE(mkdir(dir, 0700) == 0);
    struct vmsnap_err e = {0};
    struct vmsnap_vmm *v = NULL;
    struct vmsnap_vmm_config c = {.kernel = "/k",
                                  .mem = 256ull << 20,
                                  .cpus = 1,
                                  .ram_path = "/dev/shm/r",
                                  .accel = "tcg",
                                  .run_dir = dir};
    REQUIRE(vmsnap_vmm_new(NULL, &c, &v, &e) == 0);
    snprintf(opt, sizeof(opt), "unix:%s/qmp.sock,server=on,wait=off", dir);
    pid_t child = fork();
    REQUIRE(child >= 0);
    if (child == 0) {
        setpgid(0, 0); /* its sleep goes with it */
        execlp("sh", "sh", "-c", "sleep 30; :", "sh", opt, (char *)NULL);
        _exit(127);
    }
    setpgid(child, child); /* (either side may get there first) */
    snprintf(pidfile, sizeof(pidfile), "%s/pid", dir);
    FILE *f = fopen(pidfile, "w");
    REQUIRE(f && fprintf(f, "%d\n", (int)child) > 0 && fclose(f) == 0);
    enum vmsnap_vmm_state st = VMSNAP_VMM_DEAD;
    pid_t pid = 0;
    int rc = -1;
    for (int i = 0; i < 100 && (rc != 0 || st != VMSNAP_VMM_OTHER); i++) { /* until it runs sh */
        usleep(20 * 1000);
        vmsnap_vmm_set_reply_wait(v, -1);
        rc = vmsnap_vmm_state(v, &st, &pid, &e);
    }
    CHECKF(rc == 0 && st == VMSNAP_VMM_OTHER && pid == child, "rc %d, state %s, pid %d", rc,
           vmsnap_vmm_state_name(st), (int)pid);
    vmsnap_vmm_set_reply_wait(v, 0); /* asked: nothing answers on its socket */
    rc = vmsnap_vmm_state(v, &st, &pid, &e);
    CHECKF(rc < 0 && strstr(e.msg, "qmp.sock"), "rc %d: %s", rc, e.msg);
    kill(-child, SIGKILL);
    waitpid(child, NULL, 0);
    CHECK(vmsnap_vmm_state(v, &st, &pid, &e) == 0 && st == VMSNAP_VMM_DEAD && pid == 0);
    vmsnap_vmm_free(v);
}

int main(void)
{
    test_qmp_parse();
    test_status();
    test_escape();
    test_cpuinfo();
    test_rewrite();
    test_new();
    test_reply_wait();
    test_lock();
    return t_done();
}
