"""Where a vLLM engine start goes, read from the engine's own log lines.

vLLM keeps no record of its start's phases; it logs them, from the processes that do
the work (the engine core, its workers), some with a duration and all at the moment
the phase ends. sweeper gives vLLM a logging configuration (``VLLM_LOGGING_CONFIG_PATH``,
read by every vLLM process at import) that keeps vLLM's usual console output and also
writes each record with its exact wall time to a timing file; after the start, the
lines of that file that mark the ends of phases cut the load into stages:

- ``engine_start``: from the load call until a worker starts loading the model
  (processes spawned, imports, device and distributed init);
- ``weights``: until "Model loading took ..." (weights read, or dummy-initialised);
- ``engine_compile``: until "torch.compile took ... in total" (Dynamo and Inductor, or
  the compiled graphs loaded from the compile cache), inside the first profiling run;
- ``kv_cache``: until CUDA-graph capture begins (the rest of the memory-profiling run,
  the KV cache sized and allocated);
- ``cuda_graphs``: until "Graph capturing finished in N secs" (its start is that line's
  time less N, which vLLM rounds to a second);
- ``engine_warmup``: until "init engine (...) took": the engine's warm-up after capture
  (kernels compiled or autotuned on their first use).

What follows (the engine's handshake with the front end) stays in ``load``, and so does
what precedes the call (vLLM's import in the actor). A phase whose closing
line is missing (another vLLM version, ``enforce_eager`` without compilation or graphs)
is counted in the next phase found; a start with no line at all stays one ``load`` span.
A ``VLLM_LOGGING_CONFIG_PATH`` the user set is kept, and then there is no breakdown.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from actors.stages import carve

log = logging.getLogger(__name__)

# One record per line: wall time (s since the epoch), pid, message (first line only).
_TIMING_FORMAT = "%(created).6f %(process)d %(message)s"
# An in-process engine's files (actors/backends/vllm/backend.py) live in the node's cache, one pair
# per actor process; files no process has written to for this long are removed at the next
# install, so that a node that runs sweeps for months keeps a bounded number of them.
STALE_AFTER_S = 7 * 24 * 3600.0

# vLLM's console format without its own formatter class (kept out of a config file that
# must load in every vLLM version).
_CONSOLE_FORMAT = "%(levelname)s %(asctime)s [%(filename)s:%(lineno)d] %(message)s"


@dataclass(frozen=True)
class _Phase:
    stage: str
    ends: re.Pattern[str]  # the line that closes it
    # The line also states the phase's own length (its first group): the phase begins
    # that long before the line, and what lies between is the previous phase's.
    stated: bool = False


_PHASES = (
    _Phase("engine_start", re.compile(r"^(Starting to load model|Loading model from scratch)")),
    _Phase("weights", re.compile(r"^Model loading took .* ([\d.]+) seconds")),
    # vLLM 0.34 tags the line with the compiled part ("[backbone] torch.compile took ..."; 0.26: none).
    _Phase("engine_compile", re.compile(r"^(?:\[[\w.-]+\] )?torch\.compile (?:and initial profiling/warmup run together )?took")),
    _Phase("cuda_graphs", re.compile(r"^Graph capturing finished in ([\d.]+) secs"), stated=True),
    _Phase("engine_warmup", re.compile(r"^init engine \(profile, create kv cache, warmup model\) took")),
)
# The time between the phase before a stated one and its start: the KV cache's.
_BEFORE_STATED = "kv_cache"


@dataclass(frozen=True)
class Span:
    stage: str
    start_s: float  # wall clock (time.time())
    end_s: float


def engine_log_dir() -> Path:
    """Where in-process engines' logging configurations and timing files go: the node's cache."""
    from actors.models import cache_root

    return cache_root() / "vllm-start"


def prune(directory: Path, older_than_s: float = STALE_AFTER_S, now_s: float | None = None) -> int:
    """Remove the timing files and configurations in ``directory`` untouched for ``older_than_s``;
    returns how many. A file another process removes first is not an error."""
    now_s = time.time() if now_s is None else now_s
    removed = 0
    for path in [*directory.glob("*.timing"), *directory.glob("*.logging.json")]:
        try:
            if now_s - path.stat().st_mtime > older_than_s:
                path.unlink()
                removed += 1
        except FileNotFoundError:
            continue
    return removed


def install(directory: Path, name: str, env: dict[str, str] | None = None) -> Path | None:
    """Write a logging configuration that also sends vLLM's records to ``directory/name.timing``
    and point ``env`` (default: this process's environment) at it. Returns the timing file,
    or None where the user configured vLLM's logging themselves."""
    target = os.environ if env is None else env
    timing = directory / f"{name}.timing"
    config = directory / f"{name}.logging.json"
    users = os.environ.get("VLLM_LOGGING_CONFIG_PATH")
    if (users and Path(users).parent != directory) or os.environ.get("VLLM_CONFIGURE_LOGGING") == "0":
        return None  # the user's own logging configuration
    directory.mkdir(parents=True, exist_ok=True)
    prune(directory)
    config.write_text(json.dumps({
        "version": 1, "disable_existing_loggers": False,
        "formatters": {"console": {"format": _CONSOLE_FORMAT, "datefmt": "%m-%d %H:%M:%S"},
                       "timing": {"format": _TIMING_FORMAT}},
        "handlers": {
            "console": {"class": "logging.StreamHandler", "formatter": "console", "level": "INFO",
                        "stream": "ext://sys.stdout"},
            # Every vLLM process appends whole lines to the one file.
            "timing": {"class": "logging.FileHandler", "formatter": "timing", "level": "INFO",
                       "filename": str(timing), "mode": "a"},
        },
        "loggers": {"vllm": {"handlers": ["console", "timing"], "level": "INFO", "propagate": False}},
    }))
    target["VLLM_LOGGING_CONFIG_PATH"] = str(config)
    return timing


def read_lines(timing: Path, offset: int = 0) -> list[tuple[float, str]]:
    """The timing file's records from byte ``offset`` on, as (wall time, message)."""
    try:
        with open(timing, "rb") as f:
            f.seek(offset)
            text = f.read().decode(errors="replace")
    except OSError:
        return []
    lines = []
    for line in text.splitlines():
        parts = line.split(" ", 2)
        if len(parts) == 3:
            try:
                lines.append((float(parts[0]), parts[2]))
            except ValueError:
                continue  # a continuation line of a multi-line message
    return lines


def phases(lines: list[tuple[float, str]], started_s: float, ended_s: float) -> list[Span]:
    """The start's phases between ``started_s`` and ``ended_s`` (wall clock), in order,
    from the lines that close them (each the first of its kind after the previous one)."""
    spans: list[Span] = []
    begin = started_s
    for phase in _PHASES:
        found = next(((t, m) for t, m in lines if begin <= t <= ended_s and phase.ends.search(m)), None)
        if found is None:
            continue
        t, match = found[0], phase.ends.search(found[1])
        assert match is not None
        start = begin
        if phase.stated:
            start = min(max(t - float(match.group(1)), begin), t)
            if start > begin:
                spans.append(Span(_BEFORE_STATED, begin, start))
        spans.append(Span(phase.stage, start, t))
        begin = t
    return spans


def read_phases(timing: Path | None, offset: int, started_s: float, ended_s: float) -> list[Span]:
    """``phases`` of the records written to ``timing`` since ``offset``; none without a file."""
    if timing is None:
        return []
    spans = phases(read_lines(timing, offset), started_s, ended_s)
    if not spans:
        log.info("no vLLM start phases in %s (another vLLM version's log lines?)", timing)
    return spans


def carve_phases(spans: list[Span]) -> None:
    """A start's phases as stages nested in the current stage (the load), if a clock is current."""
    wall_minus_monotonic_s = time.time() - time.monotonic()
    for span in spans:
        carve(span.stage, span.start_s - wall_minus_monotonic_s, span.end_s - wall_minus_monotonic_s)


def size(timing: Path | None) -> int:
    """Where the next records will start (a process that starts several engines reads each's own)."""
    try:
        return timing.stat().st_size if timing is not None else 0
    except OSError:
        return 0
