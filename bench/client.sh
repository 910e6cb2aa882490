#!/usr/bin/env bash
# The client-library microbenchmarks (Orion §6.2) and the MDS throughput with 1, 2, 4
# and 8 client processes, over both fabric backends; writes
# bench/results/{client,mds}-{local,tcp}-DATE.{json,txt}. Pools live on /dev/shm
# (volatile mode). ONLY=mds or ONLY=client runs one of the two.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p orion-cli
day=$(date +%F)
for b in local tcp; do
  if [ "${ONLY:-client}" = client ] || [ -z "${ONLY:-}" ]; then
    ./target/release/orion bench client --backend "$b" --iters "${ITERS:-3000}" --json \
      > "bench/results/client-$b-$day.json"
    ./target/release/orion bench client --backend "$b" --iters "${ITERS:-3000}" \
      | tee "bench/results/client-$b-$day.txt"
  fi
  if [ "${ONLY:-mds}" = mds ] || [ -z "${ONLY:-}" ]; then
    ./target/release/orion bench mds --backend "$b" --millis "${MILLIS:-2000}" --json \
      > "bench/results/mds-$b-$day.json"
    ./target/release/orion bench mds --backend "$b" --millis "${MILLIS:-2000}" \
      | tee "bench/results/mds-$b-$day.txt"
  fi
done
