/* SPDX-License-Identifier: Apache-2.0 */
/* The S3 backend's pure parts: SigV4 against AWS's published examples, URI encoding, and the S3
 * XML reader on hostile input. (URL parsing: test_store_url.c; manifests: test_manifest.c.) */
#include "store/s3/s3_int.h"
#include "store/s3/sigv4_int.h"
#include "store/store_int.h"
#include "t.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static void test_signing_key(void)
{
    /* AWS docs, "Examples of how to derive a signing key": IAM, 20120215, us-east-1 */
    uint8_t k[32];
    REQUIRE(sigv4_signing_key("wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", "20120215", "us-east-1",
                              "iam", k) == 0);
    char hex[65];
    for (int i = 0; i < 32; i++)
        snprintf(hex + 2 * i, 3, "%02x", k[i]);
    CHECKF(!strcmp(hex, "f4780e2d9f65fa895f9c67b32ce1baf0b0d8a43505a000a1a9e090d414db404d"), "%s",
           hex);
}

static void test_s3_get_object_example(void)
{
    /* S3 API reference, "Example: GET Object" (header-based auth, Range bytes=0-9) */
    const char *empty = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
    struct sigv4_header h[] = {
        {"x-amz-date", "20130524T000000Z"},
        {"range", "bytes=0-9"},
        {"host", "examplebucket.s3.amazonaws.com"},
        {"x-amz-content-sha256", empty},
    };
    struct sigv4_input in = {"GET",
                             "/test.txt",
                             "",
                             h,
                             4,
                             empty,
                             "20130524T000000Z",
                             "us-east-1",
                             "s3",
                             "AKIAIOSFODNN7EXAMPLE",
                             "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"};
    char auth[512];
    REQUIRE(sigv4_authorization(&in, auth, sizeof(auth)) == 0);
    CHECKF(!strcmp(auth,
                   "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/"
                   "aws4_request, SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, "
                   "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"),
           "%s", auth);
    /* the secret never reaches the output */
    CHECK(!strstr(auth, "wJalr"));
    /* a different secret gives a different signature */
    in.secret_key = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEZ";
    char auth2[512];
    REQUIRE(sigv4_authorization(&in, auth2, sizeof(auth2)) == 0);
    CHECK(strcmp(auth, auth2) != 0);
}

static void test_get_vanilla(void)
{
    /* aws-sig-v4-test-suite "get-vanilla" */
    struct sigv4_header h[] = {{"host", "example.amazonaws.com"},
                               {"x-amz-date", "20150830T123600Z"}};
    struct sigv4_input in = {"GET",
                             "/",
                             "",
                             h,
                             2,
                             "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
                             "20150830T123600Z",
                             "us-east-1",
                             "service",
                             "AKIDEXAMPLE",
                             "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"};
    char auth[512];
    REQUIRE(sigv4_authorization(&in, auth, sizeof(auth)) == 0);
    CHECKF(
        strstr(auth, "Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31"),
        "%s", auth);
}

static void test_uri_encode(void)
{
    char out[64];
    CHECK(sigv4_uri_encode("a b/c~d+é", true, out, sizeof(out)) > 0);
    CHECKF(!strcmp(out, "a%20b/c~d%2B%C3%A9"), "%s", out);
    CHECK(sigv4_uri_encode("a/b", false, out, sizeof(out)) > 0);
    CHECK(!strcmp(out, "a%2Fb"));
    CHECK(sigv4_uri_encode("abcdef", true, out, 4) == -ENOSPC);
}

static void test_xml(void)
{
    const char *doc = "<?xml version=\"1.0\"?><ListBucketResult xmlns=\"x\"><IsTruncated>true"
                      "</IsTruncated><Contents><Key>a&amp;b&#x41;&#66;</Key><Size>12</Size>"
                      "</Contents><Contents><Key>c</Key><Size>3</Size></Contents>"
                      "<KeyCount>2</KeyCount><NextContinuationToken/></ListBucketResult>";
    struct xml_span s = {doc, strlen(doc)}, c, r;
    char buf[64];
    uint64_t v;
    REQUIRE(xml_find(s, "Contents", &c, &r));
    CHECK(xml_child_text(c, "Key", buf, sizeof(buf)) && !strcmp(buf, "a&bAB"));
    CHECK(xml_child_u64(c, "Size", &v) && v == 12);
    REQUIRE(xml_find(r, "Contents", &c, &r));
    CHECK(xml_child_text(c, "Key", buf, sizeof(buf)) && !strcmp(buf, "c"));
    CHECK(!xml_find(r, "Contents", &c, &r));
    CHECK(xml_child_text(s, "IsTruncated", buf, sizeof(buf)) && !strcmp(buf, "true"));
    /* "Key" must not match "KeyCount" */
    struct xml_span only = {"<KeyCount>2</KeyCount>", 22};
    CHECK(!xml_find(only, "Key", &c, &r));
    CHECK(xml_child_text(s, "NextContinuationToken", buf, sizeof(buf)) && buf[0] == '\0');
    /* hostile: unterminated, bad entities, NUL, overflow, truncated everywhere */
    const char *bad[] = {"<Key>abc",
                         "<Key>a&bogus;</Key>",
                         "<Key>&#0;</Key>",
                         "<Key>&#x110000;</Key>",
                         "<Key>a<b>c</b></Key>",
                         "<Size>99999999999999999999</Size>",
                         "<Key"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct xml_span b = {bad[i], strlen(bad[i])};
        CHECKF(!xml_child_text(b, "Key", buf, sizeof(buf)) || i == 5, "bad[%zu]", i);
        CHECK(!xml_child_u64(b, "Size", &v));
    }
    struct xml_span nul = {"<Key>a\0b</Key>", 14};
    CHECK(!xml_child_text(nul, "Key", buf, sizeof(buf)));
    struct xml_span small = {"<Key>abcdef</Key>", 17};
    CHECK(!xml_child_text(small, "Key", buf, 4));
    /* every prefix of the document is handled without reading past it */
    for (size_t n = 0; n < strlen(doc); n++) {
        char *cp = malloc(n ? n : 1);
        memcpy(cp, doc, n);
        struct xml_span p = {cp, n};
        for (struct xml_span cur = p; xml_find(cur, "Contents", &c, &r); cur = r)
            xml_child_text(c, "Key", buf, sizeof(buf));
        free(cp);
    }
}

int main(void)
{
    test_signing_key();
    test_s3_get_object_example();
    test_get_vanilla();
    test_uri_encode();
    test_xml();
    return t_done();
}
