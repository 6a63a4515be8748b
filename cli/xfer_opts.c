/* SPDX-License-Identifier: Apache-2.0 */
/* The transfer verbs' shared parts (push, pull, ls, rm, gc): the option parser, the URL operand
 * check, the summary line and its JSON form. */
#include "cli.h"
#include "vmsnap/xfer.h"

#include <getopt.h>
#include <json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

int cmd_xfer_getopt(const char *verb, int argc, char **argv, struct vmsnap_xfer_opts *o,
                    const struct xfer_flags *f)
{
    static const struct xfer_flags none;
    if (!f)
        f = &none;
    static const struct option lopts[] = {
        {"connections", required_argument, NULL, 'j'},
        {"part-size", required_argument, NULL, 'p'},
        {"max-memory", required_argument, NULL, 'm'},
        {"threads", required_argument, NULL, 't'},
        {"frame-size", required_argument, NULL, 'f'},
        {"level", required_argument, NULL, 'l'},
        {"max-size", required_argument, NULL, 's'},
        {"no-fsync", no_argument, NULL, 'n'},
        {"endpoint", required_argument, NULL, 'e'},
        {"region", required_argument, NULL, 'r'},
        {"path-style", no_argument, NULL, 'P'},
        {"retries", required_argument, NULL, 'R'},
        {"force", no_argument, NULL, 'F'},
        {"drop-cache", no_argument, NULL, 'D'},
        {"json", no_argument, NULL, 'J'},
        {"base", required_argument, NULL, 'B'},
        {"dry-run", no_argument, NULL, 'N'},
        {"older-than", required_argument, NULL, 'O'},
        {"help", no_argument, NULL, 'h'},
        CLI_COMMON_LONGOPTS,
        {0, 0, 0, 0},
    };
    /* options that mean something to some of the verbs only: refused elsewhere rather than
     * silently ignored (pull --level 9 would look as if it did something) */
    static const struct {
        int c;
        const char *verbs, *name, *who;
    } only[] = {
        {'j', " push pull ", "-j/--connections", "push and pull"},
        {'p', " push ", "--part-size", "push"},
        {'m', " push pull ", "--max-memory", "push and pull"},
        {'t', " push pull ", "--threads", "push and pull"},
        {'f', " push ", "--frame-size", "push"},
        {'l', " push ", "--level", "push"},
        {'n', " pull ", "--no-fsync", "pull"},
    };
    unsigned long v;
    int c;
    optind = 1;
    char w[16]; /* " verb ", as only[].verbs lists them */
    snprintf(w, sizeof(w), " %s ", verb);
    while ((c = getopt_long(argc, argv, "j:hqv", lopts, NULL)) != -1) {
        for (size_t k = 0; k < sizeof(only) / sizeof(only[0]); k++) {
            if (only[k].c == c && !strstr(only[k].verbs, w))
                return cli_usage(verb, "%s is an option of %s only (%s does not use it)",
                                 only[k].name, only[k].who, verb),
                       -1;
        }
        switch (c) {
        case 'q':
        case 'v':
            cli_common_flag(c);
            break;
        case 'j':
            if (cli_parse_uint(optarg, 1, 256, &v) < 0)
                return cli_usage(verb, "-j wants a connection count from 1 to 256, not '%s'",
                                 optarg),
                       -1;
            o->connections = (unsigned)v;
            break;
        case 'p':
        case 'm':
        case 'f':
        case 's': {
            uint64_t sz;
            if (cli_parse_size(optarg, &sz) < 0 || sz == 0)
                return cli_usage(verb, "%s wants a size like 16M, not '%s'",
                                 c == 'p'   ? "--part-size"
                                 : c == 'm' ? "--max-memory"
                                 : c == 'f' ? "--frame-size"
                                            : "--max-size",
                                 optarg),
                       -1;
            if (c == 'p')
                o->part_size = sz;
            else if (c == 'm')
                o->max_memory = sz;
            else if (c == 'f')
                o->frame_size = sz;
            else
                o->max_size = sz;
            break;
        }
        case 't':
            if (cli_parse_uint(optarg, 1, 256, &v) < 0)
                return cli_usage(verb, "--threads wants 1 to 256, not '%s'", optarg), -1;
            o->threads = (unsigned)v;
            break;
        case 'l':
            if (cli_parse_uint(optarg, 1, 22, &v) < 0)
                return cli_usage(verb, "--level wants a zstd level from 1 to 22, not '%s'", optarg),
                       -1;
            o->level = (int)v;
            break;
        case 'R':
            if (cli_parse_uint(optarg, 0, 100, &v) < 0)
                return cli_usage(verb, "--retries wants 0 to 100, not '%s'", optarg), -1;
            o->store.max_attempts = (unsigned)v + 1;
            break;
        case 'n':
            o->no_fsync = true;
            break;
        case 'e':
            o->store.endpoint = optarg;
            break;
        case 'r':
            o->store.region = optarg;
            break;
        case 'P':
            o->store.path_style = true;
            break;
        case 'F':
            if (!f->force)
                return cli_usage(verb, "--force is an option of rm only"), -1;
            *f->force = true;
            break;
        case 'N':
            if (!f->dry_run)
                return cli_usage(verb, "--dry-run is an option of gc only"), -1;
            *f->dry_run = true;
            break;
        case 'O':
            if (!f->older_than)
                return cli_usage(verb, "--older-than is an option of gc only"), -1;
            if (cli_parse_duration(optarg, f->older_than) < 0)
                return cli_usage(verb,
                                 "--older-than wants a duration like 90s, 30m, 2h or 7d (0: "
                                 "every upload), not '%s'",
                                 optarg),
                       -1;
            break;
        case 'B':
            if (strcmp(verb, "push"))
                return cli_usage(verb, "--base is an option of push only"), -1;
            o->base = optarg;
            break;
        case 'J':
            if (!f->json)
                return cli_usage(verb, "--json is an option of push, pull and ls only"), -1;
            *f->json = true;
            break;
        case 'D':
            if (!f->drop_cache)
                return cli_usage(verb, "--drop-cache is an option of pull only"), -1;
            *f->drop_cache = true;
            break;
        case 'h':
            return -2;
        default:
            return cli_usage(verb, "bad option"), -1;
        }
    }
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
    return optind;
}

