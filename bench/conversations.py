"""Make a ShareGPT file of many distinct multi-turn conversations from the bundled prompt set.

    python3 -m bench conversations --count 64 --turns 4 --out /tmp/conversations.json

Conversation i's user turns are ``--turns`` prompts of sweeper's bundled set
(sweeper/data/prompts.jsonl, CC0), taken in a seeded order without repeats, with no
assistant turns: replayed with ``history: model``, each turn's prompt holds the real
model's own earlier replies. Distinct conversations matter where a prefix cache is measured:
a sample that cycles a few conversations (``num_prompts`` above the file's count) resends
identical histories, which the cache then finds across conversations, not only within one.
The topics of one conversation's turns are unrelated; the lengths and the growth of the
history are what a chat session's are.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from sweeper.core.datasets import BUNDLED_FILE, read_records


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--count", type=int, default=64, help="conversations (default: %(default)s)")
    ap.add_argument("--turns", type=int, default=4, help="user turns per conversation (default: %(default)s)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, required=True, help="the .json file to write")


def conversations(count: int, turns: int, seed: int) -> list[dict]:
    prompts = [r.prompt for r in read_records(BUNDLED_FILE)]
    if count * turns > len(prompts):
        raise SystemExit(f"{count} x {turns} turns need {count * turns} prompts; the bundled set has {len(prompts)}")
    random.Random(seed).shuffle(prompts)
    return [{"id": f"bundled-chat-{i}",
             "conversations": [{"from": "human", "value": p} for p in prompts[i * turns:(i + 1) * turns]]}
            for i in range(count)]


def run(args: argparse.Namespace) -> None:
    made = conversations(args.count, args.turns, args.seed)
    args.out.write_text(json.dumps(made, indent=1))
    print(f"{args.out}: {len(made)} conversations of {args.turns} user turns from {BUNDLED_FILE.name}")
