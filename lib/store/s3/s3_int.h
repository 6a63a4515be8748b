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

#endif
