/* SPDX-License-Identifier: Apache-2.0 */
/* The local store backend through the store API (include/vmsnap/store.h): URLs and keys (bad
 * ones refused before anything is touched), put/get/get_tail/get_stream/head/delete/tidy/list,
 * objects replaced atomically with a new tag and mode 0600 under 0700 directories, links, FIFOs
 * and directories refused as objects; multipart uploads written out of order from several
 * connections at once, invisible until complete, aborted without a trace, listed as uploads
 * while they run; part copies guarded by the source's tag. */
#include "t.h"

#include "vmsnap/store.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static uint64_t seed = 7;
static struct vmsnap_store *st;
static struct vmsnap_store_conn *conn;
static char *base; /* the key of the test's directory in the store */

static uint8_t *random_buf(size_t len)
{
    uint8_t *b = malloc(len ? len : 1);
    REQUIRE(b);
    for (size_t i = 0; i < len; i++)
        b[i] = (uint8_t)t_rand(&seed);
    return b;
}

/* base + "/" + rel, in a static rotating buffer */
static const char *key(const char *rel)
{
    static char bufs[8][PATH_MAX];
    static int next;
    char *b = bufs[next++ % 8];
    snprintf(b, PATH_MAX, "%s/%s", base, rel);
    return b;
}

/* A key that outlives the next calls of key(): char NAME[] = base + "/" + REL */
#define KEY(name, rel)                                                                             \
    char name[PATH_MAX];                                                                           \
    snprintf(name, sizeof(name), "%s/%s", base, rel)

/* The file behind a key (the store's root is "/"). */
static const char *path_of(const char *k)
{
    static char bufs[4][PATH_MAX];
    static int next;
    char *b = bufs[next++ % 4];
    snprintf(b, PATH_MAX, "/%s", k);
    return b;
}

static bool get_equals(const char *k, const uint8_t *want, size_t len)
{
    uint8_t *got = malloc(len ? len : 1);
    REQUIRE(got);
    uint64_t size = 0;
    bool ok = vmsnap_store_head(conn, k, &size, NULL) == 0 && size == len &&
              vmsnap_store_get(conn, k, 0, len, got, NULL) == 0 && !memcmp(got, want, len);
    free(got);
    return ok;
}

/* Hidden entries (temporaries, uploads) in a directory. */
static int hidden_in(const char *dir)
{
    return t_sh("ls -A '%s' | grep -q '^\\.'", dir) == 0;
}

