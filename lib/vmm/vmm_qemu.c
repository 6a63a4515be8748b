/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The QEMU driver. QEMU runs in the background in its own session (double fork, so no caller
 * has to reap it), stderr appended to run_dir/qemu.log (not -daemonize, which loses the error
 * messages of a failed start). Guest RAM is a memory-backend-file on the microvm machine; the
 * serial console is a unix socket chardev that also appends to console.log.
 *
 * Control is QMP over run_dir/qmp.sock (vmm_qmp.c), one short connection per operation (greeting,
 * qmp_capabilities, commands, replies one JSON object per line; events are skipped). Snapshot
 * and restore are migrations with the x-ignore-shared capability to and from the state file,
 * whose descriptor vmsnap opens and passes over QMP (getfd, URI fd:), so a share=on RAM file is
 * left out of the state and is itself the memory image. QEMU runs under -sandbox (seccomp: no
 * spawning, no privilege changes, no obsolete or resource-control syscalls).
 *
 * A process is identified by the pid file and confirmed through /proc/<pid>/cmdline naming our
 * QMP socket, so a recycled pid is never signalled.
 */
#include "vmm_int.h"

#include "sys/sys.h"
#include "util/util.h"

#include <limits.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int qemu_opt_escape(const char *s, char *out, size_t len)
{
    size_t o = 0;
    for (; *s; s++) {
        if (o + 2 >= len)
            return -ENAMETOOLONG;
        out[o++] = *s;
        if (*s == ',')
            out[o++] = ',';
    }
    if (o >= len)
        return -ENAMETOOLONG;
    out[o] = 0;
    return 0;
}

/* ---- process ---- */

static pid_t read_pid(struct vmsnap_vmm *v)
{
    /* a regular file only, opened without blocking: a FIFO planted there must not hang us */
    int fd = open(v->pidfile, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0)
        return 0;
    struct stat sb;
    char buf[32];
    ssize_t n = fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) ? read(fd, buf, sizeof(buf) - 1) : -1;
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = 0;
    long pid = strtol(buf, NULL, 10);
    return pid > 1 && pid < INT_MAX ? (pid_t)pid : 0;
}

/* The process exists and is not a zombie. */
static bool proc_alive(pid_t pid)
{
    char path[64], buf[256];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "re");
    if (!f)
        return false;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = 0;
    char *rp = strrchr(buf, ')');
    return rp && rp[1] == ' ' && rp[2] != 'Z' && rp[2] != 'X';
}

/* Alive (not a zombie) and really our QEMU: its command line names our QMP socket. */
static bool pid_is_ours(struct vmsnap_vmm *v, pid_t pid)
{
    if (pid <= 1 || !proc_alive(pid))
        return false;
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/cmdline", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return false;
    size_t cap = 1 << 16;
    char *cl = malloc(cap);
    bool ours = false;
    if (cl) {
        ssize_t r = read(fd, cl, cap - 1);
        if (r > 0) {
            for (ssize_t i = 0; i < r; i++)
                if (!cl[i])
                    cl[i] = ' ';
            cl[r] = 0;
            /* the whole -qmp option as built (commas doubled): a bare substring also matched
             * another VM's socket whose path ends with this one's */
            char qmp[300], opt[340];
            ours = qemu_opt_escape(v->qmp_sock, qmp, sizeof(qmp)) == 0 &&
                   snprintf(opt, sizeof(opt), " unix:%s,server=on,", qmp) < (int)sizeof(opt) &&
                   strstr(cl, opt);
        }
        free(cl);
    }
    close(fd);
    return ours;
}

