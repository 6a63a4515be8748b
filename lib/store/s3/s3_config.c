/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The S3 configuration of a store: bucket and key from an s3:// or gs:// URL; the endpoint,
 * region, addressing style, retries and TLS trust from the options, the environment and the AWS
 * profile (flag > environment > profile > default; docs/credentials.md); then the credential
 * chain (s3_creds.c), resolved here at open so that a store without credentials fails before
 * any work.
 */
#include "s3_creds.h"
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
     * from the credential chain, and curl would read such a host as credentials for another one */
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

/* The S3 endpoint: the flag, else (unless AWS_IGNORE_CONFIGURED_ENDPOINT_URLS or the profile's
 * ignore_configured_endpoint_urls) the service's own variable before the global one, the
 * environment before the profile, as the AWS SDKs order them; NULL: AWS's regional default. */
static const char *s3_endpoint(const struct vmsnap_store_opts *o, bool gs,
                               const struct s3_profile *p)
{
    if (o->endpoint || gs)
        return o->endpoint ? o->endpoint : env("VMSNAP_GS_ENDPOINT");
    const char *ig = env("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS");
    if (!ig)
        ig = s3_profile_get(p, "ignore_configured_endpoint_urls");
    if (ig && !strcasecmp(ig, "true"))
        return NULL;
    const char *ep = env("AWS_ENDPOINT_URL_S3");
    if (!ep)
        ep = env("AWS_ENDPOINT_URL");
    if (!ep)
        ep = s3_profile_service(p, "s3", "endpoint_url");
    if (!ep)
        ep = s3_profile_get(p, "s3.endpoint_url");
    if (!ep)
        ep = s3_profile_get(p, "endpoint_url");
    return ep;
}

/* Attempts per request: --retries, VMSNAP_S3_ATTEMPTS, AWS_MAX_ATTEMPTS, the profile's
 * max_attempts, 6. */
static int attempts(struct s3_config *c, const struct vmsnap_store_opts *o,
                    const struct s3_profile *p, struct vmsnap_err *err)
{
    c->max_attempts = o->max_attempts ? o->max_attempts : 6;
    if (o->max_attempts)
        return 0;
    const char *att = env("VMSNAP_S3_ATTEMPTS");
    if (att && atoi(att) > 0) {
        c->max_attempts = (unsigned)atoi(att);
        return 0;
    }
    const char *v = env("AWS_MAX_ATTEMPTS"), *from = "AWS_MAX_ATTEMPTS";
    if (!v && (v = s3_profile_get(p, "max_attempts")))
        from = p->config_path;
    if (!v)
        return 0;
    char *end;
    long x = strtol(v, &end, 10);
    if (end == v || *end || x < 1 || x > 101)
        return vmsnap_err_set(err, EINVAL, "max attempts (%s): 1 to 101, not '%s'", from, v);
    c->max_attempts = (unsigned)x;
    return 0;
}

/* TLS trust: --ca-bundle, AWS_CA_BUNDLE, the profile's ca_bundle, then what the curl tool reads
 * (CURL_CA_BUNDLE, SSL_CERT_FILE; SSL_CERT_DIR as a directory); none: libcurl's default store.
 * A bundle named but not readable is an error now rather than a TLS failure later. */
static int tls_trust(struct s3_config *c, const struct vmsnap_store_opts *o,
                     const struct s3_profile *p, struct vmsnap_err *err)
{
    static const char *const envs[] = {"AWS_CA_BUNDLE", NULL, "CURL_CA_BUNDLE", "SSL_CERT_FILE"};
    const char *ca = o->ca_bundle, *from = "--ca-bundle";
    for (size_t i = 0; !ca && i < sizeof(envs) / sizeof(envs[0]); i++) {
        ca = envs[i] ? env(envs[i]) : s3_profile_get(p, "ca_bundle");
        from = envs[i] ? envs[i] : p->config_path;
    }
    const char *dir = env("SSL_CERT_DIR");
    if (ca) {
        FILE *f = fopen(ca, "re");
        if (!f)
            return err_sys(err, "CA bundle %s (from %s)", ca, from);
        fclose(f);
    }
    if (dupset(&c->ca_file, ca, err) < 0 || dupset(&c->ca_path, dir, err) < 0)
        return -ENOMEM;
    return 0;
}

/* Endpoint, region, addressing style, attempts and TLS from the options, the environment and
 * the profile (flag > environment > profile > default). */
static int settings(struct s3_config *c, bool gs, const struct vmsnap_store_opts *o,
                    const struct s3_profile *p, struct vmsnap_err *err)
{
    const char *ep = s3_endpoint(o, gs, p);
    const char *region = o->region ? o->region : env("AWS_REGION");
    if (!region)
        region = env("AWS_DEFAULT_REGION");
    if (!region && !gs)
        region = s3_profile_get(p, "region");
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
    const char *style = gs ? NULL : s3_profile_get(p, "s3.addressing_style");
    if (style && strcmp(style, "path") && strcmp(style, "virtual") && strcmp(style, "auto"))
        return vmsnap_err_set(err, EINVAL,
                              "%s: s3 addressing_style '%s': expected path, virtual or auto",
                              p->config_path, style);
    c->path_style = o->path_style ||
                    (ps ? !strcasecmp(ps, "true") : style && !strcmp(style, "path")) ||
                    store_host_is_ip(c->host) || strchr(c->bucket, '.') != NULL;
    c->insecure_tls = o->insecure_tls;
    c->backoff_ms = o->backoff_ms ? o->backoff_ms : 200;
    rc = attempts(c, o, p, err);
    return rc < 0 ? rc : tls_trust(c, o, p, err);
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

    struct s3_profile prof;
    int rc = s3_profile_load(&prof, o->profile, err);
    if (rc == 0)
        rc = settings(c, gs, o, &prof, err);
    if (rc == 0)
        rc = s3_global_init(err); /* the providers use libcurl too */
    if (rc == 0) {
        char where[600];
        snprintf(where, sizeof(where), "%s://%s", c->url_scheme, c->bucket);
        const struct s3_tls tls = {c->ca_file, c->ca_path, c->insecure_tls};
        rc = s3_creds_open(&c->creds, where, gs, c->region, &tls, &prof, err);
    }
    s3_profile_fini(&prof);
    return rc;
}

void s3_config_fini(struct s3_config *c)
{
    free(c->scheme);
    free(c->host);
    free(c->bucket);
    free(c->region);
    free(c->ca_file);
    free(c->ca_path);
    s3_creds_free(c->creds);
}
