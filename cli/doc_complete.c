/* SPDX-License-Identifier: Apache-2.0 */
/* The bash and zsh completions, the options list the tests compare everything with, and the
 * consistency check of the tables: all from the verb table and the option tables the parsers
 * use (cli.h), so a completion offers exactly what the parser takes.
 *
 * The bash script is self-contained (no bash-completion helpers): per (verb, sub-verb) a case
 * arm sets the options, the ones taking an argument and the operands' kinds; the function walks
 * the words before the cursor (global options, the verb, its sub-verb, options with their
 * arguments, operands) to know what the word under the cursor is. */
#include "cli.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

/* the (verb, sub-verb) pairs that parse: a verb without sub-verbs is one with sub NULL */
typedef void (*each_fn)(void *arg, const struct cli_verb *v, const struct cli_sub *s);

static void each_parser(each_fn fn, void *arg)
{
    size_t n;
    const struct cli_verb *vs = cli_verbs(&n);
    for (size_t i = 0; i < n; i++) {
        if (!vs[i].subs)
            fn(arg, &vs[i], NULL);
        for (const struct cli_sub *s = vs[i].subs; s && s->name; s++)
            fn(arg, &vs[i], s);
    }
}

static const struct cli_opt *table_of(const struct cli_verb *v, const struct cli_sub *s)
{
    return s ? s->opts : v->opts;
}

/* the row is one the (sub-)verb uses (its `only` names it, or it has none) */
static bool row_used(const struct cli_verb *v, const struct cli_sub *s, const struct cli_opt *o)
{
    return !o->only || cli_word_in(o->only, s ? s->name : v->name);
}

#define FOR_ROWS(o, t) for (const struct cli_opt *o = (t); o && (o->name || o->letter); o++)

/* what every parser takes without a row (cli_getopt); a verb without a table (help, version)
 * only what main takes out after it: -q and -v */
static const char *const common[] = {"-h", "--help", "-q", "--quiet", "-v", "--verbose", NULL};

static const char *const *common_of(const struct cli_opt *t)
{
    return t ? common : common + 2;
}

static const char *kind_word(enum cli_kind k)
{
    switch (k) {
    case CLI_K_FILE:
        return "file";
    case CLI_K_DIR:
        return "dir";
    case CLI_K_URL:
        return "url";
    case CLI_K_CHOICE:
        return "choice";
    default:
        return "none";
    }
}

/* ---- the consistency check ---- */

static int bad(const char *what, const char *where, const char *name)
{
    fprintf(stderr, "vmsnap: option tables: %s: %s %s\n", where, what, name ? name : "");
    return -1;
}

static int check_table(const struct cli_opt *t, const char *where, const struct cli_group *g)
{
    int rc = 0;
    size_t n = 0;
    FOR_ROWS(o, t)
    {
        char lab[64];
        cli_opt_label(lab, sizeof(lab), o);
        if (++n > 60)
            return bad("more than 60 rows", where, NULL);
        if (o->val <= 0 || o->val == 'h' || o->val == 'q' || o->val == 'v' || o->val == '?' ||
            o->val == ':')
            rc = bad("reserved val of", where, lab);
        if (o->letter == 'h' || o->letter == 'q' || o->letter == 'v' ||
            (o->name && (!strcmp(o->name, "help") || !strcmp(o->name, "quiet") ||
                         !strcmp(o->name, "verbose"))))
            rc = bad("a common option (cli_getopt adds it) in the table:", where, lab);
        if (!o->help || !*o->help)
            rc = bad("no help for", where, lab);
        if (!o->arg && o->kind != CLI_K_NONE)
            rc = bad("a flag with an argument kind:", where, lab);
        if ((o->kind == CLI_K_CHOICE) != (o->choices != NULL))
            rc = bad("choices without CLI_K_CHOICE (or the reverse):", where, lab);
        for (const struct cli_opt *p = t; p < o; p++) {
            if (o->name && p->name && !strcmp(o->name, p->name))
                rc = bad("two rows named", where, lab);
            if (o->letter && o->letter == p->letter)
                rc = bad("two rows with the letter of", where, lab);
        }
        /* every word of `only` names a user of the table */
        for (const char *w = o->only; w && *w; w += strspn(w, " ")) {
            size_t k = strcspn(w, " ");
            bool found = false;
            for (size_t i = 0; i < g->n; i++) {
                const char *key = cli_user_key(&g->users[i]);
                found = found || (strlen(key) == k && !strncmp(key, w, k));
            }
            if (!found)
                rc = bad("`only` names no verb or sub-verb of its table:", where, lab);
            w += k;
        }
    }
    return rc;
}

