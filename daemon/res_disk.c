/* SPDX-License-Identifier: Apache-2.0 */
/* Disks: create and clone are operations on their destination path; info answers at once. The
 * fields are the CLI's (docs/cli.md: disk create, clone, info) and so are the results' keys. */
#include "daemon.h"

#include "vmsnap/disk.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void info_json(json_object *r, const char *path, const struct vmsnap_disk_info *i)
{
    json_object_object_add(r, "path", json_object_new_string(path));
    json_object_object_add(r, "logical_bytes", json_object_new_int64((int64_t)i->virtual_size));
    json_object_object_add(r, "allocated_bytes", json_object_new_int64((int64_t)i->allocated));
    json_object_object_add(r, "block_bytes", json_object_new_int64(i->block_size));
    json_object_object_add(r, "blocks_total", json_object_new_int64((int64_t)i->blocks_total));
    json_object_object_add(r, "blocks_free", json_object_new_int64((int64_t)i->blocks_free));
    json_object_object_add(r, "inodes_total", json_object_new_int64((int64_t)i->inodes_total));
    json_object_object_add(r, "inodes_free", json_object_new_int64((int64_t)i->inodes_free));
    json_object_object_add(r, "uuid", json_object_new_string(i->uuid_str));
    json_object_object_add(r, "label", json_object_new_string(i->label));
    json_object_object_add(r, "features", json_object_new_string(i->features));
    json_object_object_add(r, "clean", json_object_new_boolean(i->clean));
    json_object_object_add(r, "blocks_used",
                           json_object_new_int64((int64_t)(i->blocks_total - i->blocks_free)));
    json_object_object_add(r, "inodes_used",
                           json_object_new_int64((int64_t)(i->inodes_total - i->inodes_free)));
    json_object_object_add(r, "mount_count", json_object_new_int64(i->mount_count));
    json_object_object_add(r, "mkfs_time", json_object_new_int64(i->mkfs_time));
    json_object_object_add(r, "write_time", json_object_new_int64(i->write_time));
}

#define ENTRIES_MAX 4096 /* --add and --mkdir steps of one create */

/* The body's "entries" as the library's in *out (caller frees; NULL when none): 0 or -ENOMEM */
static int entries_of(json_object *o, struct vmsnap_disk_entry **out, size_t *n)
{
    json_object *a = NULL;
    *n = 0;
    *out = NULL;
    if (!json_object_object_get_ex(o, "entries", &a) || !json_object_array_length(a))
        return 0;
    struct vmsnap_disk_entry *e = *out = calloc(json_object_array_length(a), sizeof(*e));
    if (!e)
        return -ENOMEM;
    for (size_t i = 0; i < json_object_array_length(a); i++) {
        json_object *j = json_object_array_get_idx(a, i);
        const char *op = d_jstr(j, "op");
        e[i] = (struct vmsnap_disk_entry){
            .op = op && !strcmp(op, "add") ? VMSNAP_DISK_ADD : VMSNAP_DISK_MKDIR,
            .src = d_jstr(j, "src"),
            .dest = d_jstr(j, "dest"),
            .mode = (int32_t)d_jint(j, "mode", -1),
            .uid = d_jint(j, "uid", -1),
            .gid = d_jint(j, "gid", -1),
        };
        (*n)++;
    }
    return 0;
}

/* Each entry strictly (its keys and types, an op, a source for "add", under the roots); 0, or
 * fills rs and returns < 0 */
static int entries_check(struct d_request *rq, struct d_response *rs, json_object *o)
{
    static const struct d_field f[] = {
        {"op", D_STR, true},
        {"src", D_STR, false},
        {"dest", D_STR, true},
        {"mode", D_INT, false},
        {"uid", D_INT, false},
        {"gid", D_INT, false},
        {0},
    };
    json_object *a = NULL;
    if (!json_object_object_get_ex(o, "entries", &a))
        return 0;
    if (json_object_array_length(a) > ENTRIES_MAX) {
        d_error_msg(rs, -D_EUSAGE, "entries: at most %d", ENTRIES_MAX);
        return -1;
    }
    for (size_t i = 0; i < json_object_array_length(a); i++) {
        json_object *j = json_object_array_get_idx(a, i), *parsed = NULL;
        const char *text = json_object_to_json_string_ext(j, JSON_C_TO_STRING_PLAIN);
        struct vmsnap_err err = {0};
        if (d_body_parse(text, strlen(text), f, &parsed, &err) < 0) {
            d_error_msg(rs, -D_EUSAGE, "entries[%zu]: %s", i, err.msg);
            return -1;
        }
        json_object_put(parsed);
        const char *op = d_jstr(j, "op");
        bool add = !strcmp(op, "add");
        if ((!add && strcmp(op, "mkdir")) || add != (d_jstr(j, "src") != NULL)) {
            d_error_msg(rs, -D_EUSAGE, "entries[%zu]: op 'add' with a src, or 'mkdir' without one",
                        i);
            return -1;
        }
        if (add && d_req_path(rq, rs, j, "src", true) < 0)
            return -1;
    }
    return 0;
}

