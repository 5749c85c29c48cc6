"""Sweep-file schema: axes, defaults, unknown keys, bad values."""

from __future__ import annotations

import pytest

from sweeper.core.errors import SweepFileError
from sweeper.plan.spec import load_sweep, parse_sweep
from tests.conftest import run_cli

MINIMAL = {
    "name": "s", "models": "tiny-llama", "precisions": "fp32", "batch_sizes": 4,
    "workload": {"input_len": 8, "output_len": 4},
}


def test_scalars_become_one_element_axes():
    s = parse_sweep(MINIMAL)
    assert s.models == ["tiny-llama"]
    assert s.backends == ["transformers"]
    assert s.batch_sizes == [4]
    assert s.workload.input_len == [8]
    assert s.repeats == 1 and s.measure.min_iters == 5


def test_duplicates_dropped_in_order():
    s = parse_sweep({**MINIMAL, "batch_sizes": [8, 1, 8, 2]})
    assert s.batch_sizes == [8, 1, 2]


@pytest.mark.parametrize("patch, field, words", [
    ({"modles": ["x"]}, "modles", "unknown key"),
    ({"workload": {"input_len": 8, "output_len": 4, "prompt": "x"}}, "workload.prompt", "unknown key"),
    ({"batch_sizes": []}, "batch_sizes", "must not be empty"),
    ({"batch_sizes": [1, 0]}, "batch_sizes[1]", "greater than 0"),
    ({"batch_sizes": ["four"]}, "batch_sizes[0]", "integer"),
    ({"batch_sizes": [1.5]}, "batch_sizes[0]", "integer"),
    ({"workload": {"input_len": -1, "output_len": 4}}, "workload.input_len", "greater than 0"),
    ({"precisions": ["fp7"]}, "precisions", "unknown precision 'fp7'"),
    ({"backends": ["tensorrt"]}, "backends", "unknown backend 'tensorrt'"),
    ({"exclude": [{"colour": "red"}]}, "exclude", "not an axis"),
    ({"exclude": [{}]}, "exclude", "empty"),
    ({"name": "a b/c"}, "name", "pattern"),
    ({"measure": {"min_iters": 0}}, "measure.min_iters", "greater than 0"),
    ({"backend_options": {"transformers": {"attn_implementation": "magic"}}}, None, "attn_implementation"),
    ({"backend_options": {"transformers": {"bogus": 1}}}, None, "bogus"),
    ({"backend_options": {"transformers": [{}, {"compile": "sometimes"}]}}, None,
     "backend_options.transformers[1].compile"),
    ({"tensor_parallel": [1, 0]}, "tensor_parallel[1]", "greater than 0"),
    ({"fidelity": {"reference": "fp7"}}, "fidelity.reference", "unknown precision 'fp7'"),
    ({"fidelity": {"prompts": 0}}, "fidelity.prompts", "greater than 0"),
    ({"fidelity": {"tokens": 3}}, "fidelity.tokens", "unknown key"),
])
def test_bad_values_name_the_field(patch, field, words):
    with pytest.raises(SweepFileError) as info:
        parse_sweep({**MINIMAL, **patch}, "f.yaml")
    msg = str(info.value)
    assert msg.startswith("f.yaml: ")
    if field:
        assert info.value.field == field, msg
    assert words in msg


def test_missing_required_field():
    data = dict(MINIMAL)
    del data["models"]
    with pytest.raises(SweepFileError, match="models: required field is missing"):
        parse_sweep(data, "f.yaml")


def test_top_level_not_a_mapping():
    with pytest.raises(SweepFileError, match="mapping"):
        parse_sweep(["a", "b"], "f.yaml")