int cli_doc_check(void)
{
    size_t n;
    const struct cli_verb *vs = cli_verbs(&n);
    const struct cli_verb *ptrs[64];
    if (n > 64)
        return bad("more than 64 verbs", "verb table", NULL);
    for (size_t i = 0; i < n; i++)
        ptrs[i] = &vs[i];
    struct cli_group g[64];
    size_t ng = cli_groups(ptrs, n, g, 64);
    int rc = 0;
    for (size_t k = 0; k < ng; k++) {
        char where[64];
        snprintf(where, sizeof(where), "%s%s%s", g[k].users[0].verb->name,
                 g[k].users[0].sub ? " " : "", g[k].users[0].sub ? g[k].users[0].sub->name : "");
        if (check_table(g[k].opts, where, &g[k]) < 0)
            rc = -1;
    }
    for (size_t i = 0; i < n; i++) {
        if (!vs[i].summary || !vs[i].page || !vs[i].help || !vs[i].synopsis)
            rc = bad("a verb without summary, page, help or synopsis:", "verb table", vs[i].name);
        if (!vs[i].subs && !vs[i].operands)
            rc = bad("a verb without operands (say \"none\"):", "verb table", vs[i].name);
        for (const struct cli_sub *s = vs[i].subs; s && s->name; s++)
            if (!s->opts || !s->operands || !s->summary || !s->synopsis)
                rc = bad("a sub-verb without options, operands, summary or synopsis:", vs[i].name,
                         s->name);
    }
    return rc;
}

/* ---- --options: every spelling each parser takes, one a line ---- */

static void options_one(void *arg, const struct cli_verb *v, const struct cli_sub *s)
{
    (void)arg;
    const char *sub = s ? s->name : "-";
    FOR_ROWS(o, table_of(v, s))
    {
        const char *use = row_used(v, s, o) ? "yes" : v->unused_ignored ? "ignored" : "refused";
        char sp[2][64];
        int k = 0;
        if (o->letter)
            snprintf(sp[k++], sizeof(sp[0]), "-%c", o->letter);
        if (o->name)
            snprintf(sp[k++], sizeof(sp[0]), "--%s", o->name);
        for (int i = 0; i < k; i++)
            printf("%s\t%s\t%s\t%s\t%s%s%s\t%s\t%s\n", v->name, sub, sp[i], o->arg ? o->arg : "-",
                   kind_word(o->kind), o->choices ? ":" : "", o->choices ? o->choices : "", use,
                   v->page);
    }
    for (const char *const *c = common_of(table_of(v, s)); *c; c++)
        printf("%s\t%s\t%s\t-\tnone\tcommon\t%s\n", v->name, sub, *c, v->page);
}

int cli_doc_options(int argc, char **argv)
{
    (void)argv;
    if (argc != 1)
        return cli_usage("help", "--options takes no argument");
    if (cli_doc_check() < 0)
        return EXIT_FAIL;
    printf("# verb\tsub-verb\toption\targument\tkind\tuse\tpage\n");
    FOR_ROWS(o, cli_global_opts)
    {
        if (o->letter)
            printf("-\t-\t-%c\t%s\t%s\tglobal\tvmsnap\n", o->letter, o->arg ? o->arg : "-",
                   kind_word(o->kind));
        printf("-\t-\t--%s\t%s\t%s\tglobal\tvmsnap\n", o->name, o->arg ? o->arg : "-",
               kind_word(o->kind));
    }
    each_parser(options_one, NULL);
    return EXIT_OK;
}

/* ---- bash ---- */

