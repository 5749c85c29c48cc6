#!/usr/bin/env bash
# A chain of GPU steps longer than one device call (600 s): it runs in a process session of its
# own, which outlives the call (the machine stays held while calls keep coming), writing into
# $RESULTS/out; each later call brings what the chain has written so far into its own $OUT.
#
#   bash bench/chain.sh start SCRIPT STEP...   # runs `bash SCRIPT STEP...` with OUT=$RESULTS/out
#   bash bench/chain.sh collect SECONDS        # waits up to SECONDS for the chain, then copies
#                                              # what is new; call again until it says done
# What is new is packed into one archive per call, collect-HHMMSS.tgz (the device tool returns at
# most 8 files); each file goes once, except text files (*.txt, *.log, *.json), which grow and go
# every time. SCRIPT is bench/gpu_session.sh or bench/fleet_gpu.sh.
set -uo pipefail
RESULTS=/tmp/sweeper-results  # survives between calls while the machine stays warm
OUT="${OUT:-/tmp/out}"
mkdir -p "$RESULTS/out" "$OUT"
case "${1:-}" in
    start) shift
           OUT=$RESULTS/out setsid nohup bash "$@" > "$RESULTS/chain.log" 2>&1 < /dev/null &
           echo $! > "$RESULTS/chain.pid"
           echo "chain started (pid $(cat "$RESULTS/chain.pid")): $*" ;;
    collect) t0=$SECONDS
             while kill -0 "$(cat "$RESULTS/chain.pid")" 2>/dev/null && [ $((SECONDS - t0)) -lt "${2:-500}" ]; do
                 sleep 5
             done
             kill -0 "$(cat "$RESULTS/chain.pid")" 2>/dev/null && echo "chain running" || echo "chain done"
             # What is new goes back as one archive: the device tool returns at most 8 files a call.
             new=()
             for f in "$RESULTS"/out/*; do
                 case "$f" in *.sent) continue ;; esac
                 [ -f "$f.sent" ] && continue
                 new+=("$(basename "$f")")
                 case "$f" in *.txt|*.log|*.json) ;; *) touch "$f.sent" ;; esac
             done
             [ ${#new[@]} -gt 0 ] && tar czf "$OUT/collect-$(date -u +%H%M%S).tgz" -C "$RESULTS/out" "${new[@]}"
             cp "$RESULTS/out/fleet.txt" "$OUT/" 2>/dev/null
             tail -c 6000 "$RESULTS/chain.log" > "$OUT/chain-tail.log"
             cat "$RESULTS/out/fleet.txt" 2>/dev/null ;;
    *) echo "usage: $0 start SCRIPT STEP... | collect SECONDS" >&2; exit 2 ;;
esac
