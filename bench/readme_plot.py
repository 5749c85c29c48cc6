"""Draw the guide's Pareto plot, docs/img/pareto.png, from a real GPU run's trials table.

    python3 -m bench readme-plot [TRIALS_PARQUET] [OUT_PNG]

The default input is docs/data/sweep_quantization_h200_2026-11-21_core-trials.parquet
(sweeps/quantization.yaml on an NVIDIA H200); the plot is the one `sweeper report` draws
(sweeper.analysis.plots.plot_pareto).
"""

from __future__ import annotations

import argparse
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TRIALS = ROOT / "docs" / "data" / "sweep_quantization_h200_2026-11-21_core-trials.parquet"
DEFAULT_PNG = ROOT / "docs" / "img" / "pareto.png"


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("trials", nargs="?", type=Path, default=DEFAULT_TRIALS,
                    help="a trials.parquet (default: %(default)s)")
    ap.add_argument("out", nargs="?", type=Path, default=DEFAULT_PNG, help="the PNG to write (default: %(default)s)")


def run(args: argparse.Namespace) -> None:
    import pandas as pd

    from sweeper.analysis.plots import plot_pareto
    from sweeper.analysis.report import figure_png

    trials_path, out_path = args.trials, args.out
    trials = pd.read_parquet(trials_path)
    fig = plot_pareto(trials)
    device = ", ".join(sorted(trials["device_name"].dropna().unique()))
    fig.suptitle(f"Latency against energy per token: {', '.join(sorted(trials['model'].unique()))} "
                 f"on {device}\nlines join each model's non-dominated trials (labelled)", fontsize=11)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_bytes(figure_png(fig, dpi=100))
    print(f"{out_path}: {len(trials)} trials from {trials_path}")
