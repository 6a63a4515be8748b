/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The background retrier: one thread, a bounded queue of files still dirty after a preserve
 * eviction, each retried at fixed delays after it was queued.
 *
 * A retry never trusts the name alone: it opens the path and compares device, inode, size and
 * mtime with what was queued, so a file renamed over the name (a new checkpoint), or modified in
 * place, is left alone. No descriptor is held between retries, so a queued file that gets deleted
 * is freed at once rather than pinned by the retrier.
 *
 * The thread takes the earliest due entry out of the queue, drops the lock while it acts (a few
 * syscalls), and puts it back with its next due time unless it is finished. Cancellation sets a
 * flag and wakes the thread; queued entries are freed unattempted.
 */
#include "pcache_int.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct entry {
    char *path;
    struct stat id;
    double t0;     /* monotonic seconds when queued */
    uint32_t next; /* index of the next delay */
};

struct vmsnap_pcache_retrier {
    pthread_mutex_t mu;
    pthread_cond_t wake; /* new entry or stop */
    pthread_cond_t idle; /* queue drained */
    pthread_t thread;
    double *delays;
    size_t ndelays;
    struct entry *q;
    size_t n, cap;
    bool busy; /* an entry is out of the queue being worked on */
    bool stop;
    struct vmsnap_pcache_retrier_stats st;
};

static const double default_delays[] = {0.5, 1.5, 3.0};

static struct timespec to_ts(double t)
{
    struct timespec ts;
    ts.tv_sec = (time_t)t;
    ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    return ts;
}

enum outcome { KEEP, DONE_DROPPED, DONE_GAVE_UP, DONE_REPLACED, DONE_FAILED };

/* One retry of `e` (the lock is not held). */
static enum outcome attempt(const struct entry *e, bool last, uint64_t *dropped)
{
    *dropped = 0;
    int fd = open(e->path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY);
    if (fd < 0)
        return DONE_REPLACED;
    struct stat sb;
    enum outcome out;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || !pcache_same_file(&sb, &e->id)) {
        vlog(VMSNAP_LOG_DEBUG, "pcache retry %s: replaced or modified; left alone", e->path);
        out = DONE_REPLACED;
        goto done;
    }
    uint64_t dirty;
    int rc = pcache_drop_clean(fd, (uint64_t)sb.st_size, dropped, &dirty);
    if (rc != 0) {
        if (rc < 0)
            vlog(VMSNAP_LOG_WARN, "pcache retry %s: fadvise: %s", e->path, strerror(-rc));
        out = DONE_FAILED;
    } else if (dirty == 0) {
        out = DONE_DROPPED;
    } else {
        out = last ? DONE_GAVE_UP : KEEP;
    }
    vlog(VMSNAP_LOG_DEBUG, "pcache retry %s: dropped %llu pages, %llu still dirty", e->path,
         (unsigned long long)*dropped, (unsigned long long)dirty);
done:
    close(fd);
    return out;
}

