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


def test_control_plane_does_not_import_torch():
    code = ("import sys, sweeper.cli, sweeper.plan.expand, sweeper.run.sweep_run, sweeper.run.storage, actors.actor;"
            "heavy = [m for m in ('torch', 'transformers', 'vllm') if m in sys.modules];"
            "assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_readme_sweep_file_example_is_a_valid_sweep():
    import re

    import yaml

    from sweeper.plan.expand import expand
    from sweeper.plan.spec import parse_sweep

    text = (ROOT / "README.md").read_text()
    section = text.split("## Sweep files", 1)[1]
    block = re.search(r"```yaml\n(.*?)```", section, re.S).group(1)
    sweep = parse_sweep(yaml.safe_load(block), "README.md")
    trials, _ = expand(sweep, check_hub=False)
    assert trials and {t.fidelity is not None for t in trials} == {True}
