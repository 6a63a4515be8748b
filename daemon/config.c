/* SPDX-License-Identifier: Apache-2.0 */
/* The node's configuration: "key = value" lines (docs/daemon.md lists the keys), '#' comments;
 * flags are applied after the file through the same d_config_set(). Keys that name several
 * things (root, asset_dir, profile) may repeat. A profile line names what a request may ask for
 * and how it reaches its store: "profile = NAME [aws=AWSPROFILE] [endpoint=URL] [region=R]
 * [path_style]"; the credentials stay where the AWS profile keeps them (the daemon's shared
 * credentials file, docs/credentials.md), never in a request. */
#include "daemon.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void d_config_init(struct d_config *c)
{
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    *c = (struct d_config){
        .socket_mode = 0660,
        .workers = 2,
        .queue_max = 16,
        .codec_threads = cpus > 0 ? (unsigned)cpus : 1,
        .memory = 512ull << 20,
        .connections = 16,
        .deadline = 3600,
        .stop_timeout = 30,
        .body_max = 64u << 10,
        .header_mem = 16u << 10,
        .max_connections = 64,
        .retry_after = 2,
        .bulk_nice = 0,
    };
}

static void free_list(char **v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(v[i]);
}

void d_config_fini(struct d_config *c)
{
    free(c->socket);
    free(c->socket_group);
    free_list(c->roots, c->n_roots);
    free_list(c->asset_dirs, c->n_asset_dirs);
    for (size_t i = 0; i < c->n_profiles; i++) {
        struct d_profile *p = &c->profiles[i];
        free(p->name);
        free(p->aws);
        free(p->endpoint);
        free(p->region);
    }
    free(c->state_dir);
    free(c->ram_dir);
    free(c->cache_dir);
    free(c->qemu);
    free(c->accel);
    *c = (struct d_config){0};
}

static int set_str(char **dst, const char *v)
{
    char *s = strdup(v);
    if (!s)
        return -ENOMEM;
    free(*dst);
    *dst = s;
    return 0;
}

/* a size with an optional K/M/G/T suffix (powers of 1024) */
static int parse_size(const char *v, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long n = strtoull(v, &end, 10);
    if (errno || end == v || *v == '-')
        return -EINVAL;
    unsigned shift = 0;
    switch (*end) {
    case 'K':
        shift = 10;
        end++;
        break;
    case 'M':
        shift = 20;
        end++;
        break;
    case 'G':
        shift = 30;
        end++;
        break;
    case 'T':
        shift = 40;
        end++;
        break;
    default:
        break;
    }
    if (*end || (shift && n > (UINT64_MAX >> shift)))
        return -EINVAL;
    *out = (uint64_t)n << shift;
    return 0;
}

static int parse_uint(const char *v, unsigned lo, unsigned hi, unsigned base, unsigned *out)
{
    char *end;
    errno = 0;
    unsigned long n = strtoul(v, &end, (int)base);
    if (errno || end == v || *end || *v == '-' || n < lo || n > hi)
        return -EINVAL;
    *out = (unsigned)n;
    return 0;
}

static int parse_secs(const char *v, double *out)
{
    char *end;
    double d = strtod(v, &end);
    if (end == v || *end || !(d > 0) || d > 1e7)
        return -EINVAL;
    *out = d;
    return 0;
}

static int add_list(char **v, size_t *n, const char *val, struct vmsnap_err *err, const char *key)
{
    if (*n >= D_MAX_ROOTS)
        return vmsnap_err_set(err, E2BIG, "%s: at most %d", key, D_MAX_ROOTS);
    if (val[0] != '/')
        return vmsnap_err_set(err, EINVAL, "%s %s: not an absolute path", key, val);
    char *r = realpath(val, NULL);
    if (!r)
        return vmsnap_err_set(err, errno, "%s %s: %s", key, val, strerror(errno));
    v[(*n)++] = r;
    return 0;
}

static int add_profile(struct d_config *c, const char *val, struct vmsnap_err *err)
{
    if (c->n_profiles >= D_MAX_PROFILES)
        return vmsnap_err_set(err, E2BIG, "profile: at most %d", D_MAX_PROFILES);
    char *copy = strdup(val), *save = NULL;
    if (!copy)
        return -ENOMEM;
    struct d_profile p = {0};
    int rc = 0;
    for (char *w = strtok_r(copy, " \t", &save); w && rc == 0; w = strtok_r(NULL, " \t", &save)) {
        if (!p.name)
            rc = set_str(&p.name, w);
        else if (!strncmp(w, "aws=", 4))
            rc = set_str(&p.aws, w + 4);
        else if (!strncmp(w, "endpoint=", 9))
            rc = set_str(&p.endpoint, w + 9);
        else if (!strncmp(w, "region=", 7))
            rc = set_str(&p.region, w + 7);
        else if (!strcmp(w, "path_style"))
            p.path_style = true;
        else
            rc = vmsnap_err_set(err, EINVAL, "profile %s: unknown word '%s'", p.name, w);
    }
    free(copy);
    if (rc == 0 && !p.name)
        rc = vmsnap_err_set(err, EINVAL, "profile: no name");
    if (rc == 0 && d_config_profile(c, p.name))
        rc = vmsnap_err_set(err, EEXIST, "profile %s: given twice", p.name);
    if (rc < 0) {
        free(p.name);
        free(p.aws);
        free(p.endpoint);
        free(p.region);
        return rc;
    }
    c->profiles[c->n_profiles++] = p;
    return 0;
}

const struct d_profile *d_config_profile(const struct d_config *c, const char *name)
{
    for (size_t i = 0; name && i < c->n_profiles; i++)
        if (!strcmp(c->profiles[i].name, name))
            return &c->profiles[i];
    return NULL;
}