def test_file_errors(tmp_path):
    with pytest.raises(SweepFileError, match="no such file"):
        load_sweep(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nmodels: [a, b\n")
    with pytest.raises(SweepFileError, match=r"malformed YAML: line \d+"):
        load_sweep(bad)


def test_yaml_is_loaded_safely(tmp_path):
    evil = tmp_path / "evil.yaml"
    evil.write_text("name: !!python/object/apply:os.system ['echo pwned']\n")
    with pytest.raises(SweepFileError, match="malformed YAML"):
        load_sweep(evil)


def test_bundled_sweeps_are_valid():
    from tests.conftest import ROOT

    for path in (ROOT / "sweeps").glob("*.yaml"):
        load_sweep(path)


def test_backend_option_variants_and_fidelity_defaults():
    s = parse_sweep({**MINIMAL, "backend_options": {"transformers": [{}, {"compile": True}]},
                     "fidelity": {}})
    variants = s.options_for("transformers")
    assert [v.compile for v in variants] == [False, True]
    assert s.fidelity.reference == "bf16" and s.tensor_parallel == [1]
    # a single mapping is one variant, as before
    one = parse_sweep({**MINIMAL, "backend_options": {"transformers": {"attn_implementation": "eager"}}})
    assert [v.attn_implementation for v in one.options_for("transformers")] == ["eager"]


# -- bad input: bounds, strict YAML, every problem at once ---------------------------------

GOOD = ("name: b\nmodels: tiny-llama\nprecisions: fp32\nbatch_sizes: 1\n"
        "workload: {input_len: 8, output_len: 4}\n")


@pytest.mark.parametrize(("extra", "field", "message"), [
    ("batch_sizes: [9223372036854775808]", "batch_sizes[0]", "less than or equal to 65536"),
    ("batch_sizes: [1000000000000]", "batch_sizes[0]", "less than or equal to 65536"),
    ("workload: {input_len: 8, output_len: 4, seed: -1}", "workload.seed", "greater than or equal to 0"),
    ("workload: {input_len: 8, output_len: 4, seed: 18446744073709551616}", "workload.seed", "less than"),
    ("measure: {min_duration_s: .inf}", "measure.min_duration_s", "finite"),
    ("measure: {timeout_s: .nan}", "measure.timeout_s", "finite"),
    ("repeats: 100000", "repeats", "less than or equal to 1000"),
    ("tensor_parallel: 1000", "tensor_parallel", "less than or equal to 64"),
    ("backend_options: {noop: {step_s: 0.1}}", "backend_options.noop", "not among this sweep's backends"),
])
def test_values_that_could_not_be_stored_or_would_hang_are_refused(write_sweep, extra, field, message):
    key = extra.split(":", 1)[0]
    text = "\n".join(line for line in GOOD.splitlines() if not line.startswith(key + ":")) + "\n" + extra + "\n"
    with pytest.raises(SweepFileError) as info:
        load_sweep(write_sweep(text))
    text = str(info.value)
    assert len(text.splitlines()) == 1 and f": {field}: " in text and message in text, text


def test_a_duplicate_key_is_an_error_not_last_wins(write_sweep):
    with pytest.raises(SweepFileError, match=r"malformed YAML: line 6, column 1: duplicate key 'batch_sizes'"):
        load_sweep(write_sweep(GOOD + "batch_sizes: 2\n"))
    with pytest.raises(SweepFileError, match="duplicate key 'input_len'"):
        load_sweep(write_sweep(GOOD.replace("{input_len: 8,", "{input_len: 8, input_len: 9,")))


def test_yaml_nested_too_deep_is_one_line_not_a_recursion_error(write_sweep):
    r = run_cli("plan", str(write_sweep("a: " + "[" * 500 + "]" * 500 + "\n")))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "nested more than 32 levels deep" in r.stderr


def test_lone_surrogates_in_the_sweep_file_are_one_line_each_naming_the_field(write_sweep):
    # YAML's double-quoted "\ud800" reads as half a UTF-16 pair, which no hash, JSON or request
    # can encode: an engine flag's value failed on the trial id's hash, with a traceback.
    path = write_sweep("name: b\nmodels: tiny-llama\nbackends: server\nprecisions: bf16\n"
                       "workload: {mode: serving, request_rate: 1, num_prompts: 2, input_len: 4, output_len: 4}\n"
                       'backend_options: {server: {launch: vllm, args: {served-model-name: "m\\udfff",'
                       ' tokenizer: "\\ud800"}}}\n')
    r = run_cli("plan", str(path))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert r.stderr.strip().splitlines() == [
        f"error: {path}: backend_options.server.args.{flag}: holds a lone surrogate \\{escape} (half of a "
        "UTF-16 pair, no character): not text" for flag, escape in [("served-model-name", "udfff"),
                                                                    ("tokenizer", "ud800")]], r.stderr


def _billion_laughs(levels: int = 9) -> str:
    lines = ["name: lol", "a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("text, problem", [
    (_billion_laughs(), "YAML expands to more than 100,000 values once its aliases (*name) are expanded"),
    ("name: x\nmodels: &m [a, *m]\n", "an alias refers to the node that holds it"),
])
def test_yaml_aliases_that_expand_without_bound_are_one_line_at_once(write_sweep, text, problem):
    path = write_sweep(text)
    # The timeout guards a hang only (an expansion of 9**9 values): the answer takes about a second.
    r = run_cli("plan", str(path), timeout=20)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {path}: ") and problem in lines[0], r.stderr


def test_aliases_within_the_bound_still_load(write_sweep):
    sweep = load_sweep(write_sweep("name: s\nmodels: &m [tiny-llama]\nprecisions: fp32\nbatch_sizes: [1, 2]\n"
                                   "workload: &w {input_len: 8, output_len: 4}\n"
                                   "exclude: [{model: *m, batch_size: 2}]\n"))
    assert sweep.models == ["tiny-llama"] and sweep.batch_sizes == [1, 2]


def test_every_problem_of_a_sweep_file_at_once_one_per_line(write_sweep):
    path = write_sweep("name: b\nmodels: tiny-llama\nprecisions: fp32\nbatch_sizes: [0, 2]\n"
                       "workload: {input_len: -1, output_len: 4}\nmeasure: {min_iters: 0}\ncolour: red\n")
    r = run_cli("plan", str(path))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert [line.split(": ", 3)[2] for line in lines] == [
        # input_len was written as a scalar: it is wrong there, not at an index the file never wrote.
        "batch_sizes[0]", "workload.input_len", "measure.min_iters", "colour"], lines
    assert all(line.startswith(f"error: {path}: ") for line in lines)


SERVED = ("name: s\nmodels: tiny-llama\nprecisions: bf16\nbackends: server\n"
          "workload: {mode: serving, request_rate: 1, num_prompts: 4, input_len: 8, output_len: 4}\n")


def test_every_problem_of_every_option_variant_at_once_each_naming_its_field(write_sweep):
    # client_processes is a count or auto: pydantic names the union's members in the error's
    # location (client_processes.constrained-int) and tells of the first member only.
    path = write_sweep(SERVED + "backend_options:\n  server:\n"
                       "    - {launch: vllm, client_processes: many}\n"
                       "    - {launch: vllm, client_processes: 0, stop_timeout_s: -1, colour: red}\n")
    r = run_cli("plan", str(path))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert lines == [f"error: {path}: {problem}" for problem in [
        "backend_options.server[0].client_processes: Input should be a valid integer, or 'auto'",
        "backend_options.server[1].stop_timeout_s: Input should be greater than 0",
        "backend_options.server[1].client_processes: Input should be greater than or equal to 1, or 'auto'",
        "backend_options.server[1].colour: unknown key"]], r.stderr


def test_a_value_no_member_of_a_union_takes_is_one_line_at_the_union_s_field(write_sweep):
    """A mapping where a launch is an engine's name or {command: [...]}, a word where an output
    length is a number, a list of them, natural or reference: each member's complaint, about the
    value or a part of it, joined on one line naming the field the file wrote."""
    launch = write_sweep(SERVED + "backend_options: {server: {launch: {vllm: 1}}}\n")
    r = run_cli("plan", str(launch))
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        f"error: {launch}: backend_options.server.launch: Input should be 'vllm', 'sglang' or 'transformers'; "
        "or command: required field is missing; or vllm: unknown key"], r.stderr
    length = write_sweep(SERVED.replace("output_len: 4", "output_len: nat"), name="length.yaml")
    r = run_cli("plan", str(length))
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        f"error: {length}: workload.output_len: Input should be a valid integer, or 'natural' or 'reference'"]
    listed = write_sweep(SERVED.replace("output_len: 4", "output_len: [4, nat]"), name="listed.yaml")
    r = run_cli("plan", str(listed))
    [line] = r.stderr.strip().splitlines()
    assert r.returncode == 2 and line.startswith(f"error: {listed}: workload.output_len: [1]: "), line