static void test_urls(void)
{
    struct vmsnap_store *s;
    char *k, url[PATH_MAX + 16], buf[PATH_MAX + 16];
    const char *dir = t_tmpdir();
    snprintf(url, sizeof(url), "%s/x/./y/../z/", dir);
    REQUIRE(vmsnap_store_open(url, NULL, &s, &k, NULL) == 0);
    CHECK(vmsnap_store_kind(s) == VMSNAP_STORE_LOCAL);
    char want[PATH_MAX + 16];
    snprintf(want, sizeof(want), "%s/x/z", dir);
    CHECKF(!strcmp(vmsnap_store_url(s, k, buf, sizeof(buf)), want), "url %s, want %s", buf, want);
    free(k);
    vmsnap_store_free(s);
    snprintf(url, sizeof(url), "file://%s/x/z", dir);
    REQUIRE(vmsnap_store_open(url, NULL, &s, &k, NULL) == 0);
    CHECK(!strcmp(vmsnap_store_url(s, k, buf, sizeof(buf)), want));
    free(k);
    vmsnap_store_free(s);
    /* a relative path is the working directory's */
    char cwd[PATH_MAX];
    REQUIRE(getcwd(cwd, sizeof(cwd)));
    REQUIRE(vmsnap_store_open("rel/a/../b", NULL, &s, &k, NULL) == 0);
    snprintf(want, sizeof(want), "%s/rel/b", strcmp(cwd, "/") ? cwd : "");
    CHECKF(!strcmp(vmsnap_store_url(s, k, buf, sizeof(buf)), want), "url %s, want %s", buf, want);
    free(k);
    vmsnap_store_free(s);

    static const struct {
        const char *url, *words;
    } bad[] = {
        {"", "empty URL"},
        {"file://relative/path", "file:///absolute"},
        {"s3:/bucket/key", "a mistyped URL"},
        {"s3:bucket/key", "a mistyped URL"},
        {"File:/x", "a mistyped URL"},
        {"gs:/b/k", "a mistyped URL"},
        {"http://host/x", "unsupported URL scheme"},
        {"ftp://host/x", "unsupported URL scheme"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct vmsnap_err e = {0};
        s = (struct vmsnap_store *)&e; /* set to NULL on failure */
        k = (char *)&e;
        CHECKF(vmsnap_store_open(bad[i].url, NULL, &s, &k, &e) == -EINVAL, "'%s' opened",
               bad[i].url);
        CHECKF(strstr(e.msg, bad[i].words), "'%s': message '%s'", bad[i].url, e.msg);
        CHECK(s == NULL && k == NULL);
    }
    /* a colon elsewhere is a path's */
    REQUIRE(vmsnap_store_open("./s3:ok/snap-2026-01-01T10:00", NULL, &s, &k, NULL) == 0);
    CHECK(strstr(vmsnap_store_url(s, k, buf, sizeof(buf)), "/s3:ok/snap-2026-01-01T10:00"));
    free(k);
    vmsnap_store_free(s);
}

static void test_bad_keys(void)
{
    static const char *const bad[] = {"a//b", "a/./b", "a/../b", "..", ".", "/abs", "a/", "a/.."};
    uint8_t b[4] = {1, 2, 3, 4};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char k[PATH_MAX];
        snprintf(k, sizeof(k), "%s/keys/%s", base, bad[i]);
        struct vmsnap_err e = {0};
        CHECKF(vmsnap_store_put(conn, k, b, 4, &e) == -EINVAL && strstr(e.msg, "bad object key"),
               "put '%s': %s", k, e.msg);
        uint64_t size;
        char *id = NULL;
        CHECK(vmsnap_store_get(conn, k, 0, 4, b, NULL) == -EINVAL);
        CHECK(vmsnap_store_head(conn, k, &size, NULL) == -EINVAL);
        CHECK(vmsnap_store_delete(conn, k, NULL) == -EINVAL);
        CHECK(vmsnap_store_mpu_create(conn, k, &id, NULL) == -EINVAL && id == NULL);
        CHECK(vmsnap_store_mpu_part_copy(conn, key("keys/ok.zstd"), ".ok.zstd.mpu-x", 1, 0, k, "t",
                                         0, 4, NULL, NULL) == -EINVAL);
    }
    CHECK(vmsnap_store_put(conn, NULL, b, 4, NULL) == -EINVAL);
    CHECKF(!t_exists(path_of(key("keys"))), "a refused key made %s", path_of(key("keys")));
}

static int stream_cmp(void *arg, const void *buf, size_t len, struct vmsnap_err *err)
{
    (void)err;
    uint8_t **pos = arg;
    if (memcmp(*pos, buf, len))
        return -EBADMSG;
    *pos += len;
    return 0;
}

