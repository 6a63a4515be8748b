/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The object cache's directory: where it is, the checks that make it ours alone, the key locks
 * and the sweep of what dead fills left.
 *
 * Key locks are flocks of locks/<key>. A holder removes the lock file before releasing it, so
 * lock files do not pile up; a process that opened the old file and then gets its lock sees
 * that the name no longer leads to it and opens the new one (the name is only ever removed by
 * a holder, so a held file is always the one at the name). A temporary in tmp/ belongs to a fill
 * holding its key's lock from before it was created until after it was renamed or removed: a
 * temporary whose key lock and own flock are both free is a dead fill's, exact with no PID or
 * age involved.
 */
#include "objcache/objcache_int.h"
#include "sys/sys.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <time.h>
#include <unistd.h>

bool objcache_key_ok(const char *key)
{
    size_t n = 0;
    for (; key && key[n]; n++) {
        const char ch = key[n];
        if (n >= VMSNAP_OBJCACHE_KEY_MAX ||
            !((ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '-'))
            return false;
    }
    return n > 0;
}

int objcache_check_key(const char *key, struct vmsnap_err *err)
{
    if (objcache_key_ok(key))
        return 0;
    return vmsnap_err_set(
        err, EINVAL, "object cache: invalid key '%.120s%s' (expected 1 to %d of a-z, 0-9, -)",
        key ? key : "(null)", key && strlen(key) > 120 ? "..." : "", VMSNAP_OBJCACHE_KEY_MAX);
}

/* "8G", "512M", "1.5T", "4096", with an optional "B" or "iB" (powers of 1024), as the CLI's
 * sizes. 0 or -EINVAL. */
static int parse_size(const char *s, uint64_t *out)
{
    const size_t n = strspn(s, "0123456789.");
    if (n == 0 || !isdigit((unsigned char)s[0]) || memchr(s, '.', n) != strrchr(s, '.'))
        return -EINVAL;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end != s + n)
        return -EINVAL;
    const char *u = "KMGT", *p = *end ? strchr(u, toupper((unsigned char)*end)) : NULL;
    if (p && *end) {
        for (const char *q = u; q <= p; q++)
            v *= 1024.0;
        end++;
    }
    if (!strcmp(end, "iB") && p)
        end += 2;
    else if (!strcmp(end, "B"))
        end++;
    if (*end || !(v < 18446744073709551615.0))
        return -EINVAL;
    *out = (uint64_t)v;
    return 0;
}

/* The directory when opts->dir is NULL, into `out` (PATH_MAX bytes). */
static int default_dir(char *out, struct vmsnap_err *err)
{
    const char *env = getenv("VMSNAP_CACHE_DIR"), *xdg = getenv("XDG_CACHE_HOME");
    const char *home = getenv("HOME");
    int n;
    if (env && *env)
        n = snprintf(out, PATH_MAX, "%s", env);
    else if (geteuid() == 0)
        n = snprintf(out, PATH_MAX, "/var/cache/vmsnap");
    else if (xdg && xdg[0] == '/') /* a relative one is invalid (XDG Base Directory spec) */
        n = snprintf(out, PATH_MAX, "%s/vmsnap", xdg);
    else {
        if (!home || !*home) {
            struct passwd pw, *res = NULL;
            char buf[4096];
            if (getpwuid_r(geteuid(), &pw, buf, sizeof(buf), &res) == 0 && res)
                home = res->pw_dir;
        }
        if (!home || !*home)
            return vmsnap_err_set(err, ENOENT,
                                  "object cache: no home directory to hold ~/.cache/vmsnap: set "
                                  "VMSNAP_CACHE_DIR or --cache-dir");
        n = snprintf(out, PATH_MAX, "%s/.cache/vmsnap", home);
    }
    if (n < 0 || n >= PATH_MAX)
        return vmsnap_err_set(err, ENAMETOOLONG, "object cache: directory name too long");
    return 0;
}

