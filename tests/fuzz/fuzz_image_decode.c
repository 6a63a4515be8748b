/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Fuzz target: the image decoders on untrusted bytes. The input goes through the sequential
 * decoder (fed in two pieces) and, when it carries a seek table, through vmsnap_image_open and
 * the per-frame decoder, all in verify-only mode (no output file), with a small size cap so a
 * forged totalSize cannot make work.
 */
#include "vmsnap/image.h"

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct vmsnap_err err;
    struct vmsnap_seqdec *sd = NULL;
    if (vmsnap_seqdec_new(-1, 1ull << 30, "fuzz", &sd, &err) == 0) {
        size_t half = size / 2;
        if (vmsnap_seqdec_feed(sd, data, half, &err) == 0 &&
            vmsnap_seqdec_feed(sd, data + half, size - half, &err) == 0) {
            struct vmsnap_image_stats st;
            (void)vmsnap_seqdec_finish(sd, &st, &err);
        }
        vmsnap_seqdec_free(sd);
    }
    struct vmsnap_membuf mb = {.data = data, .len = size};
    struct vmsnap_source src;
    vmsnap_source_mem(&src, &mb, "fuzz");
    struct vmsnap_image *img = NULL;
    if (vmsnap_image_open(&src, 1ull << 30, &img, &err) == 1) {
        uint32_t n = vmsnap_image_frame_count(img);
        for (uint32_t i = 0; i < n && i < 64; i++) {
            uint64_t ext = 0;
            if (vmsnap_image_decode_frame(img, i, &src, 0, -1, &ext, &err) < 0)
                break;
        }
        vmsnap_image_free(img);
    }
    return 0;
}
