/* SPDX-License-Identifier: Apache-2.0 */
/* The CLI's error contract over HTTP. The code and class are the CLI's (docs/cli.md, the table of
 * cli_exit_code() in cli/util.c, kept in step by the daemon_api test's checks of both), so a
 * control plane reads one contract whichever way it drives the node; the daemon adds the class
 * "conflict" (code 1, the CLI's "other") for EBUSY and EEXIST, which it answers with 409. */
#include "daemon.h"

#include <errno.h>
#include <signal.h>

int d_exit_code(int rc, bool cancelled)
{
    int e = rc < 0 ? -rc : rc;
    if (cancelled || e == ECANCELED || e == EINTR)
        return 128 + SIGINT;
    switch (e) {
    case ENOENT:
    case ENOTDIR:
    case ESRCH:
        return 3;
    case EACCES:
    case EPERM:
    case ENOKEY:
    case EKEYREJECTED:
    case EKEYEXPIRED:
        return 4;
    case ECONNREFUSED:
    case ECONNRESET:
    case ECONNABORTED:
    case ENOTCONN:
    case ETIMEDOUT:
    case EHOSTUNREACH:
    case EHOSTDOWN:
    case ENETUNREACH:
    case ENETDOWN:
    case ENETRESET:
    case EAGAIN:
    case ESTALE:
        return 5;
    case EBADMSG:
    case EPROTO:
    case EILSEQ:
    case EUCLEAN:
    case EFBIG:
        return 6;
    case ENOSPC:
    case EDQUOT:
    case EIO:
    case EROFS:
        return 7;
    case D_EUSAGE: /* the request itself is wrong: nothing was done */
        return 2;
    default:
        return 1;
    }
}

const char *d_class_name(int code, int errnum)
{
    switch (code) {
    case 2:
        return "usage";
    case 3:
        return "not_found";
    case 4:
        return "access_denied";
    case 5:
        return "unreachable";
    case 6:
        return "corrupt";
    case 7:
        return "local_io";
    case 1:
        return errnum == EBUSY || errnum == EEXIST ? "conflict" : "other";
    default:
        return code >= 128 ? "interrupted" : "other";
    }
}

unsigned d_http_status(int code, int errnum)
{
    switch (code) {
    case 2:
        return 400;
    case 3:
        return 404;
    case 4:
        return 403;
    case 5:
        return 503;
    case 1:
        return errnum == EBUSY || errnum == EEXIST ? 409 : 500;
    default:
        return 500;
    }
}
