/* SPDX-License-Identifier: Apache-2.0 */
/* `vmsnap help VERB` and a sub-verb's --help, from the verb table and the option tables; the
 * grouping of the option tables the man pages share (cli/doc_man.c). */
#include "cli.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>

const char *cli_user_key(const struct cli_user *u)
{
    return u->sub ? u->sub->name : u->verb->name;
}

static void group_add(struct cli_group *g, size_t *n, size_t cap, const struct cli_opt *opts,
                      const struct cli_verb *v, const struct cli_sub *sub)
{
    if (!opts)
        return;
    size_t k = 0;
    while (k < *n && g[k].opts != opts)
        k++;
    if (k == *n) {
        if (*n == cap)
            return;
        g[k] = (struct cli_group){.opts = opts};
        (*n)++;
    }
    if (g[k].n < CLI_GROUP_USERS)
        g[k].users[g[k].n++] = (struct cli_user){v, sub};
}

size_t cli_groups(const struct cli_verb *const *vs, size_t n, struct cli_group *g, size_t cap)
{
    size_t ng = 0;
    for (size_t i = 0; i < n; i++) {
        group_add(g, &ng, cap, vs[i]->opts, vs[i], NULL);
        for (const struct cli_sub *s = vs[i]->subs; s && s->name; s++)
            group_add(g, &ng, cap, s->opts, vs[i], s);
    }
    return ng;
}

bool cli_group_row(const struct cli_group *g, const struct cli_opt *o, char *who, size_t cap)
{
    size_t hits = 0, len = 0;
    who[0] = '\0';
    for (size_t i = 0; i < g->n; i++) {
        if (o->only && !cli_word_in(o->only, cli_user_key(&g->users[i])))
            continue;
        hits++;
        if (len < cap)
            len += (size_t)snprintf(who + len, cap - len, "%s%s", len ? ", " : "",
                                    cli_user_key(&g->users[i]));
    }
    if (hits == g->n)
        who[0] = '\0'; /* for all of them: nothing to say */
    return hits > 0;
}

const char *cli_opt_spellings(char *buf, size_t cap, const struct cli_opt *o)
{
    char s[4] = "";
    if (o->letter)
        snprintf(s, sizeof(s), "-%c", o->letter);
    snprintf(buf, cap, "%s%s%s%s%s%s", s, o->letter && o->name ? ", " : "", o->name ? "--" : "",
             o->name ? o->name : "", o->arg ? " " : "", o->arg ? o->arg : "");
    return buf;
}

/* The group's rows, one a line: "  -T, --threads N      codec threads ... [run, resume]" */
static void print_rows(FILE *f, const struct cli_group *g)
{
    for (const struct cli_opt *o = g->opts; o->name || o->letter; o++) {
        char sp[96], who[128];
        if (!cli_group_row(g, o, who, sizeof(who)))
            continue;
        cli_opt_spellings(sp, sizeof(sp), o);
        int w = fprintf(f, "  %s", sp);
        fprintf(f, "%*s%s%s%s%s\n", w < 26 ? 26 - w : 1, "", o->help, *who ? " [" : "", who,
                *who ? "]" : "");
    }
}

/* "options:", or "options of cache objects and trim:" when the verb has several tables */
static void print_groups(FILE *f, const struct cli_verb *v)
{
    struct cli_group g[8];
    size_t n = cli_groups(&v, 1, g, 8);
    for (size_t k = 0; k < n; k++) {
        if (n == 1)
            fprintf(f, "\noptions%s:\n",
                    g[k].users[0].sub ? " (in brackets: the sub-verbs that use one)" : "");
        else {
            fprintf(f, "\noptions of %s", v->name);
            for (size_t i = 0; i < g[k].n; i++)
                fprintf(f, "%s%s",
                        i == 0            ? " "
                        : i + 1 == g[k].n ? " and "
                                          : ", ",
                        g[k].users[i].sub->name);
            fprintf(f, ":\n");
        }
        print_rows(f, &g[k]);
    }
    if (n)
        fprintf(f, "  -h, --help, -q, -v, -vv   as for every verb (vmsnap help)\n");
}

void cli_print_verb_help(FILE *f, const struct cli_verb *v)
{
    fprintf(f, "usage: vmsnap %s\n", v->synopsis);
    for (const struct cli_sub *s = v->subs; s && s->name; s++)
        fprintf(f, "       vmsnap %s\n", s->synopsis);
    fprintf(f, "\n%s\n", v->help);
    print_groups(f, v);
}

int cli_sub_help(const char *verb, const struct cli_sub *sub)
{
    size_t n;
    const struct cli_verb *vs = cli_verbs(&n), *v = NULL;
    for (size_t i = 0; i < n; i++)
        if (!strcmp(vs[i].name, verb))
            v = &vs[i];
    printf("usage: vmsnap %s\n\n%c%s.\n\noptions:\n", sub->synopsis,
           toupper((unsigned char)sub->summary[0]), sub->summary + 1);
    struct cli_group g = {.opts = sub->opts, .n = 1};
    g.users[0] = (struct cli_user){v, sub};
    print_rows(stdout, &g);
    printf(
        "  -h, --help, -q, -v, -vv   as for every verb (vmsnap help)\n\n(vmsnap help %s: more)\n",
        verb);
    return EXIT_OK;
}
