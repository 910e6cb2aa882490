#!/usr/bin/env bash
# An A/B of a change for threads that share one mount or one client: for one or
# more `orion` binaries in turn (reverse order every other round), each on a fresh
# `orion up` cluster (local fabric, pools in /dev/shm, MDS mirror on), runs the
# scaling rows of `orion bench workloads` (4 KiB random writes and
# create+stat+unlink from 1, 2 and 4 threads) and varmail (8 threads), once
# through the mount and once under `orion run` (the preload library), and prints
# thousands of operations per second, one line per binary and front-end. The
# preload line adds the one-thread 4 KiB write p50 and p99 (µs).
# Usage: bench/threads-ab.sh [ROUNDS] BIN [BIN...]  (a BIN's directory must hold
# its liborion_preload.so, as target/release does; default: 1 round of the release
# build).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=1
if [[ $# -gt 0 && $1 =~ ^[0-9]+$ ]]; then rounds=$1; shift; fi
if [[ $# -eq 0 ]]; then
    source scripts/setup
    cargo build --release -p orion-cli -p orion-preload
    set -- target/release/orion
fi
seconds=${SECONDS_PER_ROW:-3}
dir="" pools="" up_pid="" up_bin=""
# Stops the running cluster (by PID), unmounts and removes its pools and state:
# after each run, and on any exit.
cleanup() {
    [[ -n $dir ]] || return 0
    if [[ -n $up_pid ]]; then
        kill -INT "$up_pid" 2>/dev/null || true
        for _ in $(seq 100); do kill -0 "$up_pid" 2>/dev/null || break; sleep 0.2; done
        kill -KILL "$up_pid" 2>/dev/null || true
    fi
    "$up_bin" umount "$dir/mnt" >/dev/null 2>&1 || fusermount3 -uz "$dir/mnt" 2>/dev/null ||
        umount -l "$dir/mnt" 2>/dev/null || true
    rm -rf "$pools" "$dir" || true
    dir="" pools="" up_pid=""
}
trap cleanup EXIT
# Prints one line of figures from the JSON of `orion bench workloads` on stdin.
summary() {
    python3 -c '
import json, sys
r = json.load(sys.stdin)["results"]
w = r["scale_4k_randwrite"]["jobs"]
c = r["scale_create_stat_unlink"]["jobs"]
line = "write 1/2/4: %s  create+stat+unlink 1/2/4: %s  varmail: %.1f" % (
    " ".join("%.1f" % (w[k]["ops_s"] / 1e3) for k in "124"),
    " ".join("%.1f" % (c[k]["ops_s"] / 1e3) for k in "124"),
    r["varmail"]["ops_s"] / 1e3)
if "4k_randwrite" in r:
    line += "  write p50 %.2f p99 %.1f" % (r["4k_randwrite"]["p50_us"], r["4k_randwrite"]["p99_us"])
print(line)'
}
run_one() {
    local bin=$1
    dir=$(mktemp -d /tmp/orion-ab.XXXX)
    pools=$(mktemp -d -p /dev/shm orion-ab.XXXX)
    "$bin" up --dir "$dir" --pools "$pools" >"$dir/up.log" 2>&1 &
    up_pid=$! up_bin=$bin
    for _ in $(seq 150); do
        grep -q "orion up ready" "$dir/up.log" && break
        kill -0 "$up_pid" 2>/dev/null || break
        sleep 0.2
    done
    if ! grep -q "orion up ready" "$dir/up.log"; then
        tail -n 20 "$dir/up.log" "$dir"/logs/*.log >&2 || true
        return 1
    fi
    local only=(--only scale_4k_randwrite --only scale_create --only varmail --seconds "$seconds")
    mkdir "$dir/mnt/m" "$dir/mnt/p"
    # The benchmark's progress and errors go to a log, shown if it fails.
    printf '%s mount:   ' "$bin"
    "$bin" bench workloads "$dir/mnt/m" "${only[@]}" 2>"$dir/bench.log" | summary ||
        { tail -n 20 "$dir/bench.log" >&2; return 1; }
    printf '%s preload: ' "$bin"
    "$bin" run --dir "$dir" -- "$bin" bench workloads "$dir/mnt/p" "${only[@]}" \
        --only 4k_randwrite 2>"$dir/bench.log" | summary ||
        { tail -n 20 "$dir/bench.log" >&2; return 1; }
    cleanup
}
bins=("$@")
for r in $(seq "$rounds"); do
    order=("${bins[@]}")
    if ((r % 2 == 0)); then
        order=()
        for ((i = ${#bins[@]} - 1; i >= 0; i--)); do order+=("${bins[i]}"); done
    fi
    for bin in "${order[@]}"; do run_one "$bin"; done
done
