#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# A/B of two vmsnap binaries in one run, interleaved (A B, B A, A B, ...) so that drift in the
# machine's load hits both alike: pack -j2 and unpack -j2 of the codec bench's image on tmpfs,
# then push -j8 and pull -j8 of it through a loopback Ceph RGW (tests/rgw-up.sh) and the local
# store. Prints a Markdown table: median wall s and CPU s (user+sys) of each, and B/A ratios.
#   bench/ab.sh OLD_VMSNAP NEW_VMSNAP      AB_REPS=5  SIZE_MIB=2048  AB_S3=1 (0: no RGW)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
. "$here/bench/lib.sh"
A=$(realpath "${1:?usage: bench/ab.sh OLD_VMSNAP NEW_VMSNAP}")
B=$(realpath "${2:?usage: bench/ab.sh OLD_VMSNAP NEW_VMSNAP}")
REPS=${AB_REPS:-5}
SIZE_MIB=${SIZE_MIB:-2048}
W=$(mktemp -d /dev/shm/vmsnap-ab.XXXXXX)
STATE=$(mktemp -d /tmp/vmsnap-ab-rgw.XXXXXX)
trap 'bash "$here/tests/rgw-down.sh" "$STATE" >/dev/null 2>&1; rm -rf "$W" "$STATE"' EXIT
python3 "$here/scripts/gen-guest-image.py" "$W/memory-ranges" "$SIZE_MIB" 0.25 1
cd "$W"
S3=${AB_S3:-1}
if [ "$S3" = 1 ]; then
    bash "$here/tests/rgw-up.sh" "$STATE" >/dev/null 2>&1
    . "$STATE/env"
    curl -sS -o /dev/null --aws-sigv4 "aws:amz:us-east-1:s3" --user "$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY" \
        -H "x-amz-content-sha256: e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855" \
        -X PUT "$AWS_ENDPOINT_URL/abbench"
fi

declare -A WALLS CPUS
# one NAME BIN CMD: one timed run, appended to the lists of NAME/BIN
one() {
    local key="$1|$2" tf
    tf=$(mktemp)
    /usr/bin/time -f '%e %U %S' -o "$tf" bash -c "$3" >/dev/null 2>"$tf.err" ||
        { echo "ab: '$1' with $2 failed: $(tail -3 "$tf.err")" >&2; exit 1; }
    read -r w u s <"$tf"
    WALLS[$key]="${WALLS[$key]:-} $w"
    CPUS[$key]="${CPUS[$key]:-} $(echo "$u + $s" | bc)"
    rm -f "$tf" "$tf.err"
}
median() { tr ' ' '\n' | grep . | sort -n | sed -n "$(( (REPS + 1) / 2 ))p"; }
NAMES=("pack -j2" "unpack -j2" "push -j8 local" "pull -j8 local")
[ "$S3" = 1 ] && NAMES+=("push -j8 RGW" "pull -j8 RGW")
for i in $(seq 1 "$REPS"); do
    # the order alternates: what runs right after an RGW push shares the CPU with RGW's own
    # background work, and that must not always be the same binary
    order="A B"
    [ $((i % 2)) = 0 ] && order="B A"
    for bin in $order; do
        v=${!bin}
        one "pack -j2" $bin "rm -f p.$bin.vs; '$v' -q pack -j2 memory-ranges p.$bin.vs"
        one "unpack -j2" $bin "rm -f out.$bin; '$v' -q unpack -j2 p.$bin.vs out.$bin"
        one "push -j8 local" $bin "rm -rf st.$bin; '$v' -q push -j8 memory-ranges $W/st.$bin/mr"
        one "pull -j8 local" $bin "rm -f outl.$bin; '$v' -q pull -j8 $W/st.$bin/mr outl.$bin"
        if [ "$S3" = 1 ]; then
            one "push -j8 RGW" $bin "'$v' -q push -j8 memory-ranges s3://abbench/$bin/mr"
            one "pull -j8 RGW" $bin "rm -f outs.$bin; '$v' -q pull -j8 s3://abbench/$bin/mr outs.$bin"
        fi
    done
    # each binary's outputs are right, and the same bytes
    cmp -s p.A.vs p.B.vs || { echo "ab: the two binaries' pack outputs differ" >&2; exit 1; }
    for f in out.A out.B outl.A outl.B; do cmp -s memory-ranges "$f" || { echo "ab: $f differs" >&2; exit 1; }; done
    if [ "$S3" = 1 ]; then for f in outs.A outs.B; do cmp -s memory-ranges "$f" || { echo "ab: $f differs" >&2; exit 1; }; done; fi
done
echo "### A/B, $(date -u +%Y-%m-%d), $(machine_line)"
echo
echo "A = $1, B = $2; ${SIZE_MIB} MiB image ($(( $(du -B1 memory-ranges | cut -f1) >> 20 )) MiB allocated) on tmpfs;"
echo "median of $REPS interleaved runs; CPU = user+sys s of the client (RGW's own CPU not counted)."
echo
echo "| operation | A wall s | B wall s | B/A wall | A CPU s | B CPU s | B/A CPU |"
echo "|---|---|---|---|---|---|---|"
for n in "${NAMES[@]}"; do
    aw=$(median <<<"${WALLS[$n|A]}"); bw=$(median <<<"${WALLS[$n|B]}")
    ac=$(median <<<"${CPUS[$n|A]}"); bc_=$(median <<<"${CPUS[$n|B]}")
    echo "| $n | $aw | $bw | $(echo "scale=3; $bw / $aw" | bc) | $ac | $bc_ | $(echo "scale=3; $bc_ / $ac" | bc) |"
done
