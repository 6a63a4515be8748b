/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Private: where an S3 store's credentials and settings come from (docs/credentials.md).
 *
 *   - s3_profile.c reads the AWS shared files (~/.aws/credentials and ~/.aws/config, or
 *     AWS_SHARED_CREDENTIALS_FILE / AWS_CONFIG_FILE) and keeps the settings of one profile.
 *   - s3_fetch.c makes the credential providers' plain HTTP requests (their own CURL handle,
 *     short timeouts, the store's TLS settings and User-Agent).
 *   - s3_providers.c: the sources that hand out temporary credentials (web identity through
 *     STS, container endpoint, instance metadata IMDSv2, credential_process).
 *   - s3_gcs_token.c: gs:// OAuth 2.0 access tokens (a Google credentials file: service-account
 *     key or gcloud's authorized user; the GCE metadata server); s3_gcs_jwt.c signs the
 *     service account's JWT (RS256, libcrypto loaded on first use).
 *   - s3_creds.c: the chain in the order the AWS SDKs use (for gs://, then Google's Application
 *     Default Credentials), and the current credentials of a store, refreshed before they
 *     expire.
 *
 * Secrets (keys, tokens, the providers' answers) are never put in a message or a log line, and
 * are wiped when freed.
 */
#ifndef VMSNAP_S3_CREDS_H
#define VMSNAP_S3_CREDS_H

#include "s3_int.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <time.h>

/* The User-Agent of every request, S3's and the providers'. */
#define S3_USER_AGENT "vmsnap/" VMSNAP_VERSION

/* ---- the shared files (s3_profile.c) ----------------------------------------------------- */

struct s3_kv {
    char *key; /* lowercase; a nested one as "s3.addressing_style" */
    char *val;
    bool from_cred; /* from the credentials file (else the config file) */
};

struct s3_profile {
    char *name; /* the profile in use */
    bool named; /* chosen by --profile or AWS_PROFILE, not "default" by default */
    bool flag;  /* chosen by --profile (the environment's keys are then not used) */
    char *cred_path, *config_path;
    bool in_cred, in_config; /* the profile has a section there */
    struct s3_kv *kv;        /* the credentials file's first */
    size_t n, cap;
};

/* Select the profile (flag_profile, else AWS_PROFILE, else AWS_DEFAULT_PROFILE, else
 * "default") and read its settings from both files. A missing file is no error; a file that
 * cannot be read, or has a line that is not INI (the message names file and line), is. A profile
 * named by the flag or the environment that is in neither file is an error (as for the AWS
 * CLI). s3_profile_fini frees (also after a failure). */
int s3_profile_load(struct s3_profile *p, const char *flag_profile, struct vmsnap_err *err);
void s3_profile_fini(struct s3_profile *p);
/* The parser under s3_profile_load, on one file's bytes (untrusted; no I/O): the settings of
 * the profile p->name (set, as the rest of *p, by the caller: zeroed but for the name) found in
 * buf[0..len) are added to *p, p->in_cred or p->in_config set when its section is there. `path`
 * names the file in messages; `cred` says which file this is (the credentials file's sections
 * are "[name]", the config file's "[profile name]"). buf is cut into lines in place and must
 * hold buf[len] (a NUL or anything: it is written); the caller wipes it. 0, or -EINVAL with a
 * message naming path and line, never the line's text (it may hold a secret); -ENOMEM. */
int s3_profile_parse(struct s3_profile *p, const char *path, bool cred, char *buf, size_t len,
                     struct vmsnap_err *err);
/* A setting of `service` ("s3", "sts") in the [services NAME] section the profile names with
 * `services = NAME`, or NULL. */
const char *s3_profile_service(const struct s3_profile *p, const char *service, const char *key);
/* A setting of the profile, or NULL (the credentials file's value wins over the config's).
 * s3_profile_get_src also says from which file. */
const char *s3_profile_get(const struct s3_profile *p, const char *key);
const char *s3_profile_get_src(const struct s3_profile *p, const char *key, bool from_cred);

/* ---- credentials --------------------------------------------------------------------------- */

/* One set of credentials, immutable once made and shared by reference: a thread signing a
 * request holds a reference while it signs, so a refresh never changes keys under it. */
struct s3_cred {
    atomic_uint refs;
    char *access_key, *secret_key, *token; /* token NULL if none */
    time_t expires;                        /* 0: does not expire */
    bool bearer; /* an OAuth 2.0 access token (gs://): `token` is sent as "Authorization: Bearer",
                  * nothing is signed; access_key and secret_key are NULL */
};

/* A new credential set from copies of the strings (token and expires optional); NULL when out
 * of memory. s3_cred_put drops a reference (NULL allowed), wiping the secrets with the last. */
struct s3_cred *s3_cred_new(const char *ak, const char *sk, const char *token, time_t expires);
/* An OAuth 2.0 access token valid until `expires`; NULL when out of memory. */
struct s3_cred *s3_cred_new_bearer(const char *token, time_t expires);
void s3_cred_put(struct s3_cred *c);

/* Credentials kept across stores (s3_creds.c): how many sets were fetched from a provider, how
 * many times a store took one fetched by an earlier store; clear drops every kept set. */
void s3_creds_cache_stats(uint64_t *fetched, uint64_t *reused);
void s3_creds_cache_clear(void);

/* The TLS settings of a store, for S3's requests and the providers'. */
struct s3_tls {
    const char *ca_file; /* NULL: libcurl's default store */
    const char *ca_path;
    bool insecure;
};

/* Apply TLS settings and the User-Agent to a handle (s3_fetch.c). */
void s3_curl_common(void *curl_handle, const struct s3_tls *tls);

/* One plain HTTP request of a provider (s3_fetch.c). `headers` are "Name: value" lines (they may
 * hold a token: never logged). Retried on transport errors and 5xx up to `attempts`. On an
 * answer, 0 with *status and the body in *resp (capped at resp->max: -EFBIG); a transport failure
 * after the retries: <0 with a message naming `what` and the URL's scheme, host and port. */
struct s3_fetch_req {
    const char *what; /* "instance metadata", for messages */
    const char *method;
    const char *url;
    const char *const *headers;
    size_t nheaders;
    const char *body; /* POST/PUT body, may be NULL */
    size_t body_len;
    long connect_timeout_ms, timeout_ms;
    unsigned attempts;
    const struct s3_tls *tls;
    /* optional: a response header to capture (its name, e.g. "Metadata-Flavor"); its value,
     * blanks cut, lands in resp_header_val (resp_header_len bytes, "" when absent; the final
     * response's) */
    const char *resp_header;
    char *resp_header_val;
    size_t resp_header_len;
};
int s3_fetch(const struct s3_fetch_req *f, struct dbuf *resp, long *status, struct vmsnap_err *err);
/* A secret file (a credentials file, a token), whole, into b (at most b->max bytes: EFBIG);
 * messages name `what` and the path ("token file PATH" when `token`), never the content; the
 * read buffer is wiped, b is the caller's to wipe (s3_providers.c). */
int s3_read_secret_file(const char *what, const char *path, bool token, struct dbuf *b,
                        struct vmsnap_err *err);
/* "scheme://host[:port]" of a URL (no user info, no path: a path may be a capability). */
void s3_url_origin(const char *url, char *out, size_t len);

/* Everything the providers need, frozen when the store is opened (s3_creds.c fills it). */
struct s3_chain_cfg {
    bool gs; /* gs://: HMAC keys (environment, profile), then Google's OAuth 2.0 sources */
    const char *url;
    char *region;
    struct s3_tls tls;
    /* web identity */
    char *wi_token_file, *wi_role_arn, *wi_session_name, *sts_endpoint;
    /* credential_process */
    char *process;
    /* container */
    char *ct_url, *ct_auth, *ct_auth_file;
    /* instance metadata */
    char *imds_endpoint;
    bool imds_disabled;
    long imds_timeout_ms;
    unsigned imds_attempts;
    /* gs://: a Google credentials file (GOOGLE_APPLICATION_CREDENTIALS, or gcloud's), the GCE
     * metadata server ("http://HOST[:PORT]") */
    char *gcs_file;
    const char *gcs_file_what; /* "GOOGLE_APPLICATION_CREDENTIALS" or "gcloud credentials" */
    char *gce_url;
    long gce_timeout_ms;
};

/* The providers (s3_providers.c): each returns 0 with *out (a new reference), or <0 with err
 * filled (the message names the source and where it went, never a secret). */
int s3_src_web_identity(const struct s3_chain_cfg *c, struct s3_cred **out, struct vmsnap_err *err);
int s3_src_container(const struct s3_chain_cfg *c, struct s3_cred **out, struct vmsnap_err *err);
int s3_src_imds(const struct s3_chain_cfg *c, struct s3_cred **out, struct vmsnap_err *err);
int s3_src_process(const struct s3_chain_cfg *c, struct s3_cred **out, struct vmsnap_err *err);
/* The providers' parsers (s3_providers.c), on an answer's bytes (untrusted; no I/O; buf need
 * not be NUL-terminated; the caller wipes it).
 *   s3_cred_parse_json: a JSON object {AccessKeyId, SecretAccessKey, Token, Expiration (ISO
 *     8601, required when need_exp)} as the container endpoint and instance metadata answer;
 *     with `process`, credential_process's output (SessionToken, and "Version": 1 required).
 *   s3_cred_parse_sts: STS's AssumeRoleWithWebIdentity answer (XML: Credentials with
 *     AccessKeyId, SecretAccessKey, SessionToken, Expiration, all required).
 * Each returns 0 with *out (a new reference; access and secret key non-empty, no control
 * character in them or the token: they go into headers), or <0 with err filled: -EPROTO for an
 * answer that is not what the source sends (the message names `what` and, for STS, `origin`;
 * never a key, a token or the answer's text), -EFBIG, -ENOMEM. */
int s3_cred_parse_json(const char *what, const char *buf, size_t len, bool process, bool need_exp,
                       struct s3_cred **out, struct vmsnap_err *err);
int s3_cred_parse_sts(const char *what, const char *origin, const char *buf, size_t len,
                      struct s3_cred **out, struct vmsnap_err *err);
/* gs:// (s3_gcs_token.c): an access token from the Google credentials file c->gcs_file (a
 * service account's key, whose JWT is exchanged at its token_uri, or gcloud's authorized user,
 * whose refresh token is), or from the GCE metadata server c->gce_url. Errors as above; a token
 * endpoint's refusal (a bad signature, a revoked key) is -EACCES. */
int s3_src_gcs_file(const struct s3_chain_cfg *c, struct s3_cred **out, struct vmsnap_err *err);
int s3_src_gce_metadata(const struct s3_chain_cfg *c, struct s3_cred **out, struct vmsnap_err *err);

/* The parsers under them (s3_gcs_token.c), on untrusted bytes (no I/O; buf need not be
 * NUL-terminated; the caller wipes it).
 *   s3_gcs_file_parse: a Google credentials file into *f (s3_gcs_file_fini frees, wiping the
 *     secrets; after a failure there is nothing to free): its type and the members that type
 *     needs, token_uri checked (https, or http to loopback). <0 with a message naming `what`
 *     (the file), never a secret: -EACCES for a file that cannot be used, -ENOTSUP for
 *     external_account, -EFBIG, -ENOMEM.
 *   s3_gcs_token_parse: a token endpoint's or the metadata server's answer {"access_token",
 *     "expires_in" (1 s to 7 days), "token_type": "Bearer"}: 0 with *out (a bearer token, no
 *     blank or control character, expiring at now + expires_in), or -EPROTO naming `what`
 *     and `origin`, never the token; -ENOMEM.
 *   s3_gcs_token_refused: the error of an endpoint's refusal (HTTP `status`, the answer's
 *     "error" and "error_description" cut to printable text in the message): always <0. */
struct s3_gcs_file {
    bool service_account;                              /* else gcloud's authorized_user */
    char *client_email, *private_key, *private_key_id; /* service_account (the id may be NULL) */
    char *client_id, *client_secret, *refresh_token;   /* authorized_user */
    char *token_uri;                                   /* the file's, or Google's */
};
int s3_gcs_file_parse(const char *what, const char *buf, size_t len, struct s3_gcs_file *f,
                      struct vmsnap_err *err);
void s3_gcs_file_fini(struct s3_gcs_file *f);
int s3_gcs_token_parse(const char *what, const char *origin, const char *buf, size_t len,
                       time_t now, struct s3_cred **out, struct vmsnap_err *err);
int s3_gcs_token_refused(const char *what, const char *who, const char *origin, long status,
                         const char *buf, size_t len, struct vmsnap_err *err);

/* The signed JWT a service account sends to its token endpoint (s3_gcs_jwt.c): header
 * {"alg":"RS256","typ":"JWT"[,"kid"]}, claims iss, scope, aud, iat = now, exp = now + 3600,
 * signed with the PEM private key (RSA, unencrypted) through libcrypto. 0 with *out (malloc'd:
 * free it); <0 with a message naming `what` (the key file), never the key: -EACCES for a key
 * that cannot be used. */
int s3_gcs_jwt(const char *what, const char *pem, const char *kid, const char *iss,
               const char *scope, const char *aud, time_t now, char **out, struct vmsnap_err *err);

/* An ISO 8601 UTC time ("2026-05-01T12:00:00Z", fractions allowed) as Unix seconds; -1 if bad. */
time_t s3_parse_iso8601(const char *s);

/* A store's credentials: the chain resolved, and the current set refreshed when due. */
struct s3_creds;

/* Resolve the chain for a store (s3_creds.c's header lists it; gs:// ends with Google's
 * sources, whose access tokens are s3_cred.bearer): the first source that gives credentials
 * wins. When none does,
 * -EACCES with a message naming each source tried and why it gave none; a source that is
 * configured but fails (an STS error, a token file missing) fails at once, naming it. `p` is the
 * loaded profile; `url` names the store in messages. */
int s3_creds_open(struct s3_creds **out, const char *url, bool gs, const char *region,
                  const struct s3_tls *tls, const struct s3_profile *p, struct vmsnap_err *err);
/* The current credentials (a new reference: s3_cred_put when signed). Thread-safe: when they
 * are due for a refresh (VMSNAP_CREDS_REFRESH_SECONDS before they expire, default 300, or half
 * their lifetime when that is shorter) one caller fetches new ones from the same source while
 * the others keep signing with the current ones until they are replaced; once expired, callers
 * wait for the refresh. A failed refresh keeps the current ones while they are valid (retried
 * after a few seconds); after expiry it is the request's error. */
int s3_creds_get(struct s3_creds *cs, struct s3_cred **out, struct vmsnap_err *err);
/* The source in use ("environment", "instance metadata", ...), for the -v log. */
const char *s3_creds_source(const struct s3_creds *cs);
void s3_creds_free(struct s3_creds *cs);

#endif
