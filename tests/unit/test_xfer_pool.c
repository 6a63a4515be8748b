/* SPDX-License-Identifier: Apache-2.0 */
/* The transfer worker pool (lib/xfer/xfer_pool.c): every queued task runs, on its own thread's
 * connection, before fini returns; the byte budget is never exceeded by parts and frame groups
 * however many producers race for it; a request larger than the whole budget goes through when
 * nothing else is held; waiters are all released when the bytes they wait for come back; the
 * encoders' buffers neither wait for the part being filled nor hold back the parts they wait
 * for; kept buffers are reused and never push what is held and kept past the budget; two pools
 * sharing one budget (vmsnap_xfer_budget) see each other's bytes: one alone may take all of it,
 * the other then waits while it holds something of its own, never while it holds nothing, and
 * every byte charged to the shared budget comes back. */
#include "xfer/xfer_int.h"
#include "t.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define CAP (1u << 20)

static struct vmsnap_store *st;

static void pool_init(struct xpool *p, unsigned n, uint64_t cap)
{
    struct vmsnap_err e = {0};
    int rc = xpool_init(p, st, n, cap, NULL, &e);
    if (rc < 0) {
        fprintf(stderr, "xpool_init: %s\n", e.msg);
        exit(1);
    }
}

/* Join `th` within `secs`; false (and the thread left running) when it did not end. */
static bool joined_within(pthread_t th, int secs)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += secs;
    return pthread_timedjoin_np(th, NULL, &ts) == 0;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* ---- tasks ---- */

struct count_task {
    struct xtask t;
    atomic_int *ran;
    struct vmsnap_store_conn **conn;
};

static void count_run(struct xtask *t, struct vmsnap_store_conn *c)
{
    struct count_task *ct = (struct count_task *)t;
    *ct->conn = c;
    sleep_ms(1);
    atomic_fetch_add(ct->ran, 1);
}

/* N tasks that each wait for all N to have started: they end only if N threads run them at once. */
struct meet_task {
    struct xtask t;
    pthread_mutex_t *mu;
    pthread_cond_t *cv;
    int *arrived, want;
    bool met;
    struct vmsnap_store_conn *conn;
};

static void meet_run(struct xtask *t, struct vmsnap_store_conn *c)
{
    struct meet_task *m = (struct meet_task *)t;
    m->conn = c;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 30;
    pthread_mutex_lock(m->mu);
    ++*m->arrived;
    pthread_cond_broadcast(m->cv);
    while (*m->arrived < m->want)
        if (pthread_cond_timedwait(m->cv, m->mu, &ts) == ETIMEDOUT)
            break;
    m->met = *m->arrived >= m->want;
    pthread_mutex_unlock(m->mu);
}

static void test_tasks(void)
{
    struct xpool p;
    pool_init(&p, 4, CAP);
    CHECK(p.n == 4 && p.nconns == 4);
    enum { N = 300 };
    static struct count_task tasks[N];
    static struct vmsnap_store_conn *conns[N];
    atomic_int ran = 0;
    for (int i = 0; i < N; i++) {
        tasks[i] = (struct count_task){.t.run = count_run, .ran = &ran, .conn = &conns[i]};
        xpool_submit(&p, &tasks[i].t);
    }
    xpool_fini(&p); /* waits for the queued tasks */
    CHECKF(atomic_load(&ran) == N, "%d of %d tasks ran before fini returned", atomic_load(&ran), N);
    for (int i = 0; i < N; i++)
        CHECK(conns[i] != NULL);

    pool_init(&p, 4, CAP);
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
    int arrived = 0;
    struct meet_task m[4];
    for (int i = 0; i < 4; i++) {
        m[i] = (struct meet_task){
            .t.run = meet_run, .mu = &mu, .cv = &cv, .arrived = &arrived, .want = 4};
        xpool_submit(&p, &m[i].t);
    }
    xpool_fini(&p);
    for (int i = 0; i < 4; i++) {
        CHECKF(m[i].met, "task %d did not meet the other three: the pool ran fewer at once", i);
        for (int j = 0; j < i; j++)
            CHECKF(m[i].conn != m[j].conn, "tasks %d and %d shared a connection at once", i, j);
    }
}

