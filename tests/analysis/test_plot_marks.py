"""What a plot's marks and axes promise: labels that bracket the data, every flag visible."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest


@pytest.fixture
def ax():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots()
    yield axes
    plt.close(fig)


def _labelled_ticks(ax, axis: str) -> list[float]:
    lo, hi = ax.get_ylim() if axis == "y" else ax.get_xlim()
    target = ax.yaxis if axis == "y" else ax.xaxis
    return [t for t in target.get_majorticklocs() if lo <= t <= hi]


@pytest.mark.parametrize(("values", "below", "above"), [([6.0, 150.0], 5.0, 200.0), ([12.0, 99.0], 10.0, 100.0),
                                                        ([0.03, 0.7], 0.02, 1.0)])
def test_a_log_axis_has_a_label_beyond_each_end_of_its_data(ax, values, below, above):
    from sweeper.analysis.plot_kit import set_log

    ax.plot([1, 2], values, "o")
    set_log(ax, "y")
    ticks = _labelled_ticks(ax, "y")
    assert min(ticks) == pytest.approx(below) and max(ticks) == pytest.approx(above)
    assert all(below <= v <= above for v in values)


def test_a_trial_both_saturated_and_unstable_shows_both_marks(ax):
    from sweeper.analysis.serving_plots import _draw

    g = pd.DataFrame({"saturated": [False, True, True], "unstable": [False, False, True]})
    x, y = np.array([1.0, 2.0, 3.0]), np.array([10.0, 20.0, 30.0])
    _draw(ax, x, y, g, "C0", "series")
    marks = [(c.get_offsets().tolist(), len(c.get_facecolors())) for c in ax.collections]
    crosses = [pts for pts, _ in marks if [3.0, 30.0] in pts and [2.0, 20.0] in pts]
    rings = [pts for pts, faces in marks if pts == [[3.0, 30.0]] and faces == 0]  # hollow: no face colour
    assert crosses and rings, marks
