#!/usr/bin/env bash
# The fleet on real GPUs, step by step, on one machine of several GPUs (four: nvidia-h100-x4,
# nvidia-h200-x4; two: nvidia-h100-x2, nvidia-h200-x2); each step fits one device call.
#
# Before the steps, carry the wheels (bench/device_wheels.txt) in back-to-back calls, as for
# bench/gpu_session.sh; the last call installs them and runs the first steps:
#   bash .stage/c6/install.sh --install && SWEEPER_COMMIT=<rev> bash bench/fleet_gpu.sh check tp8b
# Later calls on the warm machine: `SWEEPER_COMMIT=<rev> bash bench/fleet_gpu.sh STEP [STEP ...]`,
# or, for more steps than one call holds, `bash bench/fleet_gpu.sh start STEP...` and then
# `bash bench/fleet_gpu.sh collect 540` in back-to-back calls (see the end of this file).
#
# Steps (docs/BENCHMARKS.md, "The fleet on real GPUs"):
#   check         the GPUs, the driver, and that NVLink multicast is off in this environment
#   tp8b          bench/fleet_tp_gpu.yaml: llama-3.1-8b at TP 1, 2, 4, offline; per-GPU energy checked
#   tp8b_serving  bench/fleet_tp_serving_gpu.yaml: the same widths serving three rates under one SLO
#   tp70b         bench/fleet_tp70b_gpu.yaml: llama-3.1-70b bf16 at TP4 and fp8 at TP2
#   packed4       bench/fleet_packed_gpu.yaml on all four GPUs: per-GPU busy seconds, wall time
#   packed2       the same grid on GPUs 0,1 alone (the fewest that hold its TP2 group)
#   packed1       its TP1 groups on GPU 0 alone
#   packed4_tp1   its TP1 groups on all four GPUs: the same grid as packed1, for the wall-time ratio
# A sweep's tensor_parallel values wider than the machine are left out (a 2-GPU machine runs
# TP 1 and 2); twonode gives each node half the GPUs and its servers that tensor parallel.
#   twonode       two `ray start` nodes (head: GPUs 0,1; worker: GPUs 2,3; token authentication),
#                 bench/fleet_twonode_gpu.yaml over both; the worker's raylet SIGKILLed while its
#                 `vllm serve` measures; then what is left running (pgrep, nvidia-smi)
# TWONODE_SWEEP names another sweep file for the twonode procedure (a CPU rehearsal with the
# noop backend: bench/fleet_twonode_cpu.yaml).
# Every step's results and log are packed into $OUT/fleet-<step>.tgz; its summary lines go to
# $OUT/fleet.txt (run as a chain, both come back inside bench/chain.sh's collect archives).
set -uo pipefail
[ -f /tmp/site/env.sh ] && source /tmp/site/env.sh
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1 RAY_USAGE_STATS_ENABLED=0
# NVLink multicast stays off in every process started here (it can take a host's GPUs out of
# service), and vLLM's all-reduce never reaches for symmetric memory: Ray nodes, workers, vLLM
# engines and launched servers all inherit this environment.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 VLLM_ALLREDUCE_USE_SYMM_MEM=0
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
RESULTS=/tmp/sweeper-results  # survives between calls while the machine stays warm
SUMMARY="$OUT/fleet.txt"

note() { echo "$*" | tee -a "$SUMMARY"; }

gpus() {  # GPUs this process may use
    if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then echo "$CUDA_VISIBLE_DEVICES" | tr ',' '\n' | grep -c .
    else nvidia-smi -L | grep -c '^GPU'; fi
}

fit() {  # sweep file, destination, GPUs: the sweep's tensor_parallel values that fit that many GPUs
    # FIT_EXCLUDE (a JSON list of exclude rules) adds rules for this machine, e.g. a shape whose
    # weights do not fit its GPUs' memory. FIT_TP_MAX caps the widths below the machine's.
    FIT_EXCLUDE="${FIT_EXCLUDE:-[]}" FIT_TP_MAX="${FIT_TP_MAX:-1024}" python3 - "$1" "$2" "$3" <<'PY'
import json, os, sys, yaml
d = yaml.safe_load(open(sys.argv[1]))
n = min(int(sys.argv[3]), int(os.environ["FIT_TP_MAX"]))
tp = d.get("tensor_parallel", 1)
tp = [t for t in (tp if isinstance(tp, list) else [tp]) if t <= n]
d["tensor_parallel"] = tp
rules = d.get("exclude", []) + json.loads(os.environ["FIT_EXCLUDE"])
d["exclude"] = [r for r in rules if r.get("tensor_parallel", 0) in tp or "tensor_parallel" not in r]
if not d["exclude"]:
    d.pop("exclude")
yaml.safe_dump(d, open(sys.argv[2], "w"))
print(f"{sys.argv[1]}: tensor_parallel {tp} (widths up to {n})")
PY
}

