# SPDX-License-Identifier: Apache-2.0
# Shared benchmark helpers: run a command N times under GNU time, keep the median wall time,
# with CPU seconds (user+sys, children included) and peak RSS of that run.
BENCH_REPS=${BENCH_REPS:-3}

# bench_run LABEL CMD : sets WALL CPU RSS_MIB (median run by wall time); CMD is a bash string
bench_run() {
    local label=$1 cmd=$2 i tf
    tf=$(mktemp)
    : > "$tf.all"
    for i in $(seq 1 "$BENCH_REPS"); do
        [ -n "${BENCH_BEFORE:-}" ] && eval "$BENCH_BEFORE"
        /usr/bin/time -f '%e %U %S %M' -o "$tf" bash -c "$cmd" >/dev/null 2>"$tf.err" || {
            echo "bench: '$label' failed: $(tail -3 "$tf.err")" >&2; rm -f "$tf" "$tf.all" "$tf.err"; return 1; }
        tail -1 "$tf" >> "$tf.all"
    done
    read -r WALL u s rss < <(sort -n "$tf.all" | sed -n "$(( (BENCH_REPS + 1) / 2 ))p")
    CPU=$(echo "$u + $s" | bc)
    RSS_MIB=$(( rss / 1024 ))
    rm -f "$tf" "$tf.all" "$tf.err"
}

machine_line() {
    echo "$(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'))," \
         "$(free -g | awk '/Mem:/{print $2}') GiB RAM, kernel $(uname -r)"
}

# CPU seconds used so far by the RGW's processes (radosgw, ceph-osd, ceph-mon)
server_cpu() {
    local t=0 p
    for p in $(pgrep -f 'radosgw|ceph-osd|ceph-mon'); do
        t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat" 2>/dev/null || echo 0)))
    done
    echo "scale=2; $t / $(getconf CLK_TCK)" | bc
}
