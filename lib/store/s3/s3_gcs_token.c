/* SPDX-License-Identifier: Apache-2.0 */
/*
 * OAuth 2.0 access tokens for gs:// stores, from the sources of Google's Application Default
 * Credentials; the Cloud Storage XML API takes them as "Authorization: Bearer TOKEN".
 *
 *   - A Google credentials file (GOOGLE_APPLICATION_CREDENTIALS, or gcloud's
 *     application_default_credentials.json), JSON:
 *       "type": "service_account": a JWT (s3_gcs_jwt.c) signed with its private_key, iss its
 *         client_email, aud its token_uri, scope devstorage.read_write, POSTed to token_uri as
 *         grant_type=urn:ietf:params:oauth:grant-type:jwt-bearer (RFC 7523);
 *       "type": "authorized_user" (what `gcloud auth application-default login` writes): its
 *         refresh_token, client_id and client_secret POSTed as grant_type=refresh_token.
 *     The file is read again at every fetch (a rotated key is picked up at the next refresh).
 *     token_uri must be https, or http to a loopback address (the JWT is a bearer assertion).
 *   - The GCE metadata server (GCE, GKE with Workload Identity, Cloud Run): GET
 *     /computeMetadata/v1/instance/service-accounts/default/token with "Metadata-Flavor:
 *     Google"; the answer must carry the same header, or it is not a metadata server (on EC2,
 *     169.254.169.254 is AWS's instance metadata). Short timeouts: a node elsewhere falls
 *     through fast.
 *
 * Both answer {"access_token", "expires_in", "token_type": "Bearer"}; expires_in makes the
 * Expiration that s3_creds.c refreshes by. Nothing of a file's secrets, an assertion or an
 * answer is put in a message (an error's "error" and "error_description" are, cut to
 * printable text: Google's say what was wrong, never a secret); buffers that held them are
 * wiped.
 */
#include "s3_creds.h"

#include "util/util.h"

#include <errno.h>
#include <fcntl.h>
#include <json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#define FILE_CAP (64u << 10)
#define ANSWER_CAP (64u << 10)
#define TOKEN_MAX 8192
#define GCS_SCOPE "https://www.googleapis.com/auth/devstorage.read_write"
#define GOOGLE_TOKEN_URI "https://oauth2.googleapis.com/token"
#define JWT_GRANT "urn:ietf:params:oauth:grant-type:jwt-bearer"

static void wipe_dbuf(struct dbuf *b)
{
    if (b->p) {
        explicit_bzero(b->p, b->cap);
        free(b->p);
    }
    b->p = NULL;
    b->len = b->cap = 0;
}

/* A string that held a secret, wiped and freed. */
static void wipe_str(char *s)
{
    if (s) {
        explicit_bzero(s, strlen(s));
        free(s);
    }
}

/* A whole JSON object from len bytes; NULL if the text is anything else. */
static json_object *parse_object(const char *p, size_t len)
{
    json_tokener *tok = json_tokener_new_ex(16);
    if (!tok)
        return NULL;
    json_object *o = json_tokener_parse_ex(tok, p ? p : "", (int)len);
    bool whole = json_tokener_get_error(tok) == json_tokener_success &&
                 (size_t)json_tokener_get_parse_end(tok) == len;
    json_tokener_free(tok);
    if (o && (!whole || !json_object_is_type(o, json_type_object))) {
        json_object_put(o);
        o = NULL;
    }
    return o;
}

static const char *jstr(json_object *o, const char *key)
{
    json_object *v;
    if (!json_object_object_get_ex(o, key, &v) || !json_object_is_type(v, json_type_string))
        return NULL;
    const char *s = json_object_get_string(v);
    return s && *s ? s : NULL;
}

/* A secret string member wiped in place before the object is freed (json-c does not). */
static void jwipe(json_object *o, const char *key)
{
    const char *s = jstr(o, key);
    if (s)
        explicit_bzero((char *)s, strlen(s));
}

/* Printable text of an untrusted string for a message: at most 200 characters, others '?'. */
static void printable(const char *s, char *out, size_t len)
{
    size_t i = 0;
    for (; s && s[i] && i < 200 && i + 1 < len; i++)
        out[i] = s[i] >= 0x20 && s[i] < 0x7f ? s[i] : '?';
    out[i] = '\0';
}

