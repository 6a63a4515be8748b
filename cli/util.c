/* SPDX-License-Identifier: Apache-2.0 */
/* CLI helpers: size parsing, error printing and the exit classes, the one JSON object of a
 * run, option errors with a did-you-mean, the TTY progress line. */
#include "cli.h"
#include "vmsnap/pcache.h"

#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <json.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

bool cli_quiet;
int cli_verbose;
bool cli_json;
const char *cli_verb = "";

/* The progress line is on the terminal (stderr) now: a message clears it first. Progress comes
 * from the library's threads, messages from any thread: one lock. */
static pthread_mutex_t term_mu = PTHREAD_MUTEX_INITIALIZER;
static bool progress_shown;

/* The failure cli_finish puts in the JSON error object: the last message printed and its
 * errno (0: none known). */
static struct {
    bool set;
    int code;
    char msg[2048];
} last_err;

static void record_error(int code, const char *msg)
{
    last_err.set = true;
    last_err.code = code;
    snprintf(last_err.msg, sizeof(last_err.msg), "%s", msg);
}

/* cli_getopt reported an option error: the verb's cli_usage("bad option") that follows is
 * silent. */
static bool opt_error_reported;

int cli_exit_code(int err)
{
    if (err < 0)
        err = -err;
    int sig = vmsnap_cancelled();
    if (sig != 0 || err == ECANCELED || err == EINTR)
        return 128 + (sig > 0 ? sig : SIGINT);
    switch (err) {
    case 0:
        return EXIT_FAIL;
    case ENOENT:
    case ENOTDIR: /* a component of the path is a file */
    case ESRCH:   /* a VM without its QEMU */
        return EXIT_NOT_FOUND;
    case EACCES:
    case EPERM:
    case ENOKEY:
    case EKEYREJECTED:
    case EKEYEXPIRED:
        return EXIT_ACCESS;
    case ECONNREFUSED:
    case ECONNRESET:
    case ECONNABORTED:
    case ENOTCONN:
    case ETIMEDOUT:
    case EHOSTUNREACH:
    case EHOSTDOWN:
    case ENETUNREACH:
    case ENETDOWN:
    case ENETRESET:
    case EAGAIN: /* 5xx and throttling after the retries, "changed meanwhile: try again" */
    case ESTALE: /* an object changed under the operation */
        return EXIT_UNREACHABLE;
    case EBADMSG: /* a damaged image, a bad manifest, a digest mismatch, a hostile name */
    case EPROTO:  /* a malformed answer, a certificate that is not trusted */
    case EILSEQ:
    case EUCLEAN:
    case EFBIG: /* input beyond a limit (--max-size, a manifest's cap) */
        return EXIT_CORRUPT;
    case ENOSPC:
    case EDQUOT:
    case EIO:
    case EROFS:
        return EXIT_LOCAL_IO;
    default:
        return EXIT_FAIL;
    }
}

const char *cli_class_name(int rc)
{
    switch (rc) {
    case EXIT_USAGE:
        return "usage";
    case EXIT_NOT_FOUND:
        return "not_found";
    case EXIT_ACCESS:
        return "access_denied";
    case EXIT_UNREACHABLE:
        return "unreachable";
    case EXIT_CORRUPT:
        return "corrupt";
    case EXIT_LOCAL_IO:
        return "local_io";
    default:
        return rc > 128 ? "interrupted" : "other";
    }
}

/* ---- the run's JSON object ---- */

static json_object *out_obj;
static bool out_streamed;
static struct {
    const char *key, *value;
} subjects[4];
static size_t nsubjects;

json_object *cli_out(void)
{
    if (!out_obj)
        out_obj = json_object_new_object();
    return out_obj;
}

void cli_subject(const char *key, const char *value)
{
    if (nsubjects < sizeof(subjects) / sizeof(subjects[0]) && value)
        subjects[nsubjects].key = key, subjects[nsubjects++].value = value;
}

