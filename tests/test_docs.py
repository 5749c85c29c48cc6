"""Documentation that is generated from code stays in step with it."""

from __future__ import annotations

import re
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


# A repository path as the docs write it: under a top-level folder, with a file extension or a
# trailing slash (a family of records is named by a prefix, e.g. docs/data/quality_..._2026-11-24_).
_REPO_PATH = re.compile(r"(?<![\w/.-])((?:sweeper|actors|sweeps|notebooks|tests|bench|docs|\.ci)/[\w./*-]*[\w*/])")


def _named_paths(text: str) -> set[str]:
    """What the text names as files: a file extension, a folder's trailing slash, or a record
    prefix under docs/data/ ("sweeper/bare 1.02" is a ratio, not a path)."""
    named = {m.group(1).rstrip(".") for m in _REPO_PATH.finditer(text)}
    return {p for p in named if re.search(r"\.[A-Za-z]\w*$", p) or p.endswith("/") or p.startswith("docs/data/")}


def _exists(path: str) -> bool:
    if "*" in path:
        return any(ROOT.glob(path))
    target = ROOT / path
    if target.exists():
        return True
    # A prefix naming a family of files (records of one run): some file must start with it.
    parent = target.parent
    return parent.is_dir() and any(p.name.startswith(target.name) for p in parent.iterdir())


def test_every_repository_path_the_docs_name_exists():
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    missing = {f"{doc.relative_to(ROOT)}: {path}" for doc in docs for path in _named_paths(doc.read_text())
               if not _exists(path)}
    assert not missing, sorted(missing)


def test_the_path_check_catches_a_path_that_is_gone():
    assert _named_paths("see `tests/test_axes.py` and sweeper/bare 1.02") == {"tests/test_axes.py"}
    assert not _exists("tests/test_axes.py") and _exists("tests/core/test_axes.py")
    assert _exists("docs/data/quality_smollm2-135m_h100_2026-11-24_") and not _exists("docs/data/no_such_run_")


def test_the_readme_is_a_landing_page():
    # What it is, the two commands, one sweep file, the commands, the results, and links: the
    # rest lives in docs/ (the guide by topic, METHOD, SCHEMA, BENCHMARKS, FLEET).
    readme = (ROOT / "README.md").read_text()
    assert len(readme.encode()) <= 25_000
    sections = [line[3:] for line in readme.splitlines() if line.startswith("## ")]
    assert sections == ["How a trial is measured", "Sweep files", "Commands", "Results", "Guide"]
    assert "docs/GUIDE.md" in readme and (ROOT / "docs" / "GUIDE.md").is_file()


def test_the_guide_names_every_plot_that_report_plots_takes():
    from sweeper.analysis.report import PLOT_NAMES

    guide = " ".join((ROOT / "docs" / "GUIDE.md").read_text().split())
    listed = guide.split("draws only the plots named (each as its PNG is named: ", 1)[1].split(")", 1)[0]
    assert listed.split(", ") == list(PLOT_NAMES)
