#!/usr/bin/env bash
# Through the FUSE mount, next to tmpfs and a null FUSE passthrough of tmpfs: fio 4 KiB
# random latency and 1 MiB bandwidth, create/stat/unlink/mkdir/rmdir on 10,000 entries.
# Writes bench/results/mount-DATE.{json,txt}. Needs root (FUSE mounts) and fio.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup
cargo build --release -p orion-cli
day=$(date +%F)
./target/release/orion bench mount --json "bench/results/mount-$day.json" \
    | tee "bench/results/mount-$day.txt"
