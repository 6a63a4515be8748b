/* SPDX-License-Identifier: Apache-2.0 */
/* The transfer verbs' shared parts (push, pull, ls, rm, gc): the option parser, the URL operand
 * check, the summary line and its JSON form. */
#include "cli.h"
#include "vmsnap/xfer.h"

#include <getopt.h> /* optarg, optind */
#include <json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* `only` lists the verbs that use an option; the others refuse it (for_this_verb) rather than
 * ignore it silently (pull --level 9 would look as if it did something). */
const struct cli_opt cli_xfer_opts[] = {
    {"json", 0, 'J', NULL, CLI_K_NONE, NULL, NULL, "the result as one JSON object on stdout"},
    {"force", 'f', 'F', NULL, CLI_K_NONE, NULL, "rm pull",
     "replace the set's files (or PATH) where they exist (pull); delete an incomplete set too "
     "(rm)"},
    {"connections", 'j', 'j', "N", CLI_K_NONE, NULL, "push pull export",
     "parallel connections, 1 to 256 (default 8)"},
    {"threads", 'T', 't', "N", CLI_K_NONE, NULL, "push pull export",
     "codec threads (0, the default: all CPUs)"},
    {"part-size", 0, 'p', "SIZE", CLI_K_NONE, NULL, "push export",
     "the size of an upload part (default 16M)"},
    {"max-memory", 0, 'm', "SIZE", CLI_K_NONE, NULL, "push pull export",
     "at most SIZE of parts and codec buffers in memory (default 256M)"},
    {"frame-size", 0, 'z', "SIZE", CLI_K_NONE, NULL, "push export",
     "the source range of one frame (default 64M)"},
    {"level", 0, 'l', "L", CLI_K_NONE, NULL, "push export", "the zstd level, 1 to 22 (default 1)"},
    {"layout", 0, 'L', "LAYOUT", CLI_K_CHOICE, "layered reference", "push",
     "a set's layout: layered (the default) or reference (URL/<name>.zstd)"},
    {"parent", 0, 'K', "URL", CLI_K_URL, NULL, "push",
     "store each file as a delta over this set's (the pages that differ)"},
    {"max-depth", 0, 'H', "N", CLI_K_NONE, NULL, "push",
     "at most N layers in a file's chain, 1 to 64 (default 8)"},
    {"base", 0, 'B', "URL", CLI_K_URL, NULL, "push",
     "an earlier set or object in the same store whose unchanged frames the store copies"},
    {"max-size", 0, 's', "SIZE", CLI_K_NONE, NULL, NULL,
     "refuse a file of a larger logical size (default 64T)"},
    {"no-fsync", 0, 'n', NULL, CLI_K_NONE, NULL, "pull",
     "do not fsync the files before they are renamed into place"},
    {"drop-cache", 0, 'D', NULL, CLI_K_NONE, NULL, "pull",
     "then drop the files' page cache (writeback started, retried for a few seconds)"},
    {"no-cache", 0, 'X', NULL, CLI_K_NONE, NULL, "pull export",
     "fetch every layer from the store, not through the node's object cache"},
    {"cache-dir", 0, 'Y', "DIR", CLI_K_DIR, NULL, "push pull export",
     "the object cache's directory (default: VMSNAP_CACHE_DIR, else as cache objects says)"},
    {"write-cache", 0, 'W', NULL, CLI_K_NONE, NULL, "push",
     "also keep a layered set's objects in the node's object cache as they are uploaded"},
    {"dry-run", 0, 'N', NULL, CLI_K_NONE, NULL, "gc", "list what gc would remove, remove nothing"},
    {"older-than", 0, 'O', "DURATION", CLI_K_NONE, NULL, "gc",
     "only what is older (90s, 30m, 2h, 7d; default 1h; 0: everything)"},
    CLI_STORE_OPTS(NULL),
    CLI_OPT_END,
};

