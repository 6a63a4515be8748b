/* SPDX-License-Identifier: Apache-2.0 */
/* vmsnap vm run|pause|suspend|resume|ls|stop|console: micro-VM lifecycle (include/vmsnap/vmm.h). */
#include "cli.h"
#include "vmsnap/vm.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h> /* optarg, optind */
#include <inttypes.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum {
    OPT_KERNEL = 256,
    OPT_INITRD,
    OPT_MEM,
    OPT_CPUS,
    OPT_DISK_SIZE,
    OPT_APPEND,
    OPT_STATE_DIR,
    OPT_RAM_DIR,
    OPT_ACCEL,
    OPT_QEMU,
    OPT_ON_DEMAND,
    OPT_NO_EVICT,
    OPT_JSON,
    OPT_RM,
    OPT_SEND,
    OPT_LINES,
    OPT_BASE,
    OPT_NO_BASE,
    OPT_ASSET_DIR,
    OPT_FORCE,
    OPT_RAM_OVERCOMMIT,
    OPT_READY,
    OPT_READY_TIMEOUT,
    OPT_TIMEOUT,
};

/* One table for every sub-verb: each takes them all (one a sub-verb does not use is ignored);
 * `only` says which sub-verbs use an option, for the help and the completions. */
const struct cli_opt cli_vm_opts[] = {
    {"kernel", 0, OPT_KERNEL, "K", CLI_K_FILE, NULL, "run resume",
     "the guest kernel (resume from a URL: instead of the set's)"},
    {"initrd", 0, OPT_INITRD, "I", CLI_K_FILE, NULL, "run resume",
     "the initramfs (resume from a URL: instead of the set's)"},
    {"mem", 0, OPT_MEM, "SIZE", CLI_K_NONE, NULL, "run",
     "guest memory, at least 16M in whole MiB (default 512M)"},
    {"cpus", 0, OPT_CPUS, "N", CLI_K_NONE, NULL, "run", "virtual CPUs, 1 to 64 (default 1)"},
    {"disk-size", 0, OPT_DISK_SIZE, "SIZE", CLI_K_NONE, NULL, "run",
     "the writable upper disk, at least 8M (default 4G)"},
    {"append", 0, OPT_APPEND, "A", CLI_K_NONE, NULL, "run", "the kernel command line"},
    {"ram-overcommit", 0, OPT_RAM_OVERCOMMIT, NULL, CLI_K_NONE, NULL, "run resume",
     "start even when the RAM directory has less room than the guest's memory"},
    {"ready", 0, OPT_READY, "TEXT", CLI_K_NONE, NULL, "run resume",
     "then wait until the guest prints a console line holding TEXT (its readiness)"},
    {"ready-timeout", 0, OPT_READY_TIMEOUT, "SECONDS", CLI_K_NONE, NULL, "run resume",
     "at most this long for --ready, 1 to 3600 (default 60; then exit 5, the VM running)"},
    {"base", 0, OPT_BASE, "URL", CLI_K_URL, NULL, "suspend",
     "a set whose unchanged frames the store copies (default: the set the VM came from)"},
    {"no-base", 0, OPT_NO_BASE, NULL, CLI_K_NONE, NULL, "suspend",
     "copy no frames from an earlier set"},
    {"on-demand", 0, OPT_ON_DEMAND, NULL, CLI_K_NONE, NULL, "resume",
     "map the memory image privately (pages read on first touch) instead of loading it"},
    {"asset-dir", 0, OPT_ASSET_DIR, "DIR[:DIR...]", CLI_K_DIR, NULL, "resume",
     "where a set's kernel and initrd may be (default: VMSNAP_ASSET_DIRS)"},
    {"force", 0, OPT_FORCE, NULL, CLI_K_NONE, NULL, "resume",
     "replace a newer local checkpoint, or go back past an interrupted pause"},
    {"rm", 0, OPT_RM, NULL, CLI_K_NONE, NULL, "stop", "also remove the VM's state directory"},
    {"timeout", 0, OPT_TIMEOUT, "SECONDS", CLI_K_NONE, NULL, "stop",
     "ask a running guest to power off (ACPI power button) and wait this long, 1 to 3600, "
     "before the hard stop (default: the hard stop at once)"},
    {"send", 0, OPT_SEND, "LINE", CLI_K_NONE, NULL, "console",
     "type LINE on the serial console instead of printing its log"},
    {"lines", 0, OPT_LINES, "N", CLI_K_NONE, NULL, "console", "print only the log's last N lines"},
    {"json", 0, OPT_JSON, NULL, CLI_K_NONE, NULL, NULL,
     "the result (timings, the list) as one JSON object on stdout"},
    {"state-dir", 0, OPT_STATE_DIR, "DIR", CLI_K_DIR, NULL, NULL,
     "where VMs are recorded (default: VMSNAP_STATE_DIR, else /var/lib/vmsnap)"},
    {"ram-dir", 0, OPT_RAM_DIR, "DIR", CLI_K_DIR, NULL, NULL,
     "guest RAM files, on tmpfs or hugetlbfs (default: VMSNAP_RAM_DIR, else /dev/shm)"},
    {"accel", 0, OPT_ACCEL, "ACCEL", CLI_K_CHOICE, "auto kvm tcg", NULL,
     "the accelerator: auto (the default: KVM where it works), kvm or tcg"},
    {"qemu", 0, OPT_QEMU, "BIN", CLI_K_FILE, NULL, NULL,
     "the QEMU binary (default: VMSNAP_QEMU, else qemu-system-x86_64)"},
    {"no-evict", 0, OPT_NO_EVICT, NULL, CLI_K_NONE, NULL, NULL,
     "skip the page-cache hygiene (for benchmarks)"},
    {NULL, 'j', 'j', "N", CLI_K_NONE, NULL, "suspend resume",
     "connections to the store, 1 to 256 (default 8)"},
    {"threads", 'T', 'T', "N", CLI_K_NONE, NULL, "suspend resume",
     "codec threads (0, the default: all CPUs)"},
    CLI_STORE_OPTS("suspend resume"),
    CLI_OPT_END,
};

