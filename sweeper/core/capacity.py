"""Capacity under an SLO: the highest offered load a configuration holds, found by probing.

A serving sweep may give its load axis as a range to search rather than a list of values
(``request_rate: {capacity: {low, high, resolution}}``, or the same for
``max_concurrency``). Each configuration then runs probes, ordinary trials at one load each,
on one loaded engine, and this module decides what the next probe is from the ones so far:

1. the range's ``low`` first; a fail there ends the search (nothing in the range holds);
2. bracketing: each pass is followed by ``growth`` times its load (capped at ``high``) until
   a probe fails, or ``high`` passes;
3. bisection, geometric, between the highest pass and the lowest fail, until they are within
   ``resolution`` of each other (for concurrency: also adjacent integers).

A probe whose figures cannot be trusted (flagged unstable without having fallen behind, or too
few requests to tell the attainment target) is measured once more at the same load before the
search goes on, its arrivals ``STRETCH`` times as long (``num_prompts`` and ``duration_s``): a
short window on an engine still settling (the first probe on a freshly started ``vllm serve``
on an H100 read p99 TPOT 18.8 ms falling to 10.4 ms across its 2.1 s window) must not end a
search. The longer probe's verdict replaces the first's; if it is still untrusted, the answer
says so (``precise``).

A probe passes when its trial is ``ok``, its SLO attainment (the share of its requests
meeting every bound) is at least the target, and, for a request rate, the engine kept up (not
``saturated``); a concurrency probe offers no rate to keep up with, so its SLO alone judges it.
The policy is a pure function of the probes' loads and verdicts: a resumed run replays the
stored probes through it and asks exactly the probes an uninterrupted run would have.
"""

from __future__ import annotations

import enum
import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import Field, model_validator

from sweeper.core.results import Part, column
from sweeper.core.settings import Settings

LoadAxis = Literal["request_rate", "max_concurrency"]
LOAD_AXES: tuple[LoadAxis, ...] = ("request_rate", "max_concurrency")

# The attainment a probe must reach when the SLO does not say (vLLM's serve_sla uses the
# same share for its goodput search).
DEFAULT_ATTAINMENT = 0.99
# Each pass's load times this, while bracketing: a knee anywhere in [low, high] is bracketed
# in log2(high / low) probes.
GROWTH = 2.0
# An untrusted probe's re-measure runs its arrivals this many times as long; once per load.
STRETCH = 2
# Loads are rounded to this many significant digits, so that a probe's trial id (its load is
# part of it) is the same on every machine and every resume.
_DIGITS = 6


class LoadSearch(Settings):
    """One configuration's capacity search: which load axis, its range, when it is found."""

    axis: LoadAxis
    low: float = Field(gt=0)
    high: float = Field(gt=0)
    resolution: float = Field(0.05, gt=0, lt=1)
    # The share of a probe's requests that must meet every SLO bound; None: no SLO, a probe
    # passes when the engine keeps up.
    attainment: float | None = Field(None, gt=0, le=1)

    @model_validator(mode="after")
    def _ordered(self) -> LoadSearch:
        if self.low >= self.high:
            raise ValueError(f"low ({self.low:g}) must be below high ({self.high:g})")
        if self.axis == "max_concurrency" and not (float(self.low).is_integer() and float(self.high).is_integer()):
            raise ValueError("max_concurrency's low and high are whole numbers of requests")
        return self

    @property
    def integer(self) -> bool:
        return self.axis == "max_concurrency"

    def value(self, load: float) -> float | int:
        """``load`` as the axis holds it: requests in flight are whole numbers."""
        return int(load) if self.integer else float(load)

    def max_steps(self) -> int:
        """Loads a search probes at most: ``low``, the bracket's doublings, the bisection's halvings."""
        bracket = math.ceil(math.log(self.high / self.low, GROWTH))
        bisect = max(0, math.ceil(math.log2(math.log(GROWTH) / math.log1p(self.resolution))))
        return 1 + bracket + bisect

    def max_probes(self) -> int:
        """Probes a search can take at most: each load's, and a longer re-measure of each."""
        return 2 * self.max_steps()


class ProbeVerdict(str, enum.Enum):
    """What a probe says of its load."""

    PASS = "pass"  # the SLO held and the engine kept up
    SLO = "slo"  # fewer requests than the target met the SLO
    SATURATION = "saturation"  # the SLO held (or none was set), but the engine fell behind
    FAILED = "failed"  # the trial did not measure (an error, a time-out): the search stops

    @property
    def fails(self) -> bool:
        return self in (ProbeVerdict.SLO, ProbeVerdict.SATURATION)


