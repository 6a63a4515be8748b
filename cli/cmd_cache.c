/* SPDX-License-Identifier: Apache-2.0 */
/* vmsnap cache stat|evict: page-cache state of snapshot files, and hygiene on demand;
 * cache objects|trim: the node-local object cache (docs/objcache.md). */
#include "cli.h"

#include <ctype.h>
#include "vmsnap/objcache.h"
#include "vmsnap/pcache.h"

#include <errno.h>
#include <getopt.h> /* optarg, optind */
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define STAT_USAGE "cache stat [--json] PATH..."
#define EVICT_USAGE                                                                                \
    "cache evict [--json] [--staged] [--preserve PATH]... [--wait DURATION] [--kick-writeback] "   \
    "PATH..."
#define OBJECTS_USAGE "cache objects [--json] [--cache-dir DIR] [--cache-size SIZE]"
#define TRIM_USAGE "cache trim [--max-size SIZE] [--json] [--cache-dir DIR] [--cache-size SIZE]"

const struct cli_opt cli_cache_stat_opts[] = {
    {"json", 0, 'J', NULL, CLI_K_NONE, NULL, NULL, "the files and the total as JSON (streamed)"},
    CLI_OPT_END,
};

const struct cli_opt cli_cache_evict_opts[] = {
    {"json", 0, 'J', NULL, CLI_K_NONE, NULL, NULL, "the counts as one JSON object on stdout"},
    {"staged", 0, 's', NULL, CLI_K_NONE, NULL, NULL,
     "truncate and unlink single-link files outside the --preserve paths"},
    {"preserve", 0, 'p', "PATH", CLI_K_FILE, NULL, NULL,
     "with --staged: keep the files under PATH (repeatable)"},
    {"wait", 0, 'w', "DURATION", CLI_K_NONE, NULL, NULL,
     "retry dirty files for up to DURATION (90, 2.5s, 10m, 1h at most)"},
    {"kick-writeback", 0, 'k', NULL, CLI_K_NONE, NULL, NULL,
     "start the writeback of dirty files first"},
    CLI_OPT_END,
};

/* cache objects and cache trim; objects refuses --max-size */
const struct cli_opt cli_cache_objects_opts[] = {
    {"json", 0, 'j', NULL, CLI_K_NONE, NULL, NULL, "the result as one JSON object on stdout"},
    {"cache-dir", 0, 'd', "DIR", CLI_K_DIR, NULL, NULL,
     "the cache (default: VMSNAP_CACHE_DIR, else /var/cache/vmsnap for root, ~/.cache/vmsnap)"},
    {"cache-size", 0, 's', "SIZE", CLI_K_NONE, NULL, NULL,
     "the cache's cap (default: VMSNAP_CACHE_SIZE, else 8G)"},
    {"max-size", 0, 'm', "SIZE", CLI_K_NONE, NULL, "trim",
     "evict least recently used entries down to SIZE (default: the cap)"},
    CLI_OPT_END,
};

const struct cli_sub cli_cache_subs[] = {
    {"stat", STAT_USAGE,
     "pages cached, dirty, under writeback, evicted and recently evicted, per file and in total",
     cli_cache_stat_opts, "file..."},
    {"evict", EVICT_USAGE, "drop the clean pages of files that are never modified",
     cli_cache_evict_opts, "file..."},
    {"objects", OBJECTS_USAGE, "the object cache's entries, totals and cap", cli_cache_objects_opts,
     "none"},
    {"trim", TRIM_USAGE, "evict least recently used entries of the object cache",
     cli_cache_objects_opts, "none"},
    {NULL, NULL, NULL, NULL, NULL},
};

struct stat_out {
    bool json;
    bool first;
};

static double pct(uint64_t part, uint64_t whole)
{
    return whole ? 100.0 * (double)part / (double)whole : 0.0;
}

