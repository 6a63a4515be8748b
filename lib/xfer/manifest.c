/* SPDX-License-Identifier: Apache-2.0 */
/*
 * manifest.json: built with json-c, parsed from untrusted bytes with every field checked (the
 * names become file names on the puller's disk, the sizes become file sizes).
 */
#include "xfer_int.h"

#include <errno.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool manifest_name_ok(const char *name, size_t len)
{
    if (len == 0 || len > 255 || memchr(name, '\0', len) || memchr(name, '/', len))
        return false;
    /* hidden names too ('.', '..', a '.bashrc', vmsnap's own '.vmsnap-*' temporaries): push
     * never stores one, so a manifest naming one was not written by it */
    if (name[0] == '.')
        return false;
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)name[i] < 0x20 || name[i] == 0x7f)
            return false;
    if (len == strlen(VMSNAP_XFER_MANIFEST) && !memcmp(name, VMSNAP_XFER_MANIFEST, len))
        return false;
    return true;
}

void manifest_fini(struct manifest *m)
{
    if (!m)
        return;
    for (size_t i = 0; i < m->n; i++) {
        struct mf_file *f = &m->files[i];
        free(f->name);
        for (size_t j = 0; j < f->nlayers; j++) {
            free(f->layers[j].key);
            free(f->layers[j].pages_key);
        }
        free(f->layers);
        free(f->pages.key);
    }
    free(m->files);
    m->files = NULL;
    m->n = 0;
    free(m->parent);
    m->parent = NULL;
}

bool mf_get_u64(void *obj, const char *k, uint64_t *v)
{
    json_object *o = obj, *x;
    if (!json_object_object_get_ex(o, k, &x) || !json_object_is_type(x, json_type_int))
        return false;
    errno = 0;
    int64_t i = json_object_get_int64(x);
    if (i < 0 || errno)
        return false;
    *v = (uint64_t)i;
    return true;
}

bool mf_hex64(const char *s)
{
    if (strlen(s) != 64)
        return false;
    for (const char *p = s; *p; p++)
        if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f')))
            return false;
    return true;
}

/* One JSON value making up all of `buf` (whitespace after it allowed), at most
 * VMSNAP_XFER_MANIFEST_MAX bytes and 32 levels deep; `what` names it in errors. */
static int parse_whole(const char *buf, size_t len, const char *where, const char *what,
                       json_object **out, struct vmsnap_err *err)
{
    *out = NULL;
    if (len > VMSNAP_XFER_MANIFEST_MAX)
        return vmsnap_err_set(err, EFBIG, "%s: %s of %zu bytes is too large", where, what, len);
    json_tokener *tok = json_tokener_new_ex(32);
    if (!tok)
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    json_object *root = json_tokener_parse_ex(tok, buf, (int)len);
    enum json_tokener_error je = json_tokener_get_error(tok);
    size_t used = (size_t)json_tokener_get_parse_end(tok);
    json_tokener_free(tok);
    if (!root || je != json_tokener_success) {
        json_object_put(root);
        if (je == json_tokener_continue) /* json-c's "continue": the input ended early */
            return vmsnap_err_set(err, EINVAL,
                                  "%s: not valid JSON (it ends after %zu bytes, "
                                  "inside the %s: truncated?)",
                                  where, len, what);
        return vmsnap_err_set(err, EINVAL, "%s: not valid JSON (%s)", where,
                              json_tokener_error_desc(
                                  je == json_tokener_success ? json_tokener_error_parse_eof : je));
    }
    for (size_t i = used; i < len; i++)
        if (buf[i] != ' ' && buf[i] != '\n' && buf[i] != '\r' && buf[i] != '\t') {
            json_object_put(root);
            return vmsnap_err_set(err, EINVAL, "%s: trailing bytes after the JSON object", where);
        }
    *out = root;
    return 0;
}

/* The top-level fields: "snapshotFiles" (*sf), "formatVersion", "pushId", "files" (*files,
 * NULL when absent: a reference manifest). */
