/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The JWT a Google service account exchanges for an access token (RFC 7523, Google's
 * "OAuth 2.0 for server to server applications"): base64url(header) "." base64url(claims) "."
 * base64url(RS256 signature of the two). JSON is made with json-c (escaping is its job), the
 * signature with OpenSSL's EVP_DigestSign over the PEM key.
 *
 * libcrypto is loaded on first use, as everywhere in vmsnap (lib/sys/crypto_dl.h says why);
 * the few calls only this file needs (PEM, EVP_PKEY, DigestSign) have their own small table
 * here, filled from the same libcrypto.so.3.
 *
 * The key never reaches a message: OpenSSL's error strings name the failing routine and reason
 * only, and the decoded key lives in OpenSSL's own memory, freed (and cleansed) by
 * EVP_PKEY_free. An encrypted PEM is refused (no password callback prompts on a terminal).
 */
#include "s3_creds.h"

#include "util/util.h"

#include <dlfcn.h>
#include <errno.h>
#include <json.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct jwt_crypto {
    BIO *(*bio_new_mem_buf)(const void *buf, int len);
    int (*bio_free)(BIO *b);
    EVP_PKEY *(*pem_read_key)(BIO *bp, EVP_PKEY **x, pem_password_cb *cb, void *u);
    int (*pkey_base_id)(const EVP_PKEY *pkey);
    void (*pkey_free)(EVP_PKEY *pkey);
    EVP_MD_CTX *(*md_ctx_new)(void);
    void (*md_ctx_free)(EVP_MD_CTX *ctx);
    int (*sign_init)(EVP_MD_CTX *ctx, EVP_PKEY_CTX **pctx, const EVP_MD *type, ENGINE *e,
                     EVP_PKEY *pkey);
    int (*sign)(EVP_MD_CTX *ctx, unsigned char *sig, size_t *siglen, const unsigned char *tbs,
                size_t tbslen);
    const EVP_MD *(*sha256)(void);
    int (*encode_block)(unsigned char *t, const unsigned char *f, int n);
    unsigned long (*err_get)(void);
    void (*err_string)(unsigned long e, char *buf, size_t len);
    void (*cleanse)(void *p, size_t n);
};

static struct jwt_crypto api;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static char load_msg[256];

static void load(void)
{
    void *h = dlopen("libcrypto.so.3", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(load_msg, sizeof(load_msg), "cannot load libcrypto.so.3 (%s): install libssl3",
                 dlerror());
        return;
    }
    struct jwt_crypto a;
    void **slots[] = {
        (void **)&a.bio_new_mem_buf, (void **)&a.bio_free,     (void **)&a.pem_read_key,
        (void **)&a.pkey_base_id,    (void **)&a.pkey_free,    (void **)&a.md_ctx_new,
        (void **)&a.md_ctx_free,     (void **)&a.sign_init,    (void **)&a.sign,
        (void **)&a.sha256,          (void **)&a.encode_block, (void **)&a.err_get,
        (void **)&a.err_string,      (void **)&a.cleanse};
    static const char *const names[] = {
        "BIO_new_mem_buf",    "BIO_free",       "PEM_read_bio_PrivateKey", "EVP_PKEY_get_base_id",
        "EVP_PKEY_free",      "EVP_MD_CTX_new", "EVP_MD_CTX_free",         "EVP_DigestSignInit",
        "EVP_DigestSign",     "EVP_sha256",     "EVP_EncodeBlock",         "ERR_get_error",
        "ERR_error_string_n", "OPENSSL_cleanse"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        *slots[i] = dlsym(h, names[i]);
        if (!*slots[i]) {
            snprintf(load_msg, sizeof(load_msg), "libcrypto.so.3 lacks %s", names[i]);
            return;
        }
    }
    api = a; /* never unloaded */
}

/* No passphrase: an encrypted key fails instead of prompting on the terminal. */
static int no_password(char *buf, int size, int rwflag, void *u)
{
    (void)buf, (void)size, (void)rwflag, (void)u;
    return -1;
}

/* The first queued OpenSSL error as text (routine and reason, nothing of the input), and the
 * queue emptied. */
static void ssl_error(char *out, size_t len)
{
    unsigned long e = api.err_get(), more;
    snprintf(out, len, "no detail");
    if (e)
        api.err_string(e, out, len);
    while ((more = api.err_get()) != 0)
        ;
}

/* base64url without padding (RFC 7515) of n bytes; malloc'd, NULL when out of memory. */
static char *b64url(const void *data, size_t n)
{
    if (n > (1u << 20))
        return NULL;
    unsigned char *o = malloc(4 * ((n + 2) / 3) + 1);
    if (!o)
        return NULL;
    int k = api.encode_block(o, data, (int)n);
    while (k > 0 && o[k - 1] == '=')
        k--;
    o[k < 0 ? 0 : k] = '\0';
    for (unsigned char *p = o; *p; p++)
        *p = *p == '+' ? '-' : *p == '/' ? '_' : *p;
    return (char *)o;
}

