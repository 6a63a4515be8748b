/* SPDX-License-Identifier: Apache-2.0 */
/* Fuzz target: the seek table parser on untrusted bytes (the whole skippable frame). */
#include "image/image_int.h"
#include "vmsnap/image.h"

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct vmsnap_err err;
    struct vmsnap_image *img = NULL;
    if (img_table_parse(data, size, 36, 1ull << 40, "fuzz", &img, &err) == 0) {
        struct vmsnap_image_stats st;
        vmsnap_image_get_stats(img, &st);
        uint32_t n = vmsnap_image_frame_count(img);
        struct vmsnap_frame_info fi;
        for (uint32_t i = 0; i < n; i++)
            vmsnap_image_frame(img, i, &fi);
        vmsnap_image_free(img);
    }
    return 0;
}
