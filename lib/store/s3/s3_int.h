/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Private: the minimal XML reader the S3 backend uses for ListObjectsV2, ListMultipartUploads,
 * CreateMultipartUpload and error bodies. It works on (pointer, length) spans of untrusted bytes,
 * never reads outside them, and allocates nothing, so it is easy to fuzz.
 */
#ifndef VMSNAP_S3_INT_H
#define VMSNAP_S3_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sigv4_int.h"
#include "vmsnap/store.h"

struct xml_span {
    const char *p;
    size_t len;
};

/* Find the first element <name ...>content</name> (or <name/>) starting in `in`; on success set
 * *content to its content and *rest to the bytes after its end tag. Elements of the same name
 * are not expected to nest (S3 responses do not). */
bool xml_find(struct xml_span in, const char *name, struct xml_span *content,
              struct xml_span *rest);

/* Decode the text of a span (entities &amp; &lt; &gt; &quot; &apos; &#N; &#xN;) into out with a
 * NUL. Returns the decoded length, or -1 if it does not fit, has a bad entity, a NUL or a
 * nested tag. */
long xml_text(struct xml_span s, char *out, size_t outlen);

/* xml_find + xml_text of a child element; false if missing or it does not decode. */
bool xml_child_text(struct xml_span in, const char *name, char *out, size_t outlen);

/* Parse a decimal uint64 child element. */
bool xml_child_u64(struct xml_span in, const char *name, uint64_t *v);

/* ---------------------------------------------------------------------------------------- */
/* The request engine (s3_request.c) and the backend's operations (s3.c, s3_list.c).         */

#define RESP_CAP (16u << 20)     /* XML answers larger than this are refused */
#define ERRBODY_CAP (64u << 10)  /* error bodies kept for their <Code> */
#define REQ_MAX_XH 4             /* extra signed headers per request */
#define SIGN_BODY_MAX (1u << 20) /* bodies up to this are hashed into the signature */
#define BACKOFF_CAP_MS 5000u

struct vmsnap_store;
struct vmsnap_store_conn;

struct dbuf {
    char *p;
    size_t len, cap, max;
    bool overflow;
};

int s3_dbuf_add(struct dbuf *b, const void *data, size_t n);

struct qparam {
    const char *name;
    const char *value;
};

/* One request and its result. */
struct req {
    const char *method;
    const char *key; /* "" for bucket-level requests */
    const struct qparam *q;
    size_t nq;
    const void *body;
    size_t body_len;
    bool has_body;
    uint64_t range_off, range_len; /* range_len 0: no Range */
    bool suffix;                   /* Range: the last range_len bytes (bytes=-N) */
    const struct sigv4_header *xh; /* extra x-amz-* headers, signed and sent (lowercase names) */
    size_t nxh;
    /* sinks for a 2xx body (at most one) */
    uint8_t *dst; /* exactly range_len bytes */
    struct dbuf *resp;
    vmsnap_store_data_fn stream_fn;
    void *stream_arg;
    /* state per attempt */
    size_t body_pos;
    uint64_t got;
    long status;
    bool delivered; /* stream: bytes were handed to stream_fn */
    int cb_err;     /* an error from stream_fn / overflow, stops the transfer */
    struct vmsnap_err *cb_errp;
    struct dbuf errbody;
    int *sock; /* the connection's socket, -1 if none (s3_conn.fd) */
    char etag[VMSNAP_STORE_ETAG_MAX];
    uint64_t content_length;
    bool have_length;
    uint64_t cr_first, cr_last, cr_total; /* Content-Range: bytes FIRST-LAST/TOTAL */
    bool have_range;
    bool no_bucket; /* answered NoSuchBucket */
};

/* Run one request with its retries (s3_request.c). */
int s3_perform(struct vmsnap_store_conn *c, struct req *r, struct vmsnap_err *err);
int s3_conn_new(struct vmsnap_store *st, struct vmsnap_store_conn *c, struct vmsnap_err *err);
void s3_conn_free(struct vmsnap_store_conn *c);

/* s3_list.c */
int s3_list(struct vmsnap_store_conn *c, const char *prefix, vmsnap_store_list_fn fn, void *arg,
            struct vmsnap_err *err);
int s3_mpu_last_part(struct vmsnap_store_conn *c, const char *key, const char *upload_id,
                     int64_t *last, struct vmsnap_err *err);
int s3_list_uploads(struct vmsnap_store_conn *c, const char *prefix, vmsnap_store_upload_fn fn,
                    void *arg, struct vmsnap_err *err);

#endif
