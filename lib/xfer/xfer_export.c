/* SPDX-License-Identifier: Apache-2.0 */
/*
 * vmsnap_xfer_export: a set (layered or not) written again in the reference layout, which the
 * reference system restores: every file's chain is flattened by a pull into a private
 * temporary directory, which is then pushed with --layout reference and removed.
 */
#include "xfer_int.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int vmsnap_xfer_export(const char *url, const char *dest, const char *tmp_dir,
                       const struct vmsnap_xfer_opts *opts, struct vmsnap_xfer_stats *stats,
                       struct vmsnap_err *err)
{
    if (stats)
        memset(stats, 0, sizeof(*stats));
    const char *td = tmp_dir ? tmp_dir : getenv("TMPDIR");
    char dir[PATH_MAX];
    if (snprintf(dir, sizeof(dir), "%s/.vmsnap-export.XXXXXX", td && *td ? td : "/var/tmp") >=
        (int)sizeof(dir))
        return vmsnap_err_set(err, ENAMETOOLONG, "export: temporary directory name too long");
    if (!mkdtemp(dir))
        return err_sys(err, "export: make a temporary directory like %s", dir);
    struct vmsnap_xfer_opts po = opts ? *opts : (struct vmsnap_xfer_opts){0};
    po.set_only = true;
    po.no_fsync = true; /* a scratch copy: a crash loses nothing */
    struct vmsnap_xfer_stats ps = {0};
    int rc = vmsnap_xfer_pull(url, dir, &po, &ps, err);
    if (rc == 0) {
        struct vmsnap_xfer_opts uo = opts ? *opts : (struct vmsnap_xfer_opts){0};
        uo.layout = VMSNAP_LAYOUT_REFERENCE;
        uo.parent = NULL;
        uo.base = NULL;
        rc = vmsnap_xfer_push(dir, dest, &uo, stats, err);
        if (rc < 0)
            vmsnap_err_wrap(err, "export %s to %s: ", url, dest);
    } else {
        vmsnap_err_wrap(err, "export %s: ", url);
    }
    if (stats)
        stats->cached_bytes = ps.cached_bytes;
    if (sys_rm_tree(dir) < 0)
        vlog(VMSNAP_LOG_WARN, "export: cannot remove the temporary directory %s", dir);
    return rc;
}
