"""`ray up` for real, over SSH: docs/cluster-onprem.yaml brings up a lab of three hosts here.

The lab is a head and two workers, each a Linux network namespace on a bridge, with its own
address on a private /24 and an sshd of its own. This process is the user's laptop: it reaches
every host through the bridge, as a machine on the lab's network would, and drives them with
Ray's cluster launcher as a user does: `ray up` (the checkout synced, the setup commands run,
Ray started with token authentication on every host, the workers by the head's autoscaler over
SSH in turn), `ray exec` (the sweep runs on the head), `ray rsync-down` (the results come home),
`ray down`.

The hosts share this machine's filesystem: its Python, Ray and sweeper stand for the same
Python and Ray the launcher needs on every host. What a host must have of its own, it has: each
sshd runs in mount, UTS and PID namespaces of its own (`unshare`), with
- a directory of the test bound over /tmp, for what a host keeps to itself: Ray's /tmp/ray (its
  session, the address file `--address auto` reads, the launcher's state file), the ssh
  sockets of the head's autoscaler, the sshd's own files, and the user's home, /tmp/home. A
  copy of /etc/passwd bound over the host's says so: sshd, and ssh's `~` in the key path of the
  head's autoscaler, take the home from there (this machine's home, where its Python may live,
  stays in place);
- its own process table: the `ray stop` of the start commands and of `ray down`, which stops
  every Ray process it can see, stops that host's alone, never this machine's other Rays;
- its own host name, which sweeper prints where it places a group, and an /etc/hosts that
  names every host of the lab.
"""

from __future__ import annotations

import contextlib
import getpass
import hashlib
import importlib.util
import ipaddress
import json
import os
import pwd
import random
import re
import secrets
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from tests.conftest import QUIET_NODE_ENV, ROOT

ONPREM = ROOT / "docs" / "cluster-onprem.yaml"
# The ray command next to this interpreter: a pyenv shim on PATH would look for pyenv in the
# test's HOME.
RAY = Path(sys.executable).with_name("ray")
_RAY_SPEC = importlib.util.find_spec("ray")
# Ray's programs and scripts: under its package's directory.
RAY_PACKAGE = f"{Path(_RAY_SPEC.origin).parent}/" if _RAY_SPEC is not None and _RAY_SPEC.origin else None
SSHD = shutil.which("sshd", path=f"/usr/sbin:/usr/local/sbin:{os.environ.get('PATH', '')}")
HOST_NAMES = ("head", "worker-1", "worker-2")


# Its own step of .ci/run (about 2.5 minutes, most of it Ray's wind-down after `ray down`),
# beside the README's test command rather than inside its 10-minute budget.
OWN_STEP = "SWEEPER_TEST_RAY_UP"


def _unavailable() -> str | None:
    """Why this machine cannot build the lab, or None."""
    if os.environ.get(OWN_STEP) != "1":
        return f"runs in its own step of .ci/run: set {OWN_STEP}=1 to run it here"
    if sys.platform != "linux" or os.geteuid() != 0:
        return "needs root on Linux: network namespaces, bind mounts and an sshd per host"
    for tool in ("ip", "unshare", "ssh", "ssh-keygen", "rsync"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed"
    if SSHD is None:
        return "sshd is not installed (Debian: apt-get install openssh-server)"
    if RAY_PACKAGE is None or not RAY.exists():
        return f"the ray command line is not installed next to {sys.executable}"
    return None


# With the fleets of test_fleet.py and test_autoscaling.py, on one worker (pytest-xdist): each
# is several raylets on a 2-core machine.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("fleet"),
              pytest.mark.skipif(_unavailable() is not None, reason=str(_unavailable()))]


def _sh(*args: str, timeout_s: float = 30) -> str:
    r = subprocess.run(args, capture_output=True, text=True, timeout=timeout_s)
    if r.returncode != 0:
        raise RuntimeError(f"{shlex.join(args)}: exit {r.returncode}: {r.stderr.strip()}")
    return r.stdout


