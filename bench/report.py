#!/usr/bin/env python3
"""bench/report.py: merges the per-system JSON files of bench/run (one per system and
round) into one results file, a markdown table (each system's median over the rounds;
Orion against the best distributed peer and against tmpfs) and PNG plots.

    bench/report.py --out bench/results/DATE-MACHINE RAW/run*/*.json
"""
import argparse
import json
import os
import platform
import statistics

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
# The scaling section: (label, workload); each has ops/s per job count.
SCALING = [
    ("4 KiB rand write", "scale_4k_randwrite"),
    ("4 KiB rand read", "scale_4k_randread"),
    ("create+stat+unlink", "scale_create_stat_unlink"),
]
# CPU time per operation (summed over every process of the machine: the workload,
# the mount, the daemons, the kernel's threads): (label, workload, path to the
# row's "cpu" object).
CPU_ROWS = [
    ("4 KiB rand write", "4k_randwrite", ["cpu"]),
    ("4 KiB rand write+fsync", "4k_randwrite_fsync", ["cpu"]),
    ("4 KiB rand read", "4k_randread", ["cpu"]),
    ("create", "metadata", ["create", "cpu"]),
    ("mkdir", "metadata", ["mkdir", "cpu"]),
    ("stat", "metadata", ["stat", "cpu"]),
    ("unlink", "metadata", ["unlink", "cpu"]),
    ("rmdir", "metadata", ["rmdir", "cpu"]),
    ("1 MiB seq write, 1 job", "1m_seqwrite_1job", ["cpu"]),
    ("1 MiB seq read, 1 job", "1m_seqread_1job", ["cpu"]),
    ("varmail", "varmail", ["cpu"]),
    ("fileserver", "fileserver", ["cpu"]),
    ("webserver", "webserver", ["cpu"]),
    ("SQLite transaction", "sqlite", ["cpu"]),
]
# The rows whose split by process is shown (table and plot).
CPU_SPLIT_ROWS = ["4 KiB rand write", "create", "stat", "varmail"]
ORDER = ["tmpfs", "null-fuse", "orion-mount", "orion-mount-r2", "orion-preload", "orion-api",
         "orion-api-opt", "glusterfs", "cephfs", "moosefs"]
PEERS = ["glusterfs", "cephfs", "moosefs"]


def value(results, workload, path):
    v = results.get(workload)
    for k in path:
        if not isinstance(v, dict) or k not in v:
            return None
        v = v[k]
    return v if isinstance(v, (int, float)) else None


def values(rounds, workload, path):
    """The figure of every round that has one."""
    return [x for x in (value(r, workload, path) for r in rounds) if x is not None]


def median(xs):
    return statistics.median(xs) if xs else None


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
    """Each system's results, one dict per round."""
    runs, meta = {}, {}
    for f in sorted(files):
        try:
            d = json.load(open(f))
        except (OSError, ValueError) as e:
            print(f"skipping {f}: {e}")
            continue
        runs.setdefault(d["system"], []).append(d.get("results", {}))
        meta[d["system"]] = {k: d.get(k) for k in ("entries", "seconds", "scale")}
    return runs, meta


def build_table(runs, systems):
    table = []
    for label, w, path, unit, higher in ROWS:
        rounds = {s: values(runs[s], w, path) for s in systems}
        cells = {s: median(rounds[s]) for s in systems}
        peers = [cells[s] for s in PEERS if cells.get(s) is not None]
        best_peer = (max(peers) if higher else min(peers)) if peers else None
        orion = cells.get("orion-mount")
        tmpfs = cells.get("tmpfs")
        table.append({
            "row": label, "unit": unit, "higher_is_better": higher, "cells": cells,
            "rounds": rounds,
            "orion_vs_best_peer": ratio(orion, best_peer, higher),
            "orion_vs_tmpfs": ratio(orion, tmpfs, higher),
            "api_vs_tmpfs": ratio(cells.get("orion-api"), tmpfs, higher),
            "api_opt_vs_tmpfs": ratio(cells.get("orion-api-opt"), tmpfs, higher),
            "preload_vs_mount": ratio(cells.get("orion-preload"), orion, higher),
            "preload_vs_api": ratio(cells.get("orion-preload"), cells.get("orion-api"), higher),
        })
    return table


