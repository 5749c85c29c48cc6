"""Prompt datasets and reply lengths in the sweep file: reading, bad input, identity, the plan."""

from __future__ import annotations

import json

import pytest
import yaml

from sweeper.core.datasets import BUNDLED_FILE, DatasetError, read_records
from sweeper.core.errors import SweepFileError
from sweeper.plan.expand import expand, make_plan
from sweeper.plan.spec import parse_sweep
from tests.conftest import run_cli


def sweep(workload: dict, **top) -> dict:
    return {"name": "d", "models": "tiny-llama", "backends": "noop", "precisions": "bf16", "batch_sizes": 2,
            "workload": workload, **top}


def jsonl(path, *records) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return str(path)


def test_the_bundled_set_is_a_few_hundred_prompts_each_with_a_reference_length():
    records = read_records(BUNDLED_FILE)
    assert 300 <= len(records) <= 400
    assert all(r.prompt.strip() and r.output_len and r.output_len > 0 for r in records)
    assert len({r.prompt for r in records}) == len(records)
    assert (BUNDLED_FILE.parent / "PROMPTS-LICENSE.md").is_file()


def test_jsonl_records_take_a_reference_length_or_completion(tmp_path):
    path = jsonl(tmp_path / "p.jsonl", {"prompt": "a"}, "", {"prompt": "b", "output_len": 7},
                 {"prompt": "c", "completion": "the reply"})
    records = read_records(tmp_path / "p.jsonl")
    assert [(r.prompt, r.output_len, r.reference) for r in records] == [
        ("a", None, None), ("b", 7, None), ("c", None, "the reply")]
    assert path.endswith(".jsonl")


def test_sharegpt_takes_the_first_turn_as_prompt_and_the_second_as_reference(tmp_path):
    data = [{"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello there"},
                               {"from": "human", "value": "more"}]},
            {"conversations": [{"from": "human", "value": "alone"}]}]  # no reply: left out, as vLLM does
    (tmp_path / "sg.json").write_text(json.dumps(data))
    records = read_records(tmp_path / "sg.json")
    assert [(r.prompt, r.reference) for r in records] == [("hi", "hello there")]


@pytest.mark.parametrize(("content", "name", "expected"), [
    (None, "missing.jsonl", "missing.jsonl: no such file"),
    ('{"prompt": "a"}\n{"prompt": "b"}\n{"prompt": oops}\n', "p.jsonl", "p.jsonl record 3: not JSON"),
    ('{"prompt": "a"}\n{"text": "b"}\n', "p.jsonl", "p.jsonl record 2 field 'prompt': missing"),
    ('{"prompt": ""}\n', "p.jsonl", "p.jsonl record 1 field 'prompt': must be non-empty text"),
    ('{"prompt": "a", "output_len": -3}\n', "p.jsonl", "record 1 field 'output_len': must be a positive"),
    ("\n\n", "p.jsonl", "p.jsonl: holds no prompts"),
    ('{"conversations": []}', "sg.json", "a ShareGPT file is a JSON list"),
    ('[{"turns": []}]', "sg.json", "sg.json record 1 field 'conversations': missing or not a list"),
    ('[1, 2', "sg.json", "sg.json: not JSON"),
    ("prompt,len\n", "p.csv", "unknown prompt-file format"),
])
def test_bad_files_name_the_file_the_record_and_the_field(tmp_path, content, name, expected):
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    with pytest.raises(SweepFileError) as err:
        expand(parse_sweep(sweep({"dataset": str(path), "output_len": 4})))
    message = str(err.value)
    assert message.startswith("<sweep>: workload.dataset: ") and expected in message, message
    assert "\n" not in message


