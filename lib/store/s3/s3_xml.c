/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A deliberately small XML reader: S3 answers are flat records (<Contents><Key>..</Key>...),
 * so "find the next <Name>...</Name> and decode its text" is all we need. Every scan is bounded
 * by the span length; nothing is allocated.
 */
#include "s3_int.h"

#include <string.h>

static const char *find_bytes(const char *p, size_t len, const char *pat, size_t plen)
{
    if (plen == 0 || len < plen)
        return NULL;
    return memmem(p, len, pat, plen);
}

bool xml_find(struct xml_span in, const char *name, struct xml_span *content, struct xml_span *rest)
{
    size_t nl = strlen(name);
    if (nl == 0 || nl > 64)
        return false;
    char open[68], close[70];
    open[0] = '<';
    memcpy(open + 1, name, nl);
    close[0] = '<';
    close[1] = '/';
    memcpy(close + 2, name, nl);
    close[2 + nl] = '>';
    const char *p = in.p, *end = in.p + in.len;
    while (p < end) {
        const char *s = find_bytes(p, (size_t)(end - p), open, nl + 1);
        if (!s)
            return false;
        const char *a = s + nl + 1; /* after "<name" */
        if (a >= end)
            return false;
        if (*a != '>' && *a != ' ' && *a != '\t' && *a != '\r' && *a != '\n' && *a != '/') {
            p = a; /* a longer name with this prefix */
            continue;
        }
        const char *gt = memchr(a, '>', (size_t)(end - a));
        if (!gt)
            return false;
        if (gt[-1] == '/') { /* <name/> */
            content->p = gt;
            content->len = 0;
            rest->p = gt + 1;
            rest->len = (size_t)(end - gt - 1);
            return true;
        }
        const char *c = gt + 1;
        const char *e = find_bytes(c, (size_t)(end - c), close, nl + 3);
        if (!e)
            return false;
        content->p = c;
        content->len = (size_t)(e - c);
        rest->p = e + nl + 3;
        rest->len = (size_t)(end - rest->p);
        return true;
    }
    return false;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* Encode code point cp as UTF-8; returns bytes or 0 if invalid. */
static size_t utf8(unsigned long cp, char *o)
{
    if (cp == 0 || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

long xml_text(struct xml_span s, char *out, size_t outlen)
{
    size_t o = 0;
    for (size_t i = 0; i < s.len;) {
        char c = s.p[i];
        char tmp[4];
        size_t tn = 1;
        tmp[0] = c;
        if (c == '<' || c == '\0') {
            return -1;
        } else if (c == '&') {
            const char *semi = memchr(s.p + i, ';', (s.len - i < 12 ? s.len - i : 12));
            if (!semi)
                return -1;
            size_t el = (size_t)(semi - (s.p + i)) + 1; /* "&...;" */
            const char *ent = s.p + i + 1;
            size_t en = el - 2;
            if (en == 3 && !memcmp(ent, "amp", 3))
                tmp[0] = '&';
            else if (en == 2 && !memcmp(ent, "lt", 2))
                tmp[0] = '<';
            else if (en == 2 && !memcmp(ent, "gt", 2))
                tmp[0] = '>';
            else if (en == 4 && !memcmp(ent, "quot", 4))
                tmp[0] = '"';
            else if (en == 4 && !memcmp(ent, "apos", 4))
                tmp[0] = '\'';
            else if (en >= 2 && ent[0] == '#') {
                unsigned long cp = 0;
                bool hx = ent[1] == 'x' || ent[1] == 'X';
                size_t j = hx ? 2 : 1;
                if (j >= en)
                    return -1;
                for (; j < en; j++) {
                    int v =
                        hx ? hexval(ent[j]) : (ent[j] >= '0' && ent[j] <= '9' ? ent[j] - '0' : -1);
                    if (v < 0)
                        return -1;
                    cp = cp * (hx ? 16 : 10) + (unsigned long)v;
                    if (cp > 0x10FFFF)
                        return -1;
                }
                tn = utf8(cp, tmp);
                if (tn == 0)
                    return -1;
            } else {
                return -1;
            }
            i += el;
        } else {
            i++;
        }
        if (o + tn >= outlen)
            return -1;
        memcpy(out + o, tmp, tn);
        o += tn;
    }
    if (o >= outlen)
        return -1;
    out[o] = '\0';
    return (long)o;
}

bool xml_child_text(struct xml_span in, const char *name, char *out, size_t outlen)
{
    struct xml_span c, r;
    return xml_find(in, name, &c, &r) && xml_text(c, out, outlen) >= 0;
}

bool xml_child_u64(struct xml_span in, const char *name, uint64_t *v)
{
    char buf[24];
    if (!xml_child_text(in, name, buf, sizeof(buf)) || !buf[0])
        return false;
    uint64_t x = 0;
    for (const char *p = buf; *p; p++) {
        if (*p < '0' || *p > '9' || x > (UINT64_MAX - 9) / 10)
            return false;
        x = x * 10 + (uint64_t)(*p - '0');
    }
    *v = x;
    return true;
}
