"""Draw the README's plot, docs/img/pareto.png, from a real GPU run's trials table.

    python bench/make_readme_plot.py [TRIALS_PARQUET] [OUT_PNG]

The default input is docs/data/quantization_h200_trials.parquet (sweeps/quantization.yaml
on an NVIDIA H200); the plot is the one `sweeper report` draws (sweeper.analysis.plots.plot_pareto).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from sweeper.analysis.plots import plot_pareto
from sweeper.analysis.report import figure_png

ROOT = Path(__file__).resolve().parents[1]


def main(trials_path: Path, out_path: Path) -> None:
    trials = pd.read_parquet(trials_path)
    fig = plot_pareto(trials)
    device = ", ".join(sorted(trials["device_name"].dropna().unique()))
    fig.suptitle(f"Latency against energy per token: {', '.join(sorted(trials['model'].unique()))} "
                 f"on {device}\nlines join each model's non-dominated trials (labelled)", fontsize=11)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_bytes(figure_png(fig, dpi=100))
    print(f"{out_path}: {len(trials)} trials from {trials_path}")


if __name__ == "__main__":
    args = sys.argv[1:]
    main(Path(args[0]) if args else ROOT / "docs" / "data" / "quantization_h200_trials.parquet",
         Path(args[1]) if len(args) > 1 else ROOT / "docs" / "img" / "pareto.png")