pack() {  # step name, files and directories to pack
    local name=$1; shift
    tar czf "$OUT/fleet-$name.tgz" --ignore-failed-read "$@" 2>/dev/null
}

sweep() {  # step name, sweep file, results directory, extra sweeper arguments...
    local name=$1 src=$2 file=/tmp/fleet-$1.yaml dir=$3; shift 3
    # The widths this machine holds (a 2-GPU machine runs TP 1 and 2 of a TP 1/2/4 sweep).
    fit "$src" "$file" "$(gpus)" | tee -a "$SUMMARY"
    local t0=$SECONDS
    python3 -m sweeper run "$file" -o "$dir" -q "$@" 2>&1 | tee "$RESULTS/$name.log"
    note "$name: sweeper run exited ${PIPESTATUS[0]} after $((SECONDS - t0)) s of wall"
    grep -E "busy fraction|where the slot time went" "$RESULTS/$name.log" | tee -a "$SUMMARY"
}

ray_cli() { python3 -c 'import sys; from ray.scripts.scripts import main; sys.argv[0] = "ray"; sys.exit(main())' "$@"; }
# A port kept from other binds for a minute, until its node binds it (free_port says why).
free_port() { python3 -c 'from actors.backends.server.process import free_port; print(free_port())'; }
node_ports() {
    for flag in --node-manager-port --object-manager-port --dashboard-agent-listen-port \
                --dashboard-agent-grpc-port --metrics-export-port --runtime-env-agent-port; do
        printf '%s=%s ' "$flag" "$(free_port)"
    done
}

