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
    # CI keeps the machine's local CPU wheel (an unpinned torch there would pull CUDA)
    assert "pip install -q torch==2.13.0" in (ROOT / ".ci" / "run").read_text()
