"""The engine versions sweeper's GPU evidence was measured on (docs/BENCHMARKS.md).

sweeper reads more of an engine than its public surface (vLLM's engine-core stamps, metric
names, log lines, flags): a node with another version runs, but the plan says so in one line,
and docs/ARCHITECTURE.md ("Engine versions") lists what moved in the versions read since.
Keyed by the module a trial needs (``BackendSpec.required_modules``); PEP 440 specifiers.
"""

from __future__ import annotations

TESTED: dict[str, str] = {
    "vllm": "==0.26.*",  # every vLLM figure in BENCHMARKS (H100, H200); 0.34's interface read, not run
    "sglang": "==0.5.16",  # BENCHMARKS §20's runs
}
