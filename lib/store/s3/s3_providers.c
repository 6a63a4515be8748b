/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The sources of temporary credentials, each one request (or three, for instance metadata) on
 * s3_fetch():
 *
 *   - web identity: the token file (re-read every time: Kubernetes rotates it) sent to STS
 *     AssumeRoleWithWebIdentity, an unsigned form POST; the answer is XML.
 *   - container: a GET of the ECS / EKS Pod Identity endpoint with the Authorization token
 *     (its file re-read every time); the answer is JSON.
 *   - instance metadata, IMDSv2 only: PUT /latest/api/token (the session token, asked for six
 *     hours), then GET /latest/meta-data/iam/security-credentials/ (the role) and .../ROLE
 *     (JSON), both with the token. IMDSv1 (no token) is never used.
 *   - credential_process: a command run by /bin/sh -c whose standard output is JSON (Version 1).
 *
 * Answers are capped (64 KiB) and parsed with json-c or the XML reader; nothing of an answer,
 * a token or a key is put in a message. Buffers that held secrets are wiped.
 */
#include "s3_creds.h"

#include "util/util.h"

#include <errno.h>
#include <fcntl.h>
#include <json.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

#define ANSWER_CAP (64u << 10)
#define TOKEN_FILE_CAP (16u << 10)

time_t s3_parse_iso8601(const char *s)
{
    struct tm tm = {0};
    int y, mo, d, h, mi, sec, n = 0;
    if (sscanf(s, "%4d-%2d-%2dT%2d:%2d:%2d%n", &y, &mo, &d, &h, &mi, &sec, &n) != 6 || n != 19)
        return -1;
    const char *p = s + n;
    if (*p == '.')
        for (p++; *p >= '0' && *p <= '9'; p++)
            ;
    long off = 0;
    if (*p == 'Z' && !p[1]) {
        off = 0;
    } else if ((*p == '+' || *p == '-') && strlen(p) == 6 && p[3] == ':') {
        int oh, om;
        if (sscanf(p + 1, "%2d:%2d", &oh, &om) != 2)
            return -1;
        off = (*p == '+' ? 1 : -1) * (oh * 3600L + om * 60L);
    } else {
        return -1;
    }
    if (mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 || mi > 59 || sec > 60)
        return -1;
    tm.tm_year = y - 1900;
    tm.tm_mon = mo - 1;
    tm.tm_mday = d;
    tm.tm_hour = h;
    tm.tm_min = mi;
    tm.tm_sec = sec;
    time_t t = timegm(&tm);
    return t == (time_t)-1 ? -1 : t - off;
}

static void dbuf_wipe(struct dbuf *b)
{
    if (b->p) {
        explicit_bzero(b->p, b->cap);
        free(b->p);
    }
    b->p = NULL;
    b->len = b->cap = 0;
}

int s3_read_secret_file(const char *what, const char *path, bool token, struct dbuf *b,
                        struct vmsnap_err *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
    if (fd < 0)
        return err_sys(err, token ? "%s: token file %s" : "%s: open %s", what, path);
    char chunk[4096];
    int rc = 0;
    for (;;) {
        ssize_t n = read(fd, chunk, sizeof(chunk));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            rc = err_sys(err, "%s: read %s", what, path);
            break;
        }
        if (n == 0)
            break;
        if (s3_dbuf_add(b, chunk, (size_t)n) < 0) {
            rc = vmsnap_err_set(err, EFBIG, "%s: %s%s is larger than %zu bytes", what,
                                token ? "token file " : "", path, b->max);
            break;
        }
    }
    close(fd);
    explicit_bzero(chunk, sizeof(chunk));
    return rc;
}