def _free_subnet() -> ipaddress.IPv4Network:
    """A /24 of 10.0.0.0/8 that no address or route of this machine overlaps (random: two runs
    side by side pick two)."""
    taken = []
    for line in _sh("ip", "-4", "-o", "addr", "show").splitlines() + _sh("ip", "-4", "route", "show").splitlines():
        for token in line.split():
            with contextlib.suppress(ValueError):
                if "/" in token or token[:1].isdigit():
                    taken.append(ipaddress.ip_network(token, strict=False))
    for _ in range(100):
        net = ipaddress.ip_network(f"10.{random.randint(64, 254)}.{random.randint(0, 255)}.0/24")
        if not any(net.overlaps(t) for t in taken):
            return net
    raise RuntimeError(f"no free /24 in 10.0.0.0/8 beside {taken}")


def _ignored_by_git() -> list[str]:
    """Rsync excludes for what git ignores at the top of this checkout (.gitignore, and also
    .git/info/exclude, which the file's own `rsync_filter` does not read): build outputs and
    caches of this machine, hundreds of MB that a fresh clone has none of."""
    r = subprocess.run(["git", "ls-files", "--others", "--ignored", "--exclude-standard", "--directory"],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    if r.returncode != 0:  # not a git checkout (an unpacked archive): nothing is ignored
        return []
    return sorted("/" + line.rstrip("/") for line in r.stdout.splitlines() if line.strip() and "/" not in line.rstrip("/"))


@dataclass
class Host:
    name: str
    ns: str  # its network namespace
    ip: str
    root: Path  # bound over its /tmp
    sshd: subprocess.Popen | None = None

    @property
    def home(self) -> Path:
        return self.root / "home"

    def pids(self) -> list[int]:
        return [int(p) for p in _sh("ip", "netns", "pids", self.ns).split()]

    def ray_processes(self) -> list[str]:
        """The command lines of the Ray processes running on this host: Ray's programs and
        scripts, the `ray` command, and the processes Ray titles `ray::...` (its workers, agents)."""
        found = []
        for pid in self.pids():
            with contextlib.suppress(OSError):  # gone meanwhile
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
                if argv[0].startswith("ray::") or any(a.startswith(str(RAY_PACKAGE)) or Path(a).name == "ray"
                                                      for a in argv[:2]):
                    found.append(" ".join(argv).strip())
        return found


class Lab:
    """Three hosts on a bridge, each with its sshd, and a laptop's home; removed on close."""

    SSHD_CONFIG = """\
# The lab's sshd: keys only, on the host's own address; every file in the host's /tmp.
Port 22
ListenAddress {ip}
HostKey /tmp/sshd/host_ed25519_key
PidFile /tmp/sshd/sshd.pid
AuthorizedKeysFile /tmp/sshd/authorized_keys
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
PermitRootLogin prohibit-password
LogLevel ERROR
"""

    def __init__(self) -> None:
        suffix = secrets.token_hex(3)  # interface names are at most 15 characters
        addresses = [str(a) for a in _free_subnet().hosts()]
        self.dir = Path(tempfile.mkdtemp(prefix=f"swl{suffix}", dir="/tmp"))  # made last: close removes it
        self.laptop = self.dir / "laptop"  # the laptop's home: its key, its token, its results
        self.cluster_name = f"sweeper-lab-{suffix}"
        self.bridge = f"swb{suffix}"
        self.gateway = addresses[0]  # the laptop's address on the lab's network
        self.hosts = [Host(name, f"swn{suffix}{i}", addresses[1 + i], self.dir / name)
                      for i, name in enumerate(HOST_NAMES)]
        self.token = secrets.token_hex(32)
        self.user = pwd.getpwuid(os.getuid()).pw_name  # the ssh user on every host
        self.key = self.laptop / ".ssh" / "id_ed25519"
        # Where `ray up` keeps its ssh connections (command_runner.SSHCommandRunner): /tmp of
        # the laptop, per user and cluster name.
        user_hash = hashlib.sha256(getpass.getuser().encode()).hexdigest()[:10]
        self.control_dir = Path(f"/tmp/ray_ssh_{user_hash}") / hashlib.sha256(self.cluster_name.encode()).hexdigest()[:10]
        self._made: list[list[str]] = []  # what to delete on close, in reverse

    @property
    def head(self) -> Host:
        return self.hosts[0]

    @property
    def workers(self) -> list[Host]:
        return self.hosts[1:]

    def start(self) -> None:
        (self.laptop / ".ray").mkdir(parents=True)
        (self.laptop / ".ray" / "auth_token").write_text(self.token)
        self.key.parent.mkdir(mode=0o700)
        _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "sweeper-lab", "-f", str(self.key))
        self._privileged("unshare", "--mount", "--uts", "--pid", "--fork", "--mount-proc", "true")
        self._privileged("ip", "link", "add", self.bridge, "type", "bridge")
        self._made.append(["ip", "link", "del", self.bridge])
        _sh("ip", "addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        _sh("ip", "link", "set", self.bridge, "up")
        for i, host in enumerate(self.hosts):
            self._network(host, i)
            self._files(host)
            self._start_sshd(host)
        for host in self.hosts:
            self._wait_for_sshd(host)
        # The head starts the workers over SSH: it must reach them across the bridge (a host
        # whose bridged traffic goes through a firewall dropping forwarded packets would not).
        for worker in self.workers:
            r = subprocess.run(["ip", "netns", "exec", self.head.ns, "bash", "-c", f"exec 3<>/dev/tcp/{worker.ip}/22"],
                               capture_output=True, text=True, timeout=30)
            assert r.returncode == 0, f"the head does not reach {worker.name}'s sshd across the bridge: {r.stderr}"

    @staticmethod
    def _privileged(*cmd: str) -> None:
        """A command root may still lack the capabilities for (in a container): a skip that
        says so."""
        try:
            _sh(*cmd)
        except RuntimeError as exc:
            pytest.skip(f"cannot build the lab's hosts here: {exc}")

    def _network(self, host: Host, i: int) -> None:
        self._privileged("ip", "netns", "add", host.ns)
        self._made.append(["ip", "netns", "del", host.ns])
        outside, inside = f"{self.bridge[:9]}v{i}", f"{self.bridge[:9]}p{i}"
        _sh("ip", "link", "add", outside, "type", "veth", "peer", "name", inside, "netns", host.ns)
        self._made.append(["ip", "link", "del", outside])
        _sh("ip", "link", "set", outside, "master", self.bridge, "up")
        for args in (["addr", "add", f"{host.ip}/24", "dev", inside], ["link", "set", inside, "up"],
                     ["link", "set", "lo", "up"],
                     # Ray takes the address of the default route for its node's: this one.
                     ["route", "add", "default", "via", self.gateway]):
            _sh("ip", "-n", host.ns, *args)

    def _files(self, host: Host) -> None:
        (host.root / "sshd").mkdir(parents=True)
        host.root.chmod(0o755)  # its /tmp: sshd refuses keys under a directory others may write
        host.home.mkdir(mode=0o700)
        _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(host.root / "sshd" / "host_ed25519_key"))
        (host.root / "sshd" / "authorized_keys").write_text(self.key.with_suffix(".pub").read_text())
        (host.root / "sshd" / "sshd_config").write_text(self.SSHD_CONFIG.format(ip=host.ip))
        # The host's user database: this machine's, but the user's home is in the host's /tmp.
        lines = []
        for line in Path("/etc/passwd").read_text().splitlines():
            fields = line.split(":")
            if len(fields) == 7 and fields[0] == self.user:
                fields[5] = "/tmp/home"
            lines.append(":".join(fields) + "\n")
        (host.root / "passwd").write_text("".join(lines))
        # Its names, as a lab's hosts know each other's: this machine's resolver cannot be
        # reached from the lab's network, and every name it is asked for would cost its timeout.
        (host.root / "hosts").write_text("127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n"
                                         + "".join(f"{h.ip} {h.name}\n" for h in self.hosts))
        # What the host's user has before `ray up`: its Python on PATH (sshd's default PATH
        # knows no pyenv or virtual environment), and the quiet Ray nodes of the tests
        # (tests.conftest.QUIET_NODE_ENV: three nodes share 2 cores here).
        quiet = " ".join(f"{k}={v}" for k, v in QUIET_NODE_ENV.items())
        (host.home / ".bashrc").write_text(f"export PATH={shlex.quote(str(RAY.parent))}:$PATH\n"
                                           f"export RAY_USAGE_STATS_ENABLED=0 {quiet}\n")

    def _start_sshd(self, host: Host) -> None:
        # sshd is the first process of the host's PID namespace: it reaps the daemons Ray
        # leaves to it. /run/sshd (sshd's privilege separation directory) is on a /run of the
        # host's own.
        script = (f"hostname {host.name} && mount --bind {shlex.quote(str(host.root / 'passwd'))} /etc/passwd"
                  f" && mount --bind {shlex.quote(str(host.root / 'hosts'))} /etc/hosts"
                  f" && mount --bind {shlex.quote(str(host.root))} /tmp"
                  f" && mount -t tmpfs -o mode=0755 tmpfs /run && mkdir /run/sshd"
                  f" && exec {SSHD} -D -e -f /tmp/sshd/sshd_config")
        with (self.dir / f"{host.name}-sshd.log").open("w") as log:
            host.sshd = subprocess.Popen(
                ["ip", "netns", "exec", host.ns, "unshare", "--mount", "--uts", "--pid", "--fork", "--mount-proc",
                 "--kill-child", "--propagation", "private", "--", "sh", "-c", script],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)

    def _wait_for_sshd(self, host: Host, bound_s: float = 30.0) -> None:
        deadline = time.monotonic() + bound_s
        while True:
            try:
                with socket.create_connection((host.ip, 22), timeout=2):
                    return
            except OSError:
                log = (self.dir / f"{host.name}-sshd.log").read_text()
                assert host.sshd is not None and host.sshd.poll() is None, f"{host.name}'s sshd exited: {log}"
                assert time.monotonic() < deadline, f"{host.name}'s sshd did not listen within {bound_s} s: {log}"
                time.sleep(0.1)

    def kill(self, host: Host, bound_s: float = 30.0) -> None:
        """Every process of the host at once, as a machine lost: its Ray, its sshd."""
        deadline = time.monotonic() + bound_s
        while host.pids():
            # A process that exits between the listing and its kill fails `kill` (its status is
            # no failure here); one started meanwhile is killed on the next round.
            subprocess.run(["sh", "-c", f"ip netns pids {host.ns} | xargs -r kill -9"], capture_output=True,
                           timeout=30)
            assert time.monotonic() < deadline, f"{host.name}'s processes outlived SIGKILL: {host.pids()}"
            time.sleep(0.1)
        if host.sshd is not None:
            host.sshd.wait(timeout=bound_s)

    def close(self) -> None:
        import psutil

        for host in self.hosts:
            with contextlib.suppress(RuntimeError, subprocess.SubprocessError, AssertionError):
                self.kill(host)
        # The launcher's ssh connections to the hosts (their ControlMaster processes, which
        # outlive `ray up` for ControlPersist's 10 s): ours alone name our control directory.
        for p in psutil.process_iter(["cmdline"]):
            if str(self.control_dir) in " ".join(p.info["cmdline"] or ()):
                with contextlib.suppress(psutil.NoSuchProcess):
                    p.kill()
        for cmd in reversed(self._made):
            with contextlib.suppress(RuntimeError):
                _sh(*cmd)
        shutil.rmtree(self.control_dir, ignore_errors=True)
        with contextlib.suppress(OSError):
            self.control_dir.parent.rmdir()  # only if no other cluster of this user has sockets there
        shutil.rmtree(self.dir, ignore_errors=True)

    def head_log(self, name: str, chars: int = 3000) -> str:
        """The end of a log of the head's Ray session (monitor.out: the autoscaler, which
        starts the workers over SSH), for a failure's message."""
        logs = sorted((self.head.root / "ray").glob(f"session_2*/logs/{name}"))
        return f"{name}: " + (logs[-1].read_text(errors="replace")[-chars:] if logs else "(none)")

    # -- the laptop's side ----------------------------------------------------------------

    def env(self, home: Path | None = None) -> dict[str, str]:
        """The laptop's environment: its own home (the test's token, never this machine's
        ~/.ray/auth_token), and the launcher's state file in the test's directory."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_AUTH", "RAY_ADDRESS"))}
        return {**env, "HOME": str(home or self.laptop), "RAY_TMPDIR": str(self.dir / "laptop-tmp"),
                "RAY_USAGE_STATS_ENABLED": "0", "COLUMNS": "200"}

    def ray(self, *args: str, timeout_s: float) -> tuple[subprocess.CompletedProcess, float]:
        """`ray ARGS` from the repository root, as a user runs it there; and its seconds."""
        t0 = time.monotonic()
        r = subprocess.run([str(RAY), *args], cwd=ROOT, env=self.env(), capture_output=True, text=True,
                           stdin=subprocess.DEVNULL, timeout=timeout_s)
        return r, time.monotonic() - t0

    def write_config(self, sweep: Path) -> Path:
        """docs/cluster-onprem.yaml filled in for the lab: its addresses, the test's key and
        user; its sweep file mounted too; the setup commands that install from the internet
        replaced by what they amount to here; the workers' GPUs declared."""
        from importlib.metadata import version

        config = yaml.safe_load(ONPREM.read_text())
        config["cluster_name"] = self.cluster_name  # names the launcher's state file and ssh sockets
        config["provider"].update(head_ip=self.head.ip, worker_ips=[w.ip for w in self.workers])
        config["auth"].update(ssh_user=self.user, ssh_private_key=str(self.key))
        config["file_mounts"]["~/sweep.yaml"] = str(sweep)
        config["rsync_exclude"] = config["rsync_exclude"] + _ignored_by_git()
        # The pip installs need the internet, which CI's machine has only for its own setup, and
        # would change this machine's Python, which every host shares. What they leave on a
        # host is checked or done instead: the same Ray as the laptop's, and sweeper imported
        # from the synced checkout (what `pip install -e ~/sweeper` makes it do; PYTHONPATH
        # comes before this machine's own editable install of sweeper).
        ray_version = version("ray")
        stand_ins = {
            'pip install -U "ray[default]==2.60.0"':
                f"python -c 'import ray; assert ray.__version__ == \"{ray_version}\", ray.__version__'",
            'pip install -e "$HOME/sweeper[vllm]"':
                "grep -q PYTHONPATH ~/.bashrc || echo 'export PYTHONPATH=$HOME/sweeper' >> ~/.bashrc",
        }
        pips = [c for c in config["setup_commands"] if "pip install" in c]
        assert pips == list(stand_ins), f"the file's installs changed ({pips}): update the stand-ins here"
        config["setup_commands"] = [stand_ins.get(c, c) for c in config["setup_commands"]]
        # This machine has no GPU: each worker declares one (a logical GPU: Ray schedules on it
        # as on a real one), so the sweep's groups have GPUs to be placed on.
        starts = config["worker_start_ray_commands"]
        assert sum("ray start " in c for c in starts) == 1, starts
        config["worker_start_ray_commands"] = [c.replace("ray start ", "ray start --num-gpus=1 ") for c in starts]
        path = self.dir / "cluster.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        return path


