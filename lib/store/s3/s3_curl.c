/* SPDX-License-Identifier: Apache-2.0 */
/* libcurl loaded on first use (see s3_curl.h for why). */
#include "s3_curl.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>

struct curl_api s3_curl;

static pthread_once_t once = PTHREAD_ONCE_INIT;
static int load_rc;
static char load_msg[VMSNAP_ERR_MSG_MAX];

#define SYM(field, name)                                                                           \
    {                                                                                              \
#name, (void **)&s3_curl.field                                                             \
    }

static void load(void)
{
    static const struct {
        const char *name;
        void **ptr;
    } syms[] = {
        SYM(global_init, curl_global_init),       SYM(global_cleanup, curl_global_cleanup),
        SYM(easy_init, curl_easy_init),           SYM(easy_setopt, curl_easy_setopt),
        SYM(easy_perform, curl_easy_perform),     SYM(easy_getinfo, curl_easy_getinfo),
        SYM(easy_reset, curl_easy_reset),         SYM(easy_cleanup, curl_easy_cleanup),
        SYM(easy_strerror, curl_easy_strerror),   SYM(slist_append, curl_slist_append),
        SYM(slist_free_all, curl_slist_free_all), SYM(share_init, curl_share_init),
        SYM(share_setopt, curl_share_setopt),     SYM(share_cleanup, curl_share_cleanup),
    };
    /* Never unloaded: libcurl keeps global state until the process ends. */
    void *h = dlopen("libcurl.so.4", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        load_rc = -ENOENT;
        snprintf(load_msg, sizeof(load_msg),
                 "cannot load libcurl for the S3 backend (%s): install libcurl4", dlerror());
        return;
    }
    for (size_t i = 0; i < sizeof(syms) / sizeof(syms[0]); i++) {
        *syms[i].ptr = dlsym(h, syms[i].name);
        if (!*syms[i].ptr) {
            load_rc = -ENOENT;
            snprintf(load_msg, sizeof(load_msg), "libcurl.so.4 lacks %s", syms[i].name);
            return;
        }
    }
}

int s3_curl_load(struct vmsnap_err *err)
{
    pthread_once(&once, load);
    if (load_rc < 0)
        return vmsnap_err_set(err, -load_rc, "%s", load_msg);
    return 0;
}