static json_object *stat_json(const char *path, const struct vmsnap_pcache_stat *st)
{
    json_object *o = json_object_new_object();
    if (path)
        json_object_object_add(o, "path", json_object_new_string(path));
    else
        json_object_object_add(o, "files", json_object_new_int64((int64_t)st->files));
    json_object_object_add(o, "logical_bytes", json_object_new_int64((int64_t)st->size));
    json_object_object_add(o, "pages", json_object_new_int64((int64_t)st->pages));
    json_object_object_add(o, "cached", json_object_new_int64((int64_t)st->cached));
    json_object_object_add(o, "method",
                           json_object_new_string(st->mincore ? "mincore" : "cachestat"));
    if (!st->mincore) {
        json_object_object_add(o, "dirty", json_object_new_int64((int64_t)st->dirty));
        json_object_object_add(o, "writeback", json_object_new_int64((int64_t)st->writeback));
        json_object_object_add(o, "evicted", json_object_new_int64((int64_t)st->evicted));
        json_object_object_add(o, "recently_evicted",
                               json_object_new_int64((int64_t)st->recently_evicted));
    }
    return o;
}

static void stat_line(const char *label, const struct vmsnap_pcache_stat *st)
{
    char size[32];
    cli_bytes(size, sizeof(size), st->size);
    if (st->mincore)
        printf("%12s %10llu %10llu %6.1f%% %10s %10s %10s %10s  %s (mincore: only resident pages "
               "known)\n",
               size, (unsigned long long)st->pages, (unsigned long long)st->cached,
               pct(st->cached, st->pages), "-", "-", "-", "-", label);
    else
        printf("%12s %10llu %10llu %6.1f%% %10llu %10llu %10llu %10llu  %s\n", size,
               (unsigned long long)st->pages, (unsigned long long)st->cached,
               pct(st->cached, st->pages), (unsigned long long)st->dirty,
               (unsigned long long)st->writeback, (unsigned long long)st->evicted,
               (unsigned long long)st->recently_evicted, label);
}

/* Streamed one file at a time so memory stays bounded on large trees. */
static int stat_cb(void *arg, const char *path, const struct vmsnap_pcache_stat *st)
{
    struct stat_out *o = arg;
    if (o->json) {
        json_object *j = stat_json(path, st);
        fputs(o->first ? "" : ",", stdout);
        cli_json_write(stdout, j);
        json_object_put(j);
        o->first = false;
    } else {
        static char p[CLI_PRINTABLE_MAX];
        stat_line(cli_printable(p, sizeof(p), path), st);
    }
    return 0;
}

static int cache_stat(int argc, char **argv)
{
    struct stat_out o = {.first = true};
    int c;
    optind = 1;
    while ((c = cli_getopt(argc, argv, cli_cache_stat_opts)) != -1) {
        switch (c) {
        case 'J':
            cli_json = true;
            break;
        case 'h':
            return cli_sub_help("cache", &cli_cache_subs[0]);
        default:
            return cli_usage("cache", "usage: %s", STAT_USAGE);
        }
    }
    if (optind >= argc)
        return cli_usage("cache", "stat: no PATH given (usage: %s)", STAT_USAGE);
    struct vmsnap_pcache_stat total = {0};
    int rc = EXIT_OK;
    o.json = cli_json;
    if (o.json) { /* streamed: memory stays bounded on any tree */
        cli_out_stream_begin();
        fputs(",\"files\":[", stdout);
    } else
        printf("%12s %10s %10s %7s %10s %10s %10s %10s  %s\n", "SIZE", "PAGES", "CACHED", "%",
               "DIRTY", "WRITEBACK", "EVICTED", "RECENT", "PATH");
    for (int i = optind; i < argc; i++) {
        struct vmsnap_pcache_stat sum;
        struct vmsnap_err err = {0};
        if ((cli_socket ? cli_client_pcache_stat_path
                        : vmsnap_pcache_stat_path)(argv[i], stat_cb, &o, &sum, &err) < 0)
            rc = cli_fail("cache", &err);
        total.files += sum.files;
        total.size += sum.size;
        total.pages += sum.pages;
        total.cached += sum.cached;
        total.dirty += sum.dirty;
        total.writeback += sum.writeback;
        total.evicted += sum.evicted;
        total.recently_evicted += sum.recently_evicted;
        total.mincore |= sum.mincore;
        total.page_size = sum.page_size;
    }
    if (o.json) {
        json_object *t = stat_json(NULL, &total);
        printf("],\"page_bytes\":%u,\"total\":", total.page_size);
        cli_json_write(stdout, t);
        json_object_put(t);
    } else {
        char label[64];
        snprintf(label, sizeof(label), "total (%llu files)", (unsigned long long)total.files);
        stat_line(label, &total);
    }
    return rc;
}

