#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# The VM demo: build the counter guest if needed, run it, suspend it to a local store, resume it
# as if on another node (another state directory), and show both counters continuing, with the
# timing breakdown of each step. Everything lives in a temporary directory that is removed.
#   guest/demo.sh [VMSNAP_BINARY]
set -euo pipefail
VMSNAP=${1:-build/vmsnap}
here=$(cd "$(dirname "$0")/.." && pwd)
G=$(bash "$here/guest/build.sh")
work=$(mktemp -d "${TMPDIR:-/tmp}/vmsnap-vmdemo.XXXXXX")
a=$work/node-a b=$work/node-b store=$work/store
trap '"$VMSNAP" vm stop --rm --state-dir "$a" demo >/dev/null 2>&1 || true
      "$VMSNAP" vm stop --rm --state-dir "$b" demo >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
counters() { tr -d '\r' <"$1/vms/demo/console.log" | grep 'vmsnap-counter' | tail -n "${2:-1}"; }
wait_ticks() { # wait_ticks STATE N: until the console has N more counter lines
    local s=$1 want i
    want=$(($(tr -d '\r' <"$s/vms/demo/console.log" | grep -c 'vmsnap-counter' || true) + $2))
    for ((i = 0; i < 600; i++)); do
        [ "$(tr -d '\r' <"$s/vms/demo/console.log" | grep -c 'vmsnap-counter' || true)" -ge "$want" ] && return
        sleep 0.1
    done
    echo "demo: the guest did not tick" >&2
    exit 1
}

echo "== vmsnap vm run (512 MiB guest, TCG unless the CPU has vmx/svm)"
"$VMSNAP" -v vm run demo --state-dir "$a" --kernel "$G/vmlinux" --initrd "$G/initrd.cpio.gz" \
    --mem 512M --disk-size 1G --append "$(cat "$G/cmdline") vmsnap.dirty=64"
touch "$a/vms/demo/console.log"
wait_ticks "$a" 3
counters "$a" 2
echo "== vmsnap vm suspend demo $store/demo"
"$VMSNAP" -v vm suspend demo "$store/demo" --state-dir "$a"
"$VMSNAP" vm ls --state-dir "$a"
echo "== vmsnap vm resume demo $store/demo (another state directory: another node; it runs the"
echo "   snapshot's kernel and initrd only from a directory it trusts: --asset-dir)"
"$VMSNAP" -v vm resume demo "$store/demo" --state-dir "$b" --asset-dir "$G"
wait_ticks "$b" 2
echo "   before suspend: $(counters "$a")"
echo "   after resume:   $(counters "$b" 2 | head -n1)"
"$VMSNAP" vm ls --state-dir "$b"
