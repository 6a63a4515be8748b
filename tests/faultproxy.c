/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A fault-injecting HTTP/1.1 proxy for the S3 tests: sits between vmsnap and RGW on loopback and
 * numbers the requests it sees (1, 2, ... across all connections, in arrival order). Rules pick
 * requests by number and answer them with a 503, reset the connection, or delay them:
 *
 *   faultproxy PORTFILE TARGET_PORT [RULE,RULE...]
 *   RULE:  N:503   N:412   N:reset   N:delayMS   N+:reset (request N and every later one)
 *          N:norange (the Range header is blanked: the server answers as if ranges were not
 *          supported, a 200 with the whole object)
 *          N:nsu (swallowed, answered 404 NoSuchUpload: what S3 may say to a retried completion)
 *          N:drop (forwarded whole, the server's answer thrown away and the client's connection
 *          reset: a request carried out whose answer was lost)
 *          mN:503 ... (N counts only requests whose first line contains "partNumber=")
 *          cN:412 ... (N counts only UploadPartCopy requests: an x-amz-copy-source header)
 *          MN:drop ... (N counts only PUTs of a key ending in manifest.json: commits)
 *          UN:drop ... (N counts only DELETEs of a key ending in manifest.json: un-commits)
 *          DN:503 ... (N counts only DELETEs of a key ending in .zstd: objects)
 *          KN:drop ... (N counts only CompleteMultipartUpload requests: POST ...uploadId=)
 *
 * It listens on an ephemeral port on 127.0.0.1, writes that port to PORTFILE and runs until
 * killed. Requests must carry Content-Length bodies (vmsnap's do); responses are relayed raw.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

enum action { NONE, E503, E412, RESET, DELAY, NORANGE, DROP, NSU };
struct rule {
    bool parts_only;
    bool copies_only;
    bool commits_only;
    bool uncommits_only;
    bool completes_only;
    bool odeletes_only;
    long n;
    bool and_later;
    enum action a;
    long ms;
};
static struct rule rules[64];
static int nrules;
static int target_port;
static atomic_long nreq, npart, ncopy, ncommit, nuncommit, ncomplete, nodelete;

struct conn {
    int c, s;
    atomic_bool drop; /* the next answer is thrown away and the client reset */
};

static int write_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static void *relay_back(void *arg)
{
    struct conn *k = arg;
    char buf[65536];
    for (;;) {
        ssize_t r = read(k->s, buf, sizeof(buf));
        if (r > 0 && atomic_load(&k->drop)) {
            /* the answer is lost on its way: the client sees its connection reset */
            struct linger l = {1, 0};
            setsockopt(k->c, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
            shutdown(k->c, SHUT_RDWR);
            break;
        }
        if (r <= 0 || write_all(k->c, buf, (size_t)r) < 0)
            break;
    }
    shutdown(k->c, SHUT_RDWR);
    return NULL;
}

static void reset_close(int fd)
{
    struct linger l = {1, 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
    close(fd);
}

static enum action pick(long n, long pn, long cn, long mn, long un, long kn, long dn, long *ms)
{
    for (int i = 0; i < nrules; i++) {
        long x = rules[i].parts_only       ? pn
                 : rules[i].copies_only    ? cn
                 : rules[i].commits_only   ? mn
                 : rules[i].uncommits_only ? un
                 : rules[i].completes_only ? kn
                 : rules[i].odeletes_only  ? dn
                                           : n;
        if (x <= 0)
            continue;
        if (x == rules[i].n || (rules[i].and_later && x >= rules[i].n)) {
            *ms = rules[i].ms;
            return rules[i].a;
        }
    }
    return NONE;
}

static void *serve(void *arg)
{
    struct conn *k = arg;
    k->s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)target_port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(k->s, (struct sockaddr *)&a, sizeof(a)) < 0) {
        reset_close(k->c);
        close(k->s);
        free(k);
        return NULL;
    }
    pthread_t back;
    pthread_create(&back, NULL, relay_back, k);
    static char hdr_init[1];
    (void)hdr_init;
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    char body[65536];
    for (;;) {
        /* read one request's headers */
        char *end = NULL;
        while (!(end = len ? memmem(buf, len, "\r\n\r\n", 4) : NULL)) {
            if (len == cap)
                goto out;
            ssize_t r = read(k->c, buf + len, cap - len);
            if (r <= 0)
                goto out;
            len += (size_t)r;
        }
        size_t hl = (size_t)(end - buf) + 4;
        long clen = 0;
        for (char *p = buf; p < buf + hl;) {
            char *nl = memchr(p, '\n', (size_t)(buf + hl - p));
            if (!nl)
                break;
            if (!strncasecmp(p, "content-length:", 15))
                clen = strtol(p + 15, NULL, 10);
            p = nl + 1;
        }
        char *eol = memchr(buf, '\n', hl);
        bool is_part = eol && memmem(buf, (size_t)(eol - buf), "partNumber=", 11);
        long n = atomic_fetch_add(&nreq, 1) + 1;
        long pn = is_part ? atomic_fetch_add(&npart, 1) + 1 : 0;
        bool is_copy = memmem(buf, hl, "\nx-amz-copy-source:", 19) != NULL;
        long cn = is_copy ? atomic_fetch_add(&ncopy, 1) + 1 : 0;
        const char *m0 = memchr(buf, ' ', hl);
        const char *sp = m0 && eol && m0 < eol ? memchr(m0 + 1, ' ', (size_t)(eol - m0 - 1)) : NULL;
        bool on_manifest = sp && sp - buf >= 17 && !memcmp(sp - 13, "manifest.json", 13);
        bool is_commit = on_manifest && !strncmp(buf, "PUT ", 4);
        bool is_uncommit = on_manifest && !strncmp(buf, "DELETE ", 7);
        long mn = is_commit ? atomic_fetch_add(&ncommit, 1) + 1 : 0;
        long un = is_uncommit ? atomic_fetch_add(&nuncommit, 1) + 1 : 0;
        bool is_complete = !strncmp(buf, "POST ", 5) && eol &&
                           memmem(buf, (size_t)(eol - buf), "uploadId=", 9) != NULL;
        long kn = is_complete ? atomic_fetch_add(&ncomplete, 1) + 1 : 0;
        bool is_odelete =
            sp && sp - buf >= 12 && !memcmp(sp - 5, ".zstd", 5) && !strncmp(buf, "DELETE ", 7);
        long dn = is_odelete ? atomic_fetch_add(&nodelete, 1) + 1 : 0;
        long ms = 0;
        enum action act = pick(n, pn, cn, mn, un, kn, dn, &ms);
        fprintf(stderr, "faultproxy: #%ld %.*s%s\n", n, eol ? (int)(eol - buf - 1) : 0, buf,
                act == E503      ? " -> 503"
                : act == E412    ? " -> 412"
                : act == RESET   ? " -> reset"
                : act == DELAY   ? " -> delay"
                : act == NORANGE ? " -> no range"
                : act == DROP    ? " -> answer dropped"
                : act == NSU     ? " -> 404 NoSuchUpload"
                                 : "");
        if (act == RESET) {
            shutdown(k->s, SHUT_RDWR);
            reset_close(k->c);
            k->c = -1;
            goto out;
        }
        if (act == DELAY)
            usleep((useconds_t)ms * 1000);
        if (act == DROP)
            atomic_store(&k->drop, true);
        if (act == NORANGE) /* same length, so nothing moves */
            for (char *p = buf; (p = memmem(p, hl - (size_t)(p - buf), "\r\nRange:", 8));)
                memcpy(p + 2, "X-Nop", 5);
        /* forward (or swallow, for a 503) the headers and the body */
        size_t have = len - hl;
        bool swallow = act == E503 || act == E412 || act == NSU;
        if (!swallow && write_all(k->s, buf, hl) < 0)
            goto out;
        long left = clen;
        size_t take = have < (size_t)left ? have : (size_t)left;
        if (!swallow && take && write_all(k->s, buf + hl, take) < 0)
            goto out;
        left -= (long)take;
        memmove(buf, buf + hl + take, have - take);
        len = have - take;
        while (left > 0) {
            ssize_t r = read(k->c, body, left < (long)sizeof(body) ? (size_t)left : sizeof(body));
            if (r <= 0)
                goto out;
            if (!swallow && write_all(k->s, body, (size_t)r) < 0)
                goto out;
            left -= r;
        }
        if (act == E412 || act == E503 || act == NSU) {
            const char *resp =
                act == NSU
                    ? "HTTP/1.1 404 Not Found\r\nContent-Type: application/xml\r\n"
                      "Content-Length: 69\r\nConnection: close\r\n\r\n"
                      "<Error><Code>NoSuchUpload</Code><Message>injected</Message></Error>\n\n"
                : act == E412
                    ? "HTTP/1.1 412 Precondition Failed\r\nContent-Type: application/xml\r\n"
                      "Content-Length: 76\r\nConnection: close\r\n\r\n"
                      "<Error><Code>PreconditionFailed</Code><Message>injected</Message></"
                      "Error>\n\n\n"
                    : "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/xml\r\n"
                      "Content-Length: 68\r\nConnection: close\r\n\r\n"
                      "<Error><Code>SlowDown</Code><Message>injected</Message></Error>\n\n\n\n\n";
            write_all(k->c, resp, strlen(resp));
            shutdown(k->s, SHUT_RDWR);
            shutdown(k->c, SHUT_WR);
            goto out;
        }
    }
out:
    shutdown(k->s, SHUT_RDWR);
    pthread_join(back, NULL);
    if (k->c >= 0)
        close(k->c);
    close(k->s);
    free(buf);
    free(k);
    return NULL;
}

static int parse_rules(const char *spec)
{
    char *dup = strdup(spec), *save = NULL;
    for (char *r = strtok_r(dup, ",", &save); r && nrules < 64; r = strtok_r(NULL, ",", &save)) {
        struct rule *x = &rules[nrules++];
        if (*r == 'm') {
            x->parts_only = true;
            r++;
        } else if (*r == 'c') {
            x->copies_only = true;
            r++;
        } else if (*r == 'M') {
            x->commits_only = true;
            r++;
        } else if (*r == 'U') {
            x->uncommits_only = true;
            r++;
        } else if (*r == 'K') {
            x->completes_only = true;
            r++;
        } else if (*r == 'D') {
            x->odeletes_only = true;
            r++;
        }
        char *e;
        x->n = strtol(r, &e, 10);
        if (*e == '+') {
            x->and_later = true;
            e++;
        }
        if (*e != ':')
            return -1;
        e++;
        if (!strcmp(e, "503"))
            x->a = E503;
        else if (!strcmp(e, "412"))
            x->a = E412;
        else if (!strcmp(e, "norange"))
            x->a = NORANGE;
        else if (!strcmp(e, "reset"))
            x->a = RESET;
        else if (!strcmp(e, "drop"))
            x->a = DROP;
        else if (!strcmp(e, "nsu"))
            x->a = NSU;
        else if (!strncmp(e, "delay", 5)) {
            x->a = DELAY;
            x->ms = strtol(e + 5, NULL, 10);
        } else
            return -1;
    }
    free(dup);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 3 || (argc > 3 && parse_rules(argv[3]) < 0)) {
        fprintf(stderr,
                "usage: faultproxy PORTFILE TARGET_PORT [N:503|N:412|N:reset|N:delayMS|N:norange|"
                "N:drop|N+:reset|mN:...|cN:...|MN:...|UN:...|KN:...]\n");
        return 2;
    }
    target_port = atoi(argv[2]);
    /* a client that closes while an answer is relayed to it (vmsnap refusing a body it did not
     * ask for) must not kill the proxy: write() gets EPIPE instead */
    signal(SIGPIPE, SIG_IGN);
    int l = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t al = sizeof(a);
    if (bind(l, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(l, 64) < 0 ||
        getsockname(l, (struct sockaddr *)&a, &al) < 0) {
        perror("faultproxy: listen");
        return 1;
    }
    char tmp[4096];
    snprintf(tmp, sizeof(tmp), "%s.tmp", argv[1]);
    FILE *f = fopen(tmp, "w");
    if (!f)
        return 1;
    fprintf(f, "%d\n", ntohs(a.sin_port));
    fclose(f);
    rename(tmp, argv[1]);
    for (;;) {
        int c = accept(l, NULL, NULL);
        if (c < 0)
            continue;
        struct conn *k = calloc(1, sizeof(*k));
        k->c = c;
        pthread_t t;
        pthread_create(&t, NULL, serve, k);
        pthread_detach(t);
    }
}
