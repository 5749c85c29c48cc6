"""The Ray cluster a sweep runs on: join one, or start the embedded local Ray."""

from __future__ import annotations

import contextlib
import functools
import os
import socket
import sys
from dataclasses import dataclass

from sweeper.core.errors import UserInputError
from sweeper.core.secrets import header_unsafe
from sweeper.core.settings import Device
from sweeper.plan.capabilities import NodeTypes


@dataclass(frozen=True)
class ClusterInfo:
    gpus: int  # alive now
    cpus: int
    nodes: int
    min_node_cpus: int
    node_ips: frozenset[str] = frozenset()  # the live nodes' addresses (Ray's node:<ip> resources)
    # This call started the embedded local Ray, whose workers run this interpreter: what is
    # installed here is what they have. Otherwise the nodes are asked (a capability probe).
    embedded: bool = False
    # What its autoscaler may launch (sweeper.run.autoscaler), or what --gpus-per-node declares.
    node_types: NodeTypes = NodeTypes()

    @property
    def device(self) -> Device:
        # A cluster that can launch GPU nodes is a GPU cluster before any is up: its groups
        # must ask Ray for GPUs, or the autoscaler never launches a GPU node for them (and the
        # nodes it launches for their CPUs run them without their GPU).
        return "cuda" if self.gpus > 0 or self.node_types.with_gpus else "cpu"

    @property
    def slots(self) -> int:
        """Groups that may run at once: its GPUs (those its node types can bring up, where more;
        not added to the alive ones, which may be of those types) or, CPU-only, its nodes."""
        if self.device == "cuda":
            return max(self.gpus, self.node_types.gpus())
        return self.nodes

    @property
    def awaits_nodes(self) -> bool:
        """No GPU node is up yet: every group waits for one the autoscaler launches."""
        return self.device == "cuda" and self.gpus == 0

    def text(self) -> str:
        """The cluster in a clause: what is up, and what its autoscaler launches on demand."""
        text = f"{self.nodes} node(s) with {self.gpus} GPU(s), {self.cpus} CPU(s)"
        if not self.node_types.with_gpus:
            return text
        text += f"; GPU nodes launched on demand: {self.node_types.text()}"
        if self.awaits_nodes:
            return text + "; waiting for the nodes the autoscaler launches for the groups"
        return text


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


# How long the head's GCS may take to answer the pre-flight call.
PROBE_TIMEOUT_S = 5.0
# A read-only GCS method every driver calls first; its token check precedes reading the request.
_KV_GET = "/ray.rpc.InternalKVGcsService/InternalKVGet"


@dataclass(frozen=True)
class _Token:
    value: str
    source: str  # where it came from, for the message that says it was refused


def _auth_token() -> _Token | None:
    """The token this driver would send, from where Ray looks: RAY_AUTH_TOKEN, then the file
    RAY_AUTH_TOKEN_PATH names, then ~/.ray/auth_token."""
    from pathlib import Path

    if os.environ.get("RAY_AUTH_TOKEN", "").strip():
        return _checked(_Token(os.environ["RAY_AUTH_TOKEN"].strip(), "RAY_AUTH_TOKEN"))
    path = os.environ.get("RAY_AUTH_TOKEN_PATH") or str(Path.home() / ".ray" / "auth_token")
    try:
        text = Path(path).read_bytes().decode("utf-8").strip()
    except OSError:
        return None
    except UnicodeDecodeError:
        raise ClusterUnreachable(f"the Ray token file {path} is not UTF-8 text: copy the head's token "
                                 "(`ray get-auth-token` there) into it") from None
    return _checked(_Token(text, path)) if text else None


def _checked(token: _Token) -> _Token:
    """A token that can travel in a gRPC header, or one line naming where it came from and what
    is wrong with it (never the token itself)."""
    if (problem := header_unsafe(token.value)) is not None:
        raise ClusterUnreachable(f"the Ray token from {token.source} cannot be sent: {problem}")
    return token


def _auth_metadata(token: _Token | None) -> tuple[tuple[str, str], ...]:
    """gRPC metadata carrying ``token`` the way Ray's own clients send it."""
    return (("authorization", f"Bearer {token.value}"),) if token else ()


def _gcs_address(address: str) -> str | None:
    """HOST:PORT of the head's GCS for a driver address, or None (Ray Client's ray://, which
    speaks its own protocol; or "auto" with no local cluster: ray.init says so at once)."""
    if address.startswith("ray://"):
        return None
    if address == "auto":
        try:
            from ray._private.services import canonicalize_bootstrap_address

            return canonicalize_bootstrap_address("auto")
        except Exception:  # noqa: BLE001 - any failure: leave the judgement to ray.init
            return None
    return address