def test_the_cli_refuses_a_bad_dataset_on_one_line_with_exit_2(tmp_path):
    jsonl(tmp_path / "p.jsonl", {"prompt": "fine"}, {"text": "no prompt"})
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(sweep({"dataset": "p.jsonl", "output_len": 4})))
    proc = run_cli("plan", str(tmp_path / "s.yaml"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "p.jsonl record 2 field 'prompt': missing" in lines[0], proc.stderr


DEEP = "[" * 100_000 + "]" * 100_000  # past the recursion json parses with (RecursionError)
TURNS = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]


@pytest.mark.parametrize(("name", "content", "replayed", "where", "problem"), [
    # A lone surrogate as JSON writes it, an escape: json reads it, nothing can encode it.
    ("p.jsonl", '{"prompt": "fine"}\n{"prompt": "half \\ud800 a pair"}\n', False,
     "record 2 field 'prompt'", "lone surrogate \\ud800"),
    ("p.jsonl", '{"prompt": "a", "completion": "b\\udfff"}\n', False, "record 1 field 'completion'",
     "lone surrogate \\udfff"),
    ("sg.json", '[{"conversations": [{"from": "human", "value": "\\ud800"}, {"from": "gpt", "value": "b"}]}]',
     False, "record 1 field 'conversations.value'", "lone surrogate \\ud800"),
    ("c.jsonl", json.dumps({"conversations": [*TURNS, {"role": "user", "content": "x"}]}).replace("x", "\\ud800"),
     True, "record 1 field 'conversations.content'", "lone surrogate \\ud800"),
    ("p.jsonl", '{"prompt": "fine"}\n{"prompt": ' + DEEP + "}\n", False, "record 2 field 'prompt'",
     "nested 100,001 levels deep"),
    ("sg.json", '[{"conversations": []},\n {"conversations": ' + DEEP + "}]", False,
     "record 2 field 'conversations'", "nested 100,002 levels deep"),
    ("c.jsonl", json.dumps({"conversations": TURNS}) + '\n{"conversations": ' + DEEP + "}\n", True,
     "record 2 field 'conversations'", "nested 100,001 levels deep"),
    ("c.jsonl", json.dumps({"conversations": [TURNS[0], {"role": ["assistant"], "content": "b"}]}) + "\n", True,
     "record 1 field 'conversations.role'", "unknown role ['assistant']"),
    ("sg.json", json.dumps([{"conversations": [{"from": {"who": "human"}, "value": "a"}]}]), True,
     "record 1 field 'conversations.from'", "unknown role {'who': 'human'}"),
], ids=["surrogate-prompt", "surrogate-completion", "surrogate-sharegpt", "surrogate-turn", "deep-prompt",
        "deep-sharegpt", "deep-conversation", "role-list", "role-object"])
def test_malformed_prompt_and_conversation_files_are_one_line_naming_the_record_and_field(
        tmp_path, name, content, replayed, where, problem):
    data = tmp_path / name
    data.write_text(content)
    workload = {"dataset": name, "output_len": 4}
    if replayed:
        workload |= {"mode": "serving", "request_rate": 1, "num_prompts": 2, "conversations": True}
    top = {"batch_sizes": None} if replayed else {}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump({k: v for k, v in sweep(workload, **top).items()
                                                     if v is not None}))
    proc = run_cli("plan", str(tmp_path / "s.yaml"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"error: {tmp_path / 's.yaml'}: workload.dataset: {data} {where}: "), lines[0]
    assert problem in lines[0], lines[0]


@pytest.mark.parametrize(("workload", "expected"), [
    ({"dataset": "bundled", "input_len": 8, "output_len": 4}, "input_len: the prompts of dataset 'bundled'"),
    ({"output_len": 4}, "input_len: required field is missing"),
    ({"input_len": 8, "output_len": "natural"}, "max_output_len: required with output_len natural"),
    ({"input_len": 8, "output_len": 4, "max_output_len": 9}, "max_output_len: caps output_len natural"),
    ({"input_len": 8, "output_len": "reference", "max_output_len": 9}, "output_len: reference takes"),
    ({"input_len": 8, "output_len": 4, "num_prompts": 3}, "num_prompts is a serving-mode key"),
    ({"input_len": 8, "output_len": 4, "chat": True}, "chat: applies to a dataset's prompts"),
    ({"dataset": "bundled", "output_len": 4, "min_input_len": 9, "max_input_len": 3},
     "min_input_len is larger than max_input_len"),
    ({"input_len": 8, "output_len": "longest"}, "workload.output_len"),
])
def test_impossible_workloads_are_refused(workload, expected):
    with pytest.raises(SweepFileError) as err:
        parse_sweep(sweep(workload))
    assert expected in str(err.value), str(err.value)


def test_profiling_needs_one_shape():
    with pytest.raises(SweepFileError, match="profile: the layer-profiling pass replays batches of one shape"):
        parse_sweep(sweep({"dataset": "bundled", "output_len": 4}, profile={"layers": "block"}))


def test_a_length_filter_that_keeps_nothing_is_found_at_plan_time_for_synthetic_models(tmp_path):
    path = jsonl(tmp_path / "p.jsonl", {"prompt": "x" * 40}, {"prompt": "y" * 400})  # 10 and 100 tokens
    with pytest.raises(SweepFileError) as err:
        expand(parse_sweep(sweep({"dataset": path, "output_len": 4, "min_input_len": 20, "max_input_len": 90})))
    assert "workload.min_input_len: no prompt of p.jsonl is within [20, 90] tokens" in str(err.value)
    assert "its prompts are 10-100 tokens" in str(err.value)
    assert expand(parse_sweep(sweep({"dataset": path, "output_len": 4, "max_input_len": 10})))[0]


def test_reference_lengths_need_every_record_to_have_one(tmp_path):
    path = jsonl(tmp_path / "p.jsonl", {"prompt": "a", "output_len": 3}, {"prompt": "b"})
    with pytest.raises(SweepFileError, match="record 2 field 'output_len': has no reference length"):
        expand(parse_sweep(sweep({"dataset": path, "output_len": "reference", "max_output_len": 8})))


def test_the_file_s_content_is_part_of_the_trial_id_and_its_place_is_not(tmp_path):
    first = jsonl(tmp_path / "a.jsonl", {"prompt": "one"}, {"prompt": "two"})
    base = sweep({"dataset": first, "output_len": 4, "num_prompts": 2})
    trial = expand(parse_sweep(base))[0][0]
    assert trial.input_len is None and trial.prompts is not None and trial.prompts.records == 2
    assert "input_len" not in trial.identity() and trial.identity()["prompts"]["sha256"] == trial.prompts.sha256
    jsonl(tmp_path / "a.jsonl", {"prompt": "one"}, {"prompt": "three"})
    edited = expand(parse_sweep(base))[0][0]
    assert edited.trial_id != trial.trial_id
    columns = trial.columns()
    assert columns["dataset"] == first and columns["dataset_sha256"] == trial.prompts.sha256
    assert columns["num_prompts"] == 2 and columns["input_len"] is None and columns["output_lengths"] == "fixed"


def test_relative_dataset_paths_are_read_from_the_sweep_file_s_folder(tmp_path):
    jsonl(tmp_path / "p.jsonl", {"prompt": "hello"})
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(sweep({"dataset": "p.jsonl", "output_len": 4})))
    proc = run_cli("plan", str(tmp_path / "s.yaml"), "--json")
    assert proc.returncode == 0, proc.stderr