/* A small secret file (a token), trailing white space cut; *out malloc'd. */
static int read_token_file(const char *what, const char *path, char **out, struct vmsnap_err *err)
{
    struct dbuf b = {.max = TOKEN_FILE_CAP};
    int rc = s3_read_secret_file(what, path, true, &b, err);
    while (rc == 0 && b.len > 0 && strchr(" \t\r\n", b.p[b.len - 1]))
        b.p[--b.len] = '\0';
    if (rc == 0 && (!b.len || strlen(b.p) != b.len || strpbrk(b.p, "\r\n")))
        rc = vmsnap_err_set(err, EINVAL, "%s: token file %s is empty or not one line", what, path);
    if (rc < 0) {
        dbuf_wipe(&b);
        return rc;
    }
    *out = b.p;
    return 0;
}

/* A key or token of an answer: it goes into a header (the access key into Authorization, the
 * token as X-Amz-Security-Token), so no control character (a CR/LF would add a header). */
static bool cred_text_ok(const char *s)
{
    for (; s && *s; s++)
        if ((unsigned char)*s < 0x20 || *s == 0x7f)
            return false;
    return true;
}

static const char *jstr(json_object *o, const char *key)
{
    json_object *v;
    if (!json_object_object_get_ex(o, key, &v) || !json_object_is_type(v, json_type_string))
        return NULL;
    const char *s = json_object_get_string(v);
    return s && *s ? s : NULL;
}

int s3_cred_parse_json(const char *what, const char *buf, size_t len, bool process, bool need_exp,
                       struct s3_cred **out, struct vmsnap_err *err)
{
    if (len > ANSWER_CAP)
        return vmsnap_err_set(err, EFBIG, "%s: the answer is larger than %u bytes", what,
                              ANSWER_CAP);
    json_tokener *tok = json_tokener_new_ex(16);
    if (!tok)
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    json_object *o = json_tokener_parse_ex(tok, buf ? buf : "", (int)len);
    bool whole = json_tokener_get_error(tok) == json_tokener_success &&
                 (size_t)json_tokener_get_parse_end(tok) == len;
    json_tokener_free(tok);
    int rc = 0;
    if (!o || !whole || !json_object_is_type(o, json_type_object)) {
        rc = vmsnap_err_set(err, EPROTO, "%s: the answer is not a JSON object", what);
        goto out;
    }
    const char *ak = jstr(o, "AccessKeyId"), *sk = jstr(o, "SecretAccessKey");
    const char *tk = jstr(o, process ? "SessionToken" : "Token"), *ex = jstr(o, "Expiration");
    time_t exp = ex ? s3_parse_iso8601(ex) : 0;
    json_object *ver = NULL;
    if (process && (!json_object_object_get_ex(o, "Version", &ver) ||
                    !json_object_is_type(ver, json_type_int) || json_object_get_int(ver) != 1)) {
        /* Version 1 is the only one there is; another is refused, as the SDKs do */
        rc = vmsnap_err_set(err, EPROTO, "%s: the output lacks \"Version\": 1", what);
    } else if (!ak || !sk) {
        rc = vmsnap_err_set(err, EPROTO, "%s: no AccessKeyId and SecretAccessKey in the answer",
                            what);
    } else if (!cred_text_ok(ak) || !cred_text_ok(sk) || !cred_text_ok(tk)) {
        rc = vmsnap_err_set(err, EPROTO, "%s: a control character in a key or the token", what);
    } else if (exp < 0 || (ex && exp == 0) || (need_exp && !ex)) {
        rc = vmsnap_err_set(err, EPROTO, "%s: %s Expiration (ISO 8601 UTC wanted)", what,
                            ex ? "a bad" : "no");
    } else if (!(*out = s3_cred_new(ak, sk, tk, exp))) {
        rc = vmsnap_err_set(err, ENOMEM, "out of memory");
    }
out:
    json_object_put(o);
    return rc;
}

