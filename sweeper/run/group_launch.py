"""What a group's actor is asked for and handed: its Ray resources and its load request.

The scheduler (``sweeper.run.sweep_run``) decides when an actor starts and for which group;
what the request holds is decided here, from the backend registry, the cluster and the
driver's environment, so that the scheduler needs none of them.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sweeper.core.backends import BACKENDS
from sweeper.core.secrets import SecretValues
from sweeper.core.trial import GroupLoad
from sweeper.plan.expand import TrialGroup
from sweeper.run.cluster import ClusterInfo


@dataclass(frozen=True)
class GroupLaunch:
    """How every group of one run is launched on ``cluster``."""

    cluster: ClusterInfo
    server_log_dir: str | None = None  # the results directory's ``servers/`` (``ResultStore.server_log_dir``)
    environ: Mapping[str, str] = field(default_factory=lambda: os.environ)

    def resources(self, group: TrialGroup) -> dict[str, Any]:
        """The actor's Ray resource request. One GPU per group (tensor parallel: several) when
        there are GPUs, or GPU nodes the autoscaler can launch (the request is what makes it
        launch one); otherwise a whole node's CPUs, so no two measured trials share a device.
        A backend may add custom resources (an external server's energy site's node)."""
        t = group.trials[0]
        extra = BACKENDS[t.backend].ray_resources(t.backend_options)
        placed: dict[str, Any] = {"resources": extra} if extra else {}
        if self.cluster.device == "cuda":
            return {"num_gpus": group.num_gpus, "num_cpus": 1, **placed}
        return {"num_gpus": 0, "num_cpus": self.cluster.min_node_cpus, **placed}

    def load_request(self, group: TrialGroup) -> GroupLoad:
        """What the group's load call carries beside its first trial. Variables the actor needs
        from the driver's environment (an external server's key) go with the call, so they
        reach whichever node it lands on and no log of Ray's."""
        t = group.trials[0]
        secrets = SecretValues.of({name: self.environ[name] for name in BACKENDS[t.backend].actor_env(t.backend_options)
                                   if name in self.environ})
        return dataclasses.replace(group.load_request, server_log_dir=self.server_log_dir, secrets=secrets)