/* The --wait schedule: the library's 0.5 s, 1.5 s, 3 s, then every second up to the limit. */
static size_t wait_schedule(double limit, double *d, size_t cap)
{
    static const double first[] = {0.5, 1.5, 3.0};
    size_t n = 0;
    for (size_t i = 0; i < 3 && first[i] <= limit; i++)
        d[n++] = first[i];
    for (double t = 4.0; t <= limit && n < cap - 1; t += 1.0)
        d[n++] = t;
    if (n == 0 || d[n - 1] < limit)
        d[n++] = limit;
    return n;
}

/* --wait: digits and a point, then s, m, h or d (90, 2.5s, 10m, 1h, as gc --older-than): no
 * sign, space, hex or exponent, which strtod alone would take. Up to an hour; -1 when it is not
 * such a duration. */
static double parse_wait(char *arg)
{
    const size_t n = strspn(arg, "0123456789.");
    const char u = arg[n];
    char *end = arg;
    errno = 0;
    double wait = -1;
    if (n && isdigit((unsigned char)arg[0]) && (!u || (strchr("smhd", u) && !arg[n + 1]))) {
        wait = strtod(arg, &end);
        if (end != arg + n)
            wait = -1;
        wait *= u == 'm' ? 60 : u == 'h' ? 3600 : u == 'd' ? 86400 : 1;
        end = arg + n + (u != 0);
    }
    if (errno || end == arg || *end || !(wait >= 0) || wait > 3600)
        return -1;
    return wait;
}

/* cache evict's command line. */
struct evict_args {
    struct vmsnap_pcache_evict_opts opts;
    double wait; /* --wait, seconds; -1: none */
    const char **preserve;
    size_t npreserve;
};

/* Parse the options into a (a->preserve allocated, freed by the caller, also on failure).
 * Returns the index of the first PATH, or -1 with *rc the exit code. */
static int evict_getopt(int argc, char **argv, struct evict_args *a, int *rc)
{
    a->wait = -1;
    a->preserve = calloc((size_t)argc + 1, sizeof(char *));
    if (!a->preserve) {
        *rc = cli_fail_code("cache", ENOMEM, "out of memory");
        return -1;
    }
    int c;
    optind = 1;
    while ((c = cli_getopt(argc, argv, cli_cache_evict_opts)) != -1) {
        switch (c) {
        case 's':
            a->opts.staged = true;
            break;
        case 'J':
            cli_json = true;
            break;
        case 'k':
            a->opts.kick_writeback = true;
            break;
        case 'p':
            a->preserve[a->npreserve++] = optarg;
            break;
        case 'w':
            if ((a->wait = parse_wait(optarg)) < 0) {
                *rc = cli_usage("cache",
                                "--wait '%s': expected a duration up to an hour (seconds, or "
                                "with s, m or h: 90, 2.5s, 10m, 1h)",
                                optarg);
                return -1;
            }
            break;
        case 'h':
            *rc = cli_sub_help("cache", &cli_cache_subs[1]);
            return -1;
        default:
            *rc = cli_usage("cache", "usage: %s", EVICT_USAGE);
            return -1;
        }
    }
    if (optind >= argc) {
        *rc = cli_usage("cache", "evict: no PATH given (usage: %s)", EVICT_USAGE);
        return -1;
    }
    a->opts.preserve = a->npreserve ? a->preserve : NULL;
    return optind;
}

