/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The S3 backend on libcurl. One CURL easy handle per connection object, reset (which keeps its
 * live connection) and reconfigured for every request, so a parallel stream keeps one TCP
 * connection. Every request is signed with our SigV4 signer (lib/sigv4.c) and retried with
 * exponential backoff and jitter on transport errors, 5xx, 429 and RequestTimeout, up to
 * max_attempts per request. A streaming GET is retried only until its first byte was delivered.
 *
 * Secrets: the Authorization header is built here and handed to curl only; the -v trace logs
 * method, bucket/key, query, status and time, never headers. curl's own verbose mode is never on.
 */
#include "s3_creds.h"
#include "s3_curl.h"
#include "s3_int.h"
#include "s3_pool.h"
#include "store/store_int.h"

#include "util/util.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static pthread_mutex_t init_lock = PTHREAD_MUTEX_INITIALIZER;
static bool curl_inited;

int s3_global_init(struct vmsnap_err *err)
{
    pthread_mutex_lock(&init_lock);
    int rc = s3_curl_load(err);
    if (rc == 0 && !curl_inited) {
        if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
            rc = vmsnap_err_set(err, EIO, "libcurl initialisation failed");
        else
            curl_inited = true;
    }
    pthread_mutex_unlock(&init_lock);
    return rc;
}

void s3_global_cleanup(void)
{
    s3_pool_cleanup(); /* the parked handles first: libcurl's cleanup comes after them */
    s3_creds_cache_clear();
    pthread_mutex_lock(&init_lock);
    if (curl_inited)
        curl_global_cleanup();
    curl_inited = false;
    pthread_mutex_unlock(&init_lock);
}

static int s3_put(struct vmsnap_store_conn *c, const char *key, const void *buf, size_t len,
                  struct vmsnap_err *err)
{
    struct req r = {.method = "PUT", .key = key, .body = buf, .body_len = len, .has_body = true};
    return s3_perform(c, &r, err);
}

static int s3_mpu_create(struct vmsnap_store_conn *c, const char *key, char **upload_id,
                         struct vmsnap_err *err)
{
    struct qparam q[] = {{"uploads", ""}};
    struct dbuf resp = {.max = RESP_CAP};
    struct req r = {.method = "POST", .key = key, .q = q, .nq = 1, .resp = &resp};
    int rc = s3_perform(c, &r, err);
    if (rc == 0) {
        char id[1024];
        struct xml_span s = {resp.p ? resp.p : "", resp.len};
        if (!xml_child_text(s, "UploadId", id, sizeof(id)) || !id[0])
            rc = vmsnap_err_set(err, EPROTO, "create multipart upload %s/%s: no UploadId in answer",
                                c->st->s3.bucket, key);
        else if (!(*upload_id = strdup(id)))
            rc = vmsnap_err_set(err, ENOMEM, "out of memory");
    }
    free(resp.p);
    return rc;
}

static int s3_mpu_part(struct vmsnap_store_conn *c, const char *key, const char *upload_id,
                       uint32_t number, uint64_t offset, const void *buf, size_t len,
                       struct vmsnap_store_part *out, struct vmsnap_err *err)
{
    (void)offset;
    char num[16];
    snprintf(num, sizeof(num), "%u", number);
    struct qparam q[] = {{"partNumber", num}, {"uploadId", upload_id}};
    struct req r = {.method = "PUT",
                    .key = key,
                    .q = q,
                    .nq = 2,
                    .body = buf,
                    .body_len = len,
                    .has_body = true};
    int rc = s3_perform(c, &r, err);
    if (rc == 0) {
        if (!r.etag[0])
            return vmsnap_err_set(err, EPROTO, "upload part %u of %s/%s: no ETag in answer", number,
                                  c->st->s3.bucket, key);
        out->number = number;
        snprintf(out->etag, sizeof(out->etag), "%s", r.etag);
    }
    return rc;
}

/* UploadPartCopy: the server copies bytes of another object (guarded by its ETag) into the
 * part; the answer's <CopyPartResult> carries the part's ETag (and may be a 200 with <Error>). */
