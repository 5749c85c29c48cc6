"""Scored trials end to end: replies whose correctness is known exactly (an OpenAI-compatible
server that answers a known share of the arithmetic task right, serving mode), and the bundled
real model scoring the task offline (any accuracy: its columns must agree with each other)."""

from __future__ import annotations

import json

import pytest

from sweeper.core.arithmetic import ArithmeticSettings, arithmetic_records
from sweeper.core.scoring import wilson_interval
from tests.actors.backends.test_server_backend import READY_S, launch, run_one_trial

TASK = {"size": 8, "difficulty": 2, "seed": 3}


def scored_through_server(tmp_path, answers, workload: dict, *server_args: str) -> tuple[dict, list[dict]]:
    """One scored serving trial through the fault server, which answers the prompts of
    ``answers`` (every third one wrong) and judged by ``numeric``: its row and request rows."""
    server = launch(tmp_path, "--answers", str(answers), "--wrong-every", "3", *server_args)
    try:
        server.wait_ready(READY_S)
        outcome = run_one_trial({
            "name": "scored", "models": ["smollm2-135m"], "backends": "server", "precisions": "bf16",
            "backend_options": {"server": {"base_url": server.base_url, "model": "fault", "dialect": "openai"}},
            "workload": {"mode": "serving", "output_len": "natural", "max_output_len": 12, "request_rate": 50,
                         **workload},
            "scoring": "numeric",
            "measure": {"warmup_iters": 1, "idle_s": 0.3, "min_window_s": 0.05},
        }, "cpu")
    finally:
        server.stop(2.0)
    row = outcome.row
    assert row["status"] == "ok", row.get("error")
    return row, outcome.tables["requests"].to_pylist()


def test_a_served_trial_s_accuracy_is_the_share_the_server_answered_right(tmp_path, smollm2_dir):
    """Of the task's 8 problems the server answers 2 wrong (records 3 and 6: the answer + 1) and
    rambles on 2 until the output length cuts them (records 4 and 8): 4 right, 2 truncated."""
    records = arithmetic_records(ArithmeticSettings(**TASK))
    assert len({r.prompt for r in records}) == len(records)
    answers = tmp_path / "answers.jsonl"
    answers.write_text("".join(json.dumps({"prompt": r.prompt, "answer": r.answer}) + "\n" for r in records))
    row, requests = scored_through_server(tmp_path, answers, {"dataset": {"arithmetic": TASK}, "num_prompts": 8},
                                          "--ramble-every", "4")
    assert (row["n_scored"], row["n_correct"], row["n_truncated"]) == (8, 4, 2)
    assert row["accuracy"] == 0.5
    assert (row["accuracy_ci95_low"], row["accuracy_ci95_high"]) == pytest.approx(wilson_interval(4, 8))
    assert row["energy_per_correct_j"] is None and row["correct_per_kj"] is None  # no GPU metered
    by_answer = {r.prompt: r.answer for r in records}
    assert len(requests) == 8 and all(r["correct"] is not None for r in requests)
    truncated = [r for r in requests if r["truncated"]]
    assert len(truncated) == 2 and all(r["output_tokens"] == 12 and not r["correct"] for r in truncated)
    wrong = [r for r in requests if not r["correct"] and not r["truncated"]]
    assert len(wrong) == 2 and all(r["extracted_answer"] is not None for r in wrong)
    right = [r for r in requests if r["correct"]]
    # Each row keeps the reply it was judged on: the extracted answer is read from it.
    assert all(r["reply"] and r["extracted_answer"] in r["reply"] for r in right + wrong)
    assert sorted(r["extracted_answer"] for r in right) == sorted(
        a for i, a in enumerate(by_answer.values(), 1) if i % 3 and i % 4)


@pytest.mark.slow
@pytest.mark.xdist_group("bundled-model")
def test_the_bundled_model_scores_the_bundled_task_offline(smollm2_dir):
    """The real model on the CPU, offline: whatever it answers, every measured reply is judged and
    the trial's columns agree with its requests'."""
    from tests.actors.backends.test_server_backend import plan_one, run_trial

    trial = plan_one({
        "name": "bundled-scored", "models": ["smollm2-135m"], "backends": "transformers", "precisions": "fp32",
        "batch_sizes": 4, "workload": {"dataset": {"arithmetic": {"size": 8, "seed": 1}}, "chat": True,
                                       "output_len": "natural", "max_output_len": 12},
        "scoring": "numeric",
        "measure": {"warmup_iters": 0, "idle_s": 0, "min_iters": 2, "min_duration_s": 0, "min_window_s": 0},
    }, "cpu")
    outcome = run_trial(trial)
    row, requests = outcome.row, outcome.tables["requests"].to_pylist()
    assert row["status"] == "ok", row.get("error")
    assert row["n_scored"] == row["n_requests"] == len(requests) >= 8
    assert 0.0 <= row["accuracy"] <= 1.0
    assert row["accuracy_ci95_low"] <= row["accuracy"] <= row["accuracy_ci95_high"]
    assert row["n_correct"] == sum(r["correct"] for r in requests)
    assert row["n_truncated"] == sum(r["truncated"] for r in requests)
    assert all(r["truncated"] == (r["output_tokens"] >= 12) for r in requests)
    assert not any(r["correct"] and r["truncated"] for r in requests)
    # The replies were read (a backend that returned no reply ids would leave every one empty): of
    # 8+ replies to "Reply with the final number only.", some hold a number, right or wrong.
    assert any(r["extracted_answer"] is not None for r in requests)
    assert row["energy_per_correct_j"] is None and row["correct_per_kj"] is None  # the CPU: no GPU energy


