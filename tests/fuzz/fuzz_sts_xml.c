/* SPDX-License-Identifier: Apache-2.0 */
/* Fuzz target: STS's AssumeRoleWithWebIdentity answer (XML) through s3_cred_parse_sts, as the
 * web identity provider reads a 200 answer. An error names the source and never a secret of the
 * input; a credential has non-empty keys, a session token and an expiry. */
#include "fuzz_cred.h"

#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *in = (const char *)data;
    struct s3_cred *c = NULL;
    struct vmsnap_err err = {0};
    int rc = s3_cred_parse_sts("web identity", "https://sts.example.com:443", in, size, &c, &err);
    if (rc == 0) {
        fuzz_check_cred(c);
        if (!c->token || c->expires <= 0)
            abort(); /* STS's credentials are temporary: token and Expiration required */
        s3_cred_put(c);
        return 0;
    }
    fuzz_check_err(rc, &err);
    fuzz_no_secret(in, size, in, size, false, err.msg);
    if (c)
        abort();
    return 0;
}
