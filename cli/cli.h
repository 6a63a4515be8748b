/* SPDX-License-Identifier: Apache-2.0 */
/* The CLI's verb table and shared helpers. Each verb lives in cli/cmd_<verb>.c. */
#ifndef VMSNAP_CLI_H
#define VMSNAP_CLI_H

#include "vmsnap/common.h"
#include "vmsnap/disk.h" /* enum vmsnap_disk_clone_how: the client's disk clone */

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

/* ---- the command line as data ----
 * One table per parser: cli_getopt() builds getopt_long's tables from it, `vmsnap help VERB`
 * prints its options list from it, and the man pages and the bash and zsh completions are
 * generated from the same tables (cli/doc_man.c, cli/doc_complete.c; `vmsnap help --man DIR`,
 * `--completion bash|zsh`, run by the build), so none of them can name an option the parser
 * does not take or miss one it takes (tests/integration/cli_docs.sh checks each against the
 * parser). */

/* What a completion offers for an option's argument or an operand. */
enum cli_kind {
    CLI_K_NONE,   /* nothing: a number, a size, a duration, free text */
    CLI_K_FILE,   /* a path */
    CLI_K_DIR,    /* a directory */
    CLI_K_URL,    /* a store URL or a local path: paths */
    CLI_K_CHOICE, /* one of the option's `choices` */
};

/* One option of a parser. A table ends with a row whose name and letter are both unset
 * (CLI_OPT_END); -h/--help, -q/--quiet and -v/--verbose are in every table without a row
 * (cli_getopt adds them; 'h' is returned for help). */
struct cli_opt {
    const char *name;    /* the long name without "--"; NULL: a short option only */
    char letter;         /* the short option; 0: none */
    int val;             /* what cli_getopt returns for it, whichever spelling was used */
    const char *arg;     /* its argument as the help names it ("SIZE"); NULL: it takes none */
    enum cli_kind kind;  /* the argument's, for the completions */
    const char *choices; /* CLI_K_CHOICE: the words, space-separated */
    const char *only;    /* a table shared by several verbs or sub-verbs: the ones it is for,
                          * space-separated ("push pull"); NULL: every one */
    const char *help;    /* one line: what it does, its default */
};
#define CLI_OPT_END                                                                                \
    {                                                                                              \
        NULL, 0, 0, NULL, CLI_K_NONE, NULL, NULL, NULL                                             \
    }
/* The store's options (endpoint, region, path style, retries, profile, CA bundle), rows of the
 * transfer verbs' table and of the VM verbs' (`only`: the verbs that take them, NULL: every one);
 * cli_store_opt parses them. */
#define CLI_STORE_OPTS(ONLY)                                                                       \
    {"endpoint",                                                                                   \
     0,                                                                                            \
     'e',                                                                                          \
     "URL",                                                                                        \
     CLI_K_NONE,                                                                                   \
     NULL,                                                                                         \
     ONLY,                                                                                         \
     "the S3 endpoint (default: AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, the profile, AWS's)"},      \
        {"region",                                                                                 \
         0,                                                                                        \
         'r',                                                                                      \
         "R",                                                                                      \
         CLI_K_NONE,                                                                               \
         NULL,                                                                                     \
         ONLY,                                                                                     \
         "the S3 region (default: AWS_REGION, AWS_DEFAULT_REGION, the profile, us-east-1)"},       \
        {"path-style", 0,                                                                          \
         'P',          NULL,                                                                       \
         CLI_K_NONE,   NULL,                                                                       \
         ONLY,         "path-style S3 URLs (endpoint/bucket/key) instead of virtual-hosted ones"}, \
        {"retries",  0,    'R',  "N",                                                              \
         CLI_K_NONE, NULL, ONLY, "retries per request, 0 to 100 (default 5)"},                     \
        {"profile",  0,                                                                            \
         'A',        "NAME",                                                                       \
         CLI_K_NONE, NULL,                                                                         \
         ONLY,       "the AWS profile of the shared files (default: AWS_PROFILE, else default)"},  \
    {                                                                                              \
        "ca-bundle", 0, 'C', "FILE", CLI_K_FILE, NULL, ONLY,                                       \
            "trust the CAs of this PEM file (default: AWS_CA_BUNDLE, the profile, the system's)"   \
    }

