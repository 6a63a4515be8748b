/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Shared checks of the credential parsers' fuzz targets (fuzz_aws_profile.c, fuzz_cred_json.c,
 * fuzz_sts_xml.c, fuzz_gcs_json.c).
 *
 * "No secret in a message": the parsers' messages hold only fixed text, the `what`/`origin`
 * the target passes and (for a few) a name from the input that is not a secret. A run of the
 * input that looks like a key (12 or more bytes without blanks, quotes or markup, holding a '+'
 * or '=' as base64 keys do) cannot come from that fixed text (none of it holds such a run), so
 * finding one in a message means the parser copied it there from the input.
 */
#ifndef VMSNAP_FUZZ_CRED_H
#define VMSNAP_FUZZ_CRED_H

#include "store/s3/s3_creds.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define FUZZ_SECRET_MIN 12

static inline bool fuzz_run_char(unsigned char c)
{
    return c > 0x20 && c < 0x7f && !strchr("\"'\\<>&", c);
}

static inline size_t fuzz_count(const char *hay, size_t hlen, const char *s, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; n && i + n <= hlen; i++)
        if (!memcmp(hay + i, s, n))
            k++;
    return k;
}

/* Every key-like run of in[0..n) must be absent from msg. With `once`, a run found elsewhere
 * in `whole` too (a copy of it in a name the message may show) is not checked. */
static inline void fuzz_no_secret(const char *in, size_t n, const char *whole, size_t wlen,
                                  bool once, const char *msg)
{
    size_t i = 0;
    while (i < n) {
        if (!fuzz_run_char((unsigned char)in[i])) {
            i++;
            continue;
        }
        size_t j = i;
        bool mark = false;
        while (j < n && fuzz_run_char((unsigned char)in[j]))
            mark = mark || in[j] == '+' || in[j] == '=', j++;
        if (mark && j - i >= FUZZ_SECRET_MIN &&
            (!once || fuzz_count(whole, wlen, in + i, j - i) == 1) &&
            fuzz_count(msg, strlen(msg), in + i, j - i))
            abort(); /* a secret of the input in an error message */
        i = j;
    }
}

/* An error: negative, the code its errno, a message that says something. */
static inline void fuzz_check_err(int rc, const struct vmsnap_err *err)
{
    if (rc >= 0 || err->code != -rc || !err->msg[0] || strlen(err->msg) >= sizeof(err->msg))
        abort();
}

static inline bool fuzz_text_ok(const char *s)
{
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || *s == 0x7f)
            return false;
    return true;
}

/* A signing credential: access and secret key non-empty, no control character in them or the
 * token (they go into headers). */
static inline void fuzz_check_cred(const struct s3_cred *c)
{
    if (!c || c->bearer || !c->access_key || !c->secret_key || !c->access_key[0] ||
        !c->secret_key[0] || (c->token && !c->token[0]) || !fuzz_text_ok(c->access_key) ||
        !fuzz_text_ok(c->secret_key) || (c->token && !fuzz_text_ok(c->token)) || c->expires < 0)
        abort();
}

#endif
