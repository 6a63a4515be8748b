/* SPDX-License-Identifier: Apache-2.0 */
/* Private: the store backend table and the shared store/connection structs. */
#ifndef VMSNAP_STORE_INT_H
#define VMSNAP_STORE_INT_H

#include "vmsnap/store.h"

/* One backend. Every function fills `err` on failure; keys are already validated. */
struct store_ops {
    int (*conn_new)(struct vmsnap_store *st, struct vmsnap_store_conn *c, struct vmsnap_err *err);
    void (*conn_free)(struct vmsnap_store_conn *c);
    int (*put)(struct vmsnap_store_conn *c, const char *key, const void *buf, size_t len,
               struct vmsnap_err *err);
    int (*mpu_create)(struct vmsnap_store_conn *c, const char *key, char **upload_id,
                      struct vmsnap_err *err);
    int (*mpu_part)(struct vmsnap_store_conn *c, const char *key, const char *upload_id,
                    uint32_t number, uint64_t offset, const void *buf, size_t len,
                    struct vmsnap_store_part *out, struct vmsnap_err *err);
    int (*mpu_part_copy)(struct vmsnap_store_conn *c, const char *key, const char *upload_id,
                         uint32_t number, uint64_t offset, const char *src_key,
                         const char *src_etag, uint64_t src_off, uint64_t len,
                         struct vmsnap_store_part *out, struct vmsnap_err *err);
    int (*mpu_complete)(struct vmsnap_store_conn *c, const char *key, const char *upload_id,
                        const struct vmsnap_store_part *parts, uint32_t nparts,
                        struct vmsnap_err *err);
    int (*mpu_abort)(struct vmsnap_store_conn *c, const char *key, const char *upload_id,
                     struct vmsnap_err *err);
    int (*get)(struct vmsnap_store_conn *c, const char *key, uint64_t off, size_t len, void *buf,
               struct vmsnap_err *err);
    int (*get_stream)(struct vmsnap_store_conn *c, const char *key, vmsnap_store_data_fn fn,
                      void *arg, struct vmsnap_err *err);
    int (*get_tail)(struct vmsnap_store_conn *c, const char *key, size_t len, void *buf,
                    size_t *got, uint64_t *size, struct vmsnap_err *err);
    int (*head)(struct vmsnap_store_conn *c, const char *key, uint64_t *size,
                char *etag /* NULL or VMSNAP_STORE_ETAG_MAX bytes */, struct vmsnap_err *err);
    int (*del)(struct vmsnap_store_conn *c, const char *key, struct vmsnap_err *err);
    void (*tidy)(struct vmsnap_store_conn *c, const char *prefix); /* optional */
    int (*list)(struct vmsnap_store_conn *c, const char *prefix, vmsnap_store_list_fn fn, void *arg,
                struct vmsnap_err *err);
    int (*list_uploads)(struct vmsnap_store_conn *c, const char *prefix, vmsnap_store_upload_fn fn,
                        void *arg, struct vmsnap_err *err);
    /* optional: when the upload's newest part was stored (Unix seconds, -1: no part); stores
     * whose list_uploads already gives the last write (local) have none */
    int (*mpu_last_part)(struct vmsnap_store_conn *c, const char *key, const char *upload_id,
                         int64_t *last, struct vmsnap_err *err);
};

struct s3_creds;

/* Parsed endpoint and credentials of an S3 store (secrets never printed). */
struct s3_config {
    char *scheme;  /* "http" / "https" */
    char *host;    /* endpoint host (no port) */
    unsigned port; /* 0: scheme default */
    char *bucket;
    char *region;
    struct s3_creds *creds;  /* the credential chain and current keys (s3/s3_creds.h) */
    char *ca_file, *ca_path; /* TLS trust: NULL for libcurl's default store */
    bool path_style;
    bool insecure_tls;
    unsigned max_attempts;
    unsigned backoff_ms;
    const char *url_scheme; /* "s3" or "gs" for messages */
};

struct vmsnap_store {
    enum vmsnap_store_kind kind;
    const struct store_ops *ops;
    char *root; /* local: directory the keys are relative to ("/") */
    struct s3_config s3;
};

struct vmsnap_store_conn {
    struct vmsnap_store *st;
    void *impl;        /* backend state (S3: struct s3_conn) */
    bool one_attempt;  /* requests are not retried (gc's deletes: a retry's back-off would hold
                        * open the time between its check and its delete) */
    bool list_skipped; /* a listing skipped a directory it could not read (local store: a
                        * warning names it; gc and ls then report failure at the end) */
    bool no_bucket;    /* the last request failed with S3's NoSuchBucket */
};

extern const struct store_ops store_local_ops;
extern const struct store_ops store_s3_ops;

/* The S3 configuration (s3/s3_config.c): parse an s3:// or gs:// `url` (gs: Cloud Storage) into
 * st->s3 with `o` and the environment; *key the malloc'd key. s3_config_fini frees it. */
int s3_config_open(struct vmsnap_store *st, const char *url, bool gs,
                   const struct vmsnap_store_opts *o, char **key, struct vmsnap_err *err);
void s3_config_fini(struct s3_config *c);

/* S3 backend set-up helpers (s3/s3.c). */
int s3_global_init(struct vmsnap_err *err);
void s3_global_cleanup(void);

/* Local store: join root and key into a malloc'd path. */
char *store_local_path(const struct vmsnap_store *st, const char *key);

/* The code in `err`, or `def` when err is NULL or empty (for callees that filled err). */
static inline int err_code_or(const struct vmsnap_err *e, int def)
{
    return e && e->code > 0 ? e->code : def;
}

/* True if `host` is an IPv4/IPv6 literal or "localhost" (path-style addressing). */
bool store_host_is_ip(const char *host);

#endif
