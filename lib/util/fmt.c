/* SPDX-License-Identifier: Apache-2.0 */
#include "util/util.h"

#include <stdio.h>

const char *vmsnap_fmt_bytes(char *buf, size_t len, uint64_t bytes)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    double v = (double)bytes;
    unsigned u = 0;
    while (v >= 1024.0 && u < 5) {
        v /= 1024.0;
        u++;
    }
    if (u == 0)
        snprintf(buf, len, "%llu B", (unsigned long long)bytes);
    else
        snprintf(buf, len, "%.2f %s", v, units[u]);
    return buf;
}
