/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The S3 configuration of a store: bucket and key from an s3:// or gs:// URL, the endpoint, region,
 * addressing style, retries and credentials from the options and the environment.
 */
#include "store/store_int.h"

#include "util/util.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

bool store_host_is_ip(const char *host)
{
    unsigned char buf[16];
    if (!strcasecmp(host, "localhost"))
        return true;
    if (inet_pton(AF_INET, host, buf) == 1 || inet_pton(AF_INET6, host, buf) == 1)
        return true;
    return false;
}

static int dupset(char **dst, const char *src, struct vmsnap_err *err)
{
    *dst = src ? strdup(src) : NULL;
    if (src && !*dst)
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    return 0;
}

static const char *env(const char *name)
{
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

/* "http[s]://host[:port][/]" into the config. */
static int parse_endpoint(struct s3_config *c, const char *ep, struct vmsnap_err *err)
{
    const char *p;
    if (!strncasecmp(ep, "https://", 8)) {
        c->scheme = strdup("https");
        p = ep + 8;
    } else if (!strncasecmp(ep, "http://", 7)) {
        c->scheme = strdup("http");
        p = ep + 7;
    } else {
        return vmsnap_err_set(err, EINVAL, "endpoint '%s': expected http://HOST[:PORT] or https://",
                              ep);
    }
    /* user:password@ is not echoed back (it may be a secret) and not taken: credentials come
     * from the environment, and curl would read such a host as credentials for another one */
    if (memchr(p, '@', strcspn(p, "/")))
        return vmsnap_err_set(err, EINVAL,
                              "endpoint: credentials in the URL (USER[:PASSWORD]@) are not "
                              "supported; give keys in AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY");
    const char *hs = p, *he;
    const bool v6 = *p == '[';
    if (v6) {
        he = strchr(p, ']');
        if (!he)
            return vmsnap_err_set(err, EINVAL, "endpoint '%s': unterminated [IPv6]", ep);
        hs = p + 1;
        p = he + 1;
    } else {
        he = p + strcspn(p, ":/");
        p = he;
    }
    if (he == hs)
        return vmsnap_err_set(err, EINVAL, "endpoint '%s': no host", ep);
    for (const char *q = hs; q < he; q++)
        if (!isalnum((unsigned char)*q) && !strchr(v6 ? ":." : ".-_", *q))
            return vmsnap_err_set(err, EINVAL, "endpoint '%s': bad character in the host name", ep);
    c->host = strndup(hs, (size_t)(he - hs));
    if (*p == ':') {
        char *end;
        unsigned long port = strtoul(p + 1, &end, 10);
        if (end == p + 1 || port == 0 || port > 65535 || (*end && strcmp(end, "/")))
            return vmsnap_err_set(err, EINVAL, "endpoint '%s': bad port", ep);
        c->port = (unsigned)port;
    } else if (*p && strcmp(p, "/")) {
        return vmsnap_err_set(err, EINVAL, "endpoint '%s': a path is not supported", ep);
    }
    if (!c->scheme || !c->host)
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    return 0;
}

static bool bucket_ok(const char *b)
{
    size_t n = strlen(b);
    if (n < 3 || n > 63)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!((b[i] >= 'a' && b[i] <= 'z') || (b[i] >= '0' && b[i] <= '9') || b[i] == '-' ||
              b[i] == '.' || b[i] == '_'))
            return false;
    return true;
}

int s3_config_open(struct vmsnap_store *st, const char *url, bool gs,
                   const struct vmsnap_store_opts *o, char **key, struct vmsnap_err *err)
{
    struct s3_config *c = &st->s3;
    const char *rest = url + 5;
    const char *slash = strchr(rest, '/');
    size_t blen = slash ? (size_t)(slash - rest) : strlen(rest);
    c->bucket = strndup(rest, blen);
    if (!c->bucket)
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    if (!bucket_ok(c->bucket))
        return vmsnap_err_set(err, EINVAL, "%s: bad bucket name '%s'", url, c->bucket);
    const char *k = slash ? slash + 1 : "";
    size_t klen = strlen(k);
    while (klen > 0 && k[klen - 1] == '/')
        klen--;
    *key = strndup(k, klen);
    if (!*key)
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    c->url_scheme = gs ? "gs" : "s3";

    const char *ep =
        o->endpoint ? o->endpoint : (gs ? env("VMSNAP_GS_ENDPOINT") : env("AWS_ENDPOINT_URL"));
    const char *region = o->region ? o->region : env("AWS_REGION");
    if (!region)
        region = env("AWS_DEFAULT_REGION");
    if (!region)
        region = gs ? "auto" : "us-east-1";
    if (dupset(&c->region, region, err) < 0)
        return -ENOMEM;
    char defep[256];
    if (!ep) {
        if (gs)
            snprintf(defep, sizeof(defep), "https://storage.googleapis.com");
        else
            snprintf(defep, sizeof(defep), "https://s3.%s.amazonaws.com", region);
        ep = defep;
    }
    int rc = parse_endpoint(c, ep, err);
    if (rc < 0)
        return rc;
    const char *ps = env("AWS_S3_USE_PATH_STYLE");
    c->path_style = o->path_style || (ps && !strcasecmp(ps, "true")) || store_host_is_ip(c->host) ||
                    strchr(c->bucket, '.') != NULL;
    c->insecure_tls = o->insecure_tls;
    /* an explicit --retries wins over the environment's default (it lost to it) */
    c->max_attempts = o->max_attempts ? o->max_attempts : 6;
    const char *att = env("VMSNAP_S3_ATTEMPTS");
    if (!o->max_attempts && att && atoi(att) > 0)
        c->max_attempts = (unsigned)atoi(att);
    c->backoff_ms = o->backoff_ms ? o->backoff_ms : 200;

    const char *ak = gs ? env("GS_ACCESS_KEY_ID") : NULL;
    const char *sk = gs ? env("GS_SECRET_ACCESS_KEY") : NULL;
    if (!ak || !sk) {
        ak = env("AWS_ACCESS_KEY_ID");
        sk = env("AWS_SECRET_ACCESS_KEY");
    }
    if (!ak || !sk)
        return vmsnap_err_set(err, EACCES,
                              "%s: no credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY",
                              url);
    if (dupset(&c->access_key, ak, err) < 0 || dupset(&c->secret_key, sk, err) < 0 ||
        dupset(&c->session_token, gs ? NULL : env("AWS_SESSION_TOKEN"), err) < 0)
        return -ENOMEM;
    return s3_global_init(err);
}

void s3_config_fini(struct s3_config *c)
{
    free(c->scheme);
    free(c->host);
    free(c->bucket);
    free(c->region);
    free(c->access_key);
    if (c->secret_key) {
        explicit_bzero(c->secret_key, strlen(c->secret_key));
        free(c->secret_key);
    }
    free(c->session_token);
}
