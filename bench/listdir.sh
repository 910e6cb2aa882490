#!/usr/bin/env bash
# The cost of listing a small directory through the mount (os.listdir: opendir,
# readdir, releasedir), for one or more `orion` binaries run in turn, each on a
# fresh `orion up` cluster: an A/B of a change to the mount's directory handles.
# Usage: bench/listdir.sh [ROUNDS] BIN [BIN...]  (default: 1 round of the release
# build). Prints microseconds per listing, five samples of 20,000 per round.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=1
if [[ $# -gt 0 && $1 =~ ^[0-9]+$ ]]; then rounds=$1; shift; fi
if [[ $# -eq 0 ]]; then
    source scripts/setup
    cargo build --release -p orion-cli
    set -- target/release/orion
fi
dir="" pools=""
# Stops the running cluster and removes its pools and state: after each run, and on
# any exit (`set -e` leaves a function without its RETURN trap).
cleanup() {
    [[ -n $dir ]] || return 0
    pkill -INT -f "up --dir $dir" || true
    for _ in $(seq 100); do pgrep -f "up --dir $dir" >/dev/null || break; sleep 0.2; done
    pkill -KILL -f "up --dir $dir" || true
    rm -rf "$pools" "$dir"
    dir="" pools=""
}
trap cleanup EXIT
run_one() {
    local bin=$1
    dir=$(mktemp -d /tmp/orion-listdir.XXXX)
    pools=$(mktemp -d -p /dev/shm orion-listdir.XXXX)
    "$bin" up --dir "$dir" --pools "$pools" >"$dir/up.log" 2>&1 &
    for _ in $(seq 150); do grep -q "orion up ready" "$dir/up.log" && break; sleep 0.2; done
    if ! grep -q "orion up ready" "$dir/up.log"; then
        tail -n 20 "$dir/up.log" "$dir"/logs/*.log >&2 || true
        return 1
    fi
    python3 - "$dir/mnt" <<'PY'
import os, sys, time
d = sys.argv[1] + "/listdir"
os.makedirs(d, exist_ok=True)
for i in range(10):
    open(f"{d}/f{i}", "w").close()
n = 20000
samples = []
for _ in range(5):
    t = time.perf_counter()
    for _ in range(n):
        os.listdir(d)
    samples.append((time.perf_counter() - t) / n * 1e6)
print(" ".join(f"{s:.1f}" for s in samples), f"(median {sorted(samples)[2]:.1f} us)")
PY
    cleanup
}
for _ in $(seq "$rounds"); do
    for bin in "$@"; do
        printf '%s: ' "$bin"
        run_one "$bin"
    done
done
