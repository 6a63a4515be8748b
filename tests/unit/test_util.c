/* SPDX-License-Identifier: Apache-2.0 */
/* Unit test of the util module's error values: a message wrapped many times keeps its
 * outermost context and its root cause. */
#include "t.h"
#include "vmsnap/common.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

/* Errors wrapped many times (vm -> xfer -> store) keep the outermost context and the root
 * cause when they outgrow the message: the middle goes. */
static void test_err_wrap(void)
{
    struct vmsnap_err e = {0};
    vmsnap_err_set(&e, ENOSPC, "write /x/memory-ranges: No space left on device");
    vmsnap_err_wrap(&e, "short: ");
    CHECKF(!strcmp(e.msg, "short: write /x/memory-ranges: No space left on device"), "%s", e.msg);
    char pre[200];
    for (int i = 0; i < 20; i++) {
        snprintf(pre, sizeof(pre), "level %02d %0150d: ", i, 0);
        vmsnap_err_wrap(&e, "%s", pre);
    }
    size_t n = strlen(e.msg);
    CHECKF(n == sizeof(e.msg) - 1, "length %zu", n);
    CHECKF(!strncmp(e.msg, "level 19 ", 9), "%.40s", e.msg);
    const char *cause = "No space left on device";
    CHECKF(!strcmp(e.msg + n - strlen(cause), cause), "%s", e.msg + n - 40);
    CHECK(strstr(e.msg, " ... ") != NULL);
    CHECK(e.code == ENOSPC);
}

int main(void)
{
    test_err_wrap();
    return t_done();
}