/* ---- the byte budget ---- */

struct racer {
    struct xpool *p;
    uint64_t seed, largest;
    atomic_uint_fast64_t *held, *max_held;
};

static void *race(void *arg)
{
    struct racer *r = arg;
    for (int i = 0; i < 3000; i++) {
        uint64_t bytes = 1 + t_rand(&r->seed) % (CAP / 3);
        r->largest = bytes > r->largest ? bytes : r->largest;
        xpool_mem_acquire(r->p, bytes);
        uint64_t now = atomic_fetch_add(r->held, bytes) + bytes;
        uint64_t m = atomic_load(r->max_held);
        while (now > m && !atomic_compare_exchange_weak(r->max_held, &m, now))
            ;
        if (i % 7 == 0)
            sched_yield();
        atomic_fetch_sub(r->held, bytes);
        xpool_mem_release(r->p, bytes);
    }
    return NULL;
}

static void test_budget_race(void)
{
    struct xpool p;
    pool_init(&p, 1, CAP);
    enum { R = 8 };
    pthread_t th[R];
    struct racer r[R];
    atomic_uint_fast64_t held = 0, max_held = 0;
    for (int i = 0; i < R; i++) {
        r[i] = (struct racer){
            .p = &p, .seed = 1000 + (uint64_t)i, .held = &held, .max_held = &max_held};
        REQUIRE(pthread_create(&th[i], NULL, race, &r[i]) == 0);
    }
    for (int i = 0; i < R; i++)
        REQUIRE(joined_within(th[i], 100));
    CHECKF(atomic_load(&max_held) <= CAP, "%llu bytes held at once, budget %u",
           (unsigned long long)atomic_load(&max_held), CAP);
    CHECKF(p.mem_peak <= CAP, "peak %llu over the budget", (unsigned long long)p.mem_peak);
    uint64_t largest = 0;
    for (int i = 0; i < R; i++)
        largest = r[i].largest > largest ? r[i].largest : largest;
    CHECKF(p.mem_peak >= largest && atomic_load(&max_held) >= largest,
           "peak %llu under the largest request %llu: the pool did not count it",
           (unsigned long long)p.mem_peak, (unsigned long long)largest);
    CHECK(p.mem_used == 0);
    xpool_fini(&p);
}

/* One acquire in a thread of its own: done turns true once it returned. */
struct acq {
    struct xpool *p;
    uint64_t bytes;
    atomic_bool done;
    pthread_t th;
};

static void *acquire_one(void *arg)
{
    struct acq *a = arg;
    xpool_mem_acquire(a->p, a->bytes);
    atomic_store(&a->done, true);
    return NULL;
}

static void start_acquire(struct acq *a, struct xpool *p, uint64_t bytes)
{
    a->p = p;
    a->bytes = bytes;
    atomic_store(&a->done, false);
    REQUIRE(pthread_create(&a->th, NULL, acquire_one, a) == 0);
}

