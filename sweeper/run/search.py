"""A configuration search on a run: Optuna's ask-and-tell over the sweep's space.

The sweep's axes (every value the grid would have run: models, backend variants, precisions,
tensor-parallel widths, batch sizes) are categorical dimensions, ``search.space``'s ranges of
backend options numeric ones. Optuna (TPE by default; NSGA-II-style Pareto sorting is TPE's
own for two objectives) suggests a point, the run turns it into a trial (or a capacity search,
when the load is searched) and runs it as a group of its own on a free GPU, and its objective
goes back with ``tell``. Several points are out at once, one per free slot: TPE's constant
liar stands in for the values still to come. Why Optuna and not Ray Tune's searchers:
docs/ARCHITECTURE.md.

Every point's rows carry ``search_id``, ``search_step`` and ``search_params``, so a resumed
search tells Optuna the stored points again (``add_trial``), goes on with those stopped
mid-way (their capacity searches replay their stored probes), and spends no budget twice.
The sampler is seeded afresh for each step from the search's seed and the step: a search run
one point at a time suggests the same points whether or not it was interrupted.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sweeper.core.axes import AXES, BACKEND, BackendChoice, non_default_options
from sweeper.core.backends import BACKENDS
from sweeper.core.capacity import Capacity
from sweeper.core.search import OPTION_PREFIX, Range, SearchPoint, SearchSettings
from sweeper.core.settings import Device
from sweeper.core.trial import Trial
from sweeper.plan.expand import Plan, compatibility
from sweeper.run.storage import ResultStore

# The axes a search never varies: the workload and its load (one value, or a capacity range),
# and repeats (a point is evaluated once).
_FIXED_AXES = frozenset({"input_len", "output_len", "request_rate", "max_concurrency", "repeat"})
# Suggestions in a row that were duplicates or infeasible before the search stops asking: the
# space is used up (a small discrete space) or holds almost nothing runnable.
MAX_FUTILE_ASKS = 200


def _label(axis: str, value: Any, variants: Mapping[str, list[Any]]) -> Any:
    """A categorical choice as Optuna holds it (a plain value)."""
    if axis == BACKEND:
        choice: BackendChoice = value
        options = variants[choice.name]
        return choice.name if len(options) == 1 else f"{choice.name}#{options.index(choice.options)}"
    return AXES[axis].key(value)


@dataclass
class Point:
    """One evaluated (or running) point of the search."""

    step: int
    params: dict[str, Any]
    trial: Trial
    values: tuple[float, ...] | None = None  # None: failed (or not told yet)
    violations: tuple[str, ...] = ()
    gpu_s: float = 0.0
    error: str | None = None
    interval: tuple[float, float] | None = None  # the first objective's 95 % interval (or bracket)
    optuna_trial: Any = field(default=None, repr=False)

    @property
    def feasible(self) -> bool:
        return self.values is not None and not self.violations


@dataclass
class SearchOutcome:
    """What a search found, for the run's summary."""

    search_id: str
    settings: SearchSettings
    points: list[Point]
    gpu_s: float
    best: list[Point]  # one objective: the best feasible point; two: the Pareto front
    closest: Point | None  # none feasible: the point closest to meeting the constraints
    stopped_by: str