const struct cli_sub cli_vm_subs[] = {
    {"run",
     "vm run NAME --kernel K [--initrd I] [--mem 512M] [--cpus 1] [--disk-size 4G] [--append A] "
     "[--ram-overcommit] [--ready TEXT [--ready-timeout S]]",
     "start a new VM", cli_vm_opts, "name"},
    {"pause", "vm pause NAME", "local checkpoint, VM stopped, memory freed", cli_vm_opts, "name"},
    {"suspend", "vm suspend NAME URL [--base URL | --no-base]",
     "checkpoint and push to a store (the local one kept if the push fails)", cli_vm_opts,
     "name url"},
    {"resume",
     "vm resume NAME [URL] [--on-demand] [--asset-dir DIR[:DIR...]] [--kernel K] [--initrd I] "
     "[--force] [--ram-overcommit] [--ready TEXT [--ready-timeout S]]",
     "from the local checkpoint, or from a store", cli_vm_opts, "name url"},
    {"ls", "vm ls [--json]", "the VMs and their state", cli_vm_opts, "none"},
    {"stop", "vm stop NAME [--rm] [--timeout S]",
     "stop the VM (its checkpoint is kept unless --rm); --timeout: ask its guest first",
     cli_vm_opts, "name"},
    {"console", "vm console NAME [--send LINE] [--lines N]", "the serial console's log",
     cli_vm_opts, "name"},
    {NULL, NULL, NULL, NULL, NULL},
};

struct args {
    struct vmsnap_vm_opts o;
    struct vmsnap_xfer_opts x;
    struct vmsnap_vm_run_args run;
    bool json, rm;
    unsigned timeout; /* stop: ask the guest first */
    const char *send;
    unsigned long lines;
    char *pos[3];
    int npos;
};

/* An option that takes a count (cli_getopt's `c`, the value in optarg): 0 taken, 1 not one of
 * them, else the usage error's exit code. */