static void test_objects(void)
{
    size_t len = (3u << 20) + 5; /* past get_stream's 1 MiB reads */
    uint8_t *data = random_buf(len);
    KEY(k, "o/a/b/obj.zstd");
    REQUIRE(vmsnap_store_put(conn, k, data, len, NULL) == 0);
    struct stat sb;
    REQUIRE(stat(path_of(k), &sb) == 0);
    CHECKF((sb.st_mode & 0777) == 0600, "object mode %o", (unsigned)(sb.st_mode & 0777));
    REQUIRE(stat(path_of(key("o/a")), &sb) == 0);
    CHECKF((sb.st_mode & 0777) == 0700, "directory mode %o", (unsigned)(sb.st_mode & 0777));
    CHECK(!hidden_in(path_of(key("o/a/b"))));
    CHECK(get_equals(k, data, len));
    uint8_t part[1000];
    CHECK(vmsnap_store_get(conn, k, 123457, sizeof(part), part, NULL) == 0 &&
          !memcmp(part, data + 123457, sizeof(part)));
    struct vmsnap_err e = {0};
    CHECK(vmsnap_store_get(conn, k, len - 10, 20, part, &e) == -EIO && strstr(e.msg, "short"));
    CHECK(vmsnap_store_get(conn, k, len + 10, 0, part, NULL) == 0); /* nothing asked */
    size_t got = 1;
    uint64_t size = 1;
    CHECK(vmsnap_store_get_tail(conn, k, sizeof(part), part, &got, &size, NULL) == 0 &&
          got == sizeof(part) && size == len && !memcmp(part, data + len - sizeof(part), got));
    uint8_t *pos = data;
    CHECK(vmsnap_store_get_stream(conn, k, stream_cmp, &pos, NULL) == 0 && pos == data + len);

    /* replaced whole, with a new tag; the tag is stable while the object is */
    char t1[VMSNAP_STORE_ETAG_MAX], t2[VMSNAP_STORE_ETAG_MAX], t3[VMSNAP_STORE_ETAG_MAX];
    REQUIRE(vmsnap_store_head_etag(conn, k, &size, t1, NULL) == 0);
    REQUIRE(vmsnap_store_head_etag(conn, k, &size, t2, NULL) == 0);
    CHECK(!strcmp(t1, t2));
    uint8_t *other = random_buf(5000);
    REQUIRE(vmsnap_store_put(conn, k, other, 5000, NULL) == 0);
    CHECK(get_equals(k, other, 5000));
    REQUIRE(vmsnap_store_head_etag(conn, k, &size, t3, NULL) == 0);
    CHECK(size == 5000 && strcmp(t1, t3));
    CHECK(!hidden_in(path_of(key("o/a/b"))));
    /* a tail longer than the object: all of it */
    uint8_t *tail = malloc(8000);
    REQUIRE(tail);
    CHECK(vmsnap_store_get_tail(conn, k, 8000, tail, &got, &size, NULL) == 0 && got == 5000 &&
          size == 5000 && !memcmp(tail, other, 5000));
    /* a control object (not *.zstd) goes through its own temporary: the same visible result */
    KEY(mk, "o/a/b/manifest.json");
    REQUIRE(vmsnap_store_put(conn, mk, "{}", 2, NULL) == 0);
    CHECK(get_equals(mk, (const uint8_t *)"{}", 2) && !hidden_in(path_of(key("o/a/b"))));
    /* empty */
    KEY(ek, "o/empty.zstd");
    REQUIRE(vmsnap_store_put(conn, ek, "", 0, NULL) == 0);
    got = size = 9;
    CHECK(vmsnap_store_get_tail(conn, ek, 100, tail, &got, &size, NULL) == 0 && got == 0 &&
          size == 0);
    CHECK(vmsnap_store_get_tail(conn, ek, 0, tail, &got, &size, NULL) == -EINVAL);

    /* what is not an object */
    e = (struct vmsnap_err){0};
    CHECK(vmsnap_store_head(conn, key("o/missing.zstd"), &size, &e) == -ENOENT &&
          strstr(e.msg, "no such object"));
    CHECK(vmsnap_store_get(conn, key("o/missing.zstd"), 0, 1, part, NULL) == -ENOENT);
    CHECK(vmsnap_store_get(conn, key("o/a/b/obj.zstd/below"), 0, 1, part, NULL) == -ENOENT);
    CHECK(vmsnap_store_head(conn, key("o/a"), &size, NULL) == -ENOENT); /* a directory */
    REQUIRE(symlink(path_of(k), path_of(key("o/link.zstd"))) == 0);
    e = (struct vmsnap_err){0};
    CHECK(vmsnap_store_get(conn, key("o/link.zstd"), 0, 1, part, &e) == -EINVAL &&
          strstr(e.msg, "symbolic link"));
    REQUIRE(mkfifo(path_of(key("o/fifo.zstd")), 0600) == 0);
    e = (struct vmsnap_err){0};
    CHECK(vmsnap_store_get_tail(conn, key("o/fifo.zstd"), 10, part, &got, &size, &e) == -EINVAL &&
          strstr(e.msg, "not a regular file"));

    /* delete: the object goes; a missing one is no error; a directory is not an object */
    REQUIRE(vmsnap_store_delete(conn, k, NULL) == 0);
    CHECK(!t_exists(path_of(k)));
    CHECK(vmsnap_store_delete(conn, k, NULL) == 0);
    CHECK(vmsnap_store_delete(conn, key("o/a"), NULL) == -EISDIR && t_exists(path_of(key("o/a"))));
    /* tidy drops an emptied directory, never one that holds something */
    vmsnap_store_tidy(conn, key("o/a/b"));
    CHECK(t_exists(path_of(key("o/a/b")))); /* the manifest is there */
    REQUIRE(vmsnap_store_delete(conn, mk, NULL) == 0);
    vmsnap_store_tidy(conn, key("o/a/b"));
    CHECK(!t_exists(path_of(key("o/a/b"))) && t_exists(path_of(key("o/a"))));
    free(tail);
    free(other);
    free(data);
}

