/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Parallel transfer of snapshot files and snapshot sets between a node and an object store
 * (include/vmsnap/store.h), overlapped with the image codec (include/vmsnap/image.h).
 *
 * Push: the codec encodes each file; its output is cut in order into parts of part_size bytes
 * that upload over `connections` streams while later ranges still compress. Bytes buffered for
 * upload and the encoder's own buffers are capped by max_memory together (the encoder waits). An
 * object that fits in one part is one PutObject. A directory (a snapshot set) goes to
 * <url>/<name>.zstd for every regular file, files in parallel and parts in parallel, then
 * <url>/manifest.json LAST (the commit marker). A set being replaced stays committed while the
 * push uploads (the objects of its names are held as unfinished uploads); its manifest is deleted
 * right before they are completed, so a half-replaced set is never visible as complete.
 *
 * Pull: the mirror. One suffix-range GET (size, footer, seek table; no HEAD), then groups of whole
 * frames (about 16 MiB) fetched over the connections and decoded in parallel into a sparse file
 * under a temporary name; objects without a seek table stream through the sequential decoder. A
 * set's manifest is read first and validated (plain names, sizes, the digest of every object:
 * tableSha256, or a whole-object sha256 from older manifests); files are renamed into place only
 * when all are complete and verified.
 *
 * With a base (opts.base) a push reuses the frames that did not change since the base: the
 * store copies them (S3 UploadPartCopy) into the new object, which stays standalone.
 *
 * The stored object is byte-identical for any connections, part size, store or base. Multipart
 * uploads that fail are aborted; the leftovers of a killed push are aborted by the next push to the
 * same key, or by vmsnap_xfer_gc().
 *
 * Thread safety: each call is independent and creates its own threads and store connections
 * (the S3 backend hands a new connection a warm one parked by an earlier call of the process:
 * store.h, "kept across stores"); calls given one vmsnap_xfer_budget share its bytes.
 */
#ifndef VMSNAP_XFER_H
#define VMSNAP_XFER_H

#include "vmsnap/common.h"
#include "vmsnap/image.h"
#include "vmsnap/store.h"

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define VMSNAP_XFER_DEFAULT_CONNECTIONS 8u
#define VMSNAP_XFER_DEFAULT_PART_SIZE (16ull << 20)
#define VMSNAP_XFER_DEFAULT_MAX_MEMORY (256ull << 20)
#define VMSNAP_XFER_MANIFEST "manifest.json"
#define VMSNAP_XFER_MANIFEST_MAX (4u << 20) /* a larger manifest is refused */
#define VMSNAP_XFER_MAX_FILES 4096u

/* How a set push stores a set (docs/transfer.md). Layered: immutable objects under names no
 * other push uses, a manifest (formatVersion 3) that names each file's chain of layers and is
 * the only object ever replaced, so a replace is one PUT; deltas over a parent set. Reference:
 * <url>/<name>.zstd and a manifest with snapshotFiles, which the reference system restores;
 * no layers, and a replace stores over the objects (a transaction of held uploads). */
enum vmsnap_xfer_layout {
    VMSNAP_LAYOUT_AUTO = 0, /* $VMSNAP_LAYOUT ("layered" or "reference"), else layered */
    VMSNAP_LAYOUT_LAYERED = 1,
    VMSNAP_LAYOUT_REFERENCE = 2,
};

#define VMSNAP_XFER_DEFAULT_MAX_DEPTH 8u
#define VMSNAP_XFER_DEFAULT_DELTA_MAX_PCT 75u

