"""CPU time and context switches of every thread of the given processes over a window:
`python3 bench/idle_cpu.py SECONDS PID...` prints "idle: X% of a core, N wake-ups/s
over K processes" (bench/idle.sh, bench/cost-ab.sh)."""
import os
import sys
import time

window, pids = float(sys.argv[1]), sys.argv[2:]


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
            for line in st.splitlines():
                if line.startswith(("voluntary_ctxt", "nonvoluntary_ctxt")):
                    wakes += int(line.split()[1])
    return ns, wakes


a, wa = snap()
time.sleep(window)
b, wb = snap()
print(f"idle: {(b - a) / window / 1e7:.2f}% of a core, "
      f"{(wb - wa) / window:.0f} wake-ups/s over {len(pids)} processes")
