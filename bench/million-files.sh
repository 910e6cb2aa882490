#!/usr/bin/env bash
# A million empty files in one directory of `orion up`'s default cluster (issue 45):
# creates them under `orion run` (the preload library: a Python loop of
# open(O_CREAT)+close), lists them through the mount, and says what the cluster's
# processes and pools hold in memory before and after.
#   bench/million-files.sh [FILES] [-- extra `orion up` arguments]
# Needs a release build (scripts/up or cargo build --release -p orion-cli -p orion-preload).
set -euo pipefail
cd "$(dirname "$0")/.."
FILES=${1:-1000000}
shift || true
[ "${1:-}" = "--" ] && shift
ORION=$PWD/target/release/orion
STATE=$(mktemp -d /tmp/orion-million.XXXXXX)
POOLS=/dev/shm/$(basename "$STATE")
MNT=$STATE/mnt
UP_PID=
stop() {
    if [ -n "$UP_PID" ] && kill -0 "$UP_PID" 2>/dev/null; then
        kill -INT "$UP_PID"
        for _ in $(seq 100); do kill -0 "$UP_PID" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$UP_PID" 2>/dev/null || true
    fi
    "$ORION" umount "$MNT" 2>/dev/null || true
    rm -rf "$POOLS" "$STATE"
}
trap stop EXIT
"$ORION" up --dir "$STATE" --pools "$POOLS" --mount "$MNT" "$@" >"$STATE/up.log" 2>&1 &
UP_PID=$!
for _ in $(seq 600); do grep -q "orion up ready" "$STATE/up.log" && break; sleep 0.2; done
grep -q "orion up ready" "$STATE/up.log" || { tail "$STATE/up.log"; exit 1; }

# Memory of the cluster's processes (the children of `orion up`) and of its pools.
memory() {
    python3 - "$UP_PID" "$POOLS" "$1" <<'EOF'
import os, sys
up, pools, when = int(sys.argv[1]), sys.argv[2], sys.argv[3]
def kids(pid):
    out = []
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            out += [int(c) for c in open(f"/proc/{pid}/task/{t}/children").read().split()]
        except OSError:
            pass
    return out
procs, todo = [], [up]
while todo:
    p = todo.pop()
    procs.append(p)
    todo += kids(p)
total_anon = 0
print(f"[{when}] process                     RssAnon MiB  RssShmem MiB")
for p in procs:
    try:
        status = dict(l.split(":", 1) for l in open(f"/proc/{p}/status"))
        cmd = open(f"/proc/{p}/cmdline").read().split("\0")
    except OSError:
        continue
    kb = lambda k: int(status.get(k, "0 kB").split()[0])
    anon, shmem = kb("RssAnon") / 1024, kb("RssShmem") / 1024
    total_anon += anon
    name = " ".join(cmd[1:3])[:26]
    print(f"[{when}] {name:<26} {anon:12.1f} {shmem:13.1f}")
pool_bytes = 0
for root, _, files in os.walk(pools):
    for f in sorted(files):
        taken = os.stat(os.path.join(root, f)).st_blocks * 512
        pool_bytes += taken
        print(f"[{when}] pool file {f:<24} {taken / 2**20:10.1f} MiB allocated")
print(f"[{when}] processes' private memory: {total_anon:.1f} MiB; pools allocated: {pool_bytes / 2**20:.1f} MiB")
EOF
}
memory before
# A real program first: tar unpacks a tree of TAR_FILES small files through the mount
# and again under `orion run` (a format-1 pool stopped at file 32,765), and find
# through the mount counts both.
TAR_FILES=${TAR_FILES:-50000}
if [ "$TAR_FILES" -gt 0 ]; then
    tree=$(mktemp -d /dev/shm/orion-tree.XXXXXX)
    python3 - "$tree/src" "$TAR_FILES" <<'EOF'
import os, sys
root, n = sys.argv[1], int(sys.argv[2])
for i in range(n):
    d = f"{root}/d{i // 1000}"
    if i % 1000 == 0:
        os.makedirs(d)
    with open(f"{d}/f{i}", "wb") as f:
        f.write(b"x" * 100)
EOF
    tar -C "$tree/src" -cf "$tree/tree.tar" .
    mkdir "$MNT/tar-mount" "$MNT/tar-run"
    t0=$(date +%s.%N); tar -C "$MNT/tar-mount" -xf "$tree/tree.tar"; t1=$(date +%s.%N)
    "$ORION" run --dir "$STATE" -- tar -C "$MNT/tar-run" -xf "$tree/tree.tar"; t2=$(date +%s.%N)
    echo "tar -x of $TAR_FILES files: through the mount $(echo "$t1 - $t0" | bc) s, under orion run $(echo "$t2 - $t1" | bc) s"
    echo "find through the mount: $(find "$MNT/tar-mount" -type f | wc -l) and $(find "$MNT/tar-run" -type f | wc -l) files"
    # Their inode numbers come back after the grace period, for the million.
    t0=$(date +%s.%N); rm -rf "$MNT/tar-mount" "$MNT/tar-run"; t1=$(date +%s.%N)
    echo "rm -rf of both through the mount: $(echo "$t1 - $t0" | bc) s"
    rm -rf "$tree"
    sleep 2
fi
echo "files: $FILES"
start=$(date +%s.%N)
"$ORION" run --dir "$STATE" -- python3 - "$MNT/d" "$FILES" <<'EOF'
import os, sys, time
d, n = sys.argv[1], int(sys.argv[2])
os.mkdir(d)
t0 = time.monotonic()
for i in range(n):
    os.close(os.open(f"{d}/f{i}", os.O_CREAT | os.O_WRONLY, 0o644))
    if (i + 1) % 100000 == 0:
        print(f"  {i + 1} files, {(i + 1) / (time.monotonic() - t0):.0f} creates/s", flush=True)
EOF
end=$(date +%s.%N)
echo "created in $(echo "$end - $start" | bc) s"
start=$(date +%s.%N)
listed=$(ls -f "$MNT/d" | wc -l)
end=$(date +%s.%N)
echo "ls -f through the mount: $listed entries in $(echo "$end - $start" | bc) s"
df -i "$MNT" | tail -1
memory after
