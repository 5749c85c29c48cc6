#!/usr/bin/env bash
# Peer clients against the truth server (issue #45): GuideLLM and AIPerf at one load, each
# against its own tests/truth_server.py, whose send log records when every request reached
# it and when every chunk left. Per client it writes OUT/<client>_<rate>rps_r<round>/:
#   run.json       the load;  sends.jsonl  the server's send log;  client.log  the client's output;
#   cpu.jsonl      the client's process-tree CPU, sampled every 0.1 s (bench/peer_clients.py watch);
#   guidellm.json  (GuideLLM's report) or aiperf/ (AIPerf's artifacts: inputs.json, profile_export*.json*).
# Each request's prompt is 16 words, the first unique ("g<round>r<i>", "a<round>r<i>"), so the
# summariser matches client and server request by request. Constant arrivals, /v1/completions,
# streamed; no tokenizer download: GuideLLM reads prompts from a JSONL file (words = tokens for the
# truth server), AIPerf is given a local tokenizer (--tokenizer builtin fetches tiktoken's o200k_base
# from the internet) and counts tokens from the server's usage (--use-server-token-count).
#
# Venvs, one per client, never the system python:
#   python3 -m venv /tmp/venv-guidellm && /tmp/venv-guidellm/bin/pip install guidellm==0.8.1
#   python3 -m venv /tmp/venv-aiperf && /tmp/venv-aiperf/bin/pip install aiperf==0.13.0
# Usage (from the repository root; one run at a time, on a quiet machine):
#   bench/peer_clients.sh OUT RATE OUTPUT_LEN FIRST_CHUNK_S CHUNK_S DURATION_S ROUND [CLIENTS]
#   bench/peer_clients.sh /tmp/peer 470 64 0.01 0.005 5 0 "guidellm aiperf"
# The measurements of docs/data/peer-clients_cpu_2026-11-28_*.json, two rounds each:
#   for r in 0 1; do
#     bench/peer_clients.sh /tmp/peer 4 32 0.1 0.02 10 $r
#     bench/peer_clients.sh /tmp/peer 150 64 0.01 0.005 5 $r
#     bench/peer_clients.sh /tmp/peer 470 64 0.01 0.005 5 $r
#   done
#   PYTHONPATH=. python3 -m bench http-client --rate 4 --arrival constant --duration-s 10 --output-len 32 \
#       --prompt-len 16 --first-chunk-s 0.1 --token-s 0.02 --rounds 2 --out sweeper_4rps.json   # likewise 150, 470
#   python3 bench/peer_clients.py summarise --out summary.json \
#       --sweeper sweeper_4rps.json /tmp/tmpXXXX/sends.jsonl ... /tmp/peer/*_r*
set -euo pipefail
OUT=$1 RATE=$2 OUTPUT_LEN=$3 FIRST_CHUNK_S=$4 CHUNK_S=$5 DURATION_S=$6 ROUND=$7
CLIENTS=${8:-"guidellm aiperf"}
GUIDELLM=${GUIDELLM:-/tmp/venv-guidellm/bin/guidellm}
AIPERF=${AIPERF:-/tmp/venv-aiperf/bin/aiperf}
TOKENIZER=${TOKENIZER:-$(ls -d ~/.cache/sweeper/bundled/smollm2-135m-* | head -1)}  # any local HF tokenizer
PORT=${PORT:-18431}
# On a small machine the client can starve the server (its own TTFT then grows): SERVER_CPUS=0
# CLIENT_CPUS=1 pins each to its own cores (taskset), e.g. SERVER_CPUS=0 CLIENT_CPUS=1 bench/peer_clients.sh ...
SERVER_PIN=${SERVER_CPUS:+taskset -c $SERVER_CPUS} CLIENT_PIN=${CLIENT_CPUS:+taskset -c $CLIENT_CPUS}
N=$(python3 -c "print(int($RATE * $DURATION_S))")
REPO=$(cd "$(dirname "$0")/.." && pwd)

for client in $CLIENTS; do
  run="$OUT/${client}_${RATE%.*}rps_r$ROUND"
  rm -rf "$run" && mkdir -p "$run"
  printf '{"client": "%s", "pinned": "%s", "rate": %s, "output_len": %s, "first_chunk_s": %s, "chunk_s": %s, "duration_s": %s, "requests": %s, "round": %s}\n' \
    "$client" "${SERVER_CPUS:+server $SERVER_CPUS, client $CLIENT_CPUS}" "$RATE" "$OUTPUT_LEN" "$FIRST_CHUNK_S" "$CHUNK_S" "$DURATION_S" "$N" "$ROUND" > "$run/run.json"
  $SERVER_PIN python3 "$REPO/tests/truth_server.py" --port "$PORT" --model truth --first-chunk-s "$FIRST_CHUNK_S" \
    --chunk-s "$CHUNK_S" --send-log "$run/sends.jsonl" > "$run/server.log" 2>&1 &
  server=$!
  trap 'kill $server 2>/dev/null || true' EXIT
  until curl -sf "http://127.0.0.1:$PORT/v1/models" > /dev/null; do sleep 0.2; done
  tag=${client:0:1}$ROUND
  if [ "$client" = guidellm ]; then
    python3 -c "import json,sys
for i in range($N): print(json.dumps({'prompt': ' '.join(['${tag}r%d' % i] + ['w'] * 15), 'output_tokens_count': $OUTPUT_LEN}))" \
      > "$run/prompts.jsonl"
    cat > "$run/scenario.json" <<EOF
{"spec": {"backend": {"kind": "openai_http", "target": "http://127.0.0.1:$PORT", "model": "truth",
                      "request_format": "/v1/completions", "validate_backend": false},
          "profile": {"kind": "constant", "rate": [$RATE]},
          "constraints": [{"kind": "max_requests", "count": $N}],
          "data": [{"kind": "json_file", "path": "$run/prompts.jsonl"}],
          "outputs": [{"kind": "json", "path": "$run/guidellm.json"}]}}
EOF
    $CLIENT_PIN python3 "$REPO/bench/peer_clients.py" watch "$run/cpu.jsonl" -- \
      "$GUIDELLM" run -c "$run/scenario.json" --disable-progress > "$run/client.log" 2>&1
  else
    python3 -c "import json
for i in range($N): print(json.dumps({'text': ' '.join(['${tag}r%d' % i] + ['w'] * 15)}))" > "$run/prompts.jsonl"
    $CLIENT_PIN python3 "$REPO/bench/peer_clients.py" watch "$run/cpu.jsonl" -- \
      "$AIPERF" profile --model truth --url "http://127.0.0.1:$PORT" --endpoint-type completions --streaming \
      --tokenizer "$TOKENIZER" --use-server-token-count --input-file "$run/prompts.jsonl" \
      --custom-dataset-type single_turn --dataset-sampling-strategy sequential --osl "$OUTPUT_LEN" \
      --request-rate "$RATE" --arrival-pattern constant --request-count "$N" --ui none \
      --artifact-dir "$run/aiperf" > "$run/client.log" 2>&1
  fi
  kill $server; wait $server 2>/dev/null || true
  trap - EXIT
  echo "$run: $(wc -l < "$run/sends.jsonl") requests in the send log"
done