void cli_out_stream_begin(void)
{
    out_streamed = true;
    fputs("{\"schema\":1", stdout);
}

json_object *cli_json_seconds(double s)
{
    char b[32];
    snprintf(b, sizeof(b), "%.3f", s);
    return json_object_new_double_s(atof(b), b);
}

static void add_subjects(json_object *o)
{
    for (size_t i = 0; i < nsubjects; i++)
        json_object_object_add(o, subjects[i].key, json_object_new_string(subjects[i].value));
}

static json_object *error_obj(int rc)
{
    json_object *e = json_object_new_object();
    json_object_object_add(e, "code", json_object_new_int(rc));
    json_object_object_add(e, "class", json_object_new_string(cli_class_name(rc)));
    json_object_object_add(e, "message",
                           json_object_new_string(last_err.set ? last_err.msg : "failed"));
    const char *en = last_err.code ? strerrorname_np(last_err.code) : NULL;
    json_object_object_add(e, "errno", en ? json_object_new_string(en) : NULL);
    add_subjects(e);
    return e;
}

int cli_finish(int rc)
{
    if (rc == EXIT_FAIL && last_err.code) /* a verb that said 1 for a failure it recorded */
        rc = cli_exit_code(last_err.code);
    if (rc != EXIT_OK && rc != EXIT_USAGE && vmsnap_cancelled() != 0)
        rc = cli_exit_code(ECANCELED); /* whatever failed once the run was cancelled */
    if (!cli_json)
        goto out;
    if (out_streamed) {
        if (rc != EXIT_OK) {
            json_object *e = error_obj(rc);
            fputs(",\"error\":", stdout);
            cli_json_write(stdout, e);
            json_object_put(e);
        }
        fputs("}\n", stdout);
        goto out;
    }
    /* a verb that reported nothing (--help) prints no object */
    if (rc == EXIT_OK && !out_obj)
        goto out;
    json_object *o = json_object_new_object();
    json_object_object_add(o, "schema", json_object_new_int(1));
    if (rc == EXIT_OK)
        add_subjects(o);
    if (out_obj) {
        json_object_object_foreach(out_obj, k, v) json_object_object_add(o, k, json_object_get(v));
    }
    if (rc != EXIT_OK)
        json_object_object_add(o, "error", error_obj(rc));
    cli_json_line(o);
    json_object_put(o);
out:
    json_object_put(out_obj);
    out_obj = NULL;
    fflush(stdout);
    return rc;
}

/* ---- options ---- */

/* Optimal string alignment distance (Levenshtein plus swaps of neighbours: "psuh" is 1 from
 * "push"), on words of up to 63 bytes. */
static size_t edit_distance(const char *a, const char *b)
{
    size_t n = strlen(a), m = strlen(b);
    if (n > 63 || m > 63)
        return SIZE_MAX;
    size_t d[64][64];
    for (size_t i = 0; i <= n; i++)
        d[i][0] = i;
    for (size_t j = 0; j <= m; j++)
        d[0][j] = j;
    for (size_t i = 1; i <= n; i++)
        for (size_t j = 1; j <= m; j++) {
            size_t v = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            if (d[i - 1][j] + 1 < v)
                v = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < v)
                v = d[i][j - 1] + 1;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] &&
                d[i - 2][j - 2] + 1 < v)
                v = d[i - 2][j - 2] + 1;
            d[i][j] = v;
        }
    return d[n][m];
}

const char *cli_did_you_mean(const char *word, const char *const *cands)
{
    /* within 1 for short words, 2 from 5 letters on: closer than that is another word */
    size_t limit = strlen(word) >= 5 ? 2 : 1, best = SIZE_MAX;
    const char *pick = NULL;
    for (size_t i = 0; cands[i]; i++) {
        size_t d = edit_distance(word, cands[i]);
        if (d <= limit && d < best)
            best = d, pick = cands[i];
    }
    return pick;
}