/* The last lines of qemu.log, for error messages. */
static void log_tail(struct vmsnap_vmm *v, char *out, size_t len)
{
    out[0] = 0;
    int fd = open(v->qemu_log, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    struct stat st;
    if (fstat(fd, &st) == 0) {
        off_t off = st.st_size > (off_t)len - 1 ? st.st_size - (off_t)len + 1 : 0;
        ssize_t r = pread(fd, out, len - 1, off);
        if (r > 0) {
            out[r] = 0;
            while (r > 0 && (out[r - 1] == '\n' || out[r - 1] == '\r'))
                out[--r] = 0;
            for (ssize_t i = 0; i < r; i++)
                if (out[i] == '\n')
                    out[i] = ' ';
        }
    }
    close(fd);
}

#define ARGV_MAX 64

static int build_argv(struct vmsnap_vmm *v, bool incoming, char **argv, char *pool, size_t pool_len,
                      struct vmsnap_err *err)
{
    size_t used = 0;
    int n = 0;
    char ram[4200], disk[4200], log[4200], con[300], qmp[300];
    if (qemu_opt_escape(v->ram_path, ram, sizeof(ram)) < 0 ||
        (v->disk && qemu_opt_escape(v->disk, disk, sizeof(disk)) < 0) ||
        qemu_opt_escape(v->console_log, log, sizeof(log)) < 0 ||
        qemu_opt_escape(v->con_sock, con, sizeof(con)) < 0 ||
        qemu_opt_escape(v->qmp_sock, qmp, sizeof(qmp)) < 0)
        return vmsnap_err_set(err, ENAMETOOLONG, "VM paths too long");
#define ARG(...)                                                                                   \
    do {                                                                                           \
        int w_ = snprintf(pool + used, pool_len - used, __VA_ARGS__);                              \
        if (w_ < 0 || (size_t)w_ >= pool_len - used || n >= ARGV_MAX - 1)                          \
            return vmsnap_err_set(err, E2BIG, "QEMU command line too long");                       \
        argv[n++] = pool + used;                                                                   \
        used += (size_t)w_ + 1;                                                                    \
    } while (0)
    unsigned long long mib = (unsigned long long)(v->mem >> 20);
    ARG("%s", v->qemu);
    ARG("-accel");
    ARG("%s", v->accel);
    ARG("-cpu");
    ARG("%s", strcmp(v->accel, "kvm") ? "max" : "host");
    ARG("-smp");
    ARG("%u", v->cpus);
    ARG("-m");
    ARG("%lluM", mib);
    ARG("-M");
    ARG("microvm,memory-backend=mem");
    ARG("-object");
    ARG("memory-backend-file,id=mem,size=%lluM,mem-path=%s,share=%s", mib, ram,
        v->ram_shared ? "on" : "off");
    ARG("-kernel");
    ARG("%s", v->kernel);
    if (v->initrd) {
        ARG("-initrd");
        ARG("%s", v->initrd);
    }
    if (v->cmdline) {
        ARG("-append");
        ARG("%s", v->cmdline);
    }
    const char *sbx = getenv("VMSNAP_QEMU_SANDBOX"); /* "0": for a QEMU built without seccomp */
    if (!sbx || strcmp(sbx, "0")) {
        ARG("-sandbox");
        ARG("on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny");
    }
    ARG("-nodefaults");
    ARG("-no-user-config");
    ARG("-display");
    ARG("none");
    ARG("-chardev");
    ARG("socket,id=con,path=%s,server=on,wait=off,logfile=%s,logappend=on", con, log);
    ARG("-serial");
    ARG("chardev:con");
    if (v->disk) {
        ARG("-drive");
        ARG("file=%s,format=raw,if=none,id=vda,cache=writeback,discard=unmap", disk);
        ARG("-device");
        ARG("virtio-blk-device,drive=vda");
    }
    ARG("-qmp");
    ARG("unix:%s,server=on,wait=off", qmp);
    ARG("-pidfile");
    ARG("%s", v->pidfile);
    if (incoming) {
        ARG("-incoming");
        ARG("defer");
    }
#undef ARG
    argv[n] = NULL;
    return 0;
}

static int qemu_stop(struct vmsnap_vmm *v, struct vmsnap_err *err);
static void qemu_gone_files(struct vmsnap_vmm *v);

/* QEMU runs the guest: it gets only the environment a VMM needs, never the caller's store
 * credentials (AWS_*, GS_*) or anything else it has no use for. Names kept: */
static bool env_for_qemu(const char *kv)
{
    static const char *const exact[] = {
        "PATH",     "HOME", "USER",   "LOGNAME",         "LANG",
        "LANGUAGE", "TZ",   "TMPDIR", "LD_LIBRARY_PATH", "GLIBC_TUNABLES"};
    static const char *const prefix[] = {"LC_", "QEMU_"};
    size_t n = strcspn(kv, "=");
    for (size_t i = 0; i < sizeof(exact) / sizeof(exact[0]); i++)
        if (strlen(exact[i]) == n && !strncmp(kv, exact[i], n))
            return true;
    for (size_t i = 0; i < sizeof(prefix) / sizeof(prefix[0]); i++)
        if (!strncmp(kv, prefix[i], strlen(prefix[i])) && n > strlen(prefix[i]))
            return true;
    return false;
}

/* Mark every descriptor above 2 close-on-exec (in the child, before exec: none of the caller's
 * files, sockets or pipes reach QEMU; the exec-error pipe still works if exec fails). */
static int cloexec_from_3(void)
{
#ifdef CLOSE_RANGE_CLOEXEC
    if (close_range(3, ~0U, CLOSE_RANGE_CLOEXEC) == 0)
        return 0;
#endif
    long max = sysconf(_SC_OPEN_MAX);
    if (max < 0 || max > (1 << 20))
        max = 1 << 20;
    for (int fd = 3; fd < max; fd++) {
        int fl = fcntl(fd, F_GETFD);
        if (fl >= 0 && !(fl & FD_CLOEXEC) && fcntl(fd, F_SETFD, fl | FD_CLOEXEC) < 0)
            return -1;
    }
    return 0;
}

/* In a child at once: every descriptor from 3 on closed but `a` and `b`. The caller's (in
 * vmsnapd, every operation's: their VM directories' locks, store connections, the daemon's
 * socket) were held by the children until QEMU's exec, through a second fork: a VM lock released
 * meanwhile stayed taken and the VM's next command failed as busy. Best effort (close_range):
 * close-on-exec covers the rest. */
static void close_but(int a, int b)
{
    int lo = a < b ? a : b, hi = a < b ? b : a;
    int from = 3;
    const int keep[2] = {lo, hi};
    for (int i = 0; i < 2; i++) {
        if (keep[i] < from)
            continue;
        if (keep[i] > from)
            (void)close_range((unsigned)from, (unsigned)keep[i] - 1, 0);
        from = keep[i] + 1;
    }
    (void)close_range((unsigned)from, ~0U, 0);
}

/* A start of QEMU: its command line and environment, built before fork (no allocation in the
 * child). */
struct spawn {
    char *argv[ARGV_MAX];
    char *pool;    /* the strings of argv */
    char **envp;   /* the caller's environment that QEMU gets (env_for_qemu) */
    pid_t fp_kill; /* test hook VMSNAP_FAILPOINT=qemu-forked: the caller, killed by the child */
};

static void spawn_free(struct spawn *sp)
{
    free(sp->pool);
    free(sp->envp);
}

static int spawn_prepare(struct vmsnap_vmm *v, bool incoming, struct spawn *sp,
                         struct vmsnap_err *err)
{
    size_t pool_len = 64 << 10;
    sp->pool = malloc(pool_len);
    if (!sp->pool)
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    int rc = build_argv(v, incoming, sp->argv, sp->pool, pool_len, err);
    if (rc < 0)
        return rc;
    /* its environment, built before fork (no allocation in the child) */
    size_t nenv = 0;
    for (char **e = environ; *e; e++)
        nenv++;
    sp->envp = calloc(nenv + 1, sizeof(*sp->envp));
    if (!sp->envp)
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    nenv = 0;
    for (char **e = environ; *e; e++)
        if (env_for_qemu(*e))
            sp->envp[nenv++] = *e;
    const char *fp = getenv("VMSNAP_FAILPOINT");
    sp->fp_kill = fp && !strcmp(fp, "qemu-forked") ? getpid() : 0;
    return 0;
}

/* The intermediate child of the double fork: its own session and default signals, it forks
 * QEMU, sends its pid over `wfd` and exits; QEMU execs, or sends its exec errno. */
static __attribute__((noreturn)) void spawn_child(const struct spawn *sp, int logfd, int wfd)
{
    if (sp->fp_kill > 0) {
        /* test hook: the caller killed (SIGKILL) while this child, just forked, holds copies
         * of its descriptors (a restart must not take them for a live daemon's); then it
         * exits without QEMU (one started for the dead caller would race its recovery) */
        kill(sp->fp_kill, SIGKILL);
        struct timespec ts = {5, 0};
        nanosleep(&ts, NULL);
        _exit(127);
    }
    close_but(logfd, wfd);
    /* QEMU gets the default signal mask and actions (the caller's may block SIGTERM, as
     * the CLI does to handle it on a thread: QEMU would not stop on it). A signal sent to
     * the caller's process group before setsid() is pending here: discarded (ignored, then
     * default), or it would kill this child and the start would fail for no reason. */
    sigset_t none;
    sigemptyset(&none);
    if (setsid() < 0)
        _exit(127);
    static const int sigs[] = {SIGINT, SIGTERM, SIGHUP};
    for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++) {
        signal(sigs[i], SIG_IGN);
        signal(sigs[i], SIG_DFL);
    }
    if (sigprocmask(SIG_SETMASK, &none, NULL) < 0)
        _exit(127);
    pid_t q = fork();
    if (q != 0) {
        int qp = (int)q;
        _exit(q < 0 || write(wfd, &qp, sizeof(qp)) != (ssize_t)sizeof(qp) ? 127 : 0);
    }
    /* not close-on-exec: with the caller's stdin closed this is descriptor 0 itself (those
     * above 2 are made close-on-exec below) */
    int nul = open("/dev/null", O_RDWR);
    if (nul < 0 || dup2(nul, 0) < 0 || dup2(logfd, 1) < 0 || dup2(logfd, 2) < 0 ||
        cloexec_from_3() < 0)
        _exit(127);
    execvpe(sp->argv[0], sp->argv, sp->envp);
    int e = errno;
    if (write(wfd, &e, sizeof(e)) < 0)
        _exit(127);
    _exit(127);
}