class SearchSpace:
    """The sweep's plan as a space: its axes' values and the ranges of options, and how a point
    becomes a trial."""

    def __init__(self, plan: Plan, settings: SearchSettings, device: Device) -> None:
        self.settings, self.device = settings, device
        sweep = plan.sweep
        self.variants: dict[str, list[Any]] = {b: sweep.options_for(b) for b in sweep.backends}
        # The values of runnable points only: a precision this cluster cannot run is no choice.
        trials = plan.runnable
        axes = [a.name for a in AXES if a.name not in _FIXED_AXES]
        labels: dict[str, list[Any]] = {a: [] for a in axes}
        for t in trials:
            for a in axes:
                label = _label(a, t.point[a], self.variants)
                if label not in labels[a]:
                    labels[a].append(label)
        self.categorical = {a: v for a, v in labels.items() if len(v) > 1}
        self.fixed = {a: v[0] for a, v in labels.items() if len(v) == 1}
        self.axes = axes
        self.grid: dict[tuple, Trial] = {}
        self.skip_reason: dict[tuple, str] = {}
        for p in plan.trials:
            key = tuple(_label(a, p.trial.point[a], self.variants) for a in axes)
            if p.runnable:
                self.grid[key] = p.trial
            else:
                self.skip_reason[key] = p.skip_reason or "not runnable"

    def suggest(self, trial: Any) -> dict[str, Any]:
        """The point's parameters, asked of an Optuna trial define-by-run: an option's range only
        for the backend that has it (grid sampling asks every dimension)."""
        params: dict[str, Any] = {}
        for axis, choices in self.categorical.items():
            params[axis] = trial.suggest_categorical(axis, choices)
        backend = str(params.get(BACKEND, self.fixed.get(BACKEND))).split("#")[0]
        for key, dim in self.settings.space.items():
            if key.split(".")[1] != backend and self.settings.sampler != "grid":
                continue
            if isinstance(dim, Range):
                if dim.int_:
                    params[key] = trial.suggest_int(key, int(dim.low), int(dim.high), log=dim.log)
                else:
                    params[key] = trial.suggest_float(key, dim.low, dim.high, log=dim.log)
            else:
                params[key] = trial.suggest_categorical(key, dim)
        return params

    def distributions(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """Each parameter's distribution (what ``add_trial`` needs to tell a stored point again)."""
        import optuna.distributions as od

        out: dict[str, Any] = {}
        for name in params:
            if name in self.categorical:
                out[name] = od.CategoricalDistribution(self.categorical[name])
                continue
            dim = self.settings.space[name]
            if isinstance(dim, Range):
                out[name] = (od.IntDistribution(int(dim.low), int(dim.high), log=dim.log) if dim.int_
                             else od.FloatDistribution(dim.low, dim.high, log=dim.log))
            else:
                out[name] = od.CategoricalDistribution(dim)
        return out

    def grid_points(self) -> dict[str, list[Any]]:
        """Every dimension's values, for Optuna's grid sampler."""
        space: dict[str, list[Any]] = dict(self.categorical)
        for key, dim in self.settings.space.items():
            assert isinstance(dim, list)  # the settings refuse ranges with sampler grid
            space[key] = list(dim)
        return space

    def size(self) -> int | None:
        """How many distinct points there are (None: a continuous range makes it unbounded)."""
        n = max(len(self.grid), 1)
        for dim in self.settings.space.values():
            if isinstance(dim, Range):
                if not dim.int_:
                    return None
                n *= int(dim.high - dim.low + 1)
            else:
                n *= len(dim)
        return n

    def trial(self, params: Mapping[str, Any]) -> Trial | str:
        """The point's trial (a capacity search's first probe where the load is searched), or why
        it cannot run: excluded, unsupported here, or options its backend refuses."""
        key = tuple(params.get(a, self.fixed.get(a)) for a in self.axes)
        base = self.grid.get(key)
        if base is None:
            return self.skip_reason.get(key, "excluded by the sweep's exclude rules")
        name = base.backend
        chosen = {k.split(".")[2]: v for k, v in params.items()
                  if k.startswith(OPTION_PREFIX) and k.split(".")[1] == name}
        if chosen:
            values = {**non_default_options(base.backend_options), **chosen}
            try:
                options = BACKENDS[name].options.model_validate(values)
            except ValueError as exc:
                return f"backend_options.{name}: {str(exc).splitlines()[-1]}"
            base = base.with_axes(**{BACKEND: BackendChoice(name, options)})
        reason = compatibility(base, self.device)
        return reason if reason is not None else base


def search_id(settings: SearchSettings, sweep_name: str, space: SearchSpace) -> str:
    """The search's id: its settings (less the budget: a larger one goes on) and its space."""
    blob = json.dumps({"search": settings.identity(), "sweep": sweep_name,
                       "grid": sorted(t.trial_id for t in space.grid.values())},
                      sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


class SearchRun:
    """The search's state in a run: Optuna's study, the points out and the points told."""

    def __init__(self, plan: Plan, settings: SearchSettings, device: Device, *, parallel: int = 1) -> None:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)  # the run's own lines say what happens
        self.settings = settings
        self.space = SearchSpace(plan, settings, device)
        self.id = search_id(settings, plan.sweep.name, self.space)
        self.parallel = max(parallel, 1)
        directions = [o.direction for o in settings.objective]
        self.study = optuna.create_study(directions=directions, sampler=self._sampler(0))
        self.points: list[Point] = []  # told, in the order they were told
        self.out: dict[str, Point] = {}  # running, by the key their result comes back under
        self.next_step = 0
        self.futile = 0  # duplicate or infeasible suggestions in a row
        self.infeasible: list[str] = []

    # -- the sampler ------------------------------------------------------------------------
    def _sampler(self, step: int) -> Any:
        import optuna

        seed = (self.settings.seed * 1_000_003 + step) % 2**32
        if self.settings.sampler == "random":
            return optuna.samplers.RandomSampler(seed=seed)
        if self.settings.sampler == "grid":
            return optuna.samplers.GridSampler(self.space.grid_points(), seed=seed)
        budget = self.settings.budget.trials or 30
        # Random points first, then TPE: a third of a small budget, at most TPE's default 10.
        startup = max(2, min(10, budget // 3))
        # Constraints reach it as each point's (set_constraint): infeasible points are ranked last.
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup, multivariate=True,
                                          constant_liar=True)

    # -- asking -----------------------------------------------------------------------------
    def budget_left(self) -> str | None:
        """Why no more points may start (None: they may)."""
        if not self.space.grid:
            return "no grid point is runnable here (the skipped rows say why)"
        b = self.settings.budget
        if b.trials is not None and len(self.points) + len(self.out) >= b.trials:
            return f"budget.trials ({b.trials}) reached"
        if b.gpu_hours is not None and self.gpu_s() >= b.gpu_hours * 3600:
            return f"budget.gpu_hours ({b.gpu_hours:g}) spent"
        if self.futile >= MAX_FUTILE_ASKS:
            size = self.space.size()
            return (f"the space is used up ({size} point(s))" if size is not None and len(self.points) >= size
                    else f"{MAX_FUTILE_ASKS} suggestions in a row were duplicates or could not run")
        return None

    def wants(self) -> bool:
        return len(self.out) < self.parallel and self.budget_left() is None

    def ask(self) -> Point | None:
        """The next point to evaluate (None: none now). A suggestion that is a point already
        told (or out) or that cannot run is told back at once, and the next one asked."""
        while self.wants():
            # Seeded by the step and the suggestions already refused for it: the same history
            # gives the same point, and a refused one is not asked again.
            self.study.sampler = self._sampler(self.next_step * 1_009 + self.futile)
            ot = self.study.ask()
            params = self.space.suggest(ot)
            made = self.space.trial(params)
            if isinstance(made, str):
                self._futile(ot, f"{_describe(params)}: {made}")
                self.infeasible.append(f"{_describe(params)}: {made}")
                continue
            key = self.key(made)
            told = next((p for p in self.points if self.key(p.trial) == key), None)
            if key in self.out or told is not None:
                self._futile(ot, None, told)
                continue
            self.futile = 0
            step, self.next_step = self.next_step, self.next_step + 1
            trial = dataclasses.replace(made, search_id=self.id, search_step=step,
                                        search_params=json.dumps(params, sort_keys=True, default=str))
            point = Point(step, params, trial, optuna_trial=ot)
            self.out[key] = point
            return point
        return None

    def _futile(self, ot: Any, reason: str | None, told: Point | None = None) -> None:
        import optuna

        self.futile += 1
        if told is not None and told.values is not None:
            # The same point again: its values, so the sampler learns nothing false.
            self.study.tell(ot, list(told.values))
        else:
            self.study.tell(ot, state=optuna.trial.TrialState.FAIL)

    @staticmethod
    def key(trial: Trial) -> str:
        """What a point's result comes back under: its capacity search, or its trial."""
        return trial.capacity_id or trial.trial_id

    def resume_point(self, step: int, params: dict[str, Any]) -> Point | None:
        """A point an earlier run started and did not finish (its capacity search stopped
        mid-way): asked again with the same parameters, under its own step."""
        made = self.space.trial(params)
        if isinstance(made, str):
            return None
        self.study.enqueue_trial(params, skip_if_exists=False)
        ot = self.study.ask()
        self.space.suggest(ot)
        trial = dataclasses.replace(made, search_id=self.id, search_step=step,
                                    search_params=json.dumps(params, sort_keys=True, default=str))
        point = Point(step, params, trial, optuna_trial=ot)
        self.out[self.key(trial)] = point
        self.next_step = max(self.next_step, step + 1)
        return point

    # -- telling ----------------------------------------------------------------------------
    def tell_row(self, trial: Trial, row: Mapping[str, Any]) -> Point | None:
        """A point's trial ended: its row gives its objectives and constraints."""
        return self._tell(self.key(trial), row, row_gpu_s(row), row_interval(self.settings, row))

    def tell_capacity(self, trial: Trial, found: Capacity) -> Point | None:
        """A point's capacity search ended: its capacity row gives its objectives."""
        return self._tell(self.key(trial), dict(found.items()), found.gpu_s or 0.0,
                          capacity_interval(self.settings, found))

    def _tell(self, key: str, row: Mapping[str, Any], gpu_s: float,
              interval: tuple[float, float] | None) -> Point | None:
        import optuna

        point = self.out.pop(key, None)
        if point is None:
            return None
        point.gpu_s, point.interval = gpu_s, interval
        values = [row.get(o.column) for o in self.settings.objective]
        point.violations = tuple(self._violations(row))
        for name, value in self._constraint_values(row).items():
            point.optuna_trial.set_constraint(name, value)
        if row.get("status") not in (None, "ok") or any(_missing(v) for v in values):
            point.error = _why_no_value(self.settings, row, values)
            self.study.tell(point.optuna_trial, state=optuna.trial.TrialState.FAIL)
        else:
            point.values = tuple(float(v) for v in values)  # type: ignore[arg-type]
            self.study.tell(point.optuna_trial, list(point.values))
        self.points.append(point)
        return point

    def restore(self, step: int, params: dict[str, Any], trial: Trial, row: Mapping[str, Any],
                gpu_s: float, interval: tuple[float, float] | None = None) -> None:
        """A point an earlier run evaluated: told to the study again, its budget spent."""
        import optuna

        values = [row.get(o.column) for o in self.settings.objective]
        failed = row.get("status") not in (None, "ok") or any(_missing(v) for v in values)
        frozen = optuna.trial.create_trial(
            params=params, distributions=self.space.distributions(params),
            values=None if failed else [float(v) for v in values],  # type: ignore[arg-type]
            state=optuna.trial.TrialState.FAIL if failed else optuna.trial.TrialState.COMPLETE,
            constraints=self._constraint_values(row) or None)
        self.study.add_trial(frozen)
        point = Point(step, params, trial, None if failed else tuple(float(v) for v in values),  # type: ignore[arg-type]
                      tuple(self._violations(row)), gpu_s, str(row.get("error")) if failed else None, interval)
        self.points.append(point)
        self.next_step = max(self.next_step, step + 1)

    def _checks(self, row: Mapping[str, Any]) -> list[tuple[str, float, str]]:
        """Each constraint: its name, its value as Optuna takes it (at most 0 where it holds), and
        what it says in words where it does not."""
        c, out = self.settings.constraints, []
        if c.slo and "capacity_load" in row:
            out.append(("slo", 0.0 if row.get("capacity_load") is not None else 1.0,
                        "slo: no load in the range held it"))
        elif c.slo:
            target, got = float(row.get("slo_attainment_target") or 0.99), _number(row.get("slo_attainment"))
            out.append(("slo", 1.0 if got is None else target - got, f"slo: attainment {got} < {target:g}"))
        if c.min_capacity_req_s is not None:
            got = _number(row.get("capacity_req_s"))
            out.append(("min_capacity_req_s", c.min_capacity_req_s - (got or 0.0),
                        f"capacity_req_s {got} < {c.min_capacity_req_s:g}"))
        if c.min_accuracy is not None:
            got = _number(row.get("accuracy"))
            out.append(("min_accuracy", 1.0 if got is None else c.min_accuracy - got,
                        f"accuracy {got} < {c.min_accuracy:g}"))
        for name, bound in c.columns.items():
            got = _number(row.get(name))
            if bound.min is not None:
                out.append((f"{name}.min", 1.0 if got is None else bound.min - got, f"{name} {got} < {bound.min:g}"))
            if bound.max is not None:
                out.append((f"{name}.max", 1.0 if got is None else got - bound.max, f"{name} {got} > {bound.max:g}"))
        return out

    def _constraint_values(self, row: Mapping[str, Any]) -> dict[str, float]:
        return {name: value for name, value, _ in self._checks(row)}

    def _violations(self, row: Mapping[str, Any]) -> list[str]:
        return [words for _, value, words in self._checks(row) if value > 0]

    # -- the answer -------------------------------------------------------------------------
    def point_rows(self) -> list[tuple[str, SearchPoint]]:
        """Each told point as search.parquet's row, keyed by its shard's name."""
        outcome = self.outcome()
        best = {id(p) for p in outcome.best}
        objectives = self.settings.objective
        rows = []
        for p in sorted(self.points, key=lambda p: p.step):
            values = list(p.values or ())
            t = p.trial
            rows.append((f"{self.id}-{p.step:06d}", SearchPoint(
                search_id=self.id, search_step=p.step, search_params=t.search_params, trial_id=t.trial_id,
                capacity_id=t.capacity_id,
                label=t.configuration_label() if t.load_search is not None else t.label(),
                objective=str(objectives[0]), value=values[0] if values else None,
                objective_2=str(objectives[1]) if len(objectives) > 1 else None,
                value_2=values[1] if len(values) > 1 else None,
                interval_low=p.interval[0] if p.interval else None,
                interval_high=p.interval[1] if p.interval and math.isfinite(p.interval[1]) else None,
                feasible=p.feasible, violations="; ".join(p.violations) or None, error=p.error,
                gpu_s=p.gpu_s, best=id(p) in best)))
        return rows

    def gpu_s(self) -> float:
        return sum(p.gpu_s for p in self.points)

    def outcome(self) -> SearchOutcome:
        feasible = [p for p in self.points if p.feasible]
        signs = [1.0 if o.direction == "minimize" else -1.0 for o in self.settings.objective]
        best: list[Point] = []
        if feasible and len(signs) == 1:
            best = [min(feasible, key=lambda p: signs[0] * p.values[0])]  # type: ignore[index]
        elif feasible:
            best = sorted(_pareto(feasible, signs), key=lambda p: signs[0] * p.values[0])  # type: ignore[index]
        closest = None
        if not feasible:
            scored = [p for p in self.points if p.values is not None]
            closest = min(scored, key=lambda p: len(p.violations), default=None)
        return SearchOutcome(self.id, self.settings, list(self.points), self.gpu_s(), best, closest,
                             self.budget_left() or "every point asked for ended")


def _pareto(points: list[Point], signs: list[float]) -> list[Point]:
    def dominated(p: Point, q: Point) -> bool:
        pv = [s * v for s, v in zip(signs, p.values or (), strict=True)]
        qv = [s * v for s, v in zip(signs, q.values or (), strict=True)]
        return all(b <= a for a, b in zip(pv, qv, strict=True)) and any(b < a for a, b in zip(pv, qv, strict=True))

    return [p for p in points if not any(dominated(p, q) for q in points if q is not p)]


def _missing(value: Any) -> bool:
    return _number(value) is None


def _number(value: Any) -> float | None:
    """A figure as a float, or None where there is none (null, NaN, infinite)."""
    if value is None or isinstance(value, bool):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _why_no_value(settings: SearchSettings, row: Mapping[str, Any], values: list[Any]) -> str:
    """Why a point has no objective value: its trial failed, or its capacity search found none."""
    if row.get("status") not in (None, "ok"):
        return str(row.get("error") or row.get("status"))
    if row.get("bounded_by") == "low":
        return f"no load from {row.get('range_low'):g} held the SLO (its capacity is below the range)"
    if row.get("bounded_by") == "failed":
        return "a probe of its capacity search failed (its trial's error is in trials.parquet)"
    missing = [o.column for o, v in zip(settings.objective, values, strict=True) if _missing(v)]
    return f"no value for the objective ({', '.join(missing)})"


def _describe(params: Mapping[str, Any]) -> str:
    return " ".join(f"{k.removeprefix(OPTION_PREFIX)}={v}" for k, v in params.items())


def row_gpu_s(row: Mapping[str, Any]) -> float:
    """A point's GPU time from its trials row: its trial and its group's load, times its GPUs."""
    start, end = row.get("started_at"), row.get("finished_at")
    seconds = max((end - start).total_seconds(), 0.0) if start is not None and end is not None else 0.0
    return (seconds + float(row.get("load_s") or 0.0)) * max(int(row.get("tensor_parallel") or 1), 1)


# The objectives whose 95 % interval a trials row carries, as a share of the figure.
_REL_CI = {"energy_per_token_j": "energy_per_token_rel_ci95", "throughput_tok_s": "throughput_rel_ci95"}


def row_interval(settings: SearchSettings, row: Mapping[str, Any]) -> tuple[float, float] | None:
    column = settings.objective[0].column
    value, rel = _number(row.get(column)), _number(row.get(_REL_CI.get(column, "")))
    if value is None or rel is None:
        return None
    return (value * (1 - rel), value * (1 + rel))


def capacity_interval(settings: SearchSettings, found: Capacity) -> tuple[float, float] | None:
    """A capacity objective's bracket: the load that held, and the one above that failed."""
    if settings.objective[0].column not in ("capacity_req_s", "capacity_load") or found.capacity_load is None:
        return None
    return (found.capacity_load, found.fail_load if found.fail_load is not None else math.inf)


def stored_points(store: ResultStore, search: str) -> list[tuple[int, dict[str, Any]]]:
    """The points of ``search`` the results directory holds, by step: (step, parameters)."""
    table = store.read_shards("trials", columns=["search_id", "search_step", "search_params"])
    points: dict[int, dict[str, Any]] = {}
    for row in table.to_pylist():
        if row["search_id"] == search and row["search_step"] is not None and row["search_params"]:
            points.setdefault(int(row["search_step"]), json.loads(row["search_params"]))
    return sorted(points.items())