int s3_src_web_identity(const struct s3_chain_cfg *c, struct s3_cred **out, struct vmsnap_err *err)
{
    const char *what = "web identity";
    char *token = NULL;
    int rc = read_token_file(what, c->wi_token_file, &token, err);
    if (rc < 0)
        return rc;
    size_t tl = strlen(token), cap = 3 * (tl + strlen(c->wi_role_arn) + 256) + 256;
    char *body = malloc(cap), *enc = malloc(3 * tl + 1);
    char earn[3 * 2048 + 1], esn[3 * 64 + 1];
    if (!body || !enc) {
        rc = vmsnap_err_set(err, ENOMEM, "out of memory");
    } else if (sigv4_uri_encode(token, false, enc, 3 * tl + 1) < 0 ||
               sigv4_uri_encode(c->wi_role_arn, false, earn, sizeof(earn)) < 0 ||
               sigv4_uri_encode(c->wi_session_name, false, esn, sizeof(esn)) < 0) {
        rc = vmsnap_err_set(err, EINVAL, "%s: the role ARN or session name is too long", what);
    } else {
        snprintf(body, cap,
                 "Action=AssumeRoleWithWebIdentity&Version=2011-06-15&RoleArn=%s&"
                 "RoleSessionName=%s&WebIdentityToken=%s",
                 earn, esn, enc);
    }
    struct dbuf resp = {.max = ANSWER_CAP};
    long status = 0;
    char url[2048];
    snprintf(url, sizeof(url), "%s%s", c->sts_endpoint,
             strchr(strstr(c->sts_endpoint, "://") + 3, '/') ? "" : "/");
    if (rc == 0) {
        const char *hdr[] = {"Accept: application/xml"};
        struct s3_fetch_req f = {.what = "web identity (STS AssumeRoleWithWebIdentity)",
                                 .method = "POST",
                                 .url = url,
                                 .headers = hdr,
                                 .nheaders = 1,
                                 .body = body,
                                 .body_len = strlen(body),
                                 .connect_timeout_ms = 5000,
                                 .timeout_ms = 30000,
                                 .attempts = 3,
                                 .tls = &c->tls};
        rc = s3_fetch(&f, &resp, &status, err);
    }
    if (body)
        explicit_bzero(body, strlen(body));
    if (enc)
        explicit_bzero(enc, strlen(enc));
    explicit_bzero(token, tl);
    free(token);
    free(body);
    free(enc);
    char origin[300];
    s3_url_origin(url, origin, sizeof(origin));
    struct xml_span x = {resp.p ? resp.p : "", resp.len};
    if (rc == 0 && status != 200) {
        char code[128] = "", msg[256] = "";
        xml_child_text(x, "Code", code, sizeof(code));
        xml_child_text(x, "Message", msg, sizeof(msg));
        rc = vmsnap_err_set(err, status == 403 || status == 401 ? EACCES : EIO,
                            "%s: STS %s refused role %s: HTTP %ld %s%s%s", what, origin,
                            c->wi_role_arn, status, code[0] ? code : "(no error code)",
                            msg[0] ? ": " : "", msg);
    } else if (rc == 0) {
        rc = s3_cred_parse_sts(what, origin, resp.p, resp.len, out, err);
    }
    dbuf_wipe(&resp);
    return rc;
}

int s3_cred_parse_sts(const char *what, const char *origin, const char *buf, size_t len,
                      struct s3_cred **out, struct vmsnap_err *err)
{
    struct xml_span x = {buf ? buf : "", len}, cr;
    char ak[256], sk[256], tk[8192], ex[64];
    int rc = 0;
    if (!xml_find(x, "Credentials", &cr, &x) || !xml_child_text(cr, "AccessKeyId", ak, 256) ||
        !xml_child_text(cr, "SecretAccessKey", sk, 256) ||
        !xml_child_text(cr, "SessionToken", tk, sizeof(tk)) ||
        !xml_child_text(cr, "Expiration", ex, sizeof(ex)) || s3_parse_iso8601(ex) <= 0 || !ak[0] ||
        !sk[0] || !tk[0] || !cred_text_ok(ak) || !cred_text_ok(sk) || !cred_text_ok(tk))
        rc = vmsnap_err_set(err, EPROTO,
                            "%s: STS %s: no Credentials (AccessKeyId, SecretAccessKey, "
                            "SessionToken, Expiration) in the answer",
                            what, origin);
    else if (!(*out = s3_cred_new(ak, sk, tk, s3_parse_iso8601(ex))))
        rc = vmsnap_err_set(err, ENOMEM, "out of memory");
    explicit_bzero(sk, sizeof(sk));
    explicit_bzero(tk, sizeof(tk));
    return rc;
}

