"""Where a sweep's time went, from ``stages.parquet``: a breakdown per stage and a timeline per slot.

A slot is one actor's placement: a node and the GPUs it held (CPU-only: the
node). The actors time their stages exclusively (``sweeper.core.stages``), so a
slot's spans never overlap; the gaps between them are ``idle`` (an actor queued
or starting, the driver's round trips). A gap longer than ``SESSION_GAP_S``
is taken as the sweep not running at all (a later ``sweeper run`` resuming
it) and counted nowhere.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sweeper.analysis.plot_kit import PlotUnavailable, new_figure
from sweeper.core.stages import IDLE, STAGES

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

# Between two runs of one sweep (an interrupt, then a resume) a slot sits unused for
# minutes to days; inside one run a slot waits at most for a model load elsewhere.
SESSION_GAP_S = 600.0


def slot_label(node: Any, gpu_ids: Any) -> str:
    gpus = f"GPU {gpu_ids}" if isinstance(gpu_ids, str) and gpu_ids else "CPU"
    return f"{node} {gpus}"


def with_slots(stages: pd.DataFrame) -> pd.DataFrame:
    """The spans with a ``slot`` label and ``end`` time, in time order."""
    import pandas as pd

    df = stages.copy()
    df["slot"] = [slot_label(n, g) for n, g in zip(df["node"], df["gpu_ids"], strict=True)]
    df["started_at"] = pd.to_datetime(df["started_at"], utc=True)
    df["end"] = df["started_at"] + pd.to_timedelta(df["duration_s"], unit="s")
    return df.sort_values(["slot", "started_at"]).reset_index(drop=True)


def idle_seconds(spans: pd.DataFrame) -> float:
    """Gaps between consecutive spans of each slot, up to ``SESSION_GAP_S`` each."""
    total = 0.0
    for _, g in spans.groupby("slot"):
        gaps = (g["started_at"].iloc[1:].reset_index(drop=True)
                - g["end"].iloc[:-1].reset_index(drop=True)).dt.total_seconds().to_numpy()
        total += float(gaps[(gaps > 0) & (gaps <= SESSION_GAP_S)].sum())
    return total


def stage_breakdown(stages: pd.DataFrame) -> pd.DataFrame:
    """Seconds, share and span count per stage (registry order), ``idle`` last."""
    import pandas as pd

    spans = with_slots(stages)
    sums = spans.groupby("stage")["duration_s"].agg(["sum", "count"])
    rows = [(name, float(sums.loc[name, "sum"]), int(sums.loc[name, "count"]))
            for name in STAGES if name in sums.index]
    rows.append((IDLE, idle_seconds(spans), 0))
    total = sum(seconds for _, seconds, _ in rows)
    return pd.DataFrame([{"stage": name, "seconds": seconds, "share": seconds / total if total else None,
                          "spans": count} for name, seconds, count in rows])


def plot_stage_timeline(stages: pd.DataFrame) -> Figure:
    """One lane per slot: each stage's spans as coloured bars over the sweep's wall time."""
    if stages is None or stages.empty:
        raise PlotUnavailable("no stage spans recorded (results from a version before stage timing)")
    spans = with_slots(stages)
    t0 = spans["started_at"].min()
    slots = sorted(spans["slot"].unique())
    fig = new_figure(11.0, 1.2 + 0.5 * len(slots))
    ax = fig.subplots()
    cmap = _colours()
    for lane, slot in enumerate(slots):
        g = spans[spans["slot"] == slot]
        for name, h in g.groupby("stage"):
            starts = (h["started_at"] - t0).dt.total_seconds().to_numpy()
            ax.broken_barh(list(zip(starts, h["duration_s"].to_numpy(), strict=True)), (lane - 0.4, 0.8),
                           facecolors=cmap[name], label=name, gid=name)
    ax.set_yticks(range(len(slots)), slots, fontsize=8)
    ax.set_xlabel("seconds since the first span")
    ax.grid(True, axis="x", alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    unique = {label: handle for handle, label in zip(handles, labels, strict=True)}
    ordered = [name for name in STAGES if name in unique]
    ax.legend([unique[n] for n in ordered], ordered, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.suptitle("where each slot's time went (white: idle)", fontsize=10)
    return fig


def _colours() -> dict[str, Any]:
    import matplotlib

    palette = matplotlib.colormaps["tab20"]
    return {name: palette(i % 20) for i, name in enumerate(STAGES)}
