/* SPDX-License-Identifier: Apache-2.0 */
/* Cancellation (see include/vmsnap/common.h): one process-wide flag, set from a signal handler or
 * any thread, read between frames, parts and requests. */
#include "util/util.h"

#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>

static atomic_int cancel_sig;
static _Thread_local int held; /* clean-up running on this thread: not cancelled */

void vmsnap_cancel(int sig)
{
    atomic_store(&cancel_sig, sig);
}

int vmsnap_cancelled(void)
{
    return atomic_load_explicit(&cancel_sig, memory_order_relaxed);
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