int cli_unknown_sub(const char *verb, const char *sub, const struct cli_sub *subs)
{
    char list[256] = "";
    const char *names[32];
    size_t n = 0;
    for (size_t i = 0, o = 0; subs[i].name && n < 31; i++, n++) {
        names[n] = subs[i].name;
        if (o < sizeof(list))
            o += (size_t)snprintf(list + o, sizeof(list) - o, "%s%s", i ? ", " : "", subs[i].name);
    }
    names[n] = NULL;
    const char *near = cli_did_you_mean(sub, names);
    if (near)
        return cli_usage(verb, "unknown subcommand '%s'; did you mean '%s'?", sub, near);
    return cli_usage(verb, "unknown subcommand '%s' (expected %s)", sub, list);
}

/* The long option `arg` ("--jsn=x") is not one of `lopts`: the usage error, with the nearest. */
static void unknown_long(const char *arg, const struct option *lopts)
{
    char word[64];
    snprintf(word, sizeof(word), "%s", arg + 2);
    word[strcspn(word, "=")] = '\0';
    const char *cands[128];
    size_t n = 0;
    for (size_t i = 0; lopts && lopts[i].name && n < 127; i++)
        cands[n++] = lopts[i].name;
    cands[n] = NULL;
    const char *near = cli_did_you_mean(word, cands);
    if (near)
        cli_usage(cli_verb, "unknown option '--%s'; did you mean '--%s'?", word, near);
    else
        cli_usage(cli_verb, "unknown option '%s'", arg);
}

/* getopt_long over `so` and `lo`; -q and -v taken here. */
static int getopt_built(int argc, char **argv, const char *so, const struct option *lo)
{
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, so, lo, NULL)) == 'q' || c == 'v')
        cli_common_flag(c);
    if (c == ':' || c == '?') {
        const char *arg = argv[optind - 1];
        if (c == ':')
            cli_usage(cli_verb, "option '%s' wants an argument", arg);
        else if (!strncmp(arg, "--", 2))
            unknown_long(arg, lo);
        else
            cli_usage(cli_verb, "unknown option '-%c'", optopt ? optopt : '?');
        opt_error_reported = true;
        c = '?';
    }
    return c;
}

/* The tables getopt_long wants, built from `opts` at each call (a few dozen rows): a long
 * option returns OPT_ROW + its row, so that either spelling maps to the row's val whatever
 * letters the table uses. */
#define OPT_ROW 0x10000
#define OPTS_MAX 64

int cli_getopt(int argc, char **argv, const struct cli_opt *opts)
{
    struct option lo[OPTS_MAX + 4];
    char so[2 * OPTS_MAX + 8];
    size_t n = 0, s = 0;
    so[s++] = ':'; /* a missing argument is ':', an unknown option '?' */
    for (size_t i = 0; opts[i].name || opts[i].letter; i++) {
        if (i >= OPTS_MAX)
            abort(); /* a table this long is a bug (cli_doc_check says so first) */
        if (opts[i].name)
            lo[n++] = (struct option){opts[i].name, opts[i].arg ? required_argument : no_argument,
                                      NULL, OPT_ROW + (int)i};
        if (opts[i].letter) {
            so[s++] = opts[i].letter;
            if (opts[i].arg)
                so[s++] = ':';
        }
    }
    lo[n++] = (struct option){"help", no_argument, NULL, 'h'};
    lo[n++] = (struct option){"quiet", no_argument, NULL, 'q'};
    lo[n++] = (struct option){"verbose", no_argument, NULL, 'v'};
    lo[n] = (struct option){NULL, 0, NULL, 0};
    memcpy(so + s, "hqv", 4);
    int c = getopt_built(argc, argv, so, lo);
    if (c >= OPT_ROW)
        return opts[c - OPT_ROW].val;
    for (size_t i = 0; c > 0 && c != 'h' && (opts[i].name || opts[i].letter); i++)
        if (opts[i].letter == c)
            return opts[i].val;
    return c;
}

