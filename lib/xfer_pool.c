/* SPDX-License-Identifier: Apache-2.0 */
/* The transfer worker pool (see xfer_int.h). */
#include "xfer_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

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
               struct vmsnap_err *err)
{
    memset(p, 0, sizeof(*p));
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
        int rc = pthread_create(&p->tids[i], NULL, worker, p);
        if (rc != 0) {
            pthread_mutex_unlock(&p->mu);
            xpool_fini(p);
            return vmsnap_err_set(err, rc, "cannot start transfer thread: %s", strerror(rc));
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

void xpool_mem_acquire(struct xpool *p, uint64_t bytes)
{
    pthread_mutex_lock(&p->mu);
    while (p->mem_used > 0 && p->mem_used + bytes > p->mem_cap)
        pthread_cond_wait(&p->cv_mem, &p->mu);
    p->mem_used += bytes;
    if (p->mem_used > p->mem_peak)
        p->mem_peak = p->mem_used;
    pthread_mutex_unlock(&p->mu);
}

void xpool_mem_release(struct xpool *p, uint64_t bytes)
{
    pthread_mutex_lock(&p->mu);
    p->mem_used -= bytes;
    pthread_cond_broadcast(&p->cv_mem);
    pthread_mutex_unlock(&p->mu);
}
