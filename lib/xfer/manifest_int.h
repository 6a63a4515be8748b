/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Private: the snapshot-set manifest (manifest.json), the commit marker of a pushed set.
 *
 *   {"snapshotFiles": ["base-id", ...],          (the reference system's field)
 *    "formatVersion": 2, "tool": "vmsnap", "toolVersion": "0.1.0",
 *    "files": {"<name>": {"object": "<name>.zstd", "size": logical, "populated": bytes,
 *                         "objectSize": bytes, "tableSha256": "<hex>"}, ...}}
 *
 * The digest of an object with a seek table is "tableSha256": SHA-256 of its first 44 bytes
 * (header and info frame) followed by its seek table (the trailing skippable frame with the
 * footer). The table holds the XXH64 of every frame's compressed bytes, which a decoder checks,
 * so the digest covers every byte, and it can be computed for objects whose frames were copied
 * server-side. "sha256" (of the whole object) is accepted as well (older vmsnap manifests).
 *
 * A reference manifest has only snapshotFiles; then `detail` is false for every file.
 */
#ifndef VMSNAP_MANIFEST_INT_H
#define VMSNAP_MANIFEST_INT_H

#include "vmsnap/common.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct mf_file {
    char *name;
    bool detail; /* the fields below are known */
    uint64_t size;
    uint64_t populated;
    uint64_t object_size;
    char sha256[65];   /* hex digest: of the whole object, or tableSha256 (table_digest) */
    bool table_digest; /* sha256 holds the tableSha256 digest */
    uint64_t copied;   /* push only (not serialised): bytes the store copied from a base */
    /* push only (not serialised): the object's first bytes as pushed, for checking the stored
     * object after the commit without reading them back */
    uint8_t prefix[44];
    bool have_prefix;
};

struct manifest {
    struct mf_file *files;
    size_t n;
    int64_t format_version; /* 0 if absent */
    char push_id[33];       /* "pushId": which push wrote it (hex), "" if absent */
};

/* A plain file name: not empty, not "." or "..", no '/', no NUL (len given), no control bytes,
 * at most 255 bytes, not the manifest's own name. */
bool manifest_name_ok(const char *name, size_t len);

/* Parse and validate untrusted bytes. `where` names the manifest in errors; `max_size` caps
 * every logical size. On success the caller owns *m (manifest_fini). */
int manifest_parse(const char *buf, size_t len, const char *where, uint64_t max_size,
                   struct manifest *m, struct vmsnap_err *err);

/* Serialise (malloc'd, NUL-terminated) or NULL on ENOMEM. */
char *manifest_build(const struct manifest *m);

void manifest_fini(struct manifest *m);

/*
 * The push mark, `<prefix>/vmsnap-push-<pushId>.json`: stored before a set push stores any
 * object, removed after its manifest is committed (or after a failed push removed its objects).
 * A mark that stays says which objects a killed push may have left there, for `gc`:
 *
 *   {"vmsnapPush": 1, "pushId": "<32 hex>", "started": <Unix seconds>, "files": ["<name>", ...]}
 *   {"vmsnapPush": 2, ..., "replaces": ["<name>", ...]}
 *
 * (objects are "<name>.zstd", as in the manifest). "replaces" (absent when empty) names the files
 * of the set the push replaces that the push does not have: once that set is un-committed they
 * are dead too, and the push removes them after its commit.
 */
#define PUSH_MARK_PREFIX "vmsnap-push-"
#define PUSH_MARK_SUFFIX ".json"

struct push_mark {
    char push_id[33];
    int64_t started;
    char **names; /* "files" (the first nfiles), then "replaces" */
    size_t n, nfiles;
};

/* Serialise (malloc'd, NUL-terminated) or NULL on ENOMEM. */
char *push_mark_build(const char *push_id, int64_t started, const struct mf_file *files, size_t n,
                      char *const *replaces, size_t nr);
/* Parse and validate untrusted bytes (names as manifest_name_ok; the id must be `want_id`). On
 * success the caller owns *pm (push_mark_fini). */
int push_mark_parse(const char *buf, size_t len, const char *where, const char *want_id,
                    struct push_mark *pm, struct vmsnap_err *err);
void push_mark_fini(struct push_mark *pm);

#endif
