#!/usr/bin/env bash
# What a short process pays for the preload library (issue 45, design note 83):
# `perf stat` of /bin/true with the library loaded and without; of `cat` of a small
# file of the mount under `orion run` and through the mount; and `make -j2` of 40
# small C files on the mount both ways. For each binary in turn, a fresh cluster
# (bench/ab-cluster.sh); the library is the one next to the binary.
#   bench/process-start.sh [ROUNDS] BIN...   (default: 1 round of the release build)
# Needs perf, gcc and make.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-200}
source bench/ab-cluster.sh
ab_args "-p orion-cli -p orion-preload" "$@"

# Mean task-clock of RUNS runs of a command (its own CPU), then its elapsed time and
# the whole machine's CPU per run (every process: the cluster's daemons too; busy
# clock ticks of /proc/stat, less idle, iowait and steal), in µs.
stat_of() {
    perf stat -r "$RUNS" -x, -e task-clock "$@" 2>&1 >/dev/null |
        awk -F, '/task-clock/ {cpu=$1} END {printf "cpu %.0f us", cpu*1000}'
    busy() { awk '/^cpu / {print $2+$3+$4+$7+$8}' /proc/stat; }
    local t0 t1 b0 b1 hz
    hz=$(getconf CLK_TCK)
    b0=$(busy)
    t0=$(date +%s%N)
    for _ in $(seq "$RUNS"); do "$@" >/dev/null; done
    t1=$(date +%s%N)
    b1=$(busy)
    printf ", elapsed %.0f us, machine cpu %.0f us\n" "$(((t1 - t0) / RUNS / 1000))" \
        "$(((b1 - b0) * 1000000 / hz / RUNS))"
}

make_tree() {
    mkdir -p "$1"
    for i in $(seq 40); do
        printf 'int f%d(int x) { return x * %d + 1; }\n' "$i" "$i" >"$1/f$i.c"
    done
    printf 'OBJS := $(patsubst %%.c,%%.o,$(wildcard *.c))\nall: $(OBJS)\n%%.o: %%.c\n\tgcc -O0 -c $< -o $@\nclean:\n\trm -f *.o\n' >"$1/Makefile"
}

# Milliseconds of the best of three `make -j2` runs in $1, each after a clean; "$2..." is
# the prefix that runs make (nothing, or `orion run --dir ... --`).
make_time() {
    local dir=$1 best=
    shift
    for _ in 1 2 3; do
        "$@" make -s -C "$dir" clean >/dev/null
        local t0 t1
        t0=$(date +%s%N)
        "$@" make -s -j2 -C "$dir" >/dev/null
        t1=$(date +%s%N)
        local ms=$(((t1 - t0) / 1000000))
        if [ -z "$best" ] || [ "$ms" -lt "$best" ]; then best=$ms; fi
    done
    echo "${best} ms"
}

run_one() {
    local orion=$1 mnt
    local lib
    # Where `orion run` finds it: beside the binary, links resolved.
    lib=$(dirname "$(readlink -f "$(command -v "$orion")")")/liborion_preload.so
    [[ -f $lib ]] || { echo "no $lib" >&2; return 1; }
    start_cluster "$orion"
    mnt=$dir/mnt
    echo hello >"$mnt/small"
    make_tree "$mnt/proj"
    local run=("$orion" run --dir "$dir" --)
    echo "== $orion"
    echo "/bin/true:                       $(stat_of /bin/true)"
    echo "/bin/true, library loaded:       $(LD_PRELOAD=$lib stat_of /bin/true)"
    echo "cat small through the mount:     $(stat_of cat "$mnt/small")"
    echo "cat small under orion run:       $("${run[@]}" bash -c "$(declare -f stat_of); RUNS=$RUNS stat_of cat $mnt/small")"
    echo "make -j2, 40 files, mount:       $(make_time "$mnt/proj")"
    echo "make -j2, 40 files, orion run:   $(make_time "$mnt/proj" "${run[@]}")"
    stop_cluster
}
take_turns "$rounds" run_one "${bins[@]}"