static int count_opt(const char *verb, int c, struct args *a)
{
    static const struct {
        int c;
        unsigned long lo, hi;
        const char *name, *unit;
    } t[] = {
        {OPT_CPUS, 1, 64, "--cpus", ""},
        {OPT_READY_TIMEOUT, 1, VMSNAP_VM_READY_TIMEOUT_MAX, "--ready-timeout", " seconds"},
        {OPT_TIMEOUT, 1, VMSNAP_VM_SHUTDOWN_MAX, "--timeout", " seconds"},
        {OPT_LINES, 1, 1000000, "--lines", ""},
        {'j', 1, 256, "-j", ""},
        {'T', 0, 256, "-T", " (0: all CPUs)"},
    };
    size_t k = 0;
    while (k < sizeof(t) / sizeof(t[0]) && t[k].c != c)
        k++;
    if (k == sizeof(t) / sizeof(t[0]))
        return 1;
    unsigned long v;
    if (cli_parse_uint(optarg, t[k].lo, t[k].hi, &v) < 0)
        return cli_usage(verb, "%s: '%s' is not in %lu..%lu%s", t[k].name, optarg, t[k].lo, t[k].hi,
                         t[k].unit);
    if (c == OPT_CPUS)
        a->run.cpus = (unsigned)v;
    else if (c == OPT_READY_TIMEOUT)
        a->o.ready_timeout = (unsigned)v;
    else if (c == OPT_TIMEOUT)
        a->timeout = (unsigned)v;
    else if (c == OPT_LINES)
        a->lines = v;
    else if (c == 'j')
        a->x.connections = (unsigned)v;
    else
        a->x.threads = (unsigned)v;
    return 0;
}

static int parse(const char *verb, const struct cli_sub *sub, int argc, char **argv, struct args *a)
{
    memset(a, 0, sizeof(*a));
    a->o.xfer = &a->x;
    int c;
    optind = 1;
    while ((c = cli_getopt(argc, argv, cli_vm_opts)) != -1) {
        switch (c) {
        case OPT_KERNEL:
            a->run.kernel = optarg;
            break;
        case OPT_INITRD:
            a->run.initrd = optarg;
            break;
        case OPT_APPEND:
            a->run.append = optarg;
            break;
        case OPT_MEM:
            if (cli_parse_size(optarg, &a->run.mem) < 0 || a->run.mem < (16u << 20) ||
                a->run.mem % (1u << 20))
                return cli_usage(verb, "--mem: '%s' is not a size of at least 16M in whole MiB",
                                 optarg);
            break;
        case OPT_DISK_SIZE:
            if (cli_parse_size(optarg, &a->run.disk_size) < 0 || a->run.disk_size < (8u << 20))
                return cli_usage(verb, "--disk-size: '%s' is not a size of at least 8M", optarg);
            break;
        case OPT_STATE_DIR:
            a->o.state_dir = optarg;
            break;
        case OPT_RAM_DIR:
            a->o.ram_dir = optarg;
            break;
        case OPT_ACCEL:
            if (strcmp(optarg, "auto") && strcmp(optarg, "kvm") && strcmp(optarg, "tcg"))
                return cli_usage(verb, "--accel: '%s' is not auto, kvm or tcg", optarg);
            a->o.accel = optarg;
            break;
        case OPT_QEMU:
            a->o.qemu = optarg;
            break;
        case OPT_ON_DEMAND:
            a->o.on_demand = true;
            break;
        case OPT_NO_EVICT:
            a->o.no_evict = true;
            break;
        case OPT_BASE:
            a->x.base = optarg;
            break;
        case OPT_NO_BASE:
            a->o.no_base = true;
            break;
        case OPT_ASSET_DIR:
            a->o.asset_dirs = optarg;
            break;
        case OPT_FORCE:
            a->o.force = true;
            break;
        case OPT_RAM_OVERCOMMIT:
            a->o.ram_overcommit = true;
            break;
        case OPT_READY:
            if (!*optarg || strlen(optarg) > VMSNAP_VM_READY_MAX)
                return cli_usage(verb, "--ready: 1 to %d bytes of text", VMSNAP_VM_READY_MAX);
            a->o.ready = optarg;
            break;
        case OPT_JSON:
            a->json = true;
            break;
        case OPT_RM:
            a->rm = true;
            break;
        case OPT_SEND:
            a->send = optarg;
            break;
        case 'h':
            cli_sub_help("vm", sub);
            return -1;
        default: {
            int rc = count_opt(verb, c, a);
            if (rc != 1) {
                if (rc)
                    return rc;
                break;
            }
            rc = cli_store_opt(verb, c, &a->x);
            if (rc < 0) /* said */
                return EXIT_USAGE;
            if (rc > 0)
                return cli_usage(verb, "unknown option");
        }
        }
    }
    for (int i = optind; i < argc; i++) {
        if (a->npos >= 3)
            return cli_usage(verb, "too many arguments");
        a->pos[a->npos++] = argv[i];
    }
    return 0;
}

