/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The pre-scan of an encode with a base: which ranges are unchanged, and which runs of them
 * are long enough to be copied from the base object instead of compressed again.
 */
#include "image_int.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <xxhash.h>

/* True when the records just built for range `idx` are the base's frame for that range. */
static bool same_as_base(const struct enc *e, uint64_t idx, const struct recs *r, uint64_t sum,
                         struct vmsnap_frame_info *bf)
{
    if (!e->plan || !e->plan[idx].base_frame)
        return false;
    uint64_t start = idx * e->frame_size;
    uint64_t end = VMSNAP_MIN(start + e->frame_size, e->size);
    vmsnap_image_frame(e->base, e->plan[idx].base_frame - 1, bf);
    return bf->src_start == start && bf->src_end == end && bf->dsize == r->len &&
           bf->populated == r->populated && bf->checksum == sum;
}

/* Pre-scan with a base: every range's records are built and hashed (not compressed) to find the
 * frames that did not change. Runs over ranges in parallel; results in e->plan. */
struct scan {
    struct enc *e;
    struct worker *w;
    pthread_mutex_t *mu;
    uint64_t *next;
    int *rc;
    struct vmsnap_err *err;
};

static void *scan_main(void *arg)
{
    struct scan *sc = arg;
    struct enc *e = sc->e;
    for (;;) {
        pthread_mutex_lock(sc->mu);
        uint64_t idx = *sc->next;
        bool stop = *sc->rc < 0 || idx >= e->nranges;
        if (!stop)
            (*sc->next)++;
        pthread_mutex_unlock(sc->mu);
        if (stop)
            break;
        struct recs r = {0};
        struct vmsnap_err er = {0};
        sc->w->cur = idx;
        int rc = cancel_check(&er);
        if (rc < 0) {
            /* cancelled: reported below */
        } else if (!e->plan[idx].base_frame) {
            /* nothing to compare with; note only whether the range has data (it breaks a run) */
            uint64_t start = idx * e->frame_size;
            size_t n = 0;
            rc =
                img_find_extents(sc->w, start, VMSNAP_MIN(start + e->frame_size, e->size), &n, &er);
            e->plan[idx].scan.len = n > 0;
        } else {
            rc = img_build_records(sc->w, idx, false, &r, &er);
        }
        struct vmsnap_frame_info bf;
        if (rc == 0 && r.len) {
            e->plan[idx].reuse = same_as_base(e, idx, &r, XXH64(sc->w->b.p, r.len, 0), &bf);
            e->plan[idx].scan = r;
        }
        img_ebuf_settle(e, &sc->w->b);
        if (rc < 0) {
            pthread_mutex_lock(sc->mu);
            if (*sc->rc == 0) {
                *sc->rc = rc;
                if (sc->err)
                    *sc->err = er;
            }
            pthread_mutex_unlock(sc->mu);
        }
    }
    if (e->mem) /* another scan may wait for the budget: nothing kept idle */
        img_ebuf_trim(e, &sc->w->b, 0);
    return NULL;
}

/* Find the unchanged frames, then keep only runs of them (adjacent in the base object too) whose
 * compressed bytes add up to at least min_run: shorter runs are compressed again. */
int img_prescan(struct enc *e, struct worker *ws, unsigned threads, struct vmsnap_err *err)
{
    const uint64_t min_run = e->min_run;
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    uint64_t next = 0;
    int rc = 0;
    struct scan *sc = calloc(threads, sizeof(*sc));
    pthread_t *tid = calloc(threads, sizeof(*tid));
    if (!sc || !tid) {
        free(sc);
        free(tid);
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    }
    bool *up = calloc(threads, sizeof(*up));
    for (unsigned i = 0; i < threads; i++) {
        sc[i] = (struct scan){e, &ws[i], &mu, &next, &rc, err};
        if (i > 0 && up)
            up[i] = thread_start(&tid[i], scan_main, &sc[i]) == 0;
    }
    scan_main(&sc[0]);
    for (unsigned i = 1; up && i < threads; i++)
        if (up[i])
            pthread_join(tid[i], NULL);
    free(up);
    free(sc);
    free(tid);
    if (rc < 0)
        return rc;
    /* Runs: reusable ranges whose base frames follow each other in the base object. A range
     * without data in either file is invisible in both objects and does not break a run; one with
     * data that is not reusable does. */
    uint64_t i = 0;
    uint32_t run_id = 0;
    while (i < e->nranges) {
        if (!e->plan[i].reuse) {
            i++;
            continue;
        }
        uint64_t j = i, last = i, bytes = 0;
        for (; j < e->nranges; j++) {
            if (!e->plan[j].reuse) {
                if (e->plan[j].scan.len)
                    break;
                continue;
            }
            if (j != i && e->plan[j].base_frame != e->plan[last].base_frame + 1)
                break;
            struct vmsnap_frame_info bf;
            vmsnap_image_frame(e->base, e->plan[j].base_frame - 1, &bf);
            bytes += bf.csize;
            last = j;
        }
        uint64_t left = bytes;
        run_id++;
        for (uint64_t k = i; k <= last; k++) {
            if (!e->plan[k].reuse)
                continue;
            e->plan[k].run_id = run_id;
            struct vmsnap_frame_info bf;
            vmsnap_image_frame(e->base, e->plan[k].base_frame - 1, &bf);
            e->plan[k].reuse = bytes >= min_run;
            e->plan[k].run_left = left;
            left -= bf.csize;
        }
        i = last + 1;
    }
    return 0;
}