/* Start QEMU in the background (its stale pid file and sockets removed, stderr appended to
 * qemu.log); *qpid gets its pid. Fails when the fork or the exec does. */
static int spawn_qemu(struct vmsnap_vmm *v, const struct spawn *sp, int *qpid,
                      struct vmsnap_err *err)
{
    unlink(v->pidfile);
    unlink(v->qmp_sock);
    unlink(v->con_sock);
    int rc, logfd = open(v->qemu_log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (logfd < 0)
        return err_sys(err, "open %s", v->qemu_log);
    int pfd[2];
    if (pipe2(pfd, O_CLOEXEC) < 0) {
        rc = err_sys(err, "pipe");
        close(logfd);
        return rc;
    }
    /* Double fork: the intermediate child exits at once, so QEMU is reparented and nobody
     * has to reap it; the pipe carries the exec error (if any) back. */
    pid_t mid = fork();
    if (mid < 0) {
        rc = err_sys(err, "fork");
        close(pfd[0]);
        close(pfd[1]);
        close(logfd);
        return rc;
    }
    if (mid == 0)
        spawn_child(sp, logfd, pfd[1]);
    close(pfd[1]);
    close(logfd);
    int st;
    while (waitpid(mid, &st, 0) < 0 && errno == EINTR)
        ;
    /* First the QEMU pid from the intermediate child, then an exec errno or end of file. */
    int e = 0;
    ssize_t r;
    while ((r = read(pfd[0], qpid, sizeof(*qpid))) < 0 && errno == EINTR)
        ;
    if (r != (ssize_t)sizeof(*qpid)) {
        close(pfd[0]);
        return vmsnap_err_set(err, ECHILD, "start %s: fork failed", sp->argv[0]);
    }
    while ((r = read(pfd[0], &e, sizeof(e))) < 0 && errno == EINTR)
        ;
    close(pfd[0]);
    if (r == (ssize_t)sizeof(e))
        return err_code(err, e, "exec %s", sp->argv[0]);
    return 0;
}

/* Wait for the QMP socket; QEMU exiting first means a bad command line or asset. */
static int wait_qmp(struct vmsnap_vmm *v, pid_t qpid, struct vmsnap_err *err)
{
    double deadline = mono_now() + 30.0;
    struct qmp q;
    for (;;) {
        struct vmsnap_err e2;
        if (qmp_open(v, &q, 0.1, &e2) == 0) {
            qmp_close(&q);
            return 0;
        }
        if (!proc_alive(qpid) || mono_now() > deadline) {
            bool timeout = proc_alive(qpid);
            if (timeout)
                qemu_stop(v, NULL);
            char tail[400];
            log_tail(v, tail, sizeof(tail));
            /* a full run directory loses QEMU's pid file and log, and so its real error */
            char hint[160] = "";
            struct statfs sf;
            if (statfs(v->run_dir, &sf) == 0 && (uint64_t)sf.f_bavail * sf.f_bsize < (1u << 20))
                snprintf(hint, sizeof(hint),
                         " (%s has %llu KiB free: QEMU may not have been able "
                         "to write its files there)",
                         v->run_dir,
                         (unsigned long long)((uint64_t)sf.f_bavail * sf.f_bsize >> 10));
            return vmsnap_err_set(err, EIO, "QEMU for %s %s: %s%s", v->run_dir,
                                  timeout ? "did not open its QMP socket in 30 s" : "exited",
                                  tail[0] ? tail : e2.msg, hint);
        }
        sys_sleep_ms(20);
    }
}

/* Boot in phases: refuse a second QEMU, build its command line and environment, spawn it, wait
 * until its QMP socket answers. */
static int qemu_boot(struct vmsnap_vmm *v, bool incoming, struct vmsnap_err *err)
{
    pid_t old = read_pid(v);
    if (pid_is_ours(v, old))
        return vmsnap_err_set(err, EBUSY, "VM in %s already has a QEMU process (pid %d)",
                              v->run_dir, (int)old);
    struct spawn sp = {.pool = NULL};
    int qpid = 0;
    int rc = spawn_prepare(v, incoming, &sp, err);
    if (rc == 0)
        rc = spawn_qemu(v, &sp, &qpid, err);
    spawn_free(&sp);
    if (rc == 0)
        rc = wait_qmp(v, (pid_t)qpid, err);
    if (rc < 0)
        return rc;
    vlog(VMSNAP_LOG_DEBUG, "QEMU started for %s (pid %d, accel %s)", v->run_dir, (int)read_pid(v),
         v->accel);
    return 0;
}

/* Set x-ignore-shared explicitly either way: a restored process keeps what its incoming side
 * set. */
static int set_ignore_shared(struct qmp *q, bool on, struct vmsnap_err *err)
{
    json_object *args = json_object_new_object();
    json_object *caps = json_object_new_array();
    json_object *cap = json_object_new_object();
    json_object_object_add(cap, "capability", json_object_new_string("x-ignore-shared"));
    json_object_object_add(cap, "state", json_object_new_boolean(on));
    json_object_array_add(caps, cap);
    json_object_object_add(args, "capabilities", caps);
    int rc = qmp_exec(q, "migrate-set-capabilities", args, NULL, err);
    json_object_put(args);
    return rc;
}

/* Poll query-migrate until completed (or failed). */
static int wait_migration(struct qmp *q, const char *what, struct vmsnap_err *err)
{
    double deadline = mono_now() + 300.0;
    unsigned ms = 2;
    for (;;) {
        json_object *ret = NULL, *status = NULL;
        int rc = qmp_exec(q, "query-migrate", NULL, &ret, err);
        if (rc < 0)
            return rc;
        const char *s = "";
        if (ret && json_object_object_get_ex(ret, "status", &status))
            s = json_object_get_string(status);
        if (!strcmp(s, "completed")) {
            json_object_put(ret);
            return 0;
        }
        if (!strcmp(s, "failed") || !strcmp(s, "cancelled")) {
            json_object *desc = NULL;
            json_object_object_get_ex(ret, "error-desc", &desc);
            rc = vmsnap_err_set(err, EIO, "%s: migration %s: %s", what, s,
                                desc ? json_object_get_string(desc) : "(see qemu.log)");
            json_object_put(ret);
            return rc;
        }
        json_object_put(ret);
        if (mono_now() > deadline)
            return vmsnap_err_set(err, ETIMEDOUT, "%s: migration not done after 300 s", what);
        sys_sleep_ms(ms);
        ms = ms < 50 ? ms * 2 : 50;
    }
}

/* Hand QEMU an open descriptor of the state file under the name "vmsnap-state" (getfd); the
 * migration then uses the URI "fd:vmsnap-state": QEMU reads or writes the file itself, with no
 * shell and no cat between (and -sandbox can forbid QEMU to spawn anything). */
#define STATE_FD_NAME "vmsnap-state"
static int pass_state_fd(struct qmp *q, const char *path, bool write, struct vmsnap_err *err)
{
    int fd = write ? open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600)
                   : open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return err_sys(err, "%s", path);
    json_object *args = json_object_new_object();
    json_object_object_add(args, "fdname", json_object_new_string(STATE_FD_NAME));
    int rc = qmp_exec_fd(q, "getfd", args, fd, NULL, err);
    json_object_put(args);
    close(fd); /* QEMU holds its own copy now */
    return rc;
}

