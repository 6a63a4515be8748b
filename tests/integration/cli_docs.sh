#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# The man pages and the bash and zsh completions, as `cmake --install` puts them into a prefix:
# man renders every page (the group pages and the per-verb pages that source them) and groff
# warns of nothing; the bash completion, sourced and called as readline does (COMP_WORDS,
# COMP_CWORD), completes verbs, sub-verbs, options, their values and paths; zsh parses _vmsnap
# and compinit registers it. And none of them drifts from the parser: the option list the CLI
# dumps from its tables (vmsnap help --options) is compared with what the bash completion
# offers, with each zsh function, with each man page and with vmsnap help VERB, and the parser
# itself is run on every option of every verb and sub-verb (taken, with a valid value, up to a
# following --help) and on every other verb's option (refused, exit 2).
. "${VMSNAP_SRC:?run through ctest}/tests/lib.sh"
BUILD=${VMSNAP_BUILD:?}
P=$T/prefix
cmake --install "$BUILD" --prefix "$P" >"$T/install.log" 2>&1 || { cat "$T/install.log" >&2; fail "cmake --install"; done_tests; }
BASHC=$P/share/bash-completion/completions/vmsnap
ZSHC=$P/share/zsh/site-functions/_vmsnap
MAN1=$P/share/man/man1
V=$P/bin/vmsnap
for f in "$BASHC" "$ZSHC" "$MAN1/vmsnap.1"; do
    [ -s "$f" ] || fail "not installed: ${f#"$P"/}"
done
[ "$fails" = 0 ] || done_tests
# what is installed is what this binary generates (not files left by another build)
"$V" help --completion bash | cmp -s - "$BASHC" || fail "installed bash completion differs from vmsnap help --completion bash"
"$V" help --completion zsh | cmp -s - "$ZSHC" || fail "installed zsh completion differs from vmsnap help --completion zsh"
mkdir "$T/gen" && "$V" help --man "$T/gen" && diff -r "$T/gen" "$MAN1" >/dev/null ||
    fail "installed man pages differ from vmsnap help --man"

# The data: verb, sub-verb (- none), spelling, argument (- none), kind, use (yes, refused,
# ignored, common, global), man page
"$V" help --options | grep -v '^#' >"$T/opts" || fail "help --options"
[ "$(wc -l <"$T/opts")" -gt 150 ] || fail "help --options lists $(wc -l <"$T/opts") spellings"
# the parsers whose options are listed: "verb" or "verb sub"
awk -F'\t' '$1 != "-" { print ($2 == "-" ? $1 : $1 " " $2) }' "$T/opts" | uniq >"$T/parsers"
# spellings VERB [SUB] [USES]: the spellings of that parser with one of USES (regex), sorted
spellings() {
    awk -F'\t' -v v="$1" -v s="${2:--}" -v u="^(${3:-yes|common})\$" \
        '$1 == v && $2 == s && $6 ~ u { print $3 }' "$T/opts" | sort -u
}
# every parser is table-driven: no getopt table under cli/ but the one cli_getopt builds
[ "$(grep -l 'struct option\b' "$SRC"/cli/*.c)" = "$SRC/cli/util.c" ] ||
    fail "a getopt_long table outside cli/util.c (options that the docs cannot list): $(grep -l 'struct option\b' "$SRC"/cli/*.c)"

