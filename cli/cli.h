/* SPDX-License-Identifier: Apache-2.0 */
/* The CLI's verb table and shared helpers. Each verb lives in cli/cmd_<verb>.c. */
#ifndef VMSNAP_CLI_H
#define VMSNAP_CLI_H

#include "vmsnap/common.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

/* Exit codes: the contract for scripts (docs/cli.md; keep them stable). 3..7 are the classes
 * cli_exit_code() derives from the library's errno; 128 + the signal when interrupted. */
#define EXIT_OK 0
#define EXIT_FAIL 1          /* other failure */
#define EXIT_USAGE 2         /* bad command line */
#define EXIT_NOT_FOUND 3     /* no such set, object, file or VM */
#define EXIT_ACCESS 4        /* access denied, bad or missing credentials */
#define EXIT_UNREACHABLE 5   /* store unreachable or retryable: trying again later may work */
#define EXIT_CORRUPT 6       /* corrupt or untrusted input */
#define EXIT_LOCAL_IO 7      /* local I/O: disk full, EIO, read-only file system, quota */
#define EXIT_INTERRUPTED 130 /* 128 + SIGINT; 143 for SIGTERM, 129 for SIGHUP */

/* The exit code of a failure with errno `err` (positive or negative): one of the above, the
 * interrupted one also when the run was cancelled (vmsnap_cancel) whatever the errno. */
int cli_exit_code(int err);
/* The class of an exit code: "not_found", "access_denied", "unreachable", "corrupt",
 * "local_io", "interrupted", "usage" or "other". */
const char *cli_class_name(int exit_code);

struct cli_verb {
    const char *name;
    int (*run)(int argc, char **argv); /* argv[0] is the verb */
    const char *synopsis;              /* one line: "pack [-j N] ... SRC DST" */
    const char *help;                  /* paragraph for `vmsnap help VERB` */
};

/* Global flags: -q, -v (-vv) anywhere on the command line; --json (main looks for it in the
 * verb's arguments before any runs, so that a usage error is JSON too). */
extern bool cli_quiet;
extern int cli_verbose;
extern bool cli_json;
/* The verb being run ("push", "disk"; "" before it is known): what cli_getopt's messages name
 * and cli_usage's "see 'vmsnap help VERB'" points to. */
extern const char *cli_verb;

/* --json: the run prints exactly one JSON object on stdout, at its end (cli_finish): {"schema":1,
 * what the verb added to cli_out(), the subjects} or, on failure, {"schema":1, ...,
 * "error":{"code", "class", "message", "errno", the subjects}}. */
struct json_object;
struct json_object *cli_out(void);
/* A subject of the run (key "url", "path", "source_path", "name"): in its output and in its
 * error object. `value` must outlive the run (an argv string). At most 4. */
void cli_subject(const char *key, const char *value);
/* A verb that streams its JSON (cache stat: memory bounded on any tree) prints "{"schema":1"
 * through here, then its members each as ',"key":value'; cli_finish closes the object. */
void cli_out_stream_begin(void);
/* main, after the verb: prints the JSON object (when --json) and returns the exit code. */
int cli_finish(int rc);
/* A number of seconds as JSON with 3 decimals, exactly (what every timing key holds). */
struct json_object *cli_json_seconds(double s);

/* getopt_long (optind set to 1 before the first call) that takes -q and -v itself
 * (cli_common_flag): the next other option, or -1. An unknown option or a missing argument is
 * reported here (with a did-you-mean for a long option) as a usage error; the verb's own
 * cli_usage() that follows ('?') then prints nothing more. */
struct option;
int cli_getopt(int argc, char **argv, const char *shortopts, const struct option *lopts);
/* CPU seconds (user and system) this process used so far. */
double cli_cpu_seconds(void);
/* Parse "64M", "4G", "4096", "1.5G" (powers of 1024). Returns 0 or -EINVAL. */
int cli_parse_size(const char *s, uint64_t *out);
/* Parse a non-negative integer within [lo, hi]. */
int cli_parse_uint(const char *s, unsigned long lo, unsigned long hi, unsigned long *out);
/* `s` with control bytes, C1 controls and bytes that are not well-formed UTF-8 as \xHH, cut to
 * fit `cap` (at least 6); returns `out`. How the text output shows every name from a store, a
 * manifest, an image or the file system (anyone who can write there could otherwise forge lines
 * of the output or send terminal escapes). */
const char *cli_printable(char *out, size_t cap, const char *s);
/* Room for a name of up to 4,400 bytes (a URL of a 4 KiB path) with every byte escaped. */
#define CLI_PRINTABLE_MAX (4 * 4400 + 8)
/* "PREFIX" then `msg` as cli_printable shows it (whole), then a newline, on stderr: every message
 * of the library (which may hold such names) reaches the terminal through here. */
void cli_eputs(const char *prefix, const char *msg);
/* `o` serialised (json-c's plain form) on `f`, made valid UTF-8 without raw control bytes: a
 * control in a string as \u00XX, a byte that is not UTF-8 as the visible \xHH (the JSON "\\xHH",
 * as the text output shows it). Every JSON output goes through here. */
struct json_object;
void cli_json_write(FILE *f, struct json_object *o);
/* The same on stdout, then a newline. */
void cli_json_line(struct json_object *o);
/* "90", "90s", "30m", "2h", "7d" -> seconds. */
int cli_parse_duration(const char *s, int64_t *out);

