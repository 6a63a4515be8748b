/* SPDX-License-Identifier: Apache-2.0 */
/* The transfer worker pool (see xfer_int.h). */
#include "xfer_int.h"

#include <errno.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

/* The header in front of every pool buffer: the size of its mapping, and the link while kept. */
struct xbuf {
    size_t size;
    struct xbuf *next;
    max_align_t pad[];
};

#define XBUF_HDR sizeof(struct xbuf)

/* The budget shared live by several calls (xfer.h): what their pools hold and keep, charged
 * and given back as each pool's own counters move (under that pool's mutex; the counters are
 * atomic, so no lock of its own and no lock order). */
struct vmsnap_xfer_budget {
    _Atomic uint64_t used, peak;
    uint64_t cap;
};

int vmsnap_xfer_budget_new(uint64_t bytes, struct vmsnap_xfer_budget **out, struct vmsnap_err *err)
{
    *out = NULL;
    if (bytes == 0)
        return vmsnap_err_set(err, EINVAL, "a shared transfer budget of 0 bytes");
    struct vmsnap_xfer_budget *b = calloc(1, sizeof(*b));
    if (!b)
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    b->cap = bytes;
    *out = b;
    return 0;
}

void vmsnap_xfer_budget_free(struct vmsnap_xfer_budget *b)
{
    free(b);
}

void vmsnap_xfer_budget_stat(const struct vmsnap_xfer_budget *b, uint64_t *used, uint64_t *peak)
{
    *used = atomic_load(&b->used);
    *peak = atomic_load(&b->peak);
}

static void shared_add(struct xpool *p, uint64_t bytes)
{
    if (!p->shared)
        return;
    uint64_t now = atomic_fetch_add(&p->shared->used, bytes) + bytes;
    uint64_t pk = atomic_load(&p->shared->peak);
    while (now > pk && !atomic_compare_exchange_weak(&p->shared->peak, &pk, now))
        ;
}

static void shared_sub(struct xpool *p, uint64_t bytes)
{
    if (p->shared)
        atomic_fetch_sub(&p->shared->used, bytes);
}

/* Charging `bytes` would pass the shared budget (false without one). */
static bool shared_full(const struct xpool *p, uint64_t bytes)
{
    return p->shared && atomic_load(&p->shared->used) + bytes > p->shared->cap;
}

/* Charging `bytes` would pass this call's cap or the shared budget. */
static bool full(const struct xpool *p, uint64_t bytes)
{
    return p->mem_used + bytes > p->mem_cap || shared_full(p, bytes);
}