/* The retrier of --wait SECONDS (> 0), on its schedule. */
static int wait_retrier(double wait, struct vmsnap_pcache_retrier **out, struct vmsnap_err *err)
{
    double *delays = calloc(VMSNAP_PCACHE_RETRIER_MAX_DELAYS, sizeof(double));
    int r = delays ? vmsnap_pcache_retrier_new(
                         delays, wait_schedule(wait, delays, VMSNAP_PCACHE_RETRIER_MAX_DELAYS), out,
                         err)
                   : vmsnap_err_set(err, ENOMEM, "out of memory");
    free(delays);
    return r;
}

/* What an evict did, the retries of --wait included. */
struct evict_totals {
    uint64_t dropped_pages, dropped_files, still_dirty, changed;
};

/* Wait out the retrier (freed here) and count what it did into t; EXIT_FAIL when interrupted. */
static int evict_wait(struct vmsnap_pcache_retrier *retrier, double wait,
                      const struct vmsnap_pcache_report *rep, struct evict_totals *t)
{
    int rc = EXIT_OK;
    if (vmsnap_pcache_retrier_wait(retrier, wait + 1.0) == -ECANCELED)
        rc = cli_fail_code("cache", ECANCELED, "interrupted while waiting for writeback (--wait)");
    struct vmsnap_pcache_retrier_stats rs;
    vmsnap_pcache_retrier_get_stats(retrier, &rs);
    vmsnap_pcache_retrier_free(retrier);
    t->dropped_pages += rs.dropped_pages;
    t->dropped_files += rs.dropped_files;
    /* Scheduled files that came clean are done; replaced or written meanwhile ones were left
     * alone (a file being written stays dirty): said on their own line. */
    t->still_dirty = rep->dirty_files - rep->scheduled + rs.gave_up + rs.failed + rs.pending;
    t->changed = rs.replaced;
    return rc;
}

static void evict_json(const struct vmsnap_pcache_report *rep, const struct evict_totals *t)
{
    const struct {
        const char *key;
        uint64_t v;
    } kv[] = {
        {"dropped_pages", t->dropped_pages},
        {"dropped_bytes", t->dropped_pages * (uint64_t)sysconf(_SC_PAGESIZE)},
        {"dropped_files", t->dropped_files},
        {"removed_files", rep->removed_files},
        {"removed_bytes", rep->removed_bytes},
        {"removed_pages", rep->removed_pages},
        {"dirty_files", t->still_dirty},
        {"changed_files", t->changed},
        {"writeback_started_files", rep->kicked},
        {"busy_files", rep->busy_files},
        {"readonly_files", rep->readonly_files},
        {"unknown_files", rep->unknown_files},
        {"skipped_mounts", rep->skipped_mounts},
    };
    for (size_t i = 0; i < sizeof(kv) / sizeof(kv[0]); i++)
        json_object_object_add(cli_out(), kv[i].key, json_object_new_int64((int64_t)kv[i].v));
}

static void evict_report(const struct vmsnap_pcache_report *rep, const struct evict_totals *t)
{
    long ps = sysconf(_SC_PAGESIZE);
    char b1[32], b2[32];
    printf("dropped: %llu pages (%s) from %llu files\n", (unsigned long long)t->dropped_pages,
           cli_bytes(b1, sizeof(b1), t->dropped_pages * (uint64_t)ps),
           (unsigned long long)t->dropped_files);
    printf("removed: %llu files (%s, %llu pages cached)\n", (unsigned long long)rep->removed_files,
           cli_bytes(b2, sizeof(b2), rep->removed_bytes), (unsigned long long)rep->removed_pages);
    printf("still dirty: %llu files\n", (unsigned long long)t->still_dirty);
    if (t->changed)
        printf("written, replaced or removed during the wait (left alone): %llu files\n",
               (unsigned long long)t->changed);
    if (rep->kicked)
        printf("writeback started: %llu files\n", (unsigned long long)rep->kicked);
    if (rep->busy_files)
        printf("not removed (in use elsewhere): %llu files\n", (unsigned long long)rep->busy_files);
    if (rep->readonly_files)
        printf("not removed (not writable): %llu files\n", (unsigned long long)rep->readonly_files);
    if (rep->unknown_files)
        printf("skipped (cachestat unavailable): %llu files\n",
               (unsigned long long)rep->unknown_files);
    if (rep->skipped_mounts)
        printf("skipped (other mounts): %llu directories\n",
               (unsigned long long)rep->skipped_mounts);
}

