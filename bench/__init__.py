"""sweeper's benchmarks: GPU evidence for the measurement method, and the tools that turn
results into the figures of docs/BENCHMARKS.md.

One entry point, run from the repository root (which makes ``sweeper``, ``actors`` and
``bench`` importable, installed or not)::

    python3 -m bench --help
    python3 -m bench SUBCOMMAND [args]      # e.g. python3 -m bench energy --out energy.json

Each subcommand is the module of the same name with ``-`` read as ``_`` (``compile-check``:
``bench/compile_check.py``), exposing ``add_arguments(parser)`` and ``run(args)``. Every
JSON result goes through :func:`bench.benchkit.write_record`: one record format, which
says what produced the file (command, commit, date, device, versions). On a lent GPU
machine, ``bench/gpu_session.sh`` and ``bench/gpu_parallel.sh`` run the subcommands one
device call at a time.
"""

from __future__ import annotations

# The subcommands, in the order ``--help`` lists them.
SUBCOMMANDS = (
    "energy",
    "overhead",
    "layers",
    "backends",
    "compile-check",
    "quant-check",
    "roofline",
    "scheduling",
    "plan-scale",
    "driver-scale",
    "overlap",
    "warmup",
    "stability",
    "vllm-compare",
    "serving",
    "server-peer",
    "http-client",
    "trials-table",
    "tp-energy",
    "readme-plot",
    "conversations",
    "typed-rows",
    "kv-cache",
    "report-render",
    "launch-race",
    "search-compare",
    "scored-replies",
    "capacity-peer",
)


def module_name(subcommand: str) -> str:
    return "bench." + subcommand.replace("-", "_")
