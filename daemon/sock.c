/* SPDX-License-Identifier: Apache-2.0 */
/* The listening unix socket, bound by the daemon itself (then handed to libmicrohttpd), so that
 * its mode and group are set before anyone can connect: bound under umask 0177, then chmod and
 * chown to the configured mode and group, then listen. A socket file already at the path is
 * tried: one that accepts belongs to a live daemon (refused), unless the process that listens
 * on it (SO_PEERCRED) is gone or is no vmsnapd (a dead daemon's socket that a child of it, forked
 * and not yet exec'd, still holds); one that refuses is stale. A stale one is unlinked and
 * replaced. Anything else at the path is never removed. */
#include "daemon.h"

#include <errno.h>
#include <grp.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

static int fill(struct sockaddr_un *sa, const char *path, struct vmsnap_err *err)
{
    *sa = (struct sockaddr_un){.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof(sa->sun_path))
        return vmsnap_err_set(err, ENAMETOOLONG, "socket %s: longer than %zu bytes", path,
                              sizeof(sa->sun_path) - 1);
    memcpy(sa->sun_path, path, strlen(path) + 1);
    return 0;
}

/* A process's name and state from /proc/PID/stat ("PID (COMM) S ..."); false when it is gone. */
static bool proc_stat(const char *path, char *comm, size_t len, char *state)
{
    char buf[512];
    FILE *f = fopen(path, "re");
    if (!f)
        return false;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *o = strchr(buf, '('), *c = strrchr(buf, ')');
    if (!o || !c || c < o || c[1] != ' ') {
        errno = EINVAL; /* unreadable: not taken for gone */
        return false;
    }
    snprintf(comm, len, "%.*s", (int)(c - o - 1), o + 1);
    *state = c[2];
    return true;
}

/* The executable of /proc/PID (`who`), without the " (deleted)" of one replaced since. */
static bool proc_exe(const char *who, char *buf, size_t len)
{
    char p[64];
    snprintf(p, sizeof(p), "/proc/%s/exe", who);
    ssize_t n = readlink(p, buf, len - 1);
    if (n <= 0)
        return false;
    buf[n] = '\0';
    size_t dl = strlen(" (deleted)");
    if ((size_t)n > dl && !strcmp(buf + n - dl, " (deleted)"))
        buf[n - dl] = '\0';
    return true;
}

/* Whether PID (the process that called listen() on the socket) is alive: not when it is gone
 * or a zombie. A live process under another name and executable than this one's is alive too
 * (a program that took a dead daemon's pid, or one listening on a misconfigured path: the two
 * cannot be told apart, and a socket is never taken from a live process); `comm` gets its
 * name ("" when this one's). */
static bool listener_alive(pid_t pid, char *comm, size_t len)
{
    comm[0] = '\0';
    if (pid == getpid())
        return true;
    if (kill(pid, 0) < 0 && errno == ESRCH)
        return false;
    char p[64], mine[32], its[32], ms, is;
    snprintf(p, sizeof(p), "/proc/%ld/stat", (long)pid);
    if (!proc_stat("/proc/self/stat", mine, sizeof(mine), &ms))
        return true; /* no /proc: cannot tell, taken for alive */
    if (!proc_stat(p, its, sizeof(its), &is))
        return errno != ENOENT && errno != ESRCH;
    if (is == 'Z' || is == 'X')
        return false;
    if (!strcmp(mine, its))
        return true;
    char me[PATH_MAX], it[PATH_MAX];
    snprintf(p, sizeof(p), "%ld", (long)pid);
    if (proc_exe("self", me, sizeof(me)) && proc_exe(p, it, sizeof(it)) && strcmp(me, it)) {
        snprintf(comm, len, "%s", its); /* another program: named in the refusal, escaped */
        for (char *q = comm; *q; q++)
            if ((unsigned char)*q < 0x20 || (unsigned char)*q >= 0x7f)
                *q = '?';
    }
    return true;
}

static int clear_stale(const char *path, const struct sockaddr_un *sa, struct vmsnap_err *err)
{
    struct stat st;
    if (lstat(path, &st) < 0)
        return errno == ENOENT ? 0
                               : vmsnap_err_set(err, errno, "socket %s: %s", path, strerror(errno));
    if (!S_ISSOCK(st.st_mode))
        return vmsnap_err_set(err, EEXIST, "socket %s: exists and is not a socket: not replaced",
                              path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return vmsnap_err_set(err, errno, "socket: %s", strerror(errno));
    int rc = connect(fd, (const struct sockaddr *)sa, sizeof(*sa));
    int e = errno;
    /* A connect may reach a dead daemon's socket still held by a child of it forked and not
     * yet exec'd (QEMU's, its descriptors close-on-exec): SO_PEERCRED names the process that
     * called listen(), the daemon, stale when it is gone. */
    struct ucred uc = {0};
    socklen_t ul = sizeof(uc);
    if (rc == 0 && getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &uc, &ul) < 0)
        uc.pid = 0;
    close(fd);
    char comm[64];
    if (rc == 0 && (uc.pid <= 0 || listener_alive(uc.pid, comm, sizeof(comm)))) {
        if (comm[0])
            return vmsnap_err_set(err, EADDRINUSE,
                                  "socket %s: process %ld (%s) is listening there: not replaced "
                                  "(configure another socket path, or stop it)",
                                  path, (long)uc.pid, comm);
        return vmsnap_err_set(err, EADDRINUSE,
                              "socket %s: another vmsnapd (pid %ld) is listening there (stop it "
                              "first)",
                              path, (long)uc.pid);
    }
    if (rc < 0 && e != ECONNREFUSED)
        return vmsnap_err_set(err, e, "socket %s: cannot tell whether it is in use: %s", path,
                              strerror(e));
    if (unlink(path) < 0 && errno != ENOENT)
        return vmsnap_err_set(err, errno, "socket %s: remove the stale socket: %s", path,
                              strerror(errno));
    return 0;
}

int d_sock_listen(const char *path, unsigned mode, const char *group, struct vmsnap_err *err)
{
    struct sockaddr_un sa;
    int rc = fill(&sa, path, err);
    if (rc < 0 || (rc = clear_stale(path, &sa, err)) < 0)
        return rc;
    gid_t gid = (gid_t)-1;
    if (group) {
        char buf[4096];
        struct group gr, *res = NULL;
        char *end;
        unsigned long n = strtoul(group, &end, 10);
        if (*group && !*end)
            gid = (gid_t)n;
        else if (getgrnam_r(group, &gr, buf, sizeof(buf), &res) == 0 && res)
            gid = res->gr_gid;
        else
            return vmsnap_err_set(err, ENOENT, "socket group %s: no such group", group);
    }
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return vmsnap_err_set(err, errno, "socket: %s", strerror(errno));
    mode_t old = umask(0177);
    rc = bind(fd, (const struct sockaddr *)&sa, sizeof(sa));
    int e = errno;
    umask(old);
    if (rc < 0) {
        close(fd);
        return vmsnap_err_set(err, e, "bind %s: %s", path, strerror(e));
    }
    if ((gid != (gid_t)-1 && chown(path, (uid_t)-1, gid) < 0) || chmod(path, mode) < 0) {
        e = errno;
        unlink(path);
        close(fd);
        return vmsnap_err_set(err, e, "socket %s: set its group and mode: %s", path, strerror(e));
    }
    if (listen(fd, 128) < 0) {
        e = errno;
        unlink(path);
        close(fd);
        return vmsnap_err_set(err, e, "listen %s: %s", path, strerror(e));
    }
    return fd;
}