static void *worker(void *arg)
{
    struct xpool *p = arg;
    pthread_mutex_lock(&p->mu);
    unsigned me = 0;
    pthread_t self = pthread_self();
    for (unsigned i = 0; i < p->n; i++)
        if (pthread_equal(p->tids[i], self))
            me = i;
    for (;;) {
        while (!p->head && !p->stop)
            pthread_cond_wait(&p->cv_task, &p->mu);
        if (!p->head)
            break;
        struct xtask *t = p->head;
        p->head = t->next;
        if (!p->head)
            p->tail = NULL;
        pthread_mutex_unlock(&p->mu);
        t->run(t, p->conns[me]);
        pthread_mutex_lock(&p->mu);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

int xpool_init(struct xpool *p, struct vmsnap_store *st, unsigned n, uint64_t mem_cap,
               struct vmsnap_xfer_budget *shared, struct vmsnap_err *err)
{
    memset(p, 0, sizeof(*p));
    p->shared = shared;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv_task, NULL);
    pthread_cond_init(&p->cv_mem, NULL);
    p->mem_cap = mem_cap;
    p->tids = calloc(n, sizeof(*p->tids));
    p->conns = calloc(n, sizeof(*p->conns));
    if (!p->tids || !p->conns) {
        xpool_fini(p);
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    }
    for (unsigned i = 0; i < n; i++) {
        int rc = vmsnap_store_conn_new(st, &p->conns[i], err);
        if (rc == 0)
            p->nconns = i + 1;
        if (rc < 0) {
            xpool_fini(p);
            return rc;
        }
    }
    /* hold the lock so workers see every tid before looking up their own */
    pthread_mutex_lock(&p->mu);
    for (unsigned i = 0; i < n; i++) {
        int rc = thread_start(&p->tids[i], worker, p);
        if (rc != 0) {
            pthread_mutex_unlock(&p->mu);
            xpool_fini(p);
            return err_code(err, rc, "cannot start transfer thread");
        }
        p->n = i + 1;
    }
    pthread_mutex_unlock(&p->mu);
    return 0;
}

void xpool_fini(struct xpool *p)
{
    pthread_mutex_lock(&p->mu);
    p->stop = true;
    pthread_cond_broadcast(&p->cv_task);
    pthread_mutex_unlock(&p->mu);
    for (unsigned i = 0; i < p->n; i++)
        pthread_join(p->tids[i], NULL);
    for (unsigned i = 0; i < p->nconns; i++)
        vmsnap_store_conn_free(p->conns[i]);
    while (p->cache) {
        struct xbuf *b = p->cache;
        p->cache = b->next;
        shared_sub(p, b->size);
        munmap(b, b->size);
    }
    p->cached = 0;
    free(p->tids);
    free(p->conns);
    p->tids = NULL;
    p->conns = NULL;
    pthread_cond_destroy(&p->cv_task);
    pthread_cond_destroy(&p->cv_mem);
    pthread_mutex_destroy(&p->mu);
}

void xpool_submit(struct xpool *p, struct xtask *t)
{
    t->next = NULL;
    pthread_mutex_lock(&p->mu);
    if (p->tail)
        p->tail->next = t;
    else
        p->head = t;
    p->tail = t;
    pthread_cond_signal(&p->cv_task);
    pthread_mutex_unlock(&p->mu);
}

/* Take kept buffers off the cache while what is held and kept passes the budget; the caller
 * unmaps them (unmap_all) after unlocking. */
static struct xbuf *uncache_locked(struct xpool *p)
{
    struct xbuf *drop = NULL;
    while (p->cache && (p->mem_used + p->cached > p->mem_cap || shared_full(p, 0))) {
        struct xbuf *d = p->cache;
        p->cache = d->next;
        p->cached -= d->size;
        shared_sub(p, d->size);
        d->next = drop;
        drop = d;
    }
    return drop;
}

static void unmap_all(struct xbuf *drop)
{
    while (drop) {
        struct xbuf *d = drop;
        drop = d->next;
        munmap(d, d->size);
    }
}

/* Wait for memory to be given back, and at least every 100 ms: a cancel (Ctrl-C) is only a
 * flag, and a wait that never looked at it outlived the first signal. Under p->mu. */
static void mem_wait(struct xpool *p)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 100 * 1000 * 1000;
    if (ts.tv_nsec >= 1000000000) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000;
    }
    pthread_cond_timedwait(&p->cv_mem, &p->mu, &ts);
}

void xpool_mem_acquire(struct xpool *p, uint64_t bytes)
{
    pthread_mutex_lock(&p->mu);
    while (p->mem_used > p->enc_used + p->fill_used && full(p, bytes) && !cancel_pending())
        mem_wait(p);
    p->mem_used += bytes;
    shared_add(p, bytes);
    if (p->mem_used > p->mem_peak)
        p->mem_peak = p->mem_used;
    pthread_mutex_unlock(&p->mu);
}

/* True while an encoder's charge of `bytes` has to wait: the budget is spent by more than the
 * parts being filled (which wait for the encoders). Under p->mu. */
static bool enc_must_wait(const struct xpool *p, uint64_t bytes)
{
    return p->mem_used > p->fill_used && full(p, bytes);
}

/* Charge `bytes` to the encoders; returns the kept buffers to unmap (after unlocking) to make
 * room for the encoder's own mapping. Under p->mu. */
static struct xbuf *enc_charge_locked(struct xpool *p, uint64_t bytes)
{
    p->mem_used += bytes;
    p->enc_used += bytes;
    shared_add(p, bytes);
    if (p->mem_used > p->mem_peak)
        p->mem_peak = p->mem_used;
    return uncache_locked(p);
}