/* the table's spellings the (sub-)verb uses, space-separated; with_arg: only those taking one */
static void spellings(FILE *f, const struct cli_verb *v, const struct cli_sub *s, bool with_arg)
{
    const char *sep = "";
    FOR_ROWS(o, table_of(v, s))
    {
        if (!row_used(v, s, o) || (with_arg && !o->arg))
            continue;
        if (o->letter)
            fprintf(f, "%s-%c", sep, o->letter), sep = " ";
        if (o->name)
            fprintf(f, "%s--%s", sep, o->name), sep = " ";
    }
    for (const char *const *c = common_of(table_of(v, s)); !with_arg && *c; c++)
        fprintf(f, "%s%s", sep, *c), sep = " ";
}

static void bash_spec(void *arg, const struct cli_verb *v, const struct cli_sub *s)
{
    FILE *f = arg;
    fprintf(f, "    %s/%s)\n        opts='", v->name, s ? s->name : "");
    spellings(f, v, s, false);
    fprintf(f, "'\n        argopts='");
    spellings(f, v, s, true);
    fprintf(f, "'\n        operands='%s'\n        ;;\n", s ? s->operands : v->operands);
}

static void bash_args(void *arg, const struct cli_verb *v, const struct cli_sub *s)
{
    FILE *f = arg;
    FOR_ROWS(o, table_of(v, s))
    {
        if (!o->arg || !row_used(v, s, o))
            continue;
        fprintf(f, "    ");
        const char *sep = "";
        if (o->letter)
            fprintf(f, "%s/%s/-%c", v->name, s ? s->name : "", o->letter), sep = " | ";
        if (o->name)
            fprintf(f, "%s%s/%s/--%s", sep, v->name, s ? s->name : "", o->name);
        fprintf(f, ") k='%s%s%s' ;;\n", kind_word(o->kind), o->choices ? " " : "",
                o->choices ? o->choices : "");
    }
}

static void bash_subs(FILE *f)
{
    size_t n;
    const struct cli_verb *vs = cli_verbs(&n);
    for (size_t i = 0; i < n; i++) {
        if (!vs[i].subs)
            continue;
        fprintf(f, "    %s/)\n        subs='", vs[i].name);
        for (const struct cli_sub *s = vs[i].subs; s->name; s++)
            fprintf(f, "%s%s", s == vs[i].subs ? "" : " ", s->name);
        fprintf(f, "'\n        ;;\n");
    }
}

static const char bash_value[] =
    "# _vmsnap_value KIND: COMPREPLY for a word of that kind (an option's argument, an operand)\n"
    "_vmsnap_value() {\n"
    "    case $1 in\n"
    "    file | url)\n"
    "        compopt -o filenames 2>/dev/null\n"
    "        mapfile -t COMPREPLY < <(compgen -f -- \"$cur\")\n"
    "        ;;\n"
    "    dir)\n"
    "        compopt -o filenames 2>/dev/null\n"
    "        mapfile -t COMPREPLY < <(compgen -d -- \"$cur\")\n"
    "        ;;\n"
    "    verb) mapfile -t COMPREPLY < <(compgen -W \"$verbs\" -- \"$cur\") ;;\n"
    "    choice\\ *) mapfile -t COMPREPLY < <(compgen -W \"${1#choice }\" -- \"$cur\") ;;\n"
    "    *) COMPREPLY=() ;;\n"
    "    esac\n"
    "}\n";

