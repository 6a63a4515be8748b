/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Private: the transfer worker pool. N threads, each owning one store connection (one TCP
 * connection for S3) for its whole life, run tasks from a FIFO queue. A byte budget (max_memory)
 * bounds buffered parts and frame groups: producers acquire before allocating and block while
 * the budget is spent; a task releases when its buffer is freed.
 */
#ifndef VMSNAP_XFER_INT_H
#define VMSNAP_XFER_INT_H

#include "vmsnap/store.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

struct xtask {
    void (*run)(struct xtask *t, struct vmsnap_store_conn *c);
    struct xtask *next;
};

struct xpool {
    pthread_mutex_t mu;
    pthread_cond_t cv_task, cv_mem;
    struct xtask *head, *tail;
    bool stop;
    uint64_t mem_used, mem_cap, mem_peak;
    uint64_t enc_used;    /* of mem_used: the encoders' buffers (xpool_enc_acquire) */
    uint64_t fill_used;   /* of mem_used: part buffers being filled by a push (xpool_fill) */
    unsigned enc_waiting; /* encoders' acquires waiting */
    struct xbuf *cache;   /* freed buffers kept for reuse (xpool_buf_free) */
    uint64_t cached;      /* their bytes: mem_used + cached stays within mem_cap */
    unsigned n, nconns;
    pthread_t *tids;
    struct vmsnap_store_conn **conns;
};

int xpool_init(struct xpool *p, struct vmsnap_store *st, unsigned n, uint64_t mem_cap,
               struct vmsnap_err *err);
/* Stop after the queued tasks ran, join, free the connections. */
void xpool_fini(struct xpool *p);
void xpool_submit(struct xpool *p, struct xtask *t);
/* Block until `bytes` fit in the budget, for a part or a frame group (a request larger than
 * the whole budget waits until no other part or group is held, so it always makes progress:
 * the encoders' buffers, which wait for these parts to be written, never hold it back). */
void xpool_mem_acquire(struct xpool *p, uint64_t bytes);
void xpool_mem_release(struct xpool *p, uint64_t bytes);
/* The same for an encoder's buffers (struct vmsnap_pack_mem): blocks while the budget is
 * spent and something is held that does not wait for the encoders themselves (anything but a
 * part being filled: that one waits for their output), until `stop(ctx)` turns true (asked
 * again at every release and xpool_kick); never blocks when `wait` is false. */
void xpool_enc_acquire(struct xpool *p, uint64_t bytes, bool wait, bool (*stop)(void *ctx),
                       void *ctx);
/* Charge `bytes` to the encoders only when xpool_enc_acquire would not wait and no encoder
 * waits; true when charged. */
bool xpool_enc_try_acquire(struct xpool *p, uint64_t bytes);
void xpool_enc_release(struct xpool *p, uint64_t bytes);
/* More is held than the budget allows, or an encoder waits for it: an encoder then gives back
 * what it would keep for its next range. */
bool xpool_over(struct xpool *p);
/* A part buffer (taken with xpool_mem_acquire) starts (`bytes` > 0) or stops (< 0) being
 * filled: encoders do not wait for it. */
void xpool_fill(struct xpool *p, int64_t bytes);
void xpool_kick(struct xpool *p);
/* A buffer of `len` bytes for a part or a frame group, taken after xpool_mem_acquire(len): a
 * freed one of about that size when the pool kept one, else a fresh anonymous mapping (not the
 * C heap, whose per-thread arenas keep freed memory: the process's memory then grew past the
 * budget). NULL when out of memory. */
void *xpool_buf_alloc(struct xpool *p, size_t len);
/* Give back a buffer of xpool_buf_alloc (before xpool_mem_release of its bytes): kept for the
 * next one while the bytes held and kept fit in the budget, else unmapped. NULL is ignored. */
void xpool_buf_free(struct xpool *p, void *buf);

#endif
