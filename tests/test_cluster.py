"""cluster.yaml passes Ray's own autoscaler validation, and says what the README promises."""

from __future__ import annotations

import copy

import pytest
import yaml

from tests.conftest import ROOT

# Instance families with GPUs (AWS): g4dn, g5, g6, g6e, p3, p4d, p5, ...
GPU_FAMILIES = ("g", "p")


@pytest.fixture(scope="module")
def cluster_config() -> dict:
    return yaml.safe_load((ROOT / "cluster.yaml").read_text())


def _validate(config: dict) -> dict:
    """What `ray up` does before it touches a cloud: fill in defaults, then validate."""
    from ray.autoscaler._private.util import prepare_config, validate_config

    prepared = prepare_config(copy.deepcopy(config))
    validate_config(prepared)
    return prepared


def test_cluster_yaml_passes_ray_validation(cluster_config):
    prepared = _validate(cluster_config)
    assert prepared["provider"]["type"] == "aws"
    types = prepared["available_node_types"]
    head = types[prepared["head_node_type"]]
    assert not head["node_config"]["InstanceType"].startswith(GPU_FAMILIES)
    workers = {k: v for k, v in types.items() if k != prepared["head_node_type"]}
    assert workers and all(w["node_config"]["InstanceType"].startswith(GPU_FAMILIES) for w in workers.values())
    for w in workers.values():
        assert 0 <= w["min_workers"] <= w["max_workers"] <= prepared["max_workers"]


def test_cluster_yaml_installs_sweeper_and_keeps_the_dashboard_on_the_head(cluster_config):
    assert any("pip install -e" in c and "sweeper[" in c for c in cluster_config["setup_commands"])
    head_start = " ".join(cluster_config["head_start_ray_commands"])
    assert "--dashboard-host=127.0.0.1" in head_start


def test_ray_validation_rejects_a_broken_cluster_yaml(cluster_config):
    """The check above has teeth: Ray refuses an unknown key and an impossible worker count."""
    import jsonschema

    bad = copy.deepcopy(cluster_config)
    bad["available_node_types"]["gpu-l40s"]["gpus_please"] = 1
    with pytest.raises(jsonschema.ValidationError):
        _validate(bad)
    bad = copy.deepcopy(cluster_config)
    bad["available_node_types"]["gpu-l40s"]["min_workers"] = 50
    with pytest.raises(ValueError):
        _validate(bad)


# -- placement on a multi-node cluster ----------------------------------------------------

PLACEMENT_SCRIPT = r'''
import json, sys
from ray.cluster_utils import Cluster
from sweeper.plan import make_plan
from sweeper.scheduler import connect, run_plan
from sweeper.spec import load_sweep
from sweeper.storage import ResultStore

sweep_path, out = sys.argv[1], sys.argv[2]
cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "num_gpus": 0})
workers = [cluster.add_node(num_cpus=2, num_gpus=1) for _ in range(2)]
cluster.wait_for_nodes()
head_id, worker_ids = cluster.head_node.node_id, [w.node_id for w in workers]
info = connect(cluster.address)
plan = make_plan(load_sweep(sweep_path), info.device, sweep_path=sweep_path)
try:
    summary = run_plan(plan, ResultStore(out), info, quiet=True)
finally:
    import ray
    ray.shutdown()
    cluster.shutdown()
print(json.dumps({"gpus": info.gpus, "nodes": info.nodes, "ok": summary.ok, "loads": summary.model_loads,
                  "head": head_id, "workers": worker_ids}))
'''


def test_groups_spread_over_nodes_and_never_share_a_gpu(tmp_path):
    """Four groups on two 1-GPU nodes (logical GPUs) behind a GPU-less head, in its own process."""
    import json
    import os
    import subprocess
    import sys

    from sweeper.storage import ResultStore

    sweep = tmp_path / "spread.yaml"
    sweep.write_text(
        "name: spread\nmodels: [tiny-llama, tiny-qwen2]\nprecisions: [fp32, bf16]\nbatch_sizes: [1, 2]\n"
        "workload: {input_len: 8, output_len: 4}\n"
        "measure: {warmup_iters: 0, min_iters: 1, min_duration_s: 0.5, idle_s: 0}\n")
    script = tmp_path / "placement.py"
    script.write_text(PLACEMENT_SCRIPT)
    # A script outside the checkout finds the packages through PYTHONPATH, installed or not.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    r = subprocess.run([sys.executable, str(script), str(sweep), str(tmp_path / "out")], cwd=ROOT,
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    info = json.loads(r.stdout.strip().splitlines()[-1])
    assert (info["gpus"], info["nodes"], info["ok"], info["loads"]) == (2, 3, 8, 4)

    rows = ResultStore(str(tmp_path / "out")).read_shards("trials").to_pylist()
    by_node: dict[str, list[dict]] = {}
    for row in rows:
        by_node.setdefault(row["ray_node_id"], []).append(row)
    assert set(by_node) == set(info["workers"])  # both GPU nodes used, the head never
    for node_rows in by_node.values():  # one GPU per node: its trials never overlap in time
        spans = sorted((r["started_at"], r["finished_at"]) for r in node_rows)
        assert all(prev_end <= start for (_, prev_end), (start, _) in zip(spans, spans[1:], strict=False))
    # a group's trials stay on one actor, hence one node
    groups: dict[tuple, set] = {}
    for row in rows:
        groups.setdefault((row["model"], row["precision"]), set()).add(row["ray_node_id"])
    assert all(len(nodes) == 1 for nodes in groups.values())
