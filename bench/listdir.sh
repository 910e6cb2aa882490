#!/usr/bin/env bash
# The cost of listing a small directory through the mount: `bench/mount-ab.sh
# listdir` (kept for the command of bench/results/2026-11-24-vm-listdir.md).
# Usage: bench/listdir.sh [ROUNDS] BIN [BIN...]
exec "$(dirname "$0")/mount-ab.sh" listdir "$@"
