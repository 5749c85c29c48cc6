#!/usr/bin/env bash
# Chains of bench/gpu_session.sh steps side by side, each on its own GPUs, in one device call:
#
#   bash bench/gpu_parallel.sh "0:energy" "1:layers16 compile8b overhead1b"
#   bash bench/gpu_parallel.sh "0,1:vllm_tp2"
#
# A chain is DEVICES:STEPS (DEVICES as CUDA_VISIBLE_DEVICES takes them). Each chain stops
# at LIMIT_S seconds (default 560) so that what finished still comes back: all results and
# logs are packed into one $OUT/gpu-<time>.tgz (the device tool returns at most 8 files).
# Steps that share a GPU would disturb each other's timings: give chains disjoint devices.
# Each step runs `python3 -m bench ...` (see bench/gpu_session.sh); SWEEPER_COMMIT set for
# this script reaches every chain's result records.
set -uo pipefail
OUT="${OUT:-/tmp/out}"
LIMIT_S="${LIMIT_S:-560}"
stage=$(mktemp -d /tmp/gpu-parallel.XXXX)
pids=()
for chain in "$@"; do
    devices="${chain%%:*}" steps="${chain#*:}"
    dir="$stage/gpu${devices//,/_}"
    mkdir -p "$dir"
    # shellcheck disable=SC2086  # steps are words
    CUDA_VISIBLE_DEVICES="$devices" OUT="$dir" timeout "$LIMIT_S" bash bench/gpu_session.sh $steps \
        > "$dir/chain.log" 2>&1 &
    pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
for log in "$stage"/*/chain.log; do echo "=== $log"; tail -n 25 "$log"; done
mkdir -p "$OUT"
tar czf "$OUT/gpu-$(date -u +%H%M%S).tgz" -C "$stage" .
exit $status
