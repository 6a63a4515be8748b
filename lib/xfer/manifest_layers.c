/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The layered set's manifest (formatVersion 3): every file a chain of immutable layer objects
 * named with their digests, plus the page table of the file as its last layer leaves it.
 *
 *   {"formatVersion": 3, "tool": "vmsnap", "toolVersion": "…", "pushId": "<32 hex>",
 *    "created": <Unix seconds>, "parent": "<URL>" (when a layer is a delta),
 *    "files": {"<name>": {"size": N, "populated": P,
 *        "layers": [{"key": "<set>/vmsnap-objects/<pushId>/<name>.zstd", "objectSize": B,
 *                    "size": N0, "populated": P0, "tableSha256": "<hex>", "delta": false}, …],
 *        "pages": {"key": "….pages", "objectSize": B, "sha256": "<hex>"}}, …}}
 *
 * No "snapshotFiles": a reader of the reference layout refuses the set instead of looking for
 * objects at <set>/<name>.zstd that are not there.
 */
#include "xfer_int.h"

#include <errno.h>
#include <limits.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool layer_key_ok(const char *key)
{
    size_t len = strlen(key);
    /* any byte a store takes (a set's own key may hold control bytes: they are escaped where
     * printed), but no way out of the store's namespace */
    if (len == 0 || len > PATH_MAX || key[0] == '/' || key[len - 1] == '/')
        return false;
    /* components: none empty, ".", ".." */
    for (const char *p = key;;) {
        const char *e = strchr(p, '/');
        size_t cl = e ? (size_t)(e - p) : strlen(p);
        if (cl == 0 || (cl == 1 && p[0] == '.') || (cl == 2 && p[0] == '.' && p[1] == '.'))
            return false;
        if (!e)
            break;
        p = e + 1;
    }
    /* "[P/]vmsnap-objects/<id>/<name>(.zstd|.pages)" */
    const char *name = strrchr(key, '/');
    if (!name)
        return false;
    const char *idend = name;
    const char *id = idend;
    while (id > key && id[-1] != '/')
        id--;
    size_t idl = (size_t)(idend - id);
    if (idl == 0 || idl > 32 || strspn(id, "0123456789abcdef") < idl)
        return false;
    size_t ld = strlen(LAYER_DIR);
    const char *dir = id - 1 - ld; /* the component before the id */
    if (id - key < (ptrdiff_t)(ld + 1) || memcmp(dir, LAYER_DIR, ld) ||
        (dir > key && dir[-1] != '/'))
        return false;
    name++;
    size_t nl = strlen(name);
    size_t zs = strlen(OBJECT_SUFFIX), ps = strlen(PAGES_SUFFIX);
    bool z = nl > zs && !strcmp(name + nl - zs, OBJECT_SUFFIX);
    bool pg = nl > ps && !strcmp(name + nl - ps, PAGES_SUFFIX);
    return (z || pg) && name[0] != '.';
}

static bool get_hex(json_object *o, const char *k, char out[65])
{
    json_object *x;
    if (!json_object_object_get_ex(o, k, &x) || !json_object_is_type(x, json_type_string) ||
        !mf_hex64(json_object_get_string(x)))
        return false;
    memcpy(out, json_object_get_string(x), 65);
    return true;
}

static bool get_key(json_object *o, char **out)
{
    json_object *x;
    if (!json_object_object_get_ex(o, "key", &x) || !json_object_is_type(x, json_type_string) ||
        (size_t)json_object_get_string_len(x) != strlen(json_object_get_string(x)) ||
        !layer_key_ok(json_object_get_string(x)))
        return false;
    *out = strdup(json_object_get_string(x));
    return *out != NULL;
}

/* A bound no honest object passes: its size against the logical size it encodes. */
static bool object_size_ok(uint64_t osize, uint64_t size)
{
    return osize > 0 && osize <= (size + (1ull << 30)) * 2;
}