/* _vmsnap's body after its first line (the verbs and global options, generated) */
static const char bash_main[] =
    "    local cur=${COMP_WORDS[COMP_CWORD]} w verb='' sub='' opts='' argopts='' operands=''\n"
    "    local subs='' k o\n"
    "    local -i i n=0 skip=0 dashdash=0\n"
    "    COMPREPLY=()\n"
    "    # the words before the cursor: options before the verb (those in globargs take an\n"
    "    # argument), the\n"
    "    # verb, its sub-verb (-q/-v may come between), then options, their arguments (bash\n"
    "    # splits --opt=value into --opt, = and value) and operands, counted in n\n"
    "    for ((i = 1; i < COMP_CWORD; i++)); do\n"
    "        w=${COMP_WORDS[i]}\n"
    "        if ((skip)); then\n"
    "            [[ $w == = ]] || skip=0\n"
    "            continue\n"
    "        fi\n"
    "        if [[ -z $verb ]]; then\n"
    "            if [[ $w == -* ]]; then\n"
    "                [[ $w != *=* && \" $globargs \" == *\" $w \"* ]] && skip=1\n"
    "                continue\n"
    "            fi\n"
    "            verb=$w\n"
    "            _vmsnap_spec \"$verb\" '' || return 0\n"
    "            continue\n"
    "        fi\n"
    "        if [[ -n $subs && -z $sub ]]; then\n"
    "            [[ $w == -* ]] && continue\n"
    "            sub=$w\n"
    "            _vmsnap_spec \"$verb\" \"$sub\" || return 0\n"
    "            continue\n"
    "        fi\n"
    "        if ((!dashdash)) && [[ $w == -- ]]; then\n"
    "            dashdash=1\n"
    "        elif ((!dashdash)) && [[ $w == -* ]]; then\n"
    "            [[ $w != *=* && \" $argopts \" == *\" $w \"* ]] && skip=1\n"
    "        else\n"
    "            n+=1\n"
    "        fi\n"
    "    done\n"
    "    if ((skip)); then # the argument of the option before (or after its '=')\n"
    "        o=${COMP_WORDS[COMP_CWORD - 1]}\n"
    "        [[ $o == = ]] && o=${COMP_WORDS[COMP_CWORD - 2]}\n"
    "        [[ $cur == = ]] && cur=''\n"
    "        k=none\n"
    "        _vmsnap_arg \"$verb\" \"$sub\" \"$o\"\n"
    "        _vmsnap_value \"$k\"\n"
    "        return 0\n"
    "    fi\n"
    "    if [[ -z $verb ]]; then\n"
    "        [[ $cur == -* ]] && k=\"choice $globals\" || k=verb\n"
    "        _vmsnap_value \"$k\"\n"
    "        return 0\n"
    "    fi\n"
    "    if [[ -n $subs && -z $sub ]]; then\n"
    "        [[ $cur == -* ]] && k='choice -h --help -q --quiet -v --verbose' || k=\"choice "
    "$subs\"\n"
    "        _vmsnap_value \"$k\"\n"
    "        return 0\n"
    "    fi\n"
    "    if ((!dashdash)) && [[ $cur == -* ]]; then\n"
    "        _vmsnap_value \"choice $opts\"\n"
    "        return 0\n"
    "    fi\n"
    "    # an operand: its kind by position; a last kind ending in ... repeats\n"
    "    local -a ks\n"
    "    read -ra ks <<<\"$operands\"\n"
    "    k=none\n"
    "    if ((n < ${#ks[@]})); then\n"
    "        k=${ks[n]}\n"
    "    elif ((${#ks[@]})) && [[ ${ks[${#ks[@]} - 1]} == *... ]]; then\n"
    "        k=${ks[${#ks[@]} - 1]}\n"
    "    fi\n"
    "    _vmsnap_value \"${k%...}\"\n"
    "}\n"
    "complete -F _vmsnap vmsnap\n";