def probe_head(address: str) -> _Token | None:
    """One bounded call to the head's GCS before Ray is imported: ``ray.init`` would retry a
    missing or refused token for 20 s in a storm of warnings, then raise a traceback.

    The call carries the token this driver would send (an empty request: the token check
    comes before the request is read). A missing or refused token is one line saying what to
    do. When the cluster wants a token and accepts ours, token mode is switched on for this
    driver (before Ray reads it, at import), so a token is all a user has to provide.
    Returns the token the cluster accepted, or None where it wants none.
    """
    import grpc

    def call(token: _Token | None) -> None:
        with grpc.insecure_channel(address) as channel:
            channel.unary_unary(_KV_GET)(b"", timeout=PROBE_TIMEOUT_S, metadata=_auth_metadata(token))

    token = _auth_token()
    try:
        call(token)
    except grpc.RpcError as exc:
        if exc.code() == grpc.StatusCode.UNAUTHENTICATED:
            if token is None:
                raise ClusterUnreachable(
                    f"--address {address}: the cluster requires a token (Ray token authentication) and "
                    f"this driver has none: set RAY_AUTH_TOKEN, or copy the head's token (`ray get-auth-token` "
                    f"there) into ~/.ray/auth_token") from None
            raise ClusterUnreachable(f"--address {address}: the cluster refused this driver's token (from "
                                     f"{token.source}): use the head's (`ray get-auth-token` there)") from None
        raise ClusterUnreachable(f"--address {address}: no Ray head's GCS answers there "
                                 f"({exc.code().name.lower()}: {exc.details()}); is it the head's "
                                 f"--port (6379 by default)?") from None
    if token is None:
        return None
    try:
        call(None)
    except grpc.RpcError as exc:
        if exc.code() != grpc.StatusCode.UNAUTHENTICATED:
            raise
        if os.environ.get("RAY_AUTH_MODE") != "token":
            if "ray._raylet" in sys.modules:  # Ray read the mode when it was imported: too late
                raise ClusterUnreachable(f"--address {address}: the cluster requires token authentication: "
                                         f"set RAY_AUTH_MODE=token (the token from {token.source} is "
                                         f"accepted)") from None
            os.environ["RAY_AUTH_MODE"] = "token"
        return token
    return None  # the cluster checks no token: none is sent


def cluster_versions(address: str, token: _Token | None) -> bytes:
    """The cluster's recorded metadata (Ray and Python versions), as every driver reads it first."""
    import grpc
    from ray._private import ray_constants
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    request = gcs_service_pb2.InternalKVGetRequest(  # type: ignore[attr-defined]
        key=b"CLUSTER_METADATA", namespace=ray_constants.KV_NAMESPACE_CLUSTER)
    with grpc.insecure_channel(address) as channel:
        stub = gcs_service_pb2_grpc.InternalKVGcsServiceStub(channel)
        return stub.InternalKVGet(request, timeout=PROBE_TIMEOUT_S, metadata=_auth_metadata(token)).value


def _check_versions(address: str, metadata: bytes) -> None:
    import json
    import platform

    import ray

    try:
        cluster = json.loads(metadata)
    except ValueError:
        return  # no metadata recorded: ray.init judges
    mine = {"ray_version": ray.__version__, "python_version": platform.python_version()}
    ray_differs = cluster.get("ray_version") not in (None, mine["ray_version"])
    # Ray itself requires the same Python major.minor on the driver and the cluster.
    python_differs = (cluster.get("python_version") or "").rsplit(".", 1)[0] not in (
        "", mine["python_version"].rsplit(".", 1)[0])
    if ray_differs or python_differs:
        raise ClusterUnreachable(
            f"--address {address}: the cluster runs Ray {cluster.get('ray_version')} on Python "
            f"{cluster.get('python_version')}, this driver Ray {mine['ray_version']} on Python "
            f"{mine['python_version']}: install the cluster's Ray (pip install \"ray[default]=="
            f"{cluster.get('ray_version')}\") in a Python {cluster.get('python_version', '').rsplit('.', 1)[0]} "
            f"environment, or run the driver on the head") from None