bool cli_word_in(const char *list, const char *word)
{
    size_t n = strlen(word);
    for (const char *p = list; p && *p;) {
        p += strspn(p, " ");
        size_t k = strcspn(p, " ");
        if (k == n && !strncmp(p, word, n))
            return true;
        p += k;
    }
    return false;
}

const char *cli_opt_label(char *buf, size_t cap, const struct cli_opt *o)
{
    if (o->letter && o->name)
        snprintf(buf, cap, "-%c/--%s", o->letter, o->name);
    else if (o->name)
        snprintf(buf, cap, "--%s", o->name);
    else
        snprintf(buf, cap, "-%c", o->letter);
    return buf;
}

const struct cli_opt *cli_opt_by_val(const struct cli_opt *opts, int val)
{
    for (size_t i = 0; opts[i].name || opts[i].letter; i++)
        if (opts[i].val == val)
            return &opts[i];
    return NULL;
}

/* "push, pull and export": the words of `list` joined for a message. */
static void join_words(char *who, size_t cap, const char *list)
{
    size_t n = 0, len = 0;
    for (const char *p = list; *p; p += strspn(p, " "), n++)
        p += strcspn(p, " ");
    who[0] = 0;
    const char *p = list;
    for (size_t k = 0; k < n && len < cap; k++) {
        size_t w = strcspn(p, " ");
        len += (size_t)snprintf(who + len, cap - len, "%s%.*s",
                                k == 0       ? ""
                                : k == n - 1 ? " and "
                                             : ", ",
                                (int)w, p);
        p += w;
        p += strspn(p, " ");
    }
}

int cli_opt_for(const char *verb, const char *word, const struct cli_opt *opts, int c)
{
    const struct cli_opt *o = cli_opt_by_val(opts, c);
    if (!o || !o->only || cli_word_in(o->only, word))
        return 0;
    char name[64], who[64];
    join_words(who, sizeof(who), o->only);
    return cli_usage(verb, "%s is an option of %s only (%s does not use it)",
                     cli_opt_label(name, sizeof(name), o), who, verb),
           -1;
}

double cli_cpu_seconds(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
}

int cli_parse_size(const char *s, uint64_t *out)
{
    if (!s || !*s)
        return -EINVAL;
    errno = 0;
    char *end;
    double v = strtod(s, &end);
    if (errno || end == s || v < 0)
        return -EINVAL;
    for (const char *c = s; c < end; c++) /* decimal only: strtod also takes nan, inf, 0x1p4 */
        if (!isdigit((unsigned char)*c) && *c != '.')
            return -EINVAL;
    double mult = 1;
    switch (*end) {
    case 'k':
    case 'K':
        mult = 1024.0;
        end++;
        break;
    case 'm':
    case 'M':
        mult = 1024.0 * 1024;
        end++;
        break;
    case 'g':
    case 'G':
        mult = 1024.0 * 1024 * 1024;
        end++;
        break;
    case 't':
    case 'T':
        mult = 1024.0 * 1024 * 1024 * 1024;
        end++;
        break;
    default:
        break;
    }
    if (*end == 'i' && end[1] == 'B')
        end += 2;
    else if (*end == 'B')
        end++;
    if (*end)
        return -EINVAL;
    double r = v * mult;
    if (r >= 18446744073709551615.0)
        return -EINVAL;
    *out = (uint64_t)r;
    return 0;
}

int cli_parse_uint(const char *s, unsigned long lo, unsigned long hi, unsigned long *out)
{
    if (!s || !*s)
        return -EINVAL;
    errno = 0;
    char *end;
    unsigned long v = strtoul(s, &end, 10);
    if (errno || *end || s[0] == '-' || v < lo || v > hi)
        return -EINVAL;
    *out = v;
    return 0;
}

/* Length of the well-formed UTF-8 sequence at `p` (RFC 3629: no overlong forms, no surrogates,
 * nothing past U+10FFFF) of a character from U+0080 up; 0 when there is none. */
