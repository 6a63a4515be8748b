/* SPDX-License-Identifier: Apache-2.0 */
/* Fuzz target: the S3 XML reader on untrusted response bodies, walking them the way the S3
 * backend does (list results, uploads, errors). */
#include "store/s3/s3_int.h"

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct xml_span in = {(const char *)data, size};
    char text[1024];
    uint64_t v;
    (void)xml_child_text(in, "Code", text, sizeof(text));
    (void)xml_child_text(in, "UploadId", text, sizeof(text));
    (void)xml_child_u64(in, "KeyCount", &v);
    struct xml_span c, rest = in;
    int n = 0;
    while (n++ < 10000 && xml_find(rest, "Contents", &c, &rest)) {
        (void)xml_child_text(c, "Key", text, sizeof(text));
        (void)xml_child_u64(c, "Size", &v);
    }
    rest = in;
    while (n++ < 20000 && xml_find(rest, "Upload", &c, &rest))
        (void)xml_child_text(c, "UploadId", text, sizeof(text));
    return 0;
}