static int cache_evict(int argc, char **argv)
{
    struct evict_args a = {0};
    int rc = EXIT_OK;
    int first = evict_getopt(argc, argv, &a, &rc);
    struct vmsnap_pcache_retrier *retrier = NULL;
    struct vmsnap_err err = {0};
    if (first >= 0 && a.wait > 0 && cli_socket) {
        rc = cli_usage("cache", "--wait: not through the daemon (--socket): the retrier is the "
                                "node's");
        first = -1;
    }
    if (first >= 0 && a.wait > 0) {
        if (wait_retrier(a.wait, &retrier, &err) < 0) {
            rc = cli_fail("cache", &err);
            first = -1;
        }
        a.opts.retrier = retrier;
    }
    if (first < 0) {
        free(a.preserve);
        return rc;
    }
    struct vmsnap_pcache_report rep = {0};
    for (int i = first; i < argc; i++) {
        vmsnap_err_clear(&err);
        if ((cli_socket ? cli_client_pcache_evict : vmsnap_pcache_evict)(argv[i], &a.opts, &rep,
                                                                         &err) < 0)
            rc = cli_fail("cache", &err);
    }
    struct evict_totals t = {rep.dropped_pages, rep.dropped_files, rep.dirty_files, 0};
    int wrc = retrier ? evict_wait(retrier, a.wait, &rep, &t) : EXIT_OK;
    if (wrc != EXIT_OK)
        rc = wrc;
    free(a.preserve);
    if (cli_json)
        evict_json(&rep, &t);
    else if (!cli_quiet)
        evict_report(&rep, &t);
    return rc;
}

/* The options of cache objects and cache trim. */
struct objcache_args {
    struct vmsnap_objcache_opts opts;
    bool json;
    bool has_max;
    uint64_t max_size; /* trim --max-size */
};

/* Parse them (--max-size only when `trim`). Returns 0, or -1 with *rc the exit code. */
static int objcache_getopt(int argc, char **argv, bool trim, struct objcache_args *a, int *rc)
{
    const char *usage = trim ? TRIM_USAGE : OBJECTS_USAGE;
    int c;
    optind = 1;
    while ((c = cli_getopt(argc, argv, cli_cache_objects_opts)) != -1) {
        switch (c) {
        case 'j':
            a->json = true;
            break;
        case 'd':
            a->opts.dir = optarg;
            break;
        case 's':
            if (cli_parse_size(optarg, &a->opts.max_bytes) < 0 || a->opts.max_bytes == 0) {
                *rc = cli_usage("cache", "--cache-size '%s': expected a size above 0 (8G, 512M)",
                                optarg);
                return -1;
            }
            break;
        case 'm':
            if (!trim || cli_parse_size(optarg, &a->max_size) < 0) {
                *rc = trim ? cli_usage("cache", "--max-size '%s': expected a size (0, 512M, 4G)",
                                       optarg)
                           : cli_usage("cache", "usage: %s", usage);
                return -1;
            }
            a->has_max = true;
            break;
        case 'h':
            *rc = cli_sub_help("cache", &cli_cache_subs[trim ? 3 : 2]);
            return -1;
        default:
            *rc = cli_usage("cache", "usage: %s", usage);
            return -1;
        }
    }
    if (optind < argc) {
        *rc = cli_usage("cache", "unexpected argument '%s' (usage: %s)", argv[optind], usage);
        return -1;
    }
    return 0;
}

