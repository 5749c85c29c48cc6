"""The Ray cluster a sweep runs on: join one, or start the embedded local Ray."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from sweeper.core.settings import Device


@dataclass(frozen=True)
class ClusterInfo:
    gpus: int
    cpus: int
    nodes: int
    min_node_cpus: int

    @property
    def device(self) -> Device:
        return "cuda" if self.gpus > 0 else "cpu"

    @property
    def slots(self) -> int:
        return self.gpus if self.gpus else self.nodes


def connect(address: str | None) -> ClusterInfo:
    """Join ``address`` or start the embedded local Ray; describe what is there."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import logging

    import ray

    if not ray.is_initialized():
        common: dict[str, Any] = dict(logging_level=logging.ERROR, log_to_driver=False)
        if address:
            ray.init(address=address, **common)
        else:
            # "local": always a fresh in-process Ray. Without it, ray.init() joins
            # whatever cluster /tmp/ray/ray_current_cluster names, even a dead one.
            ray.init(address="local", include_dashboard=False, **common)
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    resources = ray.cluster_resources()
    node_cpus = [int(n["Resources"].get("CPU", 0)) for n in nodes] or [1]
    return ClusterInfo(gpus=int(resources.get("GPU", 0)), cpus=int(resources.get("CPU", 0)),
                       nodes=len(nodes), min_node_cpus=max(min(node_cpus), 1))
