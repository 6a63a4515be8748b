/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The S3 backend's idle connections, kept across stores (s3_pool.h).
 *
 * Why a pool of handles and not libcurl's shared connection cache: CURL_LOCK_DATA_CONNECT is
 * documented as not safe between concurrent threads (curl's KNOWN_BUGS, "A shared connection
 * cache is not thread-safe"), and every S3 connection of vmsnap is a thread of its own. A CURL
 * handle used by one thread at a time is safe, and it keeps its live connection when a request
 * ends (and across curl_easy_reset), so parking whole handles keeps the connections warm without
 * sharing any of curl's connection state. What is safe to share (TLS sessions, DNS answers:
 * CURL_LOCK_DATA_SSL_SESSION and CURL_LOCK_DATA_DNS, each under its own mutex) goes into one
 * CURLSH that every handle uses, so a connection that must be made anew resumes its TLS session.
 *
 * A parked handle remembers the origin (scheme, host, port, bucket for virtual-hosted names, TLS
 * settings) its connection goes to and is handed only to a store of the same origin. Bounds: at
 * most `idle_max` handles parked (the oldest closed first), none kept idle longer than
 * IDLE_SECONDS (libcurl itself reuses no connection idle for more than 118 s). Each parked handle
 * holds one socket and libcurl's buffers (about 300 KiB with our buffer sizes).
 */
#include "s3_pool.h"

#include "s3_creds.h"
#include "s3_curl.h"
#include "util/util.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define IDLE_SECONDS 60
#define IDLE_MAX_DEFAULT 16u
#define IDLE_MAX_CAP 1024u

struct parked {
    struct s3_handle *hd;
    double since; /* monotonic seconds when parked */
};

static pthread_mutex_t pool_mu = PTHREAD_MUTEX_INITIALIZER;
static struct parked *parked; /* oldest first */
static size_t nparked, capparked;
static unsigned idle_max = IDLE_MAX_DEFAULT;

static CURLSH *share;
static pthread_mutex_t share_mu[CURL_LOCK_DATA_LAST];

static atomic_uint_fast64_t n_requests, n_connects, n_reused, n_new;

