/* SPDX-License-Identifier: Apache-2.0 */
/* vm console: the serial console's log path, and a line sent to its socket. */
#include "vm_int.h"

#include "sys/sys.h"
#include "util/util.h"

#include <errno.h>
#include <poll.h>
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
