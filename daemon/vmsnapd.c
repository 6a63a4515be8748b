/* SPDX-License-Identifier: Apache-2.0 */
/*
 * vmsnapd: the node daemon (docs/daemon.md). Start: the config file, then the flags; the
 * library's log through the daemon's JSON lines; SIGINT, SIGTERM and SIGHUP blocked in every
 * thread and taken here by sigwait; the socket bound; the operation workers started; what a
 * killed daemon left recovered (recover.c); libmicrohttpd started; READY=1 to systemd. Stop
 * (SIGTERM or SIGINT): STOPPING=1, no new connections, the requests in progress answered, the
 * queued operations cancelled, the running ones given stop_timeout seconds and then cancelled
 * through their scopes (the CLI's Ctrl-C clean-up), the socket removed. A second signal during
 * the stop ends the process at once.
 */
#include "daemon.h"

#include "vmsnap/store.h"

#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

static const char usage[] =
    "usage: vmsnapd --socket PATH [--socket-mode 0660] [--socket-group G] [--config FILE]\n"
    "               [--set KEY=VALUE]... [-v] [-q]\n"
    "The vmsnap node daemon: HTTP/1.1 + JSON on a unix socket (docs/daemon.md, "
    "docs/openapi.yaml).\n"
    "FILE holds 'key = value' lines (the keys of docs/daemon.md); the flags override it.\n";

static int parse_args(int argc, char **argv, struct d_config *cfg, int *level,
                      struct vmsnap_err *err)
{
    static const struct option longs[] = {
        {"socket", required_argument, NULL, 's'},
        {"socket-mode", required_argument, NULL, 'm'},
        {"socket-group", required_argument, NULL, 'g'},
        {"config", required_argument, NULL, 'c'},
        {"set", required_argument, NULL, 'S'},
        {"help", no_argument, NULL, 'h'},
        {"list-routes", no_argument, NULL, 'R'},
        {0},
    };
    /* the file first, so that the flags override it */
    for (int i = 1; i < argc; i++) {
        const char *f = NULL;
        if (!strcmp(argv[i], "--config") && i + 1 < argc)
            f = argv[i + 1];
        else if (!strncmp(argv[i], "--config=", 9))
            f = argv[i] + 9;
        if (f) {
            int rc = d_config_load(cfg, f, err);
            if (rc < 0)
                return rc;
        }
    }
    int c, rc = 0;
    while (rc == 0 && (c = getopt_long(argc, argv, "vqh", longs, NULL)) != -1) {
        switch (c) {
        case 's':
            rc = d_config_set(cfg, "socket", optarg, err);
            break;
        case 'm':
            rc = d_config_set(cfg, "socket_mode", optarg, err);
            break;
        case 'g':
            rc = d_config_set(cfg, "socket_group", optarg, err);
            break;
        case 'c':
            break;
        case 'S': {
            char *eq = strchr(optarg, '=');
            if (!eq)
                return vmsnap_err_set(err, EINVAL, "--set %s: not KEY=VALUE", optarg);
            *eq = '\0';
            rc = d_config_set(cfg, optarg, eq + 1, err);
            *eq = '=';
            break;
        }
        case 'v':
            *level = VMSNAP_LOG_DEBUG;
            break;
        case 'q':
            *level = VMSNAP_LOG_WARN;
            break;
        case 'h':
            fputs(usage, stdout);
            exit(0);
        case 'R': /* the route table, for the test that holds it against docs/openapi.yaml */
            for (size_t i = 0;; i++) {
                const char *m, *p = d_route_pattern(i, &m);
                if (!p)
                    exit(0);
                printf("%s %s\n", m, p);
            }
        default:
            return vmsnap_err_set(err, EINVAL, "bad arguments (--help)");
        }
    }
    if (rc == 0 && optind < argc)
        return vmsnap_err_set(err, EINVAL, "unexpected argument '%s'", argv[optind]);
    return rc < 0 ? rc : d_config_check(cfg, err);
}

int main(int argc, char **argv)
{
    struct d_config cfg;
    d_config_init(&cfg);
    struct vmsnap_err err = {0};
    int level = VMSNAP_LOG_INFO;
    if (parse_args(argc, argv, &cfg, &level, &err) < 0) {
        fprintf(stderr, "vmsnapd: %s\n%s", err.msg, usage);
        d_config_fini(&cfg);
        return 2;
    }
    d_log_init(level);
    vmsnap_set_log(d_log_lib, NULL, (enum vmsnap_log_level)level);

    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGTERM);
    sigaddset(&stop, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &stop, NULL); /* every thread started from here inherits it */
    signal(SIGPIPE, SIG_IGN);

    int rc = 1;
    struct d_ctx *ctx = NULL;
    struct d_http *http = NULL;
    /* store connections parked between operations: as many as the node's connection budget */
    vmsnap_store_set_idle_max(cfg.connections);
    struct d_journal *journal = NULL;
    int fd = d_sock_listen(cfg.socket, cfg.socket_mode, cfg.socket_group, &err);
    if (fd < 0)
        goto out;
    if (!(ctx = d_ctx_new(&cfg, &err)))
        goto out;
    /* what a killed daemon left, recovered before anything is served (the socket is bound:
     * clients wait in its backlog) */
    if (d_recover(ctx, &cfg, &journal, &err) < 0 || !(http = d_http_start(ctx, fd, &err)))
        goto out;
    d_log(VMSNAP_LOG_INFO, NULL,
          "vmsnapd %s listening on %s (workers %u, queue %u, threads %u, memory %llu, "
          "connections %u)",
          vmsnap_version(), cfg.socket, cfg.workers, cfg.queue_max, cfg.codec_threads,
          (unsigned long long)cfg.memory, cfg.connections);
    sd_notify(0, "READY=1");

    int sig = 0;
    while (sigwait(&stop, &sig) != 0)
        ;
    if (sig == SIGHUP) /* no reload yet: a HUP stops, as a TERM does */
        d_log(VMSNAP_LOG_WARN, NULL, "SIGHUP: configuration reload is not supported; stopping");
    sd_notify(0, "STOPPING=1");
    d_log(VMSNAP_LOG_INFO, NULL, "SIG%s: stopping (in-flight work has %.0f s)", sigabbrev_np(sig),
          cfg.stop_timeout);
    signal(SIGINT, SIG_DFL); /* a second signal ends the process at once */
    signal(SIGTERM, SIG_DFL);
    pthread_sigmask(SIG_UNBLOCK, &stop, NULL);
    unlink(cfg.socket); /* no new client finds it */
    d_http_quiesce(http, 5);
    d_ctx_stop(ctx, cfg.stop_timeout);
    d_http_stop(http);
    http = NULL;
    fd = -1; /* MHD closed it (quiesce handed it back and we closed it) */
    rc = 0;
    d_log(VMSNAP_LOG_INFO, NULL, "stopped");
out:
    if (rc != 0)
        fprintf(stderr, "vmsnapd: %s\n", err.msg);
    if (fd >= 0 && rc != 0) { /* bound by us, never served */
        close(fd);
        unlink(cfg.socket);
    }
    d_ctx_stop(ctx, 0);
    if (ctx)
        d_ctx_set_journal(ctx, NULL);
    d_journal_close(journal); /* its entries all removed: a clean stop leaves none */
    d_ctx_free(ctx);
    d_config_fini(&cfg);
    vmsnap_store_global_cleanup(); /* the parked connections, the kept credentials */
    return rc;
}