static void test_waiters(void)
{
    struct xpool p;
    pool_init(&p, 1, CAP);
    xpool_mem_acquire(&p, CAP); /* the whole budget */
    struct acq w[3];
    for (int i = 0; i < 3; i++)
        start_acquire(&w[i], &p, CAP / 4);
    sleep_ms(300);
    for (int i = 0; i < 3; i++)
        CHECKF(!atomic_load(&w[i].done), "waiter %d got %u bytes of a spent budget", i, CAP / 4);
    /* one release lets every waiter that fits go */
    xpool_mem_release(&p, CAP);
    for (int i = 0; i < 3; i++)
        CHECKF(joined_within(w[i].th, 30), "waiter %d was not released", i);
    CHECK(p.mem_used == 3 * (CAP / 4) && p.mem_peak <= CAP);
    /* a fourth quarter fits, a fifth waits until one is given back */
    xpool_mem_acquire(&p, CAP / 4);
    struct acq fifth;
    start_acquire(&fifth, &p, CAP / 4);
    sleep_ms(300);
    CHECK(!atomic_load(&fifth.done));
    xpool_mem_release(&p, CAP / 4);
    CHECK(joined_within(fifth.th, 30));
    xpool_mem_release(&p, 4 * (CAP / 4));
    CHECK(p.mem_used == 0);

    /* larger than the whole budget: admitted alone (it must make progress), and only alone */
    struct acq big;
    xpool_mem_acquire(&p, 100);
    start_acquire(&big, &p, 3 * CAP);
    sleep_ms(300);
    CHECK(!atomic_load(&big.done));
    xpool_mem_release(&p, 100);
    CHECK(joined_within(big.th, 30));
    struct acq small;
    start_acquire(&small, &p, 1);
    sleep_ms(300);
    CHECK(!atomic_load(&small.done)); /* the big one holds more than the budget */
    xpool_mem_release(&p, 3 * CAP);
    CHECK(joined_within(small.th, 30));
    xpool_mem_release(&p, 1);
    CHECK(p.mem_used == 0);
    xpool_fini(&p);
}

/* ---- encoders ---- */

struct enc {
    struct xpool *p;
    uint64_t bytes;
    atomic_bool stop, done;
    pthread_t th;
};

static bool enc_stop(void *ctx)
{
    return atomic_load(&((struct enc *)ctx)->stop);
}

static void *enc_one(void *arg)
{
    struct enc *e = arg;
    xpool_enc_acquire(e->p, e->bytes, true, enc_stop, e);
    atomic_store(&e->done, true);
    return NULL;
}

static void start_enc(struct enc *e, struct xpool *p, uint64_t bytes)
{
    e->p = p;
    e->bytes = bytes;
    atomic_store(&e->stop, false);
    atomic_store(&e->done, false);
    REQUIRE(pthread_create(&e->th, NULL, enc_one, e) == 0);
}

static void test_encoders(void)
{
    struct xpool p;
    pool_init(&p, 1, CAP);
    /* a part being filled waits for the encoders' output: they do not wait for it */
    xpool_mem_acquire(&p, CAP);
    xpool_fill(&p, CAP);
    struct enc e;
    start_enc(&e, &p, 4096);
    CHECKF(joined_within(e.th, 30), "an encoder waited for the part it fills");
    CHECK(xpool_over(&p)); /* past the budget: the encoder gives back what it would keep */
    xpool_enc_release(&p, 4096);
    CHECK(!xpool_over(&p));
    xpool_fill(&p, -(int64_t)CAP);
    /* ... but a part held for writing (not filling) makes it wait, until given back */
    start_enc(&e, &p, 4096);
    sleep_ms(300);
    CHECK(!atomic_load(&e.done));
    CHECK(xpool_over(&p));                       /* an encoder waits */
    CHECK(!xpool_enc_try_acquire(&p, 1));        /* nothing charged while it does */
    xpool_enc_acquire(&p, 1, false, NULL, NULL); /* never waits when told not to */
    xpool_enc_release(&p, 1);
    xpool_mem_release(&p, CAP);
    CHECKF(joined_within(e.th, 30), "the encoder was not released by the part given back");
    CHECK(p.enc_used == 4096 && p.enc_waiting == 0);
    xpool_enc_release(&p, 4096);
    /* ... or until its stop condition turns true (asked again on a kick) */
    xpool_mem_acquire(&p, CAP);
    start_enc(&e, &p, 4096);
    sleep_ms(300);
    CHECK(!atomic_load(&e.done));
    atomic_store(&e.stop, true);
    xpool_kick(&p);
    CHECK(joined_within(e.th, 30));
    xpool_enc_release(&p, 4096);
    xpool_mem_release(&p, CAP);
    /* the encoders' buffers never hold back the parts they wait for */
    xpool_enc_acquire(&p, CAP, true, NULL, NULL);
    struct acq part;
    start_acquire(&part, &p, CAP / 2);
    CHECKF(joined_within(part.th, 30), "a part waited for the encoders' buffers");
    CHECK(!xpool_enc_try_acquire(&p, 1));
    xpool_mem_release(&p, CAP / 2);
    xpool_enc_release(&p, CAP);
    CHECK(xpool_enc_try_acquire(&p, CAP / 2) && p.enc_used == CAP / 2);
    xpool_enc_release(&p, CAP / 2);
    CHECK(p.mem_used == 0 && p.enc_used == 0 && !xpool_over(&p));
    xpool_fini(&p);
}

