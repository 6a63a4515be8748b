#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Install the Debian 12 packages vmsnap needs to build, test and benchmark.
# Idempotent: installs only what is missing, runs apt-get update at most once.
# Groups: build (always), test (tools the tests run: man, groff, zsh, bash-completion for the
# man page and completion checks), s3 (Ceph RGW for the S3 tests), vm (QEMU guest), bench (peer
# tools).
set -euo pipefail

build_pkgs="cmake ninja-build gcc clang libclang-rt-14-dev clang-format pkg-config
  libzstd-dev libxxhash-dev libext2fs-dev comerr-dev e2fsprogs libcurl4-openssl-dev libssl-dev
  libjson-c-dev libseccomp-dev liburing-dev zstd xxd python3 util-linux coreutils
  xfsprogs btrfs-progs libmicrohttpd-dev libsystemd-dev python3-yaml"
test_pkgs="man-db groff-base zsh bash-completion"
s3_pkgs="ceph-mon ceph-osd radosgw ceph-common uuid-runtime bc curl openssl"
vm_pkgs="qemu-system-x86 busybox-static cpio xz-utils kmod"
bench_pkgs="rclone vmtouch time awscli"

want="$build_pkgs"
for g in "$@"; do
    case "$g" in
    test) want="$want $test_pkgs" ;;
    s3) want="$want $s3_pkgs" ;;
    vm) want="$want $vm_pkgs" ;;
    bench) want="$want $bench_pkgs" ;;
    all) want="$want $test_pkgs $s3_pkgs $vm_pkgs $bench_pkgs" ;;
    *) echo "deps.sh: unknown group '$g' (build, test, s3, vm, bench, all)" >&2; exit 2 ;;
    esac
done

missing=""
for p in $want; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0

if [ "$(id -u)" != 0 ]; then
    echo "deps.sh: missing packages:$missing (run as root, or install them)" >&2
    exit 1
fi
echo "deps.sh: installing$missing"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# shellcheck disable=SC2086
apt-get install -y -qq --no-install-recommends $missing >/dev/null
