"""The command line: plan output, and bad input as one clear line with exit code 2."""

from __future__ import annotations

import json

import pytest

from tests.conftest import ROOT, run_cli

GOOD = """
name: t
models: [tiny-llama]
precisions: [fp32, fp16]
batch_sizes: [1, 2]
workload: {input_len: 8, output_len: 4}
"""


def test_plan_json_lists_trials_and_skips(write_sweep):
    r = run_cli("plan", str(write_sweep(GOOD)), "--json", "--device", "cpu")
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    assert (plan["trials"], plan["runnable"], plan["skipped"], plan["groups"]) == (4, 2, 2, 1)
    skipped = [t for t in plan["plan"] if t["status"] == "skipped"]
    assert all(t["precision"] == "fp16" and "cpu" in t["reason"] for t in skipped)


def test_plan_table(write_sweep):
    r = run_cli("plan", str(write_sweep(GOOD)), "--device", "cuda")
    assert r.returncode == 0, r.stderr
    assert "4 to run in 2 model load(s), 0 skipped" in r.stdout


LARGE = """
name: large
models: [tiny-llama, llama-3.2-1b]
backends: noop
precisions: [fp32, bf16]
batch_sizes: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
workload: {input_len: [8, 16, 32, 64, 1024, 2000], output_len: [4, 8, 16, 32, 64, 128]}
repeats: 3
exclude:
  - {model: llama-3.2-1b, precision: fp32, batch_size: [1, 2]}
"""


def test_a_large_plan_is_one_row_per_model_load_and_json_lists_every_trial(write_sweep):
    path = str(write_sweep(LARGE))
    r = run_cli("plan", path, "--device", "cpu")
    assert r.returncode == 0, r.stderr
    # 2 models x 2 precisions x 10 batches x 36 shapes x 3 repeats = 4,320, less 2 x 36 x 3 excluded
    assert "large: 4,104 trials on cpu, one row per model load (sweeper plan --json lists every trial)" in r.stdout
    rows = [line for line in r.stdout.splitlines() if line.startswith("│ ") and "noop" in line]
    assert len(rows) == 4
    tiny = next(line for line in rows if "tiny-llama" in line and "fp32" in line)
    # 2 of the 36 shapes are longer than tiny-llama's 2048 positions (2000 + 64, 2000 + 128)
    assert [c.strip() for c in tiny.split("│")[5:9]] == ["1,080", "1,020", "0", "60"]
    assert "exceeds the model's 2048 positions" in tiny
    plan = json.loads(run_cli("plan", path, "--device", "cpu", "--json").stdout)
    assert len(plan["plan"]) == plan["trials"] == 4104 and plan["excluded"] == 216
    assert len({t["trial_id"] for t in plan["plan"]}) == 4104


@pytest.mark.parametrize("text, expected", [
    ("name: t\nmodels: [a, b\n", "malformed YAML"),
    (GOOD + "colour: red\n", "colour: unknown key"),
    (GOOD.replace("[1, 2]", "[1, -2]"), "batch_sizes[1]: Input should be greater than 0"),
    (GOOD.replace("[1, 2]", "[]"), "batch_sizes: must not be empty"),
    (GOOD.replace("input_len: 8", "input_len: eight"), "workload.input_len"),
    (GOOD.replace("tiny-llama", "not/a-real-model-xyz"), "models[0]: Hugging Face model"),
    (GOOD.replace("fp16", "int3"), "precisions: unknown precision 'int3'"),
])
@pytest.mark.parametrize("command", ["plan", "run"])
@pytest.mark.slow
def test_bad_sweep_files_exit_2_with_one_line(write_sweep, text, expected, command):
    r = run_cli(command, str(write_sweep(text)))
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr + r.stdout
    assert expected in r.stderr
    assert "starting Ray" not in r.stderr  # nothing ran


@pytest.mark.slow
def test_missing_file_and_bad_flags_exit_2(tmp_path):
    r = run_cli("run", str(tmp_path / "none.yaml"))
    assert r.returncode == 2 and "no such file" in r.stderr and "Traceback" not in r.stderr
    r = run_cli("run", "sweeps/quickstart.yaml", "--no-such-flag")
    assert r.returncode == 2 and "No such option" in r.stderr
    r = run_cli("plan", "sweeps/quickstart.yaml", "--device", "tpu")
    assert r.returncode == 2 and "Invalid value" in r.stderr
    r = run_cli("aggregate", str(tmp_path))
    assert r.returncode == 2 and "no trial shards" in r.stderr


