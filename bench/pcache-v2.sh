#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# The page-cache bench (bench/pcache.sh) on cgroup v2, for machines whose own memory controller
# is cgroup v1 (this one): it runs inside a QEMU guest (TCG here, KVM where the CPU has vmx/svm)
# whose kernel mounts cgroup2 with the memory and io controllers, i.e. with cgroup writeback,
# the per-cgroup dirty throttling the reference system's pause stalls came from.
#   guest: Debian's kernel (the package guest/build.sh fetches) and a busybox initramfs that
#          mounts this host's root read-only over virtio-9p under a tmpfs overlay (so the guest
#          runs this checkout, its vmsnap binary, python3, vmtouch), and an ext4 work disk on
#          virtio-blk made with `vmsnap disk create`, mounted at /var/tmp (BENCH_DIR);
#          DISK_WRITE_MBPS throttles that disk's writes in QEMU (a slower, cloud-like disk).
# usage: bench/pcache-v2.sh [VMSNAP_BIN] [CYCLES (6)] [MODES ("off on")]
#        env: DISK_WRITE_MBPS (unthrottled), GUEST_MEM (2G), GUEST_CPUS (nproc)
# Prints bench/pcache.sh's table, produced inside the guest. TCG runs are ~20x slower than the
# host: read the modes against each other, not the milliseconds.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
VMSNAP=$(realpath "${1:-$here/build/vmsnap}")
CYCLES=${2:-6}
MODES=${3:-off on}
for t in qemu-system-x86_64 depmod cpio gzip dpkg-deb debugfs busybox; do
    command -v $t >/dev/null || { echo "pcache-v2: $t missing (scripts/deps.sh vm)" >&2; exit 1; }
done
G=$(bash "$here/guest/build.sh")
deb=$(ls "$G"/dl/linux-image-*.deb | head -n1)
# not under /tmp or /var/tmp: the guest mounts its own tmpfs and the work disk there
W=$(mktemp -d /var/cache/vmsnap-pcache-v2.XXXXXX)
trap 'rm -rf "$W"' EXIT
dpkg-deb -x "$deb" "$W/pkg"
kver=$(ls "$W/pkg/lib/modules")
mdir=$W/pkg/lib/modules/$kver
depmod -b "$W/pkg" "$kver"
root=$W/root
mkdir -p "$root"/{bin,etc,lib/modules,proc,sys,dev,host,ovl,newroot}
cp "$(command -v busybox)" "$root/bin/busybox"
declare -A seen=()
order=()
add_mod() {
    local m=$1 d
    [ -n "${seen[$m]:-}" ] && return
    seen[$m]=1
    for d in $(sed -n "s|^$m: *||p" "$mdir/modules.dep"); do add_mod "$d"; done
    order+=("$m")
}
for name in virtio_mmio virtio_blk crc32c_generic ext4 9pnet_virtio 9p overlay; do
    m=$(grep -o "^[^:]*/$name\.ko[^:]*" "$mdir/modules.dep" | head -n1)
    [ -n "$m" ] || { echo "pcache-v2: module $name not in $deb" >&2; exit 1; }
    add_mod "$m"
done
for m in "${order[@]}"; do
    b=$(basename "$m")
    case $b in
    *.xz) xz -dc "$mdir/$m" >"$root/lib/modules/${b%.xz}"; b=${b%.xz} ;;
    *) cp "$mdir/$m" "$root/lib/modules/$b" ;;
    esac
    echo "$b" >>"$root/etc/modules-order"
