/* SPDX-License-Identifier: Apache-2.0 */
/*
 * AWS SigV4: canonical request -> string to sign -> HMAC chain over the date, region, service
 * -> signature. Headers are sorted here by name; values are used as given (callers pass trimmed
 * values). The secret only ever enters HMAC; it is never copied into an output buffer.
 */
#include "sys/crypto_dl.h"
#include "sigv4_int.h"
#include "util/util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void hex(const uint8_t *b, size_t n, char *out)
{
    static const char d[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = d[b[i] >> 4];
        out[2 * i + 1] = d[b[i] & 15];
    }
    out[2 * n] = '\0';
}

void sigv4_sha256_hex(const void *buf, size_t len, char out[65])
{
    uint8_t md[SHA256_DIGEST_LENGTH];
    SHA256(buf, len, md);
    hex(md, sizeof(md), out);
}

static int hmac(const void *key, size_t klen, const void *msg, size_t mlen, uint8_t out[32])
{
    unsigned int olen = 32;
    if (!HMAC(EVP_sha256(), key, (int)klen, msg, mlen, out, &olen) || olen != 32)
        return -EINVAL;
    return 0;
}

int sigv4_signing_key(const char *secret, const char *date8, const char *region,
                      const char *service, uint8_t key[32])
{
    size_t sl = strlen(secret);
    char *k0 = malloc(sl + 5);
    if (!k0)
        return -ENOMEM;
    memcpy(k0, "AWS4", 4);
    memcpy(k0 + 4, secret, sl + 1);
    uint8_t a[32], b[32];
    int rc = hmac(k0, sl + 4, date8, strlen(date8), a);
    OPENSSL_cleanse(k0, sl + 4);
    free(k0);
    if (rc == 0)
        rc = hmac(a, 32, region, strlen(region), b);
    if (rc == 0)
        rc = hmac(b, 32, service, strlen(service), a);
    if (rc == 0)
        rc = hmac(a, 32, "aws4_request", 12, key);
    OPENSSL_cleanse(a, sizeof(a));
    OPENSSL_cleanse(b, sizeof(b));
    return rc;
}

int sigv4_uri_encode(const char *s, bool keep_slash, char *out, size_t outlen)
{
    static const char d[] = "0123456789ABCDEF";
    size_t o = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        unsigned char c = *p;
        bool keep = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                    c == '-' || c == '_' || c == '.' || c == '~' || (keep_slash && c == '/');
        if (o + (keep ? 1 : 3) >= outlen)
            return -ENOSPC;
        if (keep) {
            out[o++] = (char)c;
        } else {
            out[o++] = '%';
            out[o++] = d[c >> 4];
            out[o++] = d[c & 15];
        }
    }
    if (o >= outlen)
        return -ENOSPC;
    out[o] = '\0';
    return (int)o;
}

static int cmp_hdr(const void *a, const void *b)
{
    const struct sigv4_header *x = *(const struct sigv4_header *const *)a;
    const struct sigv4_header *y = *(const struct sigv4_header *const *)b;
    return strcmp(x->name, y->name);
}

/* Append to a growable string; returns -ENOMEM on failure. */
struct sbuf {
    char *p;
    size_t len, cap;
};

static int sb_add(struct sbuf *s, const char *str)
{
    size_t n = strlen(str);
    if (grow_array(&s->p, &s->cap, s->len + n + 1, 1, 512) < 0)
        return -ENOMEM;
    memcpy(s->p + s->len, str, n + 1);
    s->len += n;
    return 0;
}

int sigv4_authorization(const struct sigv4_input *in, char *out, size_t outlen)
{
    if (!in->amz_date || strlen(in->amz_date) != 16 || in->nheaders > 64)
        return -EINVAL;
    const struct sigv4_header *sorted[64];
    for (size_t i = 0; i < in->nheaders; i++)
        sorted[i] = &in->headers[i];
    qsort(sorted, in->nheaders, sizeof(sorted[0]), cmp_hdr);

    struct sbuf creq = {0}, signed_hdrs = {0};
    int rc = 0;
    rc |= sb_add(&creq, in->method);
    rc |= sb_add(&creq, "\n");
    rc |= sb_add(&creq, in->canon_path);
    rc |= sb_add(&creq, "\n");
    rc |= sb_add(&creq, in->canon_query);
    rc |= sb_add(&creq, "\n");
    for (size_t i = 0; i < in->nheaders; i++) {
        rc |= sb_add(&creq, sorted[i]->name);
        rc |= sb_add(&creq, ":");
        rc |= sb_add(&creq, sorted[i]->value);
        rc |= sb_add(&creq, "\n");
        if (i)
            rc |= sb_add(&signed_hdrs, ";");
        rc |= sb_add(&signed_hdrs, sorted[i]->name);
    }
    rc |= sb_add(&creq, "\n");
    rc |= sb_add(&creq, signed_hdrs.p ? signed_hdrs.p : "");
    rc |= sb_add(&creq, "\n");
    rc |= sb_add(&creq, in->payload_hash);
    if (rc) {
        free(creq.p);
        free(signed_hdrs.p);
        return -ENOMEM;
    }

    char creq_hash[65];
    sigv4_sha256_hex(creq.p, creq.len, creq_hash);
    free(creq.p);

    char date8[9];
    memcpy(date8, in->amz_date, 8);
    date8[8] = '\0';
    char scope[256];
    int n = snprintf(scope, sizeof(scope), "%s/%s/%s/aws4_request", date8, in->region, in->service);
    if (n < 0 || (size_t)n >= sizeof(scope)) {
        free(signed_hdrs.p);
        return -EINVAL;
    }
    char sts[512];
    n = snprintf(sts, sizeof(sts), "AWS4-HMAC-SHA256\n%s\n%s\n%s", in->amz_date, scope, creq_hash);
    uint8_t key[32], sig[32];
    rc = sigv4_signing_key(in->secret_key, date8, in->region, in->service, key);
    if (rc == 0)
        rc = hmac(key, 32, sts, (size_t)n, sig);
    OPENSSL_cleanse(key, sizeof(key));
    if (rc == 0) {
        char sighex[65];
        hex(sig, 32, sighex);
        n = snprintf(out, outlen,
                     "AWS4-HMAC-SHA256 Credential=%s/%s, SignedHeaders=%s, Signature=%s",
                     in->access_key, scope, signed_hdrs.p, sighex);
        if (n < 0 || (size_t)n >= outlen)
            rc = -ENOSPC;
    }
    free(signed_hdrs.p);
    return rc;
}