/* The JSON text of an object as base64url (compact, '/' not escaped); NULL when out of memory. */
static char *b64_json(json_object *o)
{
    const char *s = o ? json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN |
                                                              JSON_C_TO_STRING_NOSLASHESCAPE)
                      : NULL;
    return s ? b64url(s, strlen(s)) : NULL;
}

/* "<header>.<claims>", both base64url of their JSON; malloc'd, NULL when out of memory. */
static char *signing_input(const char *kid, const char *iss, const char *scope, const char *aud,
                           time_t now)
{
    json_object *h = json_object_new_object(), *c = json_object_new_object();
    char *out = NULL, *hb = NULL, *cb = NULL;
    if (h && c) {
        json_object_object_add(h, "alg", json_object_new_string("RS256"));
        json_object_object_add(h, "typ", json_object_new_string("JWT"));
        if (kid)
            json_object_object_add(h, "kid", json_object_new_string(kid));
        json_object_object_add(c, "iss", json_object_new_string(iss));
        json_object_object_add(c, "scope", json_object_new_string(scope));
        json_object_object_add(c, "aud", json_object_new_string(aud));
        json_object_object_add(c, "iat", json_object_new_int64((int64_t)now));
        json_object_object_add(c, "exp", json_object_new_int64((int64_t)now + 3600));
        hb = b64_json(h);
        cb = b64_json(c);
    }
    if (hb && cb && asprintf(&out, "%s.%s", hb, cb) < 0)
        out = NULL;
    free(hb);
    free(cb);
    json_object_put(h);
    json_object_put(c);
    return out;
}

/* The RSA key of a PEM text (PKCS #8 "PRIVATE KEY", or "RSA PRIVATE KEY"). */
static int load_key(const char *what, const char *pem, EVP_PKEY **out, struct vmsnap_err *err)
{
    char why[256];
    size_t n = strlen(pem);
    BIO *b = n < (64u << 10) ? api.bio_new_mem_buf(pem, (int)n) : NULL;
    if (!b)
        return vmsnap_err_set(err, n < (64u << 10) ? ENOMEM : EACCES, "%s: private_key: %s", what,
                              n < (64u << 10) ? "out of memory" : "longer than 64 KiB");
    EVP_PKEY *k = api.pem_read_key(b, NULL, no_password, NULL);
    api.bio_free(b);
    if (!k) {
        ssl_error(why, sizeof(why));
        return vmsnap_err_set(
            err, EACCES, "%s: private_key is not an unencrypted PEM private key (%s)", what, why);
    }
    if (api.pkey_base_id(k) != EVP_PKEY_RSA) {
        api.pkey_free(k);
        return vmsnap_err_set(err, EACCES, "%s: private_key is not an RSA key (RS256 needs one)",
                              what);
    }
    *out = k;
    return 0;
}

int s3_gcs_jwt(const char *what, const char *pem, const char *kid, const char *iss,
               const char *scope, const char *aud, time_t now, char **out, struct vmsnap_err *err)
{
    pthread_once(&once, load);
    if (!api.sign)
        return vmsnap_err_set(err, ENOENT, "%s: %s", what, load_msg);
    EVP_PKEY *key = NULL;
    int rc = load_key(what, pem, &key, err);
    if (rc < 0)
        return rc;
    char *input = signing_input(kid, iss, scope, aud, now), *sig64 = NULL;
    unsigned char sig[1024]; /* an 8192-bit RSA signature */
    size_t siglen = sizeof(sig);
    EVP_MD_CTX *ctx = input ? api.md_ctx_new() : NULL;
    char why[256];
    if (!ctx) {
        rc = vmsnap_err_set(err, ENOMEM, "out of memory");
    } else if (api.sign_init(ctx, NULL, api.sha256(), NULL, key) != 1 ||
               api.sign(ctx, sig, &siglen, (const unsigned char *)input, strlen(input)) != 1) {
        ssl_error(why, sizeof(why));
        rc = vmsnap_err_set(err, EACCES, "%s: signing the JWT with private_key failed (%s)", what,
                            why);
    } else if (!(sig64 = b64url(sig, siglen)) || asprintf(out, "%s.%s", input, sig64) < 0) {
        *out = NULL;
        rc = vmsnap_err_set(err, ENOMEM, "out of memory");
    }
    api.md_ctx_free(ctx);
    api.pkey_free(key);
    api.cleanse(sig, sizeof(sig));
    free(input);
    free(sig64);
    return rc;
}