# The trials-table columns a probe is judged by (and its capacity row reports).
PROBE_COLUMNS = ("trial_id", "status", "error", "slo_attainment", "saturated", "unstable", "unstable_reason",
                 "n_requests", "n_failed_requests", "achieved_rate_req_s", "goodput_req_s",
                 "energy_per_request_j", "energy_per_token_j", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s",
                 "tpot_p99_s", "started_at", "finished_at", "load_s", "tensor_parallel")


@dataclass(frozen=True)
class Probe:
    """One probe's trial, as the search reads it: its load and the figures it is judged by."""

    load: float
    trial_id: str
    verdict: ProbeVerdict
    # Whether its figures can be trusted for the knee (an unstable trial, or too few requests
    # to tell the attainment target apart from one request more or less).
    trustworthy: bool
    why_not: str | None
    figures: Mapping[str, Any] = field(default_factory=dict, compare=False)
    # How many times the configuration's arrivals it ran (a re-measure: STRETCH).
    stretch: int = 1

    @classmethod
    def from_row(cls, search: LoadSearch, load: float, row: Mapping[str, Any], stretch: int = 1) -> Probe:
        verdict = judge(search, row)
        why_not = _distrust(search, row)
        return cls(load=float(load), trial_id=str(row.get("trial_id")), verdict=verdict,
                   trustworthy=why_not is None, why_not=why_not,
                   figures={k: row.get(k) for k in PROBE_COLUMNS}, stretch=stretch)

    @property
    def gpus(self) -> int:
        return max(int(self.figures.get("tensor_parallel") or 1), 1)

    @property
    def gpu_s(self) -> float:
        """The probe's trial time on its GPUs (its actor's clock; a CPU node counts as one)."""
        start, end = self.figures.get("started_at"), self.figures.get("finished_at")
        if start is None or end is None:
            return 0.0
        return max((end - start).total_seconds(), 0.0) * self.gpus


def probes_gpu_s(probes: Sequence[Probe]) -> float:
    """GPU-seconds of a configuration's probes: their trial time, and the model load they ran
    on (each probe's row carries its group's ``load_s``; the probes share one engine), times
    their GPUs."""
    load_s = max((float(p.figures.get("load_s") or 0.0) * p.gpus for p in probes), default=0.0)
    return sum(p.gpu_s for p in probes) + load_s


def judge(search: LoadSearch, row: Mapping[str, Any]) -> ProbeVerdict:
    if row.get("status") != "ok":
        return ProbeVerdict.FAILED
    if search.attainment is not None:
        attainment = row.get("slo_attainment")
        if attainment is None or attainment < search.attainment:
            return ProbeVerdict.SLO
    # Saturation is falling behind an offered rate. A concurrency probe offers none (the client
    # holds its requests back at the cap, which its saturation flag counts as waiting): the SLO
    # alone judges it.
    if row.get("saturated") and search.axis == "request_rate":
        return ProbeVerdict.SATURATION
    return ProbeVerdict.PASS


def _distrust(search: LoadSearch, row: Mapping[str, Any]) -> str | None:
    if row.get("status") != "ok":
        return None
    # A probe past the knee is flagged unstable because the engine fell behind: that is its
    # verdict, not a doubt about it.
    if row.get("unstable") and not row.get("saturated"):
        return f"unstable: {row.get('unstable_reason') or 'the trial was flagged'}"
    n = row.get("n_requests") or 0
    if search.attainment is not None and search.attainment < 1 and _one_request_flips(search.attainment, row, n):
        # Below this count any pass hangs on one request (it needs every request within the SLO).
        needed = math.ceil(1 / (1 - search.attainment))
        return (f"{n} requests cannot tell {search.attainment:.0%} attainment (one late request is "
                f"{1 / max(n, 1):.1%}); raise workload.num_prompts to at least {needed}")
    return None


def _one_request_flips(target: float, row: Mapping[str, Any], n: int) -> bool:
    """Whether one request judged the other way would turn the probe's verdict on the SLO, with
    fewer requests than the target can tell apart: a pass needs every one of them on time, and
    a fail by one request is as thin. A fail by many (none of 56 on time: the SLO is out of reach
    at this load) is settled however few they are, and measuring it again buys nothing."""
    if n >= math.ceil(1 / (1 - target)):
        return False
    attainment = row.get("slo_attainment")
    if attainment is None:
        return True
    met = round(attainment * n)
    passed = met >= target * n
    return passed or (met + 1) >= target * n


def _round(load: float) -> float:
    return float(f"{load:.{_DIGITS}g}")


@dataclass(frozen=True)
class NextProbe:
    """What the search asks for next: a load, and how many times the arrivals to run there."""

    load: float | int
    stretch: int = 1


