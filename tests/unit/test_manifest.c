/* SPDX-License-Identifier: Apache-2.0 */
/* The set manifest and the push mark (lib/xfer/manifest.c): what is built parses back to the
 * same fields (random sets of many files, both digest kinds, the push id); hostile bytes are
 * refused with an error naming the manifest and nothing left owned by the caller: names that
 * would leave the destination or hide there, duplicates, impossible or capped sizes, bad
 * digests, a format of another version, trailing bytes, truncation, nesting and size past the
 * limits. A push mark round-trips its files and the names it replaces; a mark of another push,
 * version or shape is refused. */
#include "xfer/xfer_int.h"
#include "t.h"

#include "vmsnap/xfer.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define Z64 "0000000000000000000000000000000000000000000000000000000000000000"
#define CAP (1ull << 40)

static uint64_t seed = 21;

static void rand_hex(char out[65])
{
    static const char hex[] = "0123456789abcdef";
    for (int i = 0; i < 64; i++)
        out[i] = hex[t_rand(&seed) % 16];
    out[64] = '\0';
}

/* A name of 1..max bytes drawn from characters a plain file name may hold (no leading '.'). */
static char *rand_name(size_t max)
{
    static const char ok[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.+";
    size_t n = 1 + t_rand(&seed) % max;
    char *s = malloc(n + 1);
    REQUIRE(s);
    for (size_t i = 0; i < n; i++)
        s[i] = ok[t_rand(&seed) % (i ? sizeof(ok) - 1 : sizeof(ok) - 3)]; /* not '.' first */
    s[n] = '\0';
    return s;
}

static bool has_name(const struct manifest *m, size_t upto, const char *name)
{
    for (size_t i = 0; i < upto; i++)
        if (!strcmp(m->files[i].name, name))
            return true;
    return false;
}

static void test_names(void)
{
    CHECK(manifest_name_ok("memory-ranges", 13));
    CHECK(manifest_name_ok("a", 1) && manifest_name_ok("state.json", 10));
    CHECK(manifest_name_ok("x.", 2) && manifest_name_ok("h\xc3\xa9llo", 6)); /* UTF-8 is bytes */
    char n255[256], n256[257];
    memset(n255, 'n', 255);
    n255[255] = '\0';
    memset(n256, 'n', 256);
    n256[256] = '\0';
    CHECK(manifest_name_ok(n255, 255));
    CHECK(!manifest_name_ok(n256, 256));
    const char *bad[] = {"",     ".",     "..",      ".bashrc",       ".vmsnap-pull.1.x",
                         "a/b",  "/abs",  "a/",      "manifest.json", "a\nb",
                         "a\tb", "a\x7f", "\x1b[31m"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        CHECKF(!manifest_name_ok(bad[i], strlen(bad[i])), "'%s' taken as a plain name", bad[i]);
    CHECK(!manifest_name_ok("a\0b", 3));           /* the length given counts the NUL */
    CHECK(manifest_name_ok("manifest.json2", 14)); /* only the manifest's own name */
    CHECK(!manifest_name_ok("manifest.json", 13) && manifest_name_ok("manifest.jso", 12));
}

/* Random sets: build, parse, compare every field; then the parsed set built again gives the
 * same bytes (nothing is lost or added by a round trip). */
static void test_round_trip(void)
{
    for (int round = 0; round < 40; round++) {
        struct manifest m = {0};
        size_t n = 1 + t_rand(&seed) % (round < 35 ? 20 : 600);
        m.files = calloc(n, sizeof(*m.files));
        REQUIRE(m.files);
        while (m.n < n) {
            struct mf_file *f = &m.files[m.n];
            f->name = rand_name(round % 5 == 0 ? 255 : 24);
            if (has_name(&m, m.n, f->name) || !manifest_name_ok(f->name, strlen(f->name))) {
                free(f->name);
                continue;
            }
            f->detail = true;
            f->size = t_rand(&seed) % (1ull << (t_rand(&seed) % 41)); /* < CAP */
            f->populated = f->size ? t_rand(&seed) % (f->size + 1) : 0;
            f->object_size = 1 + t_rand(&seed) % (f->size + 4096);
            f->table_digest = t_rand(&seed) & 1;
            rand_hex(f->sha256);
            m.n++;
        }
        if (round & 1)
            snprintf(m.push_id, sizeof(m.push_id), "%016llx%016llx",
                     (unsigned long long)t_rand(&seed), (unsigned long long)t_rand(&seed));
        char *js = manifest_build(&m);
        REQUIRE(js);
        struct manifest p;
        struct vmsnap_err e = {0};
        int rc = manifest_parse(js, strlen(js), "m", CAP, &p, &e);
        CHECKF(rc == 0, "round %d: %s", round, e.msg);
        if (rc == 0) {
            CHECK(p.n == m.n && p.format_version == 2 && !strcmp(p.push_id, m.push_id));
            for (size_t i = 0; i < m.n && i < p.n; i++) {
                const struct mf_file *a = &m.files[i], *b = &p.files[i];
                CHECKF(!strcmp(a->name, b->name) && b->detail && a->size == b->size &&
                           a->populated == b->populated && a->object_size == b->object_size &&
                           a->table_digest == b->table_digest && !strcmp(a->sha256, b->sha256),
                       "round %d file %zu (%s) differs after the round trip", round, i, a->name);
            }
            char *again = manifest_build(&p);
            REQUIRE(again);
            CHECKF(!strcmp(js, again), "round %d: built again, the manifest differs", round);
            free(again);
            /* the cap is on every file's logical size: the largest one is over a cap below it */
            uint64_t max = 0;
            for (size_t i = 0; i < m.n; i++)
                max = m.files[i].size > max ? m.files[i].size : max;
            struct manifest q;
            if (max > 0) {
                e = (struct vmsnap_err){0};
                CHECK(manifest_parse(js, strlen(js), "m", max - 1, &q, &e) == -EFBIG &&
                      strstr(e.msg, "--max-size") && q.files == NULL);
            }
            CHECK(manifest_parse(js, strlen(js), "m", max, &q, NULL) == 0);
            manifest_fini(&q);
            manifest_fini(&p);
            CHECK(p.files == NULL && p.n == 0);
        }
        free(js);
        for (size_t i = 0; i < m.n; i++)
            free(m.files[i].name);
        free(m.files);
    }
}

/* A reference manifest (snapshotFiles only): names without detail; other keys ignored. */
static void test_reference(void)
{
    const char *js = "{\"snapshotFiles\":[\"base-id\",\"config.json\",\"memory-ranges\"],"
                     "\"sandboxClass\":\"x\"}\n";
    struct manifest p;
    REQUIRE(manifest_parse(js, strlen(js), "r", CAP, &p, NULL) == 0);
    CHECK(p.n == 3 && !strcmp(p.files[2].name, "memory-ranges") && p.format_version == 0 &&
          p.push_id[0] == '\0');
    for (size_t i = 0; i < p.n; i++)
        CHECK(!p.files[i].detail);
    manifest_fini(&p);
}

#define ENTRY(fields) "{\"snapshotFiles\":[\"a\"],\"files\":{\"a\":{" fields "}}}"
#define OKF "\"size\":10,\"populated\":5,\"objectSize\":20"

struct bad_case {
    const char *json;
    const char *words; /* in the message */
};

static void test_hostile(void)
{
    static const struct bad_case bad[] = {
        {"[]", "no \"snapshotFiles\" array"},
        {"{}", "no \"snapshotFiles\" array"},
        {"{\"snapshotFiles\":\"a\"}", "no \"snapshotFiles\" array"},
        {"{\"snapshotFiles\":[]}", "snapshotFiles is empty"},
        {"{\"snapshotFiles\":[1]}", "is not a string"},
        {"{\"snapshotFiles\":[\"../passwd\"]}", "not a plain file name"},
        {"{\"snapshotFiles\":[\"a/b\"]}", "not a plain file name"},
        {"{\"snapshotFiles\":[\"..\"]}", "not a plain file name"},
        {"{\"snapshotFiles\":[\"\"]}", "not a plain file name"},
        {"{\"snapshotFiles\":[\".bashrc\"]}", "not a plain file name"},
        {"{\"snapshotFiles\":[\"a\\u0000b\"]}", "not a plain file name"},
        {"{\"snapshotFiles\":[\"a\\nb\"]}", "not a plain file name"},
        {"{\"snapshotFiles\":[\"manifest.json\"]}", "not a plain file name"},
        {"{\"snapshotFiles\":[\"a\",\"b\",\"a\"]}", "listed twice"},
        {"{\"snapshotFiles\":[\"a\"],\"formatVersion\":4}", "unsupported formatVersion"},
        {"{\"snapshotFiles\":[\"a\"],\"formatVersion\":\"2\"}", "unsupported formatVersion"},
        {"{\"snapshotFiles\":[\"a\"],\"pushId\":\"ABC\"}", "pushId"},
        {"{\"snapshotFiles\":[\"a\"],\"pushId\":\"\"}", "pushId"},
        {"{\"snapshotFiles\":[\"a\"],\"pushId\":7}", "pushId"},
        {"{\"snapshotFiles\":[\"a\"],\"pushId\":\"" Z64 "\"}", "pushId"},
        {"{\"snapshotFiles\":[\"a\"],\"files\":[]}", "\"files\" is not an object"},
        {"{\"snapshotFiles\":[\"a\"],\"files\":{}}", "no \"files\" entry for 'a'"},
        {"{\"snapshotFiles\":[\"a\"],\"files\":{\"a\":1}}", "no \"files\" entry for 'a'"},
        {ENTRY("\"size\":10,\"populated\":5,\"sha256\":\"" Z64 "\""), "needs size"},
        {ENTRY("\"size\":-1,\"populated\":0,\"objectSize\":20,\"sha256\":\"" Z64 "\""),
         "needs size"},
        {ENTRY("\"size\":1.5,\"populated\":0,\"objectSize\":20,\"sha256\":\"" Z64 "\""),
         "needs size"},
        {ENTRY("\"size\":\"10\",\"populated\":5,\"objectSize\":20,\"sha256\":\"" Z64 "\""),
         "needs size"},
        {ENTRY(OKF), "one lowercase hex digest"},
        {ENTRY(OKF ",\"sha256\":\"" Z64 "\",\"tableSha256\":\"" Z64 "\""),
         "one lowercase hex digest"},
        {ENTRY(OKF ",\"sha256\":\"" Z64 "0\""), "one lowercase hex digest"},
        {ENTRY(OKF ",\"tableSha256\":\"ABCDEF0000000000000000000000000000000000000000000000000000"
                   "000000\""),
         "one lowercase hex digest"},
        {ENTRY(OKF ",\"sha256\":64"), "one lowercase hex digest"},
        {ENTRY("\"size\":10,\"populated\":11,\"objectSize\":20,\"sha256\":\"" Z64 "\""),
         "impossible sizes"},
        {ENTRY("\"size\":10,\"populated\":5,\"objectSize\":0,\"sha256\":\"" Z64 "\""),
         "impossible sizes"},
        {ENTRY("\"size\":10,\"populated\":5,\"objectSize\":4294967296,\"sha256\":\"" Z64 "\""),
         "impossible sizes"},
        {ENTRY("\"size\":9223372036854775807,\"populated\":0,\"objectSize\":1,"
               "\"sha256\":\"" Z64 "\""),
         "over the cap"},
        {"{\"snapshotFiles\":[\"a\"]} x", "trailing bytes"},
        {"{\"snapshotFiles\":[\"a\"]}{}", "trailing bytes"},
        {"{\"snapshotFiles\":[\"memory-ranges\",\"sta", "truncated"},
        {"{\"snapshotFiles\":", "truncated"},
        {"", "not valid JSON"},
        {"nul", "not valid JSON"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct manifest p = {.n = 99};
        struct vmsnap_err e = {0};
        int rc = manifest_parse(bad[i].json, strlen(bad[i].json), "set/manifest.json", CAP, &p, &e);
        CHECKF(rc < 0, "bad[%zu] accepted: %s", i, bad[i].json);
        CHECKF(strstr(e.msg, "set/manifest.json: ") == e.msg && strstr(e.msg, bad[i].words),
               "bad[%zu]: message '%s' (wanted the manifest named and '%s')", i, e.msg,
               bad[i].words);
        CHECKF(p.files == NULL && p.n == 0, "bad[%zu]: a refused manifest left files", i);
    }
}

/* Limits: more files than VMSNAP_XFER_MAX_FILES, more than VMSNAP_XFER_MANIFEST_MAX bytes,
 * deeper than json-c's 32 levels. The length given is what is parsed: bytes after it are not
 * read, and a NUL inside it is not an end. */
static void test_limits(void)
{
    size_t cap = 64 + (size_t)(VMSNAP_XFER_MAX_FILES + 1) * 12;
    char *js = malloc(cap);
    REQUIRE(js);
    size_t o = (size_t)snprintf(js, cap, "{\"snapshotFiles\":[");
    for (unsigned i = 0; i <= VMSNAP_XFER_MAX_FILES; i++)
        o += (size_t)snprintf(js + o, cap - o, "%s\"f%u\"", i ? "," : "", i);
    o += (size_t)snprintf(js + o, cap - o, "]}");
    struct manifest p;
    struct vmsnap_err e = {0};
    CHECK(manifest_parse(js, o, "m", CAP, &p, &e) == -EBADMSG && strstr(e.msg, "at most 4096"));
    /* one fewer is a set */
    char *last = strrchr(js, ',');
    REQUIRE(last);
    memcpy(last, "]}", 3);
    CHECK(manifest_parse(js, strlen(js), "m", CAP, &p, NULL) == 0 && p.n == VMSNAP_XFER_MAX_FILES);
    manifest_fini(&p);
    free(js);

    size_t big = VMSNAP_XFER_MANIFEST_MAX + 1;
    js = malloc(big);
    REQUIRE(js);
    memset(js, ' ', big);
    memcpy(js, "{\"snapshotFiles\":[\"a\"]}", 23);
    e = (struct vmsnap_err){0};
    CHECK(manifest_parse(js, big, "m", CAP, &p, &e) == -EFBIG && strstr(e.msg, "too large"));
    CHECK(manifest_parse(js, big - 1, "m", CAP, &p, NULL) == 0 && p.n == 1); /* spaces after */
    manifest_fini(&p);
    free(js);

    char deep[200];
    size_t d = 0;
    d += (size_t)snprintf(deep, sizeof(deep), "{\"snapshotFiles\":[\"a\"],\"x\":");
    for (int i = 0; i < 40; i++)
        deep[d++] = '[';
    for (int i = 0; i < 40; i++)
        deep[d++] = ']';
    deep[d++] = '}';
    e = (struct vmsnap_err){0};
    CHECK(manifest_parse(deep, d, "m", CAP, &p, &e) < 0 && strstr(e.msg, "not valid JSON"));

    const char ok[] = "{\"snapshotFiles\":[\"a\"]}GARBAGE";
    CHECK(manifest_parse(ok, 23, "m", CAP, &p, NULL) == 0 && p.n == 1);
    manifest_fini(&p);
    const char nul[] = "{\"snapshotFiles\":[\"a\"]}\0 ";
    CHECK(manifest_parse(nul, sizeof(nul) - 1, "m", CAP, &p, NULL) < 0);
}

static void test_push_mark(void)
{
    const char *id = "0123456789abcdef0123456789abcdef";
    struct mf_file files[3] = {{.name = "memory-ranges"}, {.name = "state"}, {.name = "base-id"}};
    char *old[] = {"gone", "config.json"};
    for (size_t nr = 0; nr <= 2; nr += 2) {
        char *js = push_mark_build(id, 1700000000, files, 3, old, nr);
        REQUIRE(js);
        CHECK(strstr(js, nr ? "\"vmsnapPush\":2" : "\"vmsnapPush\":1") != NULL);
        CHECK((strstr(js, "replaces") != NULL) == (nr != 0));
        struct push_mark pm;
        struct vmsnap_err e = {0};
        REQUIRE(push_mark_parse(js, strlen(js), "mark", id, &pm, &e) == 0);
        CHECK(!strcmp(pm.push_id, id) && pm.started == 1700000000 && pm.nfiles == 3 &&
              pm.n == 3 + nr);
        for (size_t i = 0; i < 3 && i < pm.n; i++)
            CHECK(!strcmp(pm.names[i], files[i].name));
        for (size_t i = 0; i < nr && 3 + i < pm.n; i++)
            CHECK(!strcmp(pm.names[3 + i], old[i]));
        push_mark_fini(&pm);
        CHECK(pm.names == NULL && pm.n == 0);
        /* the mark of another push (its key names another id) is not this one's */
        e = (struct vmsnap_err){0};
        CHECK(push_mark_parse(js, strlen(js), "mark", "ffffffffffffffffffffffffffffffff", &pm,
                              &e) == -EINVAL &&
              strstr(e.msg, "not a vmsnap push mark of push ffff") && pm.names == NULL);
        free(js);
    }
#define MARK(rest) "{\"vmsnapPush\":1,\"pushId\":\"0123456789abcdef0123456789abcdef\"" rest "}"
    static const struct bad_case bad[] = {
        {"{\"pushId\":\"0123456789abcdef0123456789abcdef\",\"started\":1,\"files\":[]}",
         "not a vmsnap push mark"},
        {"{\"vmsnapPush\":3,\"pushId\":\"0123456789abcdef0123456789abcdef\",\"started\":1,"
         "\"files\":[]}",
         "not a vmsnap push mark"},
        {MARK(",\"started\":-1,\"files\":[]"), "not a vmsnap push mark"},
        {MARK(",\"started\":\"1\",\"files\":[]"), "not a vmsnap push mark"},
        {MARK(",\"started\":1"), "not a vmsnap push mark"},
        {MARK(",\"started\":1,\"files\":{}"), "not a vmsnap push mark"},
        {MARK(",\"started\":1,\"files\":[\"../keep\"]"), "files[0] is not a plain file name"},
        {MARK(",\"started\":1,\"files\":[\"a\",7]"), "files[1] is not a plain file name"},
        {MARK(",\"started\":1,\"files\":[\"a\"],\"replaces\":\"b\""), "\"replaces\" is not"},
        {MARK(",\"started\":1,\"files\":[],\"replaces\":[\"a\",\"../keep\"]"),
         "replaces[1] is not a plain file name"},
        {MARK(",\"started\":1,\"files\":[]") "x", "trailing bytes"},
        {MARK(",\"started\":1,\"files\":[\"a\""), "not valid JSON"},
        {"{\"vmsnapPush\":1,\"pushId\":\"0123", "truncated"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct push_mark pm = {.n = 9};
        struct vmsnap_err e = {0};
        int rc =
            push_mark_parse(bad[i].json, strlen(bad[i].json), "p/vmsnap-push-x.json", id, &pm, &e);
        CHECKF(rc < 0, "bad mark[%zu] accepted: %s", i, bad[i].json);
        CHECKF(strstr(e.msg, "p/vmsnap-push-x.json: ") == e.msg && strstr(e.msg, bad[i].words),
               "bad mark[%zu]: message '%s' (wanted '%s')", i, e.msg, bad[i].words);
        CHECKF(pm.names == NULL && pm.n == 0, "bad mark[%zu]: names left", i);
    }
}

/* The basics, as first written beside the SigV4 tests: names, one file round trip with either
 * digest, the size cap, a dozen malformed manifests each named in its error. */
static void test_basics(void)
{
    CHECK(manifest_name_ok("memory-ranges", 13));
    CHECK(!manifest_name_ok("..", 2) && !manifest_name_ok(".", 1) && !manifest_name_ok("", 0));
    CHECK(!manifest_name_ok("a/b", 3) && !manifest_name_ok("a\0b", 3));
    CHECK(!manifest_name_ok("manifest.json", 13) && !manifest_name_ok("a\nb", 3));
    struct manifest m = {0};
    struct mf_file f = {
        .name = "mem", .detail = true, .size = 100, .populated = 50, .object_size = 60};
    memset(f.sha256, 'a', 64);
    f.sha256[64] = '\0';
    m.files = &f;
    m.n = 1;
    char *js = manifest_build(&m);
    REQUIRE(js);
    struct manifest p;
    REQUIRE(manifest_parse(js, strlen(js), "t", 1ull << 40, &p, NULL) == 0);
    CHECK(p.n == 1 && !strcmp(p.files[0].name, "mem") && p.files[0].size == 100 &&
          p.files[0].populated == 50 && p.files[0].object_size == 60 && p.files[0].detail &&
          !strcmp(p.files[0].sha256, f.sha256));
    CHECK(!p.files[0].table_digest && strstr(js, "\"sha256\"") && !strstr(js, "tableSha256"));
    manifest_fini(&p);
    /* size cap: a policy (EFBIG, naming --max-size), not damage */
    struct vmsnap_err ce = {0};
    CHECK(manifest_parse(js, strlen(js), "t", 99, &p, &ce) == -EFBIG &&
          strstr(ce.msg, "--max-size"));
    free(js);
    /* the seek-table digest round-trips under its own name */
    f.table_digest = true;
    f.sha256[0] = 'b';
    js = manifest_build(&m);
    REQUIRE(js);
    CHECK(strstr(js, "\"tableSha256\":\"b") && !strstr(js, "\"sha256\""));
    REQUIRE(manifest_parse(js, strlen(js), "t", 1ull << 40, &p, NULL) == 0);
    CHECK(p.files[0].table_digest && !strcmp(p.files[0].sha256, f.sha256));
    manifest_fini(&p);
    free(js);
    const char *bad[] = {
        "[]",
        "{\"snapshotFiles\":\"x\"}",
        "{\"snapshotFiles\":[1]}",
        "{\"snapshotFiles\":[\"a\"],\"files\":{}}",
        ("{\"snapshotFiles\":[\"a\"],\"files\":{\"a\":{\"size\":-1,\"populated\":0,"
         "\"objectSize\":1,\"sha256\":\"" Z64 "\"}}}"),
        ("{\"snapshotFiles\":[\"a\"],\"files\":{\"a\":{\"size\":1,\"populated\":2,"
         "\"objectSize\":1,\"sha256\":\"" Z64 "\"}}}"),
        ("{\"snapshotFiles\":[\"a\"],\"files\":{\"a\":{\"size\":1,\"populated\":1,"
         "\"objectSize\":1,\"sha256\":\"XYZ\"}}}"),
        /* no digest; both digests; a bad table digest */
        ("{\"snapshotFiles\":[\"a\"],\"files\":{\"a\":{\"size\":1,\"populated\":1,"
         "\"objectSize\":1}}}"),
        ("{\"snapshotFiles\":[\"a\"],\"files\":{\"a\":{\"size\":1,\"populated\":1,"
         "\"objectSize\":1,\"sha256\":\"" Z64 "\",\"tableSha256\":\"" Z64 "\"}}}"),
        ("{\"snapshotFiles\":[\"a\"],\"files\":{\"a\":{\"size\":1,\"populated\":1,"
         "\"objectSize\":1,\"tableSha256\":\"" Z64 "0\"}}}"),
        "{\"snapshotFiles\":[\"a\"],\"formatVersion\":4}",
        "{\"snapshotFiles\":[\"a\"]} trailing",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct vmsnap_err e = {0};
        CHECKF(manifest_parse(bad[i], strlen(bad[i]), "t", 1ull << 40, &p, &e) < 0, "bad[%zu]", i);
        CHECKF(strstr(e.msg, "t:") == e.msg, "bad[%zu] message '%s' does not name the manifest", i,
               e.msg);
    }
}

int main(void)
{
    test_basics();
    test_names();
    test_round_trip();
    test_reference();
    test_hostile();
    test_limits();
    test_push_mark();
    return t_done();
}
