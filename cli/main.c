/* SPDX-License-Identifier: Apache-2.0 */
/* vmsnap: the verb table and global flags. */
#include "cli.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int cmd_help(int argc, char **argv);
static int cmd_version(int argc, char **argv);

/* One row per verb; keep sorted by how often users need them. */
static const struct cli_verb verbs[] = {
    {"pack", cmd_pack,
     "pack [--json] [-f] [-T N] [--frame-size SIZE] [--level L] [--keep-zero-pages] "
     "[--keep-cache] [--fsync] SRC DST",
     "Encode the sparse file SRC (a guest memory image, a disk image) into DST ('-' = stdout):\n"
     "populated extents only, all-zero pages skipped, independent zstd frames per source range\n"
     "(default 64M) compressed on -T N threads (0, the default: all CPUs; -j N is the same) at\n"
     "zstd --level L (default 1, up to 22), and a seek table. The output is byte-identical for\n"
     "every N. DST appears only when complete (mode 0600); an existing DST is refused unless\n"
     "-f/--force. --fsync makes it durable first (a filesystem that reports a full disk only on\n"
     "writeback then fails the pack, not a later read).",
     "encode a sparse file into an image", "vmsnap-pack", cli_pack_opts, NULL, "file file", false},
    {"unpack", cmd_unpack,
     "unpack [--json] [-f] [-T N] [--max-size SIZE] [--fsync] [--drop-cache] SRC DST",
     "Decode SRC ('-' = stdin) into the sparse file DST: vmsnap images in parallel, reference\n"
     "single-stream images and plain zstd sequentially. Every field and checksum is validated;\n"
     "an image larger than --max-size (default 64T) is refused.\n"
     "DST is written under a temporary name and renamed only on success (mode 0600); an\n"
     "existing DST is refused unless -f/--force. -T N: decoder threads (0: all CPUs).\n"
     "--drop-cache then drops DST's page cache (writeback started, retried for a few seconds),\n"
     "so a restored snapshot does not stay in memory next to the guest.",
     "decode an image into a sparse file", "vmsnap-pack", cli_unpack_opts, NULL, "file file",
     false},
    {"inspect", cmd_inspect, "inspect [--json] [--verify] [-T N] [--max-size 64T] SRC",
     "Show an image's logical size, populated bytes, zero pages elided, frames, compressed size\n"
     "and ratio. --verify decodes everything and checks every checksum without writing. An image\n"
     "without a seek table (a reference stream, plain zstd) is always decoded; what only the\n"
     "table records (zero pages elided, frame size) is then n/a (null in --json).",
     "describe an image, or verify it", "vmsnap-pack", cli_inspect_opts, NULL, "file", false},
    {"cache", cmd_cache, "cache stat|evict|objects|trim ...",
     "stat: pages cached, dirty, under writeback, evicted and recently evicted per file and in\n"
     "total (cachestat; mincore where unavailable, marked). evict: drop clean pages of files that\n"
     "are never modified; with --staged, single-link files outside --preserve paths are\n"
     "truncated and unlinked. Reports dropped, removed and still-dirty files; --wait retries\n"
     "dirty files up to SECONDS; --kick-writeback starts their writeback first.\n"
     "objects and trim: the object cache (objects fetched from stores, by digest;\n"
     "docs/objcache.md): its entries, totals and cap, and an eviction of the least recently\n"
     "used entries down to --max-size (default: the cap). --cache-dir: default\n"
     "$VMSNAP_CACHE_DIR, else /var/cache/vmsnap (root) or ~/.cache/vmsnap; --cache-size: the\n"
     "cap, default $VMSNAP_CACHE_SIZE, else 8G.",
     "the page cache of snapshot files; the node's object cache", "vmsnap-cache", NULL,
     cli_cache_subs, NULL, false},
    {"disk", cmd_disk, "disk create|clone|info ... IMAGE",
     "Writable upper disks: sparse journal-less ext4 images made through libext2fs. A clone is\n"
     "made by FICLONE where the file system shares extents, else by a hole-keeping copy "
     "(--direct:\n"
     "O_DIRECT, nothing left in the page cache).\n"
     "IMAGE/DST appear only when complete; an existing one is refused unless -f/--force. With\n"
     "--new-uuid, --force also adds metadata_csum_seed to an image whose metadata checksums lack\n"
     "it (kernel 4.4+); an image without metadata checksums needs no --force.",
     "writable upper disks (ext4 images)", "vmsnap-disk", NULL, cli_disk_subs, NULL, false},
    {"push", cmd_push,
     "push [--json] [-j N] [-T N] [--part-size SIZE] [--max-memory SIZE] [--parent URL] ... PATH "
     "URL",
     "Encode and upload a file (one object at URL) or a snapshot-set directory. A set is\n"
     "layered by default: every regular file to a new object under\n"
     "URL/vmsnap-objects/<pushId>/, files and parts in parallel, then URL/manifest.json, the\n"
     "only object ever replaced (one PUT: a push killed at any moment leaves the old set).\n"
     "--parent URL: each file a delta over the parent set's (the 4 KiB pages that differ);\n"
     "--max-depth N (8) layers at most; --layout reference: URL/<name>.zstd and a manifest the\n"
     "reference system reads (its replace is a transaction of held uploads).\n"
     "--write-cache: a layered set's objects also go into the node's object cache as they are\n"
     "uploaded (S3, GCS; --cache-dir, VMSNAP_CACHE_DIR), so a pull of it here fetches nothing\n"
     "(vm suspend always does this).\n"
     "URL: a path or file:///abs (local store), s3://bucket/key (--endpoint or AWS_ENDPOINT_URL,\n"
     "AWS_REGION, AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY[/AWS_SESSION_TOKEN], --path-style),\n"
     "gs://bucket/key (Cloud Storage XML API: HMAC keys, or OAuth tokens). -j: connections (8);\n"
     "-T/--threads: encoder threads (0, the default: all CPUs); --level: zstd level (default 1);\n"
     "parts of 16M (--part-size); at most 256M of parts and encoder buffers (--max-memory; passed\n"
     "by about three frames of --frame-size, 64M, per file encoding; a set encodes two at once).\n"
     "--base URL: an earlier set (or object) in the same store; frames that did not change are\n"
     "copied there by the store (S3 UploadPartCopy) instead of being compressed and uploaded\n"
     "(the reference layout; for a layered set, --base is its --parent).",
     "encode and upload a file or a snapshot set", "vmsnap-push", cli_xfer_opts, NULL, "file url",
     false},
    {"pull", cmd_pull,
     "pull [--json] [-f] [-j N] [-T N] [--max-memory SIZE] [--drop-cache] ... URL PATH",
     "Download and decode a snapshot set (manifest first; names, sizes and digests verified) or\n"
     "one object, with ranged GETs of frame groups over N connections, decoded in parallel into\n"
     "sparse files. Files appear (mode 0600) only when all are complete and verified; other\n"
     "files already in PATH are left as they are. A file of the set's names already in PATH\n"
     "(or PATH itself, for one object) is refused unless -f/--force replaces it.\n"
     "A layered set's files are each a chain of layers, checked\n"
     "against their digests; from a remote store every layer goes through the node's object\n"
     "cache (VMSNAP_CACHE_DIR, VMSNAP_CACHE_SIZE; 'vmsnap cache objects|trim').",
     "download and decode a snapshot set or an object", "vmsnap-push", cli_xfer_opts, NULL,
     "url file", false},
    {"export", cmd_export, "export [-j N] [--no-cache] ... URL DEST",
     "Write a snapshot set (layered or not) to DEST in the reference system's layout\n"
     "(DEST/<name>.zstd and a manifest with snapshotFiles), which the reference system\n"
     "restores: every file's layers are decoded into a temporary directory ($TMPDIR, else\n"
     "/var/tmp; room for the populated bytes) and pushed with --layout reference. The cost: no\n"
     "layers (every file whole), and a replace at DEST is the reference layout's transaction,\n"
     "not one PUT.",
     "write a set in the reference system's layout", "vmsnap-push", cli_xfer_opts, NULL, "url url",
     false},
    {"ls", cmd_ls, "ls [--json] URL",
     "List the snapshot sets under a prefix with their manifest summary (--json: \"sets\", an\n"
     "array of {url, valid, files, logical_bytes, object_bytes}).",
     "list the snapshot sets under a prefix", "vmsnap-push", cli_xfer_opts, NULL, "url", false},
    {"rm", cmd_rm, "rm [--json] [-f|--force] URL",
     "Delete a snapshot set, manifest first (a layered set: its manifest only; gc removes the\n"
     "layers no set names), or one snapshot object (vmsnap, reference or zstd\n"
     "magic; anything else is refused). --force also deletes the *.zstd objects of an incomplete\n"
     "set (no manifest) that are vmsnap images, keeps the others (it names them), and aborts\n"
     "its unfinished uploads. Says what it removed; nothing to remove is an error.",
     "delete a snapshot set or object", "vmsnap-push", cli_xfer_opts, NULL, "url", false},
    {"gc", cmd_gc, "gc [--json] [--older-than 1h] [--dry-run] URL",
     "Clean what killed pushes left under a prefix once it is --older-than old (default 1h;\n"
     "0: all, which fails pushes running now): unfinished multipart uploads (the next push to\n"
     "the same key also aborts them) and the objects of set pushes that never committed their\n"
     "manifest (found by their push marks), and the objects of layered sets that no manifest\n"
     "names (every manifest of the bucket is read; on a local store those under URL).\n"
     "--dry-run lists them, with sizes, and what gc would do.",
     "clean what killed pushes left", "vmsnap-push", cli_xfer_opts, NULL, "url", false},
    {"vm", cmd_vm, "vm run|pause|suspend|resume|ls|stop|console ...",
     "Micro-VMs under QEMU (docs/vm.md), recorded under --state-dir (default /var/lib/vmsnap,\n"
     "or VMSNAP_STATE_DIR), guest RAM on tmpfs (--ram-dir, default /dev/shm). A suspend\n"
     "checkpoints and pushes to a store (the local checkpoint is kept if the push fails); the\n"
     "frames unchanged since the set the VM came from are copied there by the store (--base\n"
     "URL: another set; --no-base: none). A resume is from the local checkpoint, or from a\n"
     "store with a URL. Every sub-verb takes every option below and ignores those it does not\n"
     "use. -v: step timings.",
     "micro-VMs under QEMU: run, pause, suspend, resume", "vmsnap-vm", NULL, cli_vm_subs, NULL,
     true},
    {"help", cmd_help, "help [VERB]", "Show the verbs, or one verb's help.",
     "the verbs, or one verb's help", "vmsnap", NULL, NULL, "verb", false},
    {"version", cmd_version, "version", "Show the version (also --version).", "the version",
     "vmsnap", NULL, NULL, "none", false},
};