/* ---- buffers ---- */

static void test_buffers(void)
{
    struct xpool p;
    pool_init(&p, 1, CAP);
    size_t len = 256u << 10;
    xpool_mem_acquire(&p, len);
    uint8_t *a = xpool_buf_alloc(&p, len);
    REQUIRE(a);
    memset(a, 0xa5, len); /* the whole length is writable */
    xpool_buf_free(&p, a);
    xpool_mem_release(&p, len);
    CHECK(p.cached >= len && p.mem_used + p.cached <= p.mem_cap);
    /* the same size (or a little less) comes back from the cache */
    xpool_mem_acquire(&p, len - 1000);
    uint8_t *b = xpool_buf_alloc(&p, len - 1000);
    CHECK(b == a && p.cached == 0);
    /* what is held and kept stays within the budget: a large hold unmaps the kept buffers */
    xpool_buf_free(&p, b);
    xpool_mem_release(&p, len - 1000);
    CHECK(p.cached > 0 && p.mem_used + p.cached <= p.mem_cap);
    xpool_mem_acquire(&p, CAP - 4096);
    uint8_t *c = xpool_buf_alloc(&p, CAP - 8192);
    REQUIRE(c);
    CHECKF(p.mem_used + p.cached <= p.mem_cap, "held %llu + kept %llu over the budget",
           (unsigned long long)p.mem_used, (unsigned long long)p.cached);
    c[0] = c[CAP - 8193] = 1;
    /* (freed before its bytes are released: they count once, as held) */
    xpool_buf_free(&p, c);
    xpool_mem_release(&p, CAP - 4096);
    CHECK(p.mem_used == 0 && p.cached <= p.mem_cap);
    /* an encoder's charge makes room the same way (it maps its own memory) */
    xpool_mem_acquire(&p, 64u << 10);
    uint8_t *d = xpool_buf_alloc(&p, 64u << 10);
    REQUIRE(d);
    xpool_buf_free(&p, d);
    xpool_mem_release(&p, 64u << 10);
    xpool_enc_acquire(&p, CAP, false, NULL, NULL);
    CHECK(p.cached == 0);
    xpool_enc_release(&p, CAP);
    /* freed while others are held: kept only while the held and kept bytes fit the budget */
    size_t q = 400u << 10;
    xpool_mem_acquire(&p, q);
    uint8_t *e1 = xpool_buf_alloc(&p, q);
    xpool_mem_acquire(&p, q);
    uint8_t *e2 = xpool_buf_alloc(&p, q);
    REQUIRE(e1 && e2 && p.cached == 0);
    xpool_buf_free(&p, e1); /* 800 KiB held + ~400 kept: fits */
    uint64_t one = p.cached;
    CHECK(one >= q);
    xpool_buf_free(&p, e2); /* 800 KiB held + ~800 kept would not: unmapped */
    CHECKF(p.cached == one, "kept %llu bytes, more than the budget leaves room for",
           (unsigned long long)p.cached);
    xpool_mem_release(&p, 2 * q);
    xpool_buf_free(&p, NULL);
    xpool_fini(&p);
    CHECK(p.cached == 0 && p.cache == NULL);
}

/* ---- a budget shared by two pools (two calls of a daemon) ---- */

