/* SPDX-License-Identifier: Apache-2.0 */
/* The man pages (man(7) macros), from the verb table, the option tables, the exit codes and
 * the environment and files listed here: `vmsnap help --man DIR` writes vmsnap.1, one page per
 * verb group (the verb table's `page`) and, for each verb of a group named after another, a
 * page that sources the group's (.so), so that `man vmsnap-pull` finds vmsnap-push(1). The build
 * runs it; tests/integration/cli_docs.sh checks the pages with groff -ww and man --warnings.
 *
 * The help text is written for the terminal: lines of prose (filled by roff here) and lines
 * indented by two spaces (kept as they are). */
#include "cli.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The groups' pages, in the order SEE ALSO lists them. */
static const struct page {
    const char *name, *summary, *intro;
} pages[] = {
    {"vmsnap-pack", "encode, decode and inspect snapshot images",
     "An image is a zstd stream: a header, one independent frame per source range holding that "
     "range's data extents with all-zero pages elided, and a seek table, so that it decodes in "
     "parallel and in part. Plain zstd and the reference system's single-stream images decode "
     "too."},
    {"vmsnap-push", "move snapshot sets and images to and from object stores",
     "A URL is a local path or file:///abs (a directory used as a store), s3://bucket/key (S3 "
     "and compatible stores; credentials, region and endpoint as the AWS CLI finds them) or "
     "gs://bucket/key (Cloud Storage's XML API). A snapshot set is a directory of files (guest "
     "memory, disks, state) stored with a manifest; a layered set shares unchanged pages with "
     "its parent."},
    {"vmsnap-vm", "run micro-VMs under QEMU and suspend and resume them through object stores",
     "A VM is recorded in the state directory; its RAM is a file on tmpfs, so a pause or a "
     "suspend writes it out without the guest's help and a resume maps or loads it back."},
    {"vmsnap-disk", "make, clone and describe writable upper disks",
     "An upper disk is a sparse, journal-less ext4 image made through libext2fs, without "
     "mounting anything."},
    {"vmsnap-cache", "the page cache of snapshot files and the node's object cache",
     "Snapshot files are read once and should not stay in the page cache next to the guests; "
     "the object cache keeps what pulls fetched from stores, by digest, under a byte cap."},
};

/* The environment: every variable vmsnap reads (tests/integration/cli_docs.sh compares this
 * list with the names in the sources). */
