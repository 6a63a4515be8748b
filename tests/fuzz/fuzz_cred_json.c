/* SPDX-License-Identifier: Apache-2.0 */
/* Fuzz target: the JSON answers of AWS's credential sources (the container endpoint, instance
 * metadata, credential_process's output) through s3_cred_parse_json, each of the three ways the
 * providers call it. Each gives an error (no secret of the input in its message) or a credential
 * with non-empty keys; what instance metadata accepts (Expiration required) the container
 * endpoint accepts too, with the same keys and expiry. */
#include "fuzz_cred.h"

#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static struct s3_cred *one(const char *what, const char *in, size_t size, bool process,
                           bool need_exp)
{
    struct s3_cred *c = NULL;
    struct vmsnap_err err = {0};
    int rc = s3_cred_parse_json(what, in, size, process, need_exp, &c, &err);
    if (rc == 0) {
        fuzz_check_cred(c);
        if (need_exp && c->expires <= 0)
            abort(); /* an Expiration was required */
        return c;
    }
    fuzz_check_err(rc, &err);
    fuzz_no_secret(in, size, in, size, false, err.msg);
    if (c)
        abort(); /* nothing handed out on failure */
    return NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *in = (const char *)data;
    struct s3_cred *ct = one("container credentials", in, size, false, false);
    struct s3_cred *im = one("instance metadata", in, size, false, true);
    struct s3_cred *pr = one("credential_process", in, size, true, false);
    if (im && (!ct || strcmp(im->access_key, ct->access_key) ||
               strcmp(im->secret_key, ct->secret_key) || im->expires != ct->expires ||
               !im->token != !ct->token || (im->token && strcmp(im->token, ct->token))))
        abort();
    s3_cred_put(ct);
    s3_cred_put(im);
    s3_cred_put(pr);
    return 0;
}