static void report(const char *op, const char *name, const struct vmsnap_vm_timing *t, bool json)
{
    if (json) {
        json_object *o = cli_out(), *steps = json_object_new_object();
        json_object_object_add(o, "op", json_object_new_string(op));
        for (unsigned i = 0; i < t->n; i++)
            json_object_object_add(steps, t->step[i].name, cli_json_seconds(t->step[i].seconds));
        json_object_object_add(o, "steps", steps);
        json_object_object_add(o, "seconds", cli_json_seconds(t->total));
        if (t->object_bytes) {
            json_object_object_add(o, "object_bytes",
                                   json_object_new_int64((int64_t)t->object_bytes));
            json_object_object_add(o, "copied_bytes",
                                   json_object_new_int64((int64_t)t->copied_bytes));
            json_object_object_add(o, "deltas", json_object_new_int64((int64_t)t->deltas));
            json_object_object_add(o, "cached_bytes",
                                   json_object_new_int64((int64_t)t->cached_bytes));
        }
        return;
    }
    if (cli_quiet)
        return;
    if (cli_verbose) {
        for (unsigned i = 0; i < t->n; i++)
            fprintf(stderr, "  %-14s %8.3f s\n", t->step[i].name, t->step[i].seconds);
        if (t->object_bytes && t->copied_bytes)
            fprintf(stderr,
                    "  objects        %llu bytes, %llu of them copied by the store from the base\n",
                    (unsigned long long)t->object_bytes, (unsigned long long)t->copied_bytes);
        else if (t->object_bytes)
            fprintf(stderr, "  objects        %llu bytes\n", (unsigned long long)t->object_bytes);
        if (t->deltas)
            fprintf(stderr, "  deltas         %llu files\n", (unsigned long long)t->deltas);
        if (t->cached_bytes)
            fprintf(stderr, "  cached         %llu bytes from the node's object cache\n",
                    (unsigned long long)t->cached_bytes);
    }
    fprintf(stderr, "vm %s %s: %.3f s\n", op, name, t->total);
}

struct ls_ctx {
    bool json, header;
    json_object *arr;
};

static void ls_header(struct ls_ctx *l)
{
    if (!l->json && !l->header)
        printf("%-20s %-12s %-7s %-4s %-10s %-10s %s\n", "NAME", "STATUS", "PID", "ACC", "MEMORY",
               "LOCAL", "URL");
    l->header = true;
}

