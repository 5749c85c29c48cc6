"""cluster.yaml passes Ray's own autoscaler validation, and says what the guide promises."""

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


def test_every_node_starts_with_token_authentication_and_the_token_is_not_in_the_repo(cluster_config):
    starts = [c for key in ("head_start_ray_commands", "worker_start_ray_commands")
              for c in cluster_config[key] if "ray start" in c]
    assert len(starts) == 2 and all("RAY_AUTH_MODE=token ray start" in c for c in starts)
    # The token travels from the user's machine to each node's default path, never from the checkout.
    assert cluster_config["file_mounts"]["~/.ray/auth_token"] == "~/.ray/auth_token"
    assert any("RAY_AUTH_MODE=token" in c for c in cluster_config["setup_commands"])  # attach/submit shells


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


# -- docs/cluster-onprem.yaml: the same fleet on machines of your own (Ray's local provider) --


@pytest.fixture(scope="module")
def onprem_config() -> dict:
    return yaml.safe_load((ROOT / "docs" / "cluster-onprem.yaml").read_text())


def test_the_onprem_cluster_yaml_passes_ray_validation_and_brings_up_every_listed_host(onprem_config):
    prepared = _validate(onprem_config)
    provider = prepared["provider"]
    assert provider["type"] == "local" and provider["head_ip"] not in provider["worker_ips"]
    # One node type, Ray's own for on-prem clusters: every listed worker is brought up and kept.
    (name, node_type), = prepared["available_node_types"].items()
    assert prepared["head_node_type"] == name
    assert node_type["min_workers"] == node_type["max_workers"] == len(provider["worker_ips"]) == prepared["max_workers"]
    assert {"ssh_user", "ssh_private_key"} <= prepared["auth"].keys()


def test_the_onprem_cluster_yaml_starts_and_syncs_as_cluster_yaml_does(onprem_config, cluster_config):
    """Token authentication on every node, the dashboard on the head's loopback, the same
    checkout, token mount and setup commands as the AWS file: one way of running, two fleets."""
    for key in ("setup_commands", "file_mounts"):
        assert onprem_config[key] == cluster_config[key], key
    starts = [c for key in ("head_start_ray_commands", "worker_start_ray_commands")
              for c in onprem_config[key] if "ray start" in c]
    assert len(starts) == 2 and all("RAY_AUTH_MODE=token ray start" in c for c in starts)
    head_start = " ".join(onprem_config["head_start_ray_commands"])
    assert "--dashboard-host=127.0.0.1" in head_start and "--autoscaling-config=~/ray_bootstrap_config.yaml" in head_start
    assert "--num-cpus=0" in head_start  # no trial next to the driver, as cluster.yaml's head
    # Ray's v1 autoscaler starts the workers; a worker's Ray stops itself soon after `ray down`
    # has stopped the head's, and runs no log monitor, which never would (see the file).
    assert "RAY_enable_autoscaler_v2=0 " in head_start
    worker_start = " ".join(onprem_config["worker_start_ray_commands"])
    assert "RAY_gcs_rpc_server_reconnect_timeout_s=" in worker_start and "--include-log-monitor=false" in worker_start


@pytest.mark.parametrize("name", [
    # cluster.yaml's exclude was `results` once, which dropped sweeper/core/results from every node.
    "cluster.yaml", "docs/cluster-onprem.yaml"])
def test_the_checkout_synced_to_the_nodes_holds_every_file_of_sweepers_packages(name, tmp_path):
    """What `ray up` syncs to `~/sweeper` (file_mounts `.`), as rsync itself lists it with the
    file's excludes and filters: every tracked file of the packages the nodes import."""
    import shutil
    import subprocess

    if shutil.which("rsync") is None or shutil.which("git") is None:
        pytest.skip("rsync or git is not installed")
    config = yaml.safe_load((ROOT / name).read_text())
    assert config["file_mounts"]["~/sweeper"] == "."
    tracked = subprocess.run(["git", "ls-files", "sweeper", "actors"], cwd=ROOT, capture_output=True, text=True,
                             timeout=60)
    if tracked.returncode != 0 or not tracked.stdout.strip():
        pytest.skip("not a git checkout")
    # The arguments Ray's command runner gives rsync (SSHCommandRunner._create_rsync_filter_args).
    args = [a for pattern in config.get("rsync_exclude") or [] for a in ("--exclude", pattern)]
    args += [a for f in config.get("rsync_filter") or [] for a in ("--filter", f"dir-merge,- {f}")]
    listed = subprocess.run(["rsync", "-an", "--out-format=%n", *args, f"{ROOT}/", f"{tmp_path / 'node'}/"],
                            capture_output=True, text=True, timeout=120, check=True).stdout.splitlines()
    missing = sorted(set(tracked.stdout.splitlines()) - set(listed))
    assert not missing, f"{len(missing)} tracked files not synced, e.g. {missing[:5]}"


