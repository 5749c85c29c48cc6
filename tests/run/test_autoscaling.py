"""A cluster that autoscales from zero GPU nodes, for real: Ray's fake multi-node provider.

The head is started as Ray documents it for that provider (``RAY_FAKE_CLUSTER=1 ray start
--head --autoscaling-config=FILE``), with no CPU and no GPU, as cluster.yaml's; its autoscaler
launches each node it decides on as a real raylet on this machine with the node type's
resources (logical GPUs, so the noop backend stands in for a model). Nothing is up but the
head when the sweep starts: its groups must ask Ray for GPUs for any GPU node to be launched.

The config is written whole: the provider's defaults file (``fake_multi_node/example.yaml``)
is not in Ray's wheel, and the autoscaler reads the file as it is.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from actors.backends.server.process import free_port
from tests.conftest import QUIET_NODE_ENV, ROOT

# With the fleets of test_fleet.py, on one worker (pytest-xdist): each is several raylets.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("fleet"),
              pytest.mark.skipif(shutil.which("ray") is None, reason="the ray command line is not installed")]

# Idle nodes go back this soon after the sweep (Ray's idle_timeout_minutes); long enough that a
# node is not given back between one group's end and the next group's placement.
IDLE_TIMEOUT_MIN = 0.2
NODE_TYPES = {
    "gpu-1": {"resources": {"CPU": 1, "GPU": 1}, "node_config": {}, "min_workers": 0, "max_workers": 2},
    "gpu-2": {"resources": {"CPU": 1, "GPU": 2}, "node_config": {}, "min_workers": 0, "max_workers": 1},
}


class AutoscalingCluster:
    """A head of the fake multi-node provider, with token authentication on; stopped on close.

    The head is a `ray start --block` in a process session of its own, and the nodes its
    autoscaler launches are processes of that autoscaler's: ending that session ends them all
    (never `ray stop`, which stops every Ray on the machine)."""

    def __init__(self) -> None:
        from ray._private.services import get_node_ip_address

        self.token = secrets.token_hex(32)
        # Short: Ray's Unix sockets live under it, and their paths are limited to 107 bytes.
        self.temp_dir = tempfile.mkdtemp(prefix="swa", dir="/tmp")
        self.home = Path(self.temp_dir) / "home"  # no ~/.ray/auth_token of the machine's user
        self.home.mkdir()
        self.port = free_port()
        # The provider starts its nodes against this address (its default is port 6379).
        self.address = f"{get_node_ip_address()}:{self.port}"
        self.config = Path(self.temp_dir) / "autoscaling.yaml"
        self.config.write_text(yaml.safe_dump({
            "cluster_name": "sweeper-test", "max_workers": 3, "upscaling_speed": 1.0,
            "idle_timeout_minutes": IDLE_TIMEOUT_MIN,
            "provider": {"type": "fake_multinode", "gcs_address": self.address, "use_node_id_as_ip": True,
                         "disable_node_updaters": True, "disable_launch_config_check": True},
            "auth": {}, "docker": {}, "head_node_type": "ray.head.default",  # the provider's name for its head
            "available_node_types": {"ray.head.default": {"resources": {"CPU": 0}, "node_config": {}, "max_workers": 0},
                                     **NODE_TYPES},
            "initialization_commands": [], "setup_commands": [], "head_setup_commands": [],
            "worker_setup_commands": [], "head_start_ray_commands": [], "worker_start_ray_commands": [],
            "file_mounts": {}, "cluster_synced_files": [], "file_mounts_sync_continuously": False,
            "rsync_exclude": [], "rsync_filter": []}))
        log = Path(self.temp_dir) / "head.log"
        ports = [f"{name}={free_port()}" for name in (
            "--ray-client-server-port", "--node-manager-port", "--object-manager-port",
            "--dashboard-agent-listen-port", "--dashboard-agent-grpc-port", "--metrics-export-port",
            "--runtime-env-agent-port")]
        with log.open("w") as out:
            self.head = subprocess.Popen(
                ["ray", "start", "--head", "--block", f"--port={self.port}", f"--autoscaling-config={self.config}",
                 "--num-cpus=0", "--num-gpus=0", "--include-dashboard=false", "--include-log-monitor=false",
                 f"--temp-dir={self.temp_dir}", *ports],
                # An autoscaler update a second (Ray's tests' setting; 5 s by default).
                env=self.env(RAY_FAKE_CLUSTER="1", AUTOSCALER_UPDATE_INTERVAL_S="1", RAY_AUTH_MODE="token",
                             RAY_AUTH_TOKEN=self.token, **QUIET_NODE_ENV),
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 120
        while "Ray runtime started" not in log.read_text():
            if self.head.poll() is not None or time.monotonic() > deadline:
                self.close()
                pytest.fail(f"the autoscaling head did not start: {log.read_text()[-2000:]}")
            time.sleep(0.2)

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
        return {**env, "HOME": str(self.home), "RAY_USAGE_STATS_ENABLED": "0", "COLUMNS": "200", **extra}

    def sweeper(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "sweeper", *args, "--address", self.address], cwd=ROOT,
                              capture_output=True, text=True, env=self.env(RAY_AUTH_TOKEN=self.token),
                              timeout=timeout)

    # One driver watches the alive nodes until they are the ones waited for (or its time is up).
    _WAIT = ("import ray, sys, time\n"
             "ray.init(address=sys.argv[1], logging_level=40)\n"
             "n, deadline = int(sys.argv[2]), time.monotonic() + float(sys.argv[3])\n"
             "def alive(): return sum(1 for x in ray.nodes() if x['Alive'])\n"
             "while alive() != n and time.monotonic() < deadline: time.sleep(0.5)\n"
             "print(alive())")

    def wait_for_nodes(self, n: int, timeout_s: float) -> float:
        """Seconds until exactly ``n`` nodes are alive; fails past ``timeout_s``."""
        t0 = time.monotonic()
        r = subprocess.run([sys.executable, "-c", self._WAIT, self.address, str(n), str(timeout_s)],
                           capture_output=True, text=True, timeout=timeout_s + 60,
                           env=self.env(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=self.token))
        assert r.stdout.strip().splitlines()[-1:] == [str(n)], (r.stdout, r.stderr[-2000:])
        return time.monotonic() - t0

    def close(self) -> None:
        import psutil

        with contextlib.suppress(psutil.NoSuchProcess):
            tree = psutil.Process(self.head.pid).children(recursive=True)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.head.pid, signal.SIGKILL)
            for p in tree:  # any that left the session
                with contextlib.suppress(psutil.NoSuchProcess):
                    p.kill()
        self.head.wait(timeout=30)
        shutil.rmtree(self.temp_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def autoscaling():
    cluster = AutoscalingCluster()
    try:
        yield cluster
    finally:
        cluster.close()


SWEEP = """
name: autoscale
models: [tiny-llama, tiny-qwen2]
backends: noop
precisions: fp32
tensor_parallel: {tp}
batch_sizes: [1, 2]
workload: {{input_len: 8, output_len: 4}}
backend_options: {{noop: {{step_s: 0.01}}}}
measure: {{warmup_iters: 0, min_iters: 1, min_duration_s: 0, idle_s: 0}}
"""


def test_a_sweep_from_zero_gpu_nodes_has_the_autoscaler_launch_them_and_runs_on_their_gpus(autoscaling, tmp_path):
    """Nothing up but a head without CPUs or GPUs. The plan takes the GPUs of the node types
    the autoscaler may launch: a trial wider than all of them is refused, naming the widest;
    the sweep's groups ask Ray for their GPUs (one, or two for tensor_parallel 2), the
    autoscaler launches GPU nodes for them (a two-GPU node for the TP2 groups: no other type
    fits), every trial runs on its GPUs, and once the sweep is over the idle nodes go."""
    too_wide = tmp_path / "tp3.yaml"
    too_wide.write_text(SWEEP.format(tp=3))
    r = autoscaling.sweeper("plan", str(too_wide))
    assert r.returncode == 2, r.stdout + r.stderr
    assert (f"tensor_parallel: 3 GPUs per trial on one node, but the widest node type its autoscaler launches "
            f"(gpu-2, from the autoscaler's config {autoscaling.config}) has 2") in r.stderr, r.stderr

    sweep = tmp_path / "s.yaml"
    sweep.write_text(SWEEP.format(tp="[1, 2]"))
    out = tmp_path / "out"
    t0 = time.monotonic()
    r = autoscaling.sweeper("run", str(sweep), "-o", str(out), "-q", timeout=300)
    run_s = time.monotonic() - t0
    text = r.stdout + r.stderr
    assert r.returncode == 0, text[-3000:]
    assert (f"on 1 node(s) with 0 GPU(s), 0 CPU(s); GPU nodes launched on demand: gpu-1 (1 GPU, 1 CPU(s), up to 2), "
            f"gpu-2 (2 GPUs, 1 CPU(s), up to 1) (from the autoscaler's config {autoscaling.config}); waiting for the "
            f"nodes the autoscaler launches for the groups") in text, text[-3000:]
    trials = pq.read_table(out / "trials.parquet").to_pylist()
    assert len(trials) == 8 and {t["status"] for t in trials} == {"ok"}, trials
    for t in trials:  # each on as many GPUs as it asked for (the head has none)
        assert t["ray_gpu_ids"] is not None and len(t["ray_gpu_ids"].split(",")) == t["tensor_parallel"], t
    # The two-GPU trials ran on a node with two GPUs: the gpu-2 type, launched for them.
    assert {t["ray_gpu_ids"] for t in trials if t["tensor_parallel"] == 2} == {"0,1"}
    gone_s = autoscaling.wait_for_nodes(1, timeout_s=IDLE_TIMEOUT_MIN * 60 + 90)
    print(f"\nsweep {run_s:.1f} s; idle nodes gone {gone_s:.1f} s after it")
