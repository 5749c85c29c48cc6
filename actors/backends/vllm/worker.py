"""Methods sweeper calls inside vLLM's workers, by name.

vLLM mixes ``worker_extension_cls`` into every worker it starts (one per
tensor-parallel rank), and ``LLM.collective_rpc("name")`` runs that method on
each. Calling by name sends only a string to the engine processes; sending a
function instead needs ``VLLM_ALLOW_INSECURE_SERIALIZATION=1``, which lets them
unpickle whatever they receive. This module imports nothing of vLLM: the workers
import it by its dotted path.
"""

from __future__ import annotations

from typing import Any

# The dotted path vLLM imports in each worker.
WORKER_EXTENSION = "actors.backends.vllm.worker.SweeperWorkerExtension"


class SweeperWorkerExtension:
    """Mixed into vLLM's GPU worker: ``self`` is the worker."""

    model_runner: Any

    def sweeper_weight_memory_bytes(self) -> int:
        """What loading the model took on this rank (vLLM's own count, taken around the load)."""
        return int(self.model_runner.model_memory_usage)
