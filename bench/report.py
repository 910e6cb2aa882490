#!/usr/bin/env python3
"""bench/report.py: merges the per-system JSON files of bench/run into one results
file, a markdown table (each system's figure; Orion against the best distributed peer
and against tmpfs) and PNG plots.

    bench/report.py --out bench/results/DATE-MACHINE WORKDIR/*.json
"""
import argparse
import json
import os
import platform

# (label, workload, path inside it, unit, higher is better)
ROWS = [
    ("4 KiB rand write p50", "4k_randwrite", ["p50_us"], "µs", False),
    ("4 KiB rand write p99", "4k_randwrite", ["p99_us"], "µs", False),
    ("4 KiB rand write+fsync p50", "4k_randwrite_fsync", ["p50_us"], "µs", False),
    ("4 KiB rand read p50", "4k_randread", ["p50_us"], "µs", False),
    ("4 KiB rand read p99", "4k_randread", ["p99_us"], "µs", False),
    ("create p50", "metadata", ["create", "p50_us"], "µs", False),
    ("mkdir p50", "metadata", ["mkdir", "p50_us"], "µs", False),
    ("stat p50", "metadata", ["stat", "p50_us"], "µs", False),
    ("unlink p50", "metadata", ["unlink", "p50_us"], "µs", False),
    ("rmdir p50", "metadata", ["rmdir", "p50_us"], "µs", False),
    ("1 MiB seq write, 1 job", "1m_seqwrite_1job", ["mib_s"], "MiB/s", True),
    ("1 MiB seq write, 2 jobs", "1m_seqwrite_2jobs", ["mib_s"], "MiB/s", True),
    ("1 MiB seq read, 1 job", "1m_seqread_1job", ["mib_s"], "MiB/s", True),
    ("1 MiB seq read, 2 jobs", "1m_seqread_2jobs", ["mib_s"], "MiB/s", True),
    ("varmail", "varmail", ["ops_s"], "ops/s", True),
    ("fileserver", "fileserver", ["ops_s"], "ops/s", True),
    ("webserver", "webserver", ["ops_s"], "ops/s", True),
    ("SQLite, synchronous", "sqlite", ["tx_s"], "tx/s", True),
]
ORDER = ["tmpfs", "null-fuse", "orion-mount", "orion-api", "glusterfs", "cephfs", "moosefs"]
PEERS = ["glusterfs", "cephfs", "moosefs"]


def value(results, workload, path):
    v = results.get(workload)
    for k in path:
        if not isinstance(v, dict) or k not in v:
            return None
        v = v[k]
    return v if isinstance(v, (int, float)) else None


def ratio(orion, other, higher):
    """How many times better Orion is (below 1: worse)."""
    if not orion or not other:
        return None
    return orion / other if higher else other / orion


def fmt(x, unit):
    if x is None:
        return "—"
    if unit == "µs" and x < 100:
        return f"{x:.1f}"
    return f"{x:.0f}"


def load(files):
    runs, meta = {}, {}
    for f in files:
        if f.endswith(".raw.json"):
            continue
        try:
            d = json.load(open(f))
        except (OSError, ValueError) as e:
            print(f"skipping {f}: {e}")
            continue
        runs[d["system"]] = d.get("results", {})
        meta[d["system"]] = {k: d.get(k) for k in ("entries", "seconds", "scale")}
    return runs, meta


def build_table(runs, systems):
    table = []
    for label, w, path, unit, higher in ROWS:
        cells = {s: value(runs[s], w, path) for s in systems}
        peers = [cells[s] for s in PEERS if cells.get(s) is not None]
        best_peer = (max(peers) if higher else min(peers)) if peers else None
        orion = cells.get("orion-mount")
        if orion is None:
            orion = cells.get("orion-api")
        table.append({
            "row": label, "unit": unit, "higher_is_better": higher, "cells": cells,
            "orion_vs_best_peer": ratio(orion, best_peer, higher),
            "orion_vs_tmpfs": ratio(orion, cells.get("tmpfs"), higher),
        })
    return table


def markdown(table, systems, machine, meta):
    rv = lambda x: "—" if x is None else f"{x:.2f}×"
    m = next((v for v in meta.values() if v.get("scale") is not None), {})
    lines = [
        f"Machine: {machine['cpus']} CPUs, {machine['memory_gib']} GiB, kernel "
        f"{machine['kernel']}. fio rows run {m.get('seconds')} s each; metadata rows "
        f"take {m.get('entries')} entries; Table 2's file counts are scaled by "
        f"{m.get('scale')} (thread counts, sizes and append sizes as in the table), "
        "each workload running twice as long as a fio row. "
        f"Every system stores in RAM (tmpfs); there is no RDMA "
        "(Orion's fabric runs over shared memory here). Ratios: how many times better "
        "Orion is (the mount; the client API where the mount has no figure) than the "
        "best of GlusterFS, CephFS and MooseFS, and than tmpfs (below 1: worse).",
        "",
        "| workload | unit | " + " | ".join(systems) + " | Orion vs best peer | Orion vs tmpfs |",
        "| --- | --- | " + " | ".join("---" for _ in systems) + " | --- | --- |",
    ]
    for r in table:
        lines.append(
            f"| {r['row']} | {r['unit']} | "
            + " | ".join(fmt(r["cells"][s], r["unit"]) for s in systems)
            + f" | {rv(r['orion_vs_best_peer'])} | {rv(r['orion_vs_tmpfs'])} |")
    return "\n".join(lines) + "\n"


def plots(table, systems, out):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no matplotlib: plots skipped")
        return
    groups = [("latency", ["µs"]), ("bandwidth", ["MiB/s"]), ("applications", ["ops/s", "tx/s"])]
    for name, units in groups:
        rows = [r for r in table if r["unit"] in units]
        if not rows:
            continue
        fig, ax = plt.subplots(figsize=(max(6, len(rows) * 1.3), 4.2))
        width = 0.8 / max(1, len(systems))
        for i, s in enumerate(systems):
            xs = [k + i * width for k in range(len(rows))]
            ys = [r["cells"][s] or 0 for r in rows]
            ax.bar(xs, ys, width, label=s)
        ax.set_xticks([k + 0.4 - width / 2 for k in range(len(rows))])
        ax.set_xticklabels([r["row"] for r in rows], rotation=30, ha="right", fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel(" or ".join(units))
        better = "lower" if units == ["µs"] else "higher"
        ax.set_title(f"{name} ({better} is better; log scale)")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(f"{out}-{name}.png", dpi=110)
        plt.close(fig)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True, help="path prefix of the outputs")
    ap.add_argument("files", nargs="+")
    a = ap.parse_args()
    runs, meta = load(a.files)
    if not runs:
        raise SystemExit("no results to report")
    systems = [s for s in ORDER if s in runs] + [s for s in runs if s not in ORDER]
    table = build_table(runs, systems)
    machine = {
        "host": platform.node(),
        "kernel": platform.release(),
        "cpus": os.cpu_count(),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
    }
    with open(a.out + ".json", "w") as f:
        json.dump({"machine": machine, "runs": meta, "results": runs, "table": table}, f, indent=1)
    md = markdown(table, systems, machine, meta)
    with open(a.out + ".md", "w") as f:
        f.write(md)
    print(md)
    plots(table, systems, a.out)


if __name__ == "__main__":
    main()