static size_t utf8_len(const unsigned char *p)
{
    unsigned char c = p[0];
    size_t n;
    unsigned char lo = 0x80, hi = 0xbf;
    if (c >= 0xc2 && c <= 0xdf)
        n = 2;
    else if (c >= 0xe0 && c <= 0xef)
        n = 3, lo = c == 0xe0 ? 0xa0 : 0x80, hi = c == 0xed ? 0x9f : 0xbf;
    else if (c >= 0xf0 && c <= 0xf4)
        n = 4, lo = c == 0xf0 ? 0x90 : 0x80, hi = c == 0xf4 ? 0x8f : 0xbf;
    else
        return 0;
    if (p[1] < lo || p[1] > hi)
        return 0;
    for (size_t i = 2; i < n; i++)
        if (p[i] < 0x80 || p[i] > 0xbf)
            return 0;
    return n;
}

/* A C1 control (U+0080-U+009F: 0x9b is a terminal's CSI) as UTF-8 at `p`. */
static bool utf8_c1(const unsigned char *p)
{
    return p[0] == 0xc2 && p[1] >= 0x80 && p[1] <= 0x9f;
}

/* Bytes of the character at `p` that may go to a terminal as they are (printable ASCII, a
 * well-formed UTF-8 sequence that is not a C1 control); 0 when it is to be escaped. */
static size_t printable_len(const unsigned char *p)
{
    if (*p < 0x80)
        return *p < 0x20 || *p == 0x7f ? 0 : 1;
    return utf8_c1(p) ? 0 : utf8_len(p);
}

const char *cli_printable(char *out, size_t cap, const char *s)
{
    size_t o = 0;
    const unsigned char *p = (const unsigned char *)s;
    while (*p && o + 5 < cap) {
        size_t n = printable_len(p);
        if (n == 0) {
            o += (size_t)snprintf(out + o, cap - o, "\\x%02x", *p++);
            continue;
        }
        if (o + n + 1 > cap)
            break;
        memcpy(out + o, p, n);
        o += n;
        p += n;
    }
    out[o] = '\0';
    return out;
}

/* The progress line off the terminal (term_mu held). */
static void progress_clear(void)
{
    if (progress_shown)
        fputs("\r\033[K", stderr);
    progress_shown = false;
}

void cli_eputs(const char *prefix, const char *msg)
{
    size_t cap = 4 * strlen(msg) + 8; /* every byte as \xHH, whole */
    char small[1024], *out = cap <= sizeof(small) ? small : malloc(cap);
    if (!out) /* out of memory: what fits */
        out = small, cap = sizeof(small);
    pthread_mutex_lock(&term_mu);
    progress_clear();
    fprintf(stderr, "%s%s\n", prefix, cli_printable(out, cap, msg));
    pthread_mutex_unlock(&term_mu);
    if (out != small)
        free(out);
}

/* Serialised JSON (json-c's: valid JSON, its strings as the bytes they were given) made valid
 * UTF-8 that a terminal only shows: inside a string, which is the only place such bytes can
 * be, a byte that is not UTF-8 becomes the visible \xHH (as text shows it: the JSON "\\xHH"), a
 * control (DEL, C1, and C0 should json-c leave one) \u00XX. */
static void json_put_safe(FILE *f, const char *js)
{
    const unsigned char *p = (const unsigned char *)js;
    while (*p) {
        size_t n = *p < 0x80 ? (*p < 0x20 || *p == 0x7f ? 0 : 1) : utf8_len(p);
        if (n > 0 && !(n == 2 && utf8_c1(p))) {
            fwrite(p, 1, n, f);
            p += n;
        } else if (n == 2) {
            fprintf(f, "\\u00%02x", p[1]);
            p += 2;
        } else {
            fprintf(f, *p < 0x80 ? "\\u%04x" : "\\\\x%02x", *p);
            p++;
        }
    }
}

void cli_json_write(FILE *f, struct json_object *o)
{
    json_put_safe(f, json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN |
                                                           JSON_C_TO_STRING_NOSLASHESCAPE));
}

