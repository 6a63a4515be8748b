/* SPDX-License-Identifier: Apache-2.0 */
/* vmsnap disk create|clone|info: writable upper disks (see include/vmsnap/disk.h). */
#include "cli.h"
#include "vmsnap/disk.h"

#include <errno.h>
#include <getopt.h> /* optarg, optind */
#include <inttypes.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const struct cli_opt cli_disk_create_opts[] = {
    {"json", 0, 'J', NULL, CLI_K_NONE, NULL, NULL, "what disk info says of the new image, as JSON"},
    {"size", 0, 's', "SIZE", CLI_K_NONE, NULL, NULL, "the image's size, 1M to 16T (default 4G)"},
    {"inodes", 0, 'i', "N", CLI_K_NONE, NULL, NULL,
     "the number of inodes (default: one per 16 KiB)"},
    {"label", 0, 'L', "L", CLI_K_NONE, NULL, NULL, "the file system label, up to 16 bytes"},
    {"uuid", 0, 'U', "U", CLI_K_NONE, NULL, NULL, "the file system UUID (default: a random one)"},
    {"add", 0, 'a', "SRC:DEST[:MODE[:UID:GID]]", CLI_K_FILE, NULL, NULL,
     "copy the file SRC into the image as DEST (repeatable)"},
    {"mkdir", 0, 'm', "DEST[:MODE[:UID:GID]]", CLI_K_NONE, NULL, NULL,
     "make the directory DEST in the image (repeatable)"},
    {"from-dir", 0, 'd', "DIR", CLI_K_DIR, NULL, NULL,
     "copy the tree under DIR to the image's root (as mke2fs -d)"},
    {"force", 'f', 'f', NULL, CLI_K_NONE, NULL, NULL, "replace an existing IMAGE"},
    {"fsync", 0, 'S', NULL, CLI_K_NONE, NULL, NULL, "make IMAGE durable before it appears"},
    CLI_OPT_END,
};

const struct cli_opt cli_disk_clone_opts[] = {
    {"json", 0, 'J', NULL, CLI_K_NONE, NULL, NULL, "how it was copied, as JSON"},
    {"link", 0, 'l', NULL, CLI_K_NONE, NULL, NULL,
     "a hard link when SRC and DST are on one file system (shares the superblock)"},
    {"new-uuid", 0, 'u', NULL, CLI_K_NONE, NULL, NULL, "give the copy a new file system UUID"},
    {"force", 'f', 'f', NULL, CLI_K_NONE, NULL, NULL,
     "replace an existing DST; with --new-uuid, add metadata_csum_seed where needed"},
    {"direct", 0, 'd', NULL, CLI_K_NONE, NULL, NULL,
     "copy with O_DIRECT: nothing left in the page cache"},
    CLI_OPT_END,
};

const struct cli_opt cli_disk_info_opts[] = {
    {"json", 0, 'j', NULL, CLI_K_NONE, NULL, NULL, "the description as one JSON object on stdout"},
    CLI_OPT_END,
};

const struct cli_sub cli_disk_subs[] = {
    {"create",
     "disk create [--json] [--size SIZE] [--inodes N] [--label L] [--uuid U] [-f|--force] "
     "[--fsync] [--add SRC:DEST[:MODE[:UID:GID]]]... [--mkdir DEST[:MODE[:UID:GID]]]... "
     "[--from-dir DIR] IMAGE",
     "make a sparse journal-less ext4 image", cli_disk_create_opts, "file"},
    {"clone", "disk clone [--json] [--link] [--new-uuid] [-f|--force] [--direct] SRC DST",
     "copy an image (FICLONE, else a hole-keeping copy)", cli_disk_clone_opts, "file file"},
    {"info", "disk info [--json] IMAGE", "describe an image", cli_disk_info_opts, "file"},
    {NULL, NULL, NULL, NULL, NULL},
};

/* disk --help: every sub-verb's usage */
static int disk_help(void)
{
    for (size_t i = 0; cli_disk_subs[i].name; i++)
        printf("%s vmsnap %s\n", i ? "      " : "usage:", cli_disk_subs[i].synopsis);
    return EXIT_OK;
}