# ---- the bash completion ----
# complete WORD...: COMPREPLY, sorted, one a line, for the command line WORD... (the last one is
# the word under the cursor), in $T/cwd
mkdir -p "$T/cwd/sub.d" && touch "$T/cwd/alpha" "$T/cwd/alps" "$T/cwd/beta"
complete_words() {
    (cd "$T/cwd" && bash -c '. "$1" || exit 1; shift; COMP_WORDS=("$@"); COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
        _vmsnap || exit 1; printf "%s\n" "${COMPREPLY[@]}"' _ "$BASHC" "$@") | sed '/^$/d' | sort
}
expect_complete() { # WANT (space-separated) WORD...
    local want=$1 got
    shift
    got=$(complete_words "$@" | tr '\n' ' ')
    [ "$got" = "${want:+$want }" ] || fail "bash completion of '$*': got '$got', want '$want'"
}
bash -c ". '$BASHC' && complete -p vmsnap" 2>&1 | grep -q -- '-F _vmsnap vmsnap$' || fail "bash: no complete -F _vmsnap vmsnap"
expect_complete "pull push" vmsnap pu
expect_complete "pull push" vmsnap -q --json pu
expect_complete "--parent --part-size" vmsnap push --par
expect_complete "stop suspend" vmsnap vm s
expect_complete "stop suspend" vmsnap vm -q s
expect_complete "clone create" vmsnap disk c
expect_complete "layered reference" vmsnap push --layout ''
expect_complete "reference" vmsnap push --layout = re
expect_complete "auto kvm tcg" vmsnap vm run --accel ''
expect_complete "pull push" vmsnap help pu
expect_complete "" vmsnap pull --lev          # pull refuses --level: not offered
expect_complete "--max-size" vmsnap cache trim --max
expect_complete "" vmsnap cache objects --max # objects refuses it
expect_complete "--kernel" vmsnap vm resume --ker
# paths where the operand is a path, nothing where it is a name or there is none
expect_complete "alpha alps" vmsnap pack al
expect_complete "alpha alps" vmsnap pack alpha al
expect_complete "" vmsnap pack alpha beta al
expect_complete "alpha alps" vmsnap pack --level 3 alpha al
expect_complete "alpha alps" vmsnap pack --level=3 alpha al
expect_complete "alpha alps" vmsnap cache stat alpha beta al
expect_complete "" vmsnap vm pause al
expect_complete "alpha alps" vmsnap vm suspend vm1 al
expect_complete "alpha alps" vmsnap push --parent al
expect_complete "sub.d" vmsnap disk create --from-dir s
expect_complete "" vmsnap cache objects al
# the verbs are those of the usage, the globals those the CLI takes before a verb
"$V" help >"$T/usage"
usage_verbs=$(sed -n '/^verbs:/,/^$/s/^  \([a-z]*\).*/\1/p' "$T/usage" | sort | tr '\n' ' ')
[ "$(complete_words vmsnap '' | tr '\n' ' ')" = "$usage_verbs" ] ||
    fail "bash: verbs $(complete_words vmsnap '' | tr '\n' ' '), usage lists $usage_verbs"
[ "$(complete_words vmsnap - | tr '\n' ' ')" = "$(spellings - - global | tr '\n' ' ')" ] ||
    fail "bash: global options $(complete_words vmsnap - | tr '\n' ' ')"
# per parser: what the completion offers after '-' is exactly the options the parser uses
while read -r v s; do
    # shellcheck disable=SC2086
    got=$(complete_words vmsnap $v $s - | tr '\n' ' ')
    want=$(spellings "$v" "$s" | tr '\n' ' ')
    [ "$got" = "$want" ] || fail "bash: '$v $s -' offers '$got', the parser uses '$want'"
done <"$T/parsers"

# ---- zsh ----
if command -v zsh >/dev/null; then
    zsh -n "$ZSHC" || fail "zsh -n _vmsnap"
    out=$(zsh -fc "fpath=('${ZSHC%/*}' \$fpath); autoload -Uz compinit && compinit -u -d '$T/zcompdump' && print -r -- \${_comps[vmsnap]}" 2>&1)
    [ "$out" = _vmsnap ] || fail "zsh compinit does not register _vmsnap for vmsnap: $out"
    # each parser's function names exactly its options: '*--name...', '*-x...', '(- *)-h...'
    while read -r v s; do
        fn=_vmsnap__$v${s:+__$s}
        got=$(sed -n "/^$fn() {/,/^}/p" "$ZSHC" | grep -o "^    '\(\*\|(- \*)\)--\?[A-Za-z][a-z0-9-]*" |
            sed "s/^    '\(\*\|(- \*)\)//" | sort -u | tr '\n' ' ')
        want=$(spellings "$v" "$s" | tr '\n' ' ')
        [ "$got" = "$want" ] || fail "zsh: $fn has '$got', the parser uses '$want'"
    done <"$T/parsers"
else
    [ "${VMSNAP_REQUIRE_ALL:-0}" = 1 ] && fail "zsh is not installed (scripts/deps.sh test)"
    echo "note: zsh not installed: its completion is not checked" >&2
fi

# ---- the parser: every option the tables list is taken, every other one refused ----
# sample ARG KIND: a valid value for an option's argument
sample() {
    case $2 in choice:*) set -- "${2#choice:}" && echo "${1%% *}" && return ;; esac
    case $1 in
    N | L) echo 1 ;;
    SECONDS) echo 5 ;;
    SIZE) echo 16M ;;
    DURATION) echo 10s ;;
    U) echo 0123abcd-0123-4567-89ab-0123456789ab ;;
    SRC:*) echo a:b ;;
    DEST*) echo d ;;
    DIR*) echo "$T" ;;
    FILE | K | I | BIN | PATH | URL) echo "$T/x" ;;
    LINE | A | R | NAME | TEXT) echo x ;;
    *) return 1 ;;
    esac
}
cut -f3 "$T/opts" | sort -u >"$T/all"
while read -r v s; do
    [ "$v" = help ] || [ "$v" = version ] && continue # (they parse no options: -q/-v only, in main)
    taken=" $(spellings "$v" "$s" 'yes|ignored|common' | tr '\n' ' ')"
    while IFS=$'\t' read -r _ _ sp arg kind use _; do
        [ "$arg" = - ] && val=() || { val=("$(sample "$arg" "$kind")") || { fail "cli_docs.sh: no sample value for $arg ($v $s $sp): add one"; continue; }; }
        # shellcheck disable=SC2086
        rc=0 && "$V" $v $s "$sp" ${val[@]+"${val[@]}"} --help >"$T/p.out" 2>"$T/p.err" || rc=$?
        case $use in
        refused) [ "$rc" = 2 ] && grep -q 'is an option of\|usage' "$T/p.err" ||
            fail "parser: '$v $s $sp' is listed as refused but exit $rc: $(head -c 200 "$T/p.err")" ;;
        *) [ "$rc" = 0 ] && grep -q '^usage: vmsnap' "$T/p.out" ||
            fail "parser: '$v $s $sp ${val[*]}' is listed as taken but exit $rc: $(head -c 200 "$T/p.err")" ;;
        esac
    done < <(awk -F'\t' -v v="$v" -v s="${s:--}" '$1 == v && $2 == s' "$T/opts")
    # the options of other parsers that this one's table lacks: unknown, a usage error
    while read -r sp; do
        [[ "$taken" == *" $sp "* ]] && continue
        grep -qP "^$v\t${s:--}\t\Q$sp\E\t" "$T/opts" && continue # (its own, listed above)
        # shellcheck disable=SC2086
        rc=0 && "$V" $v $s "$sp" x --help >"$T/p.out" 2>"$T/p.err" || rc=$?
        [ "$rc" = 2 ] && grep -q "unknown option" "$T/p.err" ||
            fail "parser: '$v $s $sp' is in no table of it but exit $rc: $(head -c 200 "$T/p.err")"
    done <"$T/all"
