#!/usr/bin/env bash
# CPU and wake-ups of an idle `orion up` cluster (issue 45, design note 84): for each
# binary in turn, a fresh cluster (bench/ab-cluster.sh) settles for 5 s, then the CPU
# time and context switches of every thread of `orion up` and its children are summed
# over WINDOW seconds (30 by default).
#   bench/idle.sh [ROUNDS] BIN...   (default: 1 round of the release build)
set -euo pipefail
cd "$(dirname "$0")/.."
WINDOW=${WINDOW:-30}
source bench/ab-cluster.sh
ab_args "-p orion-cli" "$@"
run_one() {
    start_cluster "$1"
    sleep 5
    # shellcheck disable=SC2046
    echo "$1: $(python3 bench/idle_cpu.py "$WINDOW" "$up_pid" $(pgrep -P "$up_pid" | tr '\n' ' '))"
    stop_cluster
}
take_turns "$rounds" run_one "${bins[@]}"
