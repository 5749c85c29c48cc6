"""How late the client sent each request, and whether that was late enough to matter.

A serving run's latencies are the engine's only while the client keeps its schedule. A
request the client sends late reaches the engine late (the load offered is not the one
asked for), and a client whose event loop is behind stamps the chunks it reads late too,
so its TTFT and ITL then hold the client's delay: at 470 requests/s on a 2-core machine,
the HTTP client's first requests once left up to 164 ms late and its TTFT p99 read 45 ms
against the server's own 11 ms. Every request records its send lateness
(``ServedRequest.send_lateness_s``: sent less due, due being its arrival or, where
``max_concurrency`` held it back, the moment a slot came free), and the trial judges it.

The rule. A trial is ``client_behind`` when the run's p99 send lateness exceeds the larger
of ``LATENESS_FLOOR_S`` and ``LATENESS_SHARE_OF_TTFT`` of its TTFT p50:

- 5 ms, because a client that keeps up sends within its event loop's timer granularity
  (epoll waits in whole milliseconds) plus the scheduling noise of a busy small machine,
  and a floor below that would flag clients that keep up;
- 10 % of TTFT p50, because the bound must matter for what the trial measures: against a
  TTFT of 2 s (an engine queueing at its capacity) 20 ms of lateness moves nothing, while
  against one of 10 ms, 5 ms is half the figure.

p99 and not the maximum: a single late request (a garbage collection in the client) is
one request's latency, a p99 of them is the tail the trial reports. The flag makes the
trial ``unstable`` with its figures in the reason, as an imprecise estimate does.

The steady window. Each request sent later than the bound marks the stretch from when it
was due to when it left as one where the client was behind; the steady window
(``actors.serving.stats``) is cut to its longest part free of every such stretch
(``clear_of``), so its throughput, energy and rates are never the client's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from actors.serving.records import ServedRequest
from actors.serving.stats import SteadyWindow
from sweeper.core.results import ClientTimeliness

# The bound on the run's p99 send lateness: the larger of these (module docstring).
LATENESS_FLOOR_S = 0.005
LATENESS_SHARE_OF_TTFT = 0.10
# The percentile the bound judges.
JUDGED_PERCENTILE = 99


def lateness_bound_s(ttft_p50_s: float | None) -> float:
    """The largest p99 send lateness a trial may have and not be flagged ``client_behind``."""
    if ttft_p50_s is None:
        return LATENESS_FLOOR_S
    return max(LATENESS_FLOOR_S, LATENESS_SHARE_OF_TTFT * ttft_p50_s)


def ttft_p50_s(requests: Sequence[ServedRequest]) -> float | None:
    """The run's TTFT p50 over its completed requests (``served_latency``'s figure)."""
    ttft = [r.ttft_s for r in requests if r.ok and r.ttft_s is not None]
    return float(np.percentile(ttft, 50)) if ttft else None


def behind_spans(requests: Sequence[ServedRequest], bound_s: float) -> list[tuple[float, float]]:
    """The stretches where the client was behind: from when each request sent later than
    ``bound_s`` was due to when it left (absolute times, in the order of their starts)."""
    spans = [(r.send_due_s, r.submit_s) for r in requests
             if r.submit_s is not None and r.submit_s - r.send_due_s > bound_s]
    return sorted(spans)


def clear_of(window: SteadyWindow | None, spans: Sequence[tuple[float, float]]) -> SteadyWindow | None:
    """The longest part of ``window`` that meets none of ``spans``; None when nothing of it is left."""
    if window is None:
        return None
    free = [(window.t_start_s, window.t_end_s)]
    for a, b in spans:
        parts = []
        for start, end in free:
            if b <= start or a >= end:
                parts.append((start, end))
                continue
            if a > start:
                parts.append((start, a))
            if b < end:
                parts.append((b, end))
        free = parts
    if not free:
        return None
    start, end = max(free, key=lambda part: part[1] - part[0])
    return SteadyWindow(start, end, window.level)


@dataclass(frozen=True)
class LatenessSummary:
    """p50, p99 and max of a set of send latenesses (None with none)."""

    count: int
    p50_s: float | None
    p99_s: float | None
    max_s: float | None

    @classmethod
    def of(cls, values: Sequence[float]) -> LatenessSummary:
        if not values:
            return cls(0, None, None, None)
        p50, p99 = np.percentile(values, [50, JUDGED_PERCENTILE])
        return cls(len(values), float(p50), float(p99), float(max(values)))


@dataclass(frozen=True)
class SendLateness:
    """The run's send lateness, over the whole run and its steady window, against its bound."""

    bound_s: float
    ttft_p50_s: float | None
    run: LatenessSummary
    steady: LatenessSummary  # the requests due inside the steady window
    late: int  # requests sent later than the bound
    window_cut_s: float  # steady window left out because the client was behind there

    @property
    def behind(self) -> bool:
        return self.run.p99_s is not None and self.run.p99_s > self.bound_s

    @property
    def reason(self) -> str | None:
        if not self.behind:
            return None
        assert self.run.p99_s is not None and self.run.max_s is not None
        ttft = f"{1e3 * self.ttft_p50_s:.3g} ms" if self.ttft_p50_s is not None else "unknown"
        text = (f"send lateness p{JUDGED_PERCENTILE} {1e3 * self.run.p99_s:.3g} ms (max "
                f"{1e3 * self.run.max_s:.3g} ms; {self.late} of {self.run.count} requests later than the bound) > "
                f"{1e3 * self.bound_s:.3g} ms, the larger of {1e3 * LATENESS_FLOOR_S:g} ms and "
                f"{LATENESS_SHARE_OF_TTFT:.0%} of TTFT p50 ({ttft}): the client fell behind its schedule, and "
                "its latencies hold its own delay")
        if self.window_cut_s > 0:
            text += f"; the steady window leaves out {self.window_cut_s:.3g} s where it was behind"
        return text

    def part(self, client_processes: int | None = None) -> ClientTimeliness:
        """The trial's result part; ``client_processes``: how many processes the client sent from."""
        return ClientTimeliness(
            send_lateness_p50_s=self.run.p50_s, send_lateness_p99_s=self.run.p99_s, send_lateness_max_s=self.run.max_s,
            steady_send_lateness_p50_s=self.steady.p50_s, steady_send_lateness_p99_s=self.steady.p99_s,
            steady_send_lateness_max_s=self.steady.max_s, send_lateness_bound_s=self.bound_s,
            client_behind=self.behind, client_behind_reason=self.reason, client_processes=client_processes)


def send_lateness(requests: Sequence[ServedRequest], window: SteadyWindow | None, bound_s: float,
                  ttft_p50: float | None, window_cut_s: float) -> SendLateness:
    """The run's send lateness (every request sent) and its steady window's (those due in it);
    ``window_cut_s``: how much of the steady window ``clear_of`` left out."""
    sent = [(r.send_due_s, lateness) for r in requests if (lateness := r.send_lateness_s) is not None]
    steady = ([lateness for due, lateness in sent if window.t_start_s <= due < window.t_end_s]
              if window is not None else [])
    return SendLateness(bound_s=bound_s, ttft_p50_s=ttft_p50, run=LatenessSummary.of([x for _, x in sent]),
                        steady=LatenessSummary.of(steady), late=sum(1 for _, x in sent if x > bound_s),
                        window_cut_s=window_cut_s)