def next_probe(search: LoadSearch, probes: Sequence[Probe]) -> NextProbe | None:
    """The next probe, or None: the search has its answer (``capacity`` says which)."""
    if not probes:
        return NextProbe(search.value(search.low))
    if any(p.verdict is ProbeVerdict.FAILED for p in probes):
        return None
    last = probes[-1]
    if not last.trustworthy and last.stretch == 1:
        return NextProbe(search.value(last.load), STRETCH)
    load = _next_load(search, latest(probes))
    return NextProbe(load) if load is not None else None


def latest(probes: Sequence[Probe]) -> list[Probe]:
    """Each load's last probe (a re-measure's verdict replaces its first's), in load order."""
    by_load = {p.load: p for p in probes}
    return [by_load[load] for load in sorted(by_load)]


def _next_load(search: LoadSearch, probes: Sequence[Probe]) -> float | int | None:
    passes = [p.load for p in probes if p.verdict is ProbeVerdict.PASS]
    fails = [p.load for p in probes if p.verdict.fails]
    if not passes:
        return None  # low failed: nothing in the range holds
    low, high = max(passes), (min(fails) if fails else None)
    if high is None:
        if low >= search.high:
            return None  # the range's top holds
        step = min(search.high, low * GROWTH)
        return search.value(math.floor(step) if search.integer else _round(step))
    if high / low <= 1 + search.resolution:
        return None
    mid = math.sqrt(low * high)
    if search.integer:
        mid = round(mid)
        if not low < mid < high:
            return None  # adjacent whole numbers: nothing between them
        return int(mid)
    return _round(mid)


class BoundedBy(str, enum.Enum):
    """What ended a capacity search."""

    SLO = "slo"  # a higher load missed the SLO attainment
    SATURATION = "saturation"  # a higher load held the SLO but the engine fell behind
    HIGH = "high"  # the range's top held: the capacity is at least high
    LOW = "low"  # the range's bottom failed: the capacity is below low (no capacity found)
    FAILED = "failed"  # a probe's trial failed
    INCOMPLETE = "incomplete"  # the search was stopped before it ended (resume completes it)


