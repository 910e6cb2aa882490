#!/usr/bin/env bash
# The local core against tmpfs (same calls, same run, both in /dev/shm), plus lookup
# latency as one directory grows to 1 M names. Writes
# bench/results/local-core-<date>.json and a markdown table beside it.
# Usage: bench/local-core.sh [CALLS_PER_ROW]   (default 20000)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup >/dev/null
cargo build --release -q -p orion-cli
day=$(date +%Y-%m-%d)
json=bench/results/local-core-$day.json
./target/release/orion bench local --json --ops "${1:-20000}" > "$json"
python3 - "$json" > "bench/results/local-core-$day.md" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print(f"Local core vs tmpfs, {r['calls_per_row']} calls per row, {r['machine']['cores']} cores, pools in /dev/shm (volatile mode).\n")
print("| call | core ops/s | core p50 µs | core p99 µs | tmpfs ops/s | tmpfs p50 µs | tmpfs p99 µs | core/tmpfs p50 |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for k, c in r["core"].items():
    t = r["tmpfs"][k]
    print(f"| {k} | {c['ops_s']:,.0f} | {c['p50_us']:.2f} | {c['p99_us']:.2f} | {t['ops_s']:,.0f} | {t['p50_us']:.2f} | {t['p99_us']:.2f} | {c['p50_us']/t['p50_us']:.2f}× |")
print("\n| names in the directory | lookup p50 µs |\n|---:|---:|")
for n, us in r["lookup_p50_us_by_dir_size"].items():
    print(f"| {int(n):,} | {us:.3f} |")
PY
cat "bench/results/local-core-$day.md"
