#!/usr/bin/env bash
# An A/B of what operations cost the whole machine, for one or more `orion` binaries
# in turn, each on a fresh `orion up` cluster (local fabric, pools in /dev/shm, MDS
# mirror on), in reverse order every other round. For each it prints:
#   idle     CPU of every process of the idle cluster (bench/idle_cpu.py: % of one core, over 5 s,
#            after 3 s of rest), and their wake-ups per second;
#   write    4 KiB random writes through the mount, one job: p50, p99, and µs of CPU
#            per write summed over every process, with the split by process;
#   scale    4 KiB random writes and create+stat+unlink through the mount with 1, 2
#            and 4 jobs: ops/s and µs of CPU per operation;
#   looked   a Python loop of 4 KiB os.pwrite through the mount to a file a second
#            mount listed (`ls -la`) first, and to one nobody else looked at: p50 µs
#            and writes per second.
# The benchmark program is the first BIN's (`orion bench workloads`, which reads the
# CPU from /proc); each BIN runs the cluster. Usage: bench/cost-ab.sh [ROUNDS] BIN...
# (default: 1 round of the release build).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${SECONDS_PER_ROW:-4}
source bench/ab-cluster.sh
ab_args "-p orion-cli -p orion-preload" "$@"
bench_bin=${bins[0]}
second=""
stop_second() {
    [[ -n $second ]] || return 0
    kill -INT "$second" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$second" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$second" 2>/dev/null || true
    fusermount3 -uz "$dir/mnt2" 2>/dev/null || umount -l "$dir/mnt2" 2>/dev/null || true
    second=""
}
trap 'stop_second; stop_cluster' EXIT
# The PIDs of the cluster's processes: `orion up` and its children.
cluster_pids() { echo "$up_pid $(pgrep -P "$up_pid" | tr '\n' ' ')"; }
idle() {
    sleep 3
    # shellcheck disable=SC2046
    python3 bench/idle_cpu.py 5 $(cluster_pids)
}
summary() {
    python3 -c '
import json, sys
r = json.load(sys.stdin)["results"]
def cpu(c):
    if not c:
        return "no CPU figure"
    by = ", ".join("%s %.1f" % kv for kv in sorted(c["by"].items(), key=lambda kv: -kv[1]))
    return "%.1f us CPU (%s)" % (c["us_per_op"], by)
w = r.get("4k_randwrite")
if w:
    print("write: p50 %.1f p99 %.1f us, %s" % (w["p50_us"], w["p99_us"], cpu(w["cpu"])))
for k, name in (("scale_4k_randwrite", "write"), ("scale_create_stat_unlink", "create+stat+unlink")):
    j = r.get(k, {}).get("jobs")
    if j:
        print("scale %s: " % name + "; ".join("%s jobs %.1f k/s %.1f us CPU" % (
            n, j[n]["ops_s"] / 1e3, (j[n]["cpu"] or {}).get("us_per_op", 0)) for n in sorted(j, key=int)))
'
}
looked() {
    local mnt=$dir/mnt
    # A second mount of the cluster: the first mount's command line, another mountpoint.
    local args
    args=$(tr '\0' '\n' <"/proc/$(pgrep -f "orion mount $mnt" | head -1)/cmdline" |
        tail -n +2 | grep -v '^--metrics$' | grep -v '^fd:' | tr '\n' ' ')
    mkdir -p "$dir/mnt2" "$mnt/looked"
    # shellcheck disable=SC2086
    "$1" ${args/$mnt/$dir/mnt2} >"$dir/mnt2.log" 2>&1 &
    second=$!
    for _ in $(seq 100); do mountpoint -q "$dir/mnt2" && break; sleep 0.1; done
    python3 - "$mnt/looked" "$dir/mnt2/looked" <<'PY'
import os, subprocess, sys, time
here, there = sys.argv[1], sys.argv[2]
def loop(path, n=20000):
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    page = b"x" * 4096
    ns = []
    t0 = time.perf_counter()
    for i in range(n):
        t = time.perf_counter_ns()
        os.pwrite(fd, page, (i % 4096) * 4096)
        ns.append(time.perf_counter_ns() - t)
    el = time.perf_counter() - t0
    os.close(fd)
    ns.sort()
    return ns[len(ns) // 2] / 1e3, n / el
open(here + "/seen", "w").close()
subprocess.run(["ls", "-la", there], stdout=subprocess.DEVNULL, check=True)
p50s, rate_s = loop(here + "/seen")
p50u, rate_u = loop(here + "/unseen")
print(f"looked: listed by the other mount p50 {p50s:.1f} us {rate_s / 1e3:.1f} k/s; "
      f"nobody else's p50 {p50u:.1f} us {rate_u / 1e3:.1f} k/s")
PY
    stop_second
}
run_one() {
    local bin=$1
    echo "== $bin"
    start_cluster "$bin"
    idle
    mkdir "$dir/mnt/w"
    "$bench_bin" bench workloads "$dir/mnt/w" --only 4k_randwrite --only scale_4k_randwrite \
        --only scale_create --seconds "$seconds" 2>"$dir/bench.log" | summary ||
        { tail -n 20 "$dir/bench.log" >&2; return 1; }
    looked "$bin"
    stop_cluster
}
take_turns "$rounds" run_one "${bins[@]}"
