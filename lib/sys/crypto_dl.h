/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Private: the few OpenSSL libcrypto calls vmsnap makes (SHA-256, HMAC-SHA256), loaded on first
 * use with dlopen. Linking libcrypto costs about 1 ms of start-up in every process, and only
 * push/pull and the S3 signer need it. Include this after the OpenSSL headers; the macros keep
 * the call sites written as plain OpenSSL. If the library cannot be loaded, the calls fail the
 * way OpenSSL's do (NULL / 0) and one error is logged.
 */
#ifndef VMSNAP_CRYPTO_DL_H
#define VMSNAP_CRYPTO_DL_H

#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/sha.h>

struct crypto_api {
    unsigned char *(*sha256)(const unsigned char *d, size_t n, unsigned char *md);
    unsigned char *(*hmac)(const EVP_MD *evp_md, const void *key, int key_len,
                           const unsigned char *d, size_t n, unsigned char *md,
                           unsigned int *md_len);
    const EVP_MD *(*evp_sha256)(void);
    void (*cleanse)(void *ptr, size_t len);
    EVP_MD_CTX *(*md_ctx_new)(void);
    void (*md_ctx_free)(EVP_MD_CTX *ctx);
    int (*digest_init_ex)(EVP_MD_CTX *ctx, const EVP_MD *type, ENGINE *impl);
    int (*digest_update)(EVP_MD_CTX *ctx, const void *d, size_t cnt);
    int (*digest_final_ex)(EVP_MD_CTX *ctx, unsigned char *md, unsigned int *s);
};

/* The loaded table (loads once, thread-safe; never NULL, never a NULL entry). */
const struct crypto_api *crypto_api(void);

#define SHA256 (crypto_api()->sha256)
#define HMAC (crypto_api()->hmac)
#define EVP_sha256 (crypto_api()->evp_sha256)
#define OPENSSL_cleanse (crypto_api()->cleanse)
#define EVP_MD_CTX_new (crypto_api()->md_ctx_new)
#define EVP_MD_CTX_free (crypto_api()->md_ctx_free)
#define EVP_DigestInit_ex (crypto_api()->digest_init_ex)
#define EVP_DigestUpdate (crypto_api()->digest_update)
#define EVP_DigestFinal_ex (crypto_api()->digest_final_ex)

#endif
