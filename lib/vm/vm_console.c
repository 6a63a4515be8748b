/* SPDX-License-Identifier: Apache-2.0 */
/* vm console: the serial console's log path, a line sent to its socket, and readiness (a line
 * the guest prints on it after a run or resume). */
#include "vm_int.h"

#include "sys/sys.h"
#include "util/util.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <time.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

int vmsnap_vm_console_path(const struct vmsnap_vm_opts *o, const char *name, char *buf, size_t len,
                           struct vmsnap_err *err)
{
    struct vmctx c;
    int rc = vm_ctx_init(&c, o, name, err);
    if (rc < 0)
        return rc;
    if (!vm_exists(c.vmdir))
        return vmsnap_err_set(err, ENOENT, "no VM named '%s' under %s", name, c.state);
    int w = snprintf(buf, len, "%s/console.log", c.vmdir);
    if (w < 0 || (size_t)w >= len)
        return vmsnap_err_set(err, ENAMETOOLONG, "console path too long");
    return 0;
}

int vmsnap_vm_console_send(const struct vmsnap_vm_opts *o, const char *name, const char *line,
                           struct vmsnap_err *err)
{
    struct vmctx c;
    int rc = vm_ctx_init(&c, o, name, err);
    if (rc < 0)
        return rc;
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    int w = snprintf(sa.sun_path, sizeof(sa.sun_path), "%s/console.sock", c.vmdir);
    if (w < 0 || (size_t)w >= sizeof(sa.sun_path))
        return vmsnap_err_set(err, ENAMETOOLONG, "console socket path too long");
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return err_sys(err, "socket");
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
        rc = vmsnap_err_set(err, errno, "VM '%s' console %s: %s (is it running?)", name,
                            sa.sun_path, strerror(errno));
        close(fd);
        return rc;
    }
    rc = sys_write_full(fd, line, strlen(line));
    if (rc == 0)
        rc = sys_write_full(fd, "\n", 1);
    if (rc < 0)
        rc = err_code(err, -rc, "VM '%s' console", name);
    /* Closed right after the write, the line could be lost: QEMU's socket chardev accepts one
     * client at a time and reads only while the serial port takes bytes, and a hang-up it saw
     * first dropped what was unread (a busy guest under load: a test's command went unanswered).
     * So the write side is shut and the socket held until QEMU, having read everything, closes
     * its end (its EOF), 5 s at most. */
    if (rc == 0 && shutdown(fd, SHUT_WR) == 0) {
        struct pollfd p = {fd, POLLIN, 0};
        char sink[256];
        for (int waited = 0; waited < 5000 && poll(&p, 1, 100) >= 0; waited += 100) {
            if (!(p.revents & (POLLIN | POLLHUP)))
                continue;
            if (read(fd, sink, sizeof(sink)) <= 0)
                break; /* EOF: QEMU read the line and let go */
        }
    }
    close(fd);
    return rc;
}

struct vm_console_mark vm_console_mark(const struct vmctx *c)
{
    char p[PATH_LEN];
    struct stat st;
    if (vm_pcat(p, c->vmdir, "/console.log") < 0 || stat(p, &st) < 0)
        return (struct vm_console_mark){0};
    return (struct vm_console_mark){st.st_dev, st.st_ino, (int64_t)st.st_size};
}

int vm_wait_ready(struct vmctx *c, json_object *cfg, struct vm_console_mark from,
                  struct vmsnap_vm_timing *t, double *t0, struct vmsnap_err *err)
{
    const struct vmsnap_vm_opts *o = c->o;
    if (!o || !o->ready)
        return 0;
    const char *want = o->ready;
    size_t n = strlen(want);
    if (n == 0 || n > VMSNAP_VM_READY_MAX)
        return vmsnap_err_set(err, EINVAL, "the readiness line: 1 to %d bytes, not %zu",
                              VMSNAP_VM_READY_MAX, n);
    double limit = o->ready_timeout ? o->ready_timeout : VMSNAP_VM_READY_TIMEOUT;
    double start = mono_now();
    char p[PATH_LEN];
    if (vm_pcat(p, c->vmdir, "/console.log") < 0)
        return vmsnap_err_set(err, ENAMETOOLONG, "path %s too long", c->vmdir);
    /* the log read as it grows, in a bounded buffer: what was read, but the last n-1 bytes (a
     * line the next read completes), is dropped */
    char buf[16384 + VMSNAP_VM_READY_MAX];
    size_t keep = 0;
    /* QEMU watched as vm ls does without asking it (the pid file's process, checked to be this
     * VM's: a QEMU that exited removed its pid file, a reused pid is another program's) */
    struct vmsnap_vmm *v = NULL;
    int rc = vm_vmm_from_cfg(c, cfg, &v, err);
    if (rc < 0)
        return rc;
    vmsnap_vmm_set_reply_wait(v, -1);
    off_t pos = 0;
    int fd = -1;
    bool found = false;
    for (int i = 0; !found; i++) {
        struct stat st;
        if (fd < 0 && (fd = open(p, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK)) >= 0 &&
            fstat(fd, &st) == 0 && st.st_dev == from.dev && st.st_ino == from.ino &&
            st.st_size >= from.size)
            pos = (off_t)from.size; /* the log of the mark: past what it held then */
        ssize_t r;
        while (fd >= 0 && !found && (r = pread(fd, buf + keep, sizeof(buf) - keep, pos)) > 0) {
            pos += r;
            size_t len = keep + (size_t)r;
            found = memmem(buf, len, want, n) != NULL;
            keep = len < n - 1 ? len : n - 1;
            memmove(buf, buf + len - keep, keep);
        }
        if (found)
            break;
        if ((rc = cancel_check(err)) < 0)
            break;
        enum vmsnap_vmm_state vs = VMSNAP_VMM_OTHER;
        struct vmsnap_err se = {0};
        if (i % 5 == 0 && vmsnap_vmm_state(v, &vs, NULL, &se) == 0 && vs == VMSNAP_VMM_DEAD) {
            rc = vmsnap_err_set(err, ESRCH,
                                "VM '%s': its QEMU exited before the guest printed its readiness "
                                "line on its console (%s)",
                                c->name, p);
            break;
        }
        if (mono_now() - start >= limit) {
            rc = vmsnap_err_set(err, ETIMEDOUT,
                                "VM '%s' runs, but its guest printed no readiness line on its "
                                "console (%s) within %.0f s; it is left running",
                                c->name, p, limit);
            break;
        }
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    if (fd >= 0)
        close(fd);
    vmsnap_vmm_free(v);
    if (rc == 0)
        vm_step(t, "ready", t0);
    return rc;
}