int s3_gcs_token_parse(const char *what, const char *origin, const char *buf, size_t len,
                       time_t now, struct s3_cred **out, struct vmsnap_err *err)
{
    json_object *o = len <= ANSWER_CAP ? parse_object(buf, len) : NULL, *ex = NULL;
    if (!o)
        return vmsnap_err_set(err, EPROTO, "%s (%s): the answer is not a JSON object", what,
                              origin);
    const char *tok = jstr(o, "access_token"), *type = jstr(o, "token_type");
    int64_t secs = 0;
    if (json_object_object_get_ex(o, "expires_in", &ex) && json_object_is_type(ex, json_type_int))
        secs = json_object_get_int64(ex);
    bool tok_ok = tok && strlen(tok) <= TOKEN_MAX;
    for (const char *p = tok; tok_ok && *p; p++)
        tok_ok = *p > 0x20 && *p < 0x7f; /* it becomes a header: no blank, no CR/LF */
    int rc = 0;
    if (!tok_ok)
        rc = vmsnap_err_set(err, EPROTO, "%s (%s): no usable access_token in the answer", what,
                            origin);
    else if (type && strcasecmp(type, "Bearer"))
        rc = vmsnap_err_set(err, EPROTO, "%s (%s): token_type is not Bearer", what, origin);
    else if (secs < 1 || secs > 7 * 86400)
        rc = vmsnap_err_set(err, EPROTO, "%s (%s): no expires_in (1 s to 7 days) in the answer",
                            what, origin);
    else if (!(*out = s3_cred_new_bearer(tok, now + (time_t)secs)))
        rc = vmsnap_err_set(err, ENOMEM, "out of memory");
    jwipe(o, "access_token");
    jwipe(o, "id_token");
    jwipe(o, "refresh_token");
    json_object_put(o);
    return rc;
}

int s3_gcs_token_refused(const char *what, const char *who, const char *origin, long status,
                         const char *buf, size_t len, struct vmsnap_err *err)
{
    char code[256] = "", desc[256] = "";
    json_object *o = len <= ANSWER_CAP ? parse_object(buf, len) : NULL;
    if (o) {
        printable(jstr(o, "error"), code, sizeof(code));
        printable(jstr(o, "error_description"), desc, sizeof(desc));
        json_object_put(o);
    }
    int e = status >= 500 || status == 429 ? EAGAIN : status >= 400 ? EACCES : EPROTO;
    return vmsnap_err_set(err, e, "%s: the token endpoint %s refused %s: HTTP %ld %s%s%s", what,
                          origin, who, status, code[0] ? code : "(no error code)",
                          desc[0] ? ": " : "", desc);
}

/* token_uri must be https, or plain http to loopback only (tests, a local proxy). */
static int token_uri_ok(const char *what, const char *uri, struct vmsnap_err *err)
{
    if (!strncasecmp(uri, "https://", 8))
        return 0;
    char origin[300];
    s3_url_origin(uri, origin, sizeof(origin));
    if (!strncasecmp(uri, "http://", 7)) {
        const char *h = origin + 7;
        size_t hl = h[0] == '[' ? strcspn(h, "]") + 1 : strcspn(h, ":");
        if ((hl == 9 && !strncasecmp(h, "localhost", 9)) || !strncmp(h, "127.", 4) ||
            (hl == 5 && !strncmp(h, "[::1]", 5)))
            return 0;
    }
    return vmsnap_err_set(err, EACCES,
                          "%s: token_uri %s: expected https:// (plain http only to a loopback "
                          "address)",
                          what, origin);
}

/* POST a form to the token endpoint and take the token from its answer. */
static int token_post(const struct s3_chain_cfg *c, const char *what, const char *who,
                      const char *uri, const char *form, struct s3_cred **out,
                      struct vmsnap_err *err)
{
    char origin[300];
    s3_url_origin(uri, origin, sizeof(origin));
    const char *hdr[] = {"Accept: application/json",
                         "Content-Type: application/x-www-form-urlencoded"};
    struct s3_fetch_req f = {.what = what,
                             .method = "POST",
                             .url = uri,
                             .headers = hdr,
                             .nheaders = 2,
                             .body = form,
                             .body_len = strlen(form),
                             .connect_timeout_ms = 5000,
                             .timeout_ms = 30000,
                             .attempts = 3,
                             .tls = &c->tls};
    struct dbuf resp = {.max = ANSWER_CAP};
    long status = 0;
    int rc = s3_fetch(&f, &resp, &status, err);
    if (rc == 0 && status != 200)
        rc = s3_gcs_token_refused(what, who, origin, status, resp.p, resp.len, err);
    else if (rc == 0)
        rc = s3_gcs_token_parse(what, origin, resp.p, resp.len, time(NULL), out, err);
    wipe_dbuf(&resp);
    return rc;
}

