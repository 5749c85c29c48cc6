"""A real Ray fleet on this machine: `ray start` nodes with token authentication on.

Each node is its own `ray start` (the head, and a worker started with `--block` in a
process session of its own, so that killing that session kills exactly that node's
Ray processes: a machine lost, as far as the cluster can tell). Every port is one the
OS just handed out, and the session directory is private, so parallel runs cannot meet.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from actors.backends.server.process import free_port
from tests.conftest import QUIET_NODE_ENV, ROOT

# One worker holds the module's fleets (pytest-xdist): each is several `ray start` nodes.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("fleet"),
              pytest.mark.skipif(shutil.which("ray") is None, reason="the ray command line is not installed")]

# Notice a killed node in about a second, not Ray's default of ~30 s.
FAST_HEALTH_CHECK = '{"health_check_initial_delay_ms": 0, "health_check_period_ms": 200, "health_check_failure_threshold": 5}'


def _node_ports() -> list[str]:
    """Every port a node listens on, chosen by the OS now and kept from other binds until the
    node binds it (Ray's defaults are fixed numbers)."""
    names = ("--node-manager-port", "--object-manager-port", "--dashboard-agent-listen-port",
             "--dashboard-agent-grpc-port", "--metrics-export-port", "--runtime-env-agent-port")
    return [f"{name}={free_port()}" for name in names]


class Fleet:
    """A head and worker nodes of `ray start`, sharing one token; stopped on close."""

    def __init__(self, token: str, gpus: tuple[int, ...] = ()) -> None:
        """``gpus``: logical GPUs per node, head first (Ray schedules on them as on real ones;
        no NVML behind them); none: CPU-only nodes."""
        self.token = token
        self.gpus = list(gpus)
        # Short: Ray's Unix sockets live under it, and their paths are limited to 107 bytes.
        self.temp_dir = tempfile.mkdtemp(prefix="swr", dir="/tmp")
        self.home = Path(self.temp_dir) / "home"  # no ~/.ray/auth_token of the machine's user
        self.home.mkdir()
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.nodes: list[subprocess.Popen] = []
        # No autoscaler monitor: a fixed fleet has nothing to scale (the flag is hidden in
        # `ray start --help`, there all the same).
        self.head = self._start(["--head", f"--port={self.port}", "--include-dashboard=false", "--no-monitor",
                                 f"--ray-client-server-port={free_port()}", f"--temp-dir={self.temp_dir}",
                                 f"--system-config={FAST_HEALTH_CHECK}"])
        self.wait_for_nodes(1)

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
        return {**env, "HOME": str(self.home), "RAY_USAGE_STATS_ENABLED": "0", **extra}

    def _start(self, args: list[str]) -> subprocess.Popen:
        """A node as a `ray start --block` in its own process session: stopping it stops its
        processes alone (never `ray stop`, which stops every Ray on the machine)."""
        gpus = self.gpus[len(self.nodes)] if len(self.nodes) < len(self.gpus) else 0
        # No log monitor (sweeper's drivers take no worker logs) and the quiet agents of
        # tests.conftest.QUIET_NODE_ENV: nothing here reads them, and each costs every node
        # seconds of CPU over the module's life.
        # A CPU slot per GPU: every group's actor asks for one CPU beside its GPUs.
        proc = subprocess.Popen(
            ["ray", "start", "--block", f"--num-cpus={max(gpus, 1)}", f"--num-gpus={gpus}", *_node_ports(),
             "--include-log-monitor=false", *args],
            env=self.env(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=self.token, **QUIET_NODE_ENV), start_new_session=True,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.nodes.append(proc)
        return proc

    def add_worker(self) -> subprocess.Popen:
        return self._start([f"--address={self.address}"])

    # One driver watches the node count until it is the one waited for (or its time is up) and
    # prints it: a driver started per look cost about a CPU-second each.
    _WAIT = ("import ray, sys, time\n"
             "ray.init(address=sys.argv[1], logging_level=40)\n"
             "n, deadline = int(sys.argv[2]), time.monotonic() + float(sys.argv[3])\n"
             "def alive(): return sum(1 for x in ray.nodes() if x['Alive'])\n"
             "while alive() != n and time.monotonic() < deadline: time.sleep(0.5)\n"
             "print(alive())")

    def wait_for_nodes(self, n: int, timeout_s: float = 90.0) -> None:
        deadline = time.monotonic() + timeout_s
        while (left_s := deadline - time.monotonic()) > 0:
            r = subprocess.run([sys.executable, "-c", self._WAIT, self.address, str(n), f"{left_s:.1f}"],
                               capture_output=True, text=True, timeout=left_s + 60,
                               env=self.env(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=self.token))
            if r.returncode == 0 and r.stdout.strip().splitlines()[-1:] == [str(n)]:
                return
            time.sleep(1.0)  # the head not up yet: its driver could not join
        pytest.fail(f"{n} nodes did not join within {timeout_s} s")

    @staticmethod
    def kill(node: subprocess.Popen) -> None:
        """SIGKILL a node's processes, all at once: `ray start`, its raylet (and GCS), the trial
        actors' worker processes the raylet started, its agents (by PID: ours alone)."""
        import psutil

        tree = psutil.Process(node.pid).children(recursive=True)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(node.pid, signal.SIGKILL)
        for p in tree:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        node.wait(timeout=30)

    def close(self) -> None:
        for node in reversed(self.nodes):  # workers first, then the head
            if node.poll() is None:
                self.kill(node)
        shutil.rmtree(self.temp_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def fleet():
    f = Fleet(secrets.token_hex(32))
    try:
        yield f
    finally:
        f.close()


def sweeper(fleet: Fleet, *args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sweeper", *args], cwd=ROOT, capture_output=True, text=True,
                          env={**(env or fleet.env()), "COLUMNS": "200"}, timeout=timeout)


def _start_sweep(fleet: Fleet, sweep: Path, out: Path) -> tuple[subprocess.Popen, list[str], threading.Thread]:
    """`sweeper run --address` of the fleet, in the background: its process, the lines it has
    printed so far (filled as it prints), and the thread that reads them."""
    proc = subprocess.Popen([sys.executable, "-m", "sweeper", "run", str(sweep), "--address", fleet.address,
                             "-o", str(out), "-q"], cwd=ROOT, env={**fleet.env(RAY_AUTH_TOKEN=fleet.token),
                                                                "COLUMNS": "200"},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)  # type: ignore[arg-type]
    reader.start()
    return proc, lines, reader


def _wait_for_placed(proc: subprocess.Popen, lines: list[str], placed: re.Pattern[str], n: int,
                     bound_s: float = 180.0) -> None:
    """Until ``n`` of the sweep's lines match ``placed`` (its groups are placed); fails if the
    sweep ends first or ``bound_s`` passes."""
    deadline = time.monotonic() + bound_s
    while sum(bool(placed.match(line.rstrip())) for line in list(lines)) < n:
        assert proc.poll() is None, "".join(lines)
        assert time.monotonic() < deadline, "".join(lines)
        time.sleep(0.2)


def _recovered(proc: subprocess.Popen, lines: list[str], out: Path, n: int) -> tuple[str, list[dict]]:
    """The checks after a node was lost under a gated sweep: it ended well, the lost trial was
    retried, all ``n`` trials are there once and ok, and every row is the head's (the lost
    node's trials were held at the gate, so it finished none). Returns the output and rows."""
    text = "".join(lines)
    assert proc.returncode == 0, text[-3000:]
    assert re.search(r"retry 1/2: .*actor died", text), text[-3000:]
    trials = pq.read_table(out / "trials.parquet").to_pylist()
    assert len(trials) == n and len({t["trial_id"] for t in trials}) == n
    assert {t["status"] for t in trials} == {"ok"}
    assert len({t["ray_node_id"] for t in trials}) == 1
    return text, trials


SWEEP = """
name: fleet
models: [tiny-llama, tiny-qwen2]
backends: noop
precisions: fp32
batch_sizes: [1, 2]
workload: {{input_len: 8, output_len: 4}}
backend_options: {{noop: {{step_s: 0.01, gate_file: {gate}}}}}
measure: {{warmup_iters: 0, min_iters: 1, min_duration_s: 0, idle_s: 0}}
"""


def test_a_missing_or_wrong_token_is_one_line_and_the_right_one_is_enough(fleet, tmp_path):
    sweep = tmp_path / "s.yaml"
    sweep.write_text(SWEEP.format(gate=tmp_path / "open"))
    for env, expected in ((fleet.env(), "the cluster requires a token (Ray token authentication) and this "
                                        "driver has none: set RAY_AUTH_TOKEN"),
                          (fleet.env(RAY_AUTH_TOKEN="0" * 64), "the cluster refused this driver's token (from "
                                                               "RAY_AUTH_TOKEN)")):
        r = sweeper(fleet, "plan", str(sweep), "--address", fleet.address, env=env, timeout=60)
        assert r.returncode == 2, r.stderr
        assert r.stderr.strip() == f"error: --address {fleet.address}: {expected}" + r.stderr.strip().split(expected)[1]
        assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
        assert "InvalidAuthToken" not in r.stderr  # no storm of Ray's own retries
    # The token alone (RAY_AUTH_MODE unset): the driver switches token mode on itself.
    ok = sweeper(fleet, "plan", str(sweep), "--address", fleet.address, env=fleet.env(RAY_AUTH_TOKEN=fleet.token))
    assert ok.returncode == 0, ok.stderr
    assert "installed libraries checked in: cluster" in ok.stdout


def test_a_node_lost_mid_sweep_has_its_trial_retried_on_the_other(fleet, tmp_path):
    worker = fleet.add_worker()
    fleet.wait_for_nodes(2)
    gate = tmp_path / "open"
    sweep = tmp_path / "s.yaml"
    sweep.write_text(SWEEP.format(gate=gate))
    out = tmp_path / "out"
    proc, lines, reader = _start_sweep(fleet, sweep, out)
    try:
        # Both groups placed, one per node, each held at the gate inside its first trial.
        _wait_for_placed(proc, lines, re.compile(r"^placed "), 2)
        nodes = {re.search(r" on (\S+) CPU", line).group(1) for line in list(lines) if line.startswith("placed ")}
        assert len(nodes) == 2, lines  # one group on each node
        time.sleep(1.0)  # the first trials are submitted behind the loads
        fleet.kill(worker)
        gate.touch()
        proc.wait(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
        reader.join(timeout=10)
    _recovered(proc, lines, out, 4)


def test_a_node_lost_with_a_launched_server_leaves_no_server_behind(fleet, tmp_path):
    """Two groups, each launching a server (the fault server, with a child process), one per
    node. The worker node is killed as a machine loss looks to its processes: every process
    of Ray's on it at once (its session), nothing else; the server there, in a process group
    and session of its own, must then go too (its watchdog sees its actor die), while the
    other node's server goes on; at the end no server of the sweep is left."""
    import psutil

    from tests.actors.backends.test_server_backend import alive, read_pids, wait_gone
    from tests.fault_server import FAULT_SERVER

    worker = fleet.add_worker()
    fleet.wait_for_nodes(2)
    pid_files = [tmp_path / "pids-a", tmp_path / "pids-b"]
    variants = "\n".join(
        f'    - {{launch: {{command: [python, "{FAULT_SERVER}", --port, "{{port}}", --pid-file, "{f}", --child, '
        f'--token-s, "0.3", --model, "{name}"], dialect: vllm}}}}' for name, f in zip("ab", pid_files, strict=True))
    sweep = tmp_path / "s.yaml"
    sweep.write_text(f"""
name: fleet-server
models: [tiny-llama]
backends: server
backend_options:
  server:
{variants}
precisions: fp32
workload: {{mode: serving, input_len: 8, output_len: 4, request_rate: 2, num_prompts: 60, seed: 0}}
measure: {{warmup_iters: 1, idle_s: 0, min_window_s: 0.2}}
""")
    out = tmp_path / "out"
    proc, lines, reader = _start_sweep(fleet, sweep, out)
    seen: list[int] = []
    try:
        first = [read_pids(f, 2, bound_s=180.0) for f in pid_files]  # both servers up, one per node
        seen = [p for pids in first for p in pids]
        session = os.getsid(worker.pid)
        on_worker = [p for p in psutil.Process(worker.pid).children(recursive=True) if _sid(p.pid) == session]
        assert on_worker, "the worker node runs no process"
        with contextlib.suppress(ProcessLookupError):
            os.killpg(worker.pid, signal.SIGKILL)
        for p in on_worker:  # Ray's processes on the lost node, and only those
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        worker.wait(timeout=30)
        # One server goes within seconds of its node (its run had about 30 s left); the other runs on.
        deadline = time.monotonic() + 20.0
        while not any(not any(alive(p) for p in pids) for pids in first):
            assert time.monotonic() < deadline, f"no server went with the lost node: {first}"
            time.sleep(0.1)
        states = [[alive(p) for p in pids] for pids in first]
        assert sorted(states) == [[False, False], [True, True]], f"{first}: {states}"
        proc.wait(timeout=400)
        seen = sorted({p for f in pid_files for p in read_pids(f, 2)})
    finally:
        if proc.poll() is None:
            proc.kill()
        reader.join(timeout=10)
    text = "".join(lines)
    assert proc.returncode == 0, text[-3000:]
    assert wait_gone(seen, bound_s=30.0) == [], [p for p in seen if alive(p)]
    trials = pq.read_table(out / "trials.parquet").to_pylist()
    assert {t["status"] for t in trials} == {"ok"} and len(trials) == 2


def _sid(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except OSError:
        return None


@pytest.fixture(scope="module")
def gpu_fleet():
    """A head and a worker of two logical GPUs each, as `ray start --num-gpus` declares them."""
    f = Fleet(secrets.token_hex(32), gpus=(2, 2))
    try:
        yield f
    finally:
        f.close()


def test_tensor_parallel_groups_hold_one_nodes_gpus_alone_and_survive_a_lost_node(gpu_fleet, tmp_path):
    """Three TP2 groups on two nodes of two GPUs: each placed group holds both GPUs of one
    node, the third waits for a node's two (and says so), and the worker node, killed while
    its TP2 group is held inside its first trial, costs a retry on the head: nothing lost,
    nothing doubled."""
    fleet = gpu_fleet
    worker = fleet.add_worker()
    fleet.wait_for_nodes(2)
    gate = tmp_path / "open"
    sweep = tmp_path / "s.yaml"
    sweep.write_text(SWEEP.format(gate=gate).replace("[tiny-llama, tiny-qwen2]", "[tiny-llama, tiny-qwen2, tiny-mistral]")
                     .replace("precisions: fp32", "precisions: fp32\ntensor_parallel: 2"))
    out = tmp_path / "out"
    proc, lines, reader = _start_sweep(fleet, sweep, out)
    placed_re = re.compile(r"^placed  (.+) on (\S+) GPU (\S+)$")
    try:
        _wait_for_placed(proc, lines, placed_re, 2)
        time.sleep(1.0)  # the first trials are submitted behind the loads; nothing else is placed
        first = [m.groups() for line in list(lines) if (m := placed_re.match(line.rstrip()))]
        assert len(first) == 2 and len({node for _, node, _ in first}) == 2, first  # one group a node
        assert all(sorted(gpus.split(",")) == ["0", "1"] for _, _, gpus in first), first  # both of its GPUs
        waiting = [line.rstrip() for line in list(lines) if line.startswith("waiting ")]
        assert len(waiting) == 3 and all(w.endswith(" for 2 free GPU(s) on one node") for w in waiting), waiting
        fleet.kill(worker)
        gate.touch()
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
        reader.join(timeout=10)
    text, trials = _recovered(proc, lines, out, 6)
    assert all(sorted(t["ray_gpu_ids"].split(",")) == ["0", "1"] for t in trials), trials
    # The closing table counts each GPU on its own: the head's two ran all six trials, the lost
    # node's two held the one attempt that died with it.
    rows = re.findall(r"│ (\S+)\s+│ GPU (\d) +│ +(\d+) │", text)
    by_node: dict[str, list[tuple[str, int]]] = {}
    for node, gpu, n in rows:
        by_node.setdefault(node, []).append((gpu, int(n)))
    assert sorted(by_node.values()) == [[("0", 1), ("1", 1)], [("0", 6), ("1", 6)]], text[-3000:]