int cmd_xfer_url(const char *verb, const char *url)
{
    if (strcmp(url, "-"))
        return 0;
    cli_usage(verb, "URL '-': name a store URL or a local path (stdin and stdout are not stores; "
                    "./- names a path called -)");
    return -1;
}

double cmd_xfer_cpu(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
}

void cmd_xfer_summary(const char *verb, const struct vmsnap_xfer_stats *st, double wall)
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
            cmd_xfer_cpu());
    if (st->copied_bytes)
        fprintf(stderr, "%s: %s of the object bytes copied by the store from the base\n", verb,
                cli_bytes(a, sizeof(a), st->copied_bytes));
}

void cmd_xfer_json(const char *src, const char *dst, const struct vmsnap_xfer_stats *st,
                   double wall)
{
    json_object *o = json_object_new_object();
    json_object_object_add(o, "source", json_object_new_string(src));
    json_object_object_add(o, "destination", json_object_new_string(dst));
    json_object_object_add(o, "files", json_object_new_int64((int64_t)st->files));
    json_object_object_add(o, "logical_size", json_object_new_int64((int64_t)st->logical));
    json_object_object_add(o, "populated", json_object_new_int64((int64_t)st->populated));
    json_object_object_add(o, "object_size", json_object_new_int64((int64_t)st->object_bytes));
    json_object_object_add(o, "copied_bytes", json_object_new_int64((int64_t)st->copied_bytes));
    char ws[32], cs[32];
    snprintf(ws, sizeof(ws), "%.3f", wall);
    snprintf(cs, sizeof(cs), "%.3f", cmd_xfer_cpu());
    json_object_object_add(o, "seconds", json_object_new_double_s(wall, ws));
    json_object_object_add(o, "cpu_seconds", json_object_new_double_s(atof(cs), cs));
    printf("%s\n", json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN |
                                                         JSON_C_TO_STRING_NOSLASHESCAPE));
    json_object_put(o);
}
