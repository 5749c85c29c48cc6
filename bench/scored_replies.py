"""Replies and their verdicts side by side, for a reader to check the scorer against.

Generates greedy replies of the bundled model (transformers, the chat template, as a scored
sweep sends them) to the first ``--size`` problems of sweeper's arithmetic task and judges
each with the sweep's scorer (``sweeper.core.scoring.judge``), writing per problem: the
question, the reference answer, the reply, what the scorer read out of it, and its verdict
(``correct``, ``truncated``). A reader goes through the record and lists every verdict they
would give otherwise: that is the scorer's error, and the rule to fix.

    python3 -m bench scored-replies --size 50 --out scored_replies.json
"""

from __future__ import annotations

import argparse
from typing import Any

from bench.benchkit import write_record


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="smollm2-135m", help="a bundled real model")
    parser.add_argument("--size", type=int, default=50, help="problems, the task's first ones")
    parser.add_argument("--difficulty", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-output-len", type=int, default=64, help="the reply's cap (a cut reply is wrong)")
    parser.add_argument("--scoring", default="numeric", help="the scoring method (exact, numeric, regex, choice)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", required=True)


def run(args: argparse.Namespace) -> int:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from actors.models import materialize_bundled
    from sweeper.core.arithmetic import ArithmeticSettings, arithmetic_records
    from sweeper.core.scoring import Reference, ScoringSettings, judge

    path = materialize_bundled(args.model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(args.device).eval()
    settings = ScoringSettings.model_validate({"method": args.scoring})
    records = arithmetic_records(ArithmeticSettings(size=args.size, difficulty=args.difficulty, seed=args.seed))
    rows: list[dict[str, Any]] = []
    for record in records:
        chat: Any = tokenizer.apply_chat_template([{"role": "user", "content": record.prompt}],
                                                  add_generation_prompt=True, return_tensors="pt", return_dict=True)
        inputs = {k: v.to(args.device) for k, v in chat.items()}
        with torch.no_grad():
            out = model.generate(**inputs, max_new_tokens=args.max_output_len, do_sample=False)
        new = out[0, inputs["input_ids"].shape[1]:].tolist()
        ended = tokenizer.eos_token_id in new
        reply = str(tokenizer.decode(new, skip_special_tokens=True))
        verdict = judge(reply, Reference(str(record.answer)), settings, cut=not ended and len(new) >= args.max_output_len)
        rows.append({"question": record.prompt, "answer": record.answer, "reply": reply,
                     "extracted": verdict.extracted, "correct": verdict.correct, "truncated": verdict.truncated})
    write_record(args.out, "scored-replies", {
        "model": args.model, "scoring": settings.describe(), "max_output_len": args.max_output_len,
        "accuracy": sum(r["correct"] for r in rows) / len(rows), "replies": rows})
    return 0
