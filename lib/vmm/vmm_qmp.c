/* SPDX-License-Identifier: Apache-2.0 */
/* The QMP client of the QEMU driver: one short connection per operation (greeting,
 * qmp_capabilities, commands, replies one JSON object per line; events are skipped), and the
 * classification of a reply (exposed for the unit test and the fuzzer). */
#include "vmm_int.h"

#include "sys/sys.h"
#include "util/util.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define QMP_LINE_MAX (1u << 20)
#define QMP_TIMEOUT 60.0

/* How long a QMP reply may take: 60 s, or VMSNAP_QMP_TIMEOUT seconds (1..3600; docs/vm.md). */
static double qmp_timeout(void)
{
    const char *e = getenv("VMSNAP_QMP_TIMEOUT");
    char *end = NULL;
    long s = e ? strtol(e, &end, 10) : 0;
    return e && *e && end && !*end && s >= 1 && s <= 3600 ? (double)s : QMP_TIMEOUT;
}

enum vmsnap_vmm_state qmp_status_state(const char *status)
{
    if (!status) /* {"status": null}: json_object_get_string gives NULL */
        return VMSNAP_VMM_OTHER;
    if (!strcmp(status, "running"))
        return VMSNAP_VMM_RUNNING;
    if (!strcmp(status, "paused") || !strcmp(status, "postmigrate") ||
        !strcmp(status, "finish-migrate") || !strcmp(status, "prelaunch") ||
        !strcmp(status, "save-vm") || !strcmp(status, "suspended"))
        return VMSNAP_VMM_PAUSED;
    if (!strcmp(status, "inmigrate") || !strcmp(status, "restore-vm"))
        return VMSNAP_VMM_INCOMING;
    if (!strcmp(status, "io-error")) /* werror=enospc (the default) stops the VM */
        return VMSNAP_VMM_IO_ERROR;
    return VMSNAP_VMM_OTHER;
}

int qmp_parse_reply(const char *line, const char *what, json_object **ret, struct vmsnap_err *err)
{
    if (ret)
        *ret = NULL;
    json_tokener *tok = json_tokener_new_ex(32);
    if (!tok)
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    json_object *o = json_tokener_parse_ex(tok, line, (int)strlen(line));
    enum json_tokener_error jerr = json_tokener_get_error(tok);
    json_tokener_free(tok);
    if (!o || jerr != json_tokener_success || !json_object_is_type(o, json_type_object)) {
        json_object_put(o);
        return vmsnap_err_set(err, EPROTO, "QMP %s: malformed reply '%.80s'", what, line);
    }
    json_object *v;
    int rc = 0;
    if (json_object_object_get_ex(o, "return", &v)) {
        if (ret)
            *ret = json_object_get(v);
        rc = 1;
    } else if (json_object_object_get_ex(o, "error", &v)) {
        json_object *cls = NULL, *desc = NULL;
        json_object_object_get_ex(v, "class", &cls);
        json_object_object_get_ex(v, "desc", &desc);
        rc = vmsnap_err_set(err, EIO, "QMP %s: %s: %s", what,
                            cls ? json_object_get_string(cls) : "error",
                            desc ? json_object_get_string(desc) : "(no description)");
    } else if (json_object_object_get_ex(o, "event", &v) ||
               json_object_object_get_ex(o, "QMP", &v)) {
        rc = 0;
    } else {
        rc = vmsnap_err_set(err, EPROTO, "QMP %s: unexpected message '%.80s'", what, line);
    }
    json_object_put(o);
    return rc;
}

void qmp_close(struct qmp *q)
{
    if (q->fd >= 0)
        close(q->fd);
    free(q->buf);
    free(q->line);
    q->fd = -1;
    q->buf = NULL;
    q->line = NULL;
}

/* Read one line (without CRLF) into *line (pointing into q->buf, valid until the next read). */
static int qmp_readline(struct qmp *q, double deadline, char **line, struct vmsnap_err *err)
{
    for (;;) {
        char *nl = memchr(q->buf, '\n', q->len);
        if (nl) {
            size_t n = (size_t)(nl - q->buf);
            free(q->line);
            char *out = q->line = malloc(n + 1);
            if (!out)
                return vmsnap_err_set(err, ENOMEM, "out of memory");
            memcpy(out, q->buf, n);
            out[n] = 0;
            if (n && out[n - 1] == '\r')
                out[n - 1] = 0;
            memmove(q->buf, nl + 1, q->len - n - 1);
            q->len -= n + 1;
            *line = out;
            return 0;
        }
        if (q->len >= QMP_LINE_MAX)
            return vmsnap_err_set(err, EPROTO, "QMP %s: message longer than %u bytes", q->sock,
                                  QMP_LINE_MAX);
        double left = deadline - mono_now();
        if (left <= 0)
            return vmsnap_err_set(err, ETIMEDOUT, "QMP %s: no reply in %.0f s", q->sock,
                                  q->timeout);
        struct pollfd p = {q->fd, POLLIN, 0};
        int r = poll(&p, 1, (int)(left * 1000) + 1);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return err_sys(err, "QMP %s: poll", q->sock);
        if (r == 0)
            continue;
        ssize_t got = read(q->fd, q->buf + q->len, QMP_LINE_MAX - q->len);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0)
            return err_sys(err, "QMP %s: read", q->sock);
        if (got == 0)
            return vmsnap_err_set(err, ECONNRESET, "QMP %s: connection closed by QEMU", q->sock);
        q->len += (size_t)got;
    }
}

