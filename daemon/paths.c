/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What a request may name on the node. The daemon runs VMs as root, so a path in a request is
 * used only when it is a plain absolute path (no ".", "..", empty components, control bytes)
 * that lies under a configured root once every symlink of its existing part is resolved: the
 * deepest existing ancestor goes through realpath(3) and what is below it does not exist yet
 * (a dangling symlink there is refused: creating through it would write wherever it points).
 *
 * This is a check before the call, not a descriptor-relative walk: a local user who can
 * replace a directory under a root with a symlink between the check and the library's open
 * can still redirect it. Roots should therefore be directories only the daemon's callers'
 * control plane writes (docs/daemon.md, Security).
 */
#include "daemon.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int lexical_ok(const char *path, const char *what, struct vmsnap_err *err)
{
    size_t n = strlen(path);
    if (path[0] != '/')
        return vmsnap_err_set(err, D_EUSAGE, "%s '%s': not an absolute path", what, path);
    if (n >= PATH_MAX)
        return vmsnap_err_set(err, D_EUSAGE, "%s: longer than %d bytes", what, PATH_MAX - 1);
    for (const char *p = path; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f)
            return vmsnap_err_set(err, D_EUSAGE, "%s: a control character in the path", what);
    for (const char *c = path + 1; c <= path + n;) {
        const char *e = strchr(c, '/');
        size_t len = e ? (size_t)(e - c) : strlen(c);
        if ((len == 0 && c != path + n) || (len == 1 && c[0] == '.') ||
            (len == 2 && c[0] == '.' && c[1] == '.'))
            return vmsnap_err_set(
                err, EACCES, "%s '%s': '.', '..' and empty components are refused", what, path);
        if (!e)
            break;
        c = e + 1;
    }
    if (n > 1 && path[n - 1] == '/')
        return vmsnap_err_set(err, D_EUSAGE, "%s '%s': a trailing '/'", what, path);
    return 0;
}

/* realpath of `path`, or of its deepest existing ancestor with the rest appended */
static int resolve(const char *path, char *out, size_t len, const char *what,
                   struct vmsnap_err *err)
{
    char buf[PATH_MAX];
    snprintf(buf, sizeof(buf), "%s", path);
    for (;;) {
        size_t keep = strlen(buf); /* buf is path's first `keep` bytes */
        char *r = realpath(buf, NULL);
        if (r) {
            const char *rest = path + keep;
            while (*rest == '/')
                rest++;
            int n = snprintf(out, len, "%s%s%s", r, *rest && strcmp(r, "/") ? "/" : "", rest);
            free(r);
            if (n < 0 || (size_t)n >= len)
                return vmsnap_err_set(err, ENAMETOOLONG, "%s: path too long", what);
            return 0;
        }
        if (errno != ENOENT)
            return vmsnap_err_set(err, errno, "%s %s: %s", what, buf, strerror(errno));
        struct stat st;
        if (lstat(buf, &st) == 0) /* exists, but does not resolve: a dangling symlink */
            return vmsnap_err_set(err, EACCES, "%s %s: a symlink to nothing is refused", what, buf);
        char *slash = strrchr(buf, '/');
        if (!slash)
            return vmsnap_err_set(err, ENOENT, "%s %s: no existing ancestor", what, path);
        slash[slash == buf] = '\0';
    }
}

int d_path_check(const char *path, char *const *roots, size_t n_roots, const char *what, char *out,
                 size_t len, struct vmsnap_err *err)
{
    int rc = lexical_ok(path, what, err);
    if (rc < 0)
        return rc;
    char real[PATH_MAX];
    rc = resolve(path, real, sizeof(real), what, err);
    if (rc < 0)
        return rc;
    for (size_t i = 0; i < n_roots; i++) {
        size_t rl = strlen(roots[i]);
        if (!strncmp(real, roots[i], rl) && (real[rl] == '\0' || real[rl] == '/' || rl == 1)) {
            if (snprintf(out, len, "%s", path) >= (int)len)
                return vmsnap_err_set(err, ENAMETOOLONG, "%s: path too long", what);
            return 0;
        }
    }
    if (strcmp(real, path))
        return vmsnap_err_set(err, EACCES, "%s %s (%s): outside the node's roots", what, path,
                              real);
    return vmsnap_err_set(err, EACCES, "%s %s: outside the node's roots", what, path);
}

int d_url_check(const char *url, char *const *roots, size_t n_roots, char *out, size_t len,
                struct vmsnap_err *err)
{
    if (!strncmp(url, "s3://", 5) || !strncmp(url, "gs://", 5)) {
        for (const char *p = url; *p; p++)
            if ((unsigned char)*p < 0x20 || *p == 0x7f)
                return vmsnap_err_set(err, D_EUSAGE, "url: a control character");
        if (snprintf(out, len, "%s", url) >= (int)len)
            return vmsnap_err_set(err, D_EUSAGE, "url: too long");
        return 0;
    }
    const char *p = !strncmp(url, "file://", 7) ? url + 7 : url;
    if (strstr(url, "://") && p == url)
        return vmsnap_err_set(err, D_EUSAGE, "url %s: not s3://, gs://, file:// or a path", url);
    return d_path_check(p, roots, n_roots, "store", out, len, err);
}