def test_natural_lengths_cap_the_output_len_axis_and_label_the_trial():
    trial = expand(parse_sweep(sweep({"dataset": "bundled", "output_len": "natural", "max_output_len": 64})))[0][0]
    assert trial.output_len == 64 and trial.output_lengths == "natural" and trial.stops_at_eos
    assert trial.identity()["output_lengths"] == "natural"
    assert "data=bundled out=natural<=64" in trial.label()


def test_natural_lengths_on_a_random_weight_model_are_skipped_with_the_reason():
    plan = make_plan(parse_sweep({**sweep({"dataset": "bundled", "output_len": "natural", "max_output_len": 8}),
                                  "backends": ["noop", "transformers"]}), "cpu")
    reasons = {p.trial.backend: p.skip_reason for p in plan.trials}
    assert reasons["noop"] is None  # the simulated model draws where each reply ends
    assert "a synthetic (random-weight) model never does" in (reasons["transformers"] or "")


def test_compiled_transformers_runs_one_shape_only():
    plan = make_plan(parse_sweep({**sweep({"dataset": "bundled", "output_len": 8}), "backends": "transformers",
                                  "backend_options": {"transformers": [{}, {"compile": True}]}}), "cpu")
    reasons = {p.trial.variant(): p.skip_reason for p in plan.trials}
    assert reasons[""] is None
    assert (reasons["compile=True"] or "").startswith("compile: true compiles the decode step of one batch shape")


def test_dataset_errors_are_user_input_errors():
    from sweeper.core.errors import UserInputError

    assert issubclass(DatasetError, UserInputError)
