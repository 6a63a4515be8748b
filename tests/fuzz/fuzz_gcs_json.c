/* SPDX-License-Identifier: Apache-2.0 */
/* Fuzz target: the gs:// token sources' JSON on untrusted bytes: a Google credentials file
 * (s3_gcs_file_parse), a token answer (s3_gcs_token_parse) and a token endpoint's refusal
 * (s3_gcs_token_refused). A file gives an error or the members its type needs, with a token_uri
 * that is https (or http to loopback); an answer gives an error or a bearer token fit for a
 * header with an expiry in the next 7 days; a refusal is always an error, in printable text.
 * No secret of the input is in a message, but for the file's "type" and token_uri's origin,
 * which the messages show by design (and are cut out before the check). */
#include "fuzz_cred.h"

#include <errno.h>
#include <stdint.h>
#include <strings.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* msg with the part from `after` up to the last `before` cut out (when both are there). */
static void cut(char *msg, const char *after, const char *before)
{
    char *a = strstr(msg, after);
    if (!a)
        return;
    a += strlen(after);
    char *b = NULL, *q = a;
    while ((q = strstr(q, before)))
        b = q++;
    if (b)
        memmove(a, b, strlen(b) + 1);
}

static bool nonempty(const char *s)
{
    return s && s[0];
}

static void file(const char *in, size_t size)
{
    struct s3_gcs_file f;
    struct vmsnap_err err = {0};
    int rc = s3_gcs_file_parse("GOOGLE_APPLICATION_CREDENTIALS fuzz.json", in, size, &f, &err);
    if (rc < 0) {
        fuzz_check_err(rc, &err);
        if (!strstr(err.msg, "fuzz.json"))
            abort(); /* the message names the file */
        cut(err.msg, "\"type\" is '", "', expected service_account");
        cut(err.msg, "token_uri ", ": expected https://");
        fuzz_no_secret(in, size, in, size, false, err.msg);
        return;
    }
    bool ok = nonempty(f.token_uri) &&
              (!strncasecmp(f.token_uri, "https://", 8) || !strncasecmp(f.token_uri, "http://", 7));
    if (f.service_account)
        ok = ok && nonempty(f.client_email) && nonempty(f.private_key);
    else
        ok = ok && nonempty(f.client_id) && nonempty(f.client_secret) && nonempty(f.refresh_token);
    if (!ok)
        abort();
    s3_gcs_file_fini(&f);
}

static void answer(const char *in, size_t size)
{
    const time_t now = 1780000000;
    struct s3_cred *c = NULL;
    struct vmsnap_err err = {0};
    int rc =
        s3_gcs_token_parse("GCE metadata server", "http://127.0.0.1:8080", in, size, now, &c, &err);
    if (rc < 0) {
        fuzz_check_err(rc, &err);
        fuzz_no_secret(in, size, in, size, false, err.msg);
        if (c)
            abort();
        return;
    }
    if (!c || !c->bearer || !nonempty(c->token) || strlen(c->token) > 8192 || c->expires <= now ||
        c->expires > now + 7 * 86400)
        abort();
    for (const char *p = c->token; *p; p++)
        if (*p <= 0x20 || *p >= 0x7f)
            abort(); /* it becomes "Authorization: Bearer TOKEN" */
    s3_cred_put(c);
}

static void refused(const char *in, size_t size)
{
    struct vmsnap_err err = {0};
    long status = size ? 400 + (long)(in[0] & 0x7f) : 401;
    int rc = s3_gcs_token_refused("fuzz.json", "the refresh token", "https://oauth2.example.com",
                                  status, in, size, &err);
    fuzz_check_err(rc, &err);
    if (err.code != EAGAIN && err.code != EACCES && err.code != EPROTO)
        abort();
    for (const char *p = err.msg; *p; p++)
        if (*p < 0x20 || *p >= 0x7f)
            abort(); /* the endpoint's text is cut to printable characters */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *in = (const char *)data;
    file(in, size);
    answer(in, size);
    refused(in, size);
    return 0;
}