struct listed {
    char keys[16][PATH_MAX];
    uint64_t sizes[16];
    int n, stop_at;
};

static int on_obj(void *arg, const char *k, uint64_t size, int64_t mtime)
{
    struct listed *l = arg;
    if (l->n == l->stop_at)
        return -ECANCELED;
    REQUIRE(l->n < 16);
    snprintf(l->keys[l->n], PATH_MAX, "%s", k + strlen(base) + 1);
    l->sizes[l->n++] = size;
    CHECK(mtime > 0 && mtime <= (int64_t)time(NULL) + 1);
    return 0;
}

static bool listed_has(const struct listed *l, const char *rel, uint64_t size)
{
    for (int i = 0; i < l->n; i++)
        if (!strcmp(l->keys[i], rel) && l->sizes[i] == size)
            return true;
    return false;
}

struct uploads {
    char keys[8][PATH_MAX], ids[8][300];
    int64_t started[8];
    int n;
};

static int on_upload(void *arg, const char *k, const char *id, int64_t started)
{
    struct uploads *u = arg;
    REQUIRE(u->n < 8);
    snprintf(u->keys[u->n], PATH_MAX, "%s", k + strlen(base) + 1);
    snprintf(u->ids[u->n], sizeof(u->ids[0]), "%s", id);
    u->started[u->n++] = started;
    return 0;
}

static void test_list(void)
{
    const char *names[] = {"l/x.zstd", "l/xx.zstd", "l/y.zstd", "l/sub/z.zstd", "lz/w.zstd"};
    for (size_t i = 0; i < 5; i++)
        REQUIRE(vmsnap_store_put(conn, key(names[i]), "abcdefgh", i + 1, NULL) == 0);
    REQUIRE(t_sh("echo h >'%s/.hidden'", path_of(key("l"))) == 0);
    char *id = NULL;
    REQUIRE(vmsnap_store_mpu_create(conn, key("l/up.zstd"), &id, NULL) == 0);

    struct listed l = {.stop_at = -1};
    REQUIRE(vmsnap_store_list(conn, key("l/"), on_obj, &l, NULL) == 0);
    CHECKF(l.n == 4, "%d objects under l/", l.n);
    CHECK(listed_has(&l, "l/x.zstd", 1) && listed_has(&l, "l/xx.zstd", 2) &&
          listed_has(&l, "l/y.zstd", 3) && listed_has(&l, "l/sub/z.zstd", 4));
    /* a prefix is a prefix of keys, not a directory */
    l = (struct listed){.stop_at = -1};
    REQUIRE(vmsnap_store_list(conn, key("l/x"), on_obj, &l, NULL) == 0);
    CHECK(l.n == 2 && listed_has(&l, "l/x.zstd", 1) && listed_has(&l, "l/xx.zstd", 2));
    l = (struct listed){.stop_at = -1};
    REQUIRE(vmsnap_store_list(conn, key("l"), on_obj, &l, NULL) == 0);
    CHECK(l.n == 5 && listed_has(&l, "lz/w.zstd", 5));
    l = (struct listed){.stop_at = -1};
    CHECK(vmsnap_store_list(conn, key("nothing/"), on_obj, &l, NULL) == 0 && l.n == 0);
    /* the callback stops the listing with its value */
    l = (struct listed){.stop_at = 1};
    CHECK(vmsnap_store_list(conn, key("l/"), on_obj, &l, NULL) == -ECANCELED && l.n == 1);

    struct uploads u = {0};
    time_t now = time(NULL);
    REQUIRE(vmsnap_store_list_uploads(conn, key("l/"), on_upload, &u, NULL) == 0);
    CHECKF(u.n == 1, "%d uploads", u.n);
    CHECK(!strcmp(u.keys[0], "l/up.zstd") && !strcmp(u.ids[0], id) && u.started[0] >= now - 5 &&
          u.started[0] <= now + 1);
    REQUIRE(vmsnap_store_mpu_abort(conn, key("l/up.zstd"), id, NULL) == 0);
    u = (struct uploads){0};
    REQUIRE(vmsnap_store_list_uploads(conn, key("l/"), on_upload, &u, NULL) == 0);
    CHECK(u.n == 0);
    free(id);
}

