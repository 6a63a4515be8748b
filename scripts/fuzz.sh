#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# scripts/fuzz.sh [SECONDS_PER_TARGET]: build the libFuzzer targets (clang, ASan+UBSan, as
# `make build-asan` builds them, in a build directory of their own: $BUILD_FUZZ, default
# build-fuzz) and run each for SECONDS_PER_TARGET (default 60) on a copy of its corpus
# (tests/fuzz/corpus/<target>, which stays as it is). Prints a line per target: executions, new
# corpus entries (inputs libFuzzer kept for new coverage), findings (crash, leak, timeout and
# out-of-memory inputs), then the total. Exit 1 on any finding (the inputs and logs stay in
# $BUILD_FUZZ/fuzz-run/<target>/), 2 when the build fails. FUZZ_TARGETS="qmp image" runs those
# only.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
case $secs in '' | *[!0-9]*) echo "usage: scripts/fuzz.sh [SECONDS_PER_TARGET]" >&2; exit 2 ;; esac
build=${BUILD_FUZZ:-build-fuzz}
targets=${FUZZ_TARGETS:-$(cd tests/fuzz/corpus && ls)} # FUZZ_TARGETS="qmp image": those only

mkdir -p "$build"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DVMSNAP_WERROR=ON \
    -DVMSNAP_SANITIZE=ON -DCMAKE_C_COMPILER=clang -DVMSNAP_FUZZ=ON >"$build/fuzz-cmake.log" 2>&1 ||
    { cat "$build/fuzz-cmake.log" >&2; exit 2; }
# shellcheck disable=SC2046 # one word per target
cmake --build "$build" --target $(printf 'fuzz_%s ' $targets) >"$build/fuzz-build.log" 2>&1 ||
    { tail -40 "$build/fuzz-build.log" >&2; exit 2; }

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
total_execs=0 total_new=0 total_found=0
printf '%-12s %14s %12s %9s\n' target executions new-entries findings
for t in $targets; do
    run=$build/fuzz-run/$t
    rm -rf "$run" && mkdir -p "$run/corpus" "$run/findings"
    cp tests/fuzz/corpus/"$t"/* "$run/corpus/"
    before=$(find "$run/corpus" -type f | wc -l)
    rc=0
    "$build/tests/fuzz_$t" -max_total_time="$secs" -timeout=25 -print_final_stats=1 \
        -artifact_prefix="$run/findings/" "$run/corpus" >"$run/log" 2>&1 || rc=$?
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$run/log" | tail -1)
    new=$(($(find "$run/corpus" -type f | wc -l) - before))
    found=$(find "$run/findings" -type f | wc -l)
    # an exit without a finding saved (a crash of the fuzzer itself) counts as one
    [ "$rc" = 0 ] || [ "$found" -gt 0 ] || found=1
    printf '%-12s %14s %12s %9s\n' "$t" "${execs:-?}" "$new" "$found"
    [ "$found" = 0 ] || echo "  $t: see $run/log and $run/findings/" >&2
    total_execs=$((total_execs + ${execs:-0}))
    total_new=$((total_new + new))
    total_found=$((total_found + found))
done
printf '%-12s %14s %12s %9s\n' total "$total_execs" "$total_new" "$total_found"
[ "$total_found" = 0 ]
