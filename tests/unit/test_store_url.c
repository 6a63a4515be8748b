/* SPDX-License-Identifier: Apache-2.0 */
/* Store URLs: schemes, S3 and GCS endpoints, addressing style and region from options and the
 * environment, local paths normalised, malformed URLs refused, no secret in a message. */
#include "store/store_int.h"
#include "t.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static void test_urls(void)
{
    struct vmsnap_store *st;
    char *key;
    setenv("AWS_ACCESS_KEY_ID", "AKID", 1);
    setenv("AWS_SECRET_ACCESS_KEY", "topsecretvalue", 1);
    unsetenv("AWS_ENDPOINT_URL");
    unsetenv("AWS_S3_USE_PATH_STYLE");
    unsetenv("AWS_REGION");
    REQUIRE(vmsnap_store_open("s3://my-bucket/a/b/", NULL, &st, &key, NULL) == 0);
    CHECK(!strcmp(key, "a/b"));
    CHECK(!strcmp(st->s3.host, "s3.us-east-1.amazonaws.com") && !st->s3.path_style);
    CHECK(!strcmp(st->s3.scheme, "https") && !strcmp(st->s3.region, "us-east-1"));
    vmsnap_store_free(st);
    free(key);
    struct vmsnap_store_opts o = {.endpoint = "http://127.0.0.1:7480"};
    REQUIRE(vmsnap_store_open("s3://bkt/k", &o, &st, &key, NULL) == 0);
    CHECK(st->s3.path_style && st->s3.port == 7480 && !strcmp(st->s3.host, "127.0.0.1"));
    vmsnap_store_free(st);
    free(key);
    setenv("AWS_S3_USE_PATH_STYLE", "true", 1);
    o.endpoint = "https://minio.example.com";
    REQUIRE(vmsnap_store_open("s3://bkt/k", &o, &st, &key, NULL) == 0);
    CHECK(st->s3.path_style);
    vmsnap_store_free(st);
    free(key);
    unsetenv("AWS_S3_USE_PATH_STYLE");
    REQUIRE(vmsnap_store_open("gs://gbucket/x", NULL, &st, &key, NULL) == 0);
    CHECK(!strcmp(st->s3.host, "storage.googleapis.com") && !strcmp(st->s3.region, "auto"));
    vmsnap_store_free(st);
    free(key);
    REQUIRE(vmsnap_store_open("file:///a/./b/../c", NULL, &st, &key, NULL) == 0);
    CHECK(st->kind == VMSNAP_STORE_LOCAL && !strcmp(key, "a/c"));
    vmsnap_store_free(st);
    free(key);
    struct vmsnap_err e = {0};
    CHECK(vmsnap_store_open("file://rel/x", NULL, &st, &key, &e) == -EINVAL);
    CHECK(vmsnap_store_open("ftp://x/y", NULL, &st, &key, &e) == -EINVAL);
    CHECK(vmsnap_store_open("s3://B/x", NULL, &st, &key, &e) == -EINVAL);
    CHECK(vmsnap_store_open("s3://bkt/a//b", NULL, &st, &key, &e) == -EINVAL);
    CHECK(vmsnap_store_open("s3://bkt/a/../b", NULL, &st, &key, &e) == -EINVAL);
    unsetenv("AWS_SECRET_ACCESS_KEY");
    CHECK(vmsnap_store_open("s3://bkt/x", NULL, &st, &key, &e) == -EACCES);
    CHECK(!strstr(e.msg, "topsecretvalue"));
    vmsnap_store_global_cleanup();
}

int main(void)
{
    test_urls();
    return t_done();
}