twonode() {
    local token port tmp head worker raylet t0 dir=$RESULTS/twonode n half first second
    n=$(gpus); half=$((n / 2))
    first=$(seq -s, 0 $((half - 1))); second=$(seq -s, "$half" $((n - 1)))
    # One server group per node, as wide as a node: tensor parallel = the node's GPUs.
    python3 -c 'import sys, yaml; d = yaml.safe_load(open(sys.argv[1])); d["tensor_parallel"] = int(sys.argv[3]); yaml.safe_dump(d, open(sys.argv[2], "w"))' \
        "${TWONODE_SWEEP:-bench/fleet_twonode_gpu.yaml}" /tmp/fleet-twonode.yaml "$half"
    note "twonode: head GPUs $first, worker GPUs $second, tensor_parallel $half"
    token=$(python3 -c 'import secrets; print(secrets.token_hex(32))')
    port=$(free_port)
    tmp=$(mktemp -d /tmp/rayXXXX)
    export RAY_AUTH_MODE=token RAY_AUTH_TOKEN=$token
    local health='{"health_check_initial_delay_ms": 0, "health_check_period_ms": 500, "health_check_failure_threshold": 6}'
    # Each node in a process session of its own, so that it can be lost alone.
    # shellcheck disable=SC2046  # node_ports is a list of flags
    CUDA_VISIBLE_DEVICES=$first setsid python3 -c 'import sys; from ray.scripts.scripts import main; sys.argv[0] = "ray"; sys.exit(main())' \
        start --head --block --port="$port" --num-gpus="$half" --num-cpus=8 --include-dashboard=false \
        --ray-client-server-port="$(free_port)" --temp-dir="$tmp" --system-config="$health" $(node_ports) \
        > "$RESULTS/twonode-head.log" 2>&1 &
    head=$!
    sleep 8
    # shellcheck disable=SC2046
    CUDA_VISIBLE_DEVICES=$second setsid python3 -c 'import sys; from ray.scripts.scripts import main; sys.argv[0] = "ray"; sys.exit(main())' \
        start --address="127.0.0.1:$port" --block --num-gpus="$((n - half))" --num-cpus=8 $(node_ports) \
        > "$RESULTS/twonode-worker.log" 2>&1 &
    worker=$!
    sleep 8
    ray_cli status --address "127.0.0.1:$port" 2>&1 | tee "$RESULTS/twonode-status-before.txt" | head -20
    t0=$SECONDS
    python3 -m sweeper run /tmp/fleet-twonode.yaml --address "127.0.0.1:$port" -o "$dir" -q \
        > "$RESULTS/twonode.log" 2>&1 &
    local driver=$!
    # Wait for both servers to be placed, one per node, and a first trial to finish; then lose
    # the worker: SIGKILL its raylet (the node's scheduler: the node is gone for the cluster,
    # its actors die with it, and the launched server must then be stopped by its watchdog).
    until [ "$(grep -c '^placed ' "$RESULTS/twonode.log")" -ge 2 ] && grep -qE '^\[[0-9]+/[0-9]+\] ok' "$RESULTS/twonode.log"; do
        if ! kill -0 "$driver" 2>/dev/null || [ $((SECONDS - t0)) -gt 420 ]; then break; fi
        sleep 2
    done
    grep '^placed ' "$RESULTS/twonode.log" | tee -a "$SUMMARY"
    raylet=$(pgrep -s "$(ps -o sid= -p "$worker" | tr -d ' ')" -x raylet)
    note "twonode: $((SECONDS - t0)) s into the sweep, SIGKILL of the worker's raylet (pid $raylet)"
    pgrep -af 'vllm|raylet|EngineCore' > "$RESULTS/twonode-pgrep-before-kill.txt"
    nvidia-smi --query-compute-apps=pid,process_name,gpu_uuid,used_memory --format=csv > "$RESULTS/twonode-gpu-apps-before-kill.txt"
    kill -9 "$raylet"
    sleep 10  # a server's watchdog stops it within a second of its actor's death
    note "twonode: 10 s after the kill, processes of vllm/raylet/EngineCore:"
    pgrep -af 'vllm|raylet|EngineCore' | cut -c1-160 | tee "$RESULTS/twonode-pgrep-after-kill.txt" | tee -a "$SUMMARY"
    nvidia-smi --query-compute-apps=pid,process_name,gpu_uuid,used_memory --format=csv | tee "$RESULTS/twonode-gpu-apps-after-kill.txt" | tee -a "$SUMMARY"
    wait "$driver"
    note "twonode: sweeper run exited $? after $((SECONDS - t0)) s"
    cat "$RESULTS/twonode.log"
    grep -E "retry|busy fraction" "$RESULTS/twonode.log" | tee -a "$SUMMARY"
    note "twonode: after the sweep, processes of vllm/EngineCore and the GPUs' compute apps:"
    pgrep -af 'vllm|EngineCore' | cut -c1-160 | tee "$RESULTS/twonode-pgrep-after.txt" | tee -a "$SUMMARY"
    nvidia-smi --query-compute-apps=pid,process_name,gpu_uuid,used_memory --format=csv | tee -a "$SUMMARY"
    kill -9 "$head" 2>/dev/null; pkill -9 -s "$(ps -o sid= -p "$head" 2>/dev/null | tr -d ' ')" 2>/dev/null
    python3 -m bench tp-energy "$dir" --out "$RESULTS/twonode-tp.json" | tee -a "$SUMMARY"
    pack twonode "$RESULTS"/twonode*.log "$RESULTS"/twonode*.txt "$RESULTS"/twonode*.json "$dir"/*.parquet "$dir"/plan.json
    unset RAY_AUTH_MODE RAY_AUTH_TOKEN
}

step() {
    case "$1" in
        check) nvidia-smi -L | tee -a "$SUMMARY"
               nvidia-smi --query-gpu=index,name,power.limit,driver_version --format=csv | tee -a "$SUMMARY"
               nvidia-smi topo -m 2>&1 | head -8 | tee -a "$SUMMARY"
               env | grep -E '^(NCCL_NVLS_ENABLE|TORCH_SYMM_MEM_DISABLE_MULTICAST|NVSHMEM_DISABLE_NVLS|VLLM_ALLREDUCE_USE_SYMM_MEM)=' | tee -a "$SUMMARY"
               python3 -c 'import torch, vllm, ray; print("torch", torch.__version__, "vllm", vllm.__version__, "ray", ray.__version__, "GPUs", torch.cuda.device_count())' 2>&1 | tail -1 | tee -a "$SUMMARY" ;;
        tp8b) sweep tp8b bench/fleet_tp_gpu.yaml "$RESULTS/tp8b"
              python3 -m bench tp-energy "$RESULTS/tp8b" --out "$RESULTS/tp8b.json" | tee -a "$SUMMARY"
              # Which all-reduce vLLM chose for its tensor-parallel groups, its own log lines whole.
              grep -rhE "all-reduce backends|custom_all_reduce|symm_mem" /tmp/ray/session_latest/logs/ 2>/dev/null \
                  | cut -c1-800 | sort | uniq -c | sort -rn | head -6 | tee -a "$SUMMARY"
              pack tp8b "$RESULTS/tp8b.log" "$RESULTS/tp8b.json" "$RESULTS/tp8b"/*.parquet "$RESULTS/tp8b/plan.json" ;;
        tp8b_serving) sweep tp8b_serving bench/fleet_tp_serving_gpu.yaml "$RESULTS/tp8b_serving"
              python3 -m bench tp-energy "$RESULTS/tp8b_serving" --out "$RESULTS/tp8b_serving.json" | tee -a "$SUMMARY"
              pack tp8b_serving "$RESULTS/tp8b_serving.log" "$RESULTS/tp8b_serving.json" "$RESULTS/tp8b_serving"/*.parquet ;;
        tp70b) # bf16 70B at TP2 is 70 GB of weights per GPU: it fits an H200 (141 GB), not an H100 (80 GB).
               local mib; mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
               [ "$mib" -lt 100000 ] && export FIT_EXCLUDE='[{"precision": "bf16", "tensor_parallel": 2}]'
               sweep tp70b bench/fleet_tp70b_gpu.yaml "$RESULTS/tp70b"
               unset FIT_EXCLUDE
               python3 -m bench tp-energy "$RESULTS/tp70b" --out "$RESULTS/tp70b.json" | tee -a "$SUMMARY"
               pack tp70b "$RESULTS/tp70b.log" "$RESULTS/tp70b.json" "$RESULTS/tp70b"/*.parquet ;;
        packed4) sweep packed4 bench/fleet_packed_gpu.yaml "$RESULTS/packed4"
                 pack packed4 "$RESULTS/packed4.log" "$RESULTS/packed4"/trials.parquet "$RESULTS/packed4"/stages.parquet ;;
        packed1) CUDA_VISIBLE_DEVICES=0 sweep packed1 bench/fleet_packed_gpu.yaml "$RESULTS/packed1"
                 pack packed1 "$RESULTS/packed1.log" "$RESULTS/packed1"/trials.parquet "$RESULTS/packed1"/stages.parquet ;;
        packed4_tp1) FIT_TP_MAX=1 sweep packed4_tp1 bench/fleet_packed_gpu.yaml "$RESULTS/packed4_tp1"
                 pack packed4_tp1 "$RESULTS/packed4_tp1.log" "$RESULTS/packed4_tp1"/trials.parquet "$RESULTS/packed4_tp1"/stages.parquet ;;
        packed2) CUDA_VISIBLE_DEVICES=0,1 sweep packed2 bench/fleet_packed_gpu.yaml "$RESULTS/packed2"
                 pack packed2 "$RESULTS/packed2.log" "$RESULTS/packed2"/trials.parquet "$RESULTS/packed2"/stages.parquet ;;
        twonode) twonode ;;
        *) echo "unknown step: $1 (see the header of $0)"; return 2 ;;
    esac
}

mkdir -p "$RESULTS"
# A chain of steps longer than one device call (bench/chain.sh): `start STEP...`, then `collect SECONDS`.
case "${1:-}" in
    start) shift; exec bash bench/chain.sh start "$0" "$@" ;;
    collect) exec bash bench/chain.sh collect "${2:-500}" ;;
esac
for s in "$@"; do
    note "== $s ($(date -u +%FT%TZ), commit ${SWEEPER_COMMIT:-unknown})"
    step "$s"
done