def test_ray_validation_rejects_node_types_in_an_onprem_cluster_yaml(onprem_config):
    """The check has teeth here too: node types copied over from cluster.yaml are refused (the
    local provider has one type of its own, its resources what Ray detects on each host)."""
    import click

    bad = copy.deepcopy(onprem_config)
    bad["available_node_types"] = {"gpu": {"resources": {"GPU": 1}, "node_config": {}}}
    with pytest.raises(click.ClickException, match="available_node_types is not supported"):
        _validate(bad)


# -- placement on a multi-node cluster ----------------------------------------------------

# The two sweeps on two 1-GPU nodes behind a GPU-less head: (sweep's head, min_duration_s, gated).
SPREAD_SWEEPS = {
    "spread": ("name: spread\nmodels: [tiny-llama, tiny-qwen2]\nprecisions: [fp32, bf16]\nbatch_sizes: [1, 2]\n",
               0.5, False),
    "long": ("name: long\nmodels: tiny-llama\nprecisions: fp32\nbatch_sizes: [1, 2, 3, 4, 5, 6, 7, 8]\nrepeats: 2\n",
             2.0, True),
}


@pytest.fixture(scope="module")
def spread_runs(tmp_path_factory) -> dict[str, tuple[dict, list[dict], dict[str, list[dict]]]]:
    """Both sweeps of SPREAD_SWEEPS, one after the other on one such cluster (its own process):
    per sweep, its summary, rows and rows per node, having checked that no node's GPU ran two
    trials at once. One cluster for both: its three nodes cost seconds of CPU to start.

    The noop backend sleeps its step times: what is under test is placement, and a real model
    here would only add its imports and its CPU-bound windows to the suite's time."""
    from sweeper.run.storage import ResultStore
    from tests.cluster_scenarios import run_scenarios

    runs = []
    for name, (sweep_head, min_duration_s, gated) in SPREAD_SWEEPS.items():
        d = tmp_path_factory.mktemp(name)
        sweep, gate = d / "sweep.yaml", d / "gate"
        sweep.write_text(sweep_head + "backends: noop\nworkload: {input_len: 8, output_len: 4}\n"
                         f"measure: {{warmup_iters: 0, min_iters: 1, min_duration_s: {min_duration_s}, idle_s: 0}}\n"
                         + (f'backend_options: {{noop: {{gate_file: "{gate}"}}}}\n' if gated else ""))
        runs.append((sweep, d / "out"))
    results = {}
    for name, (_, out), info in zip(SPREAD_SWEEPS, runs, run_scenarios("spread", runs, ROOT), strict=True):
        rows = ResultStore(str(out)).read_shards("trials").to_pylist()
        by_node: dict[str, list[dict]] = {}
        for row in rows:
            by_node.setdefault(row["ray_node_id"], []).append(row)
        for node_rows in by_node.values():  # one GPU per node: its trials never overlap in time
            spans = sorted((r["started_at"], r["finished_at"]) for r in node_rows)
            assert all(prev_end <= start for (_, prev_end), (start, _) in zip(spans, spans[1:], strict=False))
        results[name] = (info, rows, by_node)
    return results


@pytest.mark.slow
@pytest.mark.xdist_group("spread")  # one worker runs the module's cluster once for both tests
def test_groups_spread_over_nodes_and_never_share_a_gpu(spread_runs):
    """Four groups on two 1-GPU nodes (logical GPUs) behind a GPU-less head."""
    info, rows, by_node = spread_runs["spread"]
    assert (info["gpus"], info["nodes"], info["ok"], info["model_loads"]) == (2, 3, 8, 4)
    assert set(by_node) == set(info["workers"])  # both GPU nodes used, the head never
    # a group's trials stay on one actor, hence one node
    groups: dict[tuple, set] = {}
    for row in rows:
        groups.setdefault((row["model"], row["precision"]), set()).add(row["ray_node_id"])
    assert all(len(nodes) == 1 for nodes in groups.values())