static int ls_cb(void *arg, const struct vmsnap_vm_info *in)
{
    struct ls_ctx *l = arg;
    ls_header(l); /* with the first row (a listing that fails at once prints none) */
    if (l->json) {
        json_object *o = json_object_new_object();
        json_object_object_add(o, "name", json_object_new_string(in->name));
        json_object_object_add(o, "status", json_object_new_string(in->status));
        json_object_object_add(o, "pid", json_object_new_int64(in->pid));
        json_object_object_add(o, "accel", in->accel ? json_object_new_string(in->accel) : NULL);
        json_object_object_add(o, "memory_bytes", json_object_new_int64((int64_t)in->mem));
        json_object_object_add(o, "checkpoint", json_object_new_boolean(in->checkpoint));
        json_object_object_add(o, "url", in->url ? json_object_new_string(in->url) : NULL);
        json_object_object_add(o, "path", json_object_new_string(in->dir));
        if (in->busy_pid)
            json_object_object_add(o, "busy_pid", json_object_new_int64(in->busy_pid));
        json_object_array_add(l->arr, o);
        return 0;
    }
    /* the record is read back from a file in the state directory: no escapes from it */
    static char name[CLI_PRINTABLE_MAX], status[CLI_PRINTABLE_MAX], accel[CLI_PRINTABLE_MAX],
        url[CLI_PRINTABLE_MAX];
    char mem[32];
    printf("%-20s %-12s %-7d %-4s %-10s %-10s %s\n", cli_printable(name, sizeof(name), in->name),
           cli_printable(status, sizeof(status), in->status), (int)in->pid,
           in->accel ? cli_printable(accel, sizeof(accel), in->accel) : "-",
           cli_bytes(mem, sizeof(mem), in->mem), in->checkpoint ? "checkpoint" : "-",
           in->url ? cli_printable(url, sizeof(url), in->url) : "-");
    return 0;
}

static int console(const struct args *a, const char *name)
{
    struct vmsnap_err e = {0};
    if (a->send) {
        if (vmsnap_vm_console_send(&a->o, name, a->send, &e) < 0)
            return cli_fail("vm console", &e);
        return EXIT_OK;
    }
    char path[4200];
    if (vmsnap_vm_console_path(&a->o, name, path, sizeof(path), &e) < 0)
        return cli_fail("vm console", &e);
    FILE *f = fopen(path, "re");
    if (!f)
        return cli_fail_code("vm console", errno, "%s: %s", path, strerror(errno));
    /* Print the log with the serial CRs removed; with --lines only the last N lines, kept in
     * a bounded ring. */
    unsigned long keep = a->lines;
    char **ring = keep ? calloc(keep, sizeof(char *)) : NULL;
    if (keep && !ring) {
        fclose(f);
        return cli_fail_code("vm console", ENOMEM, "out of memory");
    }
    char *line = NULL;
    size_t cap = 0;
    unsigned long n = 0;
    ssize_t len;
    while ((len = getline(&line, &cap, f)) >= 0) {
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
            line[--len] = 0;
        if (!keep) {
            printf("%s\n", line);
            continue;
        }
        free(ring[n % keep]);
        ring[n % keep] = strdup(line);
        n++;
    }
    for (unsigned long i = n > keep ? n - keep : 0; keep && i < n; i++)
        printf("%s\n", ring[i % keep] ? ring[i % keep] : "");
    for (unsigned long i = 0; i < keep; i++)
        free(ring[i]);
    free(ring);
    free(line);
    fclose(f);
    return EXIT_OK;
}

