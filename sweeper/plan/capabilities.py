"""What each node of the cluster can run: installed libraries and GPUs, asked at plan time.

The registries name what a trial needs (``BackendSpec.requires``,
``Precision.library``); this module finds out where that is installed. On a
cluster a tiny Ray task pinned to every alive node reports its own Python
environment, because the driver's environment says nothing about the workers'
(a CPU-only head node may lack vllm while its GPU workers have it). Without a
cluster the local environment stands in, and says so.

A library present nowhere that a trial could be placed makes the trial
``skipped`` at plan time; a node that does not answer the probe is left out,
never a reason to skip. A worker that lacks a library all the same fails the
trial with ``BackendUnavailable``.

A process that runs several sweeps through one Ray driver (a notebook, the session API) may
reuse its last answer for the same alive nodes (``probe_cluster(reuse=True)``): each probe
starts a fresh worker on every node, about a second and a half on a busy machine. What was
found present is trusted (a library removed since fails its trials on the worker, as above);
a reused answer that would skip a trial is not (one installed since would go unseen), and the
caller asks the nodes again (``sweeper.run.session``).
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass, field, replace

from sweeper.core.backends import BACKENDS
from sweeper.core.precisions import PRECISIONS
from sweeper.core.servers import ENGINES
from sweeper.plan.installed import host_libraries, library_versions

PROBE_TIMEOUT_S = 60.0


def probed_libraries() -> tuple[str, ...]:
    """Every module or distribution the registries say a trial may need."""
    names = {m for b in BACKENDS.values() for m in b.requires}
    names |= {m for e in ENGINES.values() for m in e.modules}
    names |= {p.library for p in PRECISIONS.values() if p.library}
    return tuple(sorted(names))


@dataclass(frozen=True)
class NodeCapabilities:
    node_id: str
    hostname: str
    gpus: int
    libraries: dict[str, str | None] = field(default_factory=dict)

    def has(self, library: str) -> bool:
        return self.libraries.get(library) is not None


def _gpus(n: int) -> str:
    return f"{n} GPU{'s' if n != 1 else ''}"


@dataclass(frozen=True)
class NodeType:
    """A kind of node a cluster's autoscaler may launch: its resources per node as its config
    declares them (no node of it need be alive), and how many of it the config allows."""

    name: str
    gpus: int
    cpus: int | None = None  # None: the config does not say
    max_workers: int | None = None  # None: no bound known (a node shape the user declared)

    def text(self) -> str:
        parts = [_gpus(self.gpus)] + ([f"{self.cpus} CPU(s)"] if self.cpus is not None else [])
        parts += [f"up to {self.max_workers}"] if self.max_workers is not None else []
        return f"{self.name} ({', '.join(parts)})"


# The node type a user declares with --gpus-per-node, for a cluster whose node types sweeper cannot read.
DECLARED = "--gpus-per-node"


@dataclass(frozen=True)
class NodeTypes:
    """The node types a cluster's autoscaler may launch, and where sweeper learnt them
    (``sweeper.run.autoscaler``). Empty: a fixed cluster, or one whose types are unknown."""

    types: tuple[NodeType, ...] = ()
    source: str = ""  # "the autoscaler's config FILE" | "--gpus-per-node" | ...
    max_workers: int | None = None  # the config's bound on all its workers together
    # Types whose config declares no resources (a cloud provider fills them in at launch, from
    # the instance type): their GPUs are unknown here, so they count for none.
    unsized: tuple[str, ...] = ()

    @property
    def with_gpus(self) -> tuple[NodeType, ...]:
        return tuple(t for t in self.types if t.gpus > 0)

    @property
    def widest(self) -> NodeType | None:
        return max(self.with_gpus, key=lambda t: t.gpus, default=None)

    def gpus(self) -> int:
        """The most GPUs these nodes hold at once: the widest types first, within the config's
        bounds (a type with none counts one node: how many the cloud gives is not known)."""
        left = self.max_workers
        total = 0
        for t in sorted(self.with_gpus, key=lambda t: -t.gpus):
            n = t.max_workers if t.max_workers is not None else 1
            n = min(n, left) if left is not None else n
            total += n * t.gpus
            left = left - n if left is not None else None
        return total

    def declare(self, gpus_per_node: int) -> NodeTypes:
        """These types and the one the user declares (``--gpus-per-node``)."""
        source = f"{DECLARED} {gpus_per_node}"
        # The declaration answers for the types the config leaves unsized.
        return replace(self, types=(*self.types, NodeType("declared", gpus_per_node)), unsized=(),
                       source=f"{self.source}; {source}" if self.source else source)

    def text(self) -> str:
        return f"{', '.join(t.text() for t in self.with_gpus)} (from {self.source})"

    def notes(self) -> list[str]:
        """What a plan says of them: the GPU nodes it waits for, and the types it could not size."""
        notes = []
        if self.with_gpus:
            notes.append(f"GPU nodes the cluster's autoscaler launches on demand: {self.text()}; each group asks "
                         "Ray for its GPUs and waits for such a node")
        if self.unsized:
            notes.append(f"node type(s) {', '.join(self.unsized)} declare no resources in {self.source} (their "
                         f"provider fills them in at launch): counted without GPUs; {DECLARED} N declares them")
        return notes


@dataclass(frozen=True)
class Capabilities:
    """What the nodes a sweep can use have installed; ``source`` says where that was learnt."""

    nodes: tuple[NodeCapabilities, ...]
    source: str  # "cluster (N nodes probed)" | "local environment"
    unanswered: tuple[str, ...] = ()  # node ids that did not answer the probe
    reused: bool = False  # this process's earlier answer for the same alive nodes (probe_cluster)
    # The node types the cluster's autoscaler may launch: their GPUs are known, what they have
    # installed is not (no node of them need be alive to answer the probe).
    node_types: NodeTypes = NodeTypes()

    def candidates(self, device: str, num_gpus: int) -> tuple[tuple[NodeCapabilities, ...], str]:
        """Nodes a trial could be placed on, and how to name them in a reason."""
        if device == "cuda":
            fit = tuple(n for n in self.nodes if n.gpus >= num_gpus)
            if fit:
                return fit, f"node with {_gpus(num_gpus)}"
        # No node fits (Ray will say so when it queues the trial): judge libraries on all.
        return self.nodes, "node"

    def _on_nodes_to_come(self, device: str, num_gpus: int) -> bool:
        """No alive node fits the trial but a node type the autoscaler launches does: it runs on
        a node that is not up yet, whose libraries no probe has seen (the alive ones, a CPU-only
        head, say nothing of them)."""
        return (device == "cuda" and not any(n.gpus >= num_gpus for n in self.nodes)
                and any(t.gpus >= num_gpus for t in self.node_types.types))

    def where_missing(self, library: str, device: str, num_gpus: int) -> str | None:
        """Why no node a trial could use has ``library`` (a clause for a skip reason), or None."""
        if not self.nodes or self._on_nodes_to_come(device, num_gpus):
            return None  # nothing answered, or not up yet: unknown is not a reason to skip
        nodes, what = self.candidates(device, num_gpus)
        if any(n.has(library) for n in nodes):
            return None
        if self.source == LOCAL:
            return "which is not installed in the local environment"
        return f"which no {what} of the cluster has installed ({self.source})"

    def too_wide(self, device: str, num_gpus: int) -> str | None:
        """Why a trial of ``num_gpus`` can never be placed, or None.

        A trial's GPUs are one node's (a tensor-parallel group spans no network), so a
        trial wider than the widest node, alive or of a type the autoscaler launches, would
        wait forever. A cluster with no GPU node and no GPU node type known gives no verdict:
        its node types may be unreadable here (its GPU nodes come with the demand), or the plan
        is for some other machine.
        """
        if device != "cuda":
            return None
        alive = max((n.gpus for n in self.nodes), default=0)
        launched = self.node_types.widest
        if not 0 < max(alive, launched.gpus if launched else 0) < num_gpus:
            return None
        where = []
        if alive or launched is None:
            where.append(f"this machine has {alive}" if self.source == LOCAL
                         else f"the widest node of the cluster ({self.source}) has {alive}")
        if launched is not None:
            where.append(f"the widest node type its autoscaler launches ({launched.name}, from "
                         f"{self.node_types.source}) has {launched.gpus}")
        return f"{num_gpus} GPUs per trial on one node, but {' and '.join(where)}"

    def versions(self, library: str, device: str, num_gpus: int) -> list[str]:
        if self._on_nodes_to_come(device, num_gpus):
            return []  # unknown: not a reason to skip
        nodes, _ = self.candidates(device, num_gpus)
        return sorted({v for n in nodes if n.has(library) and (v := n.libraries[library]) is not None})


LOCAL = "local environment"


def local_gpus() -> int:
    """How many NVIDIA GPUs this machine has, asked of NVML (no torch import)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no driver, no library: no GPUs
        return 0