/* Create the missing parents of `path` (0700, as ~/.cache should be). Failures show at the
 * open that follows. */
static void make_parents(const char *path)
{
    char p[PATH_MAX];
    snprintf(p, sizeof(p), "%s", path);
    for (char *s = strchr(p + 1, '/'); s; s = strchr(s + 1, '/')) {
        *s = '\0';
        (void)mkdir(p, 0700);
        *s = '/';
    }
}

/* Whether the directory `st` may hold a cache of ours; `what` names it in the message. */
static int check_owned(const struct stat *st, const char *what, struct vmsnap_err *err)
{
    if (st->st_uid != geteuid())
        return vmsnap_err_set(err, EPERM,
                              "object cache %s: owned by uid %u, not by this user (uid %u): "
                              "another user could plant, swap or lock its entries; use a "
                              "directory of your own (--cache-dir, VMSNAP_CACHE_DIR)",
                              what, (unsigned)st->st_uid, (unsigned)geteuid());
    if (st->st_mode & (S_IWGRP | S_IWOTH))
        return vmsnap_err_set(err, EPERM,
                              "object cache %s: writable by group or others (mode %04o): they "
                              "could plant or swap entries; chmod 700 it",
                              what, (unsigned)(st->st_mode & 07777));
    return 0;
}

/* Open the cache directory `path` (created if missing), refusing a symlink and a directory
 * that is not ours alone. */
static int open_root(const char *path, int *out, struct vmsnap_err *err)
{
    char p[PATH_MAX];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof(p))
        return vmsnap_err_set(err, EINVAL, "object cache: bad directory name '%.200s'", path);
    memcpy(p, path, n + 1);
    while (n > 1 && p[n - 1] == '/') /* "lnk/" would follow the link */
        p[--n] = '\0';
    const char *base = strrchr(p, '/') ? strrchr(p, '/') + 1 : p;
    if (!strcmp(base, ".") || !strcmp(base, ".."))
        return vmsnap_err_set(err, EINVAL,
                              "object cache %s: name the directory itself, not '.' or '..'", path);
    if (mkdir(p, 0700) < 0 && errno == ENOENT) {
        make_parents(p);
        (void)mkdir(p, 0700);
    }
    int fd = open(p, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        struct stat st;
        if (errno == ELOOP || (errno == ENOTDIR && lstat(p, &st) == 0 && S_ISLNK(st.st_mode)))
            return vmsnap_err_set(err, ELOOP,
                                  "object cache %s: a symbolic link, refused (it can be pointed "
                                  "elsewhere at any time; give the directory it leads to)",
                                  path);
        return err_sys(err, "object cache: open %s", path);
    }
    struct stat st;
    int rc = fstat(fd, &st) < 0 ? err_sys(err, "object cache: stat %s", path)
                                : check_owned(&st, path, err);
    if (rc < 0) {
        close(fd);
        return rc;
    }
    *out = fd;
    return 0;
}