static void bash(FILE *f)
{
    size_t n;
    const struct cli_verb *vs = cli_verbs(&n);
    fprintf(f,
            "# bash completion for vmsnap(1) %s. Generated by the build (vmsnap help "
            "--completion bash)\n# from the tables vmsnap parses its command line with; "
            "edits here are lost.\n\n",
            vmsnap_version());
    fprintf(f, "# _vmsnap_spec VERB SUB: the caller's opts (the options), argopts (those taking "
               "an argument),\n# operands (their kinds in order) and subs (the sub-verbs); "
               "status 1 for an unknown verb\n_vmsnap_spec() {\n    opts='' argopts='' "
               "operands='' subs=''\n    case $1/$2 in\n");
    bash_subs(f);
    each_parser(bash_spec, f);
    fprintf(f, "    *) return 1 ;;\n    esac\n}\n\n");
    fprintf(f, "# _vmsnap_arg VERB SUB OPTION: the caller's k, what the option's argument is\n"
               "_vmsnap_arg() {\n    case $1/$2/$3 in\n");
    FOR_ROWS(o, cli_global_opts) /* before the verb: VERB and SUB empty */
    {
        if (o->arg)
            fprintf(f, "    //--%s) k='%s' ;;\n", o->name, kind_word(o->kind));
    }
    each_parser(bash_args, f);
    fprintf(f, "    *) k=none ;;\n    esac\n}\n\n");
    fprintf(f, "%s\n_vmsnap() {\n    local verbs='", bash_value);
    for (size_t i = 0; i < n; i++)
        fprintf(f, "%s%s", i ? " " : "", vs[i].name);
    fprintf(f, "' globals='");
    const char *sep = "";
    FOR_ROWS(o, cli_global_opts)
    {
        if (o->letter)
            fprintf(f, "%s-%c", sep, o->letter), sep = " ";
        fprintf(f, "%s--%s", sep, o->name), sep = " ";
    }
    fprintf(f, "' globargs='");
    sep = "";
    FOR_ROWS(o, cli_global_opts)
    {
        if (o->arg && o->letter)
            fprintf(f, "%s-%c", sep, o->letter), sep = " ";
        if (o->arg)
            fprintf(f, "%s--%s", sep, o->name), sep = " ";
    }
    fprintf(f, "'\n%s", bash_main);
}

/* ---- zsh ---- */

/* `s` inside a single-quoted zsh word; `special` the characters _arguments wants escaped
 * there: "[]" in a [description], ":" in a message or a value */
static void zqs(FILE *f, const char *s, const char *special)
{
    for (; *s; s++) {
        if (*s == '\'')
            fputs("'\\''", f);
        else if (*s == '\\' || strchr(special, *s))
            fprintf(f, "\\%c", *s);
        else
            fputc(*s, f);
    }
}

static void zq(FILE *f, const char *s)
{
    zqs(f, s, "[]");
}

static void zqm(FILE *f, const char *s)
{
    zqs(f, s, ":");
}

static void zsh_action(FILE *f, const char *msg, enum cli_kind k, const char *choices)
{
    fputc(':', f);
    zqm(f, msg);
    switch (k) {
    case CLI_K_FILE:
    case CLI_K_URL:
        fputs(":_files", f);
        break;
    case CLI_K_DIR:
        fputs(":_files -/", f);
        break;
    case CLI_K_CHOICE:
        fputs(":(", f);
        zqm(f, choices);
        fputc(')', f);
        break;
    default:
        fputs(": ", f);
    }
}

static void zsh_opt(FILE *f, const struct cli_opt *o)
{
    for (int i = 0; i < 2; i++) {
        if ((i == 0 && !o->letter) || (i == 1 && !o->name))
            continue;
        /* '*': an option may be given again (--add, --preserve, -v) */
        fputs(" \\\n    '*", f);
        if (i == 0)
            fprintf(f, "-%c%s", o->letter, o->arg ? "+" : "");
        else
            fprintf(f, "--%s%s", o->name, o->arg ? "=" : "");
        fputc('[', f);
        zq(f, o->help);
        fputc(']', f);
        if (o->arg)
            zsh_action(f, o->arg, o->kind, o->choices);
        fputc('\'', f);
    }
}

static void zsh_parser(void *arg, const struct cli_verb *v, const struct cli_sub *s)
{
    FILE *f = arg;
    fprintf(f, "_vmsnap__%s%s%s() {\n  _arguments -s -S", v->name, s ? "__" : "", s ? s->name : "");
    FOR_ROWS(o, table_of(v, s))
    {
        if (row_used(v, s, o))
            zsh_opt(f, o);
    }
    for (const char *const *c = common_of(table_of(v, s)); *c; c++)
        fprintf(f, " \\\n    '%s%s[%s]'", (*c)[strspn(*c, "-")] == 'h' ? "(- *)" : "*", *c,
                (*c)[strspn(*c, "-")] == 'h'   ? "the usage"
                : (*c)[strspn(*c, "-")] == 'q' ? "errors only"
                                               : "more (twice: debug)");
    /* the operands */
    const char *ops = s ? s->operands : v->operands;
    int pos = 1;
    for (const char *w = ops; *w; w += strspn(w, " ")) {
        size_t k = strcspn(w, " ");
        char word[32];
        snprintf(word, sizeof(word), "%.*s", (int)k, w);
        w += k;
        bool rep = k > 3 && !strcmp(word + k - 3, "...");
        if (rep)
            word[k - 3] = '\0';
        if (!strcmp(word, "none"))
            continue;
        if (rep)
            fprintf(f, " \\\n    '*:%s", word);
        else
            fprintf(f, " \\\n    '%d:%s", pos++, word);
        if (!strcmp(word, "file") || !strcmp(word, "url"))
            fputs(":_files'", f);
        else if (!strcmp(word, "dir"))
            fputs(":_files -/'", f);
        else if (!strcmp(word, "verb"))
            fputs(":_vmsnap_verbs'", f);
        else
            fputs(": '", f);
    }
    fputs("\n}\n\n", f);
}

