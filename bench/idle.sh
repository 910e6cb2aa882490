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
    python3 - "$1" "$WINDOW" "$up_pid" $(pgrep -P "$up_pid" | tr '\n' ' ') <<'PY'
import os, sys, time
bin_, window, pids = sys.argv[1], float(sys.argv[2]), sys.argv[3:]
def snap():
    ns = wakes = 0
    for p in pids:
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in tasks:
            try:
                ns += int(open(f"/proc/{p}/task/{t}/schedstat").read().split()[0])
                st = open(f"/proc/{p}/task/{t}/status").read()
            except OSError:
                continue
            for l in st.splitlines():
                if l.startswith(("voluntary_ctxt", "nonvoluntary_ctxt")):
                    wakes += int(l.split()[1])
    return ns, wakes
a, wa = snap(); time.sleep(window); b, wb = snap()
print(f"{bin_}: idle {(b - a) / window / 1e7:.2f}% of a core, "
      f"{(wb - wa) / window:.0f} wake-ups/s over {len(pids)} processes")
PY
    stop_cluster
}
take_turns "$rounds" run_one "${bins[@]}"
