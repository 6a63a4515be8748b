/* SPDX-License-Identifier: Apache-2.0 */
/* Fuzz target: the daemon's request handling (daemon/router.c, jsonbody.c, paths.c and the
 * resources' checks) without a server. Input: "METHOD PATH[?QUERY]\n" then the body. The
 * daemon context has no workers, so admitted operations only queue (and are cancelled when the
 * context stops after each input); read-only handlers run for real under a temporary root. */
#include "daemon.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char root[64];

static void setup(struct d_config *cfg)
{
    if (!root[0]) {
        snprintf(root, sizeof(root), "/tmp/vmsnapd-fuzz-XXXXXX");
        if (!mkdtemp(root))
            abort();
        vmsnap_set_log(NULL, NULL, VMSNAP_LOG_ERROR);
        d_log_init(-1);
    }
    d_config_init(cfg);
    struct vmsnap_err err;
    if (d_config_set(cfg, "root", root, &err) < 0 || d_config_set(cfg, "asset_dir", root, &err))
        abort();
    char state[96];
    snprintf(state, sizeof(state), "%s/state", root);
    d_config_set(cfg, "state_dir", state, &err);
    d_config_set(cfg, "cache_dir", state, &err);
    cfg->workers = 0; /* nothing runs: operations only queue */
    cfg->queue_max = 4;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nl = memchr(data, '\n', size);
    if (!nl || nl - data > 2048)
        return 0;
    char line[2049];
    memcpy(line, data, (size_t)(nl - data));
    line[nl - data] = '\0';
    char *sp = strchr(line, ' ');
    if (!sp)
        return 0;
    *sp = '\0';
    char *path = sp + 1, *q = strchr(path, '?');
    if (q)
        *q++ = '\0';
    struct d_config cfg;
    setup(&cfg);
    struct vmsnap_err err = {0};
    struct d_ctx *ctx = d_ctx_new(&cfg, &err);
    if (!ctx)
        abort();
    struct d_request rq = {.method = line,
                           .path = path,
                           .query = q,
                           .body = (const char *)nl + 1,
                           .body_len = size - (size_t)(nl + 1 - data),
                           .ctx = ctx};
    memcpy(rq.id, "0123456789abcdef", D_REQ_ID_LEN);
    struct d_response rs = {.status = 200};
    d_route(&rq, &rs);
    /* every answer is a status and either a JSON object or text */
    if (rs.status < 200 || rs.status > 599 || (!rs.body && !rs.text && rs.status != 200))
        abort();
    json_object_put(rs.body);
    free(rs.text);
    d_ctx_stop(ctx, 0);
    d_ctx_free(ctx);
    d_config_fini(&cfg);
    return 0;
}
