/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Private: the S3 backend's CURL handles, parked with their live connection when a store
 * connection is freed and handed to the next store connection to the same origin, in this
 * process (s3_pool.c says why handles and not libcurl's shared connection cache). A daemon
 * running one operation after another thus reuses its TCP and TLS connections and its TLS
 * sessions; a CLI process, which runs one operation, only parks them until it exits.
 *
 * vmsnap_store_stats, vmsnap_store_set_idle_max and vmsnap_store_idle_close (store.h) are here.
 *
 * Thread safety: every function may be called from any thread; a handle is used by the one
 * thread that holds it.
 */
#ifndef VMSNAP_S3_POOL_H
#define VMSNAP_S3_POOL_H

#include "s3_curl.h"
#include "vmsnap/store.h"

#include <stdbool.h>
#include <stdint.h>

struct s3_handle {
    CURL *h;
    int fd;        /* the socket of the handle's connection, -1 if none; lives with the handle
                    * because libcurl keeps a pointer to it (CURLOPT_CLOSESOCKETDATA) as long as
                    * the connection lives */
    CURLSH *share; /* TLS sessions and DNS answers (NULL: none); set on the handle per request */
    char origin[320];
};

/* A handle for `origin` (a string naming where its connection goes and with which TLS
 * settings): a parked one of the same origin, else a new one. 0, or -ENOMEM. */
int s3_handle_get(const char *origin, struct s3_handle **out, struct vmsnap_err *err);
/* Give a handle back: parked when `reusable` and it holds a connection, else closed. NULL ok. */
void s3_handle_put(struct s3_handle *hd, bool reusable);
/* Count one request and the connections it opened (CURLINFO_NUM_CONNECTS). */
void s3_pool_count(uint64_t connects);
/* Close parked handles, the oldest first, until at most `keep` remain. */
void s3_pool_trim(unsigned keep);
/* Close every parked handle and, when no handle uses it any more, the share. */
void s3_pool_cleanup(void);

#endif
