"""Loading a results directory: its aggregated Parquet tables, checked and read into pandas.

``sweeper aggregate`` writes ``trials.parquet`` and, when the sweep produced
them, ``requests.parquet``, ``timeline.parquet`` and ``layers.parquet`` at the
top of a results directory. The report, ``sweeper query`` and the notebooks
all start here; pandas and pyarrow are imported only when something is read.
The two large tables are read on demand: the timeline one trial at a time, the
requests only as the aggregates a plot asks for (``Results.turn_energy``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sweeper.core.budget import BUDGET_COLUMNS
from sweeper.core.errors import ResultsError, first_line
from sweeper.core.plan_record import PLAN_FILE, PlanRecord
from sweeper.core.settings import ReportSettings

if TYPE_CHECKING:  # pragma: no cover - typing only
    import pandas as pd


@dataclass
class Results:
    """A results directory's aggregated tables (the timeline is read per trial: it is the large one)."""

    root: Path
    trials: pd.DataFrame
    layers: pd.DataFrame | None = None
    timeline_path: Path | None = None
    report: ReportSettings = ReportSettings()  # how energy is priced (co2e_g_per_1k_tokens, cost_per_1m_tokens)
    stages: pd.DataFrame | None = None  # where the sweep's time went (sweeper.core.stages)
    requests_path: Path | None = None  # requests.parquet, read only by the plots that need it (it is large)

    def timeline(self, trial_id: str) -> pd.DataFrame | None:
        if self.timeline_path is None:
            return None
        import pandas as pd

        return pd.read_parquet(self.timeline_path, filters=[("trial_id", "==", trial_id)])

    def timeline_trials(self) -> set[str]:
        if self.timeline_path is None:
            return set()
        import pyarrow.parquet as pq

        ids = pq.read_table(self.timeline_path, columns=["trial_id"]).column("trial_id")
        return set(ids.unique().to_pylist()) - {None}

    def search_points(self) -> pd.DataFrame | None:
        """search.parquet (a configuration search's points), or None where the sweep had none."""
        path = table_path(self.root, "search")
        if path is None:
            return None
        import pandas as pd

        return _read(pd, path, self.root)

    def turn_energy(self) -> pd.DataFrame | None:
        """Per trial and conversation turn (requests.parquet ``turn``, 0-based): ``turn_requests``,
        every request of that turn; ``n_requests``, those that completed inside the steady
        window with an attributed energy; ``energy_sum_j``, their energies summed. None where
        requests.parquet is absent or has no ``turn`` column (a sweep that replayed no
        conversations, or one aggregated before conversations existed)."""
        if self.requests_path is None:
            return None
        return request_turn_energy(self.requests_path, self.root)


def table_path(root: str | os.PathLike[str], kind: str) -> Path | None:
    """``root/<kind>.parquet`` if it exists."""
    path = Path(root) / f"{kind}.parquet"
    return path if path.is_file() else None


def check_results_dir(root: str | os.PathLike[str]) -> Path:
    """The results directory as a Path, or a ResultsError that says what to do."""
    text = str(root)
    if "://" in text:
        raise ResultsError(f"{text}: reports and queries read local directories; copy the results here first")
    path = Path(text)
    if not path.is_dir():
        raise ResultsError(f"{text}: no such results directory")
    if table_path(path, "trials") is None:
        hint = (f"run `sweeper aggregate {text}` first" if (path / "shards" / "trials").is_dir()
                else "is this a sweeper output directory?")
        raise ResultsError(f"{text}: no trials.parquet ({hint})")
    return path


# What every analysis reads; a table without them is not one sweeper wrote.
REQUIRED_TRIAL_COLUMNS = frozenset({"trial_id", "model", "backend", "precision", "batch_size", "status"})


def _read(pd: Any, path: Path, root: str | os.PathLike[str]) -> Any:
    try:
        return pd.read_parquet(path)
    except Exception as exc:  # pyarrow raises several kinds for a truncated or empty file
        lines = str(exc).strip().splitlines()
        raise ResultsError(f"{path}: not a readable Parquet table ({lines[0] if lines else type(exc).__name__}); "
                           f"`sweeper aggregate {root}` rebuilds it from the shards") from None


