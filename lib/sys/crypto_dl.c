/* SPDX-License-Identifier: Apache-2.0 */
/* libcrypto loaded on first use (see crypto_dl.h for why). */
#include "sys/crypto_dl.h"
#include "util/util.h"

#include <dlfcn.h>
#include <pthread.h>
#include <string.h>

/* Stand-ins used when libcrypto cannot be loaded: they fail as OpenSSL's calls fail. */
static unsigned char *no_sha256(const unsigned char *d, size_t n, unsigned char *md)
{
    (void)d;
    (void)n;
    memset(md, 0, 32);
    return NULL;
}
static unsigned char *no_hmac(const EVP_MD *m, const void *k, int kl, const unsigned char *d,
                              size_t n, unsigned char *md, unsigned int *ml)
{
    (void)m;
    (void)k;
    (void)kl;
    (void)d;
    (void)n;
    (void)md;
    if (ml)
        *ml = 0;
    return NULL;
}
static const EVP_MD *no_evp(void)
{
    return NULL;
}
static void plain_cleanse(void *p, size_t n)
{
    volatile unsigned char *v = p;
    while (n--)
        *v++ = 0;
}
static EVP_MD_CTX *no_ctx_new(void)
{
    return NULL;
}
static void no_ctx_free(EVP_MD_CTX *c)
{
    (void)c;
}
static int no_init(EVP_MD_CTX *c, const EVP_MD *t, ENGINE *e)
{
    (void)c;
    (void)t;
    (void)e;
    return 0;
}
static int no_update(EVP_MD_CTX *c, const void *d, size_t n)
{
    (void)c;
    (void)d;
    (void)n;
    return 0;
}
static int no_final(EVP_MD_CTX *c, unsigned char *md, unsigned int *s)
{
    (void)c;
    (void)md;
    if (s)
        *s = 0;
    return 0;
}

static struct crypto_api api = {no_sha256,   no_hmac, no_evp,    plain_cleanse, no_ctx_new,
                                no_ctx_free, no_init, no_update, no_final};
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void load(void)
{
    void *h = dlopen("libcrypto.so.3", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        vlog(VMSNAP_LOG_ERROR, "cannot load libcrypto.so.3 (%s): SHA-256 and S3 signing fail",
             dlerror());
        return;
    }
    struct crypto_api a;
    void **slots[] = {
        (void **)&a.sha256,         (void **)&a.hmac,          (void **)&a.evp_sha256,
        (void **)&a.cleanse,        (void **)&a.md_ctx_new,    (void **)&a.md_ctx_free,
        (void **)&a.digest_init_ex, (void **)&a.digest_update, (void **)&a.digest_final_ex};
    static const char *const names[] = {"SHA256",
                                        "HMAC",
                                        "EVP_sha256",
                                        "OPENSSL_cleanse",
                                        "EVP_MD_CTX_new",
                                        "EVP_MD_CTX_free",
                                        "EVP_DigestInit_ex",
                                        "EVP_DigestUpdate",
                                        "EVP_DigestFinal_ex"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        *slots[i] = dlsym(h, names[i]);
        if (!*slots[i]) {
            vlog(VMSNAP_LOG_ERROR, "libcrypto.so.3 lacks %s: SHA-256 and S3 signing fail",
                 names[i]);
            return;
        }
    }
    api = a; /* never unloaded */
}

const struct crypto_api *crypto_api(void)
{
    pthread_once(&once, load);
    return &api;
}
