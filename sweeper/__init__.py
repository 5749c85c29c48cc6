"""sweeper: what it costs, in seconds, bytes and joules, to run an LLM a given way.

The control plane (this package) never imports torch, transformers or vllm at
import time, so it runs on a CPU-only Ray head node. The data plane lives in
``actors/``. Its layers, each importing only those before it:

- ``sweeper.core``: shared types and registries (trials, axes, precisions, backends,
  presets, the results schema, errors); the data plane imports this and nothing else.
- ``sweeper.plan``: the sweep file, model resolution, grid expansion, capabilities.
- ``sweeper.run``: the cluster, the sweep run (scheduling on Ray), progress, storage.
- ``sweeper.analysis``: loading results, tables, the report, plots, queries.
"""

from sweeper.core.version import __version__

__all__ = ["__version__"]