def test_presets_listed():
    r = run_cli("presets")
    assert r.returncode == 0
    for name in ("llama-3.2-1b", "llama-3.1-8b", "qwen2.5-0.5b", "qwen2.5-7b", "mistral-7b", "tiny-llama"):
        assert name in r.stdout


def test_version_and_flags_read_as_flags():
    from sweeper.core.version import __version__

    r = run_cli("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"sweeper {__version__}"
    for command in ([], ["run"], ["plan"], ["report"], ["query"], ["aggregate"], ["presets"]):
        helped = run_cli(*command, "--help")
        assert helped.returncode == 0 and "--help" in helped.stdout
        assert "<bool>" not in helped.stdout, (command, helped.stdout)  # --help, --quiet, --version: flags


def test_plan_marks_what_an_output_directory_already_holds(tmp_path):
    import json

    from sweeper.run.storage import ResultStore

    sweep = ROOT / "sweeps" / "quickstart.yaml"
    plan = json.loads(run_cli("plan", str(sweep), "--json").stdout)["plan"]
    store = ResultStore(str(tmp_path))
    done = plan[0]["trial_id"]
    store.write_shard("trials", done, [{"trial_id": done, "status": "ok"}])
    failed = plan[1]["trial_id"]
    store.write_shard("trials", failed, [{"trial_id": failed, "status": "failed", "reason": "oom"}])
    # Skipped as unsupported by an earlier plan, runnable in this one: it runs, as `sweeper run` would.
    unsupported = plan[2]["trial_id"]
    store.write_shard("trials", unsupported, [{"trial_id": unsupported, "status": "skipped",
                                               "reason": "unsupported"}])
    marked = {t["trial_id"]: t["status"] for t in json.loads(
        run_cli("plan", str(sweep), "--json", "-o", str(tmp_path)).stdout)["plan"]}
    assert marked[done] == "done (ok)" and marked[failed] == "done (failed: oom)" and marked[unsupported] == "run"
    assert sum(s == "run" for s in marked.values()) == len(plan) - 2
    retrying = json.loads(run_cli("plan", str(sweep), "--json", "-o", str(tmp_path), "--retry-failed").stdout)
    assert {t["trial_id"]: t["status"] for t in retrying["plan"]}[failed] == "run"
    text = run_cli("plan", str(sweep), "-o", str(tmp_path)).stdout
    assert f"{len(plan) - 2} to run in" in text and f"2 already done in {tmp_path}" in text


def test_the_tests_sweeper_runs_join_the_shared_ray_head_whatever_an_in_process_ray_set(write_sweep, tmp_path,
                                                                                       monkeypatch):
    """The suite's time depends on it: a ``sweeper run`` of a test joins the session's Ray head
    (conftest.run_cli), also once this process's own Ray driver has set its variables."""
    from tests.conftest import _SharedHead

    _SharedHead.address()  # up before the variables below appear
    for key, value in {"RAY_AUTH_MODE": "token", "RAY_CLIENT_MODE": "0",
                       "PYTHONBREAKPOINT": "ray.util.rpdb._driver_set_trace"}.items():
        monkeypatch.setenv(key, value)  # what ray.init() sets in the process that calls it
    # A variable that some earlier test or library left set would make every later run of this
    # worker start a Ray of its own: name it.
    assert _SharedHead.environment_differences() == []
    sweep = write_sweep("name: joined\nmodels: [tiny-llama]\nbackends: [noop]\nprecisions: [fp32]\n"
                        "batch_sizes: [1]\nworkload: {input_len: 4, output_len: 2}\n"
                        "measure: {warmup_iters: 0, min_iters: 1, min_duration_s: 0.01, idle_s: 0}\n")
    r = run_cli("run", str(sweep), "-o", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr[-2000:]
    assert "sweeper: on the Ray cluster this process is connected to (GCS " in r.stderr
    assert "starting Ray (local)" not in r.stderr
