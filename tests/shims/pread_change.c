/* SPDX-License-Identifier: Apache-2.0 */
/*
 * LD_PRELOAD shim for the tests of sources written while vmsnap reads them: at the first pread
 * of the file SHIM_FILE (matched by the descriptor's path), SHIM_ACT=truncate cuts it to 1000
 * bytes and SHIM_ACT=append (the default) appends 8 bytes to it, then the read goes on.
 * Built by the test scripts: cc -shared -fPIC -o X.so pread_change.c -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

static int done;

ssize_t pread64(int fd, void *buf, size_t n, off_t off)
{
    char p[64], real[4096];
    snprintf(p, sizeof(p), "/proc/self/fd/%d", fd);
    ssize_t k = readlink(p, real, sizeof(real) - 1);
    const char *want = getenv("SHIM_FILE");
    if (k > 0 && want) {
        real[k] = 0;
        if (!strcmp(real, want) && !__atomic_exchange_n(&done, 1, __ATOMIC_SEQ_CST)) {
            const char *act = getenv("SHIM_ACT");
            if (act && !strcmp(act, "truncate")) {
                if (truncate(real, 1000) != 0)
                    perror("shim: truncate");
            } else {
                int w = open(real, O_WRONLY | O_APPEND);
                if (w < 0 || write(w, "appended", 8) != 8)
                    perror("shim: append");
                if (w >= 0)
                    close(w);
            }
        }
    }
    return ((ssize_t(*)(int, void *, size_t, off_t))dlsym(RTLD_NEXT, "pread64"))(fd, buf, n, off);
}

ssize_t pread(int fd, void *buf, size_t n, off_t off)
{
    return pread64(fd, buf, n, off);
}
