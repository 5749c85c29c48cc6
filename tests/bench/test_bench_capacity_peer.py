"""How ``bench capacity-peer`` reads a capacity off vLLM's sweep: the highest rate of its ladder
whose p99 TTFT and TPOT keep to the SLO, bracketed by the next rate it explored (the two
concurrency anchors, at 1 and at the whole dataset, are not rates it offered)."""

from __future__ import annotations

import argparse

from bench.capacity_peer import knee, serve_argv


def _level(rate: float, ttft_ms: float, tpot_ms: float, concurrency: int | None = None) -> dict:
    return {"request_rate": rate, "p99_ttft_ms": ttft_ms, "p99_tpot_ms": tpot_ms, "max_concurrency": concurrency}


SLO = argparse.Namespace(slo_ttft_ms=500.0, slo_tpot_ms=50.0)


def test_the_peer_s_capacity_is_its_highest_rate_within_the_slo_and_the_next_one_brackets_it():
    levels = [_level(3.0, 40, 10, concurrency=1), _level(30, 80, 20), _level(55, 300, 35), _level(80, 900, 60),
              _level(105, 4000, 90), _level(130, 9000, 95, concurrency=150)]
    assert knee(levels, SLO) == {"capacity_req_s": 55, "next_explored_req_s": 80}
    # TPOT alone can bound it; nothing within the SLO: no capacity.
    assert knee([_level(30, 80, 20), _level(55, 300, 51)], SLO)["capacity_req_s"] == 30
    assert knee([_level(30, 800, 20)], SLO) == {"capacity_req_s": None, "next_explored_req_s": None}
    # A run that reported no percentile cannot be shown to hold the SLO.
    assert knee([_level(30, None, 20)], SLO)["capacity_req_s"] is None  # type: ignore[arg-type]


def test_the_peer_s_server_is_sweeper_s_launch_command_on_a_fixed_port():
    args = argparse.Namespace(model="llama-3.2-1b", port=8391, eager=True)
    argv = serve_argv(args, "/models/m")
    assert argv[argv.index("--port") + 1] == "8391" and argv[argv.index("--host") + 1] == "127.0.0.1"
    assert "--enforce-eager" in argv and "--load-format" in argv and "{port}" not in " ".join(argv)


def test_a_step_past_its_limit_is_stopped_with_the_server_it_started(tmp_path):
    """vLLM's sweep starts `vllm serve` as its child; a step stopped at its limit must not leave
    that child holding the GPU. Here the "server" is a grandchild that ignores SIGTERM, in a
    session of its own (as vLLM's sweep starts it): a stop of the step's group alone misses it."""
    import time

    from bench.capacity_peer import bounded

    pid_file = tmp_path / "server.pid"
    script = f"setsid bash -c 'trap \"\" TERM; echo $$ > {pid_file}; exec sleep 300' & wait"
    done = bounded(["bash", "-c", script], 3.0, tmp_path / "step.log", grace_s=1.0)
    assert done.returncode is None and done.record()["timed_out"]
    server = int(pid_file.read_text())
    for _ in range(100):  # the group's SIGKILL is sent before bounded returns; reaping may lag
        if not _alive(server):
            break
        time.sleep(0.05)
    else:
        raise AssertionError(f"the step's server (pid {server}) outlived it")
    quick = bounded(["bash", "-c", "echo measured; exit 3"], 30.0, tmp_path / "quick.log")
    assert quick.returncode == 3 and "measured" in (tmp_path / "quick.log").read_text()
    assert quick.record()["error"].strip() == "measured"


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, killed but not yet reaped by whoever adopted it, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