static int s3_mpu_part_copy(struct vmsnap_store_conn *c, const char *key, const char *upload_id,
                            uint32_t number, uint64_t offset, const char *src_key,
                            const char *src_etag, uint64_t src_off, uint64_t len,
                            struct vmsnap_store_part *out, struct vmsnap_err *err)
{
    (void)offset;
    const struct s3_config *cfg = &c->st->s3;
    char num[16], src[3 * 1024 + 300], range[64], enc[3 * 1024 + 1];
    if (strlen(src_key) > 1024 || sigv4_uri_encode(src_key, true, enc, sizeof(enc)) < 0)
        return vmsnap_err_set(err, ENAMETOOLONG, "copy source key too long");
    snprintf(src, sizeof(src), "/%s/%s", cfg->bucket, enc);
    snprintf(range, sizeof(range), "bytes=%llu-%llu", (unsigned long long)src_off,
             (unsigned long long)(src_off + len - 1));
    snprintf(num, sizeof(num), "%u", number);
    struct sigv4_header xh[3] = {{"x-amz-copy-source", src},
                                 {"x-amz-copy-source-if-match", src_etag},
                                 {"x-amz-copy-source-range", range}};
    struct qparam q[] = {{"partNumber", num}, {"uploadId", upload_id}};
    struct dbuf resp = {.max = RESP_CAP};
    struct req r = {.method = "PUT",
                    .key = key,
                    .q = q,
                    .nq = 2,
                    .xh = xh,
                    .nxh = 3,
                    .body = "",
                    .has_body = true, /* an empty body: Content-Length: 0 */
                    .resp = &resp};
    vlog(VMSNAP_LOG_DEBUG, "s3: part %u of %s/%s = copy of %s/%s %s (if-match %s)", number,
         cfg->bucket, key, cfg->bucket, src_key, range, src_etag);
    int rc = s3_perform(c, &r, err);
    if (rc < 0 && r.status == 412)
        rc = vmsnap_err_set(err, ESTALE, "copy %s://%s/%s into part %u of %s: the source changed",
                            cfg->url_scheme, cfg->bucket, src_key, number, key);
    if (rc == 0) {
        struct xml_span s = {resp.p ? resp.p : "", resp.len};
        if (!xml_child_text(s, "ETag", out->etag, sizeof(out->etag)) || !out->etag[0])
            rc = vmsnap_err_set(err, EPROTO, "copy part %u of %s/%s: no ETag in answer", number,
                                cfg->bucket, key);
        out->number = number;
    }
    free(resp.p);
    return rc;
}

static int s3_mpu_complete(struct vmsnap_store_conn *c, const char *key, const char *upload_id,
                           const struct vmsnap_store_part *parts, uint32_t nparts,
                           struct vmsnap_err *err)
{
    struct dbuf body = {.max = (size_t)nparts * 256 + 256};
    int rc = s3_dbuf_add(&body, "<CompleteMultipartUpload>", 25);
    for (uint32_t i = 0; i < nparts && rc == 0; i++) {
        char line[256];
        /* ETags are quoted hex; escape the quotes for XML */
        char et[VMSNAP_STORE_ETAG_MAX * 6];
        size_t o = 0;
        for (const char *p = parts[i].etag; *p && o + 7 < sizeof(et); p++) {
            if (*p == '"') {
                memcpy(et + o, "&quot;", 6);
                o += 6;
            } else if (*p == '&' || *p == '<' || *p == '>') {
                continue;
            } else {
                et[o++] = *p;
            }
        }
        et[o] = '\0';
        int n =
            snprintf(line, sizeof(line), "<Part><PartNumber>%u</PartNumber><ETag>%s</ETag></Part>",
                     parts[i].number, et);
        rc = s3_dbuf_add(&body, line, (size_t)n);
    }
    if (rc == 0)
        rc = s3_dbuf_add(&body, "</CompleteMultipartUpload>", 26);
    if (rc < 0) {
        free(body.p);
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    }
    struct qparam q[] = {{"uploadId", upload_id}};
    struct dbuf resp = {.max = RESP_CAP};
    struct req r = {.method = "POST",
                    .key = key,
                    .q = q,
                    .nq = 1,
                    .body = body.p,
                    .body_len = body.len,
                    .has_body = true,
                    .resp = &resp};
    rc = s3_perform(c, &r, err);
    /* RGW answers an empty <ETag></ETag>: nothing in the answer is needed. */
    free(resp.p);
    free(body.p);
    return rc;
}

static int s3_mpu_abort(struct vmsnap_store_conn *c, const char *key, const char *upload_id,
                        struct vmsnap_err *err)
{
    struct qparam q[] = {{"uploadId", upload_id}};
    struct req r = {.method = "DELETE", .key = key, .q = q, .nq = 1};
    int rc = s3_perform(c, &r, err);
    if (rc == -ENOENT) { /* NoSuchUpload, or RGW's NoSuchKey: already gone */
        vmsnap_err_clear(err);
        rc = 0;
    }
    return rc;
}