static int fail(const char *sub, const struct vmsnap_err *e)
{
    /* Library messages already start with "disk <sub> <image>:". */
    if (strncmp(e->msg, "disk ", 5) == 0)
        return cli_fail_code("", e->code, "%s", e->msg);
    char verb[32];
    snprintf(verb, sizeof(verb), "disk %s", sub);
    return cli_fail(verb, e);
}

/* Parse ":MODE[:UID:GID]" (the part after DEST) into e. */
static int parse_attrs(char *rest, struct vmsnap_disk_entry *e)
{
    e->mode = -1;
    e->uid = e->gid = -1;
    if (!rest)
        return 0;
    char *uid = strchr(rest, ':');
    char *gid = NULL;
    if (uid) {
        *uid++ = '\0';
        gid = strchr(uid, ':');
        if (!gid)
            return -EINVAL;
        *gid++ = '\0';
    }
    char *end;
    if (*rest) {
        unsigned long m = strtoul(rest, &end, 8);
        if (*end || m > 07777)
            return -EINVAL;
        e->mode = (int32_t)m;
    }
    unsigned long v;
    if (uid && *uid) {
        if (cli_parse_uint(uid, 0, 0xFFFFFFFFul, &v) < 0)
            return -EINVAL;
        e->uid = (int64_t)v;
    }
    if (gid && *gid) {
        if (cli_parse_uint(gid, 0, 0xFFFFFFFFul, &v) < 0)
            return -EINVAL;
        e->gid = (int64_t)v;
    }
    return 0;
}

/* --add SRC:DEST[:MODE[:UID:GID]] (c 'a') or --mkdir DEST[:MODE[:UID:GID]] into e (the argument
 * is cut at its colons); 0, or the exit code of the usage error printed. */
static int parse_entry(int c, char *arg, struct vmsnap_disk_entry *e)
{
    char given[4096]; /* arg is cut at its colons below; messages show it whole */
    snprintf(given, sizeof(given), "%s", arg);
    char *s = arg;
    if (c == 'a') {
        char *colon = strchr(s, ':');
        if (!colon || colon == s || !colon[1])
            return cli_usage("disk", "create: --add wants SRC:DEST[:MODE[:UID:GID]], got '%s'",
                             arg);
        *colon = '\0';
        e->op = VMSNAP_DISK_ADD;
        e->src = s;
        s = colon + 1;
    } else {
        e->op = VMSNAP_DISK_MKDIR;
    }
    char *rest = strchr(s, ':');
    if (rest)
        *rest++ = '\0';
    e->dest = s;
    if (parse_attrs(rest, e) < 0)
        return cli_usage("disk", "create: bad MODE[:UID:GID] in '%s' (octal mode, numbers)", given);
    return 0;
}

/* --json: what disk info (and create) report, in the run's object. */
static void info_json(const struct vmsnap_disk_info *ip)
{
    json_object *o = cli_out();
    json_object_object_add(o, "logical_bytes", json_object_new_int64((int64_t)ip->virtual_size));
    json_object_object_add(o, "allocated_bytes", json_object_new_int64((int64_t)ip->allocated));
    json_object_object_add(o, "block_bytes", json_object_new_int64(ip->block_size));
    json_object_object_add(o, "blocks_total", json_object_new_int64((int64_t)ip->blocks_total));
    json_object_object_add(o, "blocks_free", json_object_new_int64((int64_t)ip->blocks_free));
    json_object_object_add(o, "blocks_used",
                           json_object_new_int64((int64_t)(ip->blocks_total - ip->blocks_free)));
    json_object_object_add(o, "inodes_total", json_object_new_int64((int64_t)ip->inodes_total));
    json_object_object_add(o, "inodes_free", json_object_new_int64((int64_t)ip->inodes_free));
    json_object_object_add(o, "inodes_used",
                           json_object_new_int64((int64_t)(ip->inodes_total - ip->inodes_free)));
    json_object_object_add(o, "uuid", json_object_new_string(ip->uuid_str));
    /* bytes from the image: cli_json_line escapes them as every name in JSON */
    json_object_object_add(o, "label", json_object_new_string(ip->label));
    json_object *f = json_object_new_array();
    char feats[sizeof(ip->features)];
    memcpy(feats, ip->features, sizeof(feats));
    char *save = NULL;
    for (char *t = strtok_r(feats, " ", &save); t; t = strtok_r(NULL, " ", &save))
        json_object_array_add(f, json_object_new_string(t));
    json_object_object_add(o, "features", f);
    json_object_object_add(o, "clean", json_object_new_boolean(ip->clean));
    json_object_object_add(o, "mount_count", json_object_new_int64(ip->mount_count));
    json_object_object_add(o, "mkfs_time", json_object_new_int64(ip->mkfs_time));
    json_object_object_add(o, "write_time", json_object_new_int64(ip->write_time));
}