const struct cli_verb *cli_verbs(size_t *n)
{
    *n = sizeof(verbs) / sizeof(verbs[0]);
    return verbs;
}

/* Before the verb (run() below); -q, -v and clusters of them ("-vv") also after it. */
const struct cli_opt cli_global_opts[] = {
    {"quiet", 'q', 'q', NULL, CLI_K_NONE, NULL, NULL, "errors only"},
    {"verbose", 'v', 'v', NULL, CLI_K_NONE, NULL, NULL,
     "more: step timings, retries; twice (-vv): debug lines, each request"},
    {"json", 0, 'J', NULL, CLI_K_NONE, NULL, NULL,
     "one JSON object on stdout, failures included (every verb that reports)"},
    {"socket", 0, 'S', "PATH", CLI_K_FILE, NULL, NULL,
     "send push, pull, ls, rm and vm run/pause/suspend/resume/stop/ls to the node daemon "
     "vmsnapd there (default: VMSNAP_SOCKET)"},
    {"version", 0, 'V', NULL, CLI_K_NONE, NULL, NULL, "the version"},
    {"help", 'h', 'h', NULL, CLI_K_NONE, NULL, NULL, "the verbs"},
    CLI_OPT_END,
};

/* EXIT_* in cli.h; docs/cli.md says more of each */
const struct cli_exit cli_exits[] = {
    {"0", "ok"},
    {"1", "other failure"},
    {"2", "usage"},
    {"3", "not found"},
    {"4", "access denied"},
    {"5", "unreachable or retryable"},
    {"6", "corrupt or untrusted input"},
    {"7", "local I/O"},
    {"130", "interrupted (143 SIGTERM, 129 SIGHUP)"},
    {NULL, NULL},
};