done
cat >"$root/init" <<'INIT'
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
for m in $(cat /etc/modules-order); do insmod /lib/modules/$m || echo "insmod $m failed"; done
now=$(sed -n 's/.*vmsnap.now=\([0-9]*\).*/\1/p' /proc/cmdline); [ -n "$now" ] && date -s "@$now" >/dev/null
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=512000,cache=loose host /host
mount -t tmpfs -o size=256m tmpfs /ovl && mkdir -p /ovl/u /ovl/w
mount -t overlay overlay -o lowerdir=/host,upperdir=/ovl/u,workdir=/ovl/w /newroot
R=/newroot
mount -t proc proc $R/proc; mount -t sysfs sys $R/sys; mount -t devtmpfs dev $R/dev
for f in fd:/proc/self/fd stdin:/proc/self/fd/0 stdout:/proc/self/fd/1 stderr:/proc/self/fd/2; do
    ln -sf "${f#*:}" "$R/dev/${f%%:*}"
done
mount -t cgroup2 none $R/sys/fs/cgroup
mount -t tmpfs tmpfs $R/tmp; mkdir -p $R/dev/shm; mount -t tmpfs tmpfs $R/dev/shm
mount -t ext4 /dev/vda $R/var/tmp
echo "pcache-v2 guest: $(uname -r), cgroup2 controllers: $(cat $R/sys/fs/cgroup/cgroup.controllers)"
chroot $R /bin/bash /var/tmp/run.sh
sync; umount $R/var/tmp; poweroff -f
INIT
chmod 0755 "$root/init" "$root/bin/busybox"
(cd "$root" && find . | LC_ALL=C sort | cpio -o -H newc --quiet | gzip -1) >"$W/initrd.gz"
mkdir -p "$W/bin" && cp "$VMSNAP" "$W/bin/vmsnap"
cat >"$W/run.sh" <<RUN
cd '$here' && BENCH_DIR=/var/tmp EXTRAS=0 bash bench/pcache.sh '$W/bin/vmsnap' $CYCLES '$MODES' \
    >/var/tmp/out.md 2>/var/tmp/err.txt; echo "rc=\$?" >>/var/tmp/err.txt
RUN
"$VMSNAP" -q disk create --size 8G --add "$W/run.sh:/run.sh" "$W/work.img"
thr=
[ -n "${DISK_WRITE_MBPS:-}" ] && thr=",throttling.bps-write=$((DISK_WRITE_MBPS * 1000000))"
accel=tcg,thread=multi
grep -Eq 'vmx|svm' /proc/cpuinfo && [ -w /dev/kvm ] && accel=kvm
disk=${DISK_WRITE_MBPS:+writes throttled to $DISK_WRITE_MBPS MB/s}
disk=${disk:-unthrottled}
echo "pcache-v2: booting the guest ($accel, ${GUEST_MEM:-2G}, disk $disk)" >&2
timeout 7200 qemu-system-x86_64 -M microvm,pit=off,pic=off,rtc=off -accel "$accel" -cpu max \
    -smp "${GUEST_CPUS:-$(nproc)}" -m "${GUEST_MEM:-2G}" -nodefaults -no-user-config -nographic \
    -serial stdio -kernel "$G/vmlinux" -initrd "$W/initrd.gz" \
    -append "$(cat "$G/cmdline") rdinit=/init vmsnap.now=$(date +%s)" \
    -fsdev local,id=r,path=/,security_model=none,readonly=on,multidevs=remap \
    -device virtio-9p-device,fsdev=r,mount_tag=host \
    -drive "id=d,file=$W/work.img,format=raw,if=none,cache=none,aio=threads$thr" \
    -device virtio-blk-device,drive=d </dev/null | tr -d '\r' | grep '^pcache-v2' >&2 || true
debugfs -R "dump /err.txt $W/err.txt" "$W/work.img" 2>/dev/null
debugfs -R "dump /out.md $W/out.md" "$W/work.img" 2>/dev/null
grep -q '^rc=0' "$W/err.txt" 2>/dev/null || { echo "pcache-v2: the bench failed in the guest:" >&2; tail -5 "$W/err.txt" >&2; exit 1; }
echo "(cgroup v2 guest, $accel; disk $disk)"
cat "$W/out.md"