static int disk_create(int argc, char **argv)
{
    struct vmsnap_disk_create_opts o = {0};
    struct vmsnap_disk_entry *ents = calloc((size_t)argc, sizeof(*ents));
    uint8_t uuid[16];
    int rc = EXIT_USAGE;
    if (!ents)
        return cli_fail_code("disk create", ENOMEM, "out of memory");
    size_t n = 0;
    int c;
    optind = 1;
    while ((c = cli_getopt(argc, argv, cli_disk_create_opts)) != -1) {
        switch (c) {
        case 'J':
            cli_json = true;
            break;
        case 's':
            if (cli_parse_size(optarg, &o.size) < 0 || o.size < VMSNAP_DISK_MIN_SIZE ||
                o.size > VMSNAP_DISK_MAX_SIZE + 4095) {
                rc =
                    cli_usage("disk", "create: --size '%s': expected 1M to 16T less 4 KiB", optarg);
                goto out;
            }
            break;
        case 'i': {
            unsigned long v;
            if (cli_parse_uint(optarg, 1, 0xFFFFFFF0ul, &v) < 0) {
                rc = cli_usage("disk", "create: bad --inodes '%s' (1 to 4294967280)", optarg);
                goto out;
            }
            o.inodes = v;
            break;
        }
        case 'L':
            if (strlen(optarg) > VMSNAP_DISK_LABEL_MAX) {
                rc = cli_usage("disk", "create: --label '%s' is longer than 16 bytes", optarg);
                goto out;
            }
            o.label = optarg;
            break;
        case 'U':
            if (vmsnap_disk_parse_uuid(optarg, uuid) < 0) {
                rc = cli_usage("disk", "create: bad --uuid '%s' (want xxxxxxxx-xxxx-...)", optarg);
                goto out;
            }
            o.uuid = uuid;
            break;
        case 'a':
        case 'm':
            if ((rc = parse_entry(c, optarg, &ents[n])) != 0)
                goto out;
            n++;
            break;
        case 'd':
            o.from_dir = optarg;
            break;
        case 'f':
            o.force = true;
            break;
        case 'S':
            o.fsync = true;
            break;
        case 'h':
            rc = cli_sub_help("disk", &cli_disk_subs[0]);
            goto out;
        default:
            rc = cli_usage("disk", "create: unknown option");
            goto out;
        }
    }
    if (optind != argc - 1 || !argv[optind][0]) {
        rc = cli_usage("disk", "create wants exactly one IMAGE (a non-empty path)");
        goto out;
    }
    o.entries = ents;
    o.n_entries = n;
    cli_subject("path", argv[optind]);
    struct vmsnap_err e = {0};
    rc = (cli_socket ? cli_client_disk_create : vmsnap_disk_create)(argv[optind], &o, &e) < 0
             ? fail("create", &e)
             : EXIT_OK;
    struct vmsnap_disk_info in;
    if (rc == EXIT_OK && cli_json) /* what disk info says of the new image */
        rc = (cli_socket ? cli_client_disk_info : vmsnap_disk_info)(argv[optind], &in, &e) < 0
                 ? fail("create", &e)
                 : (info_json(&in), EXIT_OK);
out:
    free(ents);
    return rc;
}