/* -j, --threads, --level, --retries: a count in a range. */
static int count_opt(const char *verb, int c, struct vmsnap_xfer_opts *o)
{
    static const struct {
        int c;
        unsigned long lo, hi;
        const char *want;
    } counts[] = {
        {'j', 1, 256, "-j wants a connection count from 1 to 256"},
        {'t', 0, 256, "-T/--threads wants 0 (all CPUs) to 256"},
        {'l', 1, 22, "--level wants a zstd level from 1 to 22"},
        {'R', 0, 100, "--retries wants 0 to 100"},
    };
    size_t k = 0;
    while (counts[k].c != c)
        k++;
    unsigned long v;
    if (cli_parse_uint(optarg, counts[k].lo, counts[k].hi, &v) < 0)
        return cli_usage(verb, "%s, not '%s'", counts[k].want, optarg), -1;
    if (c == 'j')
        o->connections = (unsigned)v;
    else if (c == 't')
        o->threads = (unsigned)v;
    else if (c == 'l')
        o->level = (int)v;
    else
        o->store.max_attempts = (unsigned)v + 1;
    return 0;
}

int cli_store_opt(const char *verb, int c, struct vmsnap_xfer_opts *o)
{
    switch (c) {
    case 'e':
        o->store.endpoint = optarg;
        return 0;
    case 'r':
        o->store.region = optarg;
        return 0;
    case 'P':
        o->store.path_style = true;
        return 0;
    case 'A':
        o->store.profile = optarg;
        return 0;
    case 'C':
        o->store.ca_bundle = optarg;
        return 0;
    case 'R':
        return count_opt(verb, c, o);
    default:
        return 1;
    }
}

/* --part-size, --max-memory, --frame-size, --max-size: a size above 0. */
static int size_opt(const char *verb, int c, struct vmsnap_xfer_opts *o)
{
    uint64_t sz;
    if (cli_parse_size(optarg, &sz) < 0 || sz == 0)
        return cli_usage(verb, "%s wants a size like 16M, not '%s'",
                         c == 'p'   ? "--part-size"
                         : c == 'm' ? "--max-memory"
                         : c == 'z' ? "--frame-size"
                                    : "--max-size",
                         optarg),
               -1;
    if (c == 'p')
        o->part_size = sz;
    else if (c == 'm')
        o->max_memory = sz;
    else if (c == 'z')
        o->frame_size = sz;
    else
        o->max_size = sz;
    return 0;
}

/* The options of one verb only, kept in `f` (or o->base); -1 after the usage error. */
static int verb_flag(const char *verb, int c, struct vmsnap_xfer_opts *o,
                     const struct xfer_flags *f)
{
    switch (c) {
    case 'F':
        if (!f->force)
            return cli_usage(verb, "-f/--force is an option of rm and pull only"), -1;
        *f->force = true;
        return 0;
    case 'N':
        if (!f->dry_run)
            return cli_usage(verb, "--dry-run is an option of gc only"), -1;
        *f->dry_run = true;
        return 0;
    case 'O':
        if (!f->older_than)
            return cli_usage(verb, "--older-than is an option of gc only"), -1;
        if (cli_parse_duration(optarg, f->older_than) < 0)
            return cli_usage(verb,
                             "--older-than wants a duration like 90s, 30m, 2h or 7d (0: "
                             "every upload), not '%s'",
                             optarg),
                   -1;
        return 0;
    case 'B':
        if (strcmp(verb, "push"))
            return cli_usage(verb, "--base is an option of push only"), -1;
        o->base = optarg;
        return 0;
    case 'L':
        if (!strcmp(optarg, "layered"))
            o->layout = VMSNAP_LAYOUT_LAYERED;
        else if (!strcmp(optarg, "reference"))
            o->layout = VMSNAP_LAYOUT_REFERENCE;
        else
            return cli_usage(verb, "--layout is 'layered' or 'reference', not '%s'", optarg), -1;
        return 0;
    case 'K':
        o->parent = optarg;
        return 0;
    case 'H': {
        char *end;
        unsigned long d = strtoul(optarg, &end, 10);
        if (!*optarg || *end || d < 1 || d > 64)
            return cli_usage(verb, "--max-depth wants 1 to 64 layers, not '%s'", optarg), -1;
        o->max_depth = (unsigned)d;
        return 0;
    }
    case 'X':
        o->no_cache = true;
        return 0;
    case 'Y':
        o->cache_dir = optarg;
        return 0;
    case 'W':
        o->write_cache = true;
        return 0;
    case 'J': /* every transfer verb reports (main saw it first: cli_json) */
        cli_json = true;
        return 0;
    case 'D':
        if (!f->drop_cache)
            return cli_usage(verb, "--drop-cache is an option of pull only"), -1;
        *f->drop_cache = true;
        return 0;
    default:
        return cli_usage(verb, "bad option"), -1;
    }
}