static int read_layers(json_object *d, struct mf_file *f, const char *where, uint64_t max_size,
                       struct vmsnap_err *err)
{
    json_object *ls;
    if (!json_object_object_get_ex(d, "layers", &ls) || !json_object_is_type(ls, json_type_array))
        return vmsnap_err_set(err, EINVAL, "%s: entry for '%s' has no \"layers\" array", where,
                              f->name);
    size_t n = json_object_array_length(ls);
    if (n == 0 || n > MAX_LAYERS)
        return vmsnap_err_set(err, EINVAL, "%s: '%s' has %zu layers (1 to %u)", where, f->name, n,
                              MAX_LAYERS);
    if (!(f->layers = calloc(n, sizeof(*f->layers))))
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        json_object *e = json_object_array_get_idx(ls, i), *dl;
        struct mf_layer *l = &f->layers[i];
        bool ok = json_object_is_type(e, json_type_object) && get_key(e, &l->key);
        f->nlayers += l->key != NULL;
        ok = ok && mf_get_u64(e, "objectSize", &l->object_size) &&
             mf_get_u64(e, "size", &l->size) && mf_get_u64(e, "populated", &l->populated) &&
             get_hex(e, "tableSha256", l->sha256) && json_object_object_get_ex(e, "delta", &dl) &&
             json_object_is_type(dl, json_type_boolean);
        if (!ok)
            return vmsnap_err_set(err, EINVAL,
                                  "%s: layer %zu of '%s' needs a key of a layer object, "
                                  "objectSize, size, populated, tableSha256 and delta",
                                  where, i, f->name);
        l->delta = json_object_get_boolean(dl);
        json_object *lp;
        if (json_object_object_get_ex(e, "pages", &lp)) {
            bool pok = json_object_is_type(lp, json_type_object) && get_key(lp, &l->pages_key) &&
                       mf_get_u64(lp, "objectSize", &l->pages_size) &&
                       get_hex(lp, "sha256", l->pages_sha256) && l->pages_size > 0 &&
                       l->pages_size <= (l->size / VMSNAP_PAGE_SIZE + 1) * 16 + 4096;
            if (!pok)
                return vmsnap_err_set(err, EINVAL,
                                      "%s: the \"pages\" of layer %zu of '%s' need a key of a "
                                      "layer object, a plausible objectSize and sha256",
                                      where, i, f->name);
        }
        if (l->size > max_size)
            return vmsnap_err_set(err, EFBIG,
                                  "%s: layer %zu of '%s' is %llu bytes, over the cap of %llu "
                                  "(--max-size; raise it for a larger image)",
                                  where, i, f->name, (unsigned long long)l->size,
                                  (unsigned long long)max_size);
        if (l->populated > l->size || !object_size_ok(l->object_size, l->size))
            return vmsnap_err_set(err, EINVAL, "%s: layer %zu of '%s' has impossible sizes", where,
                                  i, f->name);
        if ((i == 0) == l->delta)
            return vmsnap_err_set(err, EINVAL,
                                  "%s: '%s': the first layer must be a full image and only it "
                                  "(layer %zu says delta %s)",
                                  where, f->name, i, l->delta ? "true" : "false");
    }
    if (f->layers[n - 1].size != f->size)
        return vmsnap_err_set(err, EINVAL, "%s: '%s' is %llu bytes but its last layer makes %llu",
                              where, f->name, (unsigned long long)f->size,
                              (unsigned long long)f->layers[n - 1].size);
    return 0;
}