static int disk_clone(int argc, char **argv)
{
    struct vmsnap_disk_clone_opts o = {0};
    int c;
    optind = 1;
    while ((c = cli_getopt(argc, argv, cli_disk_clone_opts)) != -1) {
        switch (c) {
        case 'J':
            cli_json = true;
            break;
        case 'l':
            o.link = true;
            break;
        case 'u':
            o.new_uuid = true;
            break;
        case 'f':
            o.force = true;
            break;
        case 'd':
            o.direct = true;
            break;
        case 'h':
            return cli_sub_help("disk", &cli_disk_subs[1]);
        default:
            return cli_usage("disk", "clone: unknown option");
        }
    }
    if (optind != argc - 2 || !argv[optind][0] || !argv[optind + 1][0])
        return cli_usage("disk", "clone wants SRC DST (non-empty paths: an empty DST failed only "
                                 "after the whole copy)");
    if (o.link && o.new_uuid)
        return cli_usage("disk", "clone: --link and --new-uuid exclude each other (a link shares "
                                 "the source's superblock)");
    cli_subject("source_path", argv[optind]);
    cli_subject("path", argv[optind + 1]);
    struct vmsnap_err e = {0};
    enum vmsnap_disk_clone_how how;
    if ((cli_socket ? cli_client_disk_clone : vmsnap_disk_clone)(argv[optind], argv[optind + 1], &o,
                                                                 &how, &e) < 0)
        return fail("clone", &e);
    static const char *const names[] = {"link", "ficlone", "extents", "read-write", "direct"};
    if (cli_json)
        json_object_object_add(cli_out(), "method", json_object_new_string(names[how]));
    if (cli_verbose) {
        static char s[CLI_PRINTABLE_MAX], d[CLI_PRINTABLE_MAX];
        fprintf(stderr, "vmsnap disk clone: %s -> %s (%s)\n",
                cli_printable(s, sizeof(s), argv[optind]),
                cli_printable(d, sizeof(d), argv[optind + 1]), names[how]);
    }
    return EXIT_OK;
}

static int disk_info(int argc, char **argv)
{
    int c;
    optind = 1;
    while ((c = cli_getopt(argc, argv, cli_disk_info_opts)) != -1) {
        if (c == 'h')
            return cli_sub_help("disk", &cli_disk_subs[2]);
        if (c != 'j')
            return cli_usage("disk", "info: unknown option");
        cli_json = true;
    }
    if (optind != argc - 1)
        return cli_usage("disk", "info wants exactly one IMAGE");
    cli_subject("path", argv[optind]);
    struct vmsnap_disk_info in;
    struct vmsnap_err e = {0};
    if ((cli_socket ? cli_client_disk_info : vmsnap_disk_info)(argv[optind], &in, &e) < 0)
        return fail("info", &e);
    if (cli_json) {
        info_json(&in);
        return EXIT_OK;
    }
    char a[32], b[32];
    static char path[CLI_PRINTABLE_MAX];
    printf("image:        %s\n", cli_printable(path, sizeof(path), argv[optind]));
    printf("virtual size: %s (%" PRIu64 " bytes)\n", cli_bytes(a, sizeof(a), in.virtual_size),
           in.virtual_size);
    printf("allocated:    %s (%" PRIu64 " bytes)\n", cli_bytes(b, sizeof(b), in.allocated),
           in.allocated);
    printf("uuid:         %s\n", in.uuid_str);
    char label[4 * sizeof(in.label) + 8]; /* bytes from the image: no terminal escapes */
    cli_printable(label, sizeof(label), in.label);
    printf("label:        %s\n", label);
    printf("features:     %s\n", in.features);
    printf("blocks:       %" PRIu64 " used, %" PRIu64 " free, %" PRIu64 " total (%u bytes each)\n",
           in.blocks_total - in.blocks_free, in.blocks_free, in.blocks_total, in.block_size);
    printf("inodes:       %" PRIu64 " used, %" PRIu64 " free, %" PRIu64 " total\n",
           in.inodes_total - in.inodes_free, in.inodes_free, in.inodes_total);
    printf("state:        %s\n", in.clean ? "clean" : "not clean (mounted, or errors recorded)");
    return EXIT_OK;
}

int cmd_disk(int argc, char **argv)
{
    if (argc < 2)
        return cli_usage("disk", "want a subcommand: create, clone or info");
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))
        return disk_help();
    if (!strcmp(argv[1], "create"))
        return disk_create(argc - 1, argv + 1);
    if (!strcmp(argv[1], "clone"))
        return disk_clone(argc - 1, argv + 1);
    if (!strcmp(argv[1], "info"))
        return disk_info(argc - 1, argv + 1);
    return cli_unknown_sub("disk", argv[1], cli_disk_subs);
}
