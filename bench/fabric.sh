#!/usr/bin/env bash
# Runs `orion bench fabric` over the local and libfabric tcp backends and stores the JSON
# results in bench/results/fabric-<backend>-<date>.json.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup
cargo build --release -p orion-cli
date=$(date +%F)
for b in local tcp; do
    ./target/release/orion bench fabric --backend "$b" --json | tee "bench/results/fabric-$b-$date.json"
done