done <"$T/parsers"
# the options before the verb
# (one taking an argument given one: --socket PATH, which version does not use)
while IFS=$'\t' read -r sp arg; do
    val=()
    [ "$arg" = - ] || val=("$T/none")
    rc=0 && "$V" "$sp" ${val[@]+"${val[@]}"} version >/dev/null 2>"$T/p.err" || rc=$?
    [ "$rc" = 0 ] || fail "parser: '$sp' before a verb is listed but exit $rc: $(cat "$T/p.err")"
done < <(awk -F'\t' '$1 == "-" && $2 == "-" && $6 == "global" { print $3 "\t" $4 }' "$T/opts" | sort -u)

# ---- vmsnap help VERB and VERB --help list the options of the tables, and only those ----
# help_opts FILE: the spellings at the start of the lines of its options lists
help_opts() { { sed -n '/^options/,$p' "$1" | grep -o '^  -[^ ,]*\(, --[a-z0-9-]*\)\?' || true; } | sed 's/^ *//; s/, /\n/' | sort -u; }
for v in $(cut -f1 "$T/parsers" | cut -d' ' -f1 | sort -u); do
    "$V" help "$v" >"$T/h.out" 2>&1 || fail "help $v"
    # every parser of the verb: its rows (not the common -h, -q, -v: one line for those)
    want=$(awk -F'\t' -v v="$v" '$1 == v && $6 == "yes" { print $3 }' "$T/opts" | sort -u | tr '\n' ' ')
    got=$(help_opts "$T/h.out" | { grep -vx -- '-h\|--help' || true; } | tr '\n' ' ')
    [ "$got" = "$want" ] || fail "help $v lists '$got', the tables '$want'"