/* "name=value&..." of n pairs, each value percent-encoded; malloc'd, NULL if out of memory. */
static char *form_encode(const char *const *kv, size_t n)
{
    size_t cap = 1;
    for (size_t i = 0; i < n; i++)
        cap += strlen(kv[2 * i]) + 3 * strlen(kv[2 * i + 1]) + 2;
    char *out = malloc(cap);
    if (!out)
        return NULL;
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        o += (size_t)snprintf(out + o, cap - o, "%s%s=", i ? "&" : "", kv[2 * i]);
        int k = sigv4_uri_encode(kv[2 * i + 1], false, out + o, cap - o);
        if (k < 0) {
            wipe_str(out);
            return NULL;
        }
        o += (size_t)k;
    }
    return out;
}

/* A service account: its JWT exchanged at its token_uri. */
static int from_service_account(const struct s3_chain_cfg *c, const char *what,
                                const struct s3_gcs_file *f, struct s3_cred **out,
                                struct vmsnap_err *err)
{
    char *jwt = NULL;
    int rc = s3_gcs_jwt(what, f->private_key, f->private_key_id, f->client_email, GCS_SCOPE,
                        f->token_uri, time(NULL), &jwt, err);
    if (rc < 0)
        return rc;
    const char *kv[] = {"grant_type", JWT_GRANT, "assertion", jwt};
    char *form = form_encode(kv, 2);
    char who[400];
    snprintf(who, sizeof(who), "the JWT of %.300s", f->client_email);
    if (!form)
        rc = vmsnap_err_set(err, ENOMEM, "out of memory");
    else
        rc = token_post(c, what, who, f->token_uri, form, out, err);
    wipe_str(jwt);
    wipe_str(form);
    return rc;
}

/* gcloud's authorized user: its refresh token exchanged at the token endpoint. */
static int from_authorized_user(const struct s3_chain_cfg *c, const char *what,
                                const struct s3_gcs_file *f, struct s3_cred **out,
                                struct vmsnap_err *err)
{
    const char *kv[] = {"grant_type",    "refresh_token",  "client_id",     f->client_id,
                        "client_secret", f->client_secret, "refresh_token", f->refresh_token};
    char *form = form_encode(kv, 4);
    if (!form)
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    int rc = token_post(c, what, "the refresh token", f->token_uri, form, out, err);
    wipe_str(form);
    return rc;
}

/* A string member copied into *dst (NULL when absent or empty); false when out of memory. */
static bool take(json_object *o, const char *key, char **dst)
{
    const char *v = jstr(o, key);
    *dst = v ? strdup(v) : NULL;
    return !v || *dst;
}

/* The members of one type, checked as from_service_account / from_authorized_user need them. */
static int file_fields(const char *what, json_object *o, struct s3_gcs_file *f,
                       struct vmsnap_err *err)
{
    bool mem = true;
    if (f->service_account) {
        mem = take(o, "client_email", &f->client_email) &&
              take(o, "private_key", &f->private_key) &&
              take(o, "private_key_id", &f->private_key_id);
        if (mem && (!f->client_email || !f->private_key))
            return vmsnap_err_set(err, EACCES, "%s: a service_account without %s", what,
                                  f->client_email ? "private_key" : "client_email");
    } else {
        mem = take(o, "client_id", &f->client_id) && take(o, "client_secret", &f->client_secret) &&
              take(o, "refresh_token", &f->refresh_token);
        if (mem && (!f->client_id || !f->client_secret || !f->refresh_token))
            return vmsnap_err_set(err, EACCES,
                                  "%s: an authorized_user without client_id, client_secret or "
                                  "refresh_token (run 'gcloud auth application-default login')",
                                  what);
    }
    if (mem && !take(o, "token_uri", &f->token_uri))
        mem = false;
    if (mem && !f->token_uri && !(f->token_uri = strdup(GOOGLE_TOKEN_URI)))
        mem = false;
    if (!mem)
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    return token_uri_ok(what, f->token_uri, err);
}

