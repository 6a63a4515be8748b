/* SPDX-License-Identifier: Apache-2.0 */
/* Fuzz target: the snapshot-set manifest parser on untrusted bytes; a parsed manifest must
 * serialise and parse back to the same file list (when it carries every file's detail). The same
 * bytes go through the push-mark parser (gc reads marks from the store), whose marks must
 * round-trip too. */
#include "xfer/xfer_int.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void fuzz_mark(const uint8_t *data, size_t size)
{
    static const char id[] = "0123456789abcdef0123456789abcdef";
    struct push_mark pm;
    struct vmsnap_err err;
    if (push_mark_parse((const char *)data, size, "fuzz", id, &pm, &err) != 0)
        return;
    struct mf_file *f = calloc(pm.nfiles ? pm.nfiles : 1, sizeof(*f));
    if (!f)
        abort();
    for (size_t i = 0; i < pm.nfiles; i++)
        f[i].name = pm.names[i];
    char *js =
        push_mark_build(id, pm.started, f, pm.nfiles, pm.names + pm.nfiles, pm.n - pm.nfiles);
    struct push_mark p2;
    if (!js || push_mark_parse(js, strlen(js), "fuzz-rebuilt", id, &p2, &err) != 0 ||
        p2.n != pm.n || p2.nfiles != pm.nfiles || p2.started != pm.started)
        abort();
    for (size_t i = 0; i < pm.n; i++)
        if (strcmp(pm.names[i], p2.names[i]) != 0)
            abort();
    push_mark_fini(&p2);
    free(js);
    free(f);
    push_mark_fini(&pm);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_mark(data, size);
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