static const struct cli_verb *find_verb(const char *name)
{
    for (size_t i = 0; i < sizeof(verbs) / sizeof(verbs[0]); i++)
        if (strcmp(verbs[i].name, name) == 0)
            return &verbs[i];
    return NULL;
}

/* "vmsnap psuh: unknown verb; did you mean 'push'?" (a usage error) */
static int unknown_verb(const char *name, const char *prefix)
{
    const char *names[sizeof(verbs) / sizeof(verbs[0]) + 1];
    for (size_t i = 0; i < sizeof(verbs) / sizeof(verbs[0]); i++)
        names[i] = verbs[i].name;
    names[sizeof(verbs) / sizeof(verbs[0])] = NULL;
    const char *near = cli_did_you_mean(name, names);
    if (near)
        return cli_usage(prefix, "unknown verb; did you mean '%s'?", near);
    return cli_usage(prefix, "unknown verb (the verbs: 'vmsnap help')");
}

static void usage(FILE *f)
{
    fprintf(f, "usage: vmsnap [-q] [-v|-vv] VERB [ARGS]   (-q, -v, -vv: anywhere)\n\nverbs:\n");
    for (size_t i = 0; i < sizeof(verbs) / sizeof(verbs[0]); i++)
        fprintf(f, "  %s\n", verbs[i].synopsis);
    /* "Exit codes: 0 ok, 1 other failure, ..." in lines of at most 96 */
    size_t col = fprintf(f, "\nExit codes:") - 1;
    for (size_t i = 0; cli_exits[i].code; i++) {
        char item[96];
        int n = snprintf(item, sizeof(item), " %s %s%s", cli_exits[i].code, cli_exits[i].what,
                         cli_exits[i + 1].code ? "," : ".");
        if (col + (size_t)n > 96) {
            fputc('\n', f);
            col = 0;
        }
        col += (size_t)fprintf(f, "%s", col ? item : item + 1);
    }
    fprintf(f, "\n--json (every verb that reports): one JSON object on stdout, failures "
               "included.\n'vmsnap help VERB' for details; docs/cli.md for the contract.\n");
}