/* Parts of one upload from several connections at once, in reverse order. */
struct part_job {
    const char *key, *id;
    const uint8_t *data;
    size_t part, nparts;
    int rc;
    struct vmsnap_store_part out;
};

#define PART (256u << 10)

static void *put_part(void *arg)
{
    struct part_job *j = arg;
    struct vmsnap_store_conn *c;
    j->rc = vmsnap_store_conn_new(st, &c, NULL);
    if (j->rc == 0) {
        j->rc = vmsnap_store_mpu_part(c, j->key, j->id, (uint32_t)(j->part + 1), j->part * PART,
                                      j->data + j->part * PART, PART, &j->out, NULL);
        vmsnap_store_conn_free(c);
    }
    return NULL;
}

static void test_multipart(void)
{
    enum { N = 6 };
    uint8_t *data = random_buf(N * PART);
    KEY(k, "m/obj.zstd");
    char *id = NULL;
    REQUIRE(vmsnap_store_mpu_create(conn, k, &id, NULL) == 0);
    CHECKF(!strncmp(id, ".obj.zstd.mpu-", 14) && !strchr(id, '/'), "upload id '%s'", id);
    pthread_t th[N];
    struct part_job jobs[N];
    for (int i = N - 1; i >= 0; i--) {
        jobs[i] = (struct part_job){.key = k, .id = id, .data = data, .part = (size_t)i};
        REQUIRE(pthread_create(&th[i], NULL, put_part, &jobs[i]) == 0);
    }
    struct vmsnap_store_part parts[N];
    for (int i = 0; i < N; i++) {
        pthread_join(th[i], NULL);
        CHECKF(jobs[i].rc == 0, "part %d: %d", i + 1, jobs[i].rc);
        CHECK(jobs[i].out.number == (uint32_t)i + 1);
        parts[i] = jobs[i].out;
    }
    /* not an object before its completion */
    uint64_t size;
    CHECK(vmsnap_store_head(conn, k, &size, NULL) == -ENOENT);
    struct listed l = {.stop_at = -1};
    REQUIRE(vmsnap_store_list(conn, key("m/"), on_obj, &l, NULL) == 0);
    CHECK(l.n == 0);
    REQUIRE(vmsnap_store_mpu_complete(conn, k, id, parts, N, NULL) == 0);
    CHECK(get_equals(k, data, N * PART));
    CHECK(!hidden_in(path_of(key("m"))));
    struct uploads u = {0};
    REQUIRE(vmsnap_store_list_uploads(conn, key("m/"), on_upload, &u, NULL) == 0);
    CHECK(u.n == 0);
    /* a completed upload is gone: its parts and completion fail, its abort is no error */
    struct vmsnap_err e = {0};
    CHECK(vmsnap_store_mpu_part(conn, k, id, 1, 0, data, 10, NULL, &e) == -ENOENT &&
          strstr(e.msg, "no longer exists"));
    CHECK(vmsnap_store_mpu_abort(conn, k, id, NULL) == 0);
    free(id);

    /* aborted: nothing stays, the object there before is untouched */
    REQUIRE(vmsnap_store_mpu_create(conn, k, &id, NULL) == 0);
    REQUIRE(vmsnap_store_mpu_part(conn, k, id, 1, 0, "zzzz", 4, NULL, NULL) == 0);
    CHECK(hidden_in(path_of(key("m"))));
    REQUIRE(vmsnap_store_mpu_abort(conn, k, id, NULL) == 0);
    CHECK(!hidden_in(path_of(key("m"))) && get_equals(k, data, N * PART));
    CHECK(vmsnap_store_mpu_part(conn, k, id, 1, 0, "zzzz", 4, NULL, NULL) == -ENOENT);
    CHECK(vmsnap_store_mpu_abort(conn, k, id, NULL) == 0);
    /* an id that is not an upload of this key is refused, whatever it names */
    e = (struct vmsnap_err){0};
    CHECK(vmsnap_store_mpu_part(conn, k, "../../etc/passwd", 1, 0, "x", 1, NULL, &e) == -EINVAL &&
          strstr(e.msg, "bad upload id"));
    CHECK(vmsnap_store_mpu_abort(conn, k, ".other.zstd.mpu-abcdef", NULL) == -EINVAL);
    CHECK(vmsnap_store_mpu_complete(conn, k, "obj.zstd", NULL, 0, NULL) == -EINVAL);
    CHECK(vmsnap_store_mpu_part(conn, k, id, 0, 0, "x", 1, NULL, NULL) == -EINVAL);
    CHECK(vmsnap_store_mpu_part(conn, k, id, VMSNAP_STORE_MAX_PARTS + 1, 0, "x", 1, NULL, NULL) ==
          -EINVAL);
    free(id);
    id = NULL;
    /* an upload to where a directory is fails at once */
    CHECK(vmsnap_store_mpu_create(conn, key("m"), &id, NULL) < 0);
    free(data);
}