static int s3_get(struct vmsnap_store_conn *c, const char *key, uint64_t off, size_t len, void *buf,
                  struct vmsnap_err *err)
{
    struct req r = {.method = "GET", .key = key, .range_off = off, .range_len = len, .dst = buf};
    int rc = s3_perform(c, &r, err);
    if (rc == 0 && r.got != len)
        rc = vmsnap_err_set(err, EIO, "GET %s://%s/%s: %llu of %zu bytes at %llu (short object)",
                            c->st->s3.url_scheme, c->st->s3.bucket, key, (unsigned long long)r.got,
                            len, (unsigned long long)off);
    return rc;
}

static int s3_get_tail(struct vmsnap_store_conn *c, const char *key, size_t len, void *buf,
                       size_t *got, uint64_t *size, struct vmsnap_err *err)
{
    const struct s3_config *cfg = &c->st->s3;
    struct req r = {.method = "GET", .key = key, .range_len = len, .suffix = true, .dst = buf};
    int rc = s3_perform(c, &r, err);
    if (rc < 0 && r.status == 416) {
        /* a suffix range of a non-empty object is always satisfiable: this one is empty */
        vmsnap_err_clear(err);
        return 0;
    }
    if (rc < 0)
        return rc;
    uint64_t total;
    if (r.status == 206) {
        if (!r.have_range || r.cr_last + 1 != r.cr_total || r.cr_last - r.cr_first + 1 != r.got)
            return vmsnap_err_set(err, EPROTO,
                                  "GET %s://%s/%s: a 206 answer without a matching Content-Range "
                                  "for the last %zu bytes",
                                  cfg->url_scheme, cfg->bucket, key, len);
        total = r.cr_total;
    } else { /* 200: the server sent the whole object (it fit in len: write_cb checks) */
        total = r.got;
        if (r.have_length && r.content_length != r.got)
            return vmsnap_err_set(err, EIO, "GET %s://%s/%s: %llu of %llu bytes", cfg->url_scheme,
                                  cfg->bucket, key, (unsigned long long)r.got,
                                  (unsigned long long)r.content_length);
    }
    if (r.got != (total < len ? total : len))
        return vmsnap_err_set(err, EIO, "GET %s://%s/%s: %llu bytes for the last %zu of %llu",
                              cfg->url_scheme, cfg->bucket, key, (unsigned long long)r.got, len,
                              (unsigned long long)total);
    *got = (size_t)r.got;
    *size = total;
    return 0;
}

static int s3_get_stream(struct vmsnap_store_conn *c, const char *key, vmsnap_store_data_fn fn,
                         void *arg, struct vmsnap_err *err)
{
    struct req r = {.method = "GET", .key = key, .stream_fn = fn, .stream_arg = arg};
    int rc = s3_perform(c, &r, err);
    if (rc == 0 && r.have_length && r.got != r.content_length)
        rc = vmsnap_err_set(err, EIO, "GET %s/%s: %llu of %llu bytes", c->st->s3.bucket, key,
                            (unsigned long long)r.got, (unsigned long long)r.content_length);
    return rc;
}

static int s3_head(struct vmsnap_store_conn *c, const char *key, uint64_t *size, char *etag,
                   struct vmsnap_err *err)
{
    struct req r = {.method = "HEAD", .key = key};
    int rc = s3_perform(c, &r, err);
    if (rc == 0) {
        if (!r.have_length)
            return vmsnap_err_set(err, EPROTO, "HEAD %s/%s: no Content-Length", c->st->s3.bucket,
                                  key);
        *size = r.content_length;
        if (etag)
            snprintf(etag, VMSNAP_STORE_ETAG_MAX, "%s", r.etag);
    }
    return rc;
}

static int s3_del(struct vmsnap_store_conn *c, const char *key, struct vmsnap_err *err)
{
    struct req r = {.method = "DELETE", .key = key};
    int rc = s3_perform(c, &r, err);
    if (rc == -ENOENT && r.status == 404 && !r.no_bucket) { /* a missing bucket is an error */
        vmsnap_err_clear(err);
        rc = 0;
    }
    return rc;
}

const struct store_ops store_s3_ops = {
    .conn_new = s3_conn_new,
    .conn_free = s3_conn_free,
    .put = s3_put,
    .mpu_create = s3_mpu_create,
    .mpu_part = s3_mpu_part,
    .mpu_part_copy = s3_mpu_part_copy,
    .mpu_complete = s3_mpu_complete,
    .mpu_abort = s3_mpu_abort,
    .get = s3_get,
    .get_stream = s3_get_stream,
    .get_tail = s3_get_tail,
    .head = s3_head,
    .del = s3_del,
    .list = s3_list,
    .list_uploads = s3_list_uploads,
    .mpu_last_part = s3_mpu_last_part,
};
