"""What a search will cost at most, before it runs: what ``sweeper plan`` shows of a capacity
search (``request_rate: {capacity: ...}``) and of a configuration search (``search:``)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from sweeper.core.capacity import LoadSearch
from sweeper.core.search import Budget, Dimension, Range, SearchSettings
from sweeper.plan.expand import Plan


@dataclass(frozen=True)
class SearchBounds:
    """The most a sweep's searches can run: configurations, probes, trials and GPU-hours."""

    configurations: int  # runnable grid points (each a configuration, or a search's categorical point)
    probes: int  # trials per configuration: a capacity search's most probes, else 1
    points: int  # configurations evaluated: the search's budget (bounded by its space), else all
    gpus: int  # GPUs a configuration holds at most
    # Seconds a trial and a model load may take at most (measure.timeout_s, load_timeout_s);
    # None where a trial has no time limit.
    trial_limit_s: float | None
    load_limit_s: float

    @property
    def trials(self) -> int:
        return self.points * self.probes

    @property
    def gpu_hours(self) -> float | None:
        """The most GPU time the time limits allow (None: trials have no limit)."""
        if self.trial_limit_s is None:
            return None
        return self.points * (self.load_limit_s + self.probes * self.trial_limit_s) * max(self.gpus, 1) / 3600


def search_bounds(plan: Plan) -> SearchBounds | None:
    """The bounds of ``plan``'s searches (None: a plain grid)."""
    sweep = plan.sweep
    load: LoadSearch | None = sweep.workload.load_search
    search: SearchSettings | None = sweep.search
    if load is None and search is None:
        return None
    runnable = plan.runnable
    points = len(runnable)
    if search is not None:
        points = min(search.budget.trials or points * _space_size(search), points * _space_size(search))
    return SearchBounds(configurations=len(runnable), probes=load.max_probes() if load is not None else 1,
                        points=points, gpus=max((t.num_gpus for t in runnable), default=1),
                        trial_limit_s=sweep.measure.timeout_s, load_limit_s=sweep.measure.load_timeout_s)


def _space_size(search: SearchSettings) -> int:
    """How many values the numeric dimensions add per grid point (a continuous range: as many as
    a budget asks for)."""
    n = 1
    for dim in search.space.values():
        if isinstance(dim, Range):
            n *= int(dim.high - dim.low + 1) if dim.int_ else 1_000_000
        else:
            n *= len(dim)
    return min(n, 1_000_000)


def bounds_lines(plan: Plan) -> list[str]:
    """The plan's search lines for ``sweeper plan``."""
    bounds = search_bounds(plan)
    if bounds is None:
        return []
    load, search = plan.sweep.workload.load_search, plan.sweep.search
    lines = []
    if load is not None:
        lines.append(_capacity_line(load, bounds))
    if search is not None:
        lines.append(_search_line(search, bounds))
    lines.append(_cost_line(bounds, search.budget.gpu_hours if search is not None else None))
    return lines


def _capacity_line(load: LoadSearch, bounds: SearchBounds) -> str:
    """What a capacity search probes, what it holds each load to, and how many probes it takes at most."""
    unit = "req/s" if load.axis == "request_rate" else "requests in flight"
    target = f"{load.attainment:.3g} of requests within the SLO" if load.attainment is not None else "no SLO"
    return (f"capacity search: {load.axis} from {load.low:g} to {load.high:g} {unit}, to "
            f"{load.resolution:.0%}, holding {target} without saturating: at most {load.max_steps()} load(s) "
            f"per configuration, on one loaded engine, each measured again for twice as long if its figures "
            f"are not to be trusted (the {load.axis} column shows each one's first)")


def _search_line(search: SearchSettings, bounds: SearchBounds) -> str:
    """A configuration search's sampler, objectives, space and budget."""
    objectives = ", ".join(str(o) for o in search.objective)
    ranges = [_dimension_text(key, dim) for key, dim in search.space.items()]
    return (f"search ({search.sampler}, seed {search.seed}): {objectives}; space: the "
            f"{bounds.configurations} runnable grid point(s) below" + (f" x {'; '.join(ranges)}" if ranges else "")
            + f"; budget: {_budget_text(search.budget)}")


def _dimension_text(key: str, dim: Dimension) -> str:
    """One dimension of a search's space: a range with its scale, or the values it picks from."""
    name = key.removeprefix("backend_options.")
    if isinstance(dim, Range):
        return f"{name} in [{dim.low:g}, {dim.high:g}]" + (" log" if dim.log else "") + (" int" if dim.int_ else "")
    return f"{name} in {dim}"


def _budget_text(budget: Budget) -> str:
    """When a search stops: after its points, its GPU-hours, or whichever comes first."""
    parts = []
    if budget.trials is not None:
        parts.append(f"{budget.trials} point(s)")
    if budget.gpu_hours is not None:
        parts.append(f"{budget.gpu_hours:g} GPU-h")
    return ", ".join(parts)


def _cost_line(bounds: SearchBounds, budget_gpu_h: float | None) -> str:
    """The most trials the searches run, and what bounds their GPU time: the time limits, the
    search's budget, or nothing yet (then how to bound it)."""
    cap = f"at most {bounds.trials:,} trial(s) ({bounds.points:,} configuration(s) x {bounds.probes} probe(s))"
    hours = bounds.gpu_hours
    if hours is not None and math.isfinite(hours):
        cap += f", at most {hours:,.2f} GPU-h by the time limits (measure.timeout_s, load_timeout_s)"
    elif budget_gpu_h is None:
        cap += "; set measure.timeout_s (a trial's limit) to bound its GPU time"
    if budget_gpu_h is not None:
        # The budget stops new points; the ones running when it is spent finish.
        cap += (f"; the budget stops it once {budget_gpu_h:g} GPU-h are spent (the points then running, one per "
                "free GPU, finish)")
    return cap
