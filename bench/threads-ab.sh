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
seconds=${SECONDS_PER_ROW:-3}
source bench/ab-cluster.sh
ab_args "-p orion-cli -p orion-preload" "$@"
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
    start_cluster "$bin"
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
    stop_cluster
}
take_turns "$rounds" run_one "${bins[@]}"
