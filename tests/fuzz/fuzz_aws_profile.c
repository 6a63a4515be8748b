/* SPDX-License-Identifier: Apache-2.0 */
/* Fuzz target: the AWS shared files' reader (s3_profile_parse) on untrusted bytes, read as the
 * credentials file and then as the config file of one profile ("default", then "dev"), as
 * s3_profile_load does. An error names the file and line and never a value of the input (the
 * values are the secrets); a success keeps only settings with a name and a value, each once per
 * file, all found again by s3_profile_get_src. */
#include "fuzz_cred.h"

#include <stdint.h>
#include <stdio.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The values of the input's lines (what follows the first '=' or ':') must not be in msg,
 * unless the same bytes are elsewhere in the input too (a [services NAME] header is shown). */
static void no_value(const char *in, size_t size, const char *msg)
{
    const char *line = in, *end = in + size;
    while (line < end) {
        const char *nl = memchr(line, '\n', (size_t)(end - line));
        const char *le = nl ? nl : end;
        const char *eq = line;
        while (eq < le && *eq != '=' && *eq != ':')
            eq++;
        if (eq < le)
            fuzz_no_secret(eq + 1, (size_t)(le - eq - 1), in, size, true, msg);
        line = le + 1;
    }
}

static int parse(struct s3_profile *p, const char *path, bool cred, const uint8_t *data,
                 size_t size)
{
    char *buf = malloc(size + 1);
    if (!buf)
        abort();
    memcpy(buf, data, size);
    struct vmsnap_err err = {0};
    int rc = s3_profile_parse(p, path, cred, buf, size, &err);
    free(buf);
    if (rc < 0) {
        fuzz_check_err(rc, &err);
        if (!strstr(err.msg, path))
            abort(); /* the message names the file */
        no_value((const char *)data, size, err.msg);
    }
    return rc;
}

static void one(const char *name, const uint8_t *data, size_t size)
{
    struct s3_profile p;
    memset(&p, 0, sizeof(p));
    if (!(p.name = strdup(name)))
        abort();
    int rc = parse(&p, "fuzz-credentials", true, data, size);
    if (rc == 0)
        rc = parse(&p, "fuzz-config", false, data, size);
    if (rc == 0) {
        if (p.n > 256)
            abort();
        for (size_t i = 0; i < p.n; i++) {
            const struct s3_kv *e = &p.kv[i];
            /* a setting of the profile comes from a file that has its section */
            if (e->key[0] != '@' && !(e->from_cred ? p.in_cred : p.in_config))
                abort();
            if (!e->key[0] || !e->val[0] || s3_profile_get_src(&p, e->key, e->from_cred) != e->val)
                abort(); /* empty, or set twice in one file (the first would win) */
        }
        (void)s3_profile_get(&p, "aws_secret_access_key");
        (void)s3_profile_service(&p, "s3", "endpoint_url");
    }
    s3_profile_fini(&p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > (1u << 20))
        return 0;
    one("default", data, size);
    one("dev", data, size);
    return 0;
}
