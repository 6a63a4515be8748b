/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The credential providers' HTTP requests (STS, the container endpoint, instance metadata):
 * plain, unsigned, small, each on a handle of its own made for it and freed after (they are
 * rare: once at open and once per refresh). Short timeouts and few attempts, as the AWS SDKs
 * use for these endpoints, so that a host without them fails fast. Only http and https, no
 * redirects. Their headers may hold a token: nothing of a request but its origin
 * (scheme://host:port) is ever put in a message.
 */
#include "s3_creds.h"
#include "s3_curl.h"

#include "sys/sys.h"
#include "util/util.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

void s3_curl_common(void *curl_handle, const struct s3_tls *tls)
{
    CURL *h = curl_handle;
    curl_easy_setopt(h, CURLOPT_USERAGENT, S3_USER_AGENT);
    curl_easy_setopt(h, CURLOPT_SSL_VERIFYPEER, tls && tls->insecure ? 0L : 1L);
    curl_easy_setopt(h, CURLOPT_SSL_VERIFYHOST, tls && tls->insecure ? 0L : 2L);
    if (tls && tls->ca_file)
        curl_easy_setopt(h, CURLOPT_CAINFO, tls->ca_file);
    if (tls && tls->ca_path)
        curl_easy_setopt(h, CURLOPT_CAPATH, tls->ca_path);
}

void s3_url_origin(const char *url, char *out, size_t len)
{
    const char *p = strstr(url, "://");
    size_t skip = p ? (size_t)(p - url) + 3 : 0;
    const char *host = url + skip;
    size_t hl = strcspn(host, "/?#");
    const char *at = memchr(host, '@', hl);
    if (at) { /* user info is not shown */
        hl -= (size_t)(at + 1 - host);
        host = at + 1;
    }
    snprintf(out, len, "%.*s%.*s", (int)skip, url, (int)hl, host);
}

static size_t fetch_write(char *buf, size_t size, size_t n, void *arg)
{
    struct dbuf *b = arg;
    return s3_dbuf_add(b, buf, size * n) < 0 ? 0 : size * n;
}

/* The one response header a request asked for (s3_fetch_req.resp_header): its value, blanks
 * cut; cleared at each status line, so an interim response's does not count. */
static size_t fetch_header(char *buf, size_t size, size_t n, void *arg)
{
    const struct s3_fetch_req *f = arg;
    const size_t len = size * n, nl = strlen(f->resp_header);
    if (len >= 5 && !strncmp(buf, "HTTP/", 5)) {
        f->resp_header_val[0] = '\0';
    } else if (len > nl && buf[nl] == ':' && !strncasecmp(buf, f->resp_header, nl)) {
        const char *v = buf + nl + 1, *e = buf + len;
        while (v < e && (*v == ' ' || *v == '\t'))
            v++;
        while (e > v && strchr(" \t\r\n", e[-1]))
            e--;
        snprintf(f->resp_header_val, f->resp_header_len, "%.*s", (int)(e - v), v);
    }
    return len;
}

static void fetch_setup(CURL *h, const struct s3_fetch_req *f, struct curl_slist *hl,
                        struct dbuf *resp)
{
    curl_easy_reset(h);
    curl_easy_setopt(h, CURLOPT_URL, f->url);
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, f->connect_timeout_ms);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, f->timeout_ms);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hl);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, fetch_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, resp);
    s3_curl_common(h, f->tls);
    if (f->resp_header && f->resp_header_val && f->resp_header_len) {
        f->resp_header_val[0] = '\0';
        curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, fetch_header);
        curl_easy_setopt(h, CURLOPT_HEADERDATA, (void *)f);
    }
    if (!strcmp(f->method, "POST") || !strcmp(f->method, "PUT")) {
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)f->body_len);
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, f->body ? f->body : "");
        if (strcmp(f->method, "POST"))
            curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, f->method);
    }
}

int s3_fetch(const struct s3_fetch_req *f, struct dbuf *resp, long *status, struct vmsnap_err *err)
{
    char origin[300];
    s3_url_origin(f->url, origin, sizeof(origin));
    CURL *h = curl_easy_init();
    if (!h)
        return vmsnap_err_set(err, ENOMEM, "curl_easy_init failed");
    struct curl_slist *hl = curl_slist_append(NULL, "Expect:");
    for (size_t i = 0; i < f->nheaders && hl; i++)
        hl = curl_slist_append(hl, f->headers[i]);
    int rc = hl ? 0 : vmsnap_err_set(err, ENOMEM, "out of memory");
    for (unsigned a = 1; rc == 0; a++) {
        resp->len = 0;
        resp->overflow = false;
        fetch_setup(h, f, hl, resp);
        CURLcode cc = curl_easy_perform(h);
        *status = 0;
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, status);
        vlog(VMSNAP_LOG_DEBUG, "s3: %s: %s %s -> %ld%s%s", f->what, f->method, origin, *status,
             cc ? " curl: " : "", cc ? curl_easy_strerror(cc) : "");
        if (cc == CURLE_WRITE_ERROR && resp->overflow) {
            rc = vmsnap_err_set(err, EFBIG, "%s (%s): an answer larger than %zu bytes", f->what,
                                origin, resp->max);
            break;
        }
        if (cc == CURLE_OK && (*status < 500 || a >= f->attempts))
            break;
        if (cc != CURLE_OK && a >= f->attempts) {
            rc = vmsnap_err_set(err,
                                cc == CURLE_OPERATION_TIMEDOUT         ? ETIMEDOUT
                                : cc == CURLE_COULDNT_CONNECT          ? ECONNREFUSED
                                : cc == CURLE_PEER_FAILED_VERIFICATION ? EPROTO
                                                                       : EIO,
                                "%s (%s): %s%s", f->what, origin, curl_easy_strerror(cc),
                                cc == CURLE_PEER_FAILED_VERIFICATION
                                    ? " (give the CA with --ca-bundle FILE or AWS_CA_BUNDLE)"
                                    : "");
            break;
        }
        sys_sleep_ms(100u * a); /* a short pause before the next attempt */
    }
    curl_slist_free_all(hl);
    curl_easy_cleanup(h);
    return rc;
}