void xpool_enc_acquire(struct xpool *p, uint64_t bytes, bool wait, bool (*stop)(void *ctx),
                       void *ctx)
{
    pthread_mutex_lock(&p->mu);
    while (wait && enc_must_wait(p, bytes) && !(stop && stop(ctx)) && !cancel_pending()) {
        p->enc_waiting++;
        mem_wait(p);
        p->enc_waiting--;
    }
    struct xbuf *drop = enc_charge_locked(p, bytes);
    pthread_mutex_unlock(&p->mu);
    unmap_all(drop);
}

bool xpool_enc_try_acquire(struct xpool *p, uint64_t bytes)
{
    pthread_mutex_lock(&p->mu);
    bool ok = p->enc_waiting == 0 && !enc_must_wait(p, bytes);
    struct xbuf *drop = ok ? enc_charge_locked(p, bytes) : NULL;
    pthread_mutex_unlock(&p->mu);
    unmap_all(drop);
    return ok;
}

void xpool_enc_release(struct xpool *p, uint64_t bytes)
{
    pthread_mutex_lock(&p->mu);
    p->mem_used -= bytes;
    p->enc_used -= bytes;
    shared_sub(p, bytes);
    pthread_cond_broadcast(&p->cv_mem);
    pthread_mutex_unlock(&p->mu);
}

bool xpool_over(struct xpool *p)
{
    pthread_mutex_lock(&p->mu);
    bool over = p->mem_used > p->mem_cap || p->enc_waiting > 0 || shared_full(p, 1);
    pthread_mutex_unlock(&p->mu);
    return over;
}

void xpool_fill(struct xpool *p, int64_t bytes)
{
    pthread_mutex_lock(&p->mu);
    p->fill_used += (uint64_t)bytes;
    pthread_mutex_unlock(&p->mu);
}

void xpool_kick(struct xpool *p)
{
    pthread_mutex_lock(&p->mu);
    pthread_cond_broadcast(&p->cv_mem);
    pthread_mutex_unlock(&p->mu);
}

void xpool_mem_release(struct xpool *p, uint64_t bytes)
{
    pthread_mutex_lock(&p->mu);
    p->mem_used -= bytes;
    shared_sub(p, bytes);
    pthread_cond_broadcast(&p->cv_mem);
    pthread_mutex_unlock(&p->mu);
}

static size_t map_size(size_t len)
{
    size_t pg = 4096;
    return (len + XBUF_HDR + pg - 1) / pg * pg;
}

void *xpool_buf_alloc(struct xpool *p, size_t len)
{
    size_t want = map_size(len);
    struct xbuf *b = NULL;
    pthread_mutex_lock(&p->mu);
    /* a kept buffer of this size, or up to a quarter larger (frame groups vary in size) */
    for (struct xbuf **pp = &p->cache; *pp; pp = &(*pp)->next)
        if ((*pp)->size >= want && (*pp)->size - want <= want / 4) {
            b = *pp;
            *pp = b->next;
            p->cached -= b->size;
            shared_sub(p, b->size);
            break;
        }
    /* else make room: what is held (this buffer's bytes included) and kept within the budget */
    struct xbuf *drop = b ? NULL : uncache_locked(p);
    pthread_mutex_unlock(&p->mu);
    unmap_all(drop);
    if (!b) {
        void *m = mmap(NULL, want, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED)
            return NULL;
        b = m;
        b->size = want;
    }
    b->next = NULL;
    return (uint8_t *)b + XBUF_HDR;
}

void xpool_buf_free(struct xpool *p, void *buf)
{
    if (!buf)
        return;
    struct xbuf *b = (struct xbuf *)((uint8_t *)buf - XBUF_HDR);
    pthread_mutex_lock(&p->mu);
    /* mem_used still counts this buffer's bytes: keeping it adds nothing held */
    bool keep = p->mem_used + p->cached <= p->mem_cap && !shared_full(p, b->size);
    if (keep) {
        b->next = p->cache;
        p->cache = b;
        p->cached += b->size;
        shared_add(p, b->size);
    }
    pthread_mutex_unlock(&p->mu);
    if (!keep)
        munmap(b, b->size);
}