@pytest.fixture
def lab():
    lab = Lab()
    try:
        lab.start()
        yield lab
    finally:
        lab.close()


SWEEP = """
name: onprem
models: [tiny-llama, tiny-qwen2]
backends: noop
precisions: fp32
batch_sizes: [1, 2]
workload: {input_len: 8, output_len: 4}
backend_options: {noop: {step_s: 0.01, gate_file: /tmp/gate}}
measure: {warmup_iters: 0, min_iters: 1, min_duration_s: 0, idle_s: 0}
"""

# Run on the head through `ray exec`: waits (bounded) until the head and both workers are
# alive, and prints them (node id, address, GPUs) and where sweeper is imported from.
WAIT_FOR_NODES = """
import json, sys, time
import ray, sweeper
ray.init(address="auto", logging_level=40)
deadline = time.monotonic() + float(sys.argv[1])
def alive(): return [n for n in ray.nodes() if n["Alive"]]
while len(alive()) < 3 and time.monotonic() < deadline: time.sleep(0.5)
print("LAB " + json.dumps({"nodes": {n["NodeID"]: [n["NodeManagerAddress"], n["Resources"].get("GPU", 0)]
                                     for n in alive()}, "sweeper": sweeper.__file__}))
"""


class Exec:
    """`ray exec CONFIG COMMAND` from the laptop, in the background: the lines it prints, each
    with the time it arrived."""

    def __init__(self, lab: Lab, config: Path, command: str) -> None:
        self.proc = subprocess.Popen([str(RAY), "exec", str(config), command], cwd=ROOT, env=lab.env(), text=True,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.lines: list[tuple[float, str]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:  # the head's terminal (ssh -tt): lines end in \r\n
            self.lines.append((time.monotonic(), line.rstrip()))

    def text(self) -> str:
        return "\n".join(line for _, line in list(self.lines))

    def wait_for(self, pattern: re.Pattern[str], n: int, bound_s: float) -> list[tuple[float, re.Match[str]]]:
        """The first ``n`` lines matching ``pattern`` (their times); fails if the command ends
        first or ``bound_s`` passes."""
        deadline = time.monotonic() + bound_s
        while True:
            found = [(t, m) for t, line in list(self.lines) if (m := pattern.search(line))]
            if len(found) >= n:
                return found[:n]
            assert self.proc.poll() is None or self._reader.is_alive(), self.text()[-5000:]
            assert time.monotonic() < deadline, f"no {n} lines matching {pattern.pattern} within {bound_s} s: " \
                                                f"{self.text()[-5000:]}"
            time.sleep(0.1)

    def wait(self, bound_s: float) -> int:
        try:
            code = self.proc.wait(timeout=bound_s)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(timeout=30)
            self._reader.join(timeout=30)
        return code


def test_ray_up_brings_the_onprem_lab_up_over_ssh_and_a_lost_host_costs_one_retry(lab):
    """`ray up` of docs/cluster-onprem.yaml syncs the checkout to every host, runs the setup
    commands and starts Ray there with token authentication (the workers from the head); a
    sweep run on the head through `ray exec` places its two groups on the two workers, one of
    which is then lost with every process on it while its group's first trial waits at a gate
    (so the loss is mid-trial whatever the machine's speed): the trial runs again on the
    other, and the results brought home hold every trial once. A client without the token is
    refused by the head; after `ray down` no Ray process is left on any host."""
    times: dict[str, float] = {}
    sweep = lab.dir / "sweep.yaml"
    sweep.write_text(SWEEP)
    config = lab.write_config(sweep)

    r, times["ray up"] = lab.ray("up", "-y", "--no-config-cache", str(config), timeout_s=300)
    assert r.returncode == 0, (r.stdout + r.stderr)[-5000:]
    # The workers are started by the head's autoscaler after `ray up` returns: wait for them.
    t0 = time.monotonic()
    waiter = Exec(lab, config, f"python -c {shlex.quote(WAIT_FOR_NODES)} 180")
    (_, found), = waiter.wait_for(re.compile(r"^LAB (\{.*\})$"), 1, bound_s=240)
    assert waiter.wait(bound_s=60) == 0, waiter.text()[-3000:]
    assert len(json.loads(found.group(1))["nodes"]) == 3, (found.group(1), lab.head_log("monitor.out"))
    times["workers up after ray up"] = time.monotonic() - t0
    lab_state = json.loads(found.group(1))
    nodes = {node_id: (ip, gpus) for node_id, (ip, gpus) in lab_state["nodes"].items()}
    assert sorted(nodes.values()) == sorted([(lab.head.ip, 0), *[(w.ip, 1) for w in lab.workers]]), nodes
    host_of = {node_id: next(h for h in lab.hosts if h.ip == ip) for node_id, (ip, _) in nodes.items()}
    # The head's driver imports sweeper from the checkout the launcher synced there.
    assert lab_state["sweeper"] == "/tmp/home/sweeper/sweeper/__init__.py", lab_state

    for host in lab.hosts:  # what the launcher left on every host
        assert (host.home / "sweeper" / "pyproject.toml").read_text() == (ROOT / "pyproject.toml").read_text()
        assert not (host.home / "sweeper" / ".git").exists()
        assert (host.home / ".ray" / "auth_token").read_text().strip() == lab.token
        bashrc = (host.home / ".bashrc").read_text()
        assert "export RAY_AUTH_MODE=token" in bashrc and "PYTHONPATH=$HOME/sweeper" in bashrc, bashrc
        assert any("raylet" in cmd for cmd in host.ray_processes()), host.name

    # A client without the token is refused by the head (its GCS, on the lab's network).
    stranger = lab.dir / "stranger"
    stranger.mkdir()
    r = subprocess.run([sys.executable, "-m", "sweeper", "plan", str(sweep), "--address", f"{lab.head.ip}:6379"],
                       cwd=ROOT, env=lab.env(home=stranger), capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "the cluster requires a token (Ray token authentication) and this driver has none" in r.stderr, r.stderr

    # The sweep, on the head: `ray exec` as a user's `ray attach` session would run it.
    t0 = time.monotonic()
    run = Exec(lab, config, "sweeper run ~/sweep.yaml --address auto -o ~/results/onprem -q")
    try:
        placed = run.wait_for(re.compile(r"^placed  .+ on (\S+):\w+ GPU 0$"), 2, bound_s=180)
        on = [m.group(1) for _, m in placed]
        assert sorted(on) == [w.name for w in lab.workers], run.text()[-3000:]  # one group a worker
        # Each group's actor inside its first trial (Ray titles the process with the method it
        # runs), held there at the gate: the host is lost mid-trial.
        deadline = time.monotonic() + 120
        while not all(any(c.startswith("ray::TrialRunner.run") for c in w.ray_processes()) for w in lab.workers):
            assert time.monotonic() < deadline and run.proc.poll() is None, \
                ({w.name: w.ray_processes() for w in lab.workers}, run.text()[-3000:])
            time.sleep(0.2)
        lost = next(w for w in lab.workers if w.name == on[1])
        t_kill = time.monotonic()
        lab.kill(lost)
        for w in lab.workers:
            (w.root / "gate").touch()  # the hosts' /tmp/gate
        (t_retry, _), = run.wait_for(re.compile(r"retry 1/2: .*actor died"), 1, bound_s=180)
        code = run.wait(bound_s=300)
    finally:
        if run.proc.poll() is None:
            run.proc.kill()
    times["sweep"] = time.monotonic() - t0
    times["retry after the kill"] = t_retry - t_kill
    text = run.text()
    assert code == 0, text[-5000:]
    assert len(re.findall(r"retry \d+/\d+: ", text)) == 1, text[-5000:]  # the lost trial's, and only it

    # The results come home from the head, where the driver wrote them.
    home = lab.laptop / "results"
    r, times["ray rsync-down"] = lab.ray("rsync-down", str(config), "~/results/onprem/", f"{home}/", timeout_s=120)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    trials = pq.read_table(home / "trials.parquet").to_pylist()
    assert len(trials) == 4 and len({t["trial_id"] for t in trials}) == 4, trials  # each once: none lost, none doubled
    assert {t["status"] for t in trials} == {"ok"}, trials
    # The lost host finished no trial (its group's were held at the gate): all ran on the other.
    survivor = next(w for w in lab.workers if w is not lost)
    assert {host_of[t["ray_node_id"]].name for t in trials} == {survivor.name}, trials

    r, times["ray down"] = lab.ray("down", "-y", str(config), timeout_s=120)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    # `ray down` stops Ray on the head (the local provider's teardown); the live worker's raylet
    # stops itself once the head's GCS has been gone for the file's
    # RAY_gcs_rpc_server_reconnect_timeout_s (15 s), and its agents 60 s later (the time they
    # give their last report to the head that is gone).
    t0 = time.monotonic()
    left = {h.name: h.ray_processes() for h in lab.hosts}
    assert not left["head"], left
    while any(left.values()) and time.monotonic() - t0 < 180:
        time.sleep(0.5)
        left = {h.name: h.ray_processes() for h in lab.hosts}
    times["no ray process after ray down"] = time.monotonic() - t0
    print("\n" + "; ".join(f"{k} {v:.1f} s" for k, v in times.items()))
    assert not any(left.values()), left
