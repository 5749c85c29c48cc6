"""Synthetic checkpoints a server can serve (actors.models.materialize_servable)."""

from __future__ import annotations

import json
import subprocess
import sys

from actors.models import materialize_servable
from tests.conftest import ROOT


def test_a_servable_directory_names_its_architecture_and_its_words_are_its_tokens(tmp_path):
    from transformers import AutoTokenizer

    path = materialize_servable("tiny-llama", root=tmp_path)
    config = json.loads((path / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    tokenizer = AutoTokenizer.from_pretrained(path)
    ids = [5, 17, 2000, 2, 2047]  # 2 is the preset's EOS: a whole word, never inside "t2000"
    text = tokenizer.decode(ids)
    assert text == "t5 t17 t2000 t2 t2047"
    assert tokenizer(text, add_special_tokens=False)["input_ids"] == ids
    assert materialize_servable("tiny-llama", root=tmp_path) == path  # built once


def test_a_built_servable_directory_is_found_without_importing_transformers(tmp_path):
    # A launched server's actor needs only the directory's path: importing transformers there
    # cost each such actor seconds of CPU before the server even started.
    path = materialize_servable("tiny-llama", root=tmp_path)
    probe = ("import sys; from pathlib import Path; from actors.models import materialize_servable; "
             f"p = materialize_servable('tiny-llama', root=Path({str(tmp_path)!r})); "
             "print(p, 'transformers' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == [str(path), "False"]