/* Options; zeroed means defaults. */
struct vmsnap_xfer_opts {
    enum vmsnap_xfer_layout layout; /* set push */
    /* layered set push: URL of a layered set in the same store whose files this push's files
     * are stored as deltas over (only the 4 KiB pages that differ, found through the parent's
     * page tables, without reading its images). A file the parent does not have, or whose
     * chain would get deeper than max_depth, gets a full layer; so does one whose delta comes
     * out larger than delta_max_pct of the chain's full image (it is encoded again, whole). A
     * parent that is missing or not
     * layered is a warning (an info when parent_implicit) and every file gets a full layer. */
    const char *parent;
    bool parent_implicit;
    unsigned max_depth;     /* layers in a chain at most; 0: 8 */
    unsigned delta_max_pct; /* 0: 75 */
    /* pull of a layered set from a remote store: the node-local object cache
     * (include/vmsnap/objcache.h): NULL/0 its defaults; no_cache: fetch everything */
    const char *cache_dir;
    uint64_t cache_size;
    bool no_cache;
    /* layered set push to a remote store: also keep every object it stores in that cache
     * (written through as it is uploaded), so a pull of the set on this node fetches nothing
     * (`vm suspend` sets it: the node that suspended a VM is the likeliest to resume it) */
    bool write_cache;
    unsigned connections; /* parallel streams (-j); 0: 8 */
    uint64_t part_size;   /* upload part size; 0: 16 MiB (>= 5 MiB for S3) */
    uint64_t max_memory;  /* cap on buffered parts/frame groups and a push's encoder buffers;
                           * 0: 256 MiB (a push passes it by ~three frames per file) */
    /* a budget shared live with other calls (vmsnap_xfer_budget_new); NULL: none */
    struct vmsnap_xfer_budget *budget;
    unsigned threads;    /* codec threads; 0: CPUs */
    uint64_t frame_size; /* codec frame size on push; 0: codec default */
    int level;           /* zstd level on push; 0: codec default */
    uint64_t max_size;   /* pull: cap on a file's logical size; 0: 64 TiB */
    bool no_fsync;       /* pull: skip fsync before renaming into place */
    bool set_only;       /* pull: a snapshot set or an error (no single object) */
    struct vmsnap_store_opts store;
    vmsnap_progress_fn progress; /* object bytes done / total known so far */
    void *progress_arg;
    /* push: URL of an earlier snapshot set (or object, for a file push) in the same store, e.g.
     * the one a VM was resumed from. Frames whose content did not change are copied by the store
     * from the base's objects (S3 UploadPartCopy; local: copy_file_range) instead of being
     * compressed and uploaded. A base that is missing or unusable is ignored (logged); one that
     * changes during the push makes that file go again without it. */
    const char *base;
    /* the base was chosen by the caller, not asked for by the user: one no file could use is
     * logged as info, not warned about */
    bool base_implicit;
};

/* A byte budget shared live by every call given it (vmsnap_xfer_opts.budget), e.g. by a
 * daemon's concurrent operations: their parts, frame groups, encoder buffers and kept buffers
 * are charged to it as they are taken and given back as they are freed, so one call alone may
 * use all of it and several share it as they go. A call waits while the budget is spent only
 * when it holds something of its own in flight (a call holding nothing takes what it needs:
 * every call progresses; the total may pass the budget by about one buffer per call, as a
 * call's own max_memory, which still caps each call). A call waiting for another's bytes
 * notices them within 100 ms. Thread-safe; free only when no call uses it. */
struct vmsnap_xfer_budget;
VMSNAP_API int vmsnap_xfer_budget_new(uint64_t bytes, struct vmsnap_xfer_budget **out,
                                      struct vmsnap_err *err);
VMSNAP_API void vmsnap_xfer_budget_free(struct vmsnap_xfer_budget *b);
/* the bytes charged now and the most charged at once since it was made */
VMSNAP_API void vmsnap_xfer_budget_stat(const struct vmsnap_xfer_budget *b, uint64_t *used,
                                        uint64_t *peak);

struct vmsnap_xfer_stats {
    uint64_t files;
    uint64_t logical;      /* sum of logical sizes */
    uint64_t populated;    /* sum of populated bytes */
    uint64_t object_bytes; /* the files' objects (a set's manifest not counted, as pull and ls */
                           /* count them) */
    uint64_t copied_bytes; /* push with a base: object bytes the store copied from it */
    uint64_t deltas;       /* layered push: files stored as a delta over the parent's */
    uint64_t cached_bytes; /* layered pull: object bytes read from the node's cache */
};

