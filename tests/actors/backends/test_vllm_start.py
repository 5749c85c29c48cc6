"""A vLLM engine start's phases, read from the log lines vLLM writes through sweeper's
logging configuration: a real child process logging vLLM's own messages, and the parser."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from actors.backends.vllm.start import (
    STALE_AFTER_S,
    Span,
    engine_log_dir,
    install,
    phases,
    prune,
    read_lines,
    read_phases,
    size,
)

# vLLM 0.26's messages, as its format strings render them (actors/backends/vllm/start.py).
START = [
    (100.0, "Initializing a V1 LLM engine (v0.26.0) with config: model='/m'"),
    (104.0, "Starting to load model /m..."),
    (104.5, "Loading weights took 0.40 seconds"),
    (106.0, "Model loading took 2.3 GiB memory and 1.950000 seconds"),
    (107.0, "Dynamo bytecode transform time: 3.10 s"),
    (121.0, "torch.compile took 14.80 s in total"),
    (123.0, "Initial profiling/warmup run took 1.90 s"),
    (124.0, "Available KV cache memory: 60.1 GiB"),
    (130.0, "Graph capturing finished in 5 secs, took 0.42 GiB"),
    (131.0, "init engine (profile, create kv cache, warmup model) took 25.00 s (compilation: 14.80 s)"),
]


def test_the_phases_of_a_start_partition_it_in_order():
    assert phases(START, 99.0, 132.0) == [
        Span("engine_start", 99.0, 104.0), Span("weights", 104.0, 106.0), Span("engine_compile", 106.0, 121.0),
        Span("kv_cache", 121.0, 125.0), Span("cuda_graphs", 125.0, 130.0), Span("engine_warmup", 130.0, 131.0)]
    # Lines of another engine's start (before this load, or after it) are not this one's.
    assert phases(START, 131.5, 200.0) == []
    # enforce_eager: no compilation and no graphs; what lies after the weights stays in the load.
    eager = [line for line in START if "compile" not in line[1] and "Graph" not in line[1]]
    assert [s.stage for s in phases(eager, 99.0, 132.0)] == ["engine_start", "weights", "engine_warmup"]
    # A version without the compile line counts its compilation in the KV-cache phase.
    assert phases([line for line in START if not line[1].startswith("torch.compile")], 99.0, 132.0)[2:] == [
        Span("kv_cache", 106.0, 125.0), Span("cuda_graphs", 125.0, 130.0), Span("engine_warmup", 130.0, 131.0)]
    # vLLM 0.34 tags its compile line with the part compiled (vllm/compilation/monitor.py): the same phase.
    tagged = [(t, "[backbone] " + m if m.startswith("torch.compile") else m) for t, m in START]
    assert phases(tagged, 99.0, 132.0) == phases(START, 99.0, 132.0)
    # A stated length longer than the time since the previous phase starts at that phase's end.
    assert phases([(1.0, "Starting to load model m"), (2.0, "Graph capturing finished in 9 secs")], 0.0, 3.0) == [
        Span("engine_start", 0.0, 1.0), Span("cuda_graphs", 1.0, 2.0)]


def test_vllm_s_processes_log_to_the_console_and_to_the_timing_file(tmp_path, monkeypatch):
    monkeypatch.delenv("VLLM_LOGGING_CONFIG_PATH", raising=False)
    env: dict[str, str] = {}
    timing = install(tmp_path / "logs", "engine-1", env)
    assert timing is not None and env["VLLM_LOGGING_CONFIG_PATH"].endswith("engine-1.logging.json")
    messages = ["Starting to load model /m...", "Model loading took 2.3 GiB memory and 0.100000 seconds",
                "torch.compile took 0.20 s in total", "Graph capturing finished in 0 secs, took 0.01 GiB"]
    child = (  # what a vLLM process does at import: configure logging from the file
        "import json, logging.config, os, sys\n"
        "logging.config.dictConfig(json.load(open(os.environ['VLLM_LOGGING_CONFIG_PATH'])))\n"
        "log = logging.getLogger('vllm.v1.worker.gpu_model_runner')\n"
        "for m in json.loads(sys.argv[1]): log.info(m)\n"
        "logging.getLogger('elsewhere').warning('not vLLM')\n")
    before = size(timing)
    for _ in range(2):  # two processes of one engine append to the one file
        done = subprocess.run([sys.executable, "-c", child, json.dumps(messages[:2])], env=env,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert "INFO" in done.stdout and "Starting to load model /m..." in done.stdout  # the usual console log
    done = subprocess.run([sys.executable, "-c", child, json.dumps(messages[2:])], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = read_lines(timing, before)
    assert [m for _, m in lines] == messages[:2] * 2 + messages[2:]
    assert all(a <= b for (a, _), (b, _) in zip(lines, lines[1:], strict=False))  # wall times, in order
    spans = read_phases(timing, before, lines[0][0] - 1.0, lines[-1][0] + 1.0)
    # (the moments between the compile line and the capture line are the KV cache's)
    assert [s.stage for s in spans if s.stage != "kv_cache"] == ["engine_start", "weights", "engine_compile",
                                                                 "cuda_graphs"]
    # Read from an offset: only what a later engine start wrote.
    assert read_lines(timing, size(timing)) == []


def test_a_logging_configuration_the_user_set_is_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_LOGGING_CONFIG_PATH", str(tmp_path / "mine.json"))
    assert install(tmp_path / "logs", "engine-1", {}) is None
    assert read_phases(None, 0, 0.0, 1.0) == []


def test_engine_files_live_in_the_node_cache_and_stale_ones_are_pruned(tmp_path, monkeypatch):
    monkeypatch.delenv("VLLM_LOGGING_CONFIG_PATH", raising=False)
    monkeypatch.setenv("SWEEPER_CACHE", str(tmp_path / "cache"))
    directory = engine_log_dir()
    assert directory == tmp_path / "cache" / "vllm-start"
    old = install(directory, "engine-1", {})
    assert old is not None
    old.write_text("1.0 1 Starting to load model m\n")
    live = install(directory, "engine-2", {})
    assert live is not None
    live.write_text("")
    stale_s = time.time() - STALE_AFTER_S - 60
    for path in (old, directory / "engine-1.logging.json"):
        os.utime(path, (stale_s, stale_s))
    other = directory / "notes.txt"  # not sweeper's: never touched
    other.write_text("x")
    os.utime(other, (stale_s, stale_s))
    # The next engine's install prunes what no process wrote to for a week, and nothing else.
    assert install(directory, "engine-3", {}) is not None
    assert sorted(p.name for p in directory.iterdir()) == [
        "engine-2.logging.json", "engine-2.timing", "engine-3.logging.json", "notes.txt"]
    assert prune(directory, older_than_s=0.0, now_s=time.time() + 1) == 3  # engine-3 has no timing file yet
