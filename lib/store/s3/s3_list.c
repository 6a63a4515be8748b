/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The S3 listings: ListObjectsV2, ListMultipartUploads and ListParts, page by page.
 */
#include "s3_curl.h"
#include "s3_int.h"
#include "sigv4_int.h"
#include "store/store_int.h"

#include "sys/sys.h"
#include "util/util.h"

#include <ctype.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
/* "2026-11-30T12:00:00.000Z" (S3's form; fraction optional, or an offset "+01:00" / "-0500"
 * instead of Z) -> Unix seconds; -1 if it is not exactly that. */
static int64_t iso8601(const char *s)
{
    struct tm tm = {0};
    int n = 0;
    if (sscanf(s, "%4d-%2d-%2dT%2d:%2d:%2d%n", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour,
               &tm.tm_min, &tm.tm_sec, &n) != 6 ||
        n != 19 || tm.tm_year < 1970 || tm.tm_mon < 1 || tm.tm_mon > 12 || tm.tm_mday < 1 ||
        tm.tm_mday > 31 || tm.tm_hour > 23 || tm.tm_min > 59 || tm.tm_sec > 60)
        return -1;
    const char *p = s + n;
    if (*p == '.') {
        if (!isdigit((unsigned char)*++p))
            return -1;
        while (isdigit((unsigned char)*p))
            p++;
    }
    int64_t off = 0;
    if (*p == 'Z') {
        p++;
    } else if (*p == '+' || *p == '-') {
        int sign = *p++ == '-' ? -1 : 1;
        if (!isdigit((unsigned char)p[0]) || !isdigit((unsigned char)p[1]))
            return -1;
        int hh = (p[0] - '0') * 10 + (p[1] - '0'), mm = 0;
        p += 2;
        if (*p == ':')
            p++;
        if (isdigit((unsigned char)p[0]) && isdigit((unsigned char)p[1])) {
            mm = (p[0] - '0') * 10 + (p[1] - '0');
            p += 2;
        }
        if (hh > 23 || mm > 59)
            return -1;
        off = sign * (int64_t)(hh * 3600 + mm * 60);
    } else {
        return -1;
    }
    if (*p)
        return -1;
    tm.tm_year -= 1900;
    tm.tm_mon -= 1;
    time_t t = timegm(&tm);
    return t == (time_t)-1 ? -1 : (int64_t)t - off;
}

int s3_list(struct vmsnap_store_conn *c, const char *prefix, vmsnap_store_list_fn fn, void *arg,
            struct vmsnap_err *err)
{
    char token[2048] = "";
    for (;;) {
        struct qparam q[3] = {{"list-type", "2"}, {"prefix", prefix}};
        size_t nq = 2;
        if (token[0])
            q[nq++] = (struct qparam){"continuation-token", token};
        struct dbuf resp = {.max = RESP_CAP};
        struct req r = {.method = "GET", .key = "", .q = q, .nq = nq, .resp = &resp};
        int rc = perform(c, &r, err);
        if (rc < 0) {
            free(resp.p);
            return rc;
        }
        struct xml_span s = {resp.p ? resp.p : "", resp.len}, item, rest;
        for (struct xml_span cur = s; rc == 0 && xml_find(cur, "Contents", &item, &rest);
             cur = rest) {
            char k[1100], lm[64];
            uint64_t size = 0;
            if (!xml_child_text(item, "Key", k, sizeof(k)) || !xml_child_u64(item, "Size", &size))
                rc = vmsnap_err_set(err, EPROTO, "list %s/%s: malformed <Contents>",
                                    c->st->s3.bucket, prefix);
            else
                rc = fn(arg, k, size,
                        xml_child_text(item, "LastModified", lm, sizeof(lm)) ? iso8601(lm) : -1);
        }
        char trunc[8] = "";
        xml_child_text(s, "IsTruncated", trunc, sizeof(trunc));
        bool more = !strcmp(trunc, "true");
        if (rc == 0 && more &&
            (!xml_child_text(s, "NextContinuationToken", token, sizeof(token)) || !token[0]))
            rc = vmsnap_err_set(err, EPROTO, "list %s/%s: truncated without a continuation token",
                                c->st->s3.bucket, prefix);
        free(resp.p);
        if (rc < 0 || !more)
            return rc;
    }
}

