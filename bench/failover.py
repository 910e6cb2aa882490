#!/usr/bin/env python3
"""bench/failover.py: plots the JSON lines of `orion bench failover --json` (one file
per run) as client throughput around the kill of the primary MDS, with the timeline's
marks (the mirror saw it, took the role, served; the first operation after).

    bench/failover.py --out bench/results/DATE-MACHINE-failover RAW/f-*.out
"""
import argparse
import json
import statistics

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("runs", nargs="+")
a = ap.parse_args()
runs = [json.loads(l) for p in a.runs for l in open(p) if l.startswith("{")]
keys = ["ops_per_s_before", "detected_ms", "role_ms", "serving_ms", "first_op_ms", "back_to_90pct_ms"]
rows = ["| manager | runs | " + " | ".join(keys) + " |", "|" + " --- |" * (len(keys) + 2)]
def group(r):
    """The manager, and the fault when it is not a kill -9 (runs before `--stop`)."""
    f = r.get("fault", "sigkill")
    return r["manager"] if f == "sigkill" else f"{r['manager']}, {f}"


groups = sorted({group(r) for r in runs})
for m in groups:
    rs = [r for r in runs if group(r) == m]
    med = [statistics.median(r[k] for r in rs if r[k] is not None) for k in keys]
    rows.append(f"| {m} | {len(rs)} | " + " | ".join(f"{v:.0f}" for v in med) + " |")
open(a.out + ".md", "w").write("\n".join(rows) + "\n")
print("\n".join(rows))
try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    print("no matplotlib: plot skipped")
    raise SystemExit(0)
fig, axes = plt.subplots(1, len(groups), figsize=(5.5 * len(groups), 3.6), sharey=True, squeeze=False)
axes = axes[0]
for ax, m in zip(axes, groups):
    rs = [r for r in runs if group(r) == m]
    for i, r in enumerate(rs):
        xs = [p[0] for p in r["ops_per_s_by_50ms"]]
        ys = [p[1] / 1000 for p in r["ops_per_s_by_50ms"]]
        ax.step(xs, ys, where="post", alpha=0.7, label=f"run {i + 1}")
    if rs:
        r = rs[0]
        for k, c in [("detected_ms", "grey"), ("role_ms", "orange"), ("serving_ms", "green"), ("first_op_ms", "red")]:
            if r[k] is not None:
                ax.axvline(r[k], color=c, ls="--", lw=1, label=k.replace("_ms", "") + " (run 1)")
    ax.axvline(0, color="black", lw=1)
    how = "SIGSTOP" if rs and rs[0].get("fault") == "sigstop" else "kill -9"
    ax.set_title(f"{how} of the primary MDS at 0 ({rs[0]['manager'] if rs else m} manager)")
    ax.set_xlabel("ms from the fault (50 ms windows)")
    ax.grid(alpha=0.3)
axes[0].set_ylabel("client ops/s (thousands)")
axes[-1].legend(fontsize=7, loc="upper left")
fig.tight_layout()
fig.savefig(a.out + ".png", dpi=110)
print(f"wrote {a.out}.png")
