"""Scoring in the sweep file and the plan: the arithmetic task, answers required, bad input on
one line with exit 2, identity."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from sweeper.core.arithmetic import ArithmeticSettings, arithmetic_records
from sweeper.core.errors import SweepFileError
from sweeper.plan.expand import expand, make_plan
from sweeper.plan.spec import parse_sweep
from tests.conftest import run_cli

SCORED = {"output_len": "natural", "max_output_len": 16}


def sweep(workload: dict, **top) -> dict:
    return {"name": "s", "models": "smollm2-135m", "backends": "transformers", "precisions": "fp32",
            "batch_sizes": 2, "workload": workload, **top}


_START = re.compile(r"^(\w+) has (\d+) (\w+)\.$")
_STEPS = [(re.compile(r"^Then \w+ buys (\d+) more\.$"), lambda v, b: v + b),
          (re.compile(r"^Then \w+ gives away (\d+)\.$"), lambda v, b: v - b),
          (re.compile(r"^Then \w+ gets more until \w+ has (\d+) times as many\.$"), lambda v, b: v * b),
          (re.compile(r"^Then \w+ shares them equally among (\d+) friends and keeps one share\.$"),
           lambda v, b: v / b)]


def solve(problem: str) -> tuple[float, int]:
    """A problem's answer worked out from its words alone, and its steps."""
    sentences = re.split(r"(?<=\.) (?=[A-Z])", problem.split(" How many")[0])
    value = float(_START.match(sentences[0]).group(2))
    for sentence in sentences[1:]:
        pattern, op = next((p, op) for p, op in _STEPS if p.match(sentence))
        value = op(value, int(pattern.match(sentence).group(1)))
    return value, len(sentences) - 1


@pytest.mark.parametrize("difficulty", [1, 2, 3])
def test_arithmetic_problems_have_exact_whole_answers_and_their_difficulty_s_steps(difficulty):
    records = arithmetic_records(ArithmeticSettings(size=200, difficulty=difficulty, seed=7))
    assert len(records) == 200 and len({r.prompt for r in records}) > 150
    for r in records:
        value, steps = solve(r.prompt)
        assert value == int(r.answer) >= 0 and steps == difficulty, r.prompt
        assert r.prompt.endswith("Reply with the final number only.")
    assert records == arithmetic_records(ArithmeticSettings(size=200, difficulty=difficulty, seed=7))
    assert records != arithmetic_records(ArithmeticSettings(size=200, difficulty=difficulty, seed=8))


def test_a_task_is_named_alone_or_with_its_settings_and_joins_the_trial_s_identity():
    default = expand(parse_sweep(sweep({"dataset": "arithmetic", **SCORED}, scoring="numeric")))[0][0]
    sized = expand(parse_sweep(sweep({"dataset": {"arithmetic": {"size": 20, "difficulty": 2}}, **SCORED},
                                     scoring="numeric")))[0][0]
    assert default.prompts.records == 100 and sized.prompts.records == 20
    assert json.loads(sized.prompts.task) == {"arithmetic": {"size": 20, "difficulty": 2, "seed": 0}}
    assert default.dataset == sized.dataset == "arithmetic" and default.trial_id != sized.trial_id
    assert default.configuration().scoring == '{"method":"numeric"}'
    unscored = expand(parse_sweep(sweep({"dataset": "arithmetic", **SCORED})))[0][0]
    assert unscored.scoring is None and unscored.trial_id != default.trial_id
    assert "scoring" not in unscored.identity()
    tolerant = expand(parse_sweep(sweep({"dataset": "arithmetic", **SCORED},
                                        scoring={"method": "numeric", "tolerance": 0.5})))[0][0]
    assert tolerant.trial_id != default.trial_id