def capacity_id(identity: Mapping[str, Any], axis: LoadAxis) -> str:
    """The configuration's id: its trials' identity without the searched load."""
    rest = {k: v for k, v in identity.items() if k != axis}
    blob = json.dumps(rest, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Capacity(Part):
    """One configuration's capacity (capacity.parquet): the highest load that held, and its figures there."""

    capacity_id: str | None = column("the configuration: its trials' identity without the searched load")
    sweep: str | None = column("sweep name")
    model: str | None = column("model entry as written in the sweep file")
    backend: str | None = column("inference backend")
    backend_options: str | None = column("the backend's validated options, canonical JSON")
    precision: str | None = column("numeric format")
    tensor_parallel: int | None = column("GPUs the configuration holds")
    input_len: int | None = column("prompt tokens per request (null: a dataset's prompts)")
    output_len: int | None = column("generated tokens per request (or their cap)")
    repeat: int | None = column("repeat index")
    load_axis: str | None = column("the load searched: request_rate | max_concurrency")
    range_low: float | None = column("the searched range's bottom (requests/s, or requests in flight)")
    range_high: float | None = column("the searched range's top")
    resolution: float | None = column("the search ended once its bracket was within this share of its load")
    attainment_target: float | None = column(
        "the share of a probe's requests that had to meet every SLO bound (null: no SLO; a probe passed "
        "when the engine kept up)")
    capacity_load: float | None = column(
        "the highest load that passed (request_rate: requests/s; max_concurrency: requests in flight); "
        "null: none did")
    capacity_req_s: float | None = column(
        "requests per second at capacity: the rate offered (request_rate) or completed in the steady "
        "window (max_concurrency)")
    capacity_concurrency: int | None = column("max_concurrency: requests in flight at capacity (null for request_rate)")
    bounded_by: str | None = column(
        "what ended the search: slo (the next load missed the attainment target) | saturation (it held the "
        "SLO but the engine fell behind) | high (the range's top held) | low (its bottom failed: no "
        "capacity) | failed (a probe's trial failed) | incomplete (stopped; the next run resumes it)")
    precise: bool | None = column(
        "the knee is bracketed within the resolution by two trusted probes (ok, stable, enough requests "
        "to tell the target); false: read capacity_load as approximate (imprecise_reason says why)")
    imprecise_reason: str | None = column("why precise is false")
    n_probes: int | None = column("probes the search ran or reused")
    gpu_s: float | None = column("the probes' trial time and the model load they ran on, x their GPUs")
    slo_attainment: float | None = column("at capacity: share of the probe's requests meeting every SLO bound")
    goodput_req_s: float | None = column("at capacity: requests meeting every SLO bound per second")
    energy_per_request_j: float | None = column("at capacity: GPU energy per completed request")
    energy_per_token_j: float | None = column("at capacity: GPU energy per output token")
    ttft_p50_s: float | None = column("at capacity: median time to first token")
    ttft_p99_s: float | None = column("at capacity: 99th percentile time to first token")
    tpot_p50_s: float | None = column("at capacity: median time per output token")
    tpot_p99_s: float | None = column("at capacity: 99th percentile time per output token")
    pass_trial_id: str | None = column("the probe at capacity: the highest load that passed")
    fail_trial_id: str | None = column("the probe above it: the lowest load that failed (null: none did)")
    fail_load: float | None = column("the lowest load that failed (null: none did)")


def capacity(search: LoadSearch, probes: Sequence[Probe], identity: Mapping[str, Any]) -> Capacity:
    """The search's answer from its probes (complete or not); ``identity``: the configuration's
    own columns (model, backend, ... of any of its probes' rows)."""
    measured = latest(probes)
    passes = [p for p in measured if p.verdict is ProbeVerdict.PASS]
    fails = [p for p in measured if p.verdict.fails]
    at = max(passes, key=lambda p: p.load) if passes else None
    above = min(fails, key=lambda p: p.load) if fails else None
    bounded = _bounded_by(search, probes, at, above)
    precise, why = _precision(search, bounded, at, above, measured)
    figures = at.figures if at is not None else {}
    if at is None:
        rate = None
    elif search.integer:
        rate = figures.get("achieved_rate_req_s")
    else:
        rate = at.load
    return Capacity(
        capacity_id=identity.get("capacity_id"), sweep=identity.get("sweep"), model=identity.get("model"),
        backend=identity.get("backend"), backend_options=identity.get("backend_options"),
        precision=identity.get("precision"), tensor_parallel=identity.get("tensor_parallel"),
        input_len=identity.get("input_len"), output_len=identity.get("output_len"), repeat=identity.get("repeat"),
        load_axis=search.axis, range_low=search.low, range_high=search.high, resolution=search.resolution,
        attainment_target=search.attainment, capacity_load=at.load if at is not None else None,
        capacity_req_s=rate, capacity_concurrency=int(at.load) if at is not None and search.integer else None,
        bounded_by=bounded.value, precise=precise, imprecise_reason=why, n_probes=len(probes),
        gpu_s=probes_gpu_s(probes),
        slo_attainment=figures.get("slo_attainment"), goodput_req_s=figures.get("goodput_req_s"),
        energy_per_request_j=figures.get("energy_per_request_j"),
        energy_per_token_j=figures.get("energy_per_token_j"),
        ttft_p50_s=figures.get("ttft_p50_s"), ttft_p99_s=figures.get("ttft_p99_s"),
        tpot_p50_s=figures.get("tpot_p50_s"), tpot_p99_s=figures.get("tpot_p99_s"),
        pass_trial_id=at.trial_id if at is not None else None,
        fail_trial_id=above.trial_id if above is not None else None,
        fail_load=above.load if above is not None else None)


def _bounded_by(search: LoadSearch, probes: Sequence[Probe], at: Probe | None, above: Probe | None) -> BoundedBy:
    if any(p.verdict is ProbeVerdict.FAILED for p in probes):
        return BoundedBy.FAILED
    if next_probe(search, probes) is not None:
        return BoundedBy.INCOMPLETE
    if at is None:
        return BoundedBy.LOW
    if above is None:
        return BoundedBy.HIGH
    return BoundedBy.SLO if above.verdict is ProbeVerdict.SLO else BoundedBy.SATURATION


def _precision(search: LoadSearch, bounded: BoundedBy, at: Probe | None,
               above: Probe | None, measured: Sequence[Probe]) -> tuple[bool, str | None]:
    if bounded is BoundedBy.LOW:
        low = measured[0] if measured else None
        doubt = f" (the probe there, {low.load:g}, is {low.why_not})" if low is not None and low.why_not else ""
        return False, f"no load in the range held{doubt}"
    if bounded in (BoundedBy.FAILED, BoundedBy.INCOMPLETE):
        return False, {BoundedBy.FAILED: "a probe's trial failed",
                       BoundedBy.INCOMPLETE: "the search was stopped before its bracket closed"}[bounded]
    if bounded is BoundedBy.HIGH:
        return False, f"the range's top ({search.high:g}) held: the capacity is at least that"
    for name, probe in (("at capacity", at), ("above it", above)):
        if probe is not None and not probe.trustworthy:
            return False, f"the probe {name} ({probe.load:g}) is {probe.why_not}"
    return True, None
