#!/usr/bin/env bash
# The floor of each FUSE transport on this machine (issue 46): a FUSE file system that
# does nothing (bench/probes/fuse-uring), served over /dev/fuse and over io_uring in
# turn, under one Python thread's loops of 4 KiB pwrite, stat and 4 KiB pread (30,000
# each after 2,000 to warm up), with the machine's CPU per operation (/proc/stat busy
# ticks over the loop: the caller, the server and the kernel).
#   bench/fuse-uring-probe.sh [ROUNDS]   (root; turns the module's enable_uring on)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-2}
param=/sys/module/fuse/parameters/enable_uring
[ -w "$param" ] || { echo "no $param here (kernel < 6.14?) or not root" >&2; exit 1; }
echo 1 >"$param"
cargo build --release --quiet --manifest-path bench/probes/fuse-uring/Cargo.toml
probe=bench/probes/fuse-uring/target/release/fuse-uring-probe
mnt=$(mktemp -d /tmp/fuse-uring-probe.XXXXXX)
pid=
cleanup() {
    # Killing the probe first aborts its FUSE connection: the unmount cannot hang.
    [ -n "$pid" ] && kill "$pid" 2>/dev/null || true
    umount "$mnt" 2>/dev/null || umount -l "$mnt" 2>/dev/null || true
    [ -f "$mnt.log" ] && { echo "probe log:" >&2; cat "$mnt.log" >&2; rm -f "$mnt.log"; }
    rmdir "$mnt" 2>/dev/null || true
}
trap cleanup EXIT
run() {
    "$probe" "$mnt" "$1" >"$mnt.log" 2>&1 &
    pid=$!
    for _ in $(seq 50); do grep -qx ready "$mnt.log" 2>/dev/null && break; sleep 0.1; done
    timeout 300 python3 - "$mnt" "$1" <<'PY'
import os, sys, time
m, t = sys.argv[1], sys.argv[2]
def busy():
    v = list(map(int, open('/proc/stat').readline().split()[1:]))
    return sum(v) - v[3] - v[4]
fd = os.open(m + '/f', os.O_RDWR)
page = b'x' * 4096
ops = (('4k pwrite', lambda: os.pwrite(fd, page, 0)),
       ('stat', lambda: os.stat(m + '/f')),
       ('4k pread', lambda: os.pread(fd, 4096, 0)))
for name, op in ops:
    for _ in range(2000):
        op()
    n, lat = 30000, []
    b0, t0 = busy(), time.perf_counter()
    for _ in range(n):
        s = time.perf_counter(); op(); lat.append(time.perf_counter() - s)
    el = time.perf_counter() - t0
    cpu = (busy() - b0) / os.sysconf('SC_CLK_TCK')
    lat.sort()
    print(f"{t:5s} {name:9s} p50 {lat[n // 2] * 1e6:6.1f} us  p99 {lat[int(n * .99)] * 1e6:6.1f} us"
          f"  {n / el / 1e3:6.1f} k/s  machine CPU {cpu / n * 1e6:5.1f} us/op")
os.close(fd)
PY
    umount "$mnt"
    wait "$pid" || true
    pid=
    grep '^served' "$mnt.log"
    rm -f "$mnt.log"
}
for _ in $(seq "$rounds"); do
    run dev
    run uring
done
