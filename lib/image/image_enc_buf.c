/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Encoder buffers (struct ebuf in image_int.h) and the memory budget: reserve, trim, settle.
 * See image_enc.c for how much the encoder holds; a buffer waits for the budget in
 * img_ebuf_reserve, and gate_stop decides when it stops waiting.
 */
#include "image_int.h"

#include <errno.h>
#include <sys/mman.h>

/* With a budget: a range's buffer stops waiting for it when the range is the one the writer
 * waits for (everything held waits for that one, directly or not), or when the encode stops.
 * Called by the waiting thread. */
static bool gate_stop(void *ctx)
{
    const struct worker *w = ctx;
    return __atomic_load_n(&w->e->abort, __ATOMIC_ACQUIRE) ||
           w->cur <= __atomic_load_n(&w->e->written, __ATOMIC_ACQUIRE);
}

#define EBUF_STEP ((size_t)1 << 20)

static size_t ebuf_round(size_t len)
{
    return len ? (len + EBUF_STEP - 1) / EBUF_STEP * EBUF_STEP : 0;
}

/* Make `b` hold at least `len` bytes (what it held is lost). With a budget, a buffer that can
 * be charged more at once (nothing waits) grows in place; otherwise it is given back first
 * (nothing waits holding it) and the new one charged before it is mapped: for worker `gw` that
 * waits while the budget is spent (see gate_stop); NULL: never waits. */
int img_ebuf_reserve(const struct enc *e, struct ebuf *b, size_t len, struct worker *gw,
                     struct vmsnap_err *err)
{
    if (len <= b->cap)
        return 0;
    size_t cap = ebuf_round(len);
    void *np;
    if (e->mem && b->p && e->mem->try_acquire && e->mem->try_acquire(e->mem->arg, cap - b->cap)) {
        np = cap <= b->map ? b->p : mremap(b->p, b->map, cap, MREMAP_MAYMOVE);
        if (np == MAP_FAILED) {
            e->mem->release(e->mem->arg, cap - b->cap);
            img_ebuf_trim(e, b, 0);
        } else {
            b->p = np;
            b->map = VMSNAP_MAX(b->map, cap);
            b->cap = cap;
            return 0;
        }
    }
    if (e->mem) {
        img_ebuf_trim(e, b, 0);
        e->mem->acquire(e->mem->arg, cap, gw && gw->wait, gate_stop, gw);
        np = mmap(NULL, cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (np == MAP_FAILED)
            e->mem->release(e->mem->arg, cap);
    } else {
        np = b->p ? mremap(b->p, b->map, cap, MREMAP_MAYMOVE)
                  : mmap(NULL, cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    }
    if (np == MAP_FAILED)
        return vmsnap_err_set(err, ENOMEM, "out of memory (%zu bytes for a range)", cap);
    b->p = np;
    b->cap = b->map = cap;
    return 0;
}

/* Keep only the first `keep` bytes of `b` (whole steps; 0: unmap it) and uncharge the rest.
 * The mapping stays (see struct ebuf); the bytes past the kept ones go back to the kernel. */
void img_ebuf_trim(const struct enc *e, struct ebuf *b, size_t keep)
{
    size_t cap = ebuf_round(keep);
    if (cap >= b->cap)
        return;
    if (cap == 0) {
        munmap(b->p, b->map);
        b->p = NULL;
        b->map = 0;
    } else if (madvise(b->p + cap, b->map - cap, MADV_DONTNEED) < 0) {
        return; /* (cannot fail on a private anonymous mapping of ours) */
    }
    if (e->mem)
        e->mem->release(e->mem->arg, b->cap - cap);
    b->cap = cap;
}

/* After a use: kept for the next range, unless more is charged than the budget allows or
 * another range waits for it. */
void img_ebuf_settle(const struct enc *e, struct ebuf *b)
{
    if (e->mem && e->mem->over(e->mem->arg))
        img_ebuf_trim(e, b, 0);
}