int cli_verb_help(const char *name)
{
    const struct cli_verb *v = find_verb(name);
    if (!v) {
        cli_verb = ""; /* no "see 'vmsnap help help'" */
        return unknown_verb(name, name);
    }
    cli_print_verb_help(stdout, v);
    return EXIT_OK;
}

/* help VERB; and the generators the build runs (not for users, so not in the usage):
 * help --man DIR, help --completion bash|zsh, help --options */
static int cmd_help(int argc, char **argv)
{
    if (argc < 2) {
        usage(stdout);
        return EXIT_OK;
    }
    if (!strcmp(argv[1], "--man"))
        return cli_doc_man(argc - 1, argv + 1);
    if (!strcmp(argv[1], "--completion"))
        return cli_doc_completion(argc - 1, argv + 1);
    if (!strcmp(argv[1], "--options"))
        return cli_doc_options(argc - 1, argv + 1);
    return cli_verb_help(argv[1]);
}

static int cmd_version(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    printf("vmsnap %s\n", vmsnap_version());
    return EXIT_OK;
}

static void log_stderr(void *arg, enum vmsnap_log_level level, const char *msg)
{
    (void)arg;
    static const char *const names[] = {"error", "warning", "info", "debug"};
    char prefix[32];
    snprintf(prefix, sizeof(prefix), "vmsnap: %s: ", names[level]);
    cli_eputs(prefix, msg);
}