/* ListParts: the newest part's LastModified (-1: no part yet), page by page. */
int s3_mpu_last_part(struct vmsnap_store_conn *c, const char *key, const char *upload_id,
                     int64_t *last, struct vmsnap_err *err)
{
    *last = -1;
    char marker[16] = "";
    for (int page = 0; page < 100; page++) {
        struct qparam q[2] = {{"uploadId", upload_id}};
        size_t nq = 1;
        if (marker[0])
            q[nq++] = (struct qparam){"part-number-marker", marker};
        struct dbuf resp = {.max = RESP_CAP};
        struct req r = {.method = "GET", .key = key, .q = q, .nq = nq, .resp = &resp};
        int rc = perform(c, &r, err);
        if (rc < 0) {
            free(resp.p);
            return rc;
        }
        struct xml_span s = {resp.p ? resp.p : "", resp.len}, item, rest;
        for (struct xml_span cur = s; xml_find(cur, "Part", &item, &rest); cur = rest) {
            char lm[64];
            int64_t t = xml_child_text(item, "LastModified", lm, sizeof(lm)) ? iso8601(lm) : -1;
            if (t > *last)
                *last = t;
        }
        char trunc[8] = "";
        xml_child_text(s, "IsTruncated", trunc, sizeof(trunc));
        bool more = !strcmp(trunc, "true") &&
                    xml_child_text(s, "NextPartNumberMarker", marker, sizeof(marker)) && marker[0];
        free(resp.p);
        if (!more)
            return 0;
    }
    return 0;
}

int s3_list_uploads(struct vmsnap_store_conn *c, const char *prefix, vmsnap_store_upload_fn fn,
                    void *arg, struct vmsnap_err *err)
{
    char kmark[1100] = "", umark[1100] = "";
    for (;;) {
        struct qparam q[4] = {{"uploads", ""}, {"prefix", prefix}};
        size_t nq = 2;
        if (kmark[0]) {
            q[nq++] = (struct qparam){"key-marker", kmark};
            q[nq++] = (struct qparam){"upload-id-marker", umark};
        }
        struct dbuf resp = {.max = RESP_CAP};
        struct req r = {.method = "GET", .key = "", .q = q, .nq = nq, .resp = &resp};
        int rc = perform(c, &r, err);
        if (rc < 0) {
            free(resp.p);
            return rc;
        }
        struct xml_span s = {resp.p ? resp.p : "", resp.len}, item, rest;
        for (struct xml_span cur = s; rc == 0 && xml_find(cur, "Upload", &item, &rest);
             cur = rest) {
            char k[1100], id[1100], init[64];
            if (!xml_child_text(item, "Key", k, sizeof(k)) ||
                !xml_child_text(item, "UploadId", id, sizeof(id)))
                rc = vmsnap_err_set(err, EPROTO, "list uploads %s/%s: malformed <Upload>",
                                    c->st->s3.bucket, prefix);
            else
                rc = fn(arg, k, id,
                        xml_child_text(item, "Initiated", init, sizeof(init)) ? iso8601(init) : -1);
        }
        char trunc[8] = "";
        xml_child_text(s, "IsTruncated", trunc, sizeof(trunc));
        bool more = !strcmp(trunc, "true");
        if (rc == 0 && more) {
            if (!xml_child_text(s, "NextKeyMarker", kmark, sizeof(kmark)) ||
                !xml_child_text(s, "NextUploadIdMarker", umark, sizeof(umark)) || !kmark[0])
                rc = vmsnap_err_set(err, EPROTO, "list uploads %s/%s: truncated without markers",
                                    c->st->s3.bucket, prefix);
        }
        free(resp.p);
        if (rc < 0 || !more)
            return rc;
    }
}
