/* SPDX-License-Identifier: Apache-2.0 */
/* Fuzz target: the snapshot-set manifest parser on untrusted bytes; a parsed manifest must
 * serialise and parse back to the same file list (when it carries every file's detail). */
#include "manifest_int.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct manifest m;
    struct vmsnap_err err;
    memset(&m, 0, sizeof(m));
    if (manifest_parse((const char *)data, size, "fuzz", 1ull << 46, &m, &err) != 0)
        return 0;
    /* manifest_build writes vmsnap manifests: round-trip only those with every file's detail */
    bool detailed = true;
    for (size_t i = 0; i < m.n; i++)
        detailed = detailed && m.files[i].detail;
    char *js = detailed ? manifest_build(&m) : NULL;
    if (js) {
        struct manifest m2;
        memset(&m2, 0, sizeof(m2));
        if (manifest_parse(js, strlen(js), "fuzz-rebuilt", 1ull << 46, &m2, &err) != 0 ||
            m2.n != m.n)
            abort(); /* what we write we must read back */
        for (size_t i = 0; i < m.n; i++)
            if (strcmp(m.files[i].name, m2.files[i].name) != 0)
                abort();
        manifest_fini(&m2);
        free(js);
    }
    manifest_fini(&m);
    return 0;
}