/* A sub-verb ("vm run", "disk create"). `operands` names each operand's kind for the
 * completions, in order, space-separated: "file", "dir", "url", "name" (nothing offered) or
 * "none"; a last word ending in "..." repeats ("file..."). */
struct cli_sub {
    const char *name;           /* "create" */
    const char *synopsis;       /* "disk create [--json] ... IMAGE" (after "vmsnap ") */
    const char *summary;        /* one line */
    const struct cli_opt *opts; /* the parser's table (shared with other sub-verbs or not) */
    const char *operands;
};

struct cli_verb {
    const char *name;
    int (*run)(int argc, char **argv); /* argv[0] is the verb */
    const char *synopsis;              /* one line: "pack [-j N] ... SRC DST" */
    const char *help;                  /* paragraph for `vmsnap help VERB` */
    const char *summary;               /* one line, for the man pages' lists */
    const char *page;                  /* the man page it is in ("vmsnap-pack") */
    const struct cli_opt *opts;        /* its parser's table; NULL: none (or see subs) */
    const struct cli_sub *subs;        /* NULL, or its sub-verbs (a row with name NULL ends) */
    const char *operands;              /* as in struct cli_sub */
    bool unused_ignored; /* its sub-verbs share one table and take every row of it, ignoring
                          * those whose `only` does not name them (vm); else such a row is
                          * refused */
};
/* The verb table (cli/main.c), `*n` rows. */
const struct cli_verb *cli_verbs(size_t *n);
/* The options taken before the verb (cli/main.c). */
extern const struct cli_opt cli_global_opts[];
/* The exit codes (cli/main.c): the usage text and the man page's EXIT STATUS. */
struct cli_exit {
    const char *code; /* "0", "143, 129" */
    const char *what;
};
extern const struct cli_exit cli_exits[]; /* ends with code NULL */
/* Each verb's and sub-verb's table (cli/cmd_*.c). */
extern const struct cli_opt cli_pack_opts[], cli_unpack_opts[], cli_inspect_opts[];
extern const struct cli_opt cli_xfer_opts[]; /* push, pull, export, ls, rm, gc */
extern const struct cli_opt cli_vm_opts[];   /* every vm sub-verb's (`only`: which uses it) */
struct vmsnap_xfer_opts;
/* A store option (CLI_STORE_OPTS: cli_getopt's `c`, its argument in optarg) into `o`: 0, 1 when
 * `c` is not one, -1 after the usage error (for `verb`) was printed. */
int cli_store_opt(const char *verb, int c, struct vmsnap_xfer_opts *o);
extern const struct cli_sub cli_vm_subs[], cli_disk_subs[], cli_cache_subs[];
/* `word` is one of the space-separated `list`. */
bool cli_word_in(const char *list, const char *word);
/* "-j/--connections", "--part-size", "-j": how messages name an option. */
const char *cli_opt_label(char *buf, size_t cap, const struct cli_opt *o);
/* The row of `opts` cli_getopt returns `val` for; NULL when none. */
const struct cli_opt *cli_opt_by_val(const struct cli_opt *opts, int val);
/* The row of `opts` for `c` is for `word` (its `only` lists it, or is NULL): 0; else the usage
 * error for `verb` ("--timeout is an option of stop only (vm pause does not use it)") and -1. */
int cli_opt_for(const char *verb, const char *word, const struct cli_opt *opts, int c);
/* `vmsnap help VERB` (and VERB --help): usage, sub-verbs, description, options, on stdout.
 * Returns EXIT_OK, or the usage error for an unknown verb. */