static int qemu_restore(struct vmsnap_vmm *v, const char *dir, struct vmsnap_err *err)
{
    char path[4200];
    int rc = 0;
    if (snprintf(path, sizeof(path), "%s/state", dir) >= (int)sizeof(path))
        return vmsnap_err_set(err, ENAMETOOLONG, "snapshot directory %s too long", dir);
    if (access(path, R_OK) < 0)
        return err_sys(err, "restore: %s", path);
    rc = qemu_boot(v, true, err);
    if (rc < 0)
        return rc;
    struct qmp q;
    rc = qmp_open(v, &q, 5.0, err);
    if (rc < 0)
        goto fail;
    /* Both sides must agree on x-ignore-shared: it is set only when the RAM stayed out of the
     * state (taken from a shared RAM file). */
    rc = set_ignore_shared(&q, !v->state_has_ram, err);
    sys_failpoint("resume-incoming"); /* QEMU up, waiting for the state it is not yet given */
    if (rc == 0)
        rc = pass_state_fd(&q, path, false, err);
    if (rc == 0) {
        json_object *args = json_object_new_object();
        json_object_object_add(args, "uri", json_object_new_string("fd:" STATE_FD_NAME));
        rc = qmp_exec(&q, "migrate-incoming", args, NULL, err);
        json_object_put(args);
    }
    if (rc == 0)
        rc = wait_migration(&q, path, err);
    qmp_close(&q);
    if (rc == 0)
        return 0;
fail:;
    char tail[300];
    log_tail(v, tail, sizeof(tail));
    if (tail[0])
        vmsnap_err_wrap(err, "(qemu.log: %s) ", tail);
    qemu_stop(v, NULL);
    return rc;
}