def test_a_searched_option_s_bad_value_is_told_every_form_it_may_take(write_sweep):
    path = write_sweep(SERVED + "backend_options: {server: {launch: vllm}}\n"
                       "search: {objective: {minimize: energy_per_token_j}, budget: {trials: 4},\n"
                       "         space: {backend_options.server.client_processes: [2, many]}}\n")
    with pytest.raises(SweepFileError) as info:
        load_sweep(path)
    assert str(info.value) == (f"{path}: search.space.backend_options.server.client_processes: 'many': "
                               "Input should be a valid integer, or 'auto'")


def test_a_key_named_like_a_type_stays_in_the_field_it_names():
    # A search range's "int" is a key of the file, though pydantic names an int union member so.
    with pytest.raises(SweepFileError) as info:
        parse_sweep({**MINIMAL, "backends": "noop", "search": {
            "objective": {"minimize": "energy_per_token_j"}, "budget": {"trials": 4},
            "space": {"backend_options.noop.max_batch": {"low": 1, "high": 4, "int": "maybe"}}}})
    assert info.value.problems == (("search.space.backend_options.noop.max_batch.int",
                                    "Input should be a valid boolean, unable to interpret input"),)


def test_a_grid_past_the_limit_is_refused_with_its_size(write_sweep):
    from sweeper.plan.expand import expand

    text = GOOD.replace("batch_sizes: 1", f"batch_sizes: {list(range(1, 1001))}").replace(
        "input_len: 8", f"input_len: {list(range(1, 1002))}")
    with pytest.raises(SweepFileError, match="the grid has 1,001,000 trials, more than the 1,000,000"):
        expand(load_sweep(write_sweep(text)))


@pytest.mark.parametrize(("rule", "message"), [
    ('{batch_size: "8"}', "exclude[0].batch_size: '8' is not a int, so it could never match"),
    ("{precision: 16}", "exclude[0].precision: 16 is not a str"),
    ("{batch_size: [8, true]}", "exclude[0].batch_size: True is not a int"),
])
def test_an_exclude_value_of_the_wrong_type_is_refused(write_sweep, rule, message):
    with pytest.raises(SweepFileError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_sweep(write_sweep(GOOD + f"exclude: [{rule}]\n"))
