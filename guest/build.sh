#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Build the "counter" test guest from Debian packages only, into a cache directory outside the
# repository (default /var/cache/vmsnap-guest, or $VMSNAP_GUEST_DIR, or the first argument):
#   vmlinux          the kernel ELF (PVH entry), unpacked from the XZ payload of the bzImage of
#                    Debian's linux-image-<ver>-amd64 (fetched with `apt-get download`)
#   initrd.cpio.gz   busybox-static, guest/init as /init, and the virtio-mmio / virtio-blk / ext4
#                    modules, and evdev and the ACPI button (the power button: a graceful stop),
#                    with their dependencies, from the same kernel package
#   cmdline          the kernel command line that boots reliably under TCG
# Idempotent: a finished build (stamp matching the kernel version and this script's inputs) is
# reused. Prints the cache directory on stdout.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-${VMSNAP_GUEST_DIR:-/var/cache/vmsnap-guest}}
mkdir -p "$out/dl"
out=$(cd "$out" && pwd)

for t in apt-get dpkg-deb xz cpio gzip depmod; do
    command -v "$t" >/dev/null || { echo "guest/build.sh: $t missing (scripts/deps.sh vm)" >&2; exit 1; }
done
# The initramfs has no libc: only Debian's busybox-static will do.
dpkg-query -W -f='${Status}' busybox-static 2>/dev/null | grep -q "install ok installed" ||
    { echo "guest/build.sh: busybox-static missing (scripts/deps.sh vm)" >&2; exit 1; }
busybox=/bin/busybox

# The kernel the meta package points at (pinned by VMSNAP_GUEST_KERNEL if set).
kpkg=${VMSNAP_GUEST_KERNEL:-$(apt-cache depends linux-image-amd64 2>/dev/null |
    sed -n 's/^ *Depends: \(linux-image-[0-9].*-amd64\)$/\1/p' | head -n1)}
[ -n "$kpkg" ] || { echo "guest/build.sh: cannot tell the kernel package (apt-cache depends linux-image-amd64)" >&2; exit 1; }
kver=${kpkg#linux-image-}

stamp="$kpkg $(cat "$here/init" "$0" | md5sum | cut -d' ' -f1) $(md5sum <"$busybox" | cut -d' ' -f1)"
if [ -f "$out/stamp" ] && [ "$(cat "$out/stamp")" = "$stamp" ] &&
    [ -f "$out/vmlinux" ] && [ -f "$out/initrd.cpio.gz" ] && [ -f "$out/cmdline" ]; then
    echo "$out"
    exit 0
fi

deb=$(ls "$out/dl/${kpkg}_"*.deb 2>/dev/null | head -n1 || true)
if [ -z "$deb" ]; then
    (cd "$out/dl" && apt-get download "$kpkg" >&2) || {
        echo "guest/build.sh: apt-get download $kpkg failed" >&2
        exit 1
    }
    deb=$(ls "$out/dl/${kpkg}_"*.deb | head -n1)
fi

work=$(mktemp -d "$out/build.XXXXXX")
trap 'rm -rf "$work"' EXIT
dpkg-deb -x "$deb" "$work/pkg"
vmlinuz="$work/pkg/boot/vmlinuz-$kver"

# The bzImage's payload is XZ: decompress from the first XZ magic (FD 37 7A 58 5A 00). xz
# complains about the trailing bytes after the stream; the ELF is complete by then.
off=$(LC_ALL=C grep -obUaP '\xfd7zXZ\x00' "$vmlinuz" | head -n1 | cut -d: -f1 || true)
[ -n "$off" ] || { echo "guest/build.sh: no XZ payload in $vmlinuz" >&2; exit 1; }
tail -c +"$((off + 1))" "$vmlinuz" | xz -dc --single-stream >"$work/vmlinux" 2>/dev/null || true
head -c 4 "$work/vmlinux" | grep -q 'ELF' || { echo "guest/build.sh: unpacked kernel is not an ELF" >&2; exit 1; }

# Initramfs: busybox, /init, the modules in dependency order.
root="$work/root"
mkdir -p "$root/bin" "$root/etc" "$root/lib/modules"
cp "$busybox" "$root/bin/busybox"
cp "$here/init" "$root/init"
chmod 0755 "$root/init" "$root/bin/busybox"
mdir="$work/pkg/lib/modules/$kver"
# The package ships no modules.dep (depmod runs at install time): generate it in the tree.
depmod -b "$work/pkg" "$kver"
declare -A seen=()
order=()
add_mod() { # add_mod PATH-relative-to-mdir: dependencies first
    local m=$1 d
    [ -n "${seen[$m]:-}" ] && return
    seen[$m]=1
    for d in $(sed -n "s|^$m: *||p" "$mdir/modules.dep"); do add_mod "$d"; done
    order+=("$m")
}
for name in virtio_mmio virtio_blk crc32c_generic ext4 evdev button; do
    m=$(grep -o "^[^:]*/$name\.ko[^:]*" "$mdir/modules.dep" | head -n1)
    [ -n "$m" ] || { echo "guest/build.sh: module $name not in $kpkg" >&2; exit 1; }
    add_mod "$m"
done
: >"$root/etc/modules-order"
for m in "${order[@]}"; do
    base=$(basename "$m")
    case "$base" in
    *.xz) xz -dc "$mdir/$m" >"$root/lib/modules/${base%.xz}"; base=${base%.xz} ;;
    *) cp "$mdir/$m" "$root/lib/modules/$base" ;;
    esac
    echo "$base" >>"$root/etc/modules-order"
done
(cd "$root" && find . | LC_ALL=C sort | cpio -o -H newc --quiet | gzip -6) >"$work/initrd.cpio.gz"

# tsc_early_khz/lpj skip an early timer calibration that hung once under TCG.
echo "console=ttyS0 quiet panic=-1 tsc_early_khz=2445000 lpj=9780000" >"$work/cmdline"

mv "$work/vmlinux" "$out/vmlinux"
mv "$work/initrd.cpio.gz" "$out/initrd.cpio.gz"
mv "$work/cmdline" "$out/cmdline"
echo "$stamp" >"$out/stamp"
echo "$out"