done

# ---- the man pages ----
command -v man >/dev/null && command -v groff >/dev/null ||
    skip "man-db or groff not installed (scripts/deps.sh test)"
export MANPATH=$P/share/man MANWIDTH=80 LC_ALL=C.UTF-8
pages=$(cut -f7 "$T/opts" | sort -u)
for pg in $pages; do
    f=$MAN1/$pg.1
    [ -s "$f" ] || { fail "no man page $pg"; continue; }
    out=$(groff -ww -man -Tutf8 -z "$f" 2>&1) && [ -z "$out" ] || fail "groff -ww $pg: $out"
    man --warnings=w "$pg" >"$T/$pg.txt" 2>"$T/man.err" || fail "man $pg: exit $?"
    [ -s "$T/man.err" ] && fail "man --warnings $pg: $(head -c 300 "$T/man.err")"
    grep -q "^NAME" "$T/$pg.txt" && grep -q "^SYNOPSIS" "$T/$pg.txt" || fail "man $pg: no NAME/SYNOPSIS"
    # the options of the page's verbs, and nothing else that looks like one in its OPTIONS
    want=$(awk -F'\t' -v p="$pg" '$7 == p && ($6 == "yes" || $6 == "global") { print $3 }' "$T/opts" | sort -u | tr '\n' ' ')
    got=$(sed -n '/^OPTIONS/,/^[A-Z]/p' "$T/$pg.txt" | grep -o '^       -[^ ,]*\(, --[a-z0-9-]*\)\?' |
        sed 's/^ *//; s/, /\n/' | sort -u | tr '\n' ' ')
    [ "$got" = "$want" ] || fail "man $pg OPTIONS lists '$got', the tables '$want'"
done
# every verb has a page under its own name (.so of its group's), which man finds
for v in $(cut -f1 "$T/parsers" | cut -d' ' -f1 | sort -u | grep -vx 'help\|version'); do
    man --warnings=w "vmsnap-$v" >"$T/v.txt" 2>"$T/man.err" || { fail "man vmsnap-$v: exit $?"; continue; }
    [ -s "$T/man.err" ] && fail "man --warnings vmsnap-$v: $(head -c 300 "$T/man.err")"
    grep -q "vmsnap $v" "$T/v.txt" || fail "man vmsnap-$v does not show $v's synopsis"
done
# vmsnap(1): the exit codes of the usage, every verb, and every environment variable the
# sources read (and none they do not)
for c in $(sed -n '/^Exit codes:/,/^--json/p' "$T/usage" | grep -o '\b[0-9]\{1,3\} [a-z]' | cut -d' ' -f1); do
    sed -n '/^EXIT STATUS/,/^[A-Z]/p' "$T/vmsnap.txt" | grep -q "^       $c " || fail "man vmsnap: no exit code $c"
done
for v in $usage_verbs; do
    sed -n '/^VERBS/,/^[A-Z]/p' "$T/vmsnap.txt" | grep -q "^       $v\b" || fail "man vmsnap: no verb $v"
done
names_re='"\(AWS\|VMSNAP\|GS\|SSL\|CURL\|XDG\|GOOGLE\|GCE\|CLOUDSDK\|NO_GCE\)_[A-Z0-9_]*"'
# (cli/doc_man.c holds the man page's list itself)
src_env=$(grep -rhoI "$names_re" "$SRC/lib" "$SRC/cli" --include='*.c' --include='*.h' --exclude=doc_man.c | tr -d '"' | sort -u)
man_env=$(sed -n '/^ENVIRONMENT/,/^[A-Z]/p' "$T/vmsnap.txt" | grep -o '\b[A-Z][A-Z0-9]*_[A-Z0-9_]*[A-Z0-9]\b' | sort -u)
[ "$(wc -w <<<"$src_env")" -gt 30 ] || fail "the scan of the sources for environment variables found $(wc -w <<<"$src_env")"
for e in $src_env; do grep -qx "$e" <<<"$man_env" || fail "man vmsnap: ENVIRONMENT lacks $e (read in the sources)"; done
for e in $man_env; do grep -qx "$e" <<<"$src_env" || fail "man vmsnap: ENVIRONMENT lists $e, which no source reads"; done
done_tests