/* One option: 0, -1 after a usage error, -2 for --help. */
static int one_opt(const char *verb, int c, struct vmsnap_xfer_opts *o, const struct xfer_flags *f)
{
    switch (c) {
    case 'j':
    case 't':
    case 'l':
    case 'R':
        return count_opt(verb, c, o);
    case 'p':
    case 'm':
    case 'z':
    case 's':
        return size_opt(verb, c, o);
    case 'n':
        o->no_fsync = true;
        return 0;
    case 'e':
    case 'r':
    case 'P':
    case 'A':
    case 'C':
        return cli_store_opt(verb, c, o);
    case 'h':
        return -2;
    default:
        return verb_flag(verb, c, o, f);
    }
}

/* What the options say together; -1 after a usage error. */
static int check_opts(const char *verb, const struct vmsnap_xfer_opts *o)
{
    /* a budget under one part cannot hold the part being filled: it was accepted and not kept
     * (--max-memory 1M peaked at 120 MB) */
    if (!strcmp(verb, "push") && o->max_memory &&
        o->max_memory < (o->part_size ? o->part_size : VMSNAP_XFER_DEFAULT_PART_SIZE))
        return cli_usage(verb, "--max-memory must be at least the part size (--part-size, %s)",
                         o->part_size ? "as given" : "16M by default"),
               -1;
    struct vmsnap_pack_opts po = {.frame_size = o->frame_size, .level = o->level};
    struct vmsnap_err perr = {0};
    if (vmsnap_image_check_pack_opts(&po, &perr) < 0) /* a usage error, as pack says it */
        return cli_usage(verb, "%s", perr.msg), -1;
    return 0;
}

/* Parse the transfer options; returns the index of the first operand, -1 after a usage error
 * was printed, -2 for --help. */
static int xfer_getopt(const char *verb, int argc, char **argv, struct vmsnap_xfer_opts *o,
                       const struct xfer_flags *f)
{
    static const struct xfer_flags none;
    if (!f)
        f = &none;
    int c;
    optind = 1;
    while ((c = cli_getopt(argc, argv, cli_xfer_opts)) != -1) {
        int rc = cli_opt_for(verb, verb, cli_xfer_opts, c);
        if (rc == 0)
            rc = one_opt(verb, c, o, f);
        if (rc < 0)
            return rc;
    }
    return check_opts(verb, o) < 0 ? -1 : optind;
}

/* A URL operand: "-" is a usage error (printed), -1. */
static int url_operand(const char *verb, const char *url)
{
    if (strcmp(url, "-"))
        return 0;
    cli_usage(verb, "URL '-': name a store URL or a local path (stdin and stdout are not stores; "
                    "./- names a path called -)");
    return -1;
}

static void summary(const char *verb, const struct vmsnap_xfer_stats *st, double wall)
{
    if (cli_quiet)
        return;
    char a[32], b[32], c[32], r[32];
    fprintf(stderr,
            "%s: %llu file%s, logical %s, populated %s, object bytes %s, %.3f s (%s/s of object "
            "bytes), %.2f CPU s\n",
            verb, (unsigned long long)st->files, st->files == 1 ? "" : "s",
            cli_bytes(a, sizeof(a), st->logical), cli_bytes(b, sizeof(b), st->populated),
            cli_bytes(c, sizeof(c), st->object_bytes), wall,
            cli_bytes(r, sizeof(r), wall > 0 ? (uint64_t)((double)st->object_bytes / wall) : 0),
            cli_cpu_seconds());
    if (st->copied_bytes)
        fprintf(stderr, "%s: %s of the object bytes copied by the store from the base\n", verb,
                cli_bytes(a, sizeof(a), st->copied_bytes));
    if (st->deltas)
        fprintf(stderr, "%s: %llu file%s stored as a delta over the parent's\n", verb,
                (unsigned long long)st->deltas, st->deltas == 1 ? "" : "s");
    if (st->cached_bytes)
        fprintf(stderr, "%s: %s of the object bytes read from the node's cache\n", verb,
                cli_bytes(a, sizeof(a), st->cached_bytes));
}