/* The object cache's calls: the library's on the handle opened here, or the daemon's (--socket:
 * the node's cache, no handle). */
static const struct objcache_calls {
    int (*stat)(struct vmsnap_objcache *c, uint64_t *entries, uint64_t *bytes, uint64_t *cap,
                struct vmsnap_err *err);
    const char *(*dir)(const struct vmsnap_objcache *c);
    int (*list)(struct vmsnap_objcache *c,
                int (*fn)(void *arg, const struct vmsnap_objcache_entry *e), void *arg,
                struct vmsnap_err *err);
    int (*trim)(struct vmsnap_objcache *c, uint64_t max_bytes, uint64_t *evicted, uint64_t *freed,
                struct vmsnap_err *err);
} oc_direct = {vmsnap_objcache_stat, vmsnap_objcache_dir, vmsnap_objcache_list,
               vmsnap_objcache_trim},
  oc_client = {cli_client_objcache_stat, cli_client_objcache_dir, cli_client_objcache_list,
               cli_client_objcache_trim},
  *oc = &oc_direct;

/* "2025-06-01T12:34:56Z" */
static const char *utc_text(char *b, size_t n, int64_t t)
{
    struct tm tm;
    time_t tt = (time_t)t;
    if (!gmtime_r(&tt, &tm) || !strftime(b, n, "%Y-%m-%dT%H:%M:%SZ", &tm))
        snprintf(b, n, "?");
    return b;
}

struct objects_out {
    bool json, first;
    uint64_t entries, bytes;
};

/* One entry, streamed (the listing is never held whole). */
static int objects_cb(void *arg, const struct vmsnap_objcache_entry *e)
{
    struct objects_out *o = arg;
    char t[32];
    utc_text(t, sizeof(t), e->last_used);
    o->entries++;
    o->bytes += e->size;
    if (o->json) {
        json_object *j = json_object_new_object();
        json_object_object_add(j, "key", json_object_new_string(e->key));
        json_object_object_add(j, "bytes", json_object_new_int64((int64_t)e->size));
        json_object_object_add(j, "last_used", json_object_new_int64(e->last_used));
        json_object_object_add(j, "last_used_utc", json_object_new_string(t));
        printf("%s\n    ", o->first ? "" : ",");
        cli_json_write(stdout, j);
        json_object_put(j);
        o->first = false;
    } else {
        char size[32];
        printf("%12s  %-20s  %s\n", cli_bytes(size, sizeof(size), e->size), t, e->key);
    }
    return 0;
}

static int cache_objects(struct vmsnap_objcache *c, bool json)
{
    struct vmsnap_err err = {0};
    struct objects_out o = {json, true, 0, 0};
    uint64_t cap = 0;
    if (oc->stat(c, NULL, NULL, &cap, &err) < 0)
        return cli_fail("cache", &err);
    if (json) { /* what is known before the listing, then the entries as they come */
        cli_out_stream_begin();
        json_object *d = json_object_new_string(oc->dir(c));
        printf(",\"path\":");
        cli_json_write(stdout, d);
        json_object_put(d);
        printf(",\"cap_bytes\":%llu,\n  \"entries\":[", (unsigned long long)cap);
    } else
        printf("%12s  %-20s  %s\n", "SIZE", "LAST USED (UTC)", "KEY");
    int rc = oc->list(c, objects_cb, &o, &err);
    if (json) {
        json_object *t = json_object_new_object();
        json_object_object_add(t, "entries", json_object_new_int64((int64_t)o.entries));
        json_object_object_add(t, "bytes", json_object_new_int64((int64_t)o.bytes));
        printf("\n  ],\n  \"total\":");
        cli_json_write(stdout, t);
        json_object_put(t); /* cli_finish closes the object */
    } else {
        char b[32], cp[32];
        static char d[CLI_PRINTABLE_MAX];
        printf("total: %llu entries, %s of %s (%.1f%%) in %s\n", (unsigned long long)o.entries,
               cli_bytes(b, sizeof(b), o.bytes), cli_bytes(cp, sizeof(cp), cap), pct(o.bytes, cap),
               cli_printable(d, sizeof(d), oc->dir(c)));
    }
    return rc < 0 ? cli_fail("cache", &err) : EXIT_OK;
}

