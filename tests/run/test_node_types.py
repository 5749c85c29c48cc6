"""The GPU nodes a cluster can have, not only those it has: an autoscaler's node types decide
the plan's device, what each group asks of Ray, and how wide a trial may be.

Without a cluster: the node types are records here (read from a config dict, a GCS cluster
config, or declared with ``--gpus-per-node``). The same rule on a real autoscaling Ray (the
fake multi-node provider) is tested in test_autoscaling.py.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from sweeper.core.errors import SweepFileError, UserInputError
from sweeper.plan.capabilities import Capabilities, NodeCapabilities, NodeType, NodeTypes
from sweeper.plan.expand import make_plan
from sweeper.plan.spec import parse_sweep
from sweeper.run.assembly import build_sweep_run
from sweeper.run.autoscaler import node_types_of
from sweeper.run.cluster import ClusterInfo
from sweeper.run.session import check_gpus_per_node, declared
from sweeper.run.storage import ResultStore
from sweeper.run.sweep_run import RunOptions
from tests.conftest import ROOT, run_cli
from tests.run.test_sweep_run import ScriptedRunner

# A head of `CPU: 0` (as cluster.yaml's), no worker up, and what its autoscaler may launch.
TYPES = NodeTypes((NodeType("gpu-1", gpus=1, cpus=1, max_workers=2), NodeType("gpu-2", gpus=2, cpus=1, max_workers=1)),
                  "the autoscaler's config /x/cfg.yaml", max_workers=3)
FROM_ZERO = ClusterInfo(gpus=0, cpus=0, nodes=1, min_node_cpus=1, node_types=TYPES)
HEAD = NodeCapabilities("head", "head", gpus=0, libraries={})  # a CPU-only head with nothing installed


def _sweep(**over: Any):
    return parse_sweep({"name": "auto", "models": ["tiny-llama", "tiny-qwen2"], "backends": "noop",
                        "precisions": "fp32", "batch_sizes": [1, 2], "workload": {"input_len": 8, "output_len": 4},
                        "measure": {"min_iters": 1, "min_duration_s": 0, "idle_s": 0}, **over})


def test_a_cluster_that_can_launch_gpu_nodes_asks_ray_for_gpus_before_any_is_up(tmp_path):
    assert FROM_ZERO.device == "cuda" and FROM_ZERO.awaits_nodes
    assert FROM_ZERO.slots == 4  # two gpu-1 and one gpu-2, within the config's three workers
    assert "waiting for the nodes the autoscaler launches" in FROM_ZERO.text()
    assert "gpu-2 (2 GPUs, 1 CPU(s), up to 1)" in FROM_ZERO.text()
    plan = make_plan(_sweep(tensor_parallel=[1, 2]), FROM_ZERO.device)
    runner = ScriptedRunner()
    build_sweep_run(plan, ResultStore(str(tmp_path / "out")), FROM_ZERO, runner, options=RunOptions(poll_s=0.01)).run()
    # Each group asks for its GPUs (that request is what makes the autoscaler launch a GPU
    # node), not for a node's CPUs, which any node it launches would give without a GPU.
    assert sorted(r["num_gpus"] for r in runner.started) == [1, 1, 2, 2]
    assert all(r["num_cpus"] == 1 for r in runner.started)
    # The same cluster without the node types: the CPUs the defect asked for.
    bare = ClusterInfo(gpus=0, cpus=0, nodes=1, min_node_cpus=1)
    assert bare.device == "cpu" and not bare.awaits_nodes and "launched on demand" not in bare.text()


def test_a_fixed_gpu_cluster_is_unchanged():
    fixed = ClusterInfo(gpus=4, cpus=16, nodes=2, min_node_cpus=8)
    assert fixed.device == "cuda" and fixed.slots == 4 and not fixed.awaits_nodes
    assert fixed.text() == "2 node(s) with 4 GPU(s), 16 CPU(s)"


def test_the_plan_refuses_a_trial_wider_than_every_node_type_and_names_the_widest():
    capabilities = Capabilities((HEAD,), "cluster, 1 node probed", node_types=TYPES)
    with pytest.raises(SweepFileError) as exc:
        make_plan(_sweep(tensor_parallel=3), "cuda", capabilities=capabilities)
    assert ("3 GPUs per trial on one node, but the widest node type its autoscaler launches (gpu-2, from the "
            "autoscaler's config /x/cfg.yaml) has 2") in str(exc.value)
    assert "tensor_parallel" in str(exc.value)
    plan = make_plan(_sweep(tensor_parallel=[1, 2]), "cuda", capabilities=capabilities)
    assert len(plan.runnable) == 8 and not plan.skipped
    assert any(n.startswith("GPU nodes the cluster's autoscaler launches on demand: gpu-1 (1 GPU") and
               n.endswith("each group asks Ray for its GPUs and waits for such a node") for n in plan.notes)
    # With no GPU node and no node type known, no verdict: the cluster may be one whose types
    # sweeper cannot read (--gpus-per-node declares them).
    make_plan(_sweep(tensor_parallel=3), "cuda", capabilities=Capabilities((HEAD,), "cluster, 1 node probed"))


def test_alive_gpus_and_node_types_together_bound_the_width():
    alive = Capabilities((HEAD, NodeCapabilities("w", "w", gpus=4, libraries={})), "cluster, 2 nodes probed",
                         node_types=TYPES)
    assert alive.too_wide("cuda", 4) is None  # the alive node of four
    reason = alive.too_wide("cuda", 8)
    assert reason == ("8 GPUs per trial on one node, but the widest node of the cluster (cluster, 2 nodes probed) "
                      "has 4 and the widest node type its autoscaler launches (gpu-2, from the autoscaler's config "
                      "/x/cfg.yaml) has 2")


def test_what_nodes_not_up_yet_have_installed_is_no_reason_to_skip():
    sweep = _sweep(backends="transformers")  # needs torch and transformers on the node it runs on
    head_only = Capabilities((HEAD,), "cluster, 1 node probed")
    skipped = make_plan(sweep, "cuda", capabilities=head_only)
    assert not skipped.runnable and "which no node of the cluster has installed" in (skipped.skipped[0].skip_reason or "")
    # The trials run on GPU nodes the autoscaler launches: no probe has seen them.
    plan = make_plan(sweep, "cuda", capabilities=Capabilities((HEAD,), "cluster, 1 node probed", node_types=TYPES))
    assert len(plan.runnable) == 4 and not plan.skipped


def test_node_types_as_rays_autoscaler_counts_them():
    config = {"max_workers": 3, "head_node_type": "head", "available_node_types": {
        "head": {"resources": {"CPU": 0}},  # no max_workers: the autoscaler launches none of it
        "gpu-1": {"resources": {"CPU": 1, "GPU": 1}, "max_workers": 2},
        "gpu-8": {"resources": {"CPU": 96, "GPU": 8}, "max_workers": 5},  # bounded by the cluster's 3
        "cpu": {"resources": {"CPU": 4}, "max_workers": 1},
        "off": {"resources": {"GPU": 4}, "max_workers": 0},
    }}
    found = node_types_of(config, "cfg")
    assert found is not None
    assert found.types == (NodeType("gpu-1", 1, 1, 2), NodeType("gpu-8", 8, 96, 3), NodeType("cpu", 0, 4, 1))
    assert found.widest == NodeType("gpu-8", 8, 96, 3)
    assert found.gpus() == 24  # three gpu-8 fill the cluster's three workers
    assert node_types_of({"available_node_types": {}}, "cfg") is None
    assert node_types_of({}, "cfg") is None


def test_the_repositorys_cluster_yaml_leaves_its_gpu_types_to_the_provider():
    """cluster.yaml as written: its GPU types declare no resources (`ray up` fills them in from
    the instance types in the config it writes to the head); read raw, their GPUs are unknown,
    counted as none, and the plan says how to declare them."""
    found = node_types_of(yaml.safe_load((ROOT / "cluster.yaml").read_text()), "cluster.yaml")
    assert found is not None and found.types == () and found.unsized == ("gpu-l40s", "gpu-h100")
    assert any("--gpus-per-node N declares them" in n for n in found.notes())
    filled = node_types_of({**yaml.safe_load((ROOT / "cluster.yaml").read_text()), "available_node_types": {
        "head": {"resources": {"CPU": 0}},
        "gpu-l40s": {"resources": {"CPU": 4, "GPU": 1}, "max_workers": 8},
        "gpu-h100": {"resources": {"CPU": 192, "GPU": 8}, "max_workers": 2}}}, "~/ray_bootstrap_config.yaml")
    assert filled is not None and filled.widest == NodeType("gpu-h100", 8, 192, 2) and filled.gpus() == 24


def test_the_cluster_config_an_autoscaler_reports_to_the_gcs(monkeypatch):
    from ray._private.state import state
    from ray.core.generated import autoscaler_pb2

    config = autoscaler_pb2.ClusterConfig()
    group = config.node_group_configs.add(name="gpu-4", min_count=0, max_count=-1)
    group.resources.update({"GPU": 4, "CPU": 32})
    config.node_group_configs.add(name="never", max_count=0).resources.update({"GPU": 1})
    monkeypatch.setattr(state, "get_cluster_config", lambda: config)
    from sweeper.run.autoscaler import _reported

    found = _reported()
    assert found is not None and found.types == (NodeType("gpu-4", 4, 32, None),)
    assert found.source == "the autoscaler's cluster config in the GCS"


def test_gpus_per_node_declares_the_nodes_sweeper_cannot_read():
    cluster = declared(ClusterInfo(gpus=0, cpus=0, nodes=1, min_node_cpus=1), 2)
    assert cluster.device == "cuda" and cluster.awaits_nodes and cluster.slots == 2
    assert "declared (2 GPUs) (from --gpus-per-node 2)" in cluster.text()
    assert Capabilities((HEAD,), "c", node_types=cluster.node_types).too_wide("cuda", 3) is not None
    unsized = NodeTypes(source="cluster.yaml", unsized=("gpu-l40s",))
    assert unsized.declare(1).unsized == () and unsized.declare(1).source == "cluster.yaml; --gpus-per-node 1"
    for bad in (0, -1, True):
        with pytest.raises(UserInputError, match="expected a whole number of GPUs, at least 1"):
            check_gpus_per_node(bad, joins_cluster=True)
    with pytest.raises(UserInputError, match="it needs --address"):
        check_gpus_per_node(2, joins_cluster=False)


def test_gpus_per_node_on_the_command_line(write_sweep):
    sweep = str(write_sweep("name: s\nmodels: tiny-llama\nbackends: noop\n"))
    r = run_cli("plan", sweep, "--gpus-per-node", "2")
    assert r.returncode == 2 and "--gpus-per-node declares the GPU nodes" in r.stderr and "--address" in r.stderr
    for bad in ("0", "two"):
        r = run_cli("plan", sweep, "--gpus-per-node", bad)
        assert r.returncode == 2 and "--gpus-per-node" in r.stderr, r.stderr
