/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Object stores: a small table of operations (put, multipart create/part/part-copy/complete/
 * abort, ranged get, head, delete, list, list multipart uploads) with two backends:
 *
 *   - the local store (a bare path or file:///abs/path): an object is a file; every write goes
 *     to a temporary file in the same directory, is fsynced and renamed, so a crash never leaves
 *     a visible partial object. Files are created 0600, directories 0700.
 *   - S3 (s3://bucket/key, and gs://bucket/key through Google Cloud Storage's S3-compatible XML
 *     API): libcurl + OpenSSL with our own SigV4 signer; retries with exponential backoff and
 *     jitter on 5xx, 429, timeouts and resets, bounded per request.
 *
 * A struct vmsnap_store holds the configuration (endpoint, bucket, credentials) and is shared
 * read-only by all threads. A struct vmsnap_store_conn is one stream: for S3 one CURL handle, so
 * one TCP connection reused across its requests. A connection is used by one thread at a time.
 *
 * Keys are relative to the store (S3: the object key; local: a path relative to the store root,
 * which is "/" for absolute URLs). Errors: -ENOENT for a missing object or upload, -EACCES for
 * denied credentials (the message names the bucket), -ECONNREFUSED/-ETIMEDOUT/-EHOSTUNREACH/
 * -ECONNRESET for transport failures and -EAGAIN for 5xx or throttling after the retries,
 * -EREMOTEIO for another refusal of the store's, -EINVAL for bad URLs. Secrets never appear in any
 * message.
 */
#ifndef VMSNAP_STORE_H
#define VMSNAP_STORE_H

#include "vmsnap/common.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define VMSNAP_STORE_ETAG_MAX 96

/* S3 limits: every part but the last at least 5 MiB, at most 10,000 parts, parts <= 5 GiB. */
#define VMSNAP_STORE_MIN_PART (5ull << 20)
#define VMSNAP_STORE_MAX_PARTS 10000u
#define VMSNAP_STORE_MAX_PART (5ull << 30)

struct vmsnap_store;
struct vmsnap_store_conn;

/* Options for vmsnap_store_open(). Zeroed means defaults (from the environment for S3). */
struct vmsnap_store_opts {
    const char *endpoint;  /* --endpoint; NULL: AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, the
                            * profile's s3 endpoint_url / endpoint_url, else AWS's regional one */
    const char *region;    /* NULL: AWS_REGION, AWS_DEFAULT_REGION, the profile's region, else
                            * us-east-1 ("auto" for gs://) */
    bool path_style;       /* force path-style; also AWS_S3_USE_PATH_STYLE=true, the profile's
                            * s3 addressing_style = path, IP/localhost */
    bool insecure_tls;     /* disable TLS verification (never the default) */
    unsigned max_attempts; /* attempts per request; 0: VMSNAP_S3_ATTEMPTS, AWS_MAX_ATTEMPTS, the
                            * profile's max_attempts, else 6 */
    unsigned backoff_ms;   /* first retry delay; 0: 200 ms, doubled per retry, capped at 5 s */
    const char *profile;   /* --profile: the AWS profile (NULL: AWS_PROFILE, else "default");
                            * given, the environment's keys are not used (as the AWS CLI does) */
    const char *ca_bundle; /* --ca-bundle: PEM file of the CAs to trust (NULL: AWS_CA_BUNDLE, the
                            * profile's ca_bundle, CURL_CA_BUNDLE, SSL_CERT_FILE, else the
                            * system store) */
};

/* Kinds of store. */
enum vmsnap_store_kind {
    VMSNAP_STORE_LOCAL = 0,
    VMSNAP_STORE_S3 = 1,
};

/* A part of a multipart upload, as returned by vmsnap_store_mpu_part(). */
struct vmsnap_store_part {
    uint32_t number; /* 1-based */
    char etag[VMSNAP_STORE_ETAG_MAX];
};

/* Callback for vmsnap_store_list(): one object, its size and when it was last written (Unix
 * seconds by the store's clock; -1 when the store does not say). Return < 0 to stop (that value
 * is returned). */
typedef int (*vmsnap_store_list_fn)(void *arg, const char *key, uint64_t size, int64_t mtime);
/* Callback for vmsnap_store_list_uploads(): one unfinished multipart upload, and when it started
 * (Unix seconds; S3: its Initiated time; local store: its temporary file's last write), -1 when
 * the store does not say. */
typedef int (*vmsnap_store_upload_fn)(void *arg, const char *key, const char *upload_id,
                                      int64_t started);
/* Callback for vmsnap_store_get_stream(): the next bytes of the object, in order. */
typedef int (*vmsnap_store_data_fn)(void *arg, const void *buf, size_t len, struct vmsnap_err *err);

/* Parse `url` and open its store. Accepted: a bare path, file:///abs/path, s3://bucket/key,
 * gs://bucket/key. On success *out is the store (free with vmsnap_store_free) and *key a
 * malloc'd key inside it (caller frees; may be ""), with no trailing '/'. S3 resolves its
 * credentials here through the AWS chain (environment, web identity, the shared credentials
 * and config files, container endpoint, instance metadata: docs/credentials.md), -EACCES naming
 * every source tried when none gives any; gs:// reads GS_ACCESS_KEY_ID / GS_SECRET_ACCESS_KEY,
 * then the AWS keys of the environment or the profile. Temporary credentials are refreshed
 * before they expire, by whichever connection's request finds them due (thread-safe). Thread
 * safety of open: none needed (no shared state besides libcurl's global init, done once). */
VMSNAP_API int vmsnap_store_open(const char *url, const struct vmsnap_store_opts *opts,
                                 struct vmsnap_store **out, char **key, struct vmsnap_err *err);
/* Free a store (NULL allowed). Every connection must be freed first. */
VMSNAP_API void vmsnap_store_free(struct vmsnap_store *st);
VMSNAP_API enum vmsnap_store_kind vmsnap_store_kind(const struct vmsnap_store *st);
/* Does `url` name a remote store by its scheme (s3://, gs://, or any other scheme://, which
 * vmsnap_store_open refuses), rather than a local path or file:// URL? Nothing is opened. */
VMSNAP_API bool vmsnap_store_url_remote(const char *url);
/* Do `a` and `b` address the same place, where an object of one can be copied into the other
 * server-side: both local, or S3 with the same scheme (s3/gs), endpoint host and port, and
 * bucket? Credentials and options are not compared. */
VMSNAP_API bool vmsnap_store_same(const struct vmsnap_store *a, const struct vmsnap_store *b);
/* The filesystem path of `key` in a local store (malloc'd; caller frees); NULL for another kind
 * of store or when out of memory. */
VMSNAP_API char *vmsnap_store_local_path(const struct vmsnap_store *st, const char *key);
/* Format the URL of `key` in this store ("s3://bucket/key", "/abs/path") into buf. */
VMSNAP_API const char *vmsnap_store_url(const struct vmsnap_store *st, const char *key, char *buf,
                                        size_t len);

/* Open one stream (an S3 connection). Free with vmsnap_store_conn_free (NULL allowed). */
VMSNAP_API int vmsnap_store_conn_new(struct vmsnap_store *st, struct vmsnap_store_conn **out,
                                     struct vmsnap_err *err);
VMSNAP_API void vmsnap_store_conn_free(struct vmsnap_store_conn *c);
/* The store `c` was opened on. */
VMSNAP_API struct vmsnap_store *vmsnap_store_conn_store(const struct vmsnap_store_conn *c);
/* While `on`, the requests on `c` are not retried (one attempt each): for a caller that checks
 * something and then acts on it (a listing, then a DELETE), so that no back-off between two
 * attempts holds open the time between its check and its request. Off when opened. */
VMSNAP_API void vmsnap_store_conn_one_attempt(struct vmsnap_store_conn *c, bool on);
/* A listing on `c` skipped a directory it could not read (the local store: a warning names it);
 * a caller that needs the whole list reports failure. Stays set once set. */
VMSNAP_API bool vmsnap_store_conn_list_skipped(const struct vmsnap_store_conn *c);
/* The last request on `c` failed because the bucket does not exist (S3's NoSuchBucket; an
 * -ENOENT that is not about one object). Always false for the local store. */
VMSNAP_API bool vmsnap_store_conn_no_bucket(const struct vmsnap_store_conn *c);

/* Store `len` bytes as object `key` in one request (replaces an existing object atomically). */
VMSNAP_API int vmsnap_store_put(struct vmsnap_store_conn *c, const char *key, const void *buf,
                                size_t len, struct vmsnap_err *err);

/* Multipart upload: create returns a malloc'd upload id (caller frees). Parts may be uploaded
 * concurrently on different connections; `offset` is the part's byte offset in the object (the
 * local store writes there; S3 ignores it) and part numbers run 1..N in offset order. The
 * object appears only on complete, with parts sorted by number. Abort discards everything;
 * aborting an unknown upload is not an error. */
VMSNAP_API int vmsnap_store_mpu_create(struct vmsnap_store_conn *c, const char *key,
                                       char **upload_id, struct vmsnap_err *err);
VMSNAP_API int vmsnap_store_mpu_part(struct vmsnap_store_conn *c, const char *key,
                                     const char *upload_id, uint32_t number, uint64_t offset,
                                     const void *buf, size_t len, struct vmsnap_store_part *out,
                                     struct vmsnap_err *err);
VMSNAP_API int vmsnap_store_mpu_complete(struct vmsnap_store_conn *c, const char *key,
                                         const char *upload_id,
                                         const struct vmsnap_store_part *parts, uint32_t nparts,
                                         struct vmsnap_err *err);
VMSNAP_API int vmsnap_store_mpu_abort(struct vmsnap_store_conn *c, const char *key,
                                      const char *upload_id, struct vmsnap_err *err);

/* Make part `number` of an upload from bytes [src_off, src_off + len) of the existing object
 * `src_key` in the same store, without moving them through this process (S3: UploadPartCopy,
 * executed by the server; local store: copy_file_range). `src_etag` (from
 * vmsnap_store_head_etag) guards the source: if the object changed since, -ESTALE. The same part
 * size rules as vmsnap_store_mpu_part() apply. */
VMSNAP_API int vmsnap_store_mpu_part_copy(struct vmsnap_store_conn *c, const char *key,
                                          const char *upload_id, uint32_t number, uint64_t offset,
                                          const char *src_key, const char *src_etag,
                                          uint64_t src_off, uint64_t len,
                                          struct vmsnap_store_part *out, struct vmsnap_err *err);

/* Read exactly `len` bytes of `key` at `off` into buf (-EIO if the object is shorter). */
VMSNAP_API int vmsnap_store_get(struct vmsnap_store_conn *c, const char *key, uint64_t off,
                                size_t len, void *buf, struct vmsnap_err *err);
/* Read the last min(len, size) bytes of `key` into buf in one request (S3: a suffix Range), with
 * the object's size: *got bytes read, *size the whole object's. -ENOENT if it does not exist;
 * an empty object gives *got = *size = 0. Opening an object this way needs no HEAD. */
VMSNAP_API int vmsnap_store_get_tail(struct vmsnap_store_conn *c, const char *key, size_t len,
                                     void *buf, size_t *got, uint64_t *size,
                                     struct vmsnap_err *err);
/* Read the whole object in order through `fn` (one GET; no retry once data was delivered). */
VMSNAP_API int vmsnap_store_get_stream(struct vmsnap_store_conn *c, const char *key,
                                       vmsnap_store_data_fn fn, void *arg, struct vmsnap_err *err);
/* Object size, or -ENOENT. */
VMSNAP_API int vmsnap_store_head(struct vmsnap_store_conn *c, const char *key, uint64_t *size,
                                 struct vmsnap_err *err);
/* Object size and entity tag: S3's ETag; local store: a tag of the file's identity and
 * modification time. A changed object gets a new tag. */
VMSNAP_API int vmsnap_store_head_etag(struct vmsnap_store_conn *c, const char *key, uint64_t *size,
                                      char etag[VMSNAP_STORE_ETAG_MAX], struct vmsnap_err *err);
/* Delete `key`; a missing object is not an error. */
VMSNAP_API int vmsnap_store_delete(struct vmsnap_store_conn *c, const char *key,
                                   struct vmsnap_err *err);
/* After the objects under `prefix` ("KEY/") were deleted: drop what held them when it is empty
 * (the local store: the directory, which a push created; S3 has nothing to drop). */
VMSNAP_API void vmsnap_store_tidy(struct vmsnap_store_conn *c, const char *prefix);
/* Every object whose key starts with `prefix`, in key order for S3 (directory order locally). */
VMSNAP_API int vmsnap_store_list(struct vmsnap_store_conn *c, const char *prefix,
                                 vmsnap_store_list_fn fn, void *arg, struct vmsnap_err *err);
/* When the unfinished upload `upload_id` of `key` last stored a part (Unix seconds by the store's
 * clock): *last = -1 when it has none yet, or when the store does not tell (the local store,
 * whose vmsnap_store_list_uploads already gives the last write). -ENOENT: the upload is gone. */
VMSNAP_API int vmsnap_store_mpu_last_part(struct vmsnap_store_conn *c, const char *key,
                                          const char *upload_id, int64_t *last,
                                          struct vmsnap_err *err);
/* Every unfinished multipart upload whose key starts with `prefix`. */
VMSNAP_API int vmsnap_store_list_uploads(struct vmsnap_store_conn *c, const char *prefix,
                                         vmsnap_store_upload_fn fn, void *arg,
                                         struct vmsnap_err *err);

/* libcurl's process-wide state: vmsnap_store_open() initialises it on first use; a program that
 * wants a clean leak report calls this once at exit, after every store is freed. It also closes
 * the idle connections (below). */
VMSNAP_API void vmsnap_store_global_cleanup(void);

/* Connections and credentials kept across stores, process-wide (S3 backend). A store connection
 * that is freed parks its CURL handle with its live TCP/TLS connection; the next store
 * connection to the same endpoint, bucket and TLS settings in this process takes it, so one
 * operation after another (the node daemon's) connects once. New connections resume TLS
 * sessions of earlier ones. Credentials that a provider handed out with an expiry (instance
 * metadata, container endpoint, web identity, credential_process, Google's tokens) are reused by
 * the next store with the same source and settings until they are due for refresh; keys read
 * from the environment or the profile files are read again by every store. Both are bounded:
 * at most `idle_max` parked connections (default 16; none idle for more than 60 s), 16 sets of
 * credentials. */
struct vmsnap_store_stats {
    uint64_t requests;      /* HTTP requests made (each attempt of each request) */
    uint64_t connects;      /* TCP connections opened by them (libcurl's CURLINFO_NUM_CONNECTS) */
    uint64_t conns_reused;  /* store connections that started with a parked, warm handle */
    uint64_t conns_new;     /* store connections that started with a new handle */
    uint64_t conns_idle;    /* handles parked now */
    uint64_t creds_fetched; /* credentials fetched from a provider */
    uint64_t creds_reused; /* stores that took a provider's credentials fetched by an earlier one */
};
/* The counters since the process started. Thread-safe. */
VMSNAP_API void vmsnap_store_stats(struct vmsnap_store_stats *out);
/* At most n parked connections (0 turns parking off and closes them; capped at 1024). */
VMSNAP_API void vmsnap_store_set_idle_max(unsigned n);
/* Close every parked connection now (idle ones are otherwise closed after 60 s). */
VMSNAP_API void vmsnap_store_idle_close(void);

#ifdef __cplusplus
}
#endif
#endif
