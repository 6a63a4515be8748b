/* SPDX-License-Identifier: Apache-2.0 */
/* A program built against an installed vmsnap (tests/integration/install.sh): packs SRC into
 * OBJ and unpacks OBJ into DST through the public API, printing the populated bytes. */
#include <vmsnap/image.h>

#include <stdio.h>

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: %s SRC OBJ DST\n", argv[0]);
        return 2;
    }
    struct vmsnap_err err = {0};
    struct vmsnap_pack_opts po = {.threads = 2};
    struct vmsnap_image_stats st;
    if (vmsnap_image_pack(argv[1], argv[2], &po, &st, &err) < 0) {
        fprintf(stderr, "pack: %s\n", err.msg);
        return 1;
    }
    struct vmsnap_unpack_opts uo = {.threads = 2};
    if (vmsnap_image_unpack(argv[2], argv[3], &uo, &st, &err) < 0) {
        fprintf(stderr, "unpack: %s\n", err.msg);
        return 1;
    }
    printf("vmsnap %s: %llu populated bytes\n", vmsnap_version(), (unsigned long long)st.populated);
    return 0;
}
