/* SPDX-License-Identifier: Apache-2.0 */
/* CLI helpers: size parsing, error printing, the TTY progress line. */
#include "cli.h"
#include "vmsnap/pcache.h"

#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <json.h>
#include <limits.h>
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

int cli_getopt(int argc, char **argv, const char *shortopts, const struct option *lopts)
{
    int c;
    while ((c = getopt_long(argc, argv, shortopts, lopts, NULL)) == 'q' || c == 'v')
        cli_common_flag(c);
    return c;
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

void cli_eputs(const char *prefix, const char *msg)
{
    size_t cap = 4 * strlen(msg) + 8; /* every byte as \xHH, whole */
    char small[1024], *out = cap <= sizeof(small) ? small : malloc(cap);
    if (!out) /* out of memory: what fits */
        out = small, cap = sizeof(small);
    fprintf(stderr, "%s%s\n", prefix, cli_printable(out, cap, msg));
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
    snprintf(prefix, sizeof(prefix), "vmsnap %s: ", verb);
    va_list ap;
    va_start(ap, fmt);
    char *msg = NULL;
    int n = vasprintf(&msg, fmt, ap);
    va_end(ap);
    cli_eputs(prefix, n >= 0 ? msg : "(out of memory)");
    if (n >= 0)
        free(msg);
}

int cli_fail(const char *verb, const struct vmsnap_err *err)
{
    cli_error(verb, "%s", err->msg);
    return EXIT_FAIL;
}

int cli_usage(const char *verb, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "vmsnap %s: ", verb);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n(see 'vmsnap help %s')\n", verb);
    va_end(ap);
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
    p->label = label;
    p->t0 = cli_now();
    p->last = 0;
    p->active = !cli_quiet && isatty(STDERR_FILENO);
}

void cli_progress_cb(void *arg, uint64_t done, uint64_t total)
{
    struct cli_progress *p = arg;
    if (!p->active)
        return;
    double now = cli_now();
    if (now - p->last < 0.2 && done < total)
        return;
    p->last = now;
    char a[32], b[32], r[32];
    double el = now - p->t0;
    uint64_t rate = el > 0 ? (uint64_t)((double)done / el) : 0;
    fprintf(stderr, "\r%s: %s / %s (%s/s)   ", p->label, cli_bytes(a, sizeof(a), done),
            cli_bytes(b, sizeof(b), total), cli_bytes(r, sizeof(r), rate));
}

void cli_progress_end(struct cli_progress *p)
{
    if (p->active && p->last > 0)
        fputs("\r\033[K", stderr);
}

int cli_drop_cache(const char *verb, const char *path)
{
    struct vmsnap_err err = {0};
    struct vmsnap_pcache_retrier *r = NULL;
    if (vmsnap_pcache_retrier_new(NULL, 0, &r, &err) < 0) {
        cli_error(verb, "--drop-cache: %s", err.msg);
        return EXIT_FAIL;
    }
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
    if (rc < 0) {
        cli_error(verb, "--drop-cache: %s", err.msg);
        return EXIT_FAIL;
    }
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
