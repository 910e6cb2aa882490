#!/usr/bin/env bash
# What a short process pays for the preload library (issue 45): `perf stat` of
# /bin/true with the library loaded and without; of `cat` of a small file of the
# mount under `orion run` and through the mount; and `make -j2` of 40 small C files
# on the mount both ways. Each build runs its own `orion up` (local fabric, pools in
# /dev/shm, mirror on).
#   bench/process-start.sh [BUILD_DIR...]   (default: target/release; each holds
#                                            orion and liborion_preload.so)
# Needs perf, gcc and make.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILDS=("$@")
[ ${#BUILDS[@]} -eq 0 ] && BUILDS=("$PWD/target/release")
RUNS=${RUNS:-200}
STATE=
POOLS=
UP_PID=
stop() {
    if [ -n "$UP_PID" ] && kill -0 "$UP_PID" 2>/dev/null; then
        kill -INT "$UP_PID"
        for _ in $(seq 100); do kill -0 "$UP_PID" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$UP_PID" 2>/dev/null || true
    fi
    [ -n "$STATE" ] && { "${ORION:-true}" umount "$STATE/mnt" 2>/dev/null || true; }
    [ -n "$POOLS" ] && rm -rf "$POOLS"
    [ -n "$STATE" ] && rm -rf "$STATE"
    UP_PID= STATE= POOLS=
}
trap stop EXIT

# Mean elapsed and task-clock of RUNS runs of a command, in µs.
stat_of() {
    perf stat -r "$RUNS" -x, -e task-clock "$@" 2>&1 >/dev/null |
        awk -F, '/task-clock/ {cpu=$1} END {printf "cpu %.0f us", cpu*1000}'
    local t0 t1
    t0=$(date +%s%N)
    for _ in $(seq "$RUNS"); do "$@" >/dev/null; done
    t1=$(date +%s%N)
    printf ", elapsed %.0f us\n" "$(((t1 - t0) / RUNS / 1000))"
}

make_tree() {
    mkdir -p "$1"
    for i in $(seq 40); do
        printf 'int f%d(int x) { return x * %d + 1; }\n' "$i" "$i" >"$1/f$i.c"
    done
    printf 'OBJS := $(patsubst %%.c,%%.o,$(wildcard *.c))\nall: $(OBJS)\n%%.o: %%.c\n\tgcc -O0 -c $< -o $@\nclean:\n\trm -f *.o\n' >"$1/Makefile"
}

# Seconds of the best of three `make -j2` runs in $1, each after a clean; "$2..." is
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

for build in "${BUILDS[@]}"; do
    ORION=$build/orion
    LIB=$build/liborion_preload.so
    STATE=$(mktemp -d /tmp/orion-start.XXXXXX)
    POOLS=/dev/shm/$(basename "$STATE")
    "$ORION" up --dir "$STATE" --pools "$POOLS" >"$STATE/up.log" 2>&1 &
    UP_PID=$!
    for _ in $(seq 600); do grep -q "orion up ready" "$STATE/up.log" && break; sleep 0.2; done
    grep -q "orion up ready" "$STATE/up.log" || { tail "$STATE/up.log"; exit 1; }
    MNT=$STATE/mnt
    echo hello >"$MNT/small"
    make_tree "$MNT/proj"
    RUN=("$ORION" run --dir "$STATE" --)
    echo "== $build ($(git -C "$(dirname "$build")" rev-parse --short HEAD 2>/dev/null || echo ?))"
    echo "/bin/true:                       $(stat_of /bin/true)"
    echo "/bin/true, library loaded:       $(LD_PRELOAD=$LIB stat_of /bin/true)"
    echo "cat small through the mount:     $(stat_of cat "$MNT/small")"
    echo "cat small under orion run:       $("${RUN[@]}" bash -c "$(declare -f stat_of); RUNS=$RUNS stat_of cat $MNT/small")"
    echo "make -j2, 40 files, mount:       $(make_time "$MNT/proj")"
    echo "make -j2, 40 files, orion run:   $(make_time "$MNT/proj" "${RUN[@]}")"
    stop
done