def test_the_plan_says_replies_are_scored_greedily_and_skips_a_backend_that_runs_no_model():
    plan = make_plan(parse_sweep(sweep({"dataset": "arithmetic", **SCORED}, scoring="numeric")), "cpu")
    assert any("numeric (tolerance 1e-06)" in n and "greedily (temperature 0)" in n for n in plan.notes), plan.notes
    noop = make_plan(parse_sweep(sweep({"dataset": "arithmetic", **SCORED}, scoring="numeric", backends="noop",
                                       precisions="bf16")), "cpu")
    assert noop.runnable == [] and "runs no model" in noop.skipped[0].skip_reason


@pytest.mark.parametrize(("workload", "top", "field", "problem"), [
    ({"input_len": 8, "output_len": 4}, {}, "scoring", "random prompts have none"),
    ({"dataset": "arithmetic", "output_len": 8}, {}, "scoring", "set workload.output_len: natural"),
    ({"dataset": {"arithmetic": {"difficulty": 9}}, **SCORED}, {}, "workload.dataset",
     "arithmetic.difficulty: Input should be less than or equal to 3"),
    ({"dataset": {"arithmetic": {"sizes": 9}}, **SCORED}, {}, "workload.dataset", "arithmetic.sizes"),
    ({"dataset": "arithmetic", **SCORED}, {"scoring": {"method": "regex"}}, "scoring",
     "pattern: required by method regex"),
    ({"dataset": "arithmetic", **SCORED}, {"scoring": "fuzzy"}, "scoring.method", "unknown scoring method 'fuzzy'"),
])
def test_bad_scoring_input_names_its_field(workload, top, field, problem):
    with pytest.raises(SweepFileError) as err:
        expand(parse_sweep(sweep(workload, **{"scoring": "numeric", **top})))
    message = str(err.value)
    assert message.startswith(f"<sweep>: {field}: ") and problem in message and "\n" not in message, message


def _chats(tmp_path, *conversations) -> dict:
    (tmp_path / "c.jsonl").write_text("".join(json.dumps({"conversations": c}) + "\n" for c in conversations))
    return {**sweep({"mode": "serving", "dataset": "c.jsonl", "conversations": True, "request_rate": 1,
                     "num_prompts": 2, **SCORED}, scoring="numeric"), "batch_sizes": None}


def test_a_scored_conversation_file_needs_an_answered_turn_in_every_conversation(tmp_path):
    asked = [{"role": "user", "content": "2 + 2?", "answer": 4}, {"role": "user", "content": "and 3 + 3?"}]
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(_chats(tmp_path, asked, [{"role": "user", "content": "hi"}])))
    proc = run_cli("plan", str(tmp_path / "s.yaml"))
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        f"error: {tmp_path / 's.yaml'}: workload.dataset: {tmp_path / 'c.jsonl'} record 2 field "
        "'conversations.answer': has no turn with an answer, which scoring: numeric judges replies against "
        "(give a user turn an \"answer\")"], proc.stderr
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(_chats(tmp_path, asked)))
    assert run_cli("plan", str(tmp_path / "s.yaml")).returncode == 0  # turns without one are sent, not judged


@pytest.mark.parametrize(("answer", "problem"), [
    ([4], "a turn's answer is a text or a number"), ("  ", "a turn's answer is a text or a number"),
    (True, "a turn's answer is a text or a number")])
def test_a_turn_s_bad_answer_names_the_record_and_field(tmp_path, answer, problem):
    data = _chats(tmp_path, [{"role": "user", "content": "2 + 2?", "answer": answer}])
    with pytest.raises(SweepFileError) as err:
        expand(parse_sweep(data), sweep_path=str(tmp_path / "s.yaml"))
    assert "record 1 field 'conversations.answer': " + problem in str(err.value)


def test_conversations_are_not_scored_by_likelihood(tmp_path):
    data = _chats(tmp_path, [{"role": "user", "content": "2 + 2?", "answer": 4}])
    with pytest.raises(SweepFileError, match="scoring.likelihood: scores a prompt's choices"):
        parse_sweep({**data, "scoring": {"method": "choice", "likelihood": True}})