static void *run(void *arg)
{
    struct vmsnap_pcache_retrier *r = arg;
    pthread_mutex_lock(&r->mu);
    while (!r->stop) {
        if (r->n == 0) {
            pthread_cond_broadcast(&r->idle);
            pthread_cond_wait(&r->wake, &r->mu);
            continue;
        }
        size_t best = 0;
        double due = r->q[0].t0 + r->delays[r->q[0].next];
        for (size_t i = 1; i < r->n; i++) {
            double d = r->q[i].t0 + r->delays[r->q[i].next];
            if (d < due) {
                due = d;
                best = i;
            }
        }
        if (due > mono_now()) {
            struct timespec ts = to_ts(due);
            pthread_cond_timedwait(&r->wake, &r->mu, &ts);
            continue;
        }
        struct entry e = r->q[best];
        r->q[best] = r->q[--r->n];
        r->busy = true;
        r->st.attempts++;
        pthread_mutex_unlock(&r->mu);

        uint64_t dropped;
        enum outcome out = attempt(&e, e.next + 1 >= r->ndelays, &dropped);

        pthread_mutex_lock(&r->mu);
        r->busy = false;
        r->st.dropped_pages += dropped;
        switch (out) {
        case KEEP:
            e.next++;
            if (r->stop)
                break;
            /* an add may have taken the slot it came from */
            if (grow_array(&r->q, &r->cap, r->n + 1, sizeof(*r->q), 16) < 0) {
                r->st.failed++;
                break;
            }
            r->q[r->n++] = e;
            e.path = NULL;
            break;
        case DONE_DROPPED:
            r->st.dropped_files++;
            break;
        case DONE_GAVE_UP:
            r->st.gave_up++;
            break;
        case DONE_REPLACED:
            r->st.replaced++;
            break;
        case DONE_FAILED:
            r->st.failed++;
            break;
        }
        free(e.path);
    }
    pthread_cond_broadcast(&r->idle);
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

int vmsnap_pcache_retrier_new(const double *delays, size_t ndelays,
                              struct vmsnap_pcache_retrier **out, struct vmsnap_err *err)
{
    *out = NULL;
    if (!delays) {
        delays = default_delays;
        ndelays = sizeof(default_delays) / sizeof(default_delays[0]);
    }
    if (ndelays == 0 || ndelays > VMSNAP_PCACHE_RETRIER_MAX_DELAYS)
        return vmsnap_err_set(err, EINVAL, "pcache retrier: %zu delays (1..%d allowed)", ndelays,
                              VMSNAP_PCACHE_RETRIER_MAX_DELAYS);
    for (size_t i = 0; i < ndelays; i++)
        if (!(delays[i] >= 0) || (i > 0 && delays[i] < delays[i - 1]))
            return vmsnap_err_set(err, EINVAL,
                                  "pcache retrier: delay %zu (%g s) negative or decreasing", i,
                                  delays[i]);
    struct vmsnap_pcache_retrier *r = calloc(1, sizeof(*r));
    if (!r)
        return vmsnap_err_set(err, ENOMEM, "pcache retrier: out of memory");
    r->delays = malloc(ndelays * sizeof(double));
    if (!r->delays) {
        free(r);
        return vmsnap_err_set(err, ENOMEM, "pcache retrier: out of memory");
    }
    memcpy(r->delays, delays, ndelays * sizeof(double));
    r->ndelays = ndelays;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->wake, &ca);
    pthread_cond_init(&r->idle, &ca);
    pthread_condattr_destroy(&ca);
    int rc = pthread_create(&r->thread, NULL, run, r);
    if (rc != 0) {
        pthread_cond_destroy(&r->idle);
        pthread_cond_destroy(&r->wake);
        pthread_mutex_destroy(&r->mu);
        free(r->delays);
        free(r);
        return err_code(err, rc, "pcache retrier: thread");
    }
    *out = r;
    return 0;
}

int pcache_retrier_add(struct vmsnap_pcache_retrier *r, const char *path, const struct stat *st)
{
    char *copy = strdup(path);
    if (!copy)
        return -ENOMEM;
    pthread_mutex_lock(&r->mu);
    int rc = 0;
    if (r->stop) {
        rc = -ECANCELED;
    } else if (r->n >= VMSNAP_PCACHE_RETRIER_MAX_PENDING) {
        rc = -ENOSPC;
    } else {
        rc = grow_array(&r->q, &r->cap, r->n + 1, sizeof(*r->q), 16);
    }
    if (rc == 0) {
        r->q[r->n++] = (struct entry){.path = copy, .id = *st, .t0 = mono_now(), .next = 0};
        r->st.scheduled++;
        copy = NULL;
        pthread_cond_signal(&r->wake);
    }
    pthread_mutex_unlock(&r->mu);
    free(copy);
    return rc;
}

int vmsnap_pcache_retrier_wait(struct vmsnap_pcache_retrier *r, double timeout)
{
    double deadline = timeout >= 0 ? mono_now() + timeout : 0;
    int rc = 0;
    pthread_mutex_lock(&r->mu);
    while ((r->n > 0 || r->busy) && !r->stop) {
        if (vmsnap_cancelled()) { /* checked every 0.2 s */
            rc = -ECANCELED;
            break;
        }
        double t = mono_now();
        if (timeout >= 0 && t >= deadline) {
            rc = -ETIMEDOUT;
            break;
        }
        struct timespec ts = to_ts(timeout >= 0 ? VMSNAP_MIN(deadline, t + 0.2) : t + 0.2);
        pthread_cond_timedwait(&r->idle, &r->mu, &ts);
    }
    pthread_mutex_unlock(&r->mu);
    return rc;
}

void vmsnap_pcache_retrier_get_stats(struct vmsnap_pcache_retrier *r,
                                     struct vmsnap_pcache_retrier_stats *stats)
{
    pthread_mutex_lock(&r->mu);
    *stats = r->st;
    stats->pending = r->n + (r->busy ? 1 : 0);
    pthread_mutex_unlock(&r->mu);
}

void vmsnap_pcache_retrier_free(struct vmsnap_pcache_retrier *r)
{
    if (!r)
        return;
    pthread_mutex_lock(&r->mu);
    r->stop = true;
    pthread_cond_broadcast(&r->wake);
    pthread_mutex_unlock(&r->mu);
    pthread_join(r->thread, NULL);
    for (size_t i = 0; i < r->n; i++)
        free(r->q[i].path);
    free(r->q);
    free(r->delays);
    pthread_cond_destroy(&r->idle);
    pthread_cond_destroy(&r->wake);
    pthread_mutex_destroy(&r->mu);
    free(r);
}