def spread(table, systems):
    """The largest spread of a system's rounds around their median, in percent."""
    worst = 0.0
    for r in table:
        for s in systems:
            xs, m = r["rounds"][s], r["cells"][s]
            if len(xs) > 1 and m:
                worst = max(worst, (max(xs) - min(xs)) / m * 100)
    return worst


def markdown(table, systems, machine, meta, rounds):
    rv = lambda x: "—" if x is None else f"{x:.2f}×"
    m = next((v for v in meta.values() if v.get("scale") is not None), {})
    lines = [
        f"Each figure is the median of {rounds} rounds (every system once per round, in "
        f"turn); the rounds of one figure spread up to {spread(table, systems):.0f}% "
        "around it on this VM (every round's figure is in the JSON). ",
        f"Machine: {machine['cpus']} CPUs, {machine['memory_gib']} GiB, kernel "
        f"{machine['kernel']}. 4 KiB rows run {m.get('seconds')} s each; metadata rows "
        f"take {m.get('entries')} entries; Table 2's file counts are scaled by "
        f"{m.get('scale')} (thread counts, sizes and append sizes as in the table), "
        "each workload running twice as long as a 4 KiB row. "
        f"Every system stores in RAM (tmpfs); there is no RDMA "
        "(Orion's fabric runs over shared memory here). orion-mount-r2 is the mount "
        "with every data page on two data stores (`orion up --replicas 2`). "
        "orion-api is the client "
        "library in the benchmark's process, on the cluster of orion-mount (`orion up`: "
        "an MDS with its mirror), each write committed before it returns; "
        "orion-api-opt the same with optimistic persistence (small writes committed "
        "in batches, at fsync or close, or within 10 ms). orion-preload is the same "
        "benchmark program run unmodified under `orion run` (the preload library serves "
        "its file calls, and its sqlite3's, through the client library in its own "
        "process), on the cluster of orion-mount. Ratios: how many times better "
        "Orion is (the mount) than the best of GlusterFS, CephFS and MooseFS, and than "
        "tmpfs; the client API against tmpfs; the preload library against the mount and "
        "against the API (below 1: worse).",
        "",
        "| workload | unit | " + " | ".join(systems)
        + " | Orion vs best peer | Orion vs tmpfs | API vs tmpfs | API opt. vs tmpfs"
        + " | preload vs mount | preload vs API |",
        "| --- | --- | " + " | ".join("---" for _ in systems)
        + " | --- | --- | --- | --- | --- | --- |",
    ]
    for r in table:
        if not any(r["cells"][s] is not None for s in systems):
            continue  # a run of some workloads only (ONLY=)
        lines.append(
            f"| {r['row']} | {r['unit']} | "
            + " | ".join(fmt(r["cells"][s], r["unit"]) for s in systems)
            + f" | {rv(r['orion_vs_best_peer'])} | {rv(r['orion_vs_tmpfs'])}"
            + f" | {rv(r['api_vs_tmpfs'])} | {rv(r['api_opt_vs_tmpfs'])}"
            + f" | {rv(r['preload_vs_mount'])} | {rv(r['preload_vs_api'])} |")
    if lines[-1].startswith("| --- "):
        lines = lines[:-3]  # no row has a figure: no table
    return "\n".join(lines) + "\n"


def build_scaling(runs, systems):
    """Per scaling workload and system: the median ops/s of each job count."""
    out = []
    for label, w in SCALING:
        counts = sorted({int(j) for s in systems for r in runs[s]
                         for j in (r.get(w, {}).get("jobs") or {})})
        if not counts:
            continue
        cells = {s: {j: median(values(runs[s], w, ["jobs", str(j), "ops_s"])) for j in counts}
                 for s in systems}
        cpu = {s: {j: median(values(runs[s], w, ["jobs", str(j), "cpu", "us_per_op"]))
                   for j in counts} for s in systems}
        out.append({"row": label, "workload": w, "jobs": counts, "cells": cells, "cpu": cpu})
    return out