static int do_create(struct d_op *op, const struct d_config *cfg, const struct d_grant *g,
                     json_object *r, struct vmsnap_err *err)
{
    (void)g;
    (void)cfg;
    json_object *o = d_op_body(op);
    const char *path = d_jstr(o, "path");
    uint8_t uuid[16];
    const char *us = d_jstr(o, "uuid");
    if (us && vmsnap_disk_parse_uuid(us, uuid) < 0)
        return vmsnap_err_set(err, EINVAL, "uuid %s: not a UUID", us);
    struct vmsnap_disk_create_opts co = {
        .size = (uint64_t)d_jint(o, "size_bytes", 0),
        .inodes = (uint64_t)d_jint(o, "inodes", 0),
        .label = d_jstr(o, "label"),
        .uuid = us ? uuid : NULL,
        .from_dir = d_jstr(o, "from_dir"),
        .force = d_jbool(o, "force"),
        .fsync = d_jbool(o, "fsync"),
    };
    struct vmsnap_disk_entry *ents;
    if (entries_of(o, &ents, &co.n_entries) < 0)
        return vmsnap_err_set(err, ENOMEM, "disk create %s: out of memory", path);
    co.entries = ents;
    int rc = vmsnap_disk_create(path, &co, err);
    free(ents);
    if (rc < 0)
        return rc;
    struct vmsnap_disk_info info;
    if ((rc = vmsnap_disk_info(path, &info, err)) < 0)
        return rc;
    info_json(r, path, &info);
    return 0;
}

void r_disk_create(struct d_request *rq, struct d_response *rs)
{
    static const struct d_field f[] = {
        {"path", D_STR, true},
        {"size_bytes", D_INT, false},
        {"inodes", D_INT, false},
        {"label", D_STR, false},
        {"uuid", D_STR, false},
        {"from_dir", D_STR, false},
        {"force", D_BOOL, false},
        {"fsync", D_BOOL, false},
        {"entries", D_OBJ_ARRAY, false},
        {"deadline_seconds", D_INT, false},
        {0},
    };
    json_object *o = d_req_body(rq, rs, f);
    if (!o)
        return;
    if (d_req_path(rq, rs, o, "path", true) < 0 || d_req_path(rq, rs, o, "from_dir", false) < 0 ||
        entries_check(rq, rs, o) < 0) {
        json_object_put(o);
        return;
    }
    if (d_jint(o, "size_bytes", 0) < 0 || d_jint(o, "inodes", 0) < 0) {
        json_object_put(o);
        d_error_msg(rs, -D_EUSAGE, "size_bytes and inodes: not negative");
        return;
    }
    char target[4200];
    snprintf(target, sizeof(target), "path:%s", d_jstr(o, "path"));
    d_submit_body(rq, rs, "disk.create", target, 0, false, do_create, o);
}

static int do_clone(struct d_op *op, const struct d_config *cfg, const struct d_grant *g,
                    json_object *r, struct vmsnap_err *err)
{
    (void)g;
    (void)cfg;
    json_object *o = d_op_body(op);
    const char *src = d_jstr(o, "source_path"), *dst = d_jstr(o, "path");
    struct vmsnap_disk_clone_opts co = {
        .link = d_jbool(o, "link"),
        .new_uuid = d_jbool(o, "new_uuid"),
        .force = d_jbool(o, "force"),
        .direct = d_jbool(o, "direct"),
    };
    enum vmsnap_disk_clone_how how;
    int rc = vmsnap_disk_clone(src, dst, &co, &how, err);
    if (rc < 0)
        return rc;
    static const char *const names[] = {"link", "ficlone", "extents", "read-write", "direct"};
    json_object_object_add(r, "source_path", json_object_new_string(src));
    json_object_object_add(r, "path", json_object_new_string(dst));
    json_object_object_add(r, "method", json_object_new_string(names[how]));
    return 0;
}

void r_disk_clone(struct d_request *rq, struct d_response *rs)
{
    static const struct d_field f[] = {
        {"source_path", D_STR, true},
        {"path", D_STR, true},
        {"link", D_BOOL, false},
        {"new_uuid", D_BOOL, false},
        {"force", D_BOOL, false},
        {"direct", D_BOOL, false},
        {"deadline_seconds", D_INT, false},
        {0},
    };
    json_object *o = d_req_body(rq, rs, f);
    if (!o)
        return;
    if (d_req_path(rq, rs, o, "source_path", true) < 0 || d_req_path(rq, rs, o, "path", true) < 0) {
        json_object_put(o);
        return;
    }
    char target[4200];
    snprintf(target, sizeof(target), "path:%s", d_jstr(o, "path"));
    d_submit_body(rq, rs, "disk.clone", target, 0, false, do_clone, o);
}

void r_disk_info(struct d_request *rq, struct d_response *rs)
{
    char buf[4096];
    const char *p = d_query(rq, "path", buf, sizeof(buf));
    if (!p) {
        d_error_msg(rs, -D_EUSAGE, "disk info: ?path= is required");
        return;
    }
    json_object *o = json_object_new_object();
    json_object_object_add(o, "path", json_object_new_string(p));
    if (d_req_path(rq, rs, o, "path", true) < 0) {
        json_object_put(o);
        return;
    }
    struct vmsnap_disk_info info;
    struct vmsnap_err err = {0};
    int rc = vmsnap_disk_info(d_jstr(o, "path"), &info, &err);
    if (rc < 0) {
        d_error(rs, rc, &err, false);
    } else {
        rs->body = d_obj();
        info_json(rs->body, d_jstr(o, "path"), &info);
    }
    json_object_put(o);
}