/* Send one command; `pass_fd` >= 0 travels with its first bytes (SCM_RIGHTS), as getfd wants. */
int qmp_exec_fd(struct qmp *q, const char *cmd, json_object *args, int pass_fd, json_object **ret,
                struct vmsnap_err *err)
{
    json_object *req = json_object_new_object();
    if (!req)
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    json_object_object_add(req, "execute", json_object_new_string(cmd));
    if (args)
        json_object_object_add(req, "arguments", json_object_get(args));
    const char *js = json_object_to_json_string_ext(req, JSON_C_TO_STRING_PLAIN);
    size_t n = strlen(js) + 1;
    char *s = malloc(n);
    if (!s) {
        json_object_put(req);
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    }
    memcpy(s, js, n - 1);
    s[n - 1] = '\n';
    json_object_put(req);
    int rc = 0;
    for (size_t off = 0; off < n;) {
        ssize_t w;
        if (off == 0 && pass_fd >= 0) {
            union {
                char buf[CMSG_SPACE(sizeof(int))];
                struct cmsghdr align;
            } u;
            memset(&u, 0, sizeof(u));
            struct iovec iov = {s, n};
            struct msghdr mh = {.msg_iov = &iov,
                                .msg_iovlen = 1,
                                .msg_control = u.buf,
                                .msg_controllen = sizeof(u.buf)};
            struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
            cm->cmsg_level = SOL_SOCKET;
            cm->cmsg_type = SCM_RIGHTS;
            cm->cmsg_len = CMSG_LEN(sizeof(int));
            memcpy(CMSG_DATA(cm), &pass_fd, sizeof(int));
            w = sendmsg(q->fd, &mh, MSG_NOSIGNAL);
        } else {
            w = send(q->fd, s + off, n - off, MSG_NOSIGNAL);
        }
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0) {
            rc = err_sys(err, "QMP %s: send %s", q->sock, cmd);
            break;
        }
        off += (size_t)w;
    }
    free(s);
    if (rc < 0)
        return rc;
    double deadline = mono_now() + q->timeout;
    for (;;) {
        char *line;
        rc = qmp_readline(q, deadline, &line, err);
        if (rc < 0)
            return rc;
        rc = qmp_parse_reply(line, cmd, ret, err);
        if (rc != 0)
            return rc < 0 ? rc : 0;
    }
}

int qmp_exec(struct qmp *q, const char *cmd, json_object *args, json_object **ret,
             struct vmsnap_err *err)
{
    return qmp_exec_fd(q, cmd, args, -1, ret, err);
}

int qmp_open(struct vmsnap_vmm *v, struct qmp *q, double timeout, struct vmsnap_err *err)
{
    q->fd = -1;
    q->len = 0;
    q->line = NULL;
    q->sock = v->qmp_sock;
    q->timeout = qmp_timeout();
    if (v->qmp_wait > 0 && v->qmp_wait < q->timeout)
        q->timeout = v->qmp_wait;
    q->buf = malloc(QMP_LINE_MAX + 1);
    if (!q->buf)
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    memcpy(sa.sun_path, v->qmp_sock, strlen(v->qmp_sock) + 1);
    /* Non-blocking connect: QEMU accepts one QMP client at a time and leaves the others in the
     * listen backlog; with the backlog full (a hung QEMU, or clients queued behind another) a
     * blocking connect waited forever. EAGAIN is retried for as long as a reply may take. */
    const double t0 = mono_now(), deadline = t0 + timeout, busy_deadline = t0 + q->timeout;
    int rc;
    for (;;) {
        q->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (q->fd < 0) {
            rc = err_sys(err, "socket");
            goto fail;
        }
        if (connect(q->fd, (struct sockaddr *)&sa, sizeof(sa)) == 0) {
            int fl = fcntl(q->fd, F_GETFL);
            if (fl < 0 || fcntl(q->fd, F_SETFL, fl & ~O_NONBLOCK) < 0) {
                rc = err_sys(err, "QMP %s: fcntl", v->qmp_sock);
                goto fail;
            }
            break;
        }
        int e = errno;
        close(q->fd);
        q->fd = -1;
        if (e == EAGAIN && mono_now() >= busy_deadline) {
            rc = vmsnap_err_set(err, ETIMEDOUT,
                                "QMP %s: QEMU accepted no connection in %.0f s (hung, or busy "
                                "with other clients)",
                                v->qmp_sock, q->timeout);
            goto fail;
        }
        if (e != EAGAIN && (mono_now() >= deadline || (e != ENOENT && e != ECONNREFUSED))) {
            rc = err_code(err, e, "QMP connect %s", v->qmp_sock);
            goto fail;
        }
        sys_sleep_ms(20);
    }
    char *line;
    rc = qmp_readline(q, mono_now() + q->timeout, &line, err); /* greeting */
    if (rc < 0)
        goto fail;
    if (!strstr(line, "\"QMP\"")) {
        rc = vmsnap_err_set(err, EPROTO, "QMP %s: unexpected greeting '%.80s'", v->qmp_sock, line);
        goto fail;
    }
    rc = qmp_exec(q, "qmp_capabilities", NULL, NULL, err);
    if (rc < 0)
        goto fail;
    return 0;
fail:
    qmp_close(q);
    return rc;
}

/* One command on a fresh connection. */
int qmp_once(struct vmsnap_vmm *v, const char *cmd, json_object *args, json_object **ret,
             struct vmsnap_err *err)
{
    struct qmp q;
    int rc = qmp_open(v, &q, 2.0, err);
    if (rc < 0)
        return rc;
    rc = qmp_exec(&q, cmd, args, ret, err);
    qmp_close(&q);
    return rc;
}