int cmd_vm(int argc, char **argv)
{
    if (argc < 2)
        return cli_usage("vm", "missing subcommand (run, pause, suspend, resume, ls, stop, "
                               "console)");
    const char *sub = argv[1];
    const struct cli_sub *s = NULL;
    for (size_t i = 0; cli_vm_subs[i].name; i++)
        if (!strcmp(sub, cli_vm_subs[i].name))
            s = &cli_vm_subs[i];
    if (!strcmp(sub, "--help") || !strcmp(sub, "-h")) {
        printf("usage: vmsnap vm run|pause|suspend|resume|ls|stop|console ... ('vmsnap vm run "
               "--help', 'vmsnap help vm')\n");
        return EXIT_OK;
    }
    if (!s)
        return cli_unknown_sub("vm", sub, cli_vm_subs);
    char verb[32];
    snprintf(verb, sizeof(verb), "vm %s", sub);
    struct args a;
    int rc = parse(verb, s, argc - 1, argv + 1, &a);
    if (rc < 0)
        return EXIT_OK;
    if (rc > 0)
        return rc;
    if (a.o.ready_timeout && !a.o.ready)
        return cli_usage(verb, "--ready-timeout: without --ready there is nothing to wait for");
    a.json = a.json || cli_json;
    cli_json = a.json;
    if (a.npos >= 1 && strcmp(sub, "ls"))
        cli_subject("name", a.pos[0]);
    if (a.npos == 2 && (!strcmp(sub, "suspend") || !strcmp(sub, "resume")))
        cli_subject("url", a.pos[1]);
    struct vmsnap_err e = {0};
    struct vmsnap_vm_timing t = {0};
    if (!strcmp(sub, "ls")) {
        if (a.npos)
            return cli_usage(verb, "no arguments expected");
        struct ls_ctx l = {.json = a.json, .arr = a.json ? json_object_new_array() : NULL};
        if (l.arr) /* what could be listed, also when the listing failed (with "error") */
            json_object_object_add(cli_out(), "vms", l.arr);
        rc = (cli_socket ? cli_client_vm_list : vmsnap_vm_list)(&a.o, ls_cb, &l, &e);
        if (rc == 0)
            ls_header(&l); /* no VMs: the header alone */
        return rc < 0 ? cli_fail(verb, &e) : EXIT_OK;
    }
    if (a.npos < 1)
        return cli_usage(verb, "missing VM name");
    const char *name = a.pos[0];
    if (!strcmp(sub, "run")) {
        if (a.npos != 1)
            return cli_usage(verb, "expected NAME only");
        if (!a.run.kernel)
            return cli_usage(verb, "--kernel is required");
        rc = (cli_socket ? cli_client_vm_run : vmsnap_vm_run)(&a.o, name, &a.run, &t, &e);
    } else if (!strcmp(sub, "pause")) {
        if (a.npos != 1)
            return cli_usage(verb, "expected NAME only");
        rc = (cli_socket ? cli_client_vm_pause : vmsnap_vm_pause)(&a.o, name, &t, &e);
    } else if (!strcmp(sub, "suspend")) {
        if (a.npos != 2)
            return cli_usage(verb, "expected NAME URL");
        rc = (cli_socket ? cli_client_vm_suspend : vmsnap_vm_suspend)(&a.o, name, a.pos[1], &t, &e);
    } else if (!strcmp(sub, "resume")) {
        if (a.npos > 2)
            return cli_usage(verb, "expected NAME [URL]");
        if ((a.run.kernel || a.run.initrd || a.o.asset_dirs) && a.npos != 2)
            return cli_usage(verb,
                             "--kernel, --initrd and --asset-dir apply to a resume from a URL");
        a.o.kernel = a.run.kernel;
        a.o.initrd = a.run.initrd;
        rc = (cli_socket ? cli_client_vm_resume
                         : vmsnap_vm_resume)(&a.o, name, a.npos == 2 ? a.pos[1] : NULL, &t, &e);
    } else if (!strcmp(sub, "stop")) {
        if (a.npos != 1)
            return cli_usage(verb, "expected NAME only");
        bool graceful = false;
        rc = (cli_socket ? cli_client_vm_shutdown : vmsnap_vm_shutdown)(&a.o, name, a.rm, a.timeout,
                                                                        &graceful, &e);
        if (rc < 0)
            return cli_fail(verb, &e);
        if (a.json) {
            json_object_object_add(cli_out(), "op", json_object_new_string("stop"));
            json_object_object_add(cli_out(), "removed", json_object_new_boolean(a.rm));
            json_object_object_add(cli_out(), "graceful", json_object_new_boolean(graceful));
        }
        return EXIT_OK;
    } else if (!strcmp(sub, "console")) {
        if (a.npos != 1)
            return cli_usage(verb, "expected NAME only");
        return console(&a, name);
    } else {
        return cli_usage("vm", "unknown subcommand '%s'", sub);
    }
    if (rc < 0)
        return cli_fail(verb, &e);
    report(sub, name, &t, a.json);
    return EXIT_OK;
}