static int qemu_pause(struct vmsnap_vmm *v, struct vmsnap_err *err)
{
    return qmp_once(v, "stop", NULL, NULL, err);
}

static int qemu_resume(struct vmsnap_vmm *v, struct vmsnap_err *err)
{
    return qmp_once(v, "cont", NULL, NULL, err);
}

static int qemu_snapshot(struct vmsnap_vmm *v, const char *dir, struct vmsnap_err *err)
{
    char path[4200];
    if (snprintf(path, sizeof(path), "%s/state", dir) >= (int)sizeof(path))
        return vmsnap_err_set(err, ENAMETOOLONG, "snapshot directory %s too long", dir);
    struct qmp q;
    int rc = qmp_open(v, &q, 2.0, err);
    if (rc < 0)
        return rc;
    rc = set_ignore_shared(&q, v->ram_shared, err);
    if (rc == 0) {
        /* QEMU throttles a migration to 32 MiB/s by default: nothing to share bandwidth with
         * here, and a VM whose RAM is not shared (restored on demand) sends all of it */
        json_object *args = json_object_new_object();
        json_object_object_add(args, "max-bandwidth", json_object_new_int64(INT64_MAX / 2));
        rc = qmp_exec(&q, "migrate-set-parameters", args, NULL, err);
        json_object_put(args);
    }
    if (rc == 0)
        rc = pass_state_fd(&q, path, true, err);
    if (rc == 0) {
        json_object *args = json_object_new_object();
        json_object_object_add(args, "uri", json_object_new_string("fd:" STATE_FD_NAME));
        rc = qmp_exec(&q, "migrate", args, NULL, err);
        json_object_put(args);
    }
    if (rc == 0)
        rc = wait_migration(&q, dir, err);
    qmp_close(&q);
    return rc;
}

