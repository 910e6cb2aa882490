#!/usr/bin/env bash
# The client-library microbenchmarks (Orion §6.2) over both fabric backends; writes
# bench/results/client-{local,tcp}-DATE.json. Pools live on /dev/shm (volatile mode).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p orion-cli
day=$(date +%F)
for b in local tcp; do
  ./target/release/orion bench client --backend "$b" --iters "${ITERS:-3000}" --json \
    > "bench/results/client-$b-$day.json"
  ./target/release/orion bench client --backend "$b" --iters "${ITERS:-3000}" \
    | tee "bench/results/client-$b-$day.txt"
done