static double now_mono(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void share_lock(CURL *h, curl_lock_data d, curl_lock_access a, void *arg)
{
    (void)h;
    (void)a;
    (void)arg;
    pthread_mutex_lock(&share_mu[d]);
}

static void share_unlock(CURL *h, curl_lock_data d, void *arg)
{
    (void)h;
    (void)arg;
    pthread_mutex_unlock(&share_mu[d]);
}

/* The share, made on first use (pool_mu held). NULL when libcurl cannot make one: the handles
 * then work without it, only without TLS session reuse between them. */
static CURLSH *share_locked(void)
{
    if (share)
        return share;
    CURLSH *s = curl_share_init();
    if (!s)
        return NULL;
    for (int i = 0; i < CURL_LOCK_DATA_LAST; i++)
        pthread_mutex_init(&share_mu[i], NULL);
    if (curl_share_setopt(s, CURLSHOPT_LOCKFUNC, share_lock) != CURLSHE_OK ||
        curl_share_setopt(s, CURLSHOPT_UNLOCKFUNC, share_unlock) != CURLSHE_OK ||
        curl_share_setopt(s, CURLSHOPT_SHARE, CURL_LOCK_DATA_SSL_SESSION) != CURLSHE_OK ||
        curl_share_setopt(s, CURLSHOPT_SHARE, CURL_LOCK_DATA_DNS) != CURLSHE_OK) {
        curl_share_cleanup(s);
        return NULL;
    }
    share = s;
    return share;
}

static void handle_free(struct s3_handle *hd)
{
    if (hd) {
        curl_easy_cleanup(hd->h);
        free(hd);
    }
}

/* Close what was parked before `before` (pool_mu held); the handles are moved to `out` to be
 * closed outside the lock. */
static size_t expire_locked(double before, struct s3_handle **out, size_t max)
{
    size_t k = 0;
    while (k < nparked && k < max && parked[k].since < before) {
        out[k] = parked[k].hd;
        k++;
    }
    if (k == 0)
        return 0; /* parked may be NULL: no offset applied to it */
    memmove(parked, parked + k, (nparked - k) * sizeof(*parked));
    nparked -= k;
    return k;
}

int s3_handle_get(const char *origin, struct s3_handle **out, struct vmsnap_err *err)
{
    *out = NULL;
    struct s3_handle *old[8];
    struct s3_handle *hd = NULL;
    pthread_mutex_lock(&pool_mu);
    size_t nold = expire_locked(now_mono() - IDLE_SECONDS, old, 8);
    for (size_t i = nparked; i-- > 0;) { /* the most recently parked first: the warmest */
        if (!strcmp(parked[i].hd->origin, origin)) {
            hd = parked[i].hd;
            memmove(parked + i, parked + i + 1, (nparked - i - 1) * sizeof(*parked));
            nparked--;
            break;
        }
    }
    CURLSH *sh = share_locked();
    pthread_mutex_unlock(&pool_mu);
    for (size_t i = 0; i < nold; i++)
        handle_free(old[i]);
    if (hd) {
        atomic_fetch_add(&n_reused, 1);
        *out = hd;
        return 0;
    }
    hd = calloc(1, sizeof(*hd));
    if (!hd)
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    hd->fd = -1;
    hd->share = sh;
    hd->h = curl_easy_init();
    if (!hd->h) {
        free(hd);
        return vmsnap_err_set(err, ENOMEM, "curl_easy_init failed");
    }
    snprintf(hd->origin, sizeof(hd->origin), "%s", origin);
    atomic_fetch_add(&n_new, 1);
    *out = hd;
    return 0;
}

void s3_handle_put(struct s3_handle *hd, bool reusable)
{
    if (!hd)
        return;
    struct s3_handle *drop = NULL;
    pthread_mutex_lock(&pool_mu);
    if (!reusable || hd->fd < 0 || idle_max == 0) {
        drop = hd; /* no live connection to keep, or pooling off */
    } else {
        if (nparked >= idle_max) { /* the oldest goes */
            drop = parked[0].hd;
            memmove(parked, parked + 1, (nparked - 1) * sizeof(*parked));
            nparked--;
        }
        if (grow_array(&parked, &capparked, nparked + 1, sizeof(*parked), 8) < 0) {
            pthread_mutex_unlock(&pool_mu);
            handle_free(drop);
            handle_free(hd);
            return;
        }
        parked[nparked++] = (struct parked){hd, now_mono()};
    }
    pthread_mutex_unlock(&pool_mu);
    handle_free(drop);
}

void s3_pool_count(uint64_t connects)
{
    atomic_fetch_add(&n_requests, 1);
    if (connects)
        atomic_fetch_add(&n_connects, connects);
}

void vmsnap_store_set_idle_max(unsigned n)
{
    if (n > IDLE_MAX_CAP)
        n = IDLE_MAX_CAP;
    pthread_mutex_lock(&pool_mu);
    idle_max = n;
    pthread_mutex_unlock(&pool_mu);
    s3_pool_trim(n);
}

void s3_pool_trim(unsigned keep)
{
    for (;;) {
        struct s3_handle *hd = NULL;
        pthread_mutex_lock(&pool_mu);
        if (nparked > keep) {
            hd = parked[0].hd;
            memmove(parked, parked + 1, (nparked - 1) * sizeof(*parked));
            nparked--;
        }
        pthread_mutex_unlock(&pool_mu);
        if (!hd)
            return;
        handle_free(hd);
    }
}

void s3_pool_cleanup(void)
{
    s3_pool_trim(0);
    pthread_mutex_lock(&pool_mu);
    free(parked);
    parked = NULL;
    nparked = capparked = 0;
    /* CURLSHE_IN_USE while a handle of a store still open uses it: then it stays */
    if (share && curl_share_cleanup(share) == CURLSHE_OK)
        share = NULL;
    pthread_mutex_unlock(&pool_mu);
}

void vmsnap_store_stats(struct vmsnap_store_stats *out)
{
    memset(out, 0, sizeof(*out));
    s3_creds_cache_stats(&out->creds_fetched, &out->creds_reused);
    out->requests = atomic_load(&n_requests);
    out->connects = atomic_load(&n_connects);
    out->conns_reused = atomic_load(&n_reused);
    out->conns_new = atomic_load(&n_new);
    pthread_mutex_lock(&pool_mu);
    out->conns_idle = nparked;
    pthread_mutex_unlock(&pool_mu);
}

void vmsnap_store_idle_close(void)
{
    s3_pool_trim(0);
}