/* Open (creating) the subdirectory `name`, ours and on the same filesystem as the cache. */
static int open_sub(struct vmsnap_objcache *c, const char *name, dev_t dev, int *out,
                    struct vmsnap_err *err)
{
    if (mkdirat(c->dfd, name, 0700) < 0 && errno != EEXIST)
        return err_sys(err, "object cache: mkdir %s/%s", c->dir, name);
    int fd = openat(c->dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return err_sys(err, "object cache: open %s/%s", c->dir, name);
    char what[PATH_MAX + 16];
    snprintf(what, sizeof(what), "%s/%s", c->dir, name);
    struct stat st;
    int rc = fstat(fd, &st) < 0 ? err_sys(err, "object cache: stat %s", what)
                                : check_owned(&st, what, err);
    if (rc == 0 && st.st_dev != dev)
        rc = vmsnap_err_set(err, EXDEV,
                            "object cache %s: on another filesystem than %s (a fill is published "
                            "by rename from tmp/ to objects/)",
                            what, c->dir);
    if (rc < 0) {
        close(fd);
        return rc;
    }
    *out = fd;
    return 0;
}

int objcache_lock(const struct vmsnap_objcache *c, const char *key, bool wait, int *out,
                  struct vmsnap_err *err)
{
    unsigned delay = 1; /* ms, doubled up to 50: a waiter notices a commit within 50 ms */
    for (;;) {
        int fd = openat(c->lfd, key, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0600);
        if (fd < 0)
            return err_sys(err, "object cache: open %s/locks/%s", c->dir, key);
        int rc = 0;
        while (rc == 0 && flock(fd, LOCK_EX | LOCK_NB) < 0) {
            if (errno == EINTR)
                continue;
            if (errno != EWOULDBLOCK)
                rc = err_sys(err, "object cache: flock %s/locks/%s", c->dir, key);
            else if (!wait)
                rc = -EBUSY;
            else if ((rc = cancel_check(err)) == 0) {
                sys_sleep_ms(delay);
                delay = VMSNAP_MIN(delay * 2, 50);
            }
        }
        struct stat a, b;
        if (rc == 0 && fstat(fd, &a) < 0) {
            rc = err_sys(err, "object cache: stat %s/locks/%s", c->dir, key);
        } else if (rc == 0 && fstatat(c->lfd, key, &b, AT_SYMLINK_NOFOLLOW) == 0) {
            if (a.st_dev == b.st_dev && a.st_ino == b.st_ino) {
                *out = fd;
                return 0;
            }
        } else if (rc == 0 && errno != ENOENT) {
            rc = err_sys(err, "object cache: stat %s/locks/%s", c->dir, key);
        }
        close(fd); /* rc 0: the holder before us removed the name; lock the new file */
        if (rc < 0)
            return rc;
    }
}

void objcache_unlock(const struct vmsnap_objcache *c, const char *key, int fd)
{
    if (fd < 0)
        return;
    if (unlinkat(c->lfd, key, 0) < 0 && errno != ENOENT)
        vlog(VMSNAP_LOG_WARN, "object cache: remove %s/locks/%s: %s", c->dir, key, strerror(errno));
    close(fd);
}

void objcache_touch(int fd, const char *key)
{
    struct timespec ts[2] = {{.tv_nsec = UTIME_OMIT}, {0}};
    clock_gettime(CLOCK_REALTIME, &ts[1]);
    if (futimens(fd, ts) < 0)
        vlog(VMSNAP_LOG_DEBUG, "object cache: set last use of %s: %s", key, strerror(errno));
}

/* A name in tmp/ is "<key>.<random>"; its key into `key`. */
static bool tmp_key(const char *name, char *key)
{
    const char *dot = strchr(name, '.');
    size_t n = dot ? (size_t)(dot - name) : 0;
    if (n == 0 || n > VMSNAP_OBJCACHE_KEY_MAX)
        return false;
    memcpy(key, name, n);
    key[n] = '\0';
    return objcache_key_ok(key);
}

/* Remove the temporary `name` if it is a dead fill's: its key's lock and its own flock free. */
static bool sweep_one(struct vmsnap_objcache *c, const char *name)
{
    char key[VMSNAP_OBJCACHE_KEY_MAX + 1];
    int lock;
    if (!tmp_key(name, key) || objcache_lock(c, key, false, &lock, NULL) < 0)
        return false;
    bool swept = false;
    int fd = openat(c->tfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) == 0) {
        swept = unlinkat(c->tfd, name, 0) == 0;
        if (!swept)
            vlog(VMSNAP_LOG_WARN, "object cache: remove %s/tmp/%s: %s", c->dir, name,
                 strerror(errno));
    }
    if (fd >= 0)
        close(fd);
    objcache_unlock(c, key, lock);
    return swept;
}

/* Remove the temporaries of dead fills, then the lock files nobody holds (a dead fill's; a
 * killed holder leaves its file). */