/* Can a push to `url` (of a snapshot set when `set`) start? The URL parses and, for the local
 * store, the deepest directory of the key that exists is a directory this process may write
 * (and the key itself, for a set, is a directory or nothing). For a set on S3 the store is
 * asked: a small push mark naming nothing is stored at the key and removed (two requests), so an
 * endpoint that does not answer, credentials it refuses and a bucket they cannot write in fail
 * here. For a caller about to do something costly first (vm suspend stops the VM). */
VMSNAP_API int vmsnap_xfer_check_dest(const char *url, bool set,
                                      const struct vmsnap_xfer_opts *opts, struct vmsnap_err *err);

/* Push the regular file or snapshot-set directory `path` to `url`. Errors name the file or
 * object; on failure no new object is visible at the file's key and no multipart upload is left;
 * a set push leaves no manifest of its own: a set it was replacing stays (failing before the
 * un-commit) or is put back when none of its objects was stored over yet. */
VMSNAP_API int vmsnap_xfer_push(const char *path, const char *url,
                                const struct vmsnap_xfer_opts *opts,
                                struct vmsnap_xfer_stats *stats, struct vmsnap_err *err);

/* Pull `url` (a snapshot set if <url>/manifest.json exists, else one object) to `path` (a
 * directory for a set, created 0700 if missing; a file otherwise). A prefix holding objects but
 * no manifest fails with "incomplete snapshot: no manifest at ...". On failure nothing new is
 * left at `path`. */
VMSNAP_API int vmsnap_xfer_pull(const char *url, const char *path,
                                const struct vmsnap_xfer_opts *opts,
                                struct vmsnap_xfer_stats *stats, struct vmsnap_err *err);

/* Write the set at `url` (layered, or any set pull reads) to `dest` in the reference layout
 * (<dest>/<name>.zstd and a manifest with snapshotFiles), which the reference system restores:
 * each file's chain is decoded into a temporary directory under `tmp_dir` (NULL: $TMPDIR, else
 * /var/tmp; it needs room for the set's populated bytes), pushed with the reference layout
 * (a replace of a set at `dest` is that layout's transaction), and removed. */
VMSNAP_API int vmsnap_xfer_export(const char *url, const char *dest, const char *tmp_dir,
                                  const struct vmsnap_xfer_opts *opts,
                                  struct vmsnap_xfer_stats *stats, struct vmsnap_err *err);

/* One snapshot set found by vmsnap_xfer_list(). `files`, `logical` and `object_bytes` come from
 * its manifest; `valid` is false (and the counts 0) if the manifest does not parse. */
struct vmsnap_xfer_set {
    const char *url;
    uint64_t files;
    uint64_t logical;
    uint64_t object_bytes;
    bool valid;
};
typedef int (*vmsnap_xfer_list_fn)(void *arg, const struct vmsnap_xfer_set *set);

/* Call `fn` for every snapshot set (every manifest.json) under the prefix `url`. */
VMSNAP_API int vmsnap_xfer_list(const char *url, const struct vmsnap_xfer_opts *opts,
                                vmsnap_xfer_list_fn fn, void *arg, struct vmsnap_err *err);

/* What vmsnap_xfer_remove() removed. */
struct vmsnap_rm_result {
    bool set;            /* a manifest was removed (a set) */
    bool object;         /* a single object was removed */
    unsigned objects;    /* a set's objects removed (the manifest's, and with force the others) */
    unsigned kept;       /* force: *.zstd objects under the prefix kept, not vmsnap images */
    unsigned uploads;    /* unfinished multipart uploads aborted */
    unsigned pushes;     /* marks of unfinished pushes removed */
    unsigned marks_kept; /* marks that cannot be read, kept without force (the call fails) */
    bool empty_dir;      /* local store: only an empty directory was there, and it was removed */
    char kept_key[512];  /* the first kept object's URL */
};