/* Print "vmsnap VERB: message" to stderr, the message as cli_eputs shows it. */
void cli_error(const char *verb, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Print the library's error `err` as cli_error does and record it for --json; returns its exit
 * code (cli_exit_code of err->code). */
int cli_fail(const char *verb, const struct vmsnap_err *err);
/* The same for a message made here, with the errno `code` it stands for (0: other). */
int cli_fail_code(const char *verb, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The one of `cands` (NULL-terminated) closest to the mistyped `word` when it is within a small
 * edit distance (insertions, deletions, substitutions, swaps of neighbours), else NULL. */
const char *cli_did_you_mean(const char *word, const char *const *cands);
/* The usage error for the unknown sub-verb `sub` of `verb` (its sub-verbs `subs`, NULL-ended),
 * with a did-you-mean. Returns EXIT_USAGE. */
int cli_unknown_sub(const char *verb, const char *sub, const char *const *subs);
/* Print a usage error (with the verb's synopsis) and return EXIT_USAGE. */
int cli_usage(const char *verb, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Progress line on stderr when it is a TTY and not quiet: "verb: done / total (pct%, rate,
 * ETA)", cleared before any message (cli_eputs). `total` that grew since the first report (or
 * `estimate`) is an estimate, shown as "~total". `map` (optional) turns the library's `done` into
 * the bytes the line counts (pack: the populated bytes below a logical offset), `map_total` then
 * the total. */
struct cli_progress {
    const char *label;
    double t0;
    double last;
    bool active;
    uint64_t first_total;
    bool estimate; /* the total is not known yet: "~total" (set by a push, which learns it as it
                      encodes) */
    uint64_t (*map)(void *arg, uint64_t done);
    void *map_arg;
    uint64_t map_total;
};
void cli_progress_init(struct cli_progress *p, const char *label);
void cli_progress_cb(void *arg, uint64_t done, uint64_t total);
void cli_progress_end(struct cli_progress *p);

/* --drop-cache: after `path` (a file, or a directory of files) is complete and in place, drop
 * its clean page cache, start writeback of the dirty pages and retry for up to a few seconds
 * (measured: a fresh 512 MiB file is clean and dropped within about 1 s). Prints what it did
 * unless quiet. Returns EXIT_OK or EXIT_FAIL. */
int cli_drop_cache(const char *verb, const char *path);

/* An existing regular file `dst` is refused unless `force` (as zstd does): EXIT_OK, or the exit
 * code of the refusal printed ("DST exists: not replaced (-f/--force replaces it)"). Anything
 * else there (a link, a directory, a device) the library refuses whatever the flag. */
int cli_refuse_existing(const char *verb, const char *dst, bool force);

double cli_now(void);
const char *cli_bytes(char *buf, size_t len, uint64_t bytes);

/* Verb implementations. */
int cmd_pack(int argc, char **argv);
int cmd_unpack(int argc, char **argv);
int cmd_inspect(int argc, char **argv);
int cmd_cache(int argc, char **argv);
int cmd_disk(int argc, char **argv);

/* Transfer verbs (cli/xfer_opts.c holds their shared option parser and summary line). */
struct vmsnap_xfer_opts;
struct vmsnap_xfer_stats;
int cmd_push(int argc, char **argv);
int cmd_pull(int argc, char **argv);
int cmd_export(int argc, char **argv);
int cmd_ls(int argc, char **argv);
int cmd_rm(int argc, char **argv);
int cmd_gc(int argc, char **argv);
int cmd_vm(int argc, char **argv);
/* The options of one transfer verb only; a NULL member (or `f` NULL) is an option the verb
 * refuses. */
struct xfer_flags {
    bool *force;         /* rm, pull -f/--force */
    bool *drop_cache;    /* pull --drop-cache */
    bool *dry_run;       /* gc --dry-run */
    int64_t *older_than; /* gc --older-than DURATION, in seconds */
};
/* -q / -v given after the verb (each verb's getopt passes them here); the long forms go in
 * each verb's option table. */
void cli_common_flag(int c);
#define CLI_COMMON_LONGOPTS                                                                        \
    {"quiet", no_argument, NULL, 'q'},                                                             \
    {                                                                                              \
        "verbose", no_argument, NULL, 'v'                                                          \
    }
/* After a verb's own --help usage line: what `vmsnap help VERB` says of it. */
void cli_verb_description(const char *name);

/* The command line of a transfer verb. */
struct xfer_verb {
    const char *name;  /* "push" */
    const char *usage; /* what --help prints before the verb's description */
    int operands;      /* how many it takes */
    const char *want;  /* the usage error when they are not that many: "expected PATH and URL" */
    int url;           /* which of them is the URL ("-" is refused) */
};
/* Parse a transfer verb's options (into o and the verb's own flags f), --help, its operands.
 * Returns the index of the first operand, or -1 with *rc the exit code (EXIT_OK after --help,
 * EXIT_USAGE after a usage error it printed). */
int cmd_xfer_args(const struct xfer_verb *v, int argc, char **argv, struct vmsnap_xfer_opts *o,
                  const struct xfer_flags *f, int *rc);
/* After the library call `rc`: the store's global state released, a failure printed (its exit
 * code), else EXIT_OK. */
int cmd_xfer_end(const char *verb, int rc, const struct vmsnap_err *err);
/* push and pull: `fn` from `from` to `to` with the progress line, then the summary line on
 * stderr, or with --json the same in the run's JSON object. Returns the exit code. */
typedef int (*cmd_xfer_copy_fn)(const char *from, const char *to,
                                const struct vmsnap_xfer_opts *opts,
                                struct vmsnap_xfer_stats *stats, struct vmsnap_err *err);
int cmd_xfer_copy(const char *verb, cmd_xfer_copy_fn fn, const char *from, const char *to,
                  struct vmsnap_xfer_opts *o);
#endif
