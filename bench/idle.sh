#!/usr/bin/env bash
# CPU and wake-ups of an idle `orion up` cluster (issue 45): each build starts its own
# cluster (local fabric, pools in /dev/shm, mirror on), lets it settle for 5 s, then
# sums the CPU time and context switches of every thread of `orion up` and its
# children over WINDOW seconds (30 by default).
#   bench/idle.sh [BUILD_DIR...]   (default: target/release; each holds `orion`)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILDS=("$@")
[ ${#BUILDS[@]} -eq 0 ] && BUILDS=("$PWD/target/release")
WINDOW=${WINDOW:-30}
STATE=
POOLS=
UP_PID=
stop() {
    if [ -n "$UP_PID" ] && kill -0 "$UP_PID" 2>/dev/null; then
        kill -INT "$UP_PID"
        for _ in $(seq 100); do kill -0 "$UP_PID" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$UP_PID" 2>/dev/null || true
    fi
    [ -n "$STATE" ] && { "${ORION:-true}" umount "$STATE/mnt" 2>/dev/null || true; }
    [ -n "$POOLS" ] && rm -rf "$POOLS"
    [ -n "$STATE" ] && rm -rf "$STATE"
    UP_PID= STATE= POOLS=
}
trap stop EXIT
for build in "${BUILDS[@]}"; do
    ORION=$build/orion
    STATE=$(mktemp -d /tmp/orion-idle.XXXXXX)
    POOLS=/dev/shm/$(basename "$STATE")
    "$ORION" up --dir "$STATE" --pools "$POOLS" >"$STATE/up.log" 2>&1 &
    UP_PID=$!
    for _ in $(seq 600); do grep -q "orion up ready" "$STATE/up.log" && break; sleep 0.2; done
    grep -q "orion up ready" "$STATE/up.log" || { tail "$STATE/up.log"; exit 1; }
    sleep 5
    python3 - "$build" "$WINDOW" "$UP_PID" $(pgrep -P "$UP_PID" | tr '\n' ' ') <<'PY'
import os, sys, time
build, window, pids = sys.argv[1], float(sys.argv[2]), sys.argv[3:]
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
print(f"{build}: idle {(b - a) / window / 1e7:.2f}% of a core, "
      f"{(wb - wa) / window:.0f} wake-ups/s over {len(pids)} processes")
PY
    stop
done