def request_turn_energy(path: Path, root: str | os.PathLike[str]) -> pd.DataFrame | None:
    """``Results.turn_energy`` of the requests table at ``path``: aggregated in DuckDB, which
    reads only the columns named here and never holds the table itself (it has a row per
    request of the whole sweep); rows with a null turn (not part of a conversation) are skipped."""
    import duckdb
    import pyarrow.parquet as pq

    try:
        names = set(pq.read_schema(path).names)
    except Exception as exc:  # pyarrow raises several kinds for a truncated or empty file
        raise ResultsError(f"{path}: not a readable Parquet table ({first_line(exc)}); "
                           f"`sweeper aggregate {root}` rebuilds it from the shards") from None
    if "turn" not in names:
        return None
    # Only completed requests (error null) that finished inside their trial's steady window.
    # A replay starts every conversation's first turn in the ramp-up and ends its last turns in
    # the drain, where few requests share the GPU and each is attributed a larger share of its
    # energy: counting those would bend the curve up at both ends for a reason that is not the
    # turn. The window is also what the trial's headline figures (energy_j, J/token) cover.
    measured = " AND ".join(["energy_j IS NOT NULL", *(["error IS NULL"] if "error" in names else []),
                             *(["in_window IS TRUE"] if "in_window" in names else [])])
    sql = (f"SELECT trial_id, CAST(turn AS BIGINT) AS turn, COUNT(*) AS turn_requests, "
           f"COUNT(*) FILTER (WHERE {measured}) AS n_requests, "
           f"COALESCE(SUM(energy_j) FILTER (WHERE {measured}), 0.0) AS energy_sum_j "
           "FROM read_parquet(?) WHERE turn IS NOT NULL GROUP BY trial_id, turn ORDER BY trial_id, turn")
    con = duckdb.connect()
    try:
        return con.execute(sql, [str(path)]).df()
    except duckdb.Error as exc:
        raise ResultsError(f"{path}: cannot read the conversations' turns ({first_line(exc)}); "
                           f"`sweeper aggregate {root}` rebuilds it from the shards") from None
    finally:
        con.close()


def report_settings(root: str | os.PathLike[str], **overrides: Any) -> ReportSettings:
    """The sweep's ``report`` block as its last run recorded it (``plan.json``), with the
    given non-None values (the CLI's) in its place."""
    try:
        record = PlanRecord.parse((Path(root) / PLAN_FILE).read_bytes())
    except OSError:  # no plan recorded (results aggregated by an older version, or copied)
        record = None
    settings = record.report if record is not None else ReportSettings()
    given = {k: v for k, v in overrides.items() if v is not None}
    return settings.model_validate({**settings.model_dump(), **given}) if given else settings


def add_budget_columns(trials: pd.DataFrame, report: ReportSettings) -> pd.DataFrame:
    """``co2e_g_per_1k_tokens`` and ``cost_per_1m_tokens`` from each trial's J/token: null where
    the setting is not given or no energy was measured (never zero)."""
    df = trials.copy()
    for column in BUDGET_COLUMNS:
        factor = column.factor(report)
        if factor is None or "energy_per_token_j" not in df.columns:
            df[column.name] = float("nan")
        else:  # NaN energy (no GPU, a failed row) stays NaN: null, never zero
            df[column.name] = df["energy_per_token_j"].astype("float64") * factor
    return df


def load_results(root: str | os.PathLike[str], report: ReportSettings | None = None) -> Results:
    """Read a results directory's aggregated tables into pandas (``report``: the pricing of
    energy; default: what the sweep file's ``report`` block recorded)."""
    import pandas as pd

    path = check_results_dir(root)
    trials = _read(pd, path / "trials.parquet", root)
    missing = REQUIRED_TRIAL_COLUMNS - set(trials.columns)
    if missing:
        raise ResultsError(f"{path / 'trials.parquet'}: not a sweeper trials table (no {', '.join(sorted(missing))} "
                           f"column); `sweeper aggregate {root}` rebuilds it from the shards")
    layers_path = table_path(path, "layers")
    layers = _read(pd, layers_path, root) if layers_path else None
    timeline_path = table_path(path, "timeline")
    if timeline_path is not None:
        import pyarrow.parquet as pq

        if pq.ParquetFile(timeline_path).metadata.num_rows == 0:  # CPU runs write an empty timeline
            timeline_path = None
    report = report if report is not None else report_settings(path)
    trials = add_budget_columns(trials, report)
    stages_path = table_path(path, "stages")
    stages = _read(pd, stages_path, root) if stages_path else None
    return Results(path, trials, layers if layers is not None and not layers.empty else None, timeline_path,
                   report, stages if stages is not None and not stages.empty else None,
                   requests_path=table_path(path, "requests"))