/* The verbs that stop cleanly when cancelled (pack, unpack, inspect --verify, push, pull,
 * cache evict --wait, vm suspend and resume, vm run --ready and vm stop --timeout: the first ends
 * the readiness wait, VM running, the second the guest's chance to power off, the VM then stopped
 * hard): SIGINT, SIGTERM and SIGHUP are taken by one thread
 * (blocked in every other, from before any is created); the first cancels what runs (it stops at
 * the next frame or part and cleans up, exit 128 + the signal: 130, 143, 129) and gives the signals
 * their default action back, so a second one ends the process at once. A signal inherited as
 * ignored (nohup, a background job of a script) stays ignored. Every other verb keeps the default:
 * one signal ends it. */
static sigset_t stop_sigs;

static void *stop_main(void *arg)
{
    (void)arg;
    int sig = 0;
    while (sigwait(&stop_sigs, &sig) != 0)
        ;
    vmsnap_cancel(sig);
    for (int s = 1; s < NSIG; s++)
        if (sigismember(&stop_sigs, s) == 1)
            signal(s, SIG_DFL);
    /* unblocked here only: a second signal is delivered to this thread, with its default action,
     * even while the message below waits on a blocked stderr */
    pthread_sigmask(SIG_UNBLOCK, &stop_sigs, NULL);
    char msg[96];
    const char *name = sigabbrev_np(sig);
    int n = snprintf(msg, sizeof(msg),
                     "%svmsnap: SIG%s: stopping and cleaning up (again to quit at once)\n",
                     isatty(STDERR_FILENO) ? "\r\033[K" : "", name ? name : "?");
    if (n > 0 && write(STDERR_FILENO, msg, (size_t)n) < 0)
        n = 0;
    for (;;)
        pause();
    return NULL;
}

static bool has_arg(int argc, char **argv, const char *opt)
{
    for (int i = 1; i < argc; i++)
        if (!strncmp(argv[i], opt, strlen(opt)))
            return true;
    return false;
}

static bool cancellable(int argc, char **argv)
{
    static const char *const plain[] = {"pack", "unpack", "push", "pull"};
    for (size_t i = 0; i < sizeof(plain) / sizeof(plain[0]); i++)
        if (!strcmp(argv[0], plain[i]))
            return true;
    if (!strcmp(argv[0], "inspect"))
        return has_arg(argc, argv, "--verify");
    if (argc > 1 && !strcmp(argv[0], "cache"))
        return !strcmp(argv[1], "evict") && has_arg(argc, argv, "--wait");
    if (argc > 1 && !strcmp(argv[0], "vm")) /* and the waits of run --ready, stop --timeout */
        return !strcmp(argv[1], "suspend") || !strcmp(argv[1], "resume") ||
               (!strcmp(argv[1], "run") && has_arg(argc, argv, "--ready")) ||
               (!strcmp(argv[1], "stop") && has_arg(argc, argv, "--timeout"));
    return false;
}

static void handle_stop_signals(void)
{
    static const int sigs[] = {SIGINT, SIGTERM, SIGHUP};
    sigemptyset(&stop_sigs);
    for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++) {
        struct sigaction old;
        if (sigaction(sigs[i], NULL, &old) == 0 && old.sa_handler != SIG_IGN)
            sigaddset(&stop_sigs, sigs[i]);
    }
    pthread_t t;
    if (pthread_sigmask(SIG_BLOCK, &stop_sigs, NULL) != 0)
        return;
    if (pthread_create(&t, NULL, stop_main, NULL) != 0) {
        pthread_sigmask(SIG_UNBLOCK, &stop_sigs, NULL);
        return;
    }
    pthread_detach(t);
}

