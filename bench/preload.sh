#!/usr/bin/env bash
# The preload library against the FUSE mount, on one cluster: `orion up` (MDS, two
# data stores, the mount; pools on /dev/shm, shared-memory fabric), then `orion bench
# workloads` through the mount, and the same program under `orion run` (its calls
# served in-process). Writes bench/results/preload-DATE.{mount,preload}.json and a
# table in bench/results/preload-DATE.md. ONLY (space-separated words) picks the
# workloads; SECONDS_PER_ROW and ENTRIES size them.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p orion-cli -p orion-preload
orion=./target/release/orion
day=$(date +%F)
state=$(mktemp -d /tmp/orion-preload-bench.XXXXXX)
out=bench/results/preload-$day
only=${ONLY:-4k_randwrite 4k_randread metadata varmail fileserver webserver sqlite}
args=(--seconds "${SECONDS_PER_ROW:-3}" --entries "${ENTRIES:-3000}")
for w in $only; do args+=(--only "$w"); done
$orion up --dir "$state" --no-mirror > "$state/up.log" 2>&1 &
up=$!
cleanup() {
  kill -INT "$up" 2>/dev/null || true
  wait "$up" 2>/dev/null || true
  pools=$(sed -n 's/.*pools in \([^ ]*\).*/\1/p' "$state/up.log" | head -1)
  [ -n "$pools" ] && rm -rf "$pools"
  rm -rf "$state"
}
trap cleanup EXIT
for _ in $(seq 100); do
  grep -q "orion up ready" "$state/up.log" && break
  sleep 0.2
done
grep -q "orion up ready" "$state/up.log" || { cat "$state/up.log"; exit 1; }
mkdir -p "$state/mnt/mount" "$state/mnt/preload"
$orion bench workloads "$state/mnt/mount" --system mount "${args[@]}" --json "$out.mount.json"
ORION_PRELOAD_STATS=1 $orion run --dir "$state" -- \
  $orion bench workloads "$state/mnt/preload" --system preload "${args[@]}" --json "$out.preload.json"
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
m = json.load(open(out + ".mount.json"))["results"]
p = json.load(open(out + ".preload.json"))["results"]
rows = []
def row(name, a, b, unit, lower_better):
    if a is None or b is None:
        return
    x = a / b if lower_better else b / a
    rows.append(f"| {name} | {a:.1f} {unit} | {b:.1f} {unit} | {x:.2f}x |")
for k in ("4k_randwrite", "4k_randwrite_fsync", "4k_randread"):
    if k in m and k in p:
        row(k + " p50", m[k]["p50_us"], p[k]["p50_us"], "us", True)
        row(k + " p99", m[k]["p99_us"], p[k]["p99_us"], "us", True)
for k in ("create", "stat", "unlink", "mkdir", "rmdir"):
    if k in m.get("metadata", {}) and k in p.get("metadata", {}):
        row(k + " p50", m["metadata"][k]["p50_us"], p["metadata"][k]["p50_us"], "us", True)
for k in ("varmail", "fileserver", "webserver"):
    if k in m and k in p:
        row(k, m[k]["ops_s"], p[k]["ops_s"], "ops/s", False)
if "sqlite" in m and "sqlite" in p:
    row("sqlite", m["sqlite"]["tx_s"], p["sqlite"]["tx_s"], "tx/s", False)
with open(out + ".md", "w") as f:
    f.write("The FUSE mount against the preload library (`orion run`) on one `orion up` "
            "cluster (shared-memory fabric, pools on /dev/shm, no RDMA), one run each, "
            "`bench/preload.sh`. Last column: how many times better preload is.\n\n")
    f.write("| row | mount | preload | preload vs mount |\n| --- | --- | --- | --- |\n")
    f.write("\n".join(rows) + "\n")
print(open(out + ".md").read())
PY
