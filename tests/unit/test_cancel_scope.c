/* SPDX-License-Identifier: Apache-2.0 */
/* Cancellation scopes (vmsnap_scope_*): a scope's cancel reaches the thread that entered it and
 * the worker threads the library starts from there (thread_start), and no other operation; a
 * real pack under a cancelled scope fails with ECANCELED while one under another scope, at the
 * same time in the same process, succeeds. */
#include "t.h"
#include "util/util.h"
#include "vmsnap/image.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

struct probe {
    struct vmsnap_scope *scope; /* entered by the outer thread */
    int seen_outer, seen_inner;
    void *arg_inner;
};

static void *inner(void *p)
{
    struct probe *pr = p;
    pr->seen_inner = vmsnap_cancelled();
    pr->arg_inner = vmsnap_scope_arg();
    return NULL;
}

static void *outer(void *p)
{
    struct probe *pr = p;
    vmsnap_scope_enter(pr->scope);
    pr->seen_outer = vmsnap_cancelled();
    pthread_t t;
    REQUIRE(thread_start(&t, inner, pr) == 0);
    pthread_join(t, NULL);
    vmsnap_scope_enter(NULL);
    return NULL;
}

static void test_inheritance(void)
{
    int tag_a = 1, tag_b = 2;
    struct vmsnap_scope *a = vmsnap_scope_new(&tag_a), *b = vmsnap_scope_new(&tag_b);
    REQUIRE(a && b);
    vmsnap_scope_cancel(a, SIGINT);
    struct probe pa = {.scope = a}, pb = {.scope = b};
    pthread_t ta, tb;
    REQUIRE(pthread_create(&ta, NULL, outer, &pa) == 0);
    REQUIRE(pthread_create(&tb, NULL, outer, &pb) == 0);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    CHECK(pa.seen_outer == SIGINT);
    CHECK(pa.seen_inner == SIGINT); /* a worker of the cancelled operation */
    CHECK(pa.arg_inner == &tag_a);
    CHECK(pb.seen_outer == 0); /* another operation: not cancelled */
    CHECK(pb.seen_inner == 0);
    CHECK(pb.arg_inner == &tag_b);
    CHECK(vmsnap_cancelled() == 0); /* the main thread has no scope */
    CHECK(vmsnap_scope_arg() == NULL);
    /* the process-wide cancel still reaches everyone */
    vmsnap_cancel(SIGTERM);
    pb = (struct probe){.scope = b};
    REQUIRE(pthread_create(&tb, NULL, outer, &pb) == 0);
    pthread_join(tb, NULL);
    CHECK(pb.seen_outer == SIGTERM && pb.seen_inner == SIGTERM);
    vmsnap_cancel(0);
    vmsnap_scope_free(a);
    vmsnap_scope_free(b);
}

struct packer {
    struct vmsnap_scope *scope;
    const char *src, *dst;
    int rc;
    struct vmsnap_err err;
};

static void *pack_main(void *p)
{
    struct packer *k = p;
    vmsnap_scope_enter(k->scope);
    struct vmsnap_pack_opts o = {.threads = 2, .frame_size = 1u << 20};
    k->rc = vmsnap_image_pack(k->src, k->dst, &o, NULL, &k->err);
    vmsnap_scope_enter(NULL);
    return NULL;
}

static void test_pack(void)
{
    const char *src = t_path("src");
    int fd = open(src, O_CREAT | O_WRONLY | O_TRUNC, 0600);
    REQUIRE(fd >= 0);
    static char buf[1 << 16];
    uint64_t st = 7;
    for (int i = 0; i < 64; i++) { /* 4 MiB of data */
        for (size_t j = 0; j < sizeof(buf); j += 8) {
            uint64_t v = t_rand(&st);
            memcpy(buf + j, &v, 8);
        }
        REQUIRE(write(fd, buf, sizeof(buf)) == (ssize_t)sizeof(buf));
    }
    close(fd);
    struct vmsnap_scope *a = vmsnap_scope_new(NULL), *b = vmsnap_scope_new(NULL);
    REQUIRE(a && b);
    vmsnap_scope_cancel(a, SIGINT);
    struct packer ka = {.scope = a, .src = src, .dst = t_path("a.img")};
    struct packer kb = {.scope = b, .src = src, .dst = t_path("b.img")};
    pthread_t ta, tb;
    REQUIRE(pthread_create(&ta, NULL, pack_main, &ka) == 0);
    REQUIRE(pthread_create(&tb, NULL, pack_main, &kb) == 0);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    CHECKF(ka.rc == -ECANCELED, "rc %d: %s", ka.rc, ka.err.msg);
    CHECKF(strstr(ka.err.msg, "interrupted (SIGINT)") != NULL, "%s", ka.err.msg);
    CHECK(access(ka.dst, F_OK) != 0); /* cleaned up: no output */
    CHECKF(kb.rc == 0, "rc %d: %s", kb.rc, kb.err.msg);
    CHECK(access(kb.dst, F_OK) == 0);
    vmsnap_scope_free(a);
    vmsnap_scope_free(b);
}

int main(void)
{
    test_inheritance();
    test_pack();
    t_cleanup();
    return t_done();
}