int s3_gcs_file_parse(const char *what, const char *buf, size_t len, struct s3_gcs_file *f,
                      struct vmsnap_err *err)
{
    memset(f, 0, sizeof(*f));
    if (len > FILE_CAP)
        return vmsnap_err_set(err, EFBIG, "%s: larger than %u bytes", what, FILE_CAP);
    json_object *o = parse_object(buf, len);
    if (!o)
        return vmsnap_err_set(err, EACCES, "%s: not a JSON object (a Google credentials file)",
                              what);
    const char *type = jstr(o, "type");
    char t[64];
    printable(type, t, sizeof(t));
    int rc;
    if (type && (!strcmp(type, "service_account") || !strcmp(type, "authorized_user"))) {
        f->service_account = !strcmp(type, "service_account");
        rc = file_fields(what, o, f, err);
    } else if (type && !strcmp(type, "external_account")) {
        rc = vmsnap_err_set(err, ENOTSUP,
                            "%s: external_account (workload identity federation) is not "
                            "supported: use a service account key, or run on GCE/GKE",
                            what);
    } else {
        rc = vmsnap_err_set(err, EACCES,
                            "%s: \"type\" is %s%s%s, expected service_account or authorized_user",
                            what, type ? "'" : "missing", t, type ? "'" : "");
    }
    jwipe(o, "private_key");
    jwipe(o, "client_secret");
    jwipe(o, "refresh_token");
    json_object_put(o);
    if (rc < 0)
        s3_gcs_file_fini(f);
    return rc;
}

void s3_gcs_file_fini(struct s3_gcs_file *f)
{
    free(f->client_email);
    wipe_str(f->private_key);
    free(f->private_key_id);
    free(f->client_id);
    wipe_str(f->client_secret);
    wipe_str(f->refresh_token);
    free(f->token_uri);
    memset(f, 0, sizeof(*f));
}

int s3_src_gcs_file(const struct s3_chain_cfg *c, struct s3_cred **out, struct vmsnap_err *err)
{
    char what[1200];
    snprintf(what, sizeof(what), "%s %s", c->gcs_file_what, c->gcs_file);
    struct dbuf b = {.max = FILE_CAP};
    struct s3_gcs_file f;
    int rc = s3_read_secret_file(what, c->gcs_file, false, &b, err);
    if (rc == 0)
        rc = s3_gcs_file_parse(what, b.p, b.len, &f, err);
    wipe_dbuf(&b);
    if (rc < 0)
        return rc;
    if (f.service_account)
        rc = from_service_account(c, what, &f, out, err);
    else
        rc = from_authorized_user(c, what, &f, out, err);
    s3_gcs_file_fini(&f);
    return rc;
}

int s3_src_gce_metadata(const struct s3_chain_cfg *c, struct s3_cred **out, struct vmsnap_err *err)
{
    const char *what = "GCE metadata server";
    char url[1200], flavor[64] = "";
    snprintf(url, sizeof(url), "%s/computeMetadata/v1/instance/service-accounts/default/token",
             c->gce_url);
    const char *hdr[] = {"Metadata-Flavor: Google"};
    struct s3_fetch_req f = {.what = what,
                             .method = "GET",
                             .url = url,
                             .headers = hdr,
                             .nheaders = 1,
                             .connect_timeout_ms = c->gce_timeout_ms,
                             .timeout_ms = c->gce_timeout_ms + 10000,
                             .attempts = 2,
                             .tls = &c->tls,
                             .resp_header = "Metadata-Flavor",
                             .resp_header_val = flavor,
                             .resp_header_len = sizeof(flavor)};
    struct dbuf resp = {.max = ANSWER_CAP};
    long status = 0;
    int rc = s3_fetch(&f, &resp, &status, err);
    if (rc == 0 && strcmp(flavor, "Google"))
        rc = vmsnap_err_set(err, EPROTO,
                            "%s (%s): the answer (HTTP %ld) lacks 'Metadata-Flavor: Google': "
                            "not a GCE metadata server",
                            what, c->gce_url, status);
    else if (rc == 0 && status == 404)
        rc = vmsnap_err_set(err, ENOENT, "%s (%s): no service account on this instance (HTTP 404)",
                            what, c->gce_url);
    else if (rc == 0 && status != 200)
        rc = vmsnap_err_set(err, status == 401 || status == 403 ? EACCES : EIO,
                            "%s (%s): HTTP %ld for the default service account's token", what,
                            c->gce_url, status);
    else if (rc == 0)
        rc = s3_gcs_token_parse(what, c->gce_url, resp.p, resp.len, time(NULL), out, err);
    wipe_dbuf(&resp);
    return rc;
}
