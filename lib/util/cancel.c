/* SPDX-License-Identifier: Apache-2.0 */
/* Cancellation (see include/vmsnap/common.h): one process-wide flag, set from a signal handler or
 * any thread, and per-operation scopes; read between frames, parts and requests. A thread's scope
 * is a thread-local pointer, handed to the worker threads the library starts (thread_start), so
 * every thread of one operation sees that operation's flag and no other's. */
#include "util/util.h"

#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

struct vmsnap_scope {
    atomic_int sig;
    void *arg;
};

static atomic_int cancel_sig;
static _Thread_local int held; /* clean-up running on this thread: not cancelled */
static _Thread_local struct vmsnap_scope *scope;

void vmsnap_cancel(int sig)
{
    atomic_store(&cancel_sig, sig);
}

int vmsnap_cancelled(void)
{
    int sig = atomic_load_explicit(&cancel_sig, memory_order_relaxed);
    if (sig == 0 && scope)
        sig = atomic_load_explicit(&scope->sig, memory_order_relaxed);
    return sig;
}

struct vmsnap_scope *vmsnap_scope_new(void *arg)
{
    struct vmsnap_scope *s = calloc(1, sizeof(*s));
    if (s)
        s->arg = arg;
    return s;
}

void vmsnap_scope_free(struct vmsnap_scope *s)
{
    free(s);
}

void vmsnap_scope_enter(struct vmsnap_scope *s)
{
    scope = s;
}

void vmsnap_scope_cancel(struct vmsnap_scope *s, int sig)
{
    if (s)
        atomic_store(&s->sig, sig);
}

void *vmsnap_scope_arg(void)
{
    return scope ? scope->arg : NULL;
}

struct start {
    void *(*fn)(void *);
    void *arg;
    struct vmsnap_scope *scope;
};

static void *trampoline(void *p)
{
    struct start st = *(struct start *)p;
    free(p);
    scope = st.scope;
    return st.fn(st.arg);
}

int thread_start(pthread_t *t, void *(*fn)(void *), void *arg)
{
    struct start *st = malloc(sizeof(*st));
    if (!st)
        return ENOMEM;
    *st = (struct start){fn, arg, scope};
    int rc = pthread_create(t, NULL, trampoline, st);
    if (rc != 0)
        free(st);
    return rc;
}

void cancel_hold(void)
{
    held++;
}

void cancel_release(void)
{
    held--;
}

bool cancel_pending(void)
{
    return !held && vmsnap_cancelled() != 0;
}

int cancel_check(struct vmsnap_err *err)
{
    int sig = held ? 0 : vmsnap_cancelled();
    if (!sig)
        return 0;
    const char *name = sig > 0 && sig < NSIG ? sigabbrev_np(sig) : NULL;
    if (name)
        return vmsnap_err_set(err, ECANCELED, "interrupted (SIG%s)", name);
    if (sig > 0)
        return vmsnap_err_set(err, ECANCELED, "interrupted (signal %d)", sig);
    return vmsnap_err_set(err, ECANCELED, "cancelled");
}
