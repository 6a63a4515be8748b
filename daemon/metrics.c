/* SPDX-License-Identifier: Apache-2.0 */
/* /metrics in the Prometheus text exposition format (version 0.0.4): latency histograms per
 * operation kind and per VM step, bytes up and down, cache bytes, queue depth, in flight,
 * admitted, rejected, failures by class, requests by status. Fixed tables under one mutex:
 * memory stays bounded whatever the clients send (kinds and steps are the daemon's own names). */
#include "daemon.h"

#include "vmsnap/store.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NB 12
static const double bounds[NB] = {0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300};
#define MAX_SERIES 32
#define N_CLASSES 9

struct hist {
    char name[32];
    uint64_t b[NB + 1];
    uint64_t count;
    double sum;
};

struct d_metrics {
    pthread_mutex_t mu;
    struct hist ops[MAX_SERIES], steps[MAX_SERIES];
    size_t n_ops, n_steps;
    uint64_t up, down, cached;
    uint64_t admitted, rejected;
    uint64_t failures[N_CLASSES];
    uint64_t status[6]; /* 1xx..5xx, other */
};

static const char *const classes[N_CLASSES] = {"other",         "usage",       "not_found",
                                               "access_denied", "unreachable", "corrupt",
                                               "local_io",      "interrupted", "conflict"};

struct d_metrics *d_metrics_new(void)
{
    struct d_metrics *m = calloc(1, sizeof(*m));
    if (m)
        pthread_mutex_init(&m->mu, NULL);
    return m;
}

void d_metrics_free(struct d_metrics *m)
{
    if (!m)
        return;
    pthread_mutex_destroy(&m->mu);
    free(m);
}

static struct hist *series(struct hist *h, size_t *n, const char *name)
{
    for (size_t i = 0; i < *n; i++)
        if (!strcmp(h[i].name, name))
            return &h[i];
    if (*n >= MAX_SERIES)
        return NULL;
    struct hist *x = &h[(*n)++];
    snprintf(x->name, sizeof(x->name), "%s", name);
    return x;
}

static void observe(struct hist *h, double s)
{
    if (!h)
        return;
    size_t i = 0;
    while (i < NB && s > bounds[i])
        i++;
    h->b[i]++;
    h->count++;
    h->sum += s;
}

void d_metrics_request(struct d_metrics *m, unsigned status)
{
    pthread_mutex_lock(&m->mu);
    m->status[status >= 100 && status < 600 ? status / 100 - 1 : 5]++;
    pthread_mutex_unlock(&m->mu);
}

void d_metrics_op(struct d_metrics *m, const char *kind, double seconds, int code, uint64_t up,
                  uint64_t down, uint64_t cached)
{
    pthread_mutex_lock(&m->mu);
    observe(series(m->ops, &m->n_ops, kind), seconds);
    m->up += up;
    m->down += down;
    m->cached += cached;
    if (code) {
        const char *cls = d_class_name(code, 0);
        for (size_t i = 0; i < N_CLASSES; i++)
            if (!strcmp(classes[i], cls))
                m->failures[i]++;
    }
    pthread_mutex_unlock(&m->mu);
}

void d_metrics_step(struct d_metrics *m, const char *step, double seconds)
{
    pthread_mutex_lock(&m->mu);
    observe(series(m->steps, &m->n_steps, step), seconds);
    pthread_mutex_unlock(&m->mu);
}

void d_metrics_admit(struct d_metrics *m, bool admitted)
{
    pthread_mutex_lock(&m->mu);
    if (admitted)
        m->admitted++;
    else
        m->rejected++;
    pthread_mutex_unlock(&m->mu);
}

static void put_hist(FILE *f, const char *metric, const char *label, const struct hist *h, size_t n)
{
    fprintf(f, "# TYPE %s histogram\n", metric);
    for (size_t i = 0; i < n; i++) {
        uint64_t cum = 0;
        for (size_t b = 0; b < NB; b++) {
            cum += h[i].b[b];
            fprintf(f, "%s_bucket{%s=\"%s\",le=\"%g\"} %llu\n", metric, label, h[i].name, bounds[b],
                    (unsigned long long)cum);
        }
        fprintf(f, "%s_bucket{%s=\"%s\",le=\"+Inf\"} %llu\n", metric, label, h[i].name,
                (unsigned long long)h[i].count);
        fprintf(f, "%s_sum{%s=\"%s\"} %.6f\n", metric, label, h[i].name, h[i].sum);
        fprintf(f, "%s_count{%s=\"%s\"} %llu\n", metric, label, h[i].name,
                (unsigned long long)h[i].count);
    }
}