int d_config_set(struct d_config *c, const char *key, const char *v, struct vmsnap_err *err)
{
    int rc;
    uint64_t sz;
    if (!strcmp(key, "socket"))
        rc = set_str(&c->socket, v);
    else if (!strcmp(key, "socket_mode"))
        rc = parse_uint(v, 0, 0777, 8, &c->socket_mode);
    else if (!strcmp(key, "socket_group"))
        rc = set_str(&c->socket_group, v);
    else if (!strcmp(key, "root"))
        return add_list(c->roots, &c->n_roots, v, err, key);
    else if (!strcmp(key, "asset_dir"))
        return add_list(c->asset_dirs, &c->n_asset_dirs, v, err, key);
    else if (!strcmp(key, "profile"))
        return add_profile(c, v, err);
    else if (!strcmp(key, "state_dir"))
        rc = set_str(&c->state_dir, v);
    else if (!strcmp(key, "ram_dir"))
        rc = set_str(&c->ram_dir, v);
    else if (!strcmp(key, "cache_dir"))
        rc = set_str(&c->cache_dir, v);
    else if (!strcmp(key, "cache_size"))
        rc = parse_size(v, &c->cache_size);
    else if (!strcmp(key, "qemu"))
        rc = set_str(&c->qemu, v);
    else if (!strcmp(key, "accel"))
        rc = set_str(&c->accel, v);
    else if (!strcmp(key, "workers"))
        rc = parse_uint(v, 1, 64, 10, &c->workers);
    else if (!strcmp(key, "queue_max"))
        rc = parse_uint(v, 0, 4096, 10, &c->queue_max);
    else if (!strcmp(key, "codec_threads"))
        rc = parse_uint(v, 1, 1024, 10, &c->codec_threads);
    else if (!strcmp(key, "memory"))
        rc = parse_size(v, &c->memory) < 0 || c->memory < (16u << 20) ? -EINVAL : 0;
    else if (!strcmp(key, "connections"))
        rc = parse_uint(v, 1, 1024, 10, &c->connections);
    else if (!strcmp(key, "op_threads"))
        rc = parse_uint(v, 1, 1024, 10, &c->op_threads);
    else if (!strcmp(key, "op_memory"))
        rc = parse_size(v, &c->op_memory) < 0 || c->op_memory < (16u << 20) ? -EINVAL : 0;
    else if (!strcmp(key, "op_connections"))
        rc = parse_uint(v, 1, 1024, 10, &c->op_connections);
    else if (!strcmp(key, "deadline"))
        rc = parse_secs(v, &c->deadline);
    else if (!strcmp(key, "stop_timeout"))
        rc = parse_secs(v, &c->stop_timeout);
    else if (!strcmp(key, "body_max"))
        rc = parse_size(v, &sz) < 0 || sz < 256 || sz > (16u << 20) ? -EINVAL
                                                                    : (c->body_max = sz, 0);
    else if (!strcmp(key, "header_mem"))
        rc = parse_size(v, &sz) < 0 || sz < 4096 || sz > (1u << 20) ? -EINVAL
                                                                    : (c->header_mem = sz, 0);
    else if (!strcmp(key, "max_connections"))
        rc = parse_uint(v, 1, 4096, 10, &c->max_connections);
    else if (!strcmp(key, "retry_after"))
        rc = parse_uint(v, 1, 3600, 10, &c->retry_after);
    else if (!strcmp(key, "bulk_workers"))
        rc = parse_uint(v, 1, 1024, 10, &c->bulk_workers);
    else if (!strcmp(key, "bulk_nice"))
        rc = parse_uint(v, 0, 19, 10, &c->bulk_nice);
    else
        return vmsnap_err_set(err, EINVAL, "unknown setting '%s'", key);
    if (rc == -EINVAL)
        return vmsnap_err_set(err, EINVAL, "%s: bad value '%s'", key, v);
    return rc;
}

static char *trim(char *s)
{
    while (*s == ' ' || *s == '\t')
        s++;
    size_t n = strlen(s);
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\n' || s[n - 1] == '\r'))
        s[--n] = '\0';
    return s;
}

int d_config_load(struct d_config *c, const char *path, struct vmsnap_err *err)
{
    FILE *f = fopen(path, "re");
    if (!f)
        return vmsnap_err_set(err, errno, "config %s: %s", path, strerror(errno));
    char line[4096];
    unsigned no = 0;
    int rc = 0;
    while (rc == 0 && fgets(line, sizeof(line), f)) {
        no++;
        char *s = trim(line);
        if (!*s || *s == '#')
            continue;
        char *eq = strchr(s, '=');
        if (!eq) {
            rc = vmsnap_err_set(err, EINVAL, "config %s:%u: not 'key = value'", path, no);
            break;
        }
        *eq = '\0';
        rc = d_config_set(c, trim(s), trim(eq + 1), err);
        if (rc < 0)
            vmsnap_err_wrap(err, "config %s:%u: ", path, no);
    }
    fclose(f);
    return rc;
}

int d_config_check(const struct d_config *c, struct vmsnap_err *err)
{
    if (!c->socket)
        return vmsnap_err_set(err, EINVAL, "no socket (--socket PATH or 'socket = PATH')");
    if (c->socket[0] != '/')
        return vmsnap_err_set(err, EINVAL, "socket %s: not an absolute path", c->socket);
    if (c->memory < (uint64_t)c->workers * (16u << 20))
        return vmsnap_err_set(err, EINVAL, "memory: less than 16M per worker (%u workers)",
                              c->workers);
    return 0;
}