def pyplot():
    """matplotlib's pyplot drawing to files, or None where it is not installed."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def cpu_of(results, workload, path):
    """The row's CPU object of one round, or None."""
    v = results.get(workload)
    for k in path:
        if not isinstance(v, dict) or k not in v:
            return None
        v = v[k]
    return v if isinstance(v, dict) and "us_per_op" in v else None


def build_cpu(runs, systems):
    """Per CPU row and system: the median µs of CPU per operation over the rounds,
    and the median of each process's share."""
    out = []
    for label, w, path in CPU_ROWS:
        cells, split = {}, {}
        for s in systems:
            rounds = [c for c in (cpu_of(r, w, path) for r in runs[s]) if c]
            cells[s] = median([c["us_per_op"] for c in rounds])
            names = sorted({n for c in rounds for n in (c.get("by") or {})})
            split[s] = {n: median([(c.get("by") or {}).get(n, 0.0) for c in rounds])
                        for n in names}
        if any(v is not None for v in cells.values()):
            out.append({"row": label, "workload": w, "cells": cells, "split": split})
    return out


def cpu_markdown(cpu, systems):
    if not cpu:
        return ""
    lines = [
        "",
        "## CPU time per operation",
        "",
        "Microseconds of CPU per operation, summed over every process of the machine "
        "while the row ran (its threads' run time from /proc, the benchmark's own from "
        "getrusage, so the workload, the mount or client library, every daemon and "
        "the kernel's threads). This is what an operation costs where the application "
        "shares its cores with the file system, whatever the core count: lower is "
        "better. Last column: the Orion mount against the null FUSE (the floor of any "
        "FUSE file system; above 1: Orion costs more).",
        "",
        "| operation | " + " | ".join(systems) + " | mount vs null FUSE |",
        "| --- | " + " | ".join("---" for _ in systems) + " | --- |",
    ]
    for r in cpu:
        c = r["cells"]
        m, n = c.get("orion-mount"), c.get("null-fuse")
        vs = f"{m / n:.2f}×" if m and n else "—"
        lines.append(f"| {r['row']} | " + " | ".join(fmt(c[s], "µs") for s in systems)
                     + f" | {vs} |")
    lines += ["", "Where it goes (µs per operation by process; shares under 2% of a "
              "row's total are summed as `other`; `workload` is the benchmark's "
              "process, with the client library under `orion run` and the API):", ""]
    for r in cpu:
        if r["row"] not in CPU_SPLIT_ROWS:
            continue
        for s in systems:
            sp = r["split"].get(s) or {}
            if not sp:
                continue
            parts = ", ".join(f"{n} {v:.1f}" for n, v in
                              sorted(sp.items(), key=lambda kv: -kv[1]) if v >= 0.05)
            lines.append(f"- {r['row']}, {s}: {parts}")
    return "\n".join(lines) + "\n"


def cpu_plot(cpu, systems, out):
    plt = pyplot()
    if plt is None:
        return
    rows = [r for r in cpu if r["row"] in CPU_SPLIT_ROWS]
    if not rows:
        return
    fig, axes = plt.subplots(1, len(rows), figsize=(4.4 * len(rows), 4.2))
    if len(rows) == 1:
        axes = [axes]
    # One colour per process across the plots.
    every = sorted({n for r in rows for s in systems for n in (r["split"].get(s) or {})})
    colour = {n: plt.get_cmap("tab20")(i % 20) for i, n in enumerate(every)}
    for ax, r in zip(axes, rows):
        names = sorted({n for s in systems for n in (r["split"].get(s) or {})})
        bottom = [0.0] * len(systems)
        for n in names:
            ys = [(r["split"].get(s) or {}).get(n, 0.0) or 0.0 for s in systems]
            ax.bar(range(len(systems)), ys, bottom=bottom, label=n, color=colour[n])
            bottom = [b + y for b, y in zip(bottom, ys)]
        ax.set_xticks(range(len(systems)))
        ax.set_xticklabels(systems, rotation=35, ha="right", fontsize=7)
        ax.set_title(f"{r['row']}: µs CPU per op")
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(f"{out}-cpu.png", dpi=110)
    plt.close(fig)