void cli_json_line(struct json_object *o)
{
    cli_json_write(stdout, o);
    putchar('\n');
}

int cli_parse_duration(const char *s, int64_t *out)
{
    if (!s || !isdigit((unsigned char)s[0])) /* strtoull would take " -1" */
        return -EINVAL;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s)
        return -EINVAL;
    unsigned long long mult = 1;
    switch (*end) {
    case 's':
        end++;
        break;
    case 'm':
        mult = 60;
        end++;
        break;
    case 'h':
        mult = 3600;
        end++;
        break;
    case 'd':
        mult = 86400;
        end++;
        break;
    default:
        break;
    }
    if (*end || v > (unsigned long long)INT64_MAX / mult)
        return -EINVAL;
    *out = (int64_t)(v * mult);
    return 0;
}

void cli_error(const char *verb, const char *fmt, ...)
{
    char prefix[64];
    snprintf(prefix, sizeof(prefix), "vmsnap%s%s: ", *verb ? " " : "", verb);
    va_list ap;
    va_start(ap, fmt);
    char *msg = NULL;
    int n = vasprintf(&msg, fmt, ap);
    va_end(ap);
    cli_eputs(prefix, n >= 0 ? msg : "(out of memory)");
    record_error(0, n >= 0 ? msg : "(out of memory)");
    if (n >= 0)
        free(msg);
}

int cli_fail_code(const char *verb, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *msg = NULL;
    int n = vasprintf(&msg, fmt, ap);
    va_end(ap);
    cli_error(verb, "%s", n >= 0 ? msg : "(out of memory)");
    if (n >= 0)
        free(msg);
    last_err.code = code < 0 ? -code : code;
    return cli_exit_code(code);
}

int cli_fail(const char *verb, const struct vmsnap_err *err)
{
    return cli_fail_code(verb, err->code, "%s", err->msg);
}

int cli_usage(const char *verb, const char *fmt, ...)
{
    if (opt_error_reported) { /* cli_getopt said what was wrong */
        opt_error_reported = false;
        return EXIT_USAGE;
    }
    va_list ap;
    va_start(ap, fmt);
    char *msg = NULL;
    int n = vasprintf(&msg, fmt, ap);
    va_end(ap);
    const char *m = n >= 0 ? msg : "(out of memory)";
    pthread_mutex_lock(&term_mu);
    progress_clear();
    fprintf(stderr, "vmsnap%s%s: %s\n", *verb ? " " : "", verb, m);
    if (*cli_verb) /* the verb is known (not so for an unknown one, or an option before it) */
        fprintf(stderr, "(see 'vmsnap help %s')\n", cli_verb);
    pthread_mutex_unlock(&term_mu);
    record_error(0, m);
    if (n >= 0)
        free(msg);
    return EXIT_USAGE;
}

double cli_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

const char *cli_bytes(char *buf, size_t len, uint64_t bytes)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    double v = (double)bytes;
    unsigned u = 0;
    while (v >= 1024.0 && u < 5) {
        v /= 1024.0;
        u++;
    }
    if (u == 0)
        snprintf(buf, len, "%llu B", (unsigned long long)bytes);
    else
        snprintf(buf, len, "%.2f %s", v, units[u]);
    return buf;
}

void cli_progress_init(struct cli_progress *p, const char *label)
{
    memset(p, 0, sizeof(*p));
    p->label = label;
    p->t0 = cli_now();
    p->active = !cli_quiet && isatty(STDERR_FILENO);
}

/* "1h02m", "3m05s", "12s" */
static void eta_text(char *b, size_t n, double s)
{
    if (s >= 3600)
        snprintf(b, n, "%dh%02dm", (int)(s / 3600), (int)(s / 60) % 60);
    else if (s >= 60)
        snprintf(b, n, "%dm%02ds", (int)(s / 60), (int)s % 60);
    else
        snprintf(b, n, "%ds", (int)s);
}