static const struct {
    const char *name, *what;
} env[] = {
    {"AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN",
     "S3 keys (the first source of the credential chain)."},
    {"AWS_PROFILE, AWS_DEFAULT_PROFILE", "The profile of the shared files (default: default)."},
    {"AWS_SHARED_CREDENTIALS_FILE, AWS_CONFIG_FILE",
     "The shared files (default: ~/.aws/credentials, ~/.aws/config)."},
    {"AWS_REGION, AWS_DEFAULT_REGION", "The S3 region (default: the profile's, else us-east-1)."},
    {"AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL", "The S3 endpoint (default: AWS's regional one)."},
    {"AWS_ENDPOINT_URL_STS", "The STS endpoint of web identity credentials."},
    {"AWS_IGNORE_CONFIGURED_ENDPOINT_URLS",
     "true: ignore the endpoints of the environment and the config file."},
    {"AWS_S3_USE_PATH_STYLE", "true: path-style S3 URLs."},
    {"VMSNAP_S3_ATTEMPTS, AWS_MAX_ATTEMPTS", "Attempts per S3 request (default 6)."},
    {"VMSNAP_S3_CONNECT_TIMEOUT_MS", "The S3 connect timeout (default 10000)."},
    {"VMSNAP_S3_STALL_SECONDS",
     "A request that moves no byte for this long is aborted and retried (default 30)."},
    {"AWS_CA_BUNDLE, CURL_CA_BUNDLE, SSL_CERT_FILE, SSL_CERT_DIR",
     "The CAs to trust, in this order (default: the system's)."},
    {"AWS_WEB_IDENTITY_TOKEN_FILE, AWS_ROLE_ARN, AWS_ROLE_SESSION_NAME",
     "Web identity credentials (EKS service accounts): the token file and the role."},
    {"AWS_CONTAINER_CREDENTIALS_RELATIVE_URI, AWS_CONTAINER_CREDENTIALS_FULL_URI",
     "Container credentials (ECS, EKS Pod Identity): the endpoint."},
    {"AWS_CONTAINER_AUTHORIZATION_TOKEN, AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",
     "Container credentials: the token sent to the endpoint."},
    {"AWS_EC2_METADATA_DISABLED", "true: no instance metadata (IMDSv2) credentials."},
    {"AWS_EC2_METADATA_SERVICE_ENDPOINT, AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE",
     "The instance metadata address (default http://169.254.169.254; IPv6 mode: "
     "http://[fd00:ec2::254])."},
    {"AWS_METADATA_SERVICE_TIMEOUT, AWS_METADATA_SERVICE_NUM_ATTEMPTS",
     "Instance metadata: seconds per attempt (default 1) and attempts (default 2)."},
    {"VMSNAP_CREDS_REFRESH_SECONDS",
     "Temporary credentials are refreshed this long before they expire (default 300)."},
    {"GS_ACCESS_KEY_ID, GS_SECRET_ACCESS_KEY", "HMAC keys of gs:// stores (else the AWS pair)."},
    {"VMSNAP_GS_ENDPOINT", "The endpoint of gs:// stores."},
    {"GOOGLE_APPLICATION_CREDENTIALS",
     "gs:// without HMAC keys: a service-account key or authorized-user file (OAuth tokens)."},
    {"CLOUDSDK_CONFIG", "gcloud's directory (application_default_credentials.json)."},
    {"GCE_METADATA_HOST, GCE_METADATA_TIMEOUT, NO_GCE_CHECK",
     "The GCE metadata server's address (default 169.254.169.254), its connect timeout in "
     "seconds (default 1); NO_GCE_CHECK=true: never ask it."},
    {"VMSNAP_LAYOUT", "push's layout when --layout is not given: layered or reference."},
    {"VMSNAP_CACHE_DIR, VMSNAP_CACHE_SIZE", "The object cache's directory and cap (default 8G)."},
    {"XDG_CACHE_HOME, HOME", "The object cache's default directory: ~/.cache/vmsnap."},
    {"TMPDIR", "Where export decodes a set (default /var/tmp)."},
    {"VMSNAP_SOCKET", "The node daemon's socket, as --socket PATH: the verbs it covers go to it."},
    {"VMSNAP_STATE_DIR", "Where VMs are recorded (default /var/lib/vmsnap)."},
    {"VMSNAP_RAM_DIR", "Guest RAM files, on tmpfs or hugetlbfs (default /dev/shm)."},
    {"VMSNAP_QEMU", "The QEMU binary (default qemu-system-x86_64)."},
    {"VMSNAP_ASSET_DIRS",
     "Colon-separated directories that the kernel and initrd a set names may be in."},
    {"VMSNAP_QMP_TIMEOUT", "Seconds a QMP reply may take, 1 to 3600 (default 60)."},
    {"VMSNAP_QEMU_SANDBOX", "0: start QEMU without -sandbox (a QEMU built without seccomp)."},
    {"VMSNAP_FAILPOINT", "A test hook (the crash tests); never set it otherwise."},
};

static const struct {
    const char *path, *what;
} files[] = {
    {"~/.aws/credentials, ~/.aws/config", "The AWS shared files (profiles, region, endpoint)."},
    {"/var/lib/vmsnap", "The VMs' state directory (VMSNAP_STATE_DIR, --state-dir)."},
    {"/dev/shm", "The guests' RAM files (VMSNAP_RAM_DIR, --ram-dir)."},
    {"/var/cache/vmsnap, ~/.cache/vmsnap",
     "The object cache, for root and for other users (VMSNAP_CACHE_DIR, --cache-dir)."},
};

/* ---- roff text ---- */

/* `s` (up to `len` bytes) as roff text on a line being written: \ as \e, - as \- (a minus sign
 * that copies as one). `bol`: the line starts here (a leading . or ' would be a request). */
static void rput(FILE *f, const char *s, size_t len, bool bol)
{
    if (bol && len && (s[0] == '.' || s[0] == '\''))
        fputs("\\&", f);
    for (size_t i = 0; i < len && s[i]; i++) {
        if (s[i] == '\\')
            fputs("\\e", f);
        else if (s[i] == '-')
            fputs("\\-", f);
        else
            fputc(s[i], f);
    }
}

static void rline(FILE *f, const char *s)
{
    rput(f, s, strlen(s), true);
    fputc('\n', f);
}

