"""Conversations replayed turn by turn (``actors.serving.conversations``): on the simulated
engine in virtual time, through the stepped loop and through the asyncio loop against a real
HTTP server: when each next turn goes, what its prompt holds, what a failure ends, and the
trial's per-conversation figures."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

from actors.backends.base import ModelSpec
from actors.backends.noop import NoopBackend
from actors.backends.server.client import Endpoint
from actors.backends.server.fanout import run_http
from actors.serving.conversations import (
    ConversationScript,
    Dialogue,
    HistoryEncoder,
    conversation_figures,
)
from actors.serving.records import ServedRequest, ServedRun
from actors.serving_measure import measure_serving_trial
from actors.telemetry import NullTelemetry
from sweeper.core.datasets import ConversationRecord, ConversationTurn
from sweeper.core.settings import ConversationSettings
from sweeper.plan.expand import expand
from sweeper.plan.spec import parse_sweep
from tests.fake_nvml import FakeClock

CHATS = [
    {"conversations": [{"from": "system", "value": "Be brief."},
                       {"from": "human", "value": "Name a prime between ten and twenty."},
                       {"from": "gpt", "value": "Eleven."},
                       {"from": "human", "value": "And one between twenty and thirty?"},
                       {"from": "gpt", "value": "Twenty-three."},
                       {"from": "human", "value": "Which is larger?"}]},
    {"conversations": [{"role": "user", "content": "What colour is a clear sky?"},
                       {"role": "assistant", "content": "Blue."},
                       {"role": "user", "content": "Why is it that colour rather than violet?"}]},
]


def record(*users: str, replies: tuple[str | None, ...] = ()) -> ConversationRecord:
    replies = replies or (None,) * len(users)
    return ConversationRecord(tuple(ConversationTurn(u, r) for u, r in zip(users, replies, strict=True)))


def script(records, offsets, *, gap_s=0.0, history="model", out=4) -> ConversationScript:
    dialogues = [Dialogue(r, (out,) * len(r.turns)) for r in records]
    return ConversationScript(dialogues, offsets, HistoryEncoder(None, False, 1000, 0),
                              ConversationSettings(turn_gap_s=gap_s, history=history), stop_at_eos=False)


def noop_backend(**options) -> tuple[NoopBackend, FakeClock]:
    backend, clock = NoopBackend(), FakeClock(100.0)
    backend.clock, backend.sleep = clock, clock.sleep
    sweep = parse_sweep({"name": "c", "models": "tiny-llama", "backends": "noop", "precisions": "fp32",
                         "backend_options": {"noop": {"step_s": 0.01, "prefill_s": 0.02, **options}},
                         "workload": {"mode": "serving", "input_len": 8, "output_len": 4, "request_rate": 1,
                                      "num_prompts": 1}})
    backend.load(ModelSpec("synthetic", "tiny-llama", "fp32", expand(sweep)[0][0].backend_options, serving=True))
    return backend, clock


def test_each_next_turn_goes_its_gap_after_the_reply_before_it_with_the_history_so_far():
    s = script([record("one two three four five six", "seven eight nine", "ten eleven"),
                record("twelve thirteen")], [0.0, 0.05], gap_s=0.5)
    backend, _ = noop_backend()
    run = backend.serve(s.first, max_concurrency=None, deadline_s=1e9, follow=s.next_turn)
    t0 = run.t_start_s
    assert [r.index for r in run.requests] == [0, 1, 2, 3]  # conversation 0's turns 0-2, then conversation 1
    assert [s.turn_of(r.index) for r in run.requests] == [(0, 0), (0, 1), (0, 2), (1, 0)]
    assert all(r.ok for r in run.requests)
    first, second, third, other = run.requests
    # The next turn arrives exactly turn_gap_s after the reply before it ended, and goes then.
    assert second.arrival_s == pytest.approx(first.finish_s + 0.5)
    assert third.arrival_s == pytest.approx(second.finish_s + 0.5)
    assert second.send_lateness_s == pytest.approx(0.0, abs=1e-9)
    assert other.arrival_s - t0 == pytest.approx(0.05)
    # Each prompt holds the one before it and its reply: it only grows.
    assert first.prompt_tokens < second.prompt_tokens < third.prompt_tokens
    assert second.prompt_tokens >= first.prompt_tokens + first.output_tokens


def test_a_model_history_holds_the_replies_and_a_reference_history_the_files():
    rec = record("alpha beta gamma delta", "epsilon zeta", replies=("the file's own reply here", None))
    model = script([rec], [0.0])
    first = model.first[0]
    reply = ServedRequest(first.index, first.prompt_tokens, 0.0, 0.0, 0.0, (1.0, 1.1, 1.2), 1.2,
                          reply_ids=(11, 12, 13))
    nxt = model.next_turn(reply, t0_s=0.0)
    assert nxt is not None and nxt.turn == 1 and nxt.conversation_id == 0 and nxt.arrival_offset_s == 1.2
    # The prompt is the first prompt, the reply's own ids, then the new user turn.
    assert np.array_equal(nxt.prompt_ids[:first.prompt_tokens], first.prompt_ids)
    assert list(nxt.prompt_ids[first.prompt_tokens:first.prompt_tokens + 3]) == [11, 12, 13]
    assert [role for role, _ in nxt.messages] == ["user", "assistant", "user"]
    assert first.keeps_reply and not nxt.keeps_reply  # the last turn's reply is never needed
    reference = script([rec], [0.0], history="reference")
    nxt_ref = reference.next_turn(reply, t0_s=0.0)
    assert nxt_ref.messages[1] == ("assistant", "the file's own reply here")
    assert not reference.first[0].keeps_reply


def test_a_failed_turn_ends_its_conversation_and_the_others_go_on():
    s = script([record("a b c d", "e f g h"), record("i j k l", "m n o p")], [0.0, 0.0])
    failed = ServedRequest(0, 4, 0.0, 0.0, None, (), None, error="HTTP 500: boom")
    assert s.next_turn(failed, 0.0) is None
    ok = ServedRequest(2, 4, 0.0, 0.0, None, (0.1,), 0.1)
    assert s.next_turn(ok, 0.0).index == 3
    run = ServedRun(0.0, 1.0, (failed, ok, ServedRequest(3, 9, 0.2, 0.2, None, (0.3, 0.4), 0.4)))
    figures = conversation_figures(run, s, [5.0, 1.0, 2.0])
    assert figures.n_conversations == 2 and figures.conversations_completed == 1
    assert figures.energy_per_conversation_j == pytest.approx(3.0)
    assert figures.first_turn_energy_j == pytest.approx(1.0)  # the failed first turn is left out
    assert figures.last_turn_energy_j == pytest.approx(2.0)
    assert figures.conversation_s == pytest.approx(0.4)


def _sweep(path: Path, **workload) -> dict:
    return {"name": "conv", "models": "tiny-llama", "backends": "noop", "precisions": "fp32",
            "backend_options": {"noop": {"step_s": 0.01, "prefill_s": 0.02, "prefix_block": 4}},
            "workload": {"mode": "serving", "dataset": str(path), "conversations": True, "output_len": 4,
                         "request_rate": 2, "num_prompts": 6, **workload},
            "measure": {"idle_s": 0, "min_window_s": 0.2}}


def test_a_trial_records_every_turn_and_its_conversation_figures(tmp_path):
    path = tmp_path / "chats.json"
    path.write_text(json.dumps(CHATS))
    trial = expand(parse_sweep(_sweep(path, turn_gap_s=0.25)))[0][0]
    assert trial.columns()["conversations"] is True and trial.columns()["turn_gap_s"] == 0.25
    assert "(conversations, gap 0.25 s)" in trial.label()
    backend, clock = noop_backend(prefix_block=4)
    load = backend.load(ModelSpec("synthetic", "tiny-llama", "fp32", trial.backend_options, serving=True))
    measured = measure_serving_trial(backend, trial, load, NullTelemetry(reason="test"), clock=clock)
    row, rows = measured.row, measured.requests
    turns = sorted((r.conversation_id, r.turn) for r in rows)
    # 6 conversations of the two in the file (cycled): 3 and 2 user turns.
    assert len({c for c, _ in turns}) == 6 and len(rows) == 3 * 3 + 3 * 2
    assert row["n_conversations"] == 6 and row["conversations_completed"] == 6
    assert row["turns_per_conversation"] == pytest.approx(2.5)
    by_turn = {}
    for r in rows:
        by_turn.setdefault(r.turn, []).append(r.input_len)
    assert min(by_turn[1]) > max(by_turn[0]) or np.mean(by_turn[1]) > np.mean(by_turn[0])
    # Later turns resend their history: the simulated prefix cache holds it.
    later = [r for r in rows if r.turn > 0]
    assert all(r.cached_tokens > 0 for r in later)
    assert row["prefix_cache_hit_rate"] > 0
    assert row["last_turn_ttft_s"] is not None and row["conversation_s"] > 0.25
    # Offered: every turn over the span of the sends, which runs past the first turns' schedule.
    last_send_s = max(r.arrival_s for r in rows)
    assert last_send_s > max(r.arrival_s for r in rows if r.turn == 0)
    assert row["offered_rate_req_s"] == pytest.approx(len(rows) / last_send_s, rel=1e-6)


def test_a_conversation_cut_at_the_models_context_says_so(tmp_path):
    """A context of 30 positions holds the 2-turn conversation whole (26 with its replies) and
    the 3-turn one to its second turn (34 with the third): that one is cut, and said to be."""
    from actors.workload import prompt_source

    path = tmp_path / "chats.json"
    path.write_text(json.dumps(CHATS))
    trial = expand(parse_sweep(_sweep(path)))[0][0]
    backend, clock = noop_backend(prefix_block=4)
    load = backend.load(ModelSpec("synthetic", "tiny-llama", "fp32", trial.backend_options, serving=True))
    source = prompt_source(trial, load.vocab_size, max_positions=30)
    row = measure_serving_trial(backend, trial, load, NullTelemetry(reason="test"), clock=clock, source=source).row
    assert row["n_conversations"] == 6 and row["conversations_cut"] == 3
    assert row["conversations_completed"] == 6 and row["turns_per_conversation"] == pytest.approx(2.0)


@pytest.mark.parametrize("bad, field", [
    ({"turn_gap_s": 1.0, "conversations": None}, "turn_gap_s"),
    ({"history": "reference", "conversations": False}, "history"),
    ({"dataset": "random", "input_len": 8}, "conversations"),
    ({"history": "theirs"}, "workload.history"),
    ({"turn_gap_s": -1}, "workload.turn_gap_s"),
])
def test_bad_conversation_settings_name_their_field(tmp_path, bad, field):
    from sweeper.core.errors import SweepFileError

    path = tmp_path / "chats.json"
    path.write_text(json.dumps(CHATS))
    data = _sweep(path)
    data["workload"].update(bad)
    data["workload"] = {k: v for k, v in data["workload"].items() if v is not None}
    with pytest.raises(SweepFileError) as info:
        expand(parse_sweep(data))
    assert len(info.value.problems) == 1 and field in str(info.value)


def test_an_option_conversations_do_not_use_is_refused_rather_than_setting_trials_apart(tmp_path):
    from sweeper.core.errors import SweepFileError

    path = tmp_path / "chats.json"
    path.write_text(json.dumps(CHATS))
    data = {**_sweep(path), "backends": "server", "precisions": "fp32",
            "backend_options": {"server": [{"launch": "vllm"}, {"launch": "vllm", "client_processes": 4}]}}
    with pytest.raises(SweepFileError) as info:
        parse_sweep(data)
    assert list(info.value.problems) == [(
        "backend_options.server[1].client_processes", "not used by conversations (each turn is sent from one "
        "process, built from the reply before it): leave it out")]


def test_conversations_need_serving_mode(tmp_path):
    from sweeper.core.errors import SweepFileError

    path = tmp_path / "chats.json"
    path.write_text(json.dumps(CHATS))
    with pytest.raises(SweepFileError, match="conversations: .*mode: serving"):
        parse_sweep({"name": "c", "models": "tiny-llama", "backends": "noop", "precisions": "fp32",
                     "batch_sizes": 1, "workload": {"dataset": str(path), "conversations": True, "output_len": 4}})


@pytest.mark.parametrize("text, message", [
    ('[{"conversations": [{"from": "human", "value": "a"}, {"from": "gpt", "value": "b"}, {"from": "gpt", "value": "c"}]}]',
     "answers no user turn"),
    ('[{"conversations": [{"from": "gpt", "value": "a"}]}]', "answers no user turn"),
    ('[{"conversations": [{"from": "robot", "value": "a"}]}]', "unknown role"),
    ('[{"conversations": [{"from": "human", "value": "a"}, {"from": "system", "value": "b"}]}]', "system message"),
])
def test_a_malformed_conversation_file_is_one_line_naming_its_record(tmp_path, text, message):
    from sweeper.core.errors import SweepFileError

    path = tmp_path / "chats.json"
    path.write_text(text)
    with pytest.raises(SweepFileError) as info:
        expand(parse_sweep(_sweep(path)))
    assert message in str(info.value) and "record 1" in str(info.value) and "\n" not in str(info.value)


def test_a_reference_history_needs_the_files_replies(tmp_path):
    from sweeper.core.errors import SweepFileError

    path = tmp_path / "users.json"
    path.write_text('[{"conversations": [{"from": "human", "value": "a b"}, {"from": "human", "value": "c d"}]}]')
    assert expand(parse_sweep(_sweep(path)))[0][0].prompts.records == 1  # the model's own replies: fine
    with pytest.raises(SweepFileError, match="workload.history: .*record 1.*history: reference"):
        expand(parse_sweep(_sweep(path, history="reference")))


def test_a_jsonl_file_of_conversations_reads_as_its_sharegpt_twin(tmp_path):
    from sweeper.core.datasets import read_conversations

    jsonl = tmp_path / "chats.jsonl"
    jsonl.write_text("\n".join(json.dumps(c) for c in CHATS))
    twin = tmp_path / "chats.json"
    twin.write_text(json.dumps(CHATS))
    assert read_conversations(jsonl) == read_conversations(twin)
    first = read_conversations(twin)[0]
    assert first.system == "Be brief." and [t.reference for t in first.turns] == ["Eleven.", "Twenty-three.", None]


def test_an_http_client_sends_each_turn_with_the_replies_it_streamed(tmp_path):
    from tests.actors.backends.test_server_backend import launch, read_pids, wait_gone

    log = tmp_path / "bodies.jsonl"
    proc = launch(tmp_path, "--pid-file", str(tmp_path / "pids"), "--log-requests", str(log))
    try:
        proc.wait_ready(30.0)
        s = script([record("how are you today", "and tomorrow", "and after")], [0.0], gap_s=0.05, out=3)

        def body(r):
            return {"model": "fault", "stream": True, "max_tokens": r.output_len, "min_tokens": r.output_len,
                    "messages": [{"role": role, "content": c} for role, c in r.messages]}

        endpoint = Endpoint(url=f"{proc.base_url}/chat/completions", body=body, continuous_usage=False)
        run = run_http(endpoint, s.first, max_concurrency=None, deadline_s=time.monotonic() + 30, follow=s.next_turn)
    finally:
        proc.stop(2.0)
    assert wait_gone(read_pids(tmp_path / "pids", 1)) == []
    assert [r.ok for r in run.requests] == [True, True, True], [r.error for r in run.requests]
    assert run.requests[1].arrival_s == pytest.approx(run.requests[0].finish_s + 0.05)
    sent = [json.loads(line) for line in log.read_text().splitlines()]
    chats = [b["messages"] for b in sent if "messages" in b]
    assert [len(m) for m in chats] == [1, 3, 5]
    # The assistant turns are the text the server streamed back, chunk for chunk.
    assert chats[2][1] == {"role": "assistant", "content": "w0w1w2"}
    assert chats[2][3] == {"role": "assistant", "content": "w0w1w2"} and chats[2][4]["content"] == "and after"


def test_a_sample_larger_than_the_file_is_warned_of(tmp_path):
    from sweeper.plan.expand import make_plan

    path = tmp_path / "chats.json"
    path.write_text(json.dumps(CHATS))
    warned = make_plan(parse_sweep(_sweep(path, num_prompts=6)), device="cpu").warnings
    assert any("6 conversations from 2" in w and "num_prompts" in w for w in warned)
    assert not any("conversations from" in w for w in make_plan(parse_sweep(_sweep(path, num_prompts=2)),
                                                                device="cpu").warnings)