void cli_progress_cb(void *arg, uint64_t done, uint64_t total)
{
    struct cli_progress *p = arg;
    if (!p->active)
        return;
    pthread_mutex_lock(&term_mu);
    if (p->first_total == 0)
        p->first_total = total;
    else if (total != p->first_total)
        p->estimate = true; /* a set pull learns its total file by file */
    if (p->map) {
        done = p->map(p->map_arg, done);
        total = p->map_total;
    }
    double now = cli_now();
    if (now - p->last < 0.2 && done < total) {
        pthread_mutex_unlock(&term_mu);
        return;
    }
    p->last = now;
    char a[32], b[32], r[32], eta[32] = "";
    const char *approx = p->estimate ? "~" : "";
    double el = now - p->t0;
    uint64_t rate = el > 0 ? (uint64_t)((double)done / el) : 0;
    if (rate && total > done) {
        char t[24];
        eta_text(t, sizeof(t), (double)(total - done) / (double)rate);
        snprintf(eta, sizeof(eta), ", ETA %s%s", approx, t);
    }
    double pct = total ? 100.0 * (double)done / (double)total : 100.0;
    fprintf(stderr, "\r\033[K%s: %s / %s%s (%s%.0f%%, %s/s%s)", p->label,
            cli_bytes(a, sizeof(a), done), approx, cli_bytes(b, sizeof(b), total), approx,
            pct > 100 ? 100 : pct, cli_bytes(r, sizeof(r), rate), eta);
    progress_shown = true;
    pthread_mutex_unlock(&term_mu);
}

void cli_progress_end(struct cli_progress *p)
{
    if (!p->active)
        return;
    pthread_mutex_lock(&term_mu);
    progress_clear();
    p->active = false;
    pthread_mutex_unlock(&term_mu);
}

int cli_drop_cache(const char *verb, const char *path)
{
    struct vmsnap_err err = {0};
    struct vmsnap_pcache_retrier *r = NULL;
    if (vmsnap_pcache_retrier_new(NULL, 0, &r, &err) < 0)
        return cli_fail_code(verb, err.code, "--drop-cache: %s", err.msg);
    struct vmsnap_pcache_report rep = {0};
    struct stat st;
    int rc;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
        struct vmsnap_pcache_evict_opts eo = {.kick_writeback = true, .retrier = r};
        rc = vmsnap_pcache_evict(path, &eo, &rep, &err);
    } else {
        rc = vmsnap_pcache_drop_written(path, true, r, &rep, &err);
    }
    /* A process about to exit waits out the retry schedule (its background thread dies with
     * it); the schedule ends after 3 s, and usually much sooner. */
    if (rc == 0)
        (void)vmsnap_pcache_retrier_wait(r, 3.5);
    struct vmsnap_pcache_retrier_stats rs;
    vmsnap_pcache_retrier_get_stats(r, &rs);
    vmsnap_pcache_retrier_free(r);
    if (rc < 0)
        return cli_fail_code(verb, err.code, "--drop-cache: %s", err.msg);
    if (!cli_quiet) {
        char a[32];
        fprintf(stderr,
                "%s: page cache: dropped %s now, %llu file(s) were dirty (writeback "
                "started, %llu dropped on retry, %llu still dirty)\n",
                verb, cli_bytes(a, sizeof(a), rep.dropped_pages * 4096ull),
                (unsigned long long)rep.dirty_files, (unsigned long long)rs.dropped_files,
                (unsigned long long)rs.gave_up);
    }
    return EXIT_OK;
}

int cli_refuse_existing(const char *verb, const char *dst, bool force)
{
    struct stat st;
    /* what is not a regular file the library never replaces, and says what it is */
    if (force || lstat(dst, &st) < 0 || !S_ISREG(st.st_mode))
        return EXIT_OK;
    return cli_fail_code(verb, EEXIST, "%s exists: not replaced (-f/--force replaces it)", dst);
}