def local_capabilities(gpus: int) -> Capabilities:
    """This interpreter's libraries, standing in for a cluster's (no --address)."""
    node = NodeCapabilities("local", socket.gethostname(), gpus, library_versions(probed_libraries()))
    return Capabilities((node,), LOCAL)


# This process's last complete answer per cluster (its GCS address): the alive nodes it came
# from, the answer, and when it was had (time.monotonic()).
_ANSWERS: dict[str, tuple[frozenset[str], Capabilities, float]] = {}


def probe_cluster(timeout_s: float = PROBE_TIMEOUT_S, *, reuse: bool = False) -> Capabilities:
    """Ask every alive node of the connected Ray cluster what it has installed.

    One task per node, pinned there (hard node affinity) and asking for no
    CPU, so a node busy with trials still answers. GPU counts are Ray's.
    ``reuse``: this process's last answer where the cluster's alive nodes are still the ones
    it came from and every one of them answered (``reused``, and its ``source`` says when).
    """
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    alive = [n for n in ray.nodes() if n.get("Alive")]
    gcs, node_ids = ray.get_runtime_context().gcs_address, frozenset(n["NodeID"] for n in alive)
    last = _ANSWERS.get(gcs)
    if reuse and last is not None and last[0] == node_ids:
        _, answer, at = last
        return replace(answer, reused=True, source=f"{answer.source} {time.monotonic() - at:.0f} s before, "
                                                    "by this process")
    names = probed_libraries()
    probe = ray.remote(num_cpus=0, max_retries=0)(host_libraries)
    refs = {
        probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote(names):
        n for n in alive
    }
    ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s)
    nodes, unanswered = [], []
    for ref, n in refs.items():
        if ref not in ready:
            unanswered.append(n["NodeID"])
            continue
        try:
            hostname, libraries = ray.get(ref)
        except Exception:
            unanswered.append(n["NodeID"])
            continue
        nodes.append(NodeCapabilities(n["NodeID"], hostname, int(n["Resources"].get("GPU", 0)), libraries))
    for ref in refs:
        if ref not in ready:
            ray.cancel(ref, force=True)
    source = f"cluster, {len(nodes)} node{'s' if len(nodes) != 1 else ''} probed"
    if unanswered:
        source += f", {len(unanswered)} did not answer"
        _ANSWERS.pop(gcs, None)
        return Capabilities(tuple(nodes), source, tuple(unanswered))
    answer = Capabilities(tuple(nodes), source)
    _ANSWERS[gcs] = (node_ids, answer, time.monotonic())
    return answer