static int cache_trim(struct vmsnap_objcache *c, const struct objcache_args *a)
{
    struct vmsnap_err err = {0};
    uint64_t cap = 0, evicted = 0, freed = 0, entries = 0, bytes = 0;
    if (oc->stat(c, NULL, NULL, &cap, &err) < 0)
        return cli_fail("cache", &err);
    const uint64_t target = a->has_max ? a->max_size : cap;
    if (oc->trim(c, target, &evicted, &freed, &err) < 0 ||
        oc->stat(c, &entries, &bytes, NULL, &err) < 0)
        return cli_fail("cache", &err);
    if (a->json) {
        json_object *j = cli_out();
        json_object_object_add(j, "path", json_object_new_string(oc->dir(c)));
        json_object_object_add(j, "max_bytes", json_object_new_int64((int64_t)target));
        json_object_object_add(j, "evicted", json_object_new_int64((int64_t)evicted));
        json_object_object_add(j, "freed_bytes", json_object_new_int64((int64_t)freed));
        json_object_object_add(j, "entries", json_object_new_int64((int64_t)entries));
        json_object_object_add(j, "bytes", json_object_new_int64((int64_t)bytes));
        json_object_object_add(j, "cap_bytes", json_object_new_int64((int64_t)cap));
    } else if (!cli_quiet) {
        char f[32], b[32], t[32];
        printf("evicted: %llu entries (%s)\nleft: %llu entries, %s (at most %s)\n",
               (unsigned long long)evicted, cli_bytes(f, sizeof(f), freed),
               (unsigned long long)entries, cli_bytes(b, sizeof(b), bytes),
               cli_bytes(t, sizeof(t), target));
    }
    return EXIT_OK;
}

/* cache objects | cache trim: open the cache as the options say, then the verb. */
static int cache_objcache(int argc, char **argv, bool trim)
{
    struct objcache_args a = {0};
    int rc = EXIT_OK;
    if (objcache_getopt(argc, argv, trim, &a, &rc) < 0)
        return rc;
    struct vmsnap_objcache *c = NULL;
    struct vmsnap_err err = {0};
    if (cli_socket && (a.opts.dir || a.opts.max_bytes))
        return cli_usage("cache",
                         "%s: not through the daemon (--socket): the node's cache is its "
                         "configuration's",
                         a.opts.dir ? "--cache-dir" : "--cache-size");
    if (cli_socket)
        oc = &oc_client;
    else if (vmsnap_objcache_open(&a.opts, &c, &err) < 0)
        return cli_fail("cache", &err);
    rc = trim ? cache_trim(c, &a) : cache_objects(c, a.json);
    vmsnap_objcache_close(c);
    return rc;
}

int cmd_cache(int argc, char **argv)
{
    if (argc < 2)
        return cli_usage("cache", "expected 'stat', 'evict', 'objects' or 'trim'");
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        printf("usage: vmsnap cache stat|evict|objects|trim ... ('vmsnap cache stat --help', "
               "'vmsnap help cache')\n");
        return EXIT_OK;
    }
    if (strcmp(argv[1], "stat") == 0)
        return cache_stat(argc - 1, argv + 1);
    if (strcmp(argv[1], "evict") == 0)
        return cache_evict(argc - 1, argv + 1);
    if (strcmp(argv[1], "objects") == 0)
        return cache_objcache(argc - 1, argv + 1, false);
    if (strcmp(argv[1], "trim") == 0)
        return cache_objcache(argc - 1, argv + 1, true);
    return cli_unknown_sub("cache", argv[1], cli_cache_subs);
}
