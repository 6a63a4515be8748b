/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The credential chain of an S3 store, in the order the AWS SDKs and CLI use:
 *
 *   1. environment: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN (gs://:
 *      GS_ACCESS_KEY_ID / GS_SECRET_ACCESS_KEY first); skipped under --profile, as the CLI does;
 *   2. web identity: AWS_WEB_IDENTITY_TOKEN_FILE + AWS_ROLE_ARN, or the profile's
 *      web_identity_token_file + role_arn, through STS AssumeRoleWithWebIdentity;
 *   3. the profile: its keys in the credentials file, its credential_process, its keys in the
 *      config file;
 *   4. container: AWS_CONTAINER_CREDENTIALS_RELATIVE_URI (on 169.254.170.2) or _FULL_URI;
 *   5. instance metadata (IMDSv2), unless AWS_EC2_METADATA_DISABLED=true.
 *
 * The first that gives credentials wins, and a source that is configured but fails stops the
 * chain with its error (a wrong role is not papered over by another identity); instance
 * metadata, which every host is "configured" for, only adds its failure to the list the "no
 * credentials" error names.
 *
 * gs:// uses 1 and 3 (HMAC keys, signed with SigV4), then Google's Application Default
 * Credentials in their order (OAuth 2.0 access tokens, sent as a bearer token):
 *
 *   6. GOOGLE_APPLICATION_CREDENTIALS: a service-account key or authorized-user file;
 *   7. gcloud's file: $CLOUDSDK_CONFIG/application_default_credentials.json, else
 *      ~/.config/gcloud/application_default_credentials.json, when it exists;
 *   8. the GCE metadata server (GCE_METADATA_HOST, else 169.254.169.254), unless
 *      NO_GCE_CHECK=true; like instance metadata, its failure only joins the list.
 *
 * Refresh: the current set is a reference-counted immutable struct s3_cred. A set with an
 * Expiration is due refresh_window seconds before it (VMSNAP_CREDS_REFRESH_SECONDS, default
 * 300; half the set's lifetime when that is less). The first request that finds it due fetches
 * a new set from the same source outside the lock; every other request meanwhile signs with the
 * current set while it has not expired, or waits for the refresh once it has. A refresh that
 * fails keeps the current set while it is valid and is tried again 5 s later; once the set has
 * expired, the failure is the request's error (each waiting request gets it, not a retry each).
 */
#include "s3_creds.h"

#include "util/util.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

enum src {
    SRC_ENV,
    SRC_WEBID,
    SRC_PROFILE,
    SRC_PROCESS,
    SRC_CONTAINER,
    SRC_IMDS,
    SRC_GAC,
    SRC_GCLOUD,
    SRC_GCE,
    SRC_COUNT
};
static const char *const src_name[SRC_COUNT] = {"environment",
                                                "web identity",
                                                "profile",
                                                "credential_process",
                                                "container endpoint",
                                                "instance metadata",
                                                "GOOGLE_APPLICATION_CREDENTIALS file",
                                                "gcloud credentials file",
                                                "GCE metadata server"};

#define RETRY_AFTER_FAIL 5

struct s3_creds {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct s3_chain_cfg cfg;
    enum src src;
    struct s3_cred *cur;
    time_t refresh_at; /* 0: never */
    time_t retry_at;   /* after a failed refresh */
    bool refreshing;
    unsigned gen; /* refreshes finished */
    int fail_rc;  /* of the last finished refresh, 0 if it worked */
    struct vmsnap_err fail_err;
    long window;
};

static const char *env(const char *name)
{
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

static bool truthy(const char *v)
{
    return v && !strcasecmp(v, "true");
}

struct s3_cred *s3_cred_new(const char *ak, const char *sk, const char *token, time_t expires)
{
    struct s3_cred *c = calloc(1, sizeof(*c));
    if (!c)
        return NULL;
    atomic_init(&c->refs, 1);
    c->access_key = strdup(ak);
    c->secret_key = strdup(sk);
    c->token = token ? strdup(token) : NULL;
    c->expires = expires;
    if (!c->access_key || !c->secret_key || (token && !c->token)) {
        s3_cred_put(c);
        return NULL;
    }
    return c;
}

static void wipe_free(char *s)
{
    if (s) {
        explicit_bzero(s, strlen(s));
        free(s);
    }
}

struct s3_cred *s3_cred_new_bearer(const char *token, time_t expires)
{
    struct s3_cred *c = calloc(1, sizeof(*c));
    if (!c)
        return NULL;
    atomic_init(&c->refs, 1);
    c->bearer = true;
    c->token = strdup(token);
    c->expires = expires;
    if (!c->token) {
        free(c);
        return NULL;
    }
    return c;
}

void s3_cred_put(struct s3_cred *c)
{
    if (!c || atomic_fetch_sub(&c->refs, 1) != 1)
        return;
    free(c->access_key);
    wipe_free(c->secret_key);
    wipe_free(c->token);
    free(c);
}

/* ---- the chain's settings ------------------------------------------------------------------ */

static int dup_opt(char **dst, const char *src)
{
    *dst = src ? strdup(src) : NULL;
    return src && !*dst ? -1 : 0;
}

/* A number of seconds or attempts from the environment or the profile, in [lo, hi]. */
static int num_setting(const char *envname, const struct s3_profile *p, const char *key, long lo,
                       long hi, long def, long *out, struct vmsnap_err *err)
{
    const char *v = env(envname), *from = envname;
    if (!v && key && (v = s3_profile_get(p, key)))
        from = key;
    *out = def;
    if (!v)
        return 0;
    char *end;
    long x = strtol(v, &end, 10);
    if (end == v || *end || x < lo || x > hi)
        return vmsnap_err_set(err, EINVAL, "%s: expected a whole number from %ld to %ld, not '%s'",
                              from, lo, hi, v);
    *out = x;
    return 0;
}

static bool loopback_or_ecs(const char *host)
{
    return !strcasecmp(host, "localhost") || !strncmp(host, "127.", 4) || !strcmp(host, "[::1]") ||
           !strcmp(host, "169.254.170.2") || !strcmp(host, "169.254.170.23") ||
           !strcasecmp(host, "[fd00:ec2::23]");
}

/* Container endpoint settings: the URL (RELATIVE_URI on the ECS agent's address, or FULL_URI:
 * over http only to loopback or the ECS / EKS Pod Identity agent, as the SDKs allow, since the
 * request carries the authorization token) and the token. 1: not configured. */
static int container_cfg(struct s3_chain_cfg *c, struct vmsnap_err *err)
{
    const char *rel = env("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI");
    const char *full = env("AWS_CONTAINER_CREDENTIALS_FULL_URI");
    char url[2048];
    if (rel) {
        if (rel[0] != '/')
            return vmsnap_err_set(err, EINVAL,
                                  "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI: not a path (/...)");
        snprintf(url, sizeof(url), "http://169.254.170.2%s", rel);
    } else if (full) {
        char origin[300];
        s3_url_origin(full, origin, sizeof(origin));
        const bool https = !strncasecmp(full, "https://", 8);
        if (!https && strncasecmp(full, "http://", 7))
            return vmsnap_err_set(err, EINVAL,
                                  "AWS_CONTAINER_CREDENTIALS_FULL_URI: not an http(s) URL");
        char host[300];
        snprintf(host, sizeof(host), "%s", origin + (https ? 8 : 7));
        if (host[0] == '[') {
            char *e = strchr(host, ']');
            if (e)
                e[1] = '\0';
        } else {
            host[strcspn(host, ":")] = '\0';
        }
        if (!https && !loopback_or_ecs(host))
            return vmsnap_err_set(err, EINVAL,
                                  "AWS_CONTAINER_CREDENTIALS_FULL_URI %s: plain http only to a "
                                  "loopback address or the ECS / EKS agent (use https)",
                                  origin);
        snprintf(url, sizeof(url), "%s", full);
    } else {
        return 1;
    }
    if (dup_opt(&c->ct_url, url) < 0 ||
        dup_opt(&c->ct_auth_file, env("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE")) < 0 ||
        dup_opt(&c->ct_auth, env("AWS_CONTAINER_AUTHORIZATION_TOKEN")) < 0)
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    return 0;
}

/* Web identity settings: the environment's, else the profile's. 1: not configured (why in
 * `note`). */
static int webid_cfg(struct s3_chain_cfg *c, const struct s3_profile *p, char *note, size_t nlen,
                     struct vmsnap_err *err)
{
    const char *tf = env("AWS_WEB_IDENTITY_TOKEN_FILE"), *arn = env("AWS_ROLE_ARN");
    const char *sn = env("AWS_ROLE_SESSION_NAME");
    if (!tf) {
        tf = s3_profile_get(p, "web_identity_token_file");
        arn = tf ? s3_profile_get(p, "role_arn") : NULL;
        sn = tf ? s3_profile_get(p, "role_session_name") : NULL;
        if (!tf) {
            snprintf(note, nlen, "AWS_WEB_IDENTITY_TOKEN_FILE not set");
            return 1;
        }
    }
    if (!arn) {
        snprintf(note, nlen, "a token file but no %s",
                 env("AWS_WEB_IDENTITY_TOKEN_FILE") ? "AWS_ROLE_ARN" : "role_arn in the profile");
        return 1;
    }
    char def_sn[64];
    snprintf(def_sn, sizeof(def_sn), "vmsnap-%lld", (long long)time(NULL));
    /* STS's endpoint: as for every service, its own setting before the global one, the
     * environment's before the profile's (AWS_IGNORE_CONFIGURED_ENDPOINT_URLS: none) */
    const char *ep = NULL;
    if (!truthy(env("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS")) &&
        !truthy(s3_profile_get(p, "ignore_configured_endpoint_urls"))) {
        ep = env("AWS_ENDPOINT_URL_STS");
        if (!ep)
            ep = env("AWS_ENDPOINT_URL");
        if (!ep)
            ep = s3_profile_service(p, "sts", "endpoint_url");
        if (!ep)
            ep = s3_profile_get(p, "sts.endpoint_url");
        if (!ep)
            ep = s3_profile_get(p, "endpoint_url");
    }
    char def_ep[256];
    snprintf(def_ep, sizeof(def_ep), "https://sts.%s.amazonaws.com", c->region);
    if (!ep)
        ep = def_ep;
    if (strncasecmp(ep, "http://", 7) && strncasecmp(ep, "https://", 8))
        return vmsnap_err_set(err, EINVAL, "STS endpoint '%s': expected http(s)://HOST", ep);
    if (strlen(sn ? sn : def_sn) > 64 || strlen(arn) > 2048)
        return vmsnap_err_set(err, EINVAL, "web identity: role ARN or session name too long");
    if (dup_opt(&c->wi_token_file, tf) < 0 || dup_opt(&c->wi_role_arn, arn) < 0 ||
        dup_opt(&c->wi_session_name, sn ? sn : def_sn) < 0 || dup_opt(&c->sts_endpoint, ep) < 0)
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    return 0;
}

static int imds_cfg(struct s3_chain_cfg *c, const struct s3_profile *p, struct vmsnap_err *err)
{
    const char *ep = env("AWS_EC2_METADATA_SERVICE_ENDPOINT");
    if (!ep)
        ep = s3_profile_get(p, "ec2_metadata_service_endpoint");
    const char *mode = env("AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE");
    if (!mode)
        mode = s3_profile_get(p, "ec2_metadata_service_endpoint_mode");
    if (!ep)
        ep =
            mode && !strcasecmp(mode, "ipv6") ? "http://[fd00:ec2::254]" : "http://169.254.169.254";
    if (strncasecmp(ep, "http://", 7) && strncasecmp(ep, "https://", 8))
        return vmsnap_err_set(err, EINVAL, "instance metadata endpoint '%s': expected http://HOST",
                              ep);
    if (dup_opt(&c->imds_endpoint, ep) < 0)
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    size_t n = strlen(c->imds_endpoint);
    while (n > 0 && c->imds_endpoint[n - 1] == '/')
        c->imds_endpoint[--n] = '\0';
    long t = 1, a = 2;
    int rc = num_setting("AWS_METADATA_SERVICE_TIMEOUT", p, "metadata_service_timeout", 1, 60, 1,
                         &t, err);
    if (rc == 0)
        rc = num_setting("AWS_METADATA_SERVICE_NUM_ATTEMPTS", p, "metadata_service_num_attempts", 1,
                         10, 2, &a, err);
    c->imds_timeout_ms = t * 1000;
    c->imds_attempts = (unsigned)a;
    return rc;
}

static void cfg_fini(struct s3_chain_cfg *c)
{
    free((char *)c->url);
    free(c->region);
    free((char *)c->tls.ca_file);
    free((char *)c->tls.ca_path);
    free(c->wi_token_file);
    free(c->wi_role_arn);
    free(c->wi_session_name);
    free(c->sts_endpoint);
    free(c->process);
    free(c->ct_url);
    wipe_free(c->ct_auth);
    free(c->ct_auth_file);
    free(c->imds_endpoint);
    free(c->gcs_file);
    free(c->gce_url);
}

/* The GCE metadata server's address: GCE_METADATA_HOST ("HOST[:PORT]", as Google's libraries
 * take it), else 169.254.169.254 (no DNS lookup of metadata.google.internal: a node elsewhere
 * fails at once); GCE_METADATA_TIMEOUT seconds to connect (default 1). */
static int gce_cfg(struct s3_chain_cfg *c, struct vmsnap_err *err)
{
    const char *h = env("GCE_METADATA_HOST");
    if (!h)
        h = "169.254.169.254";
    for (const char *p = h; *p; p++)
        if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-:[]", *p))
            return vmsnap_err_set(err, EINVAL,
                                  "GCE_METADATA_HOST '%s': expected HOST[:PORT] (no scheme, no "
                                  "path)",
                                  h);
    if (asprintf(&c->gce_url, "http://%s", h) < 0) {
        c->gce_url = NULL;
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    }
    long t = 1;
    int rc = num_setting("GCE_METADATA_TIMEOUT", NULL, NULL, 1, 60, 1, &t, err);
    c->gce_timeout_ms = t * 1000;
    return rc;
}

/* ---- the chain ------------------------------------------------------------------------------ */

static int fetch_src(struct s3_creds *cs, enum src s, struct s3_cred **out, struct vmsnap_err *err)
{
    switch (s) {
    case SRC_WEBID:
        return s3_src_web_identity(&cs->cfg, out, err);
    case SRC_PROCESS:
        return s3_src_process(&cs->cfg, out, err);
    case SRC_CONTAINER:
        return s3_src_container(&cs->cfg, out, err);
    case SRC_IMDS:
        return s3_src_imds(&cs->cfg, out, err);
    case SRC_GAC:
    case SRC_GCLOUD:
        return s3_src_gcs_file(&cs->cfg, out, err);
    case SRC_GCE:
        return s3_src_gce_metadata(&cs->cfg, out, err);
    default:
        return vmsnap_err_set(err, EINVAL, "credentials from the %s cannot be refreshed",
                              src_name[s]);
    }
}

/* ---- credentials kept across stores ---------------------------------------------------------
 *
 * A set a provider handed out with an expiry is kept (CACHE_MAX sets, the least recently
 * fetched dropped first) under the SHA-256 of its source and every setting that source was
 * asked with, so the next store of this process with the same source and settings takes it
 * instead of asking the provider again, until it is due for refresh by the same rule as a store's
 * own set (due_at, counted from when it was fetched). The node daemon thus asks instance
 * metadata or STS once per set's lifetime, not once per operation. Keys from the environment or
 * the profile files are read again by every store (cheap, and a rotated file is seen at once);
 * a set without an expiry is not kept. The key is a digest: a container's authorization token,
 * one of the settings, is not kept. */

#define CACHE_MAX 16

struct cache_ent {
    char key[65];
    struct s3_cred *cred;
    time_t fetched;
};

static pthread_mutex_t cache_mu = PTHREAD_MUTEX_INITIALIZER;
static struct cache_ent cache[CACHE_MAX];
static atomic_uint_fast64_t n_fetched, n_reused;

static const char *nz(const char *s)
{
    return s ? s : "";
}

/* The cache key of source s under cs's settings; "" when it cannot be made (no caching). */
static void cache_key(const struct s3_creds *cs, enum src s, char key[65])
{
    const struct s3_chain_cfg *c = &cs->cfg;
    char *txt = NULL;
    key[0] = '\0';
    int n =
        asprintf(&txt,
                 "%d\x1f%d\x1f%s\x1f%s\x1f%s\x1f%d\x1f%s\x1f%s\x1f%s\x1f%s\x1f%s\x1f%s\x1f%s"
                 "\x1f%s\x1f%s\x1f%s\x1f%s",
                 (int)s, c->gs, nz(c->region), nz(c->tls.ca_file), nz(c->tls.ca_path),
                 c->tls.insecure, nz(c->wi_token_file), nz(c->wi_role_arn), nz(c->wi_session_name),
                 nz(c->sts_endpoint), nz(c->process), nz(c->ct_url), nz(c->ct_auth),
                 nz(c->ct_auth_file), nz(c->imds_endpoint), nz(c->gcs_file), nz(c->gce_url));
    if (n < 0)
        return;
    sigv4_sha256_hex(txt, (size_t)n, key);
    explicit_bzero(txt, (size_t)n);
    free(txt);
}

/* Still good for a store with refresh window `window`: not within the window (or half its
 * lifetime when fetched, when that is less) of its expiry. */
static bool cache_fresh(const struct cache_ent *e, long window, time_t now)
{
    const struct s3_cred *c = e->cred;
    long life = c->expires > e->fetched ? (long)(c->expires - e->fetched) : 0;
    long w = life / 2 < window ? life / 2 : window;
    return now < c->expires - w;
}

static bool cache_take(const struct s3_creds *cs, const char *key, struct s3_cred **out)
{
    struct s3_cred *drop = NULL;
    bool hit = false;
    pthread_mutex_lock(&cache_mu);
    for (size_t i = 0; i < CACHE_MAX; i++) {
        struct cache_ent *e = &cache[i];
        if (!e->cred || strcmp(e->key, key))
            continue;
        if (cache_fresh(e, cs->window, time(NULL))) {
            atomic_fetch_add(&e->cred->refs, 1);
            *out = e->cred;
            hit = true;
        } else {
            drop = e->cred;
            e->cred = NULL;
        }
        break;
    }
    pthread_mutex_unlock(&cache_mu);
    s3_cred_put(drop);
    return hit;
}

static void cache_put(const char *key, struct s3_cred *c)
{
    if (!c->expires)
        return;
    struct s3_cred *drop = NULL;
    pthread_mutex_lock(&cache_mu);
    size_t slot = CACHE_MAX;
    for (size_t i = 0; i < CACHE_MAX && slot == CACHE_MAX; i++)
        if (cache[i].cred && !strcmp(cache[i].key, key))
            slot = i;
    for (size_t i = 0; i < CACHE_MAX && slot == CACHE_MAX; i++)
        if (!cache[i].cred)
            slot = i;
    if (slot == CACHE_MAX) { /* full: the least recently fetched goes */
        slot = 0;
        for (size_t i = 1; i < CACHE_MAX; i++)
            if (cache[i].fetched < cache[slot].fetched)
                slot = i;
    }
    drop = cache[slot].cred;
    atomic_fetch_add(&c->refs, 1);
    snprintf(cache[slot].key, sizeof(cache[slot].key), "%s", key);
    cache[slot].cred = c;
    cache[slot].fetched = time(NULL);
    pthread_mutex_unlock(&cache_mu);
    s3_cred_put(drop);
}

static int fetch(struct s3_creds *cs, enum src s, struct s3_cred **out, struct vmsnap_err *err)
{
    char key[65];
    cache_key(cs, s, key);
    if (key[0] && cache_take(cs, key, out)) {
        atomic_fetch_add(&n_reused, 1);
        vlog(VMSNAP_LOG_DEBUG, "s3: credentials from the %s, as fetched by an earlier store",
             src_name[s]);
        return 0;
    }
    int rc = fetch_src(cs, s, out, err);
    if (rc == 0) {
        atomic_fetch_add(&n_fetched, 1);
        if (key[0])
            cache_put(key, *out);
    }
    return rc;
}

void s3_creds_cache_stats(uint64_t *fetched, uint64_t *reused)
{
    *fetched = atomic_load(&n_fetched);
    *reused = atomic_load(&n_reused);
}

void s3_creds_cache_clear(void)
{
    pthread_mutex_lock(&cache_mu);
    for (size_t i = 0; i < CACHE_MAX; i++) {
        s3_cred_put(cache[i].cred);
        cache[i].cred = NULL;
    }
    pthread_mutex_unlock(&cache_mu);
}

/* Keys from a pair of settings (both or neither); 1: neither. */
static int key_pair(const char *what, const char *ak, const char *sk, const char *tk,
                    const char *akname, const char *skname, struct s3_cred **out,
                    struct vmsnap_err *err)
{
    if (!ak && !sk)
        return 1;
    if (!ak || !sk)
        return vmsnap_err_set(err, EACCES, "%s: %s is set but %s is not", what,
                              ak ? akname : skname, ak ? skname : akname);
    *out = s3_cred_new(ak, sk, tk, 0);
    return *out ? 0 : vmsnap_err_set(err, ENOMEM, "out of memory");
}

static int src_env(struct s3_creds *cs, const struct s3_profile *p, struct s3_cred **out,
                   char *note, size_t nlen, struct vmsnap_err *err)
{
    if (p->flag) {
        snprintf(note, nlen, "not used with --profile");
        return 1;
    }
    int rc = 1;
    if (cs->cfg.gs)
        rc = key_pair("environment", env("GS_ACCESS_KEY_ID"), env("GS_SECRET_ACCESS_KEY"), NULL,
                      "GS_ACCESS_KEY_ID", "GS_SECRET_ACCESS_KEY", out, err);
    if (rc == 1)
        rc = key_pair("environment", env("AWS_ACCESS_KEY_ID"), env("AWS_SECRET_ACCESS_KEY"),
                      cs->cfg.gs ? NULL : env("AWS_SESSION_TOKEN"), "AWS_ACCESS_KEY_ID",
                      "AWS_SECRET_ACCESS_KEY", out, err);
    if (rc == 1)
        snprintf(note, nlen, "%sAWS_ACCESS_KEY_ID not set",
                 cs->cfg.gs ? "GS_ACCESS_KEY_ID and " : "");
    return rc;
}

/* The profile's keys (credentials file, then credential_process, then config file). */
static int src_profile(struct s3_creds *cs, const struct s3_profile *p, enum src *used,
                       struct s3_cred **out, char *note, size_t nlen, struct vmsnap_err *err)
{
    char what[600];
    snprintf(what, sizeof(what), "profile \"%s\" in %s", p->name, p->cred_path);
    *used = SRC_PROFILE;
    if (!p->in_cred && !p->in_config) {
        snprintf(note, nlen, "no such profile in %s or %s", p->cred_path, p->config_path);
        return 1;
    }
    int rc = key_pair(what, s3_profile_get_src(p, "aws_access_key_id", true),
                      s3_profile_get_src(p, "aws_secret_access_key", true),
                      s3_profile_get_src(p, "aws_session_token", true), "aws_access_key_id",
                      "aws_secret_access_key", out, err);
    if (rc != 1)
        return rc;
    const char *proc = s3_profile_get(p, "credential_process");
    if (proc) {
        *used = SRC_PROCESS;
        if (dup_opt(&cs->cfg.process, proc) < 0)
            return vmsnap_err_set(err, ENOMEM, "out of memory");
        rc = fetch(cs, SRC_PROCESS, out, err);
        if (rc < 0)
            vmsnap_err_wrap(err, "profile \"%s\": ", p->name);
        return rc;
    }
    snprintf(what, sizeof(what), "profile \"%s\" in %s", p->name, p->config_path);
    rc = key_pair(what, s3_profile_get_src(p, "aws_access_key_id", false),
                  s3_profile_get_src(p, "aws_secret_access_key", false),
                  s3_profile_get_src(p, "aws_session_token", false), "aws_access_key_id",
                  "aws_secret_access_key", out, err);
    if (rc != 1)
        return rc;
    if (s3_profile_get(p, "source_profile") || s3_profile_get(p, "credential_source"))
        return vmsnap_err_set(err, ENOTSUP,
                              "profile \"%s\": role_arn with source_profile / credential_source "
                              "(a signed AssumeRole) is not supported: give the role's keys, or a "
                              "credential_process",
                              p->name);
    if (s3_profile_get(p, "sso_session") || s3_profile_get(p, "sso_start_url"))
        return vmsnap_err_set(err, ENOTSUP,
                              "profile \"%s\": SSO is not supported: use credential_process = "
                              "aws configure export-credentials --profile %s --format process",
                              p->name, p->name);
    snprintf(note, nlen, "no aws_access_key_id or credential_process in profile \"%s\"", p->name);
    return 1;
}

/* Append "name (why)" to the list of sources tried. */
static void tried(char *list, size_t len, const char *name, const char *why)
{
    size_t o = strlen(list);
    int n = snprintf(list + o, len - o, "%s%s (", o ? ", " : "", name);
    if (n > 0 && (size_t)n < len - o)
        snprintf(list + o + (size_t)n, len - o - (size_t)n, "%.*s)", (int)(len / 2), why);
}

/* Append a metadata server's failure to the list: its message starts "NAME (ADDRESS): ...",
 * listed as "NAME (ADDRESS: ...)". */
static void tried_failed(char *list, size_t len, const char *name, const char *msg)
{
    char note[600], pre[64];
    snprintf(pre, sizeof(pre), "%s (", name);
    const char *m = strncmp(msg, pre, strlen(pre)) ? msg : msg + strlen(pre);
    snprintf(note, sizeof(note), "%.*s", (int)strcspn(m, ")"), m);
    const char *after = strchr(m, ')');
    if (after && after[1] == ':')
        snprintf(note + strlen(note), sizeof(note) - strlen(note), ":%s", after + 2);
    tried(list, len, name, note);
}

/* gs://, after the HMAC keys: Google's Application Default Credentials. A credentials file
 * named or present is used and its failure stops the chain; the metadata server's joins the
 * list. 1: none gave a token. */
static int walk_google(struct s3_creds *cs, char *list, size_t llen, struct s3_cred **out,
                       enum src *used, struct vmsnap_err *err)
{
    struct s3_chain_cfg *c = &cs->cfg;
    const char *gac = env("GOOGLE_APPLICATION_CREDENTIALS"), *dir = env("CLOUDSDK_CONFIG");
    char path[4200], note[4300];
    if (gac) {
        *used = SRC_GAC;
        c->gcs_file_what = "GOOGLE_APPLICATION_CREDENTIALS";
        snprintf(path, sizeof(path), "%s", gac);
    } else {
        tried(list, llen, "GOOGLE_APPLICATION_CREDENTIALS", "not set");
        *used = SRC_GCLOUD;
        c->gcs_file_what = "gcloud credentials";
        if (dir)
            snprintf(path, sizeof(path), "%s/application_default_credentials.json", dir);
        else
            snprintf(path, sizeof(path), "%s/.config/gcloud/application_default_credentials.json",
                     env("HOME") ? env("HOME") : "");
    }
    if (gac || access(path, F_OK) == 0) {
        if (dup_opt(&c->gcs_file, path) < 0)
            return vmsnap_err_set(err, ENOMEM, "out of memory");
        return fetch(cs, *used, out, err);
    }
    snprintf(note, sizeof(note), "no %s", path);
    tried(list, llen, "gcloud credentials", note);
    *used = SRC_GCE;
    if (truthy(env("NO_GCE_CHECK"))) {
        tried(list, llen, "GCE metadata server", "NO_GCE_CHECK=true");
        return 1;
    }
    int rc = gce_cfg(c, err);
    if (rc < 0)
        return rc;
    struct vmsnap_err gerr = {0};
    rc = fetch(cs, SRC_GCE, out, &gerr);
    if (rc == 0)
        return 0;
    tried_failed(list, llen, "GCE metadata server", gerr.msg);
    return 1;
}

/* Walk the chain: 0 with *out and *used, <0 with err. */
static int walk(struct s3_creds *cs, const struct s3_profile *p, struct s3_cred **out,
                enum src *used, struct vmsnap_err *err)
{
    char list[VMSNAP_ERR_MSG_MAX] = "", note[600], pname[700];
    int rc = src_env(cs, p, out, note, sizeof(note), err);
    *used = SRC_ENV;
    if (rc != 1)
        return rc;
    tried(list, sizeof(list), "environment", note);
    if (!cs->cfg.gs) {
        rc = webid_cfg(&cs->cfg, p, note, sizeof(note), err);
        *used = SRC_WEBID;
        if (rc == 0)
            return fetch(cs, SRC_WEBID, out, err);
        if (rc < 0)
            return rc;
        tried(list, sizeof(list), "web identity", note);
    }
    rc = src_profile(cs, p, used, out, note, sizeof(note), err);
    if (rc != 1)
        return rc;
    snprintf(pname, sizeof(pname), "profile \"%s\"", p->name);
    tried(list, sizeof(list), pname, note);
    if (!cs->cfg.gs) {
        rc = container_cfg(&cs->cfg, err);
        *used = SRC_CONTAINER;
        if (rc == 0)
            return fetch(cs, SRC_CONTAINER, out, err);
        if (rc < 0)
            return rc;
        tried(list, sizeof(list), "container",
              "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI / _FULL_URI not set");
        *used = SRC_IMDS;
        if (cs->cfg.imds_disabled) {
            tried(list, sizeof(list), "instance metadata", "AWS_EC2_METADATA_DISABLED=true");
        } else {
            struct vmsnap_err ierr = {0};
            rc = fetch(cs, SRC_IMDS, out, &ierr);
            if (rc == 0)
                return 0;
            tried_failed(list, sizeof(list), "instance metadata", ierr.msg);
        }
    }
    if (cs->cfg.gs && (rc = walk_google(cs, list, sizeof(list), out, used, err)) != 1)
        return rc;
    return vmsnap_err_set(err, EACCES, "%s: no credentials: tried %s", cs->cfg.url, list);
}

/* When a set fetched now is due for refresh. */
static time_t due_at(const struct s3_creds *cs, const struct s3_cred *c)
{
    if (!c->expires)
        return 0;
    time_t now = time(NULL);
    long life = c->expires > now ? (long)(c->expires - now) : 0;
    long w = life / 2 < cs->window ? life / 2 : cs->window;
    return c->expires - w;
}

int s3_creds_open(struct s3_creds **out, const char *url, bool gs, const char *region,
                  const struct s3_tls *tls, const struct s3_profile *p, struct vmsnap_err *err)
{
    *out = NULL;
    struct s3_creds *cs = calloc(1, sizeof(*cs));
    if (!cs)
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    pthread_mutex_init(&cs->mu, NULL);
    pthread_cond_init(&cs->cv, NULL);
    struct s3_chain_cfg *c = &cs->cfg;
    c->gs = gs;
    c->tls.insecure = tls->insecure;
    int rc = 0;
    if (dup_opt((char **)&c->url, url) < 0 || dup_opt(&c->region, region) < 0 ||
        dup_opt((char **)&c->tls.ca_file, tls->ca_file) < 0 ||
        dup_opt((char **)&c->tls.ca_path, tls->ca_path) < 0)
        rc = vmsnap_err_set(err, ENOMEM, "out of memory");
    c->imds_disabled = truthy(env("AWS_EC2_METADATA_DISABLED"));
    if (rc == 0 && !gs)
        rc = imds_cfg(c, p, err);
    long w = 300;
    if (rc == 0)
        rc = num_setting("VMSNAP_CREDS_REFRESH_SECONDS", p, "vmsnap_creds_refresh_seconds", 1,
                         86400, 300, &w, err);
    cs->window = w;
    struct s3_cred *cr = NULL;
    if (rc == 0)
        rc = walk(cs, p, &cr, &cs->src, err);
    if (rc < 0) {
        s3_creds_free(cs);
        return rc;
    }
    cs->cur = cr;
    cs->refresh_at = due_at(cs, cr);
    if (cr->expires)
        vlog(VMSNAP_LOG_INFO, "s3: credentials from the %s, valid for %lld s", src_name[cs->src],
             (long long)(cr->expires - time(NULL)));
    else
        vlog(VMSNAP_LOG_DEBUG, "s3: credentials from the %s", src_name[cs->src]);
    *out = cs;
    return 0;
}

/* Fetch a new set outside the lock; the lock is held on entry and on return. */
static void refresh_locked(struct s3_creds *cs)
{
    cs->refreshing = true;
    pthread_mutex_unlock(&cs->mu);
    struct s3_cred *n = NULL;
    struct vmsnap_err e = {0};
    int rc = fetch(cs, cs->src, &n, &e);
    pthread_mutex_lock(&cs->mu);
    cs->refreshing = false;
    cs->gen++;
    cs->fail_rc = rc;
    time_t now = time(NULL);
    if (rc == 0) {
        s3_cred_put(cs->cur);
        cs->cur = n;
        cs->refresh_at = due_at(cs, n);
        cs->retry_at = 0;
        vlog(VMSNAP_LOG_INFO, "s3: credentials refreshed from the %s, valid for %lld s",
             src_name[cs->src], (long long)(n->expires ? n->expires - now : 0));
    } else {
        cs->fail_err = e;
        cs->retry_at = now + RETRY_AFTER_FAIL;
        if (cs->cur && now < cs->cur->expires)
            vlog(VMSNAP_LOG_WARN,
                 "s3: refreshing the credentials failed (%s); the current ones are valid for "
                 "%lld s more",
                 e.msg, (long long)(cs->cur->expires - now));
    }
    pthread_cond_broadcast(&cs->cv);
}

int s3_creds_get(struct s3_creds *cs, struct s3_cred **out, struct vmsnap_err *err)
{
    pthread_mutex_lock(&cs->mu);
    const unsigned seen = cs->gen;
    int rc = 0;
    for (;;) {
        const time_t now = time(NULL);
        const struct s3_cred *c = cs->cur;
        const bool valid = !c->expires || now < c->expires;
        const bool due = c->expires && now >= cs->refresh_at && now >= cs->retry_at;
        if (valid && (!due || cs->refreshing))
            break; /* good, or another thread is replacing them: these until then */
        if (cs->refreshing) {
            pthread_cond_wait(&cs->cv, &cs->mu);
            continue;
        }
        if (!valid && (cs->gen != seen || now < cs->retry_at)) {
            /* a refresh since this call began, or a failed one just before, left them expired:
             * its error is this request's (each waiter gets it, none retries on its own) */
            if (cs->fail_rc) {
                rc = -(cs->fail_err.code > 0 ? cs->fail_err.code : EACCES);
                if (err)
                    *err = cs->fail_err;
                vmsnap_err_wrap(
                    err, "%s: the credentials expired and could not be refreshed: ", cs->cfg.url);
            } else {
                rc = vmsnap_err_set(err, EACCES,
                                    "%s: the credentials from the %s expired when handed out "
                                    "(is this host's clock right?)",
                                    cs->cfg.url, src_name[cs->src]);
            }
            break;
        }
        refresh_locked(cs);
    }
    if (rc == 0) {
        atomic_fetch_add(&cs->cur->refs, 1);
        *out = cs->cur;
    }
    pthread_mutex_unlock(&cs->mu);
    return rc;
}

const char *s3_creds_source(const struct s3_creds *cs)
{
    return src_name[cs->src];
}

void s3_creds_free(struct s3_creds *cs)
{
    if (!cs)
        return;
    s3_cred_put(cs->cur);
    cfg_fini(&cs->cfg);
    pthread_mutex_destroy(&cs->mu);
    pthread_cond_destroy(&cs->cv);
    free(cs);
}