char *d_metrics_text(struct d_metrics *m, unsigned queued, unsigned running)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f)
        return NULL;
    pthread_mutex_lock(&m->mu);
    put_hist(f, "vmsnapd_operation_seconds", "kind", m->ops, m->n_ops);
    put_hist(f, "vmsnapd_step_seconds", "step", m->steps, m->n_steps);
    fprintf(f, "# TYPE vmsnapd_bytes_up_total counter\nvmsnapd_bytes_up_total %llu\n",
            (unsigned long long)m->up);
    fprintf(f, "# TYPE vmsnapd_bytes_down_total counter\nvmsnapd_bytes_down_total %llu\n",
            (unsigned long long)m->down);
    fprintf(f, "# TYPE vmsnapd_cache_hit_bytes_total counter\nvmsnapd_cache_hit_bytes_total %llu\n",
            (unsigned long long)m->cached);
    fprintf(f,
            "# TYPE vmsnapd_operations_admitted_total counter\n"
            "vmsnapd_operations_admitted_total %llu\n",
            (unsigned long long)m->admitted);
    fprintf(f,
            "# TYPE vmsnapd_operations_rejected_total counter\n"
            "vmsnapd_operations_rejected_total %llu\n",
            (unsigned long long)m->rejected);
    fprintf(f, "# TYPE vmsnapd_operation_failures_total counter\n");
    for (size_t i = 0; i < N_CLASSES; i++)
        fprintf(f, "vmsnapd_operation_failures_total{class=\"%s\"} %llu\n", classes[i],
                (unsigned long long)m->failures[i]);
    fprintf(f, "# TYPE vmsnapd_http_requests_total counter\n");
    static const char *const codes[6] = {"1xx", "2xx", "3xx", "4xx", "5xx", "other"};
    for (size_t i = 0; i < 6; i++)
        fprintf(f, "vmsnapd_http_requests_total{code=\"%s\"} %llu\n", codes[i],
                (unsigned long long)m->status[i]);
    pthread_mutex_unlock(&m->mu);
    struct vmsnap_store_stats ss;
    vmsnap_store_stats(&ss); /* the library's, process-wide: every operation's store traffic */
    fprintf(f,
            "# TYPE vmsnapd_store_requests_total counter\nvmsnapd_store_requests_total %llu\n"
            "# TYPE vmsnapd_store_connects_total counter\nvmsnapd_store_connects_total %llu\n"
            "# TYPE vmsnapd_store_conns_reused_total counter\n"
            "vmsnapd_store_conns_reused_total %llu\n"
            "# TYPE vmsnapd_store_conns_new_total counter\nvmsnapd_store_conns_new_total %llu\n"
            "# TYPE vmsnapd_store_conns_idle gauge\nvmsnapd_store_conns_idle %llu\n"
            "# TYPE vmsnapd_store_creds_fetched_total counter\n"
            "vmsnapd_store_creds_fetched_total %llu\n"
            "# TYPE vmsnapd_store_creds_reused_total counter\n"
            "vmsnapd_store_creds_reused_total %llu\n",
            (unsigned long long)ss.requests, (unsigned long long)ss.connects,
            (unsigned long long)ss.conns_reused, (unsigned long long)ss.conns_new,
            (unsigned long long)ss.conns_idle, (unsigned long long)ss.creds_fetched,
            (unsigned long long)ss.creds_reused);
    fprintf(f, "# TYPE vmsnapd_queue_depth gauge\nvmsnapd_queue_depth %u\n", queued);
    fprintf(f, "# TYPE vmsnapd_operations_in_flight gauge\nvmsnapd_operations_in_flight %u\n",
            running);
    if (fclose(f) != 0) {
        free(buf);
        return NULL;
    }
    return buf;
}