int cli_verb_help(const char *name);
void cli_print_verb_help(FILE *f, const struct cli_verb *v);
/* A sub-verb's --help: its usage, summary and options. Returns EXIT_OK. */
int cli_sub_help(const char *verb, const struct cli_sub *sub);

/* The option tables of some verbs, each with the (sub-)verbs that parse with it, in the order of
 * first use: what help and the man pages list under one heading. */
#define CLI_GROUP_USERS 16
struct cli_user {
    const struct cli_verb *verb;
    const struct cli_sub *sub; /* NULL: the verb itself */
};
struct cli_group {
    const struct cli_opt *opts;
    struct cli_user users[CLI_GROUP_USERS];
    size_t n;
};
/* The groups of the `n` verbs `vs` into `g` (room for `cap`); returns how many. */
size_t cli_groups(const struct cli_verb *const *vs, size_t n, struct cli_group *g, size_t cap);
/* The name `only` matches for a user: the sub-verb's, else the verb's. */
const char *cli_user_key(const struct cli_user *u);
/* Whether the row `o` of group `g` is for one of its users; `who` (room `cap`) then gets those
 * of them it is for when it is not for all ("run, resume"), else "". */
bool cli_group_row(const struct cli_group *g, const struct cli_opt *o, char *who, size_t cap);
/* "-T, --threads N", "--json", "-j N": how the lists show an option. */
const char *cli_opt_spellings(char *buf, size_t cap, const struct cli_opt *o);
/* The hidden generators of `vmsnap help` (cli/doc_man.c, cli/doc_complete.c): argv[0] is
 * "--man", "--completion" or "--options". Returns an exit code. */
int cli_doc_man(int argc, char **argv);
int cli_doc_completion(int argc, char **argv);
int cli_doc_options(int argc, char **argv);
/* Every table is consistent (names and letters unique in a parser, `only` naming its verbs or
 * sub-verbs, choices given): 0, else -1 after saying what is wrong on stderr. */
int cli_doc_check(void);

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

/* getopt_long over `opts` (optind set to 1 before the first call), which takes -q and -v itself
 * (cli_common_flag): the next other option's `val` ('h' for -h/--help), or -1. An unknown option
 * or a missing argument is reported here (with a did-you-mean for a long option) as a usage
 * error; the verb's own cli_usage() that follows ('?') then prints nothing more. */
int cli_getopt(int argc, char **argv, const struct cli_opt *opts);
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
/* The usage error for the unknown sub-verb `sub` of `verb` (its sub-verbs `subs`), with a
 * did-you-mean. Returns EXIT_USAGE. */
struct cli_sub;
int cli_unknown_sub(const char *verb, const char *sub, const struct cli_sub *subs);
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

/* ---- client mode (cli/client.c): --socket PATH or VMSNAP_SOCKET ----
 * The daemon's socket (NULL: call the library). Each cli_client_* stands for the library call
 * of the same signature (vmsnap_xfer_push, ...) and fills the same results from the daemon's
 * answer, so a verb prints the same either way. */
extern const char *cli_socket;
struct vmsnap_xfer_opts;
struct vmsnap_xfer_stats;
struct vmsnap_xfer_set;
struct vmsnap_rm_result;
struct vmsnap_vm_opts;
struct vmsnap_vm_run_args;
struct vmsnap_vm_timing;
struct vmsnap_vm_info;
int cli_client_push(const char *from, const char *to, const struct vmsnap_xfer_opts *o,
                    struct vmsnap_xfer_stats *st, struct vmsnap_err *err);
int cli_client_pull(const char *from, const char *to, const struct vmsnap_xfer_opts *o,
                    struct vmsnap_xfer_stats *st, struct vmsnap_err *err);
int cli_client_list(const char *url, const struct vmsnap_xfer_opts *o,
                    int (*fn)(void *arg, const struct vmsnap_xfer_set *set), void *arg,
                    struct vmsnap_err *err);