/* help text: prose lines filled into paragraphs, lines indented by two spaces kept as they are */
static void rhelp(FILE *f, const char *text)
{
    bool lit = false, para = false;
    for (const char *p = text; *p;) {
        size_t n = strcspn(p, "\n");
        bool indented = n > 2 && p[0] == ' ' && p[1] == ' ';
        if (indented && !lit) {
            fputs(".RS 2\n.nf\n", f);
            lit = true;
        } else if (!indented && lit) {
            fputs(".fi\n.RE\n", f);
            lit = false;
        }
        if (!indented && !para) {
            fputs(".PP\n", f);
            para = true;
        }
        size_t skip = indented ? 2 : strspn(p, " ");
        if (n > skip) {
            rput(f, p + skip, n - skip, true);
            fputc('\n', f);
        }
        p += n;
        p += *p == '\n';
    }
    if (lit)
        fputs(".fi\n.RE\n", f);
}

/* "vm run NAME --kernel K ...": the command in bold, the rest as it is */
static void rsynopsis(FILE *f, const char *syn, const char *cmd)
{
    size_t n = strlen(cmd);
    fputs(".PP\n\\fBvmsnap ", f);
    rput(f, syn, n, false);
    fputs("\\fR", f);
    rput(f, syn + n, strlen(syn + n), false);
    fputc('\n', f);
}

static void rth(FILE *f, const char *name)
{
    char date[32] = "";
    const char *sde = getenv("SOURCE_DATE_EPOCH"); /* reproducible builds: the date given */
    if (sde && *sde) {
        time_t t = (time_t)strtoll(sde, NULL, 10);
        struct tm tm;
        if (gmtime_r(&t, &tm))
            strftime(date, sizeof(date), "%Y-%m-%d", &tm);
    }
    fputs(".\\\" Generated by the build (vmsnap help --man DIR) from the tables vmsnap parses its\n"
          ".\\\" command line with; edits here are lost.\n.TH ",
          f);
    for (const char *c = name; *c; c++)
        if (*c == '-')
            fputs("\\-", f);
        else
            fputc(toupper((unsigned char)*c), f);
    fprintf(f, " 1 \"%s\" \"vmsnap %s\" \"vmsnap manual\"\n", date, vmsnap_version());
    fputs(".nh\n.ad l\n", f); /* option names and paths are not hyphenated, nor spread out */
}

/* ---- the options ---- */

static void ropt(FILE *f, const struct cli_opt *o, const char *who)
{
    fputs(".TP\n", f);
    if (o->letter)
        fprintf(f, "\\fB\\-%c\\fR%s", o->letter, o->name ? ", " : "");
    if (o->name) {
        fputs("\\fB\\-\\-", f);
        rput(f, o->name, strlen(o->name), false);
        fputs("\\fR", f);
    }
    if (o->arg) {
        fputs(" \\fI", f);
        rput(f, o->arg, strlen(o->arg), false);
        fputs("\\fR", f);
    }
    fputc('\n', f);
    if (*who) { /* "run, resume: the guest kernel ..." */
        fputs("\\fI", f);
        rput(f, who, strlen(who), false);
        fputs(":\\fR ", f);
    }
    rput(f, o->help, strlen(o->help), !*who);
    fputs(".\n", f);
}

/* "push, pull, export, ls, rm and gc", "vm run, pause, ... and console", "cache objects and trim"
 */
static void rusers(FILE *f, const struct cli_group *g)
{
    for (size_t i = 0; i < g->n; i++) {
        const struct cli_user *u = &g->users[i];
        fputs(i == 0 ? "" : i + 1 == g->n ? " and " : ", ", f);
        if (u->sub && (i == 0 || g->users[i - 1].verb != u->verb))
            fprintf(f, "%s ", u->verb->name);
        fputs(cli_user_key(u), f);
    }
}

static void roptions(FILE *f, const struct cli_verb *const *vs, size_t n)
{
    struct cli_group g[16];
    size_t ng = cli_groups(vs, n, g, 16);
    if (!ng)
        return;
    fputs(".SH OPTIONS\n", f);
    for (size_t k = 0; k < ng; k++) {
        fputs(".SS \"Options of ", f);
        rusers(f, &g[k]);
        fputs("\"\n", f);
        bool some_only = false;
        for (const struct cli_opt *o = g[k].opts; o->name || o->letter; o++) {
            char who[128];
            if (cli_group_row(&g[k], o, who, sizeof(who)))
                some_only = some_only || *who;
        }
        if (some_only && g[k].users[0].verb->unused_ignored)
            fputs(".PP\nEach takes every option below and ignores those it does not use; the "
                  "ones that use an option are named before its description.\n",
                  f);
        else if (some_only)
            fputs(".PP\nAn option named for some of them only is refused by the others.\n", f);
        for (const struct cli_opt *o = g[k].opts; o->name || o->letter; o++) {
            char who[128];
            if (cli_group_row(&g[k], o, who, sizeof(who)))
                ropt(f, o, who);
        }
    }
    fputs(
        ".PP\nAnd as for every verb: \\fB\\-h\\fR, \\fB\\-\\-help\\fR, \\fB\\-q\\fR, \\fB\\-v\\fR "
        "and \\fB\\-vv\\fR; see\n.BR vmsnap (1).\n",
        f);
}