def test_a_prompt_file_without_answers_under_scoring_is_one_line_naming_the_file_and_field_with_exit_2(tmp_path):
    data = tmp_path / "p.jsonl"
    data.write_text('{"prompt": "2 + 2?", "answer": "4"}\n{"prompt": "no answer here"}\n')
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(sweep({"dataset": "p.jsonl", **SCORED}, scoring="numeric")))
    proc = run_cli("plan", str(tmp_path / "s.yaml"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"error: {tmp_path / 's.yaml'}: workload.dataset: {data} record 2 field 'answer': "
                               "has no reference answer"), lines[0]
    # The same file unscored plans: answers are only needed to score.
    (tmp_path / "u.yaml").write_text(yaml.safe_dump(sweep({"dataset": "p.jsonl", **SCORED})))
    assert run_cli("plan", str(tmp_path / "u.yaml")).returncode == 0


def test_likelihood_scoring_of_a_file_with_a_question_without_choices_names_the_record(tmp_path):
    data = tmp_path / "mc.jsonl"
    data.write_text('{"question": "Red?", "choices": ["yes", "no"], "answer": "A"}\n'
                    '{"question": "2 + 2?", "answer": "4"}\n')
    scoring = {"method": "choice", "likelihood": True}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(sweep({"dataset": "mc.jsonl", **SCORED}, scoring=scoring)))
    proc = run_cli("plan", str(tmp_path / "s.yaml"))
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        f"error: {tmp_path / 's.yaml'}: workload.dataset: {data} record 2 field 'choices': has no choices, which "
        "scoring.likelihood scores by (give each record \"choices\")"], proc.stderr
    # The bundled multiple-choice task has choices throughout; the plan says how it is scored.
    plan = make_plan(parse_sweep(sweep({"dataset": "choices", **SCORED}, scoring=scoring)), "cpu")
    assert any("choice (and by each choice's likelihood)" in note for note in plan.notes), plan.notes


def test_the_bundled_choices_are_dealt_from_their_seed_with_the_right_letter_anywhere():
    from collections import Counter

    from sweeper.core.choices import QUESTIONS, ChoicesSettings, choice_records
    from sweeper.core.scoring import Reference, ScoringSettings, judge

    records = choice_records(ChoicesSettings())
    assert len(records) == QUESTIONS and len({r.prompt.split("\n")[0] for r in records}) == QUESTIONS
    assert records == choice_records(ChoicesSettings()) and records != choice_records(ChoicesSettings(seed=1))
    # Dealt: every letter is the right one for some questions, none for most of them (the file's
    # own letters lean on B and C: always answering one letter must not pay).
    letters = Counter(r.answer for r in records)
    assert set(letters) == set("ABCD") and max(letters.values()) <= QUESTIONS // 2
    choice = ScoringSettings.model_validate({"method": "choice"})
    for r in records:
        assert r.prompt.endswith("Answer:") and len(r.choices) == 4
        right = r.choices["ABCD".index(r.answer)]
        # The scorer reads the dealt letter, or the right choice's text, as right.
        assert judge(f"{r.answer}. {right}", Reference(r.answer, r.choices), choice, cut=False).correct
        assert judge(f"The answer is {right}.", Reference(r.answer, r.choices), choice, cut=False).correct
    assert len(choice_records(ChoicesSettings(size=5, seed=3))) == 5


def test_the_choices_task_is_a_dataset_a_sweep_can_score(write_sweep):
    trial = expand(parse_sweep(sweep({"dataset": {"choices": {"size": 10}}, **SCORED}, scoring="choice")))[0][0]
    assert json.loads(trial.prompts.task) == {"choices": {"size": 10, "seed": 0}}
    r = run_cli("plan", str(write_sweep(yaml.safe_dump(sweep({"dataset": {"choices": {"size": 41}}, **SCORED},
                                                             scoring="choice")))))
    assert r.returncode == 2 and "workload.dataset: choices.size: Input should be less than or equal to 40" in r.stderr