int cli_client_remove(const char *url, bool force, const struct vmsnap_xfer_opts *o,
                      struct vmsnap_rm_result *res, struct vmsnap_err *err);
int cli_client_vm_run(const struct vmsnap_vm_opts *o, const char *name,
                      const struct vmsnap_vm_run_args *a, struct vmsnap_vm_timing *t,
                      struct vmsnap_err *err);
int cli_client_vm_pause(const struct vmsnap_vm_opts *o, const char *name,
                        struct vmsnap_vm_timing *t, struct vmsnap_err *err);
int cli_client_vm_suspend(const struct vmsnap_vm_opts *o, const char *name, const char *url,
                          struct vmsnap_vm_timing *t, struct vmsnap_err *err);
int cli_client_vm_resume(const struct vmsnap_vm_opts *o, const char *name, const char *url,
                         struct vmsnap_vm_timing *t, struct vmsnap_err *err);
int cli_client_vm_shutdown(const struct vmsnap_vm_opts *o, const char *name, bool remove,
                           unsigned timeout, bool *graceful, struct vmsnap_err *err);
int cli_client_vm_list(const struct vmsnap_vm_opts *o,
                       int (*fn)(void *arg, const struct vmsnap_vm_info *info), void *arg,
                       struct vmsnap_err *err);
struct vmsnap_gc_opts;
struct vmsnap_gc_result;
int cli_client_export(const char *from, const char *to, const struct vmsnap_xfer_opts *o,
                      struct vmsnap_xfer_stats *st, struct vmsnap_err *err);
int cli_client_gc(const char *url, const struct vmsnap_gc_opts *g, const struct vmsnap_xfer_opts *o,
                  struct vmsnap_gc_result *res, struct vmsnap_err *err);
int cli_client_disk_create(const char *path, const struct vmsnap_disk_create_opts *o,
                           struct vmsnap_err *err);
int cli_client_disk_clone(const char *src, const char *dst, const struct vmsnap_disk_clone_opts *o,
                          enum vmsnap_disk_clone_how *how, struct vmsnap_err *err);
int cli_client_disk_info(const char *path, struct vmsnap_disk_info *info, struct vmsnap_err *err);
struct vmsnap_pcache_stat;
struct vmsnap_pcache_evict_opts;
struct vmsnap_pcache_report;
int cli_client_pcache_stat_path(
    const char *path, int (*fn)(void *arg, const char *path, const struct vmsnap_pcache_stat *st),
    void *arg, struct vmsnap_pcache_stat *total, struct vmsnap_err *err);
/* --wait is refused (EINVAL): the retrier is the node's */
int cli_client_pcache_evict(const char *path, const struct vmsnap_pcache_evict_opts *o,
                            struct vmsnap_pcache_report *rep, struct vmsnap_err *err);
/* The object cache's calls; the handle is the daemon's (pass NULL) */
struct vmsnap_objcache;
struct vmsnap_objcache_entry;
int cli_client_objcache_stat(struct vmsnap_objcache *c, uint64_t *entries, uint64_t *bytes,
                             uint64_t *cap, struct vmsnap_err *err);
const char *cli_client_objcache_dir(const struct vmsnap_objcache *c);
int cli_client_objcache_list(struct vmsnap_objcache *c,
                             int (*fn)(void *arg, const struct vmsnap_objcache_entry *e), void *arg,
                             struct vmsnap_err *err);
int cli_client_objcache_trim(struct vmsnap_objcache *c, uint64_t max_bytes, uint64_t *evicted,
                             uint64_t *freed, struct vmsnap_err *err);

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
/* -q / -v given after the verb (cli_getopt passes them here). */
void cli_common_flag(int c);

/* The command line of a transfer verb. */
struct xfer_verb {
    const char *name; /* "push" */
    int operands;     /* how many it takes */
    const char *want; /* the usage error when they are not that many: "expected PATH and URL" */
    int url;          /* which of them is the URL ("-" is refused) */
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