/* ---- the pages ---- */

static void see_also(FILE *f, const char *self)
{
    fputs(".SH SEE ALSO\n", f);
    const char *sep = "";
    if (strcmp(self, "vmsnap"))
        fputs(".BR vmsnap (1)", f), sep = ",\n";
    for (size_t i = 0; i < sizeof(pages) / sizeof(pages[0]); i++)
        if (strcmp(self, pages[i].name)) {
            fprintf(f, "%s.BR ", sep);
            rput(f, pages[i].name, strlen(pages[i].name), false);
            fputs(" (1)", f);
            sep = ",\n";
        }
    fputs(",\n.BR zstd (1),\n.BR qemu\\-system\\-x86_64 (1).\n.PP\nThe documents under docs/ in "
          "vmsnap's source: ARCHITECTURE.md, cli.md (the contract for scripts), "
          "credentials.md, transfer.md, vm.md.\n",
          f);
}

static void group_page(FILE *f, const struct page *pg)
{
    size_t n;
    const struct cli_verb *all = cli_verbs(&n), *vs[32];
    size_t k = 0;
    for (size_t i = 0; i < n && k < 32; i++)
        if (!strcmp(all[i].page, pg->name))
            vs[k++] = &all[i];
    rth(f, pg->name);
    fputs(".SH NAME\n", f);
    for (size_t i = 0; i < k; i++)
        fprintf(f, "%svmsnap\\-%s", i ? ", " : "", vs[i]->name);
    fputs(" \\- ", f);
    rline(f, pg->summary);
    fputs(".SH SYNOPSIS\n", f);
    for (size_t i = 0; i < k; i++) {
        if (!vs[i]->subs)
            rsynopsis(f, vs[i]->synopsis, vs[i]->name);
        for (const struct cli_sub *s = vs[i]->subs; s && s->name; s++) {
            char cmd[64];
            snprintf(cmd, sizeof(cmd), "%s %s", vs[i]->name, s->name);
            rsynopsis(f, s->synopsis, cmd);
        }
    }
    fputs(".SH DESCRIPTION\n.PP\n", f);
    rline(f, pg->intro);
    for (size_t i = 0; i < k; i++) {
        fprintf(f, ".SS %s\n", vs[i]->name);
        for (const struct cli_sub *s = vs[i]->subs; s && s->name; s++) {
            fprintf(f, ".TP\n.B %s %s\n", vs[i]->name, s->name);
            rput(f, s->summary, strlen(s->summary), true);
            fputs(".\n", f);
        }
        rhelp(f, vs[i]->help);
    }
    roptions(f, vs, k);
    fputs(".SH EXIT STATUS\n.PP\nAs for every verb: 0 on success, 2 for a usage error, 1 and 3 "
          "to 7 for the classes of failure, 128 + the signal when interrupted; see\n"
          ".BR vmsnap (1).\n",
          f);
    see_also(f, pg->name);
}

