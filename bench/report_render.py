"""`sweeper report`'s time with each figure drawn once, against the way it drew them before.

    python3 -m bench report-render RESULTS_DIR [--rounds 5] [--out report_render.json]

Before: ``Figure.savefig`` (which, under constrained layout, draws the figure twice, to lay
it out and to render it, and then puts it back at its own dpi), then a third drawing for
``figure_data`` to read the laid-out artists. Now: ``report.figure_png`` draws once at the
image's dpi and ``figure_data`` reads that drawing. The two are timed alternately in each
round (process CPU time of a whole ``build_report``, and wall time), so drift cancels in the
paired ratio; every plot's pixels are compared between the two, and must be identical.
"""

from __future__ import annotations

import argparse
import io
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

from bench import benchkit


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("results", type=Path, help="a sweep's results directory (it is copied; the copy gets the report)")
    ap.add_argument("--rounds", type=int, default=5, help="rounds of (before, now) reports (default: %(default)s)")
    ap.add_argument("--out", type=Path, default=Path("report_render.json"), help="the record to write")


def _savefig_png(fig: Any, dpi: int = 110) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


def _redrawn(read: Callable[[Any], dict[str, Any]]) -> Callable[[Any], dict[str, Any]]:
    def figure_data(fig: Any) -> dict[str, Any]:
        fig.canvas.draw()  # what figure_data always did before reading
        return read(fig)
    return figure_data


@contextmanager
def _before() -> Iterator[None]:
    from sweeper.analysis import report

    saved = report.figure_png, report.figure_data
    report.figure_png, report.figure_data = _savefig_png, _redrawn(saved[1])  # type: ignore[assignment]
    try:
        yield
    finally:
        report.figure_png, report.figure_data = saved


def _timed(root: Path, way: Callable[[], Any]) -> tuple[float, float, dict[str, bytes]]:
    from sweeper.analysis.report import build_report

    with way():
        cpu0, wall0 = time.process_time(), time.perf_counter()
        report = build_report(root)
        cpu_s, wall_s = time.process_time() - cpu0, time.perf_counter() - wall0
    return cpu_s, wall_s, {p.filename: p.png for p in report.plots}


def _pixels(png: bytes) -> Any:
    import numpy as np
    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(png)))


def run(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(shutil.copytree(args.results, Path(tmp) / args.results.name))
        _timed(root, nullcontext)  # imports and first-use costs, in neither column
        rounds: list[dict[str, Any]] = []
        for i in range(args.rounds):
            ways: list[tuple[str, Callable[[], Any]]] = [("before", _before), ("now", nullcontext)]
            if i % 2:
                ways.reverse()
            measured = {name: _timed(root, way) for name, way in ways}
            pngs_before, pngs_now = measured["before"][2], measured["now"][2]
            same = sorted(pngs_before) == sorted(pngs_now) and all(
                (_pixels(pngs_before[f]) == _pixels(pngs_now[f])).all() for f in pngs_before)
            if not same:
                raise SystemExit(f"round {i}: the plots' pixels differ between the two ways")
            row: dict[str, Any] = {"plots": len(pngs_now)}
            for name, (cpu_s, wall_s, _) in measured.items():
                row[f"{name}_cpu_s"], row[f"{name}_wall_s"] = round(cpu_s, 3), round(wall_s, 3)
            rounds.append(row)
            print(rounds[-1], flush=True)
    results = {"results": str(args.results), "rounds": rounds, "pixels_identical": True,
               "cpu_ratio_now_over_before": benchkit.paired_ratio([r["now_cpu_s"] for r in rounds],
                                                                  [r["before_cpu_s"] for r in rounds]),
               "wall_ratio_now_over_before": benchkit.paired_ratio([r["now_wall_s"] for r in rounds],
                                                                   [r["before_wall_s"] for r in rounds])}
    print({k: v for k, v in results.items() if k.endswith("over_before")})
    benchkit.write_record(args.out, "report-render", results)