static bool wait_gone(struct vmsnap_vmm *v, pid_t pid, double secs)
{
    double deadline = mono_now() + secs;
    while (pid_is_ours(v, pid)) {
        if (mono_now() > deadline)
            return false;
        sys_sleep_ms(10);
    }
    return true;
}

static int qemu_stop(struct vmsnap_vmm *v, struct vmsnap_err *err)
{
    pid_t pid = read_pid(v);
    if (!pid_is_ours(v, pid)) {
        unlink(v->pidfile);
        return 0;
    }
    struct vmsnap_err e2;
    if (qmp_once(v, "quit", NULL, NULL, &e2) < 0)
        vlog(VMSNAP_LOG_DEBUG, "quit %s: %s", v->run_dir, e2.msg);
    if (!wait_gone(v, pid, 5.0)) {
        kill(pid, SIGTERM);
        if (!wait_gone(v, pid, 3.0)) {
            kill(pid, SIGKILL);
            if (!wait_gone(v, pid, 3.0))
                return vmsnap_err_set(err, ETIMEDOUT, "QEMU pid %d of %s does not exit", (int)pid,
                                      v->run_dir);
        }
    }
    qemu_gone_files(v);
    return 0;
}

static void qemu_gone_files(struct vmsnap_vmm *v)
{
    unlink(v->pidfile);
    unlink(v->qmp_sock);
    unlink(v->con_sock);
}