/* The summary in the run's JSON object (push/pull --json). */
static void summary_json(const struct vmsnap_xfer_stats *st, double wall)
{
    json_object *o = cli_out();
    json_object_object_add(o, "files", json_object_new_int64((int64_t)st->files));
    json_object_object_add(o, "logical_bytes", json_object_new_int64((int64_t)st->logical));
    json_object_object_add(o, "populated_bytes", json_object_new_int64((int64_t)st->populated));
    json_object_object_add(o, "object_bytes", json_object_new_int64((int64_t)st->object_bytes));
    json_object_object_add(o, "copied_bytes", json_object_new_int64((int64_t)st->copied_bytes));
    json_object_object_add(o, "deltas", json_object_new_int64((int64_t)st->deltas));
    json_object_object_add(o, "cached_bytes", json_object_new_int64((int64_t)st->cached_bytes));
    json_object_object_add(o, "seconds", cli_json_seconds(wall));
    json_object_object_add(o, "cpu_seconds", cli_json_seconds(cli_cpu_seconds()));
}

int cmd_xfer_args(const struct xfer_verb *v, int argc, char **argv, struct vmsnap_xfer_opts *o,
                  const struct xfer_flags *f, int *rc)
{
    int i = xfer_getopt(v->name, argc, argv, o, f);
    *rc = EXIT_USAGE;
    if (i == -2) {
        *rc = cli_verb_help(v->name);
        return -1;
    }
    if (i < 0)
        return -1;
    if (argc - i != v->operands) {
        cli_usage(v->name, "%s", v->want);
        return -1;
    }
    if (url_operand(v->name, argv[i + v->url]) < 0)
        return -1;
    if (cli_socket) {
        /* the daemon's budgets and its node's store configuration decide these */
        const struct vmsnap_store_opts *s = &o->store;
        const char *what = o->connections    ? "-j/--connections"
                           : o->threads      ? "-T/--threads"
                           : o->part_size    ? "--part-size"
                           : o->max_memory   ? "--max-memory"
                           : o->frame_size   ? "--frame-size"
                           : o->max_size     ? "--max-size"
                           : o->no_fsync     ? "--no-fsync"
                           : o->max_depth    ? "--max-depth"
                           : o->cache_dir    ? "--cache-dir"
                           : o->write_cache  ? "--write-cache"
                           : s->endpoint     ? "--endpoint"
                           : s->region       ? "--region"
                           : s->path_style   ? "--path-style"
                           : s->ca_bundle    ? "--ca-bundle"
                           : s->max_attempts ? "--retries"
                                             : NULL;
        if (what) {
            cli_usage(v->name,
                      "%s: not through the daemon (--socket): the node's configuration and "
                      "budgets set it",
                      what);
            return -1;
        }
    }
    for (int k = 0; k < v->operands; k++) /* what the output and a failure name */
        cli_subject(k == v->url ? "url" : "path", argv[i + k]);
    return i;
}

int cmd_xfer_end(const char *verb, int rc, const struct vmsnap_err *err)
{
    vmsnap_store_global_cleanup();
    return rc < 0 ? cli_fail(verb, err) : EXIT_OK;
}

int cmd_xfer_copy(const char *verb, cmd_xfer_copy_fn fn, const char *from, const char *to,
                  struct vmsnap_xfer_opts *o)
{
    struct cli_progress p;
    cli_progress_init(&p, verb);
    p.estimate = !strcmp(verb, "push"); /* object bytes: known only once encoded */
    o->progress = cli_progress_cb;
    o->progress_arg = &p;
    struct vmsnap_xfer_stats st;
    struct vmsnap_err err = {0};
    double t0 = cli_now();
    int rc = fn(from, to, o, &st, &err);
    cli_progress_end(&p);
    if ((rc = cmd_xfer_end(verb, rc, &err)) != EXIT_OK)
        return rc;
    if (cli_json)
        summary_json(&st, cli_now() - t0);
    else
        summary(verb, &st, cli_now() - t0);
    return EXIT_OK;
}
