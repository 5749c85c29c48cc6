"""What a Ray cluster's autoscaler may launch: its node types, read where Ray keeps them.

An autoscaler launches nodes for demand that nothing alive can meet, so a cluster that
autoscales from zero has no GPU node until something asks Ray for a GPU: the GPUs alive when
a sweep is planned say nothing of those it can have. Its node types do. Two places hold them:

- the cluster config that an autoscaler reporting one keeps in the GCS (what Ray Data and
  Ray Train read, through ``ray._private.state``, for the same question);
- the config file of the autoscaler that ``ray start --head --autoscaling-config FILE``
  starts (``ray up`` passes ``~/ray_bootstrap_config.yaml``, each instance type's resources
  filled in). Ray's autoscaler (v1, the default) writes its process id into the GCS with
  every update; its command line names the GCS it serves and the file, which it reads again
  at every update. Read where the driver runs on the head (``--address auto`` after
  ``ray attach``): the process and the file are there.

Elsewhere (a driver on another machine, an autoscaler that reports neither) sweeper cannot
read them: ``--gpus-per-node`` declares the GPUs of the nodes the cluster launches. A reader
that fails finds none; it never fails the run.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from sweeper.plan.capabilities import NodeType, NodeTypes


def read_node_types(gcs_address: str) -> NodeTypes:
    """The node types the connected cluster's autoscaler may launch (``gcs_address``: the GCS
    this driver is connected to); none where there is no autoscaler or none can be read."""
    return _reported() or _monitor_config(gcs_address) or NodeTypes()


def _reported() -> NodeTypes | None:
    """The cluster config in the GCS, where an autoscaler has reported one."""
    try:
        from ray._private.state import state

        config = state.get_cluster_config()
    except Exception:  # noqa: BLE001 - a Ray without it, a GCS that does not answer: not known here
        return None
    if config is None:
        return None
    types = tuple(NodeType(g.name or f"group {i}", int(g.resources.get("GPU", 0)),
                           int(g.resources["CPU"]) if "CPU" in g.resources else None,
                           None if g.max_count < 0 else int(g.max_count))
                  for i, g in enumerate(config.node_group_configs) if g.max_count != 0)
    return NodeTypes(types, "the autoscaler's cluster config in the GCS") if types else None


def _monitor_config(gcs_address: str) -> NodeTypes | None:
    """The node types of the config file that this cluster's autoscaler runs with, where it runs
    on this machine."""
    path = _monitor_config_path(gcs_address)
    if path is None:
        return None
    try:
        import yaml

        config = yaml.safe_load(path.read_text())
    except Exception:  # noqa: BLE001 - unreadable or not YAML: the autoscaler could not read it either
        return None
    try:
        return node_types_of(config, f"the autoscaler's config {path}") if isinstance(config, dict) else None
    except (TypeError, ValueError):  # a count or a resource that is no number
        return None


def _monitor_config_path(gcs_address: str) -> Path | None:
    """The ``--autoscaling-config`` file of the autoscaler serving ``gcs_address``, as its own
    process reads it; None where it runs elsewhere, or with no file (a fixed cluster)."""
    import psutil
    from ray._private import ray_constants
    from ray.experimental.internal_kv import _internal_kv_get

    from sweeper.run.cluster import same_gcs

    try:
        status = json.loads(_internal_kv_get(ray_constants.DEBUG_AUTOSCALING_STATUS) or b"{}")
        monitor = psutil.Process(int(status["monitor_pid"]))
        args = dict(a.split("=", 1) for a in monitor.cmdline() if a.startswith("--") and "=" in a)
        # The pid is the head's: here it may be any process, or another cluster's autoscaler.
        if not same_gcs(args.get("--gcs-address", ""), gcs_address) or "--autoscaling-config" not in args:
            return None
        path = Path(os.path.expanduser(args["--autoscaling-config"]))  # as the autoscaler expands it
        return path if path.is_absolute() else Path(monitor.cwd()) / path
    except Exception:  # noqa: BLE001 - no autoscaler, none here, or not ours to look at: not known
        return None


def node_types_of(config: dict[str, Any], source: str) -> NodeTypes | None:
    """The node types a Ray autoscaling config (``available_node_types``) may launch, as Ray's
    autoscaler counts them: a type's ``max_workers`` (0 when left out: never launched, as the
    head's type usually is), within the config's ``max_workers`` for all workers together."""
    available = config.get("available_node_types")
    if not isinstance(available, dict):
        return None
    total = config.get("max_workers")
    bound = int(total) if isinstance(total, int | float) and total >= 0 else None
    types, unsized = [], []
    for name, spec in available.items():
        spec = spec if isinstance(spec, dict) else {}
        most = int(spec.get("max_workers") or 0)
        most = min(most, bound) if bound is not None else most
        if most <= 0:
            continue
        resources = spec.get("resources") or {}
        if not resources:
            unsized.append(str(name))
            continue
        cpus = resources.get("CPU")
        types.append(NodeType(str(name), int(resources.get("GPU", 0) or 0),
                              int(cpus) if cpus is not None else None, most))
    return NodeTypes(tuple(types), source, bound, tuple(unsized)) if types or unsized else None