static int read_head(json_object *root, const char *where, struct manifest *m, json_object **sf,
                     json_object **files, struct vmsnap_err *err)
{
    json_object *fv, *pid;
    if (!json_object_is_type(root, json_type_object) ||
        !json_object_object_get_ex(root, "snapshotFiles", sf) ||
        !json_object_is_type(*sf, json_type_array))
        return vmsnap_err_set(err, EINVAL, "%s: no \"snapshotFiles\" array", where);
    if (json_object_object_get_ex(root, "formatVersion", &fv)) {
        if (!json_object_is_type(fv, json_type_int) || json_object_get_int64(fv) != 2)
            return vmsnap_err_set(err, EINVAL, "%s: unsupported formatVersion (expected 2 or 3)",
                                  where);
        m->format_version = 2;
    }
    if (json_object_object_get_ex(root, "pushId", &pid)) {
        const char *ps = json_object_get_string(pid);
        size_t pl = ps ? strlen(ps) : 0;
        bool ok = json_object_is_type(pid, json_type_string) && pl > 0 && pl < sizeof(m->push_id) &&
                  strspn(ps, "0123456789abcdef") == pl;
        if (!ok)
            return vmsnap_err_set(err, EINVAL, "%s: \"pushId\" is not 1-32 lowercase hex digits",
                                  where);
        memcpy(m->push_id, ps, pl + 1);
    }
    if (json_object_object_get_ex(root, "files", files) &&
        !json_object_is_type(*files, json_type_object))
        return vmsnap_err_set(err, EINVAL, "%s: \"files\" is not an object", where);
    return 0;
}

/* snapshotFiles[i]: a plain file name, listed once; appended to m->files. */
static int read_name(json_object *e, size_t i, const char *where, struct manifest *m,
                     struct vmsnap_err *err)
{
    if (!json_object_is_type(e, json_type_string))
        return vmsnap_err_set(err, EINVAL, "%s: snapshotFiles[%zu] is not a string", where, i);
    const char *name = json_object_get_string(e);
    size_t nl = (size_t)json_object_get_string_len(e);
    if (!manifest_name_ok(name, nl))
        return vmsnap_err_set(err, EINVAL,
                              "%s: snapshotFiles[%zu] is not a plain file name (refusing '%.*s')",
                              where, i, (int)(nl > 64 ? 64 : nl), name);
    for (size_t j = 0; j < m->n; j++)
        if (!strcmp(m->files[j].name, name))
            return vmsnap_err_set(err, EINVAL, "%s: file '%s' listed twice", where, name);
    struct mf_file *f = &m->files[m->n];
    f->name = strdup(name);
    if (!f->name)
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    m->n++;
    return 0;
}

/* files[f->name]: its sizes and digest. */
static int read_entry(json_object *files, struct mf_file *f, const char *where, uint64_t max_size,
                      struct vmsnap_err *err)
{
    const char *name = f->name;
    json_object *d;
    if (!json_object_object_get_ex(files, name, &d) || !json_object_is_type(d, json_type_object))
        return vmsnap_err_set(err, EINVAL, "%s: no \"files\" entry for '%s'", where, name);
    json_object *sh = NULL, *th = NULL;
    bool has_sh = json_object_object_get_ex(d, "sha256", &sh);
    bool has_th = json_object_object_get_ex(d, "tableSha256", &th);
    if (!mf_get_u64(d, "size", &f->size) || !mf_get_u64(d, "populated", &f->populated) ||
        !mf_get_u64(d, "objectSize", &f->object_size) || has_sh == has_th ||
        !json_object_is_type(has_sh ? sh : th, json_type_string) ||
        !mf_hex64(json_object_get_string(has_sh ? sh : th)))
        return vmsnap_err_set(err, EINVAL,
                              "%s: entry for '%s' needs size, populated, objectSize and one "
                              "lowercase hex digest (sha256 or tableSha256)",
                              where, name);
    f->table_digest = has_th;
    if (f->size > max_size) /* a policy, not damage */
        return vmsnap_err_set(err, EFBIG,
                              "%s: '%s' is %llu bytes, over the cap of %llu (--max-size; "
                              "raise it for a larger image)",
                              where, name, (unsigned long long)f->size,
                              (unsigned long long)max_size);
    if (f->populated > f->size || f->object_size == 0 ||
        f->object_size > (f->size + (1ull << 30)) * 2)
        return vmsnap_err_set(err, EINVAL,
                              "%s: entry for '%s' has impossible sizes (size %llu, populated "
                              "%llu, object %llu)",
                              where, name, (unsigned long long)f->size,
                              (unsigned long long)f->populated, (unsigned long long)f->object_size);
    memcpy(f->sha256, json_object_get_string(has_sh ? sh : th), 65);
    f->detail = true;
    return 0;
}