static int read_file(json_object *d, struct mf_file *f, const char *where, uint64_t max_size,
                     struct vmsnap_err *err)
{
    if (!json_object_is_type(d, json_type_object) || !mf_get_u64(d, "size", &f->size) ||
        !mf_get_u64(d, "populated", &f->populated))
        return vmsnap_err_set(err, EINVAL, "%s: entry for '%s' needs size and populated", where,
                              f->name);
    if (f->size > max_size)
        return vmsnap_err_set(err, EFBIG,
                              "%s: '%s' is %llu bytes, over the cap of %llu (--max-size; raise "
                              "it for a larger image)",
                              where, f->name, (unsigned long long)f->size,
                              (unsigned long long)max_size);
    if (f->populated > f->size)
        return vmsnap_err_set(err, EINVAL, "%s: entry for '%s' has impossible sizes", where,
                              f->name);
    int rc = read_layers(d, f, where, max_size, err);
    if (rc < 0)
        return rc;
    json_object *pg;
    if (json_object_object_get_ex(d, "pages", &pg)) {
        bool ok = json_object_is_type(pg, json_type_object) && get_key(pg, &f->pages.key) &&
                  mf_get_u64(pg, "objectSize", &f->pages.object_size) &&
                  get_hex(pg, "sha256", f->pages.sha256) && f->pages.object_size > 0 &&
                  f->pages.object_size <= (f->size / VMSNAP_PAGE_SIZE + 1) * 16 + 4096;
        if (!ok)
            return vmsnap_err_set(err, EINVAL,
                                  "%s: the \"pages\" of '%s' need a key of a layer object, a "
                                  "plausible objectSize and sha256",
                                  where, f->name);
    }
    /* what the set's other code reads of a file: its object is its last layer's */
    const struct mf_layer *top = &f->layers[f->nlayers - 1];
    f->object_size = top->object_size;
    memcpy(f->sha256, top->sha256, sizeof(f->sha256));
    f->table_digest = true;
    f->detail = true;
    return 0;
}

static int cmp_file(const void *a, const void *b)
{
    return strcmp(((const struct mf_file *)a)->name, ((const struct mf_file *)b)->name);
}

int manifest_parse_layered(void *rootp, const char *where, uint64_t max_size, struct manifest *m,
                           struct vmsnap_err *err)
{
    json_object *root = rootp, *pid, *files, *x;
    m->format_version = 3;
    if (!json_object_object_get_ex(root, "pushId", &pid) ||
        !json_object_is_type(pid, json_type_string) || strlen(json_object_get_string(pid)) != 32 ||
        strspn(json_object_get_string(pid), "0123456789abcdef") != 32)
        return vmsnap_err_set(err, EINVAL, "%s: \"pushId\" is not 32 lowercase hex digits", where);
    memcpy(m->push_id, json_object_get_string(pid), 33);
    uint64_t created = 0;
    if (json_object_object_get_ex(root, "created", &x) && !mf_get_u64(root, "created", &created))
        return vmsnap_err_set(err, EINVAL, "%s: \"created\" is not a time", where);
    m->created = (int64_t)created;
    if (json_object_object_get_ex(root, "parent", &x)) {
        const char *ps = json_object_is_type(x, json_type_string) ? json_object_get_string(x) : "";
        size_t pl = strlen(ps);
        bool ok = pl > 0 && pl < URL_BUF && pl == (size_t)json_object_get_string_len(x);
        for (size_t i = 0; ok && i < pl; i++)
            ok = (unsigned char)ps[i] >= 0x20 && ps[i] != 0x7f;
        if (!ok)
            return vmsnap_err_set(err, EINVAL, "%s: \"parent\" is not a URL", where);
        if (!(m->parent = strdup(ps)))
            return vmsnap_err_set(err, ENOMEM, "out of memory");
    }
    if (!json_object_object_get_ex(root, "files", &files) ||
        !json_object_is_type(files, json_type_object))
        return vmsnap_err_set(err, EINVAL, "%s: no \"files\" object", where);
    size_t n = (size_t)json_object_object_length(files);
    if (n == 0 || n > VMSNAP_XFER_MAX_FILES)
        return vmsnap_err_set(err, EINVAL, "%s: %zu files (1 to %u)", where, n,
                              VMSNAP_XFER_MAX_FILES);
    if (!(m->files = calloc(n, sizeof(*m->files))))
        return vmsnap_err_set(err, ENOMEM, "out of memory");
    json_object_object_foreach(files, name, d)
    {
        size_t nl = strlen(name);
        if (!manifest_name_ok(name, nl))
            return vmsnap_err_set(err, EINVAL,
                                  "%s: \"files\" has a name that is not a plain file name "
                                  "(refusing '%.*s')",
                                  where, (int)(nl > 64 ? 64 : nl), name);
        struct mf_file *f = &m->files[m->n++];
        if (!(f->name = strdup(name)))
            return vmsnap_err_set(err, ENOMEM, "out of memory");
        int rc = read_file(d, f, where, max_size, err);
        if (rc < 0)
            return rc;
    }
    qsort(m->files, m->n, sizeof(*m->files), cmp_file);
    for (size_t i = 1; i < m->n; i++)
        if (!strcmp(m->files[i - 1].name, m->files[i].name))
            return vmsnap_err_set(err, EINVAL, "%s: file '%s' listed twice", where,
                                  m->files[i].name);
    return 0;
}

