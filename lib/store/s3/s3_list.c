/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The S3 listings: ListObjectsV2, ListMultipartUploads and ListParts. Their pages are followed
 * in one place (follow_pages): each listing hands on one page's items and names the markers that
 * ask for the next.
 */
#include "s3_int.h"
#include "store/store_int.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

/* One page of a listing's answer: hand on its items, then set the query parameters that ask for
 * the next page (in the listing's own buffers) into next[0..*nnext). Returns 1 when there is a
 * next page, 0 after the last, < 0 to stop with an error (err filled). */
typedef int (*page_fn)(void *arg, struct xml_span page, struct qparam *next, size_t *nnext,
                       struct vmsnap_err *err);

#define MAX_MARKERS 2

/* Where S3 list pages are followed: GET `key` ("" for the bucket) with the `fixed` parameters,
 * then with the markers each page names, until a page is the last or `max_pages` were read. */
static int follow_pages(struct vmsnap_store_conn *c, const char *key, const struct qparam *fixed,
                        size_t nfixed, unsigned max_pages, page_fn fn, void *arg,
                        struct vmsnap_err *err)
{
    struct qparam q[4 + MAX_MARKERS];
    memcpy(q, fixed, nfixed * sizeof(*q));
    size_t nq = nfixed;
    for (unsigned page = 0; page < max_pages; page++) {
        struct dbuf resp = {.max = RESP_CAP};
        struct req r = {.method = "GET", .key = key, .q = q, .nq = nq, .resp = &resp};
        int rc = s3_perform(c, &r, err);
        size_t nnext = 0;
        if (rc == 0)
            rc =
                fn(arg, (struct xml_span){resp.p ? resp.p : "", resp.len}, q + nfixed, &nnext, err);
        free(resp.p);
        if (rc <= 0)
            return rc;
        nq = nfixed + nnext;
    }
    return 0;
}

static bool truncated(struct xml_span s)
{
    char trunc[8] = "";
    xml_child_text(s, "IsTruncated", trunc, sizeof(trunc));
    return !strcmp(trunc, "true");
}

struct list_pages {
    struct vmsnap_store_conn *c;
    const char *prefix;
    vmsnap_store_list_fn fn;
    void *arg;
    char token[2048];
};

static int list_page(void *arg, struct xml_span s, struct qparam *next, size_t *nnext,
                     struct vmsnap_err *err)
{
    struct list_pages *l = arg;
    int rc = 0;
    struct xml_span item, rest;
    for (struct xml_span cur = s; rc == 0 && xml_find(cur, "Contents", &item, &rest); cur = rest) {
        char k[1100], lm[64];
        uint64_t size = 0;
        if (!xml_child_text(item, "Key", k, sizeof(k)) || !xml_child_u64(item, "Size", &size))
            rc = vmsnap_err_set(err, EPROTO, "list %s/%s: malformed <Contents>",
                                l->c->st->s3.bucket, l->prefix);
        else
            rc = l->fn(l->arg, k, size,
                       xml_child_text(item, "LastModified", lm, sizeof(lm)) ? iso8601(lm) : -1);
    }
    bool more = truncated(s);
    if (rc == 0 && more &&
        (!xml_child_text(s, "NextContinuationToken", l->token, sizeof(l->token)) || !l->token[0]))
        rc = vmsnap_err_set(err, EPROTO, "list %s/%s: truncated without a continuation token",
                            l->c->st->s3.bucket, l->prefix);
    if (rc < 0 || !more)
        return rc;
    next[(*nnext)++] = (struct qparam){"continuation-token", l->token};
    return 1;
}

int s3_list(struct vmsnap_store_conn *c, const char *prefix, vmsnap_store_list_fn fn, void *arg,
            struct vmsnap_err *err)
{
    struct list_pages l = {.c = c, .prefix = prefix, .fn = fn, .arg = arg};
    const struct qparam q[] = {{"list-type", "2"}, {"prefix", prefix}};
    return follow_pages(c, "", q, 2, UINT_MAX, list_page, &l, err);
}

struct part_pages {
    int64_t *last;
    char marker[16];
};

static int part_page(void *arg, struct xml_span s, struct qparam *next, size_t *nnext,
                     struct vmsnap_err *err)
{
    (void)err;
    struct part_pages *p = arg;
    struct xml_span item, rest;
    for (struct xml_span cur = s; xml_find(cur, "Part", &item, &rest); cur = rest) {
        char lm[64];
        int64_t t = xml_child_text(item, "LastModified", lm, sizeof(lm)) ? iso8601(lm) : -1;
        if (t > *p->last)
            *p->last = t;
    }
    if (!truncated(s) || !xml_child_text(s, "NextPartNumberMarker", p->marker, sizeof(p->marker)) ||
        !p->marker[0])
        return 0;
    next[(*nnext)++] = (struct qparam){"part-number-marker", p->marker};
    return 1;
}

/* ListParts: the newest part's LastModified (-1: no part yet), page by page (100 at most). */
int s3_mpu_last_part(struct vmsnap_store_conn *c, const char *key, const char *upload_id,
                     int64_t *last, struct vmsnap_err *err)
{
    *last = -1;
    struct part_pages p = {.last = last};
    const struct qparam q[] = {{"uploadId", upload_id}};
    return follow_pages(c, key, q, 1, 100, part_page, &p, err);
}

struct upload_pages {
    struct vmsnap_store_conn *c;
    const char *prefix;
    vmsnap_store_upload_fn fn;
    void *arg;
    char kmark[1100], umark[1100];
};

static int upload_page(void *arg, struct xml_span s, struct qparam *next, size_t *nnext,
                       struct vmsnap_err *err)
{
    struct upload_pages *u = arg;
    int rc = 0;
    struct xml_span item, rest;
    for (struct xml_span cur = s; rc == 0 && xml_find(cur, "Upload", &item, &rest); cur = rest) {
        char k[1100], id[1100], init[64];
        if (!xml_child_text(item, "Key", k, sizeof(k)) ||
            !xml_child_text(item, "UploadId", id, sizeof(id)))
            rc = vmsnap_err_set(err, EPROTO, "list uploads %s/%s: malformed <Upload>",
                                u->c->st->s3.bucket, u->prefix);
        else
            rc = u->fn(u->arg, k, id,
                       xml_child_text(item, "Initiated", init, sizeof(init)) ? iso8601(init) : -1);
    }
    bool more = truncated(s);
    if (rc == 0 && more &&
        (!xml_child_text(s, "NextKeyMarker", u->kmark, sizeof(u->kmark)) ||
         !xml_child_text(s, "NextUploadIdMarker", u->umark, sizeof(u->umark)) || !u->kmark[0]))
        rc = vmsnap_err_set(err, EPROTO, "list uploads %s/%s: truncated without markers",
                            u->c->st->s3.bucket, u->prefix);
    if (rc < 0 || !more)
        return rc;
    next[(*nnext)++] = (struct qparam){"key-marker", u->kmark};
    next[(*nnext)++] = (struct qparam){"upload-id-marker", u->umark};
    return 1;
}

int s3_list_uploads(struct vmsnap_store_conn *c, const char *prefix, vmsnap_store_upload_fn fn,
                    void *arg, struct vmsnap_err *err)
{
    struct upload_pages u = {.c = c, .prefix = prefix, .fn = fn, .arg = arg};
    const struct qparam q[] = {{"uploads", ""}, {"prefix", prefix}};
    return follow_pages(c, "", q, 2, UINT_MAX, upload_page, &u, err);
}