@pytest.mark.slow
@pytest.mark.xdist_group("bundled-model")
def test_the_bundled_model_scores_multiple_choice_by_each_choice_s_likelihood(smollm2_dir):
    """``likelihood: true``: each question's likeliest choice after its prompt, worked out here
    again with the model's own forward pass (all positions, log-softmax in float64) from the
    prompts the trial sent; the two agree up to a near tie, and the generated letters are still
    judged beside them."""
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from actors.quality.likelihood import questions
    from actors.workload import prompt_source
    from sweeper.core.datasets import LETTERS
    from tests.actors.backends.test_server_backend import plan_one, run_trial

    trial = plan_one({
        "name": "bundled-likelihood", "models": ["smollm2-135m"], "backends": "transformers", "precisions": "fp32",
        "batch_sizes": 6, "workload": {"dataset": {"choices": {"size": 6, "seed": 2}}, "chat": True,
                                       "output_len": "natural", "max_output_len": 4},
        "scoring": {"method": "choice", "likelihood": True},
        "measure": {"warmup_iters": 0, "idle_s": 0, "min_iters": 1, "min_duration_s": 0, "min_window_s": 0},
    }, "cpu")
    row = run_trial(trial).row
    assert row["status"] == "ok", row.get("error")
    assert row["likelihood_status"] == "ok" and row["likelihood_n_scored"] == 6
    assert row["n_scored"] == 6  # the generated letters, judged as ever

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, torch_dtype=torch.float32).eval()
    asked = questions(prompt_source(trial, model.config.vocab_size, tokenizer=tokenizer))
    assert len(asked) == 6
    right, margins = 0, []
    for prompt in asked:
        sums = []
        for text in prompt.reference.choices:
            cont = tokenizer(text, add_special_tokens=False)["input_ids"]
            ids = torch.tensor([list(prompt.ids) + cont])
            with torch.inference_mode():
                logp = torch.log_softmax(model(ids).logits[0].double(), dim=-1)
            sums.append(sum(float(logp[len(prompt.ids) - 1 + j, t]) for j, t in enumerate(cont)))
        right += LETTERS[int(np.argmax(sums))] == prompt.reference.answer
        ordered = sorted(sums, reverse=True)
        margins.append(ordered[0] - ordered[1])
    near_ties = sum(m < 1e-3 for m in margins)  # where another build's rounding may pick the other
    assert abs(row["likelihood_accuracy"] * 6 - right) <= near_ties, (row["likelihood_accuracy"], right, margins)
    assert row["likelihood_accuracy_ci95_low"] <= row["likelihood_accuracy"] <= row["likelihood_accuracy_ci95_high"]
    assert 0.0 <= row["likelihood_accuracy_norm"] <= 1.0


def test_a_conversation_s_answered_turns_are_judged_on_the_replies_given_there(tmp_path, smollm2_dir):
    """Three conversations of two arithmetic turns each, every user turn with its answer, one
    closing with a turn that has none: the server answers every third problem of its answer file
    wrong, so 4 of the 6 answered turns are right; the unanswered turn is sent and not judged."""
    records = arithmetic_records(ArithmeticSettings(size=6, difficulty=1, seed=5))
    assert len({r.prompt for r in records}) == 6
    answers = tmp_path / "answers.jsonl"
    answers.write_text("".join(json.dumps({"prompt": r.prompt, "answer": r.answer}) + "\n" for r in records))
    turns = [[{"role": "user", "content": r.prompt, "answer": r.answer} for r in records[i:i + 2]]
             for i in (0, 2, 4)]
    turns[2].append({"role": "user", "content": "Thank you!"})
    chats = tmp_path / "chats.jsonl"
    chats.write_text("".join(json.dumps({"conversations": t}) + "\n" for t in turns))
    row, requests = scored_through_server(tmp_path, answers, {"dataset": str(chats), "conversations": True,
                                                             "chat": True, "turn_gap_s": 0.0, "num_prompts": 3})
    assert row["conversations_completed"] == 3 and len(requests) == 7
    assert (row["n_scored"], row["n_correct"], row["n_truncated"]) == (6, 4, 0)
    # Each judged turn by what its reply said: the file's answer, or (records 3 and 6) one more.
    said = sorted((r["correct"], r["extracted_answer"]) for r in requests if r["correct"] is not None)
    assert said == sorted([(True, str(records[i].answer)) for i in (0, 1, 3, 4)]
                          + [(False, str(int(records[i].answer) + 1)) for i in (2, 5)])
    unjudged = [r for r in requests if r["correct"] is None]
    assert [r["turn"] for r in unjudged] == [2]  # "Thank you!" has no answer: sent, not judged