static json_object *build_file(const struct mf_file *f)
{
    json_object *d = json_object_new_object(), *ls = json_object_new_array();
    if (!d || !ls) {
        json_object_put(d);
        json_object_put(ls);
        return NULL;
    }
    json_object_object_add(d, "size", json_object_new_int64((int64_t)f->size));
    json_object_object_add(d, "populated", json_object_new_int64((int64_t)f->populated));
    json_object_object_add(d, "layers", ls);
    for (size_t j = 0; j < f->nlayers; j++) {
        const struct mf_layer *l = &f->layers[j];
        json_object *e = json_object_new_object();
        if (!e) {
            json_object_put(d);
            return NULL;
        }
        json_object_object_add(e, "key", json_object_new_string(l->key));
        json_object_object_add(e, "objectSize", json_object_new_int64((int64_t)l->object_size));
        json_object_object_add(e, "size", json_object_new_int64((int64_t)l->size));
        json_object_object_add(e, "populated", json_object_new_int64((int64_t)l->populated));
        json_object_object_add(e, "tableSha256", json_object_new_string(l->sha256));
        json_object_object_add(e, "delta", json_object_new_boolean(l->delta));
        if (l->pages_key) {
            json_object *lp = json_object_new_object();
            if (!lp) {
                json_object_put(e);
                json_object_put(d);
                return NULL;
            }
            json_object_object_add(lp, "key", json_object_new_string(l->pages_key));
            json_object_object_add(lp, "objectSize", json_object_new_int64((int64_t)l->pages_size));
            json_object_object_add(lp, "sha256", json_object_new_string(l->pages_sha256));
            json_object_object_add(e, "pages", lp);
        }
        json_object_array_add(ls, e);
    }
    if (f->pages.key) {
        json_object *pg = json_object_new_object();
        if (!pg) {
            json_object_put(d);
            return NULL;
        }
        json_object_object_add(pg, "key", json_object_new_string(f->pages.key));
        json_object_object_add(pg, "objectSize",
                               json_object_new_int64((int64_t)f->pages.object_size));
        json_object_object_add(pg, "sha256", json_object_new_string(f->pages.sha256));
        json_object_object_add(d, "pages", pg);
    }
    return d;
}

char *manifest_build_layered(const struct manifest *m)
{
    json_object *root = json_object_new_object(), *files = json_object_new_object();
    if (!root || !files) {
        json_object_put(root);
        json_object_put(files);
        return NULL;
    }
    json_object_object_add(root, "formatVersion", json_object_new_int(3));
    json_object_object_add(root, "tool", json_object_new_string("vmsnap"));
    json_object_object_add(root, "toolVersion", json_object_new_string(vmsnap_version()));
    json_object_object_add(root, "pushId", json_object_new_string(m->push_id));
    json_object_object_add(root, "created", json_object_new_int64(m->created));
    if (m->parent)
        json_object_object_add(root, "parent", json_object_new_string(m->parent));
    json_object_object_add(root, "files", files);
    for (size_t i = 0; i < m->n; i++) {
        json_object *d = build_file(&m->files[i]);
        if (!d) {
            json_object_put(root);
            return NULL;
        }
        json_object_object_add(files, m->files[i].name, d);
    }
    const char *s = json_object_to_json_string_ext(root, JSON_C_TO_STRING_PRETTY |
                                                             JSON_C_TO_STRING_NOSLASHESCAPE);
    char *out = s ? strdup(s) : NULL;
    json_object_put(root);
    return out;
}