static void test_part_copy(void)
{
    enum { SZ = 1 << 20 };
    uint8_t *src = random_buf(SZ), *own = random_buf(SZ / 2);
    KEY(sk, "c/src.zstd");
    KEY(dk, "c/dst.zstd");
    REQUIRE(vmsnap_store_put(conn, sk, src, SZ, NULL) == 0);
    char tag[VMSNAP_STORE_ETAG_MAX];
    uint64_t size;
    REQUIRE(vmsnap_store_head_etag(conn, sk, &size, tag, NULL) == 0);
    char *id = NULL;
    REQUIRE(vmsnap_store_mpu_create(conn, dk, &id, NULL) == 0);
    struct vmsnap_store_part parts[2];
    /* dst = own[0, SZ/2) + src[SZ/4, SZ/4 + SZ/2) */
    CHECK(vmsnap_store_mpu_part(conn, dk, id, 1, 0, own, SZ / 2, &parts[0], NULL) == 0);
    CHECK(vmsnap_store_mpu_part_copy(conn, dk, id, 2, SZ / 2, sk, tag, SZ / 4, SZ / 2, &parts[1],
                                     NULL) == 0 &&
          parts[1].number == 2);
    struct vmsnap_err e = {0};
    CHECK(vmsnap_store_mpu_part_copy(conn, dk, id, 3, SZ, sk, tag, SZ / 2, SZ / 2 + 1, NULL, &e) ==
              -EINVAL &&
          strstr(e.msg, "past its end"));
    CHECK(vmsnap_store_mpu_part_copy(conn, dk, id, 3, SZ, sk, tag, 0, 0, NULL, NULL) == -EINVAL);
    REQUIRE(vmsnap_store_mpu_complete(conn, dk, id, parts, 2, NULL) == 0);
    uint8_t *want = malloc(SZ);
    REQUIRE(want);
    memcpy(want, own, SZ / 2);
    memcpy(want + SZ / 2, src + SZ / 4, SZ / 2);
    CHECK(get_equals(dk, want, SZ));
    free(id);
    /* the source replaced since its tag was taken: refused, nothing copied */
    REQUIRE(vmsnap_store_put(conn, sk, own, SZ / 2, NULL) == 0);
    REQUIRE(vmsnap_store_mpu_create(conn, dk, &id, NULL) == 0);
    e = (struct vmsnap_err){0};
    CHECK(vmsnap_store_mpu_part_copy(conn, dk, id, 1, 0, sk, tag, 0, SZ / 4, NULL, &e) == -ESTALE &&
          strstr(e.msg, "the source changed"));
    REQUIRE(vmsnap_store_mpu_abort(conn, dk, id, NULL) == 0);
    CHECK(get_equals(dk, want, SZ));
    free(id);
    free(want);
    free(own);
    free(src);
}

int main(void)
{
    char url[PATH_MAX];
    snprintf(url, sizeof(url), "%s/store", t_tmpdir());
    REQUIRE(vmsnap_store_open(url, NULL, &st, &base, NULL) == 0);
    REQUIRE(vmsnap_store_conn_new(st, &conn, NULL) == 0);
    test_urls();
    test_bad_keys();
    test_objects();
    test_list();
    test_multipart();
    test_part_copy();
    vmsnap_store_conn_free(conn);
    vmsnap_store_free(st);
    free(base);
    return t_done();
}
