#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# The main job on the embedded default: make a guest-memory-like image (sparse, 2 GiB logical,
# about 25% populated) on tmpfs, as a VMM leaves guest RAM, pack it, inspect it, unpack it,
# check the round trip, and print sizes and rates.
set -euo pipefail
VMSNAP=${1:-build/vmsnap}
here=$(cd "$(dirname "$0")/.." && pwd)
base=${VMSNAP_DEMO_DIR:-/dev/shm}
[ -d "$base" ] && [ -w "$base" ] || base=${TMPDIR:-/tmp}
work=$(mktemp -d "$base/vmsnap-demo.XXXXXX")
trap 'rm -rf "$work"' EXIT
size_mib=${VMSNAP_DEMO_SIZE_MIB:-2048}

echo "== generating a ${size_mib} MiB guest-memory-like image in $work"
python3 "$here/scripts/gen-guest-image.py" "$work/memory-ranges" "$size_mib" 0.25 1
printf '   logical %s, allocated %s\n' "$(du -h --apparent-size "$work/memory-ranges" | cut -f1)" \
    "$(du -h "$work/memory-ranges" | cut -f1)"

echo "== vmsnap pack (all CPUs)"
"$VMSNAP" pack "$work/memory-ranges" "$work/memory-ranges.zstd" 2>&1
echo "== vmsnap inspect --verify"
"$VMSNAP" inspect --verify "$work/memory-ranges.zstd"
echo "== vmsnap unpack (all CPUs)"
"$VMSNAP" unpack "$work/memory-ranges.zstd" "$work/restored" 2>&1
cmp "$work/memory-ranges" "$work/restored"
printf '== round trip identical; restored file allocates %s (sparse)\n' \
    "$(du -h "$work/restored" | cut -f1)"
