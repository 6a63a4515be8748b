/* SPDX-License-Identifier: Apache-2.0 */
/* Small shared idioms: checked array growth and the monotonic clock (lib/util/util.h). */
#include "util/util.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

int grow_array(void *arr, size_t *cap, size_t need, size_t elem, size_t first)
{
    if (need <= *cap)
        return 0;
    size_t ncap = *cap ? *cap : (first ? first : 1);
    while (ncap < need) {
        if (ncap > SIZE_MAX / 2)
            return -ENOMEM;
        ncap *= 2;
    }
    if (elem && ncap > SIZE_MAX / elem)
        return -ENOMEM;
    void **p = arr;
    void *n = realloc(*p, ncap * elem);
    if (!n)
        return -ENOMEM;
    *p = n;
    *cap = ncap;
    return 0;
}

double mono_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}
