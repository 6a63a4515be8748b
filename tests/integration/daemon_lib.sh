# SPDX-License-Identifier: Apache-2.0
# Shared by the shell tests of vmsnapd (docs/daemon.md): a real daemon on a unix socket under $T,
# its API through curl --unix-socket, operations waited for through ?wait=.
# Source after tests/lib.sh. The daemon's environment carries no AWS keys: a store is reached
# only through a profile configured on the node (d_profile), whose keys are in $DAWS_CREDS.
VMSNAPD=${VMSNAP_BUILD:?}/vmsnapd
[ -x "$VMSNAPD" ] || skip "$VMSNAPD not built (libmicrohttpd-dev, libsystemd-dev: scripts/deps.sh)"
command -v curl >/dev/null || skip "curl not installed"
DSOCK=$T/vmsnapd.sock
DLOG=$T/vmsnapd.log
DPID=
DAWS_CREDS=$T/aws-credentials
: >"$DAWS_CREDS"
chmod 600 "$DAWS_CREDS"
DAEMON_ARGS=()
# more of the daemon's environment (NAME=VALUE), e.g. AWS_ENDPOINT_URL: a request naming no
# profile then reaches that store, without keys
DAEMON_ENV=()

# daemon_profile NAME KEY SECRET: an AWS profile the daemon's profiles may name
daemon_profile() {
    printf '[%s]\naws_access_key_id = %s\naws_secret_access_key = %s\n' "$1" "$2" "$3" >>"$DAWS_CREDS"
}

# daemon_start [--set KEY=VALUE]...: start vmsnapd (the arguments kept for daemon_restart) and
# wait until its socket accepts
daemon_start() {
    DAEMON_ARGS=("$@")
    daemon_restart
}
daemon_restart() {
    rm -f "$T/vmsnapd.ready"
    env -u AWS_ACCESS_KEY_ID -u AWS_SECRET_ACCESS_KEY -u AWS_SESSION_TOKEN -u AWS_PROFILE \
        -u AWS_ENDPOINT_URL AWS_SHARED_CREDENTIALS_FILE="$DAWS_CREDS" \
        AWS_CONFIG_FILE=/nonexistent/aws-config ${DAEMON_ENV[@]+"${DAEMON_ENV[@]}"} \
        "$VMSNAPD" --socket "$DSOCK" \
        ${DAEMON_ARGS[@]+"${DAEMON_ARGS[@]}"} 2>>"$DLOG" &
    DPID=$!
    local i
    for ((i = 0; i < 600; i++)); do
        kill -0 "$DPID" 2>/dev/null || {
            fail "vmsnapd exited at start: $(tail -n 5 "$DLOG")"
            DPID=
            return 1
        }
        curl -s -m 5 --unix-socket "$DSOCK" -o /dev/null http://localhost/healthz && return 0
        sleep 0.05
    done
    fail "vmsnapd did not start listening"
    return 1
}
# daemon_stop [SIGNAL]: stop it (SIGTERM: a clean stop, exit 0 expected)
daemon_stop() {
    local sig=${1:-TERM} rc=0
    [ -n "$DPID" ] || return 0
    kill -"$sig" "$DPID" 2>/dev/null || true
    wait "$DPID" || rc=$?
    DPID=
    return "$rc"
}
at_exit 'daemon_stop KILL'

# dapi METHOD PATH [BODY]: the HTTP status on stdout, the answer's body in $T/resp
dapi() {
    local data=()
    [ $# -lt 3 ] || data=(-H 'Content-Type: application/json' --data-binary "$3")
    curl -s -m 90 --unix-socket "$DSOCK" -o "$T/resp" -w '%{http_code}' -X "$1" ${data[@]+"${data[@]}"} \
        "http://localhost$2"
}
# dj EXPR: the Python expression EXPR over `j`, the last answer's body
dj() { jget "$T/resp" "$1"; }

# dsubmit METHOD PATH BODY: an operation admitted (202): its id on stdout; status 1 otherwise
dsubmit() {
    local st
    st=$(dapi "$@")
    [ "$st" = 202 ] || {
        fail "$1 $2 $3: status $st: $(head -c 400 "$T/resp")"
        return 1
    }
    dj 'j["operation"]["id"]'
}
# dwait ID: wait for the operation's end; its object in $T/op.json; status 0 when it is done
dwait() {
    local i st state
    for ((i = 0; i < 100; i++)); do
        st=$(dapi GET "/v1/operations/$1?wait=30")
        [ "$st" = 200 ] || { fail "GET operation $1: $st $(head -c 300 "$T/resp")"; return 1; }
        state=$(dj 'j["operation"]["state"]')
        case $state in queued | running) ;; *) break ;; esac
    done
    jget "$T/resp" 'json.dumps(j["operation"])' >"$T/op.json"
    [ "$state" = done ]
}
# dop METHOD PATH BODY: submit and wait; a failure reported unless it is done (result in
# $T/op.json)
dop() {
    local id
    id=$(dsubmit "$@") || return 1
    dwait "$id" || {
        fail "$1 $2 $3: operation $(jget "$T/op.json" 'j["state"]'): $(jget "$T/op.json" 'j["error"]')"
        return 1
    }
}
# opj EXPR: over the last waited operation
opj() { jget "$T/op.json" "$1"; }
# dschema NAME: the last answer's body matches docs/openapi.yaml's schema NAME (the daemon tests'
# checker, tests/daemon/dlib.py); the mismatches reported
dschema() {
    local errs
    errs=$(python3 -c 'import json, sys, yaml
sys.path.insert(0, sys.argv[1] + "/tests/daemon")
from dlib import Schemas
s = Schemas(yaml.safe_load(open(sys.argv[1] + "/docs/openapi.yaml")))
print("\n".join(s.check(json.load(open(sys.argv[2])), {"$ref": "#/components/schemas/" + sys.argv[3]})))' \
        "$SRC" "$T/resp" "$1" 2>&1) || { fail "schema check $1: $errs"; return; }
    [ -z "$errs" ] || fail "the answer does not match $1: $errs: $(head -c 600 "$T/resp")"
}