/* Delete the snapshot set at `url`: the manifest first (so the set is never half-visible),
 * then its objects. Without a manifest: -ENOENT, unless `force`, which deletes the *.zstd
 * objects directly under the prefix that are vmsnap images (sparse-extent magic at byte 0;
 * others are kept and counted) and aborts its multipart uploads; finding nothing to remove is
 * -ENOENT. A single object (no manifest, the key itself exists) is deleted only when it is a
 * snapshot image (vmsnap's or the reference's magic, or zstd's): anything else is -EINVAL.
 * The marks of unfinished pushes under the prefix go with the objects they name; one that
 * cannot be read is kept (its objects cannot be told) and the call fails naming it, unless
 * `force`. */
VMSNAP_API int vmsnap_xfer_remove(const char *url, bool force, const struct vmsnap_xfer_opts *opts,
                                  struct vmsnap_rm_result *res, struct vmsnap_err *err);

/* What vmsnap_xfer_gc() found: an unfinished multipart upload, or the mark of a set push that
 * did not finish (`<prefix>/vmsnap-push-<id>.json`: a push stores it before any object and
 * removes it once its manifest is committed, or after removing what it stored when it fails). */
enum vmsnap_gc_kind {
    VMSNAP_GC_UPLOAD,
    VMSNAP_GC_PUSH,
    VMSNAP_GC_OBJECT, /* an object of a layered set that no manifest names */
};

/* What vmsnap_xfer_gc() cleans. A push in progress has an unfinished upload and a mark too:
 * cleaning them fails that push (it reports so and stores nothing), so gc leaves those younger
 * than `older_than`. */
struct vmsnap_gc_opts {
    /* seconds: abort the uploads that started at least this long ago (by this node's clock; S3
     * signatures already need it within 15 minutes of the server's). 0: every upload, also one
     * whose start the store does not give (kept otherwise). */
    int64_t older_than;
    bool dry_run; /* abort nothing; report what would be */
    /* optional: called for each upload or push mark found under the prefix (`url`: the URL of
     * the upload's object, or of the mark: `s3://bucket/key`, or the local store's absolute
     * path), its size (objects; 0 for uploads and marks), its age in seconds (-1: unknown) and
     * whether gc cleans it (or would: dry run) */
    void (*report)(void *arg, enum vmsnap_gc_kind kind, const char *url, uint64_t size, int64_t age,
                   bool act);
    void *report_arg;
};

struct vmsnap_gc_result {
    unsigned aborted; /* unfinished uploads aborted (dry run: that would be) */
    unsigned pushes;  /* push marks removed, with the objects of theirs that no manifest names */
    unsigned objects; /* those objects (dry run: names; an object already gone counts too) */
    unsigned kept;    /* uploads and marks younger than older_than, or of unknown age */
    unsigned unknown_age; /* of those kept: of unknown age (the store does not say) */
    unsigned failed;      /* the store refused to remove them: the call fails, naming the first */
    unsigned unreachable; /* objects no manifest names, removed (dry run: that would be) */
    uint64_t unreachable_bytes;
};

/* Under the prefix `url`, clean what `g` selects (NULL: everything) of what pushes left: abort
 * unfinished multipart uploads (local store: remove the temporary files of interrupted uploads),
 * and for each old push mark, delete the objects it names that the prefix's manifest does not
 * (none is there: all of them; the manifest is that push's own: none), then the mark. A prefix
 * where any mark is young is left whole (a push may be running there). *res (if not NULL) gets
 * the counts, also on failure. */
VMSNAP_API int vmsnap_xfer_gc(const char *url, const struct vmsnap_gc_opts *g,
                              const struct vmsnap_xfer_opts *opts, struct vmsnap_gc_result *res,
                              struct vmsnap_err *err);

#ifdef __cplusplus
}
#endif
#endif
