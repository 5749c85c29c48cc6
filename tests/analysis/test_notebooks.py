"""The notebooks run top to bottom (nbclient, a real kernel) against real results, and ship clean."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.analysis.test_report import build_gpu_results
from tests.conftest import ROOT

NOTEBOOKS = ROOT / "notebooks"


def _execute(name: str, results: Path, monkeypatch) -> list[dict]:
    import nbformat
    from nbclient import NotebookClient

    monkeypatch.setenv("SWEEPER_RESULTS", str(results))  # the kernel inherits the environment
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    # Run from notebooks/ as Jupyter would; a failing cell raises CellExecutionError here.
    NotebookClient(nb, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    return [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]


def _images(outputs: list[dict]) -> int:
    return sum("image/png" in o.get("data", {}) for o in outputs)


def _text(outputs: list[dict]) -> str:
    return "\n".join(o.get("text", "") + o.get("data", {}).get("text/plain", "") for o in outputs)


@pytest.fixture(scope="module")
def gpu_results(tmp_path_factory) -> Path:
    return build_gpu_results(tmp_path_factory.mktemp("h200-nb") / "quantization")


@pytest.mark.parametrize("name", ["analysis", "energy_timeline"])
def test_notebooks_ship_clean_with_a_parameters_cell(name):
    import nbformat

    nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.outputs == [] and c.execution_count is None for c in code), "clear the outputs"
    first = code[0]
    assert "parameters" in first.metadata.get("tags", [])
    assert 'RESULTS = os.environ.get("SWEEPER_RESULTS", "results/quickstart")' in first.source
    # Plotting comes from sweeper.analysis.plots, not from code pasted into the notebook.
    source = "\n".join(c.source for c in code)
    assert "from sweeper.analysis import plots, tables" in source and "plt.subplots" not in source


@pytest.mark.slow
def test_energy_timeline_on_quickstart(quickstart_results, monkeypatch):
    outputs = _execute("energy_timeline", quickstart_results, monkeypatch)
    assert _images(outputs) == 0
    assert "a CPU-only run has no GPU telemetry" in _text(outputs)


@pytest.mark.slow
def test_analysis_on_gpu_results(gpu_results, monkeypatch):
    outputs = _execute("analysis", gpu_results, monkeypatch)
    assert _images(outputs) == 5  # throughput, latency, J/token, weight memory, Pareto
    text = _text(outputs)
    assert "lowest J/token" in text and "llama-3.1-8b" in text
    assert "plot_fidelity: left out" in text


@pytest.mark.slow
def test_energy_timeline_on_gpu_results(gpu_results, monkeypatch):
    outputs = _execute("energy_timeline", gpu_results, monkeypatch)
    assert _images(outputs) == 2  # the power timeline and the layer shares
    text = _text(outputs)
    assert "trial d58a02976863a6f0: llama-3.1-8b transformers/fp16 bs=64" in text
    assert "prefill" in text and "decode" in text and "idle baseline" in text


@pytest.mark.slow
def test_the_readme_notebook_command_runs_the_analysis_on_quickstart(quickstart_results, tmp_path):
    """The documented command, papermill with the results directory as the RESULTS parameter,
    runs the analysis notebook top to bottom on the quickstart's results (one kernel for both:
    the command and what the notebook shows)."""
    import subprocess
    import sys

    import nbformat

    out = tmp_path / "analysis.ipynb"
    r = subprocess.run([sys.executable, "-m", "papermill", str(NOTEBOOKS / "analysis.ipynb"), str(out),
                        "-p", "RESULTS", str(quickstart_results), "--cwd", str(NOTEBOOKS), "--no-progress-bar"],
                       capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    nb = nbformat.read(out, as_version=4)
    injected = [c for c in nb.cells if "injected-parameters" in c.metadata.get("tags", [])]
    assert len(injected) == 1 and str(quickstart_results) in injected[0].source
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    text = _text(outputs)
    assert _images(outputs) == 3  # throughput, latency and weight memory: a CPU run has no energy
    assert "plot_pareto: left out: energy_per_token_j missing or all null" in text
    assert "tiny-llama" in text and "highest tok/s (no energy)" in text
    assert "skipped" in text  # fp16 on CPU, with its reason