/* system_powerdown, then the process watched (10 ms polls, cancellable) until it exits: QEMU
 * quits once the guest powered off (it runs without -no-shutdown). */
static int qemu_powerdown(struct vmsnap_vmm *v, double secs, bool *off, struct vmsnap_err *err)
{
    *off = false;
    pid_t pid = read_pid(v);
    if (!pid_is_ours(v, pid))
        return 0;
    int rc = qmp_once(v, "system_powerdown", NULL, NULL, err);
    if (rc < 0)
        return rc;
    double deadline = mono_now() + secs;
    while (pid_is_ours(v, pid)) {
        if ((rc = cancel_check(err)) < 0)
            return rc;
        if (mono_now() > deadline)
            return 0;
        sys_sleep_ms(10);
    }
    *off = true;
    qemu_gone_files(v);
    return 0;
}

static int qemu_state(struct vmsnap_vmm *v, enum vmsnap_vmm_state *st, pid_t *pidp,
                      struct vmsnap_err *err)
{
    pid_t pid = read_pid(v);
    if (pidp)
        *pidp = 0;
    if (!pid_is_ours(v, pid)) {
        *st = VMSNAP_VMM_DEAD;
        return 0;
    }
    if (pidp)
        *pidp = pid;
    if (v->qmp_wait < 0) { /* the pid only: QEMU is not asked */
        *st = VMSNAP_VMM_OTHER;
        return 0;
    }
    json_object *ret = NULL, *status = NULL;
    int rc = qmp_once(v, "query-status", NULL, &ret, err);
    if (rc < 0)
        return rc;
    *st = VMSNAP_VMM_OTHER;
    if (ret && json_object_object_get_ex(ret, "status", &status))
        *st = qmp_status_state(json_object_get_string(status));
    json_object_put(ret);
    return 0;
}

const struct vmm_driver vmm_qemu_driver = {
    .name = "qemu",
    .boot = qemu_boot,
    .restore = qemu_restore,
    .pause = qemu_pause,
    .snapshot = qemu_snapshot,
    .resume = qemu_resume,
    .stop = qemu_stop,
    .powerdown = qemu_powerdown,
    .state = qemu_state,
};