static void sweep(struct vmsnap_objcache *c)
{
    unsigned swept = 0, locks = 0;
    int fd = openat(c->tfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    for (struct dirent *de; d && (de = readdir(d));)
        if (de->d_name[0] != '.' && sweep_one(c, de->d_name))
            swept++;
    if (d)
        closedir(d);
    else if (fd >= 0)
        close(fd);
    fd = openat(c->lfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    d = fd >= 0 ? fdopendir(fd) : NULL;
    for (struct dirent *de; d && (de = readdir(d));) {
        int lock;
        if (objcache_key_ok(de->d_name) && objcache_lock(c, de->d_name, false, &lock, NULL) == 0) {
            objcache_unlock(c, de->d_name, lock);
            locks++;
        }
    }
    if (d)
        closedir(d);
    else if (fd >= 0)
        close(fd);
    if (swept)
        vlog(VMSNAP_LOG_INFO, "object cache %s: removed %u temporar%s of killed fills", c->dir,
             swept, swept == 1 ? "y" : "ies");
    if (locks)
        vlog(VMSNAP_LOG_DEBUG, "object cache %s: removed %u free lock files", c->dir, locks);
}

/* The cap: opts, else $VMSNAP_CACHE_SIZE, else the default. */
static int resolve_cap(const struct vmsnap_objcache_opts *o, uint64_t *cap, struct vmsnap_err *err)
{
    const char *env = getenv("VMSNAP_CACHE_SIZE");
    *cap = VMSNAP_OBJCACHE_DEFAULT_CAP;
    if (o && o->max_bytes)
        *cap = o->max_bytes;
    else if (env && *env && (parse_size(env, cap) < 0 || *cap == 0))
        return vmsnap_err_set(err, EINVAL,
                              "object cache: VMSNAP_CACHE_SIZE='%.64s': expected a size above 0 "
                              "(8G, 512M, 1.5T)",
                              env);
    return 0;
}

int vmsnap_objcache_open(const struct vmsnap_objcache_opts *o, struct vmsnap_objcache **out,
                         struct vmsnap_err *err)
{
    *out = NULL;
    char path[PATH_MAX];
    uint64_t cap;
    int rc = resolve_cap(o, &cap, err);
    if (rc == 0 && o && o->dir)
        rc = strlen(o->dir) < sizeof(path)
                 ? (snprintf(path, sizeof(path), "%s", o->dir), 0)
                 : vmsnap_err_set(err, ENAMETOOLONG, "object cache: directory name too long");
    else if (rc == 0)
        rc = default_dir(path, err);
    if (rc < 0)
        return rc;
    struct vmsnap_objcache *c = calloc(1, sizeof(*c));
    if (!c || !(c->dir = strdup(path))) {
        free(c);
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    }
    c->cap = cap;
    c->dfd = c->ofd = c->tfd = c->lfd = -1;
    struct stat st;
    rc = open_root(path, &c->dfd, err);
    if (rc == 0 && fstat(c->dfd, &st) < 0)
        rc = err_sys(err, "object cache: stat %s", path);
    if (rc == 0)
        rc = open_sub(c, "objects", st.st_dev, &c->ofd, err);
    if (rc == 0)
        rc = open_sub(c, "tmp", st.st_dev, &c->tfd, err);
    if (rc == 0)
        rc = open_sub(c, "locks", st.st_dev, &c->lfd, err);
    if (rc < 0) {
        vmsnap_objcache_close(c);
        return rc;
    }
    sweep(c);
    *out = c;
    return 0;
}

void vmsnap_objcache_close(struct vmsnap_objcache *c)
{
    if (!c)
        return;
    const int fds[] = {c->dfd, c->ofd, c->tfd, c->lfd};
    for (size_t i = 0; i < sizeof(fds) / sizeof(fds[0]); i++)
        if (fds[i] >= 0)
            close(fds[i]);
    free(c->dir);
    free(c);
}

const char *vmsnap_objcache_dir(const struct vmsnap_objcache *c)
{
    return c->dir;
}