def connected_gcs() -> str | None:
    """HOST:PORT of the GCS of the cluster this process's Ray driver is connected to ("" where
    the driver does not say: a Ray Client connection), or None (no driver; Ray not even imported)."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return None
    try:
        return str(ray.get_runtime_context().gcs_address or "")
    except Exception:  # noqa: BLE001 - a client's context has none to give
        return ""


@functools.cache
def _host_name_addresses() -> frozenset[str]:
    """What this machine's host name resolves to, asked once a process: a name the resolver
    does not know costs its whole timeout (10 s and more) at every ask."""
    with contextlib.suppress(OSError):
        return frozenset(socket.gethostbyname_ex(socket.gethostname())[2])
    return frozenset()


def _own_addresses() -> set[str]:
    """The addresses this machine is known by: its host name's, and the one Ray's nodes here
    advertise (the address of its default route, which the host name need not resolve to)."""
    own = {"127.0.0.1", "::1"} | _host_name_addresses()
    ray = sys.modules.get("ray")
    if ray is not None:
        with contextlib.suppress(Exception):
            own.add(str(ray.util.get_node_ip_address()))
    return own


def _this_machine(host: str) -> set[str]:
    """The addresses ``host`` resolves to; for a name of this machine (loopback, or one of its
    own addresses), every address this machine is known by."""
    try:
        found = {str(info[4][0]) for info in socket.getaddrinfo(host.strip("[]"), None)}
    except OSError:
        return {host}
    own = _own_addresses()
    if any(ip.startswith("127.") or ip in own for ip in found):
        return found | own
    return found


def same_gcs(a: str, b: str) -> bool:
    """Whether two HOST:PORT addresses name one GCS: one port, and hosts that resolve alike
    (loopback and this machine's own addresses count as one host)."""
    (host_a, _, port_a), (host_b, _, port_b) = a.rpartition(":"), b.rpartition(":")
    return port_a == port_b and bool(_this_machine(host_a) & _this_machine(host_b))


def connect(address: str | None) -> ClusterInfo:
    """Join ``address`` or start the embedded local Ray; describe what is there.

    A process whose Ray driver is already connected (a notebook's ``ray.init``, a caller that
    runs several sweeps) runs on that cluster, as one job; an ``address`` that names another
    cluster is refused. Nothing a run needs is set for the whole job: what an actor needs
    travels with its load call.
    """
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    connected = connected_gcs()
    if connected is not None:
        gcs = _gcs_address(address) if address and address != "auto" else None
        if gcs is not None and connected and not same_gcs(gcs, connected):
            raise ClusterUnreachable(f"--address {address}: this process's Ray driver is connected to another "
                                     f"cluster (GCS {connected}); leave --address out to run there, or "
                                     f"ray.shutdown() first")
        return describe(embedded=False)
    if address:
        _join(address)
        return describe(embedded=False)
    import logging

    import ray

    # "local": always a fresh in-process Ray. Without it, ray.init() joins
    # whatever cluster /tmp/ray/ray_current_cluster names, even a dead one.
    ray.init(address="local", include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False)
    return describe(embedded=True)


def _join(address: str) -> None:
    import logging

    check_address(address)
    gcs = _gcs_address(address)
    token = probe_head(gcs) if gcs is not None else None  # before Ray is imported: it may switch token mode on
    import ray

    if gcs is not None:
        _check_versions(address, cluster_versions(gcs, token))
    try:
        ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        lines = str(exc).strip().splitlines()
        raise ClusterUnreachable(f"--address {address}: {lines[0] if lines else type(exc).__name__}") from None


def describe(*, embedded: bool) -> ClusterInfo:
    """The connected cluster's nodes and resources, and the node types its autoscaler may launch."""
    import ray

    from sweeper.run.autoscaler import read_node_types

    nodes = [n for n in ray.nodes() if n.get("Alive")]
    resources = ray.cluster_resources()
    node_types = NodeTypes() if embedded else read_node_types(connected_gcs() or "")
    # The nodes a CPU-only trial may run on: those with CPUs (a head of `CPU: 0` runs none),
    # alive or of a type the autoscaler launches.
    node_cpus = [c for n in nodes if (c := int(n["Resources"].get("CPU", 0))) > 0]
    node_cpus += [t.cpus for t in node_types.types if t.cpus]
    return ClusterInfo(gpus=int(resources.get("GPU", 0)), cpus=int(resources.get("CPU", 0)),
                       nodes=len(nodes), min_node_cpus=min(node_cpus, default=1),
                       node_ips=frozenset(str(n.get("NodeManagerAddress")) for n in nodes), embedded=embedded,
                       node_types=node_types)