int manifest_parse(const char *buf, size_t len, const char *where, uint64_t max_size,
                   struct manifest *m, struct vmsnap_err *err)
{
    memset(m, 0, sizeof(*m));
    json_object *root;
    int rc = parse_whole(buf, len, where, "manifest", &root, err);
    if (rc < 0)
        return rc;
    json_object *sf = NULL, *files = NULL, *fv;
    if (json_object_is_type(root, json_type_object) &&
        json_object_object_get_ex(root, "formatVersion", &fv) &&
        json_object_is_type(fv, json_type_int) && json_object_get_int64(fv) == 3) {
        rc = manifest_parse_layered(root, where, max_size, m, err);
        goto out;
    }
    if ((rc = read_head(root, where, m, &sf, &files, err)) < 0)
        goto out;
    size_t n = json_object_array_length(sf);
    if (n == 0) {
        rc = vmsnap_err_set(err, EINVAL, "%s: snapshotFiles is empty (a set has at least one file)",
                            where);
        goto out;
    }
    if (n > VMSNAP_XFER_MAX_FILES) {
        rc = vmsnap_err_set(err, EINVAL, "%s: %zu files (at most %u)", where, n,
                            VMSNAP_XFER_MAX_FILES);
        goto out;
    }
    m->files = calloc(n ? n : 1, sizeof(*m->files));
    if (!m->files) {
        rc = vmsnap_err_set(err, ENOMEM, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < n && rc == 0; i++) {
        rc = read_name(json_object_array_get_idx(sf, i), i, where, m, err);
        if (rc == 0 && files)
            rc = read_entry(files, &m->files[m->n - 1], where, max_size, err);
    }
out:
    json_object_put(root);
    if (rc < 0)
        manifest_fini(m);
    if (rc == -EINVAL) { /* bytes that are not a manifest vmsnap takes: corrupt or hostile input */
        rc = -EBADMSG;
        if (err)
            err->code = EBADMSG;
    }
    return rc;
}

char *manifest_build(const struct manifest *m)
{
    json_object *root = json_object_new_object();
    json_object *sf = json_object_new_array();
    json_object *files = json_object_new_object();
    if (!root || !sf || !files) {
        json_object_put(root);
        json_object_put(sf);
        json_object_put(files);
        return NULL;
    }
    json_object_object_add(root, "snapshotFiles", sf);
    json_object_object_add(root, "formatVersion", json_object_new_int(2));
    json_object_object_add(root, "tool", json_object_new_string("vmsnap"));
    json_object_object_add(root, "toolVersion", json_object_new_string(vmsnap_version()));
    if (m->push_id[0])
        json_object_object_add(root, "pushId", json_object_new_string(m->push_id));
    json_object_object_add(root, "files", files);
    for (size_t i = 0; i < m->n; i++) {
        const struct mf_file *f = &m->files[i];
        json_object_array_add(sf, json_object_new_string(f->name));
        json_object *d = json_object_new_object();
        char obj[300];
        snprintf(obj, sizeof(obj), "%s" OBJECT_SUFFIX, f->name);
        json_object_object_add(d, "object", json_object_new_string(obj));
        json_object_object_add(d, "size", json_object_new_int64((int64_t)f->size));
        json_object_object_add(d, "populated", json_object_new_int64((int64_t)f->populated));
        json_object_object_add(d, "objectSize", json_object_new_int64((int64_t)f->object_size));
        json_object_object_add(d, f->table_digest ? "tableSha256" : "sha256",
                               json_object_new_string(f->sha256));
        json_object_object_add(files, f->name, d);
    }
    const char *s = json_object_to_json_string_ext(root, JSON_C_TO_STRING_PRETTY |
                                                             JSON_C_TO_STRING_NOSLASHESCAPE);
    char *out = s ? strdup(s) : NULL;
    json_object_put(root);
    return out;
}

char *push_mark_build(const char *push_id, int64_t started, const struct mf_file *files, size_t n,
                      char *const *replaces, size_t nr)
{
    json_object *root = json_object_new_object();
    json_object *names = json_object_new_array();
    if (!root || !names) {
        json_object_put(root);
        json_object_put(names);
        return NULL;
    }
    /* 2 with "replaces": a gc that does not know it refuses the mark rather than skip it */
    json_object_object_add(root, "vmsnapPush", json_object_new_int(nr ? 2 : 1));
    json_object_object_add(root, "pushId", json_object_new_string(push_id));
    json_object_object_add(root, "started", json_object_new_int64(started));
    json_object_object_add(root, "files", names);
    for (size_t i = 0; i < n; i++)
        json_object_array_add(names, json_object_new_string(files[i].name));
    if (nr) {
        json_object *old = json_object_new_array();
        if (!old) {
            json_object_put(root);
            return NULL;
        }
        json_object_object_add(root, "replaces", old);
        for (size_t i = 0; i < nr; i++)
            json_object_array_add(old, json_object_new_string(replaces[i]));
    }
    const char *s = json_object_to_json_string_ext(root, JSON_C_TO_STRING_PLAIN |
                                                             JSON_C_TO_STRING_NOSLASHESCAPE);
    char *out = s ? strdup(s) : NULL;
    json_object_put(root);
    return out;
}

void push_mark_fini(struct push_mark *pm)
{
    if (!pm)
        return;
    for (size_t i = 0; i < pm->n; i++)
        free(pm->names[i]);
    free(pm->names);
    pm->names = NULL;
    pm->n = 0;
}

int push_mark_parse(const char *buf, size_t len, const char *where, const char *want_id,
                    struct push_mark *pm, struct vmsnap_err *err)
{
    *pm = (struct push_mark){0};
    json_object *root;
    int rc = parse_whole(buf, len, where, "push mark", &root, err);
    if (rc < 0)
        return rc;
    json_object *v, *id, *st, *files;
    if (!json_object_is_type(root, json_type_object) ||
        !json_object_object_get_ex(root, "vmsnapPush", &v) ||
        !json_object_is_type(v, json_type_int) || json_object_get_int64(v) < 1 ||
        json_object_get_int64(v) > 2 || !json_object_object_get_ex(root, "pushId", &id) ||
        !json_object_is_type(id, json_type_string) || strcmp(json_object_get_string(id), want_id) ||
        !json_object_object_get_ex(root, "started", &st) ||
        !json_object_is_type(st, json_type_int) || json_object_get_int64(st) < 0 ||
        !json_object_object_get_ex(root, "files", &files) ||
        !json_object_is_type(files, json_type_array)) {
        rc = vmsnap_err_set(err, EINVAL, "%s: not a vmsnap push mark of push %s", where, want_id);
        goto out;
    }
    snprintf(pm->push_id, sizeof(pm->push_id), "%s", want_id);
    pm->started = json_object_get_int64(st);
    json_object *old = NULL;
    if (json_object_object_get_ex(root, "replaces", &old) &&
        !json_object_is_type(old, json_type_array)) {
        rc = vmsnap_err_set(err, EINVAL, "%s: \"replaces\" is not an array", where);
        goto out;
    }
    size_t n = json_object_array_length(files), nr = old ? json_object_array_length(old) : 0;
    if (n > VMSNAP_XFER_MAX_FILES || nr > VMSNAP_XFER_MAX_FILES) {
        rc =
            vmsnap_err_set(err, EINVAL, "%s: %zu names in \"%s\" (at most %u)", where,
                           n > VMSNAP_XFER_MAX_FILES ? n : nr,
                           n > VMSNAP_XFER_MAX_FILES ? "files" : "replaces", VMSNAP_XFER_MAX_FILES);
        goto out;
    }
    pm->nfiles = n;
    pm->names = calloc(n + nr ? n + nr : 1, sizeof(*pm->names));
    if (!pm->names) {
        rc = vmsnap_err_set(err, ENOMEM, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < n + nr; i++) {
        json_object *e =
            i < n ? json_object_array_get_idx(files, i) : json_object_array_get_idx(old, i - n);
        const char *name =
            json_object_is_type(e, json_type_string) ? json_object_get_string(e) : NULL;
        size_t nl = name ? (size_t)json_object_get_string_len(e) : 0;
        if (!name || !manifest_name_ok(name, nl)) {
            rc = vmsnap_err_set(err, EINVAL, "%s: %s[%zu] is not a plain file name", where,
                                i < n ? "files" : "replaces", i < n ? i : i - n);
            goto out;
        }
        if (!(pm->names[pm->n] = strdup(name))) {
            rc = vmsnap_err_set(err, ENOMEM, "out of memory");
            goto out;
        }
        pm->n++;
    }
out:
    json_object_put(root);
    if (rc < 0)
        push_mark_fini(pm);
    return rc;
}