int s3_src_container(const struct s3_chain_cfg *c, struct s3_cred **out, struct vmsnap_err *err)
{
    const char *what = "container credentials";
    char origin[300];
    s3_url_origin(c->ct_url, origin, sizeof(origin));
    char *auth = NULL;
    int rc = 0;
    if (c->ct_auth_file)
        rc = read_token_file(what, c->ct_auth_file, &auth, err);
    else if (c->ct_auth && !(auth = strdup(c->ct_auth)))
        rc = vmsnap_err_set(err, ENOMEM, "out of memory");
    if (rc < 0)
        return rc;
    if (auth && strpbrk(auth, "\r\n")) {
        explicit_bzero(auth, strlen(auth));
        free(auth);
        return vmsnap_err_set(err, EINVAL, "%s: AWS_CONTAINER_AUTHORIZATION_TOKEN is not one line",
                              what);
    }
    char *hdr = NULL;
    if (auth && asprintf(&hdr, "Authorization: %s", auth) < 0)
        hdr = NULL;
    const char *hv[] = {hdr};
    struct dbuf resp = {.max = ANSWER_CAP};
    long status = 0;
    if (auth && !hdr) {
        rc = vmsnap_err_set(err, ENOMEM, "out of memory");
    } else {
        struct s3_fetch_req f = {.what = what,
                                 .method = "GET",
                                 .url = c->ct_url,
                                 .headers = hv,
                                 .nheaders = hdr ? 1 : 0,
                                 .connect_timeout_ms = 2000,
                                 .timeout_ms = 5000,
                                 .attempts = 3,
                                 .tls = &c->tls};
        rc = s3_fetch(&f, &resp, &status, err);
    }
    if (rc == 0 && status != 200)
        rc = vmsnap_err_set(err, status == 401 || status == 403 ? EACCES : EIO,
                            "%s (%s): HTTP %ld%s", what, origin, status,
                            status == 401 || status == 403
                                ? " (check AWS_CONTAINER_AUTHORIZATION_TOKEN[_FILE])"
                                : "");
    if (rc == 0)
        rc = s3_cred_parse_json(what, resp.p, resp.len, false, false, out, err);
    if (hdr)
        explicit_bzero(hdr, strlen(hdr));
    if (auth)
        explicit_bzero(auth, strlen(auth));
    free(hdr);
    free(auth);
    dbuf_wipe(&resp);
    return rc;
}

/* One IMDS request with the session token (NULL: the token request itself). */
static int imds_get(const struct s3_chain_cfg *c, const char *method, const char *path,
                    const char *token, struct dbuf *resp, long *status, struct vmsnap_err *err)
{
    char url[1024], hdr[1200];
    snprintf(url, sizeof(url), "%s%s", c->imds_endpoint, path);
    if (token)
        snprintf(hdr, sizeof(hdr), "X-aws-ec2-metadata-token: %s", token);
    else
        snprintf(hdr, sizeof(hdr), "X-aws-ec2-metadata-token-ttl-seconds: 21600");
    const char *hv[] = {hdr};
    struct s3_fetch_req f = {.what = "instance metadata",
                             .method = method,
                             .url = url,
                             .headers = hv,
                             .nheaders = 1,
                             .connect_timeout_ms = c->imds_timeout_ms,
                             .timeout_ms = 2 * c->imds_timeout_ms,
                             .attempts = c->imds_attempts,
                             .tls = &c->tls};
    resp->len = 0;
    int rc = s3_fetch(&f, resp, status, err);
    explicit_bzero(hdr, sizeof(hdr));
    return rc;
}

