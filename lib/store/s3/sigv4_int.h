/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Private: AWS Signature Version 4 (header-based), used by the S3 backend. Pure functions over
 * caller buffers, so they can be checked against the published test vectors.
 */
#ifndef VMSNAP_SIGV4_INT_H
#define VMSNAP_SIGV4_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A header to sign: `name` lowercase, `value` already trimmed. */
struct sigv4_header {
    const char *name;
    const char *value;
};

struct sigv4_input {
    const char *method;                 /* "GET" */
    const char *canon_path;             /* URI-encoded path, e.g. "/bucket/a%20b" */
    const char *canon_query;            /* sorted, encoded "a=1&b=" (may be "") */
    const struct sigv4_header *headers; /* every header to sign (any order) */
    size_t nheaders;
    const char *payload_hash; /* hex SHA-256 of the body or "UNSIGNED-PAYLOAD" */
    const char *amz_date;     /* "20130524T000000Z" */
    const char *region;
    const char *service; /* "s3" */
    const char *access_key;
    const char *secret_key;
};

/* Write the Authorization header value into out. Returns 0, or -ENOSPC / -ENOMEM / -EINVAL. */
int sigv4_authorization(const struct sigv4_input *in, char *out, size_t outlen);

/* The derived signing key (32 bytes) for date "YYYYMMDD", region, service. */
int sigv4_signing_key(const char *secret, const char *date8, const char *region,
                      const char *service, uint8_t key[32]);

/* Lowercase hex SHA-256 of buf into hex[65]. */
void sigv4_sha256_hex(const void *buf, size_t len, char hex[65]);

/* RFC 3986 encoding as SigV4 wants it: unreserved kept, everything else %XX (uppercase);
 * '/' kept when keep_slash. Returns the length written (without NUL) or -ENOSPC. */
int sigv4_uri_encode(const char *s, bool keep_slash, char *out, size_t outlen);

#endif
