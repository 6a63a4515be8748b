/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The AWS shared files: ~/.aws/credentials and ~/.aws/config (AWS_SHARED_CREDENTIALS_FILE,
 * AWS_CONFIG_FILE). Both are INI as Python's configparser reads them for the AWS CLI: `[name]`
 * sections (in the config file `[default]` or `[profile name]`), `key = value` (or `key: value`)
 * lines, `#` / `;` comment lines, and a nested block written as `s3 =` followed by indented
 * `key = value` lines (kept as "s3.key"); `[services NAME]` sections hold per-service settings
 * (endpoint_url) of the profiles that say `services = NAME`. No Debian library reads this dialect,
 * so this is a small strict reader: a line that is none of those, a setting before any section, or
 * a duplicate section or setting of the profile in use is an error naming the file and line (the
 * AWS CLI refuses such files too), and never echoes the line (it may hold a secret).
 *
 * Only the profile in use is kept. The files are read whole, at most 1 MiB each, and the buffer
 * is wiped after.
 */
#include "s3_creds.h"

#include "util/util.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#define FILE_CAP (1u << 20)
#define LINE_CAP 8192
#define KV_CAP 256

static const char *env(const char *name)
{
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

static int home_dir(char *out, size_t len, struct vmsnap_err *err)
{
    const char *h = env("HOME");
    char buf[4096];
    struct passwd pw, *res = NULL;
    if (!h && getpwuid_r(getuid(), &pw, buf, sizeof(buf), &res) == 0 && res)
        h = res->pw_dir;
    if (!h)
        return vmsnap_err_set(err, ENOENT,
                              "no home directory (HOME not set) for ~/.aws: set AWS_CONFIG_FILE "
                              "and AWS_SHARED_CREDENTIALS_FILE");
    snprintf(out, len, "%s", h);
    return 0;
}

/* The path of one file: the environment's (a leading ~/ expanded) or ~/.aws/NAME. */
static int file_path(const char *envname, const char *name, char **out, struct vmsnap_err *err)
{
    const char *v = env(envname);
    char home[4096], path[8192];
    if (v && strncmp(v, "~/", 2)) {
        snprintf(path, sizeof(path), "%s", v);
    } else {
        int rc = home_dir(home, sizeof(home), err);
        if (rc < 0)
            return rc;
        if (v)
            snprintf(path, sizeof(path), "%s/%s", home, v + 2);
        else
            snprintf(path, sizeof(path), "%s/.aws/%s", home, name);
    }
    *out = strdup(path);
    return *out ? 0 : vmsnap_err_set(err, ENOMEM, "out of memory");
}

/* The whole file into a NUL-terminated buffer; *buf NULL (and 0) when it does not exist. */
static int read_small(const char *path, char **buf, size_t *len, struct vmsnap_err *err)
{
    *buf = NULL;
    *len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT || errno == ENOTDIR ? 0 : err_sys(err, "AWS file %s", path);
    struct stat sb;
    int rc = 0;
    if (fstat(fd, &sb) < 0) {
        rc = err_sys(err, "AWS file %s", path);
    } else if (!S_ISREG(sb.st_mode)) {
        rc = vmsnap_err_set(err, EINVAL, "AWS file %s: not a regular file", path);
    } else if ((uint64_t)sb.st_size > FILE_CAP) {
        rc = vmsnap_err_set(err, EFBIG, "AWS file %s: larger than %u bytes", path, FILE_CAP);
    } else if (!(*buf = malloc((size_t)sb.st_size + 1))) {
        rc = vmsnap_err_set(err, ENOMEM, "out of memory");
    } else {
        size_t got = 0;
        while (got < (size_t)sb.st_size) {
            ssize_t n = read(fd, *buf + got, (size_t)sb.st_size - got);
            if (n < 0 && errno == EINTR)
                continue;
            if (n < 0) {
                rc = err_sys(err, "read %s", path);
                break;
            }
            if (n == 0)
                break;
            got += (size_t)n;
        }
        (*buf)[got] = '\0';
        *len = got;
    }
    close(fd);
    if (rc < 0 && *buf) {
        explicit_bzero(*buf, *len);
        free(*buf);
        *buf = NULL;
    }
    return rc;
}

static char *trim(char *s)
{
    while (*s == ' ' || *s == '\t')
        s++;
    size_t n = strlen(s);
    while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t'))
        s[--n] = '\0';
    return s;
}

static bool key_ok(const char *k)
{
    if (!*k)
        return false;
    for (; *k; k++)
        if (!isalnum((unsigned char)*k) && !strchr("_-.", *k))
            return false;
    return true;
}

static int kv_add(struct s3_profile *p, const char *key, const char *val, bool from_cred,
                  const char *path, unsigned line, struct vmsnap_err *err)
{
    for (size_t i = 0; i < p->n; i++)
        if (p->kv[i].from_cred == from_cred && !strcmp(p->kv[i].key, key))
            return vmsnap_err_set(err, EINVAL, "AWS file %s:%u: '%s' set twice in profile \"%s\"",
                                  path, line, key, p->name);
    if (p->n >= KV_CAP)
        return vmsnap_err_set(err, EINVAL, "AWS file %s:%u: more than %u settings in profile", path,
                              line, KV_CAP);
    if (grow_array(&p->kv, &p->cap, p->n + 1, sizeof(*p->kv), 16) < 0)
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    struct s3_kv *e = &p->kv[p->n];
    e->key = strdup(key);
    e->val = strdup(val);
    e->from_cred = from_cred;
    if (!e->key || !e->val) {
        free(e->key);
        free(e->val);
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    }
    p->n++;
    return 0;
}

/* The profile a section header names in this file, or NULL (another kind of section). */
static const char *section_profile(char *name, bool cred)
{
    if (cred || !strcmp(name, "default"))
        return name;
    if (strncmp(name, "profile", 7) || (name[7] != ' ' && name[7] != '\t'))
        return NULL;
    char *p = trim(name + 7);
    return *p ? p : NULL;
}

struct parse_state {
    const char *path;
    bool cred;
    bool *found;
    bool have_section, in_sel;
    char svc[130];   /* the [services NAME] section this line is in, "" if none */
    char nested[64]; /* the key of the nested block open ("s3"), "" if none */
    unsigned line;
};

/* One line (without its end-of-line). */
static int parse_line(struct s3_profile *p, struct parse_state *ps, char *raw,
                      struct vmsnap_err *err)
{
    char *s = raw;
    while (*s == ' ' || *s == '\t')
        s++;
    const bool indented = s != raw;
    if (!*s || *s == '#' || *s == ';')
        return 0;
    if (indented && !ps->nested[0])
        return vmsnap_err_set(err, EINVAL,
                              "AWS file %s:%u: an indented line outside a nested block (a "
                              "'NAME =' line followed by indented settings)",
                              ps->path, ps->line);
    if (!indented && *s == '[') {
        ps->nested[0] = '\0';
        char *t = trim(s);
        size_t n = strlen(t);
        if (n < 3 || t[n - 1] != ']')
            return vmsnap_err_set(err, EINVAL, "AWS file %s:%u: a section header without ']'",
                                  ps->path, ps->line);
        t[n - 1] = '\0';
        char *name = trim(t + 1);
        ps->svc[0] = '\0';
        if (!ps->cred && !strncmp(name, "services", 8) && (name[8] == ' ' || name[8] == '\t'))
            snprintf(ps->svc, sizeof(ps->svc), "%s", trim(name + 8));
        const char *prof = section_profile(name, ps->cred);
        ps->have_section = true;
        ps->in_sel = prof && !strcmp(prof, p->name);
        if (ps->in_sel && *ps->found)
            return vmsnap_err_set(err, EINVAL, "AWS file %s:%u: profile \"%s\" appears twice",
                                  ps->path, ps->line, p->name);
        if (ps->in_sel)
            *ps->found = true;
        return 0;
    }
    if (!ps->have_section)
        return vmsnap_err_set(err, EINVAL, "AWS file %s:%u: a setting before any [section]",
                              ps->path, ps->line);
    size_t d = strcspn(s, "=:");
    if (!s[d])
        return vmsnap_err_set(err, EINVAL,
                              "AWS file %s:%u: expected 'KEY = VALUE', a [section] or a comment",
                              ps->path, ps->line);
    s[d] = '\0';
    char *k = trim(s), *v = trim(s + d + 1);
    for (char *q = k; *q; q++)
        *q = (char)tolower((unsigned char)*q);
    if (!key_ok(k) || strlen(k) >= sizeof(ps->nested))
        return vmsnap_err_set(err, EINVAL, "AWS file %s:%u: a bad setting name", ps->path,
                              ps->line);
    if (!indented) {
        ps->nested[0] = '\0';
        if (!*v) { /* "s3 =": a nested block may follow */
            snprintf(ps->nested, sizeof(ps->nested), "%s", k);
            return 0;
        }
    }
    if ((!ps->in_sel && !ps->svc[0]) || !*v)
        return 0;
    /* a [services NAME] section's settings are kept as "@NAME.s3.endpoint_url": which one the
     * profile uses ("services = NAME") may be said later in the file */
    char full[300];
    snprintf(full, sizeof(full), "%s%s%s%s%s", ps->svc[0] ? "@" : "", ps->svc,
             ps->svc[0] ? "." : "", indented ? ps->nested : "", indented ? "." : "");
    snprintf(full + strlen(full), sizeof(full) - strlen(full), "%s", k);
    return kv_add(p, full, v, ps->cred, ps->path, ps->line, err);
}

int s3_profile_parse(struct s3_profile *p, const char *path, bool cred, char *buf, size_t len,
                     struct vmsnap_err *err)
{
    struct parse_state ps = {
        .path = path, .cred = cred, .found = cred ? &p->in_cred : &p->in_config};
    int rc = 0;
    char *line = buf;
    while (rc == 0 && line < buf + len) {
        char *nl = memchr(line, '\n', (size_t)(buf + len - line));
        char *end = nl ? nl : buf + len;
        ps.line++;
        if (end - line > LINE_CAP) {
            rc = vmsnap_err_set(err, EINVAL, "AWS file %s:%u: line longer than %u bytes", path,
                                ps.line, LINE_CAP);
            break;
        }
        if (memchr(line, '\0', (size_t)(end - line))) {
            rc = vmsnap_err_set(err, EINVAL, "AWS file %s:%u: a NUL byte", path, ps.line);
            break;
        }
        *end = '\0';
        if (end > line && end[-1] == '\r')
            end[-1] = '\0';
        rc = parse_line(p, &ps, line, err);
        line = end + 1;
    }
    return rc;
}

static int parse_file(struct s3_profile *p, const char *path, bool cred, struct vmsnap_err *err)
{
    char *buf;
    size_t len;
    int rc = read_small(path, &buf, &len, err);
    if (rc < 0 || !buf)
        return rc;
    rc = s3_profile_parse(p, path, cred, buf, len, err);
    explicit_bzero(buf, len);
    free(buf);
    return rc;
}

int s3_profile_load(struct s3_profile *p, const char *flag_profile, struct vmsnap_err *err)
{
    memset(p, 0, sizeof(*p));
    const char *name = flag_profile;
    p->flag = name != NULL;
    if (!name)
        name = env("AWS_PROFILE");
    if (!name)
        name = env("AWS_DEFAULT_PROFILE");
    p->named = name != NULL;
    if (!name)
        name = "default";
    bool ok = *name && strlen(name) <= 128;
    for (const char *q = name; *q; q++)
        if (!isgraph((unsigned char)*q) || *q == '[' || *q == ']')
            ok = false;
    if (!ok)
        return vmsnap_err_set(err, EINVAL,
                              "profile name: 1 to 128 printable characters without spaces or "
                              "brackets%s",
                              p->flag ? " (--profile)" : " (AWS_PROFILE)");
    if (!(p->name = strdup(name)))
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    int rc = file_path("AWS_SHARED_CREDENTIALS_FILE", "credentials", &p->cred_path, err);
    if (rc == 0)
        rc = file_path("AWS_CONFIG_FILE", "config", &p->config_path, err);
    if (rc == 0)
        rc = parse_file(p, p->cred_path, true, err);
    if (rc == 0)
        rc = parse_file(p, p->config_path, false, err);
    if (rc == 0 && p->named && !p->in_cred && !p->in_config)
        rc = vmsnap_err_set(err, EINVAL, "profile \"%s\" (%s) is in neither %s nor %s", p->name,
                            p->flag ? "--profile" : "AWS_PROFILE", p->cred_path, p->config_path);
    return rc;
}

const char *s3_profile_get_src(const struct s3_profile *p, const char *key, bool from_cred)
{
    for (size_t i = 0; i < p->n; i++)
        if (p->kv[i].from_cred == from_cred && !strcmp(p->kv[i].key, key))
            return p->kv[i].val;
    return NULL;
}

const char *s3_profile_service(const struct s3_profile *p, const char *service, const char *key)
{
    const char *svc = s3_profile_get_src(p, "services", false);
    char full[300];
    if (!svc)
        return NULL;
    snprintf(full, sizeof(full), "@%s.%s.%s", svc, service, key);
    return s3_profile_get_src(p, full, false);
}

const char *s3_profile_get(const struct s3_profile *p, const char *key)
{
    const char *v = s3_profile_get_src(p, key, true);
    return v ? v : s3_profile_get_src(p, key, false);
}

void s3_profile_fini(struct s3_profile *p)
{
    for (size_t i = 0; i < p->n; i++) {
        explicit_bzero(p->kv[i].val, strlen(p->kv[i].val));
        free(p->kv[i].key);
        free(p->kv[i].val);
    }
    free(p->kv);
    free(p->name);
    free(p->cred_path);
    free(p->config_path);
    memset(p, 0, sizeof(*p));
}
