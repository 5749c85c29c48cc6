"""Documentation that is generated from code stays in step with it."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT


def test_schema_doc_is_current():
    generated = subprocess.run([sys.executable, "-m", "sweeper.core.schema"], capture_output=True, text=True,
                               check=True, cwd=ROOT).stdout
    assert (ROOT / "docs" / "SCHEMA.md").read_text() == generated, \
        "docs/SCHEMA.md is stale: python -m sweeper.core.schema > docs/SCHEMA.md"


def test_readme_starts_with_the_two_commands():
    head = (ROOT / "README.md").read_text().split("\n## ", 1)[0]
    assert "sweeper run sweeps/quickstart.yaml" in head
    assert "pytest" in head
    first_block = head.split("```bash\n", 1)[1].split("```", 1)[0].splitlines()
    # CPU-only machines: torch's CPU wheel first, inside the block a newcomer copies
    assert first_block[0].startswith("pip install torch --extra-index-url https://download.pytorch.org/whl/cpu && ")
    assert "sweeper run sweeps/quickstart.yaml" in first_block[0] and "pytest" in first_block[1]
    # CI keeps the machine's local CPU wheel (an unpinned torch there would pull CUDA), and then
    # runs the fast subset and the bundled real model's tests against the newest torch as well.
    ci = (ROOT / ".ci" / "run").read_text()
    assert "pip install -q torch==2.13.0" in ci
    newest = ci.split("pip install -q --upgrade torch", 1)[1]
    assert '-m "not slow"' in newest and "tests/actors/backends/test_bundled_model.py" in newest
