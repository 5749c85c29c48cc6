"""The seam between the scheduler and the cluster: actors started, called and ended.

``SweepRun`` reaches the cluster only through an ``ActorRunner``; ``RayActorRunner``
is the production one, over Ray actors of the data plane's ``TrialRunner``, and the
scheduler's tests drive it with scripted runners.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any, Protocol

from sweeper.core.errors import first_line
from sweeper.core.trial import GroupLoad, Trial

# The data plane's actor class, named by string as the backend registry names
# backends: the control plane never imports the data plane.
ACTOR_CLASS = "actors.actor:TrialRunner"

# How long a finished group's actor may take to release its backend before it is killed.
CLOSE_TIMEOUT_S = 60.0


# -- the seam to the cluster -------------------------------------------------------------

class ActorDied(Exception):
    """The actor (or its node) died before the call returned."""


class CallFailed(Exception):
    """The call itself failed on the actor (e.g. an argument that did not deserialize)."""


class CallKind(enum.Enum):
    PING = "ping"  # answered once the actor is placed, before its load
    LOAD = "load"
    RUN = "run"
    CLOSE = "close"  # the actor releases its backend (a vLLM engine's processes end); then it is ended


class ActorRunner(Protocol):
    """Starts actors and calls them; every call returns a future the runner can wait on."""

    def start(self, resources: dict[str, Any]) -> Any:
        """A new actor holding ``resources`` (it may wait for them); returns its handle."""

    def call(self, actor: Any, kind: CallKind, trial: Trial | None = None, group: GroupLoad | None = None) -> Any:
        """Submit ``ping``, ``load(trial, group)`` or ``run(trial)`` to ``actor``; returns a future."""

    def wait(self, futures: Sequence[Any], timeout_s: float) -> list[Any]:
        """The futures among ``futures`` that are done (at least one unless ``timeout_s`` passes)."""

    def result(self, future: Any) -> Any:
        """The call's value; raises ``ActorDied`` or ``CallFailed``."""

    def close(self, actor: Any) -> Any:
        """Ask ``actor`` to release its backend; returns a future that is done once it has. The
        caller ends the actor then (``release``), or when the close runs past its bound (``kill``)."""

    def release(self, actor: Any) -> None:
        """End an actor that has closed its backend: its resources go to the next actor."""

    def kill(self, actor: Any) -> None:
        """End ``actor`` now (a dead one is already gone; a hung one must not hold its GPU)."""


class RayActorRunner:
    """``ActorRunner`` over Ray actors of the data plane's ``TrialRunner``."""

    def __init__(self) -> None:
        import importlib

        import ray

        module, _, name = ACTOR_CLASS.partition(":")
        self._ray = ray
        self._remote = ray.remote(getattr(importlib.import_module(module), name))

    def start(self, resources: dict[str, Any]) -> Any:
        return self._remote.options(**resources).remote()

    def call(self, actor: Any, kind: CallKind, trial: Trial | None = None, group: GroupLoad | None = None) -> Any:
        method = getattr(actor, kind.value)
        args = () if trial is None else (trial,) if group is None else (trial, group)
        return method.remote(*args)

    def wait(self, futures: Sequence[Any], timeout_s: float) -> list[Any]:
        ready, _ = self._ray.wait(list(futures), num_returns=1, timeout=timeout_s)
        return list(ready)

    def result(self, future: Any) -> Any:
        from ray.exceptions import RayActorError, RayError

        try:
            return self._ray.get(future)
        except RayActorError as exc:
            raise ActorDied(first_line(exc)) from exc
        except RayError as exc:
            raise CallFailed(first_line(exc)) from exc

    def close(self, actor: Any) -> Any:
        # close() first: a backend whose engine runs in child processes (vLLM)
        # must end them, or they keep the GPU after the actor is killed.
        return actor.close.remote()

    def release(self, actor: Any) -> None:
        self._ray.kill(actor)

    def kill(self, actor: Any) -> None:
        self._ray.kill(actor)