def test_a_cluster_of_another_ray_or_python_is_one_line_with_the_fix():
    import json
    import platform

    import ray

    from sweeper.run.cluster import ClusterUnreachable, _check_versions

    py = platform.python_version()
    _check_versions("h:1", json.dumps({"ray_version": ray.__version__, "python_version": py}).encode())
    _check_versions("h:1", b"")  # nothing recorded: ray.init judges
    for other in ({"ray_version": "2.59.1", "python_version": py}, {"ray_version": ray.__version__,
                                                                    "python_version": "3.9.18"}):
        with pytest.raises(ClusterUnreachable) as exc:
            _check_versions("h:1", json.dumps(other).encode())
        text = str(exc.value)
        assert len(text.splitlines()) == 1
        assert text.startswith(f"--address h:1: the cluster runs Ray {other['ray_version']} on Python "
                               f"{other['python_version']}, this driver Ray {ray.__version__} on Python {py}")
        assert f'pip install "ray[default]=={other["ray_version"]}"' in text


def test_one_gcs_is_named_alike_by_loopback_and_this_machines_own_addresses():
    import socket

    from sweeper.run.cluster import same_gcs

    assert same_gcs("127.0.0.1:6379", "localhost:6379")
    assert same_gcs("127.0.0.1:6379", f"{socket.gethostname()}:6379")
    assert not same_gcs("127.0.0.1:6379", "127.0.0.1:6380")  # another port, another cluster
    assert not same_gcs("198.51.100.7:6379", "127.0.0.1:6379")  # another host (TEST-NET-2)


@pytest.mark.slow
def test_a_connected_driver_runs_there_and_refuses_an_address_of_another_cluster(ray_local):
    from sweeper.run.cluster import ClusterUnreachable, connect, connected_gcs

    gcs = connected_gcs()
    assert gcs and ray_local.nodes == 1
    joined = connect(None)  # a notebook's `ray.init()` done, no address: its cluster, not a new local one
    assert not joined.embedded and joined.nodes == ray_local.nodes and connected_gcs() == gcs
    assert not connect(gcs).embedded
    host, _, port = gcs.rpartition(":")
    other = f"{host}:{int(port) + 1}"
    with pytest.raises(ClusterUnreachable) as exc:
        connect(other)
    assert str(exc.value) == (f"--address {other}: this process's Ray driver is connected to another cluster "
                              f"(GCS {gcs}); leave --address out to run there, or ray.shutdown() first")
    assert connected_gcs() == gcs  # still connected where it was


@pytest.mark.slow
@pytest.mark.xdist_group("spread")
def test_a_long_group_splits_onto_the_idle_node_and_runs_every_trial_once(spread_runs):
    """One group of 16 two-second trials on two 1-GPU nodes: after its first trial the driver
    moves about half of the rest to a second copy of the model on the idle node, and each moved
    trial runs there. The group's trials wait at a gate from the split until the copy's first
    trial starts (tests/cluster_scenarios.py), so the copy is placed before the group can run
    out, however long its actor takes to start on a loaded machine. How many trials move, and
    whether a second split moves some on once one copy is done, rests on the machine's timing
    (the policy weighs the remaining trials against a load's measured cost); that every trial
    ran once, on the node its last split sent it to, does not."""
    info, rows, by_node = spread_runs["long"]
    assert (info["ok"], info["failed"]) == (16, 0) and info["group_splits"] == len(info["moved"]) >= 1
    assert info["gate"] == ["a copy's first trial"] * info["group_splits"]
    assert info["model_loads"] == 1 + info["group_splits"]
    assert len(rows) == len({r["trial_id"] for r in rows}) == 16
    assert set(by_node) == set(info["workers"])
    first = min(rows, key=lambda r: r["started_at"])
    assert first["trial_id"] not in info["moved_to"]  # the group kept the trial it was running
    # The first split's copy took the idle slot, the other node; each moved trial ran where sent.
    assert info["copy_nodes"][0] in info["workers"] and info["copy_nodes"][0] != first["ray_node_id"]
    moved = {r["trial_id"]: r["ray_node_id"] for r in rows if r["trial_id"] in info["moved_to"]}
    assert moved == info["moved_to"] and len(moved) >= info["moved"][0] >= 1
