"""Per-layer profiling: how much of a forward's GPU time and energy each module takes.

The package reads in the order the work happens:

- ``select``: which modules to time at a granularity (block, submodule, leaf);
- ``timers``: what a module's time is (kernel time on CUDA, host clock on CPU);
- ``profiler``: the forward hooks that time the chosen modules, split by phase;
- ``attribute``: the pass's measured energy shared out over the modules;
- ``profile_pass``: the profiling pass a trial runs after its headline measurement.

``LayerProfileError`` lives here because every step can raise it.
"""

from __future__ import annotations


class LayerProfileError(Exception):
    """The model's layers cannot be profiled (no decoder blocks found, overlapping units)."""