static void test_shared(void)
{
    struct vmsnap_xfer_budget *b;
    struct vmsnap_err e = {0};
    REQUIRE(vmsnap_xfer_budget_new(CAP, &b, &e) == 0);
    CHECK(vmsnap_xfer_budget_new(0, &(struct vmsnap_xfer_budget *){NULL}, &e) == -EINVAL);
    struct xpool p1, p2;
    struct vmsnap_err e1 = {0}, e2 = {0};
    REQUIRE(xpool_init(&p1, st, 1, CAP, b, &e1) == 0); /* each may use the whole budget */
    REQUIRE(xpool_init(&p2, st, 1, CAP, b, &e2) == 0);
    uint64_t used, peak;
    xpool_mem_acquire(&p1, CAP / 2);
    xpool_mem_acquire(&p1, CAP / 2); /* p1 alone: all of it, without waiting */
    vmsnap_xfer_budget_stat(b, &used, &peak);
    CHECKF(used == CAP && peak == CAP, "shared used %llu peak %llu", (unsigned long long)used,
           (unsigned long long)peak);
    CHECK(xpool_over(&p2)); /* p2 sees p1's bytes: its encoders give back what they keep */
    /* p2 holds nothing: its first part goes through (every call progresses) */
    xpool_mem_acquire(&p2, CAP / 4);
    /* its second waits: it holds something and the shared budget is spent... */
    struct acq w;
    start_acquire(&w, &p2, CAP / 4);
    sleep_ms(300);
    CHECKF(!atomic_load(&w.done), "a pool took bytes of a shared budget another pool spent");
    /* ... until the other pool gives back (noticed by the 100 ms poll, no wake-up across pools) */
    xpool_mem_release(&p1, CAP / 2);
    CHECKF(joined_within(w.th, 30), "the waiting pool did not see the other's bytes come back");
    /* an encoder of p1 waits for p2's parts too (p1 holds one of its own) */
    struct enc en;
    start_enc(&en, &p1, CAP / 2);
    sleep_ms(300);
    CHECK(!atomic_load(&en.done));
    xpool_mem_release(&p2, CAP / 2);
    CHECK(joined_within(en.th, 30));
    xpool_enc_release(&p1, CAP / 2);
    xpool_mem_release(&p1, CAP / 2);
    /* kept buffers count: freed into a spent shared budget they are unmapped, not kept */
    xpool_mem_acquire(&p2, 64u << 10);
    uint8_t *k = xpool_buf_alloc(&p2, 64u << 10);
    REQUIRE(k);
    xpool_mem_acquire(&p1, CAP - (64u << 10) - 1000);
    xpool_buf_free(&p2, k);
    xpool_mem_release(&p2, 64u << 10);
    CHECK(p2.cached == 0);
    xpool_mem_release(&p1, CAP - (64u << 10) - 1000);
    /* a kept buffer is charged while kept, and given back by fini */
    xpool_mem_acquire(&p2, 64u << 10);
    k = xpool_buf_alloc(&p2, 64u << 10);
    xpool_buf_free(&p2, k);
    xpool_mem_release(&p2, 64u << 10);
    vmsnap_xfer_budget_stat(b, &used, &peak);
    CHECK(p2.cached > 0 && used == p2.cached && peak <= CAP + CAP / 4);
    xpool_fini(&p1);
    xpool_fini(&p2);
    vmsnap_xfer_budget_stat(b, &used, &peak);
    CHECKF(used == 0, "%llu bytes left charged to the shared budget", (unsigned long long)used);
    vmsnap_xfer_budget_free(b);
}

int main(void)
{
    char *key = NULL;
    REQUIRE(vmsnap_store_open(t_path("store"), NULL, &st, &key, NULL) == 0);
    free(key);
    test_tasks();
    test_budget_race();
    test_waiters();
    test_encoders();
    test_buffers();
    test_shared();
    vmsnap_store_free(st);
    return t_done();
}
