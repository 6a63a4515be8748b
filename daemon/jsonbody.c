/* SPDX-License-Identifier: Apache-2.0 */
/* Request bodies: one JSON object, every key known, every type as declared. A request is never
 * partly understood: a misspelt option is an error, not a default. */
#include "daemon.h"

#include <errno.h>
#include <string.h>

static bool type_ok(json_object *v, enum d_ftype t)
{
    switch (t) {
    case D_STR:
        return json_object_is_type(v, json_type_string);
    case D_INT:
        return json_object_is_type(v, json_type_int);
    case D_BOOL:
        return json_object_is_type(v, json_type_boolean);
    case D_OBJ_ARRAY:
    case D_STR_ARRAY:
        if (!json_object_is_type(v, json_type_array))
            return false;
        for (size_t i = 0; i < json_object_array_length(v); i++)
            if (!json_object_is_type(json_object_array_get_idx(v, i),
                                     t == D_STR_ARRAY ? json_type_string : json_type_object))
                return false;
        return true;
    }
    return false;
}

static const char *type_name(enum d_ftype t)
{
    static const char *const names[] = {"a string", "an integer", "a boolean",
                                        "an array of objects", "an array of strings"};
    return names[t];
}

int d_body_parse(const char *body, size_t len, const struct d_field *fields, json_object **out,
                 struct vmsnap_err *err)
{
    *out = NULL;
    if (len == 0) {
        body = "{}";
        len = 2;
    }
    if (memchr(body, '\0', len))
        return vmsnap_err_set(err, D_EUSAGE, "body: a NUL byte");
    json_tokener *tok = json_tokener_new_ex(8);
    if (!tok)
        return -ENOMEM;
    json_tokener_set_flags(tok, JSON_TOKENER_STRICT | JSON_TOKENER_VALIDATE_UTF8);
    json_object *o = json_tokener_parse_ex(tok, body, (int)len);
    enum json_tokener_error je = json_tokener_get_error(tok);
    size_t used = json_tokener_get_parse_end(tok);
    json_tokener_free(tok);
    if (!o || je != json_tokener_success) {
        json_object_put(o);
        return vmsnap_err_set(err, D_EUSAGE, "body: not JSON (%s)",
                              je == json_tokener_continue ? "cut short"
                                                          : json_tokener_error_desc(je));
    }
    for (; used < len; used++)
        if (!strchr(" \t\r\n", body[used])) {
            json_object_put(o);
            return vmsnap_err_set(err, D_EUSAGE, "body: bytes after the JSON object");
        }
    if (!json_object_is_type(o, json_type_object)) {
        json_object_put(o);
        return vmsnap_err_set(err, D_EUSAGE, "body: not a JSON object");
    }
    int rc = 0;
    json_object_object_foreach(o, key, val)
    {
        const struct d_field *f = fields;
        while (f && f->name && strcmp(f->name, key))
            f++;
        if (!f || !f->name) {
            rc = vmsnap_err_set(err, D_EUSAGE, "body: unknown field '%.64s'", key);
            break;
        }
        if (!type_ok(val, f->type)) {
            rc = vmsnap_err_set(err, D_EUSAGE, "body: '%s' must be %s", key, type_name(f->type));
            break;
        }
    }
    for (const struct d_field *f = fields; rc == 0 && f && f->name; f++)
        if (f->required && !json_object_object_get_ex(o, f->name, NULL))
            rc = vmsnap_err_set(err, D_EUSAGE, "body: '%s' is required", f->name);
    if (rc < 0) {
        json_object_put(o);
        return rc;
    }
    *out = o;
    return 0;
}

const char *d_jstr(json_object *o, const char *key)
{
    json_object *v;
    return json_object_object_get_ex(o, key, &v) && json_object_is_type(v, json_type_string)
               ? json_object_get_string(v)
               : NULL;
}

int64_t d_jint(json_object *o, const char *key, int64_t dflt)
{
    json_object *v;
    return json_object_object_get_ex(o, key, &v) && json_object_is_type(v, json_type_int)
               ? json_object_get_int64(v)
               : dflt;
}

bool d_jbool(json_object *o, const char *key)
{
    json_object *v;
    return json_object_object_get_ex(o, key, &v) && json_object_get_boolean(v);
}
