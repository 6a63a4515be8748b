# SPDX-License-Identifier: Apache-2.0
# Shared by advice.sh and vm_advice.sh: every message of the tree that advises a command
# ('vmsnap VERB ...' in a string literal) is provoked in the state that prints it, and the command
# it advises is run as the message spells it and must succeed.
#
# The coverage table: each script declares, one per line in ADVICE_TABLE,
#   FILE^COMMAND^FRAGMENT^CASE
# FILE a source file, COMMAND the quoted command as the source spells it ('vmsnap gc',
# 'vmsnap vm resume %s URL'), FRAGMENT a piece of the same message (string literals joined), CASE
# the name of the case that provokes it, or "none: REASON" for a message whose state cannot be
# produced here (REASON says why), or "elsewhere: WHERE" for one that another script provokes
# (WHERE names it and its case). advice_check_table fails for a message of the scanned
# directories that no line covers (an advising message added without a test), for a line that
# covers none (a message changed under its test), and for a CASE that never saw its message
# (advice_seen) by the end.

# advice_sites DIR...: every advising message under DIR (*.c; not under $ADVICE_EXCLUDE), one per
# line: FILE^COMMAND^TEXT, TEXT the message's adjacent string literals joined (comments and char
# literals skipped)
advice_sites() {
    python3 - "$SRC" "${ADVICE_EXCLUDE:-}" "$@" <<'PY'
import os, re, sys
root, exclude = sys.argv[1], sys.argv[2]
def literals(src):
    """(line, joined text) of each run of adjacent string literals."""
    i, n, line, out = 0, len(src), 1, []
    run, start, last_end = None, 0, -1
    while i < n:
        c = src[i]
        if c == '\n':
            line += 1
        if src.startswith('//', i):
            j = src.find('\n', i)
            i = n if j < 0 else j
            continue
        if src.startswith('/*', i):
            j = src.find('*/', i + 2)
            line += src.count('\n', i, j)
            i = n if j < 0 else j + 2
            continue
        if c == "'":
            j = i + 1
            while j < n and src[j] != "'":
                j += 2 if src[j] == '\\' else 1
            i = j + 1
            continue
        if c == '"':
            j, buf = i + 1, []
            while j < n and src[j] != '"':
                if src[j] == '\\':
                    buf.append(src[j:j + 2])
                    j += 2
                else:
                    buf.append(src[j])
                    j += 1
            text = ''.join(buf)
            between = src[last_end:i] if last_end >= 0 else 'x'
            if run is not None and re.fullmatch(r'\s*', between):
                run += text
            else:
                if run is not None:
                    out.append((start, run))
                run, start = text, line
            last_end = i = j + 1
            continue
        i += 1
    if run is not None:
        out.append((start, run))
    return out
for d in sys.argv[3:]:
    for base, _, files in sorted(os.walk(os.path.join(root, d))):
        for f in sorted(files):
            if not f.endswith('.c'):
                continue
            p = os.path.join(base, f)
            rel = os.path.relpath(p, root)
            if exclude and rel.startswith(exclude):
                continue
            for ln, text in literals(open(p, encoding='utf-8', errors='replace').read()):
                for m in re.finditer(r"'vmsnap [a-z][^']*'", text):
                    print(f"{rel}^{m.group(0)}^{text}")
PY
}

ADVICE_SEEN=" "
# advice_seen CASE: the case saw its message (printed in the state it provoked)
advice_seen() { ADVICE_SEEN+="$1 "; }

# advice_check_table DIR...: the coverage check described above, over the messages under DIR
advice_check_table() {
    local sites line f c frag cs covered used=" " n=0 fails0=$fails
    sites=$(advice_sites "$@") || { fail "cannot scan $* for advising messages"; return; }
    [ -n "$sites" ] || { fail "no advising message found under $* (the scan is broken)"; return; }
    while IFS= read -r line; do
        n=$((n + 1))
        covered=
        local i=0
        while IFS="^" read -r f c frag cs; do
            i=$((i + 1))
            [ -n "$f" ] || continue
            if [ "${line%%^*}" = "$f" ] && [[ "$line" == "$f^$c^"*"$frag"* ]]; then
                covered=$i
                used+="$i "
                break
            fi
        done <<<"$ADVICE_TABLE"
        [ -n "$covered" ] || fail "an advising message has no test case (add one and a line to ADVICE_TABLE): $line"
    done <<<"$sites"
    local i=0
    while IFS="^" read -r f c frag cs; do
        i=$((i + 1))
        [ -n "$f" ] || continue
        [[ "$used" == *" $i "* ]] || fail "ADVICE_TABLE line covers no message (changed or gone?): $f^$c^$frag"
    done <<<"$ADVICE_TABLE"
    [ "$fails" != "$fails0" ] || echo "advice: $n advising messages under $*, each in the table" >&2
}

# advice_check_seen: every case named in the table saw its message
advice_check_seen() {
    local f c frag cs
    while IFS="^" read -r f c frag cs; do
        [ -n "$f" ] || continue
        case $cs in none:* | elsewhere:*) continue ;; esac
        [[ "$ADVICE_SEEN" == *" $cs "* ]] || fail "case $cs never saw its message ($f: $c)"
    done <<<"$ADVICE_TABLE"
}

# advised FILE PREFIX: the first command quoted in FILE ('vmsnap ...') that starts with PREFIX,
# without its quotes; status 1 (and a failure) when there is none
advised() {
    local cmd
    cmd=$(grep -o "'vmsnap [^']*'" "$1" | tr -d "'" | awk -v p="$2" 'index($0, p) == 1 { print; exit }')
    if [ -z "$cmd" ]; then
        fail "no '$2...' advised in: $(head -c 600 "$1")"
        return 1
    fi
    echo "$cmd"
}

# run_advised DESC CMD: run CMD (a command as a message spells it: 'vmsnap' stands for the binary
# under test, words split at spaces) and require exit 0; its output in $T/adv.out, $T/adv.err
run_advised() {
    local desc=$1 rc=0
    local -a w
    read -ra w <<<"$2"
    [ "${w[0]}" = vmsnap ] || { fail "$desc: advised command is not vmsnap's: $2"; return 1; }
    "$VMSNAP" "${w[@]:1}" >"$T/adv.out" 2>"$T/adv.err" || rc=$?
    if [ "$rc" != 0 ]; then
        fail "$desc: the advised '$2' exits $rc: $(head -c 600 "$T/adv.err")"
        return 1
    fi
}

# placeholder WORD VALUE CMD: CMD with the placeholder word WORD (URL, DIR, VERB) put as VALUE
placeholder() {
    local out=" $3 "
    out=${out// $1 / $2 }
    out=${out# }
    echo "${out% }"
}
# is_failure RC: a failure's exit code (1, or 3-7 by its class: docs/cli.md)
is_failure() { case $1 in 1 | [3-7]) return 0 ;; esac; return 1; }
