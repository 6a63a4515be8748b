#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# cmake --install into a temporary prefix, then a small C program (tests/install/example.c) that
# packs and unpacks a file through the public API, built against that prefix four ways: pkg-config
# (shared and --static) and the CMake package (vmsnap::vmsnap and vmsnap::vmsnap_static). Each
# must run and reproduce the file byte for byte; the installed CLI and headers are checked too.
. "${VMSNAP_SRC:?run through ctest}/tests/lib.sh"
BUILD=${VMSNAP_BUILD:?}
P=$T/prefix
cmake --install "$BUILD" --prefix "$P" >"$T/install.log" 2>&1 || { cat "$T/install.log" >&2; fail "cmake --install"; done_tests; }
for f in bin/vmsnap include/vmsnap/common.h include/vmsnap/image.h lib/libvmsnap.so.0 lib/libvmsnap.a \
    lib/pkgconfig/vmsnap.pc lib/cmake/vmsnap/vmsnapConfig.cmake; do
    [ -e "$P/$f" ] || fail "not installed: $f"
done
[ "$(readlink "$P/lib/libvmsnap.so.0")" = libvmsnap.so.0.1.0 ] || fail "SONAME link: $(readlink "$P/lib/libvmsnap.so.0")"
# (outputs captured first: grep -q closing a pipe early fails the pipeline under pipefail)
out=$(objdump -p "$P/lib/libvmsnap.so.0.1.0")
grep -q 'SONAME *libvmsnap.so.0$' <<<"$out" || fail "SONAME is not libvmsnap.so.0"
out=$("$P/bin/vmsnap" --version)
grep -q "$(sed -n 's/^project(vmsnap VERSION \([0-9.]*\).*/\1/p' "$SRC/CMakeLists.txt")" <<<"$out" ||
    fail "installed CLI version"
# the pkg-config file names the installed prefix, not the build's
grep -qx "prefix=$P" "$P/lib/pkgconfig/vmsnap.pc" || fail "vmsnap.pc prefix: $(grep prefix= "$P/lib/pkgconfig/vmsnap.pc")"

# an ASan+UBSan library needs its runtime in the program too
CC=cc EXTRA=()
if [ "${VMSNAP_SANITIZED:-0}" = 1 ]; then CC=clang EXTRA=(-fsanitize=address,undefined); fi

head -c 300000 /dev/urandom >"$T/src"
truncate -s 8M "$T/src"
printf 'tail' | dd of="$T/src" bs=1 seek=$((6 << 20)) conv=notrunc status=none
check_example() { # LABEL BINARY
    rm -f "$T/obj" "$T/dst"
    if ! LD_LIBRARY_PATH=$P/lib "$2" "$T/src" "$T/obj" "$T/dst" >"$T/ex.out" 2>"$T/ex.err"; then
        fail "$1: example failed: $(cat "$T/ex.err")"; return
    fi
    cmp -s "$T/src" "$T/dst" || fail "$1: unpacked file differs from the source"
    "$VMSNAP" inspect "$T/obj" >/dev/null 2>&1 || fail "$1: the object does not inspect"
    grep -q "populated bytes" "$T/ex.out" || fail "$1: output: $(cat "$T/ex.out")"
}
export PKG_CONFIG_PATH=$P/lib/pkgconfig
pkg-config --exists vmsnap || fail "pkg-config does not find vmsnap"
[ "$(pkg-config --modversion vmsnap)" = "$("$P/bin/vmsnap" --version | grep -o '[0-9][0-9.]*' | head -1)" ] ||
    fail "pkg-config version $(pkg-config --modversion vmsnap)"
# shellcheck disable=SC2046
if $CC "${EXTRA[@]}" -o "$T/ex_pc" "$SRC/tests/install/example.c" $(pkg-config --cflags --libs vmsnap) 2>"$T/cc.err"; then
    check_example "pkg-config" "$T/ex_pc"
    # it is the installed library that runs, not a copy in the build tree
    out=$(LD_LIBRARY_PATH=$P/lib ldd "$T/ex_pc")
    grep -q "$P/lib/libvmsnap.so.0" <<<"$out" || fail "pkg-config: not linked to the installed library"
else
    fail "pkg-config build: $(cat "$T/cc.err")"
fi
# a static link: Requires.private / Libs.private must bring every library libvmsnap.a needs
# shellcheck disable=SC2046
if $CC "${EXTRA[@]}" -o "$T/ex_pcs" "$SRC/tests/install/example.c" $(pkg-config --cflags vmsnap) \
    "$P/lib/libvmsnap.a" $(pkg-config --static --libs vmsnap | sed 's/-lvmsnap//') 2>"$T/cc.err"; then
    check_example "pkg-config --static" "$T/ex_pcs"
    out=$(ldd "$T/ex_pcs")
    ! grep -q libvmsnap <<<"$out" || fail "pkg-config --static: still linked to libvmsnap.so"
else
    fail "pkg-config --static build: $(cat "$T/cc.err")"
fi

# the CMake package
CFLAGS_EXTRA="${EXTRA[*]}"
if cmake -S "$SRC/tests/install" -B "$T/consumer" -G Ninja -DCMAKE_PREFIX_PATH="$P" -DCMAKE_C_COMPILER="$CC" \
    -DCMAKE_C_FLAGS="$CFLAGS_EXTRA" -DCMAKE_EXE_LINKER_FLAGS="$CFLAGS_EXTRA" >"$T/cm.log" 2>&1 &&
    cmake --build "$T/consumer" >>"$T/cm.log" 2>&1; then
    check_example "find_package vmsnap::vmsnap" "$T/consumer/example_shared"
    if [ -x "$T/consumer/example_static" ]; then
        check_example "find_package vmsnap::vmsnap_static" "$T/consumer/example_static"
    else
        fail "find_package: no vmsnap::vmsnap_static"
    fi
else
    fail "CMake package build: $(tail -20 "$T/cm.log")"
fi
done_tests
