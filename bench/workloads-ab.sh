#!/usr/bin/env bash
# An A/B of a change on any rows of `orion bench workloads`: for one or more `orion`
# binaries in turn (reverse order every other round), each on a fresh `orion up`
# cluster (local fabric, pools in /dev/shm, MDS mirror on), runs the rows whose
# names contain WORDS through the client library (`--api --cluster`), and on
# another fresh cluster through the mount, and prints each row's figure (MiB/s, ops/s or p50 µs), one
# line per binary and front-end.
# Usage: bench/workloads-ab.sh "WORDS" [ROUNDS] BIN [BIN...]
#   e.g. bench/workloads-ab.sh "1m_seq" 2 /tmp/old/orion target/release/orion
set -euo pipefail
cd "$(dirname "$0")/.."
words=${1:?usage: bench/workloads-ab.sh \"WORDS\" [ROUNDS] BIN [BIN...]}
shift
seconds=${SECONDS_PER_ROW:-3}
only=()
for w in $words; do only+=(--only "$w"); done
source bench/ab-cluster.sh
ab_args "-p orion-cli" "$@"
# One line of figures from the JSON of `orion bench workloads` on stdin.
summary() {
    python3 -c '
import json, sys
r = json.load(sys.stdin)["results"]
def figure(v):
    for k, unit in (("mib_s", "MiB/s"), ("ops_s", "ops/s"), ("tx_s", "tx/s"), ("p50_us", "us p50")):
        if k in v:
            return "%.0f %s" % (v[k], unit) if k != "p50_us" else "%.2f %s" % (v[k], unit)
    return json.dumps(v)
print("  ".join("%s %s" % (k, figure(v)) for k, v in sorted(r.items())))'
}
# Each front-end gets a fresh cluster: rows that churn a store's space leave freed
# pages in their grace period, which the next rows would wait for.
run_one() {
    local bin=$1 front
    for front in api mount; do
        start_cluster "$bin"
        local target=(--api --cluster "$dir")
        if [[ $front == mount ]]; then
            mkdir "$dir/mnt/m"
            target=("$dir/mnt/m")
        fi
        printf '%s %-6s ' "$bin" "$front:"
        "$bin" bench workloads "${target[@]}" "${only[@]}" --seconds "$seconds" \
            2>"$dir/bench.log" | summary || { tail -n 20 "$dir/bench.log" >&2; return 1; }
        if grep -q "no heartbeat" "$dir"/logs/mds-*.log; then
            echo "  (the MDS lost a store's heartbeats during this run)"
        fi
        stop_cluster
    done
}
take_turns "$rounds" run_one "${bins[@]}"