def scaling_markdown(scaling, systems):
    """One row per workload and job count: ops/s, and × against the system's 1 job."""
    if not scaling:
        return ""
    k = lambda x: "—" if x is None else (f"{x / 1e6:.2f} M" if x >= 1e6 else f"{x / 1e3:.1f} k")
    lines = [
        "",
        "## Scaling: jobs at once through one mount (or one client)",
        "",
        "Each job is a thread of the benchmark on files of its own (a 16 MiB file, or a "
        "directory), all through the same mount (for the client library: the same "
        "`Client`); operations per second over all jobs, and × against one job of the "
        "same system, then the µs of CPU per operation over every process. This VM has "
        "the CPUs above: past them, jobs only share cores.",
        "",
        "| workload | jobs | " + " | ".join(systems) + " |",
        "| --- | --- | " + " | ".join("---" for _ in systems) + " |",
    ]
    for r in scaling:
        for j in r["jobs"]:
            cells = []
            for s in systems:
                x, one = r["cells"][s].get(j), r["cells"][s].get(1)
                times = f" ({x / one:.2f}×)" if x and one and j != 1 else ""
                c = (r.get("cpu") or {}).get(s, {}).get(j)
                cost = f", {c:.1f} µs CPU" if c else ""
                cells.append(k(x) + times + cost)
            lines.append(f"| {r['row']} | {j} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def scaling_plot(scaling, systems, out):
    plt = pyplot()
    if plt is None or not scaling:
        return
    fig, axes = plt.subplots(1, len(scaling), figsize=(4.2 * len(scaling), 3.8))
    if len(scaling) == 1:
        axes = [axes]
    for ax, r in zip(axes, scaling):
        for s in systems:
            js = [j for j in r["jobs"] if r["cells"][s].get(j)]
            if js:
                ax.plot(js, [r["cells"][s][j] for j in js], marker="o", label=s)
        ax.set_xticks(r["jobs"])
        ax.set_xlabel("jobs")
        ax.set_yscale("log")
        ax.set_title(f"{r['row']} (ops/s)")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(f"{out}-scaling.png", dpi=110)
    plt.close(fig)


def plots(table, systems, out):
    plt = pyplot()
    if plt is None:
        print("no matplotlib: plots skipped")
        return
    groups = [("latency", ["µs"]), ("bandwidth", ["MiB/s"]), ("applications", ["ops/s", "tx/s"])]
    for name, units in groups:
        rows = [r for r in table
                if r["unit"] in units and any(r["cells"][s] for s in systems)]
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
    ap.add_argument("--command", help="the command that made the figures (said first)")
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
    scaling = build_scaling(runs, systems)
    cpu = build_cpu(runs, systems)
    with open(a.out + ".json", "w") as f:
        json.dump({"machine": machine, "runs": meta, "results": runs, "table": table,
                   "scaling": scaling, "cpu": cpu}, f, indent=1)
    rounds = max(len(v) for v in runs.values())
    md = (markdown(table, systems, machine, meta, rounds) + cpu_markdown(cpu, systems)
          + scaling_markdown(scaling, systems))
    if a.command:
        md = f"Command: `{a.command}`\n\n" + md
    with open(a.out + ".md", "w") as f:
        f.write(md)
    print(md)
    plots(table, systems, a.out)
    scaling_plot(scaling, systems, a.out)
    cpu_plot(cpu, systems, a.out)


if __name__ == "__main__":
    main()
