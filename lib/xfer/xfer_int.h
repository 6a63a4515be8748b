/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Private: the transfer module's one header. Its parts: the worker pool (xfer_pool.c), the
 * manifest and push-mark formats (manifest.c), and the context and shared state of the
 * operations (xfer_*.c, one file per operation: see each file's head).
 */
#ifndef VMSNAP_XFER_INT_H
#define VMSNAP_XFER_INT_H

#include "sys/crypto_dl.h"
#include "sys/sys.h"

#include "vmsnap/store.h"
#include "vmsnap/xfer.h"

#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---------------------------------------------------------------------------------------- */
/*
 * The transfer worker pool. N threads, each owning one store connection (one TCP
 * connection for S3) for its whole life, run tasks from a FIFO queue. A byte budget (max_memory)
 * bounds buffered parts and frame groups: producers acquire before allocating and block while
 * the budget is spent; a task releases when its buffer is freed. With a shared budget
 * (vmsnap_xfer_opts.budget) every charge goes to it too and waits also while it is spent, under
 * the same condition (this pool holds something that does not wait for its own encoders), so a
 * pool holding nothing always proceeds: no wait depends on another call.
 */
struct xtask {
    void (*run)(struct xtask *t, struct vmsnap_store_conn *c);
    struct xtask *next;
};

struct xpool {
    pthread_mutex_t mu;
    pthread_cond_t cv_task, cv_mem;
    struct xtask *head, *tail;
    bool stop;
    uint64_t mem_used, mem_cap, mem_peak;
    uint64_t enc_used;    /* of mem_used: the encoders' buffers (xpool_enc_acquire) */
    uint64_t fill_used;   /* of mem_used: part buffers being filled by a push (xpool_fill) */
    unsigned enc_waiting; /* encoders' acquires waiting */
    struct xbuf *cache;   /* freed buffers kept for reuse (xpool_buf_free) */
    uint64_t cached;      /* their bytes: mem_used + cached stays within mem_cap */
    unsigned n, nconns;
    pthread_t *tids;
    struct vmsnap_store_conn **conns;
    struct vmsnap_xfer_budget *shared; /* NULL: this call's cap only */
};

int xpool_init(struct xpool *p, struct vmsnap_store *st, unsigned n, uint64_t mem_cap,
               struct vmsnap_xfer_budget *shared, struct vmsnap_err *err);
/* Stop after the queued tasks ran, join, free the connections. */
void xpool_fini(struct xpool *p);
void xpool_submit(struct xpool *p, struct xtask *t);
/* Block until `bytes` fit in the budget, for a part or a frame group (a request larger than
 * the whole budget waits until no other part or group is held, so it always makes progress:
 * the encoders' buffers, which wait for these parts to be written, never hold it back). */
void xpool_mem_acquire(struct xpool *p, uint64_t bytes);
void xpool_mem_release(struct xpool *p, uint64_t bytes);
/* The same for an encoder's buffers (struct vmsnap_pack_mem): blocks while the budget is
 * spent and something is held that does not wait for the encoders themselves (anything but a
 * part being filled: that one waits for their output), until `stop(ctx)` turns true (asked
 * again at every release and xpool_kick); never blocks when `wait` is false. */
void xpool_enc_acquire(struct xpool *p, uint64_t bytes, bool wait, bool (*stop)(void *ctx),
                       void *ctx);
/* Charge `bytes` to the encoders only when xpool_enc_acquire would not wait and no encoder
 * waits; true when charged. */
bool xpool_enc_try_acquire(struct xpool *p, uint64_t bytes);
void xpool_enc_release(struct xpool *p, uint64_t bytes);
/* More is held than the budget allows, or an encoder waits for it: an encoder then gives back
 * what it would keep for its next range. */
bool xpool_over(struct xpool *p);
/* A part buffer (taken with xpool_mem_acquire) starts (`bytes` > 0) or stops (< 0) being
 * filled: encoders do not wait for it. */
void xpool_fill(struct xpool *p, int64_t bytes);
void xpool_kick(struct xpool *p);
/* A buffer of `len` bytes for a part or a frame group, taken after xpool_mem_acquire(len): a
 * freed one of about that size when the pool kept one, else a fresh anonymous mapping (not the
 * C heap, whose per-thread arenas keep freed memory: the process's memory then grew past the
 * budget). NULL when out of memory. */
void *xpool_buf_alloc(struct xpool *p, size_t len);
/* Give back a buffer of xpool_buf_alloc (before xpool_mem_release of its bytes): kept for the
 * next one while the bytes held and kept fit in the budget, else unmapped. NULL is ignored. */
void xpool_buf_free(struct xpool *p, void *buf);

/* ---------------------------------------------------------------------------------------- */
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
/* A layered set's (formatVersion 3) file is a chain of layer objects: the first a full image,
 * each later one a delta over the file as the layers before it leave it (docs/FORMAT.md). Keys
 * are the store's ("<set>/" LAYER_DIR "/<pushId>/<name>.zstd"), checked by layer_key_ok. */
struct mf_layer {
    char *key;
    uint64_t object_size;
    uint64_t size;      /* the image's logical size (totalSize) */
    uint64_t populated; /* bytes in the image's records */
    char sha256[65];    /* tableSha256 */
    bool delta;
    /* the page table of the file as this layer leaves it (key NULL: not known): a pull reads
     * the chain's tables to skip what newer layers replace */
    char *pages_key;
    uint64_t pages_size;
    char pages_sha256[65];
};

/* The page table of the file as its last layer leaves it (a ".pages" object: sha256 of the
 * whole object). key NULL: none. */
struct mf_pages {
    char *key;
    uint64_t object_size;
    char sha256[65];
};

struct mf_file {
    char *name;
    struct mf_layer *layers; /* formatVersion 3: the chain, oldest first (else NULL) */
    size_t nlayers;
    struct mf_pages pages;
    /* layered push only (not serialised): the parent's page table a delta is made against
     * (NULL: a full layer), and the table of the file as encoded (the encoder's output) */
    const struct vmsnap_pages *delta_parent;
    struct vmsnap_pages *pages_out;
    bool want_pages; /* ask the encoder for pages_out */
    /* layered push only: the node-cache fill the object is written through into (NULL: none);
     * tee_bad when a write to it failed (the caller aborts it) */
    struct vmsnap_objcache_fill *tee;
    bool tee_bad;
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
    int64_t format_version; /* 0 if absent; 3: a layered set */
    char push_id[33];       /* "pushId": which push wrote it (hex), "" if absent */
    char *parent;           /* formatVersion 3: "parent", the URL its deltas were made against */
    int64_t created;        /* formatVersion 3: Unix seconds of the push */
};

/* Layered sets (formatVersion 3, manifest_layers.c): objects are written once, under names no
 * other push uses, below the set's key; the manifest is the only object ever replaced. */
#define LAYER_DIR "vmsnap-objects"
#define PAGES_SUFFIX ".pages"
#define MAX_LAYERS 64u /* a manifest with a longer chain is refused */
/* A key a layered manifest may name: "[P/]" LAYER_DIR "/<hex id>/<plain name>(.zstd|.pages)",
 * no empty, "." or ".." component, at most PATH_MAX bytes. */
bool layer_key_ok(const char *key);
/* A non-negative JSON integer field; a 64-digit lowercase hex string (manifest.c). */
bool mf_get_u64(void *obj, const char *k, uint64_t *v);
bool mf_hex64(const char *s);
/* Parse the fields of a formatVersion 3 manifest (called by manifest_parse). */
int manifest_parse_layered(void *root, const char *where, uint64_t max_size, struct manifest *m,
                           struct vmsnap_err *err);
/* Serialise a layered manifest (malloc'd) or NULL on ENOMEM. */
char *manifest_build_layered(const struct manifest *m);

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
/* A set file's object is "<name>.zstd" (xfer_object_key). */
#define OBJECT_SUFFIX ".zstd"

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

/* ---------------------------------------------------------------------------------------- */
/* The operations' shared state (xfer_*.c).                                                  */

struct xfer {
    struct vmsnap_store *st;
    char *key;                     /* the URL's key in st ("": none) */
    struct vmsnap_store_conn *ctl; /* the caller's connection (xfer_conn), or NULL */
    bool pool_started;             /* pool runs (xfer_start_pool) */
    char *base_key;                /* opts.base as a key in st (NULL: none) */
    atomic_uint base_used;         /* files pushed with their base */
    atomic_bool base_why_set;      /* base_why holds why a file's base was not used */
    char base_why[320];
    struct xpool pool;
    struct vmsnap_xfer_opts o;
    pthread_mutex_t mu;
    pthread_cond_t cv_dec;
    unsigned decoding, max_decoding;
    uint64_t done, total;
    uint64_t cached_bytes; /* layered pull: object bytes read from the node's cache */
};

/* A source over an object for opening it (vmsnap_image_open) with ranged GETs: the first read
 * that ends at the object's end (the footer) fetches the last TAIL_READ bytes at once, so the
 * seek table read next is served from memory; an object no larger than that is fetched whole by
 * its first read, and a pull then decodes its frame group from that copy too. One GET instead of
 * three for a small file of a set, two instead of three for a large one. */
/* A store URL for messages and listings: a local key is a path (PATH_MAX), an S3 one at most
 * 1024 bytes after the bucket (1200 cut long local paths short, also in `ls` output) */
#define URL_BUF (PATH_MAX + 64)
#define TAIL_READ (64u << 10)
#define PRE_READ 64u /* covers the image header and info frame (44 bytes) */
struct tail_src {
    struct vmsnap_store_conn *c;
    const char *key;
    uint64_t size;
    uint8_t *buf; /* bytes [boff, boff + blen) of the object, or NULL */
    uint64_t boff;
    size_t blen;
    const uint8_t *pre; /* bytes [0, plen) of the object, or NULL */
    size_t plen;
};

struct leftover_ctx {
    const char *exact; /* abort uploads of this key only; NULL: every upload listed */
    const char *under; /* or: of this key and the keys under it ("K/..."), not "K1/..." */
    const char *in;    /* and only of keys directly in this prefix ("P/name", not "P/sub/x") */
    char *live_dir;    /* gc: the directory push_running_at last looked at, and its answer */
    bool live;
    struct vmsnap_store_conn *c;
    unsigned n;
    const struct vmsnap_gc_opts *gc; /* gc: its selection and report; NULL: abort every one */
    int64_t now;
    unsigned kept, unknown, failed, pushes, objects;
    unsigned unreachable; /* gc: unreachable objects removed, and their bytes */
    uint64_t unreachable_bytes;
    struct vmsnap_err first; /* the first refused abort or delete (gc fails with it), its key */
    char first_key[URL_BUF];
};

/* An object stored as a multipart upload not completed yet: a set push over an existing set
 * completes those of that set's names only once every file is uploaded, right before its
 * commit, so that a push failing before (a cancel, a store gone) has overwritten none of the
 * set's objects and can put its manifest back. */
struct deferred {
    char *upload_id; /* NULL: nothing pending */
    struct vmsnap_store_part *parts;
    uint32_t nparts;
};

/* The push marks found at a prefix when a push began (key and time): a killed push's, there
 * before this one, are not "another push meanwhile" to its restore. */
struct prior_marks {
    char **keys;
    int64_t *mtimes;
    size_t n, cap;
    size_t lpn; /* the length of the listed prefix ("P/"): marks directly in it count */
};

struct set_push {
    struct xfer *x;
    struct vmsnap_store_conn *ctl; /* the caller's connection */
    const char *dir;
    const char *prefix;
    const char *url;   /* the destination, for messages */
    char *mkey;        /* the set's manifest */
    int64_t mark_time; /* when the push began (its mark's "started") */
    bool had_old;      /* a set was there (or it could not be told) */
    bool late;         /* the set there is un-committed only once every file is uploaded */
    bool uncommitted;  /* the set there was un-committed */
    char push_id[33];
    char *mark_key;        /* the push mark (manifest.c), once it may be stored */
    struct mf_file *files; /* sorted by name (manifest order) */
    size_t *order;         /* largest first */
    size_t n, next;
    char **replaces; /* names of the set this push replaces that it does not have */
    size_t nr;
    /* The set this push replaces, as it was stored (NULL: none, or unreadable), and which of
     * this push's files have its names: until one of those is stored over (`overwrote`), a
     * failed push can put that set back whole. */
    char *old_raw;
    size_t old_raw_len;
    bool *in_old;
    struct mf_file *old_files; /* per file in_old: the old set's entry for that name */
    struct prior_marks prior;  /* the marks there when this push began */
    struct deferred *def;      /* per file: the upload of a file in_old, completed last */
    bool overwrote;            /* a completion of those was asked for */
    pthread_mutex_t mu;
    int rc;
    struct vmsnap_err err;
};

struct grp {
    uint64_t off, len;
    uint32_t f0, f1; /* frames [f0, f1] */
    uint8_t *buf;
    bool done;
};

struct down {
    struct xfer *x;
    char *key;
    char url[URL_BUF];
    const struct mf_file *mf; /* expected (NULL for a single object) */
    struct sys_atomic_file af;
    bool af_open;
    uint64_t osize;
    struct vmsnap_image *img;
    struct grp *g;
    uint32_t ng, next_hash;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    unsigned pending;
    int rc;
    struct vmsnap_err err;
    EVP_MD_CTX *sha;
    uint64_t hashed;
    struct tail_src tail; /* the object's last bytes, read while opening it */
    int start_rc;         /* what opening/dispatching returned (a set's pull finishes every file) */
    struct vmsnap_err open_err; /* the error of an open that ran on a pool thread */
    bool inited, opened, sequential;
    uint8_t *pre; /* the object's first PRE_READ bytes, fetched beside its tail */
    int pre_rc;
    bool pre_submitted, pre_done;
    struct vmsnap_image_stats stats;
    struct vmsnap_seqdec *seq;
    /* a layer over what earlier layers left in `ofd` (named `oname`), not a new file */
    bool overlay;
    int ofd;
    const char *oname;
    int fill_fd; /* > 0: the object's bytes are also written here (a cache entry being filled) */
    struct vmsnap_objcache_fill *fill; /* that entry: each group written out of the page cache */
    /* a chain applied newest first: pages already there are skipped (vmsnap_unpack_opts.under);
     * the file's size is not set */
    struct vmsnap_pagemask *under;
    /* data frames it returns false for are fetched but not decoded (vmsnap_unpack_opts) */
    bool (*want_frame)(void *arg, const struct vmsnap_frame_info *fi);
    void *want_arg;
};

/* A set's file opened on a pool thread (xfer_down_open), reported back through d->opened. */
struct open_task {
    struct xtask t;
    struct down *d;
    char dst[4352];
};

struct keys {
    char **v;
    size_t n, cap;
    const char *suffix; /* keep keys ending with this ("" = all) */
    const char *direct; /* keep only keys directly under this prefix (NULL = any depth) */
    bool whole_name;    /* the suffix is a whole last component */
};

/*
 * gc of push marks (manifest.c): keys "[P/]vmsnap-push-<32 hex>.json" under the prefix.
 * A push may be running at a prefix, or start there while gc works, writing objects of the very
 * names an old mark lists. So gc removes anything only from a prefix that is quiet: nothing under
 * it written for `older_than` (the store's own times, every key), no upload there active for that
 * long, every mark readable; and just before deleting it lists the prefix again and leaves it
 * alone if anything changed (a push starting meanwhile writes its mark first).
 */
struct mark_keys {
    struct keys k;
    const char *under;
};

struct prefix_uploads {
    struct vmsnap_store_conn *c;
    int64_t newest; /* the latest activity of an upload under the prefix (-1: none) */
    bool unknown;
    struct vmsnap_err err; /* why the listing stopped */
};

/* xfer_ctx.c */
void xfer_progress_add(struct xfer *x, uint64_t bytes, uint64_t total_add);
/* The operations' entry: xfer_open (the store, options and key, checked), then as each needs it
 * xfer_conn (x->ctl) and xfer_start_pool; xfer_close releases whatever of those is open. */
enum { XFER_KEY = 1 /* a key is needed */, XFER_PREFIX = 2 /* a local prefix must exist */ };
int xfer_open(struct xfer *x, const char *url, const struct vmsnap_xfer_opts *opts, unsigned flags,
              struct vmsnap_err *err);
int xfer_conn(struct xfer *x, struct vmsnap_err *err);
int xfer_start_pool(struct xfer *x, struct vmsnap_err *err);
void xfer_close(struct xfer *x);
char *xfer_join_key(const char *prefix, const char *name);
char *xfer_object_key(const char *prefix, const char *name);
bool xfer_task_skip(pthread_mutex_t *mu, const int *job_rc, int *rc, struct vmsnap_err *e);
int xfer_table_sha256(const struct vmsnap_image *img, char hex[65], struct vmsnap_err *err);
int xfer_delete_once(struct vmsnap_store_conn *c, const char *key, struct vmsnap_err *err);
/* The guarded deletes (the un-commit, the undo paths) are one attempt each, so that no back-off
 * sits between a check and its DELETE; they are retried as a whole, check and DELETE again, at
 * most GUARDED_ATTEMPTS times, sleeping *delay_ms (200 ms doubling) before each retry. */
#define GUARDED_ATTEMPTS 4
void xfer_guarded_backoff(unsigned *delay_ms);
void xfer_hex32(const unsigned char *md, char out[65]);
/* The SHA-256 of a buffer, in hex. */
int xfer_sha256_hex(const void *buf, size_t len, char hex[65], struct vmsnap_err *err);
int xfer_tail_pread(void *arg, void *buf, size_t len, uint64_t off, struct vmsnap_err *err);
int xfer_read_manifest(struct vmsnap_store_conn *c, const char *mkey, const char *murl,
                       uint64_t max_size, struct manifest *m, struct vmsnap_err *err);
const char *xfer_key_base(const char *key);
int xfer_key_exists(struct vmsnap_store_conn *c, const char *key, struct vmsnap_err *err);
int xfer_key_fits(const struct xfer *x, const char *key, struct vmsnap_err *err);
int xfer_read_small(struct vmsnap_store_conn *c, const char *key, const char *url, const char *what,
                    char **buf, size_t *len, bool *too_large, bool *two_gets,
                    struct vmsnap_err *err);
int xfer_read_manifest_x(struct vmsnap_store_conn *c, const char *mkey, const char *murl,
                         uint64_t max_size, struct manifest *m, char **raw, size_t *raw_len,
                         bool *unusable, struct vmsnap_err *err);

/* xfer_upload.c */
int xfer_push_fd(struct xfer *x, struct vmsnap_store_conn *ctl, int fd, const char *path,
                 const char *key, const char *base_key, struct mf_file *mf, struct deferred *def,
                 struct vmsnap_err *err);

/* xfer_leftover.c */
bool xfer_key_under(const char *under, const char *key);
int64_t xfer_age_of(const struct leftover_ctx *l, int64_t started);
void xfer_gc_report(const struct leftover_ctx *l, enum vmsnap_gc_kind kind, const char *key,
                    uint64_t size, int64_t age, bool act);
bool xfer_old_enough(const struct vmsnap_gc_opts *g, int64_t age);
void xfer_gc_failed(struct leftover_ctx *l, const char *key, const struct vmsnap_err *e);
int xfer_abort_leftover(void *arg, const char *key, const char *id, int64_t started);
int xfer_see_upload(void *arg, const char *key, const char *id, int64_t started);

/* xfer_marks.c */
void xfer_prior_marks_fini(struct prior_marks *p);
bool xfer_mark_name(const char *base, char id[33]);
int xfer_prefix_busy_but(struct vmsnap_store_conn *c, const char *lp, const char *mkey,
                         const char *own, const struct prior_marks *prior);
int xfer_prefix_busy(struct vmsnap_store_conn *c, const char *lp, const char *mkey,
                     const char *own);
int xfer_see_prior(void *arg, const char *key, uint64_t size, int64_t mtime);
/* After a commit: the earlier pushes' marks at `lp` that are provably dead, and what they name
 * that this push's set does not, removed (xfer_marks.c says when a mark is dead). */
void xfer_tidy_marks(const struct set_push *s, const char *lp);
int xfer_put_mark(struct vmsnap_store_conn *ctl, const struct set_push *s, int64_t started,
                  const char *url, struct vmsnap_err *err);
int xfer_read_mark(struct vmsnap_store_conn *c, const char *key, const char *murl,
                   struct push_mark *pm, struct vmsnap_err *err);

/* xfer_verify.c */
int xfer_check_object(struct xfer *x, struct vmsnap_store_conn *c, const char *key,
                      const struct mf_file *f, struct vmsnap_err *err);
int xfer_check_committed(struct xfer *x, const char *prefix, const char *mkey,
                         const struct manifest *m, const char *url, bool committed,
                         struct vmsnap_err *err);
int xfer_manifest_is(struct xfer *x, struct vmsnap_store_conn *c, const char *mkey, const char *id);
int xfer_manifest_same(struct xfer *x, struct vmsnap_store_conn *c, const char *mkey,
                       const struct set_push *s, struct vmsnap_err *err);
int xfer_held_intact(struct vmsnap_store_conn *ctl, const char *prefix, const struct set_push *s,
                     struct vmsnap_err *err);

/* xfer_set_undo.c */
/* After its commit: the replaced set's objects of names this push does not have go (each
 * guarded). True when none is left. */
bool xfer_remove_replaced(const struct set_push *s);
/* After a failure: the set it replaces stays or comes back, or what it stored goes (each delete
 * guarded); `uncommitted`: the set it replaces was un-committed. */
void xfer_push_failed(const struct set_push *s, bool uncommitted);

/* xfer_set_push.c */
/* The regular files of a snapshot-set directory, sorted by name; sizes hold st_size. */
int xfer_scan_set(const char *dir, struct mf_file **out, size_t *n, struct vmsnap_err *err);
/* 32 random hex digits. */
int xfer_new_push_id(char out[33], struct vmsnap_err *err);
/* qsort_r over indices into an array of manifest entries (the argument): largest first */
int xfer_cmp_size_desc(const void *a, const void *b, void *files);
int xfer_push_set(struct xfer *x, struct vmsnap_store_conn *ctl, const char *dir,
                  const char *prefix, const char *url, struct vmsnap_xfer_stats *stats,
                  struct vmsnap_err *err);

/* xfer_layers_push.c: a layered set's push (formatVersion 3) */
int xfer_push_layered(struct xfer *x, struct vmsnap_store_conn *ctl, const char *dir,
                      const char *prefix, const char *url, struct vmsnap_xfer_stats *stats,
                      struct vmsnap_err *err);
/* xfer_layers_pull.c: a layered set's pull into `dir` */
struct down;
int xfer_pull_layered(struct xfer *x, struct vmsnap_store_conn *ctl, const struct manifest *m,
                      const char *dir, struct down *ds, struct vmsnap_err *err);

/* xfer_layers_need.c: which layer of a chain gives which page (from the chain's page tables) */
struct layer_need {
    size_t n;        /* layers */
    uint64_t npages; /* the file's pages */
    uint64_t **bits; /* per layer: the pages it gives */
    uint64_t *pages; /* per layer: how many */
};
struct need_ref {
    const struct layer_need *need;
    size_t layer;
};
struct vmsnap_objcache;
/* The node's object cache for layered sets of a remote store (NULL: none, or not usable: a
 * warning), xfer_layers_pull.c. */
struct vmsnap_objcache *xfer_open_cache(const struct xfer *x);
int xfer_need(struct xfer *x, struct vmsnap_objcache *oc, struct vmsnap_store_conn *c,
              const struct mf_file *f, struct layer_need *n, struct vmsnap_err *err);
void xfer_need_free(struct layer_need *n);
bool xfer_need_frame(void *arg, const struct vmsnap_frame_info *fi);

/* xfer_push.c */
int xfer_layout_layered(const struct xfer *x, bool *layered, struct vmsnap_err *err);
bool xfer_local_same(const struct xfer *x, const char *key, const char *path, bool within);

/* xfer_download.c */
void xfer_down_init(struct down *d);
void xfer_down_prefetch(struct down *d);
int xfer_down_open(struct down *d, struct vmsnap_store_conn *c, const char *dst,
                   struct vmsnap_err *err);
int xfer_down_submit(struct down *d, struct vmsnap_err *err);
void xfer_down_open_run(struct xtask *t, struct vmsnap_store_conn *c);
int xfer_down_finish(struct down *d, int rc, struct vmsnap_err *err);
void xfer_down_free(struct down *d, bool keep);

/* xfer_ls.c */
int xfer_collect(void *arg, const char *key, uint64_t size, int64_t mtime);
void xfer_keys_free(struct keys *k);

/* xfer_gc_reach.c: the sweep of objects no manifest names */
int xfer_gc_layers(struct xfer *x, struct vmsnap_store_conn *c, const char *key,
                   struct leftover_ctx *l, struct vmsnap_err *err);

/* xfer_gc.c */
size_t xfer_dir_len(const char *key);
int xfer_collect_mark(void *arg, const char *key, uint64_t size, int64_t mtime);

#endif