int s3_src_imds(const struct s3_chain_cfg *c, struct s3_cred **out, struct vmsnap_err *err)
{
    const char *what = "instance metadata";
    struct dbuf resp = {.max = ANSWER_CAP};
    long status = 0;
    char token[1024] = "", role[128] = "", path[256];
    int rc = imds_get(c, "PUT", "/latest/api/token", NULL, &resp, &status, err);
    if (rc == 0 && (status != 200 || !resp.len || resp.len >= sizeof(token) ||
                    strlen(resp.p) != resp.len || strpbrk(resp.p, "\r\n")))
        rc = vmsnap_err_set(err, EIO, "%s (%s): no IMDSv2 session token (HTTP %ld)", what,
                            c->imds_endpoint, status);
    if (rc == 0) {
        memcpy(token, resp.p, resp.len + 1);
        rc = imds_get(c, "GET", "/latest/meta-data/iam/security-credentials/", token, &resp,
                      &status, err);
    }
    if (rc == 0 && status == 404)
        rc = vmsnap_err_set(err, ENOENT, "%s (%s): no IAM role attached to this instance", what,
                            c->imds_endpoint);
    else if (rc == 0 && status != 200)
        rc = vmsnap_err_set(err, EIO, "%s (%s): HTTP %ld for the role", what, c->imds_endpoint,
                            status);
    if (rc == 0) {
        size_t n = strcspn(resp.p ? resp.p : "", "\r\n");
        bool ok = n > 0 && n < sizeof(role);
        for (size_t i = 0; ok && i < n; i++)
            ok = strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+=,.@_-",
                        resp.p[i]) != NULL;
        if (!ok)
            rc = vmsnap_err_set(err, EPROTO, "%s (%s): not an IAM role name in the answer", what,
                                c->imds_endpoint);
        else
            memcpy(role, resp.p, n);
    }
    if (rc == 0) {
        snprintf(path, sizeof(path), "/latest/meta-data/iam/security-credentials/%s", role);
        rc = imds_get(c, "GET", path, token, &resp, &status, err);
        if (rc == 0 && status != 200)
            rc = vmsnap_err_set(err, EIO, "%s (%s): HTTP %ld for the credentials of role %s", what,
                                c->imds_endpoint, status, role);
    }
    if (rc == 0)
        rc = s3_cred_parse_json(what, resp.p, resp.len, false, true, out, err);
    explicit_bzero(token, sizeof(token));
    dbuf_wipe(&resp);
    return rc;
}

/* Run the command with stdout into `b` (stdin /dev/null, stderr the caller's). */
static int run_process(const char *cmd, struct dbuf *b, int *status, struct vmsnap_err *err)
{
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) < 0)
        return err_sys(err, "credential_process: pipe");
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
    char *argv[] = {"sh", "-c", (char *)cmd, NULL};
    pid_t pid;
    int e = posix_spawn(&pid, "/bin/sh", &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(fds[1]);
    if (e) {
        close(fds[0]);
        return err_code(err, e, "credential_process: spawn /bin/sh");
    }
    char chunk[4096];
    int rc = 0;
    for (;;) {
        ssize_t n = read(fds[0], chunk, sizeof(chunk));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        if (rc == 0 && s3_dbuf_add(b, chunk, (size_t)n) < 0)
            rc = vmsnap_err_set(err, EFBIG, "credential_process: more than %u bytes of output",
                                ANSWER_CAP); /* read on to the end: the child is not blocked */
    }
    explicit_bzero(chunk, sizeof(chunk));
    close(fds[0]);
    while (waitpid(pid, status, 0) < 0 && errno == EINTR)
        ;
    return rc;
}

int s3_src_process(const struct s3_chain_cfg *c, struct s3_cred **out, struct vmsnap_err *err)
{
    struct dbuf b = {.max = ANSWER_CAP};
    int st = 0;
    int rc = run_process(c->process, &b, &st, err);
    if (rc == 0 && (!WIFEXITED(st) || WEXITSTATUS(st) != 0))
        rc = vmsnap_err_set(err, EACCES, "credential_process: the command %s %d",
                            WIFEXITED(st) ? "exited with status" : "was killed by signal",
                            WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
    if (rc == 0)
        rc = s3_cred_parse_json("credential_process", b.p, b.len, true, false, out, err);
    dbuf_wipe(&b);
    return rc;
}
