# Sourced by the A/B scripts (bench/mount-ab.sh, bench/threads-ab.sh): a fresh
# `orion up` cluster per run (local fabric, pools in /dev/shm, MDS mirror on), always
# stopped by PID, unmounted and removed, and the binaries' turns.
dir="" pools="" up_pid="" up_bin=""
# Stops the running cluster (by PID), unmounts and removes its pools and state:
# after each run, and on any exit (`set -e` leaves a function without its RETURN trap).
stop_cluster() {
    [[ -n $dir ]] || return 0
    if [[ -n $up_pid ]]; then
        kill -INT "$up_pid" 2>/dev/null || true
        for _ in $(seq 100); do kill -0 "$up_pid" 2>/dev/null || break; sleep 0.2; done
        kill -KILL "$up_pid" 2>/dev/null || true
    fi
    # A cluster that needed SIGKILL leaves its mount behind.
    "$up_bin" umount "$dir/mnt" >/dev/null 2>&1 || fusermount3 -uz "$dir/mnt" 2>/dev/null ||
        umount -l "$dir/mnt" 2>/dev/null || true
    rm -rf "$pools" "$dir" || true
    dir="" pools="" up_pid=""
}
trap stop_cluster EXIT
# Starts `BIN up` and waits until it is mounted at $dir/mnt; fails (with its logs on
# stderr) if it is not ready within 30 s or exits first.
start_cluster() {
    local bin=$1
    dir=$(mktemp -d /tmp/orion-ab.XXXX)
    pools=$(mktemp -d -p /dev/shm orion-ab.XXXX)
    "$bin" up --dir "$dir" --pools "$pools" >"$dir/up.log" 2>&1 &
    up_pid=$! up_bin=$bin
    for _ in $(seq 150); do
        grep -q "orion up ready" "$dir/up.log" && return 0
        kill -0 "$up_pid" 2>/dev/null || break
        sleep 0.2
    done
    tail -n 20 "$dir/up.log" "$dir"/logs/*.log >&2 || true
    return 1
}
# Runs `FN BIN` for each BIN, ROUNDS times, in reverse order every other round: the
# first run of a round meets a colder machine.
take_turns() {
    local rounds=$1 fn=$2
    shift 2
    local bins=("$@") order r i bin
    for r in $(seq "$rounds"); do
        order=("${bins[@]}")
        if ((r % 2 == 0)); then
            order=()
            for ((i = ${#bins[@]} - 1; i >= 0; i--)); do order+=("${bins[i]}"); done
        fi
        for bin in "${order[@]}"; do "$fn" "$bin"; done
    done
}
# Reads the scripts' common arguments, [ROUNDS] BIN...: sets $rounds and $bins
# (default: 1 round of the release build, made here with the cargo flags in $1).
ab_args() {
    local build=$1
    shift
    rounds=1
    if [[ $# -gt 0 && $1 =~ ^[0-9]+$ ]]; then rounds=$1; shift; fi
    bins=("$@")
    if [[ ${#bins[@]} -eq 0 ]]; then
        source scripts/setup
        # shellcheck disable=SC2086
        cargo build --release $build
        bins=(target/release/orion)
    fi
}
