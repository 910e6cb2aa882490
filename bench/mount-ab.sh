#!/usr/bin/env bash
# An A/B of a change to the mount: one small workload through the mount, for one or
# more `orion` binaries run in turn, each on a fresh `orion up` cluster (local
# fabric, pools in /dev/shm, MDS mirror on), in reverse order every other round.
# Prints microseconds per operation, five samples per run, and their median.
# Usage: bench/mount-ab.sh WORKLOAD [ROUNDS] BIN [BIN...]  (default: 1 round of the
# release build). Workloads:
#   listdir  os.listdir of a 10-file directory (opendir, readdir, releasedir), 20,000 per sample
#   lookup   os.stat of a missing name in a subdirectory (a FUSE lookup the kernel
#            never caches, its parent not the root), 20,000 per sample
#   create   create and close a new file in a subdirectory (a lookup, then a
#            create), 2,000 per sample, each sample in a fresh subdirectory
#   open     open and close a file of a subdirectory for reading (its name and
#            attributes kept by the kernel: an open and a release), 20,000 per sample
set -euo pipefail
cd "$(dirname "$0")/.."
workload=${1:?usage: bench/mount-ab.sh WORKLOAD [ROUNDS] BIN [BIN...]}
shift
case $workload in listdir | lookup | create | open) ;; *) echo "unknown workload $workload" >&2; exit 2 ;; esac
source bench/ab-cluster.sh
ab_args "-p orion-cli" "$@"
run_one() {
    local bin=$1
    start_cluster "$bin"
    python3 - "$dir/mnt" "$workload" <<'PY'
import os, sys, time
root, workload = sys.argv[1], sys.argv[2]
d = root + "/ab"
os.makedirs(d, exist_ok=True)
if workload == "listdir":
    for i in range(10):
        open(f"{d}/f{i}", "w").close()
    n = 20000
    def sample(_):
        for _ in range(n):
            os.listdir(d)
elif workload == "lookup":
    n = 20000
    def sample(_):
        for i in range(n):
            try:
                os.stat(f"{d}/missing{i}")
            except FileNotFoundError:
                pass
elif workload == "open":
    open(f"{d}/f", "w").close()
    n = 20000
    def sample(_):
        for _ in range(n):
            os.close(os.open(f"{d}/f", os.O_RDONLY))
else:
    n = 2000
    def sample(k):
        s = f"{d}/s{k}"
        os.mkdir(s)
        for i in range(n):
            os.close(os.open(f"{s}/f{i}", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
samples = []
for k in range(5):
    t = time.perf_counter()
    sample(k)
    samples.append((time.perf_counter() - t) / n * 1e6)
print(" ".join(f"{s:.1f}" for s in samples), f"(median {sorted(samples)[2]:.1f} us)")
PY
    stop_cluster
}
# The binaries take turns, in reverse order every other round: the first run of a
# round meets a colder machine.
run_printed() {
    printf '%s: ' "$1"
    run_one "$1"
}
take_turns "$rounds" run_printed "${bins[@]}"