static void set_log_level(void)
{
    vmsnap_set_log(log_stderr, NULL,
                   cli_quiet
                       ? VMSNAP_LOG_ERROR
                       : (cli_verbose > 1 ? VMSNAP_LOG_DEBUG
                                          : (cli_verbose ? VMSNAP_LOG_INFO : VMSNAP_LOG_WARN)));
}

void cli_common_flag(int c)
{
    if (c == 'q')
        cli_quiet = true;
    else
        cli_verbose++;
    set_log_level();
}

/* -q, --quiet, -v, --verbose, or a cluster of q and v ("-vv", "-qv"): taken (0), else -1. */
static int common_flag(const char *a)
{
    if (!strcmp(a, "--quiet") || !strcmp(a, "--verbose")) {
        cli_common_flag(a[2] == 'q' ? 'q' : 'v');
        return 0;
    }
    if (a[0] != '-' || !a[1] || strspn(a + 1, "qv") != strlen(a + 1))
        return -1;
    for (const char *c = a + 1; *c; c++)
        cli_common_flag(*c);
    return 0;
}

/* --json anywhere in the verb's arguments (before "--"): a usage error is then JSON too. */
static bool wants_json(int argc, char **argv)
{
    for (int i = 1; i < argc && strcmp(argv[i], "--"); i++)
        if (!strcmp(argv[i], "--json"))
            return true;
    return false;
}

static int run(int argc, char **argv)
{
    int i = 1;
    for (; i < argc && argv[i][0] == '-'; i++) {
        if (common_flag(argv[i]) == 0) /* -q, -v, --quiet, --verbose and clusters: "-vv" */
            continue;
        if (!strcmp(argv[i], "--socket") || !strncmp(argv[i], "--socket=", 9)) {
            const char *v = argv[i][8] == '=' ? argv[i] + 9 : (i + 1 < argc ? argv[++i] : NULL);
            if (!v || !*v) {
                cli_usage("", "--socket wants the daemon's socket PATH");
                return EXIT_USAGE;
            }
            cli_socket = v;
            continue;
        }
        int c = 0;
        for (const struct cli_opt *o = cli_global_opts; !c && (o->name || o->letter); o++)
            if ((o->name && argv[i][1] == '-' && !strcmp(argv[i] + 2, o->name)) ||
                (o->letter && argv[i][1] == o->letter && !argv[i][2]))
                c = o->val;
        if (c == 'V')
            return cmd_version(0, NULL);
        if (c == 'h') {
            usage(stdout);
            return EXIT_OK;
        }
        if (c == 'J')
            continue; /* taken by wants_json */
        cli_usage("", "unknown option '%s' before the verb", argv[i]);
        usage(stderr);
        return EXIT_USAGE;
    }
    if (i >= argc) {
        cli_usage("", "no verb given");
        usage(stderr);
        return EXIT_USAGE;
    }
    set_log_level();
    const struct cli_verb *v = find_verb(argv[i]);
    if (!v)
        return unknown_verb(argv[i], argv[i]);
    cli_verb = v->name;
    /* -q/-v between a verb and its sub-verb ("vm -q stop"): taken out here */
    while (i + 1 < argc && common_flag(argv[i + 1]) == 0) {
        memmove(&argv[i + 1], &argv[i + 2], sizeof(char *) * (size_t)(argc - i - 2));
        argv[--argc] = NULL;
    }
    if (cancellable(argc - i, argv + i))
        handle_stop_signals();
    return v->run(argc - i, argv + i);
}

int main(int argc, char **argv)
{
    cli_json = wants_json(argc, argv);
    const char *s = getenv("VMSNAP_SOCKET");
    if (s && *s)
        cli_socket = s;
    return cli_finish(run(argc, argv));
}
