/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Private: libcurl, loaded on first use. libcurl and the libraries it pulls in (about thirty:
 * TLS, Kerberos, LDAP, HTTP/2, ...) cost about 1.6 ms of start-up in every process that links
 * them, which every vmsnap verb would pay though only the S3 backend needs them. So the backend
 * calls libcurl through this table, filled by dlopen("libcurl.so.4") in s3_global_init(); the
 * macros below keep the call sites written as plain libcurl.
 */
#ifndef VMSNAP_S3_CURL_H
#define VMSNAP_S3_CURL_H

#define CURL_DISABLE_TYPECHECK
#include "vmsnap/common.h"

#include <curl/curl.h>

struct curl_api {
    CURLcode (*global_init)(long flags);
    void (*global_cleanup)(void);
    CURL *(*easy_init)(void);
    CURLcode (*easy_setopt)(CURL *h, CURLoption opt, ...);
    CURLcode (*easy_perform)(CURL *h);
    CURLcode (*easy_getinfo)(CURL *h, CURLINFO info, ...);
    void (*easy_reset)(CURL *h);
    void (*easy_cleanup)(CURL *h);
    const char *(*easy_strerror)(CURLcode code);
    struct curl_slist *(*slist_append)(struct curl_slist *l, const char *s);
    void (*slist_free_all)(struct curl_slist *l);
    CURLSH *(*share_init)(void);
    CURLSHcode (*share_setopt)(CURLSH *s, CURLSHoption opt, ...);
    CURLSHcode (*share_cleanup)(CURLSH *s);
};

extern struct curl_api s3_curl;

/* Load libcurl (once; thread-safe). Returns 0 or -ENOENT with a message naming the library. */
int s3_curl_load(struct vmsnap_err *err);

/* curl.h wraps these two in argument-count-checking macros when type checks are off */
#undef curl_easy_setopt
#undef curl_easy_getinfo
#undef curl_share_setopt
#define curl_global_init s3_curl.global_init
#define curl_global_cleanup s3_curl.global_cleanup
#define curl_easy_init s3_curl.easy_init
#define curl_easy_setopt s3_curl.easy_setopt
#define curl_easy_perform s3_curl.easy_perform
#define curl_easy_getinfo s3_curl.easy_getinfo
#define curl_easy_reset s3_curl.easy_reset
#define curl_easy_cleanup s3_curl.easy_cleanup
#define curl_easy_strerror s3_curl.easy_strerror
#define curl_slist_append s3_curl.slist_append
#define curl_slist_free_all s3_curl.slist_free_all
#define curl_share_init s3_curl.share_init
#define curl_share_setopt s3_curl.share_setopt
#define curl_share_cleanup s3_curl.share_cleanup

#endif
