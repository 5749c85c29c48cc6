"""``python -m bench launch-race`` on the fault server: servers launched at once each get a
port of their own and are answered by themselves (the bench's GPU run uses ``vllm serve``)."""

from __future__ import annotations

import subprocess
import sys

from bench.benchkit import read_results
from tests.conftest import ROOT


def test_servers_launched_at_once_each_answer_on_their_own_port(tmp_path):
    out = tmp_path / "launch_race.json"
    r = subprocess.run([sys.executable, "-m", "bench", "launch-race", "--servers", "4", "--out", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    results = read_results(out)
    assert results["ok"] and results["distinct_ports"]
    rows = results["rows"]
    assert [row["served"] for row in rows] == [[f"race{i}"] for i in range(4)]
    assert all(row["listeners_in_own_group"] and not row["listeners_elsewhere"] and not row["group_left_running"]
               for row in rows)
