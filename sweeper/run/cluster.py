"""The Ray cluster a sweep runs on: join one, or start the embedded local Ray."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Any

from sweeper.core.errors import UserInputError
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


# How long the head's port may take to answer before the address is reported unreachable.
CONNECT_TIMEOUT_S = 10.0


class ClusterUnreachable(UserInputError):
    """``--address`` names no Ray cluster that answers."""


def check_address(address: str) -> None:
    """Fail in seconds, in one line, for an address that is malformed or where nothing listens.

    Ray itself retries an unreachable head for minutes; a TCP connect to the head's
    port answers at once (refused) or within ``CONNECT_TIMEOUT_S``.
    """
    if address == "auto":
        return  # Ray finds the local node's cluster itself, or says at once that there is none
    target = address.removeprefix("ray://")
    host, sep, port = target.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ClusterUnreachable(f"--address {address}: expected auto, HOST:PORT (a head's GCS port, "
                                 f"6379 by default) or ray://HOST:PORT (Ray Client, 10001)")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S):
            pass
    except OSError as exc:
        raise ClusterUnreachable(f"--address {address}: no Ray head answers there ({exc.strerror or exc}); "
                                 f"start one with `ray start --head` or check the host and port") from None


def connect(address: str | None) -> ClusterInfo:
    """Join ``address`` or start the embedded local Ray; describe what is there."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import logging

    import ray

    if not ray.is_initialized():
        common: dict[str, Any] = dict(logging_level=logging.ERROR, log_to_driver=False)
        if address:
            check_address(address)
            try:
                ray.init(address=address, **common)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                lines = str(exc).strip().splitlines()
                raise ClusterUnreachable(f"--address {address}: {lines[0] if lines else type(exc).__name__}") \
                    from None
        else:
            # "local": always a fresh in-process Ray. Without it, ray.init() joins
            # whatever cluster /tmp/ray/ray_current_cluster names, even a dead one.
            ray.init(address="local", include_dashboard=False, **common)
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    resources = ray.cluster_resources()
    node_cpus = [int(n["Resources"].get("CPU", 0)) for n in nodes] or [1]
    return ClusterInfo(gpus=int(resources.get("GPU", 0)), cpus=int(resources.get("CPU", 0)),
                       nodes=len(nodes), min_node_cpus=max(min(node_cpus), 1))