static void main_page(FILE *f)
{
    size_t n;
    const struct cli_verb *vs = cli_verbs(&n);
    rth(f, "vmsnap");
    fputs(
        ".SH NAME\nvmsnap \\- snapshot micro-VMs: encode guest memory and disks, move them to and "
        "from object stores, run the VMs under QEMU\n.SH SYNOPSIS\n.PP\n\\fBvmsnap\\fR "
        "[\\fB\\-q\\fR] [\\fB\\-v\\fR|\\fB\\-vv\\fR] [\\fB\\-\\-json\\fR] \\fIVERB\\fR "
        "[\\fIARGS\\fR]\n.PP\n\\fBvmsnap help\\fR [\\fIVERB\\fR]\n.PP\n\\fBvmsnap "
        "\\-\\-version\\fR\n.SH DESCRIPTION\n.PP\n"
        "vmsnap is the node-side data plane for micro-VM sandboxes: it turns a guest's RAM "
        "image and disks into compact objects quickly, moves them to and from object storage "
        "(S3, Cloud Storage, a local directory) and turns them back into files a VMM restores "
        "from, without leaving snapshot pages in the node's memory.\n.PP\n"
        "Each verb is described in the page of its group; \\fBvmsnap help\\fR \\fIVERB\\fR "
        "prints the same text.\n.SH VERBS\n",
        f);
    for (size_t i = 0; i < n; i++) {
        fprintf(f, ".TP\n.B %s\n", vs[i].name);
        rput(f, vs[i].summary, strlen(vs[i].summary), true);
        if (strcmp(vs[i].page, "vmsnap")) {
            fputs("; see\n.BR ", f);
            rput(f, vs[i].page, strlen(vs[i].page), false);
            fputs(" (1).\n", f);
        } else
            fputs(".\n", f);
    }
    fputs(".SH OPTIONS\n.PP\nBefore the verb:\n", f);
    for (const struct cli_opt *o = cli_global_opts; o->name || o->letter; o++)
        ropt(f, o, "");
    fputs(".PP\nOf these, \\fB\\-q\\fR and \\fB\\-v\\fR (\\fB\\-vv\\fR, and clusters such as "
          "\\fB\\-qv\\fR) are taken anywhere on the command line: before the verb, between a "
          "verb and its sub-verb, after either. After a verb, \\fB\\-h\\fR or \\fB\\-\\-help\\fR "
          "prints its help, and \\fB\\-\\-json\\fR is one of the options of every verb that "
          "reports.\n.SH EXIT STATUS\n",
          f);
    for (size_t i = 0; cli_exits[i].code; i++) {
        fprintf(f, ".TP\n.B %s\n", cli_exits[i].code);
        rline(f, cli_exits[i].what);
    }
    fputs(".PP\nWith \\fB\\-\\-json\\fR a failure prints one JSON object on stdout with the "
          "code, its class and the message.\n.SH ENVIRONMENT\n",
          f);
    for (size_t i = 0; i < sizeof(env) / sizeof(env[0]); i++) {
        fputs(".TP\n.B ", f);
        rline(f, env[i].name);
        rline(f, env[i].what);
    }
    fputs(".SH FILES\n", f);
    for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
        fputs(".TP\n.I ", f);
        rline(f, files[i].path);
        rline(f, files[i].what);
    }
    see_also(f, "vmsnap");
}

/* DIR/NAME.1: the group page `pg`, vmsnap(1) (pg NULL) or, with `so`, a page that sources
 * man1/SO.1. */
static int write_page(const char *dir, const char *name, const struct page *pg, const char *so)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s.1", dir, name);
    FILE *f = fopen(path, "we");
    if (!f)
        return cli_fail_code("help", errno, "%s: %s", path, strerror(errno));
    if (so)
        fprintf(f, ".so man1/%s.1\n", so);
    else if (pg)
        group_page(f, pg);
    else
        main_page(f);
    bool ok = !ferror(f);
    if (fclose(f) != 0 || !ok)
        return cli_fail_code("help", EIO, "%s: write failed", path);
    return EXIT_OK;
}

int cli_doc_man(int argc, char **argv)
{
    if (argc != 2)
        return cli_usage("help", "--man wants the directory to write the pages to");
    if (cli_doc_check() < 0)
        return EXIT_FAIL;
    size_t n;
    const struct cli_verb *vs = cli_verbs(&n);
    for (size_t i = 0; i < n; i++) { /* every verb's page is one of the table above */
        bool found = !strcmp(vs[i].page, "vmsnap");
        for (size_t k = 0; k < sizeof(pages) / sizeof(pages[0]); k++)
            found = found || !strcmp(vs[i].page, pages[k].name);
        if (!found)
            return cli_fail_code("help", EINVAL, "verb %s: no man page %s", vs[i].name, vs[i].page);
    }
    int rc = write_page(argv[1], "vmsnap", NULL, NULL);
    for (size_t k = 0; rc == EXIT_OK && k < sizeof(pages) / sizeof(pages[0]); k++)
        rc = write_page(argv[1], pages[k].name, &pages[k], NULL);
    for (size_t i = 0; rc == EXIT_OK && i < n; i++) {
        char name[64];
        snprintf(name, sizeof(name), "vmsnap-%s", vs[i].name);
        if (strcmp(vs[i].page, "vmsnap") && strcmp(vs[i].page, name))
            rc = write_page(argv[1], name, NULL, vs[i].page);
    }
    return rc;
}