static void zsh_described(FILE *f, const char *name, const char *summary)
{
    fputs("    '", f);
    zqm(f, name);
    fputc(':', f);
    zqs(f, summary, "");
    fputs("'\n", f);
}

static void zsh(FILE *f)
{
    size_t n;
    const struct cli_verb *vs = cli_verbs(&n);
    fprintf(f,
            "#compdef vmsnap\n# zsh completion for vmsnap(1) %s. Generated by the build "
            "(vmsnap help --completion zsh)\n# from the tables vmsnap parses its command "
            "line with; edits here are lost.\n\n",
            vmsnap_version());
    fputs("_vmsnap_verbs() {\n  local -a verbs\n  verbs=(\n", f);
    for (size_t i = 0; i < n; i++)
        zsh_described(f, vs[i].name, vs[i].summary);
    fputs("  )\n  _describe -t commands \"vmsnap verb\" verbs\n}\n\n", f);
    each_parser(zsh_parser, f);
    for (size_t i = 0; i < n; i++) {
        if (!vs[i].subs)
            continue;
        fprintf(f,
                "_vmsnap__%s() {\n  if (( CURRENT == 2 )); then\n    local -a subs\n"
                "    subs=(\n",
                vs[i].name);
        for (const struct cli_sub *s = vs[i].subs; s->name; s++)
            fprintf(f, "  "), zsh_described(f, s->name, s->summary);
        fprintf(f,
                "    )\n    _describe -t commands \"vmsnap %s sub-verb\" subs\n  else\n"
                "    shift words\n    (( CURRENT-- ))\n"
                "    (( $+functions[_vmsnap__%s__$words[1]] )) && _vmsnap__%s__$words[1]\n"
                "  fi\n}\n\n",
                vs[i].name, vs[i].name, vs[i].name);
    }
    fputs("_vmsnap() {\n  local curcontext=$curcontext state line\n  _arguments -C", f);
    FOR_ROWS(o, cli_global_opts)
    {
        zsh_opt(f, o);
    }
    fputs(" \\\n    '1:verb:_vmsnap_verbs' \\\n    '*:: :->args'\n"
          "  [[ $state == args ]] && (( $+functions[_vmsnap__$words[1]] )) && "
          "_vmsnap__$words[1]\n}\n\n_vmsnap \"$@\"\n",
          f);
}

int cli_doc_completion(int argc, char **argv)
{
    if (argc < 2 || argc > 3 || (strcmp(argv[1], "bash") && strcmp(argv[1], "zsh")))
        return cli_usage("help", "--completion wants bash or zsh, and a file (default: stdout)");
    if (cli_doc_check() < 0)
        return EXIT_FAIL;
    FILE *f = argc == 3 ? fopen(argv[2], "we") : stdout;
    if (!f)
        return cli_fail_code("help", errno, "%s: %s", argv[2], strerror(errno));
    if (!strcmp(argv[1], "bash"))
        bash(f);
    else
        zsh(f);
    bool ok = !ferror(f);
    if ((f == stdout ? fflush(f) : fclose(f)) != 0 || !ok)
        return cli_fail_code("help", EIO, "%s: write failed", argc == 3 ? argv[2] : "stdout");
    return EXIT_OK;
}
