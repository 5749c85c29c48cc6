"""Each served request's share of the energy the GPUs used while serving.

Method (``token_share``)
------------------------
A request is processed by the engine over segments of time: its prefill, from
when the engine scheduled it (where the engine says; else when it was sent: an HTTP
server does not say, and its queue's wait then lies in the segment) until its first
token, processes its prompt tokens
(those it computed: tokens its prefix cache held, ``cached_tokens``, cost no prefill
work, so a conversation's later turn or a shared-prefix prompt is not charged for
the history the cache served);
each later interval between two of its tokens processes one token. Within a
segment its work is spread evenly. The run is cut at every segment boundary of
every request into slices; each slice's energy (read from the same energy curve
as the trial's windows, so slice energies add up to the run's energy exactly)
is split over the requests in flight then, in proportion to the tokens each
processes in the slice. Slices with no request in flight (the engine idles
between arrivals) are shared by all of the run's requests in proportion to
their tokens: the cost of keeping the engine up. The per-request energies
therefore sum to the energy of the run, which carries the run window's
uncertainty.

A prefill token and a decode token weigh the same here: a prefill token costs
less compute per token than a decode step's share of the weights' traffic, so
this over-charges requests while they prefill next to decoding ones. It is the
simplest rule that needs nothing but each request's timestamps; per-step
engine statistics could refine it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from actors.serving.records import ServedRequest

METHOD = "token_share"


def prefill_from(requests: Sequence[ServedRequest]) -> str | None:
    """Where the requests' prefill segments began (``request_prefill_from``): ``scheduled`` where
    the engine stamped every one, ``sent`` where it stamped none (an HTTP server), else ``mixed``;
    None without requests."""
    stamped = {r.scheduled_s is not None for r in requests}
    if not stamped:
        return None
    return "mixed" if len(stamped) > 1 else "scheduled" if True in stamped else "sent"


def segments(request: ServedRequest) -> tuple[np.ndarray, np.ndarray]:
    """A request's work: segment boundaries (n + 1 times) and the tokens each of the n
    segments processes. Tokens delivered at one instant join the segment before them."""
    start, times = request.prefill_start_s, request.token_times_s
    if start is None or not times:
        return np.zeros(0), np.zeros(0)
    bounds = [min(start, times[0])]
    weights: list[float] = []
    # What the next segment processes: first the prompt tokens the engine computed (at least one:
    # an engine never serves a prompt's last token from its cache).
    carry = float(max(request.prompt_tokens - (request.cached_tokens or 0), 1))
    for t in times:
        if t > bounds[-1]:
            bounds.append(t)
            weights.append(carry)
            carry = 1.0
        elif weights:
            weights[-1] += 1.0  # delivered with the token before it: made in that segment
        else:
            carry += 1.0  # a token at the very instant the request was scheduled
    if not weights:  # no time passed between scheduling and the last token: no span to spread over
        return np.zeros(0), np.zeros(0)
    return np.array(bounds), np.array(weights)


@dataclass(frozen=True)
class RequestEnergy:
    """One request's share of a serving run's energy."""

    energy_j: float  # its work's share of every slice it ran in, and its part of the idle slices
    prefill_energy_j: float  # of energy_j, the share of the slices of its prefill (scheduled to first token)


def request_energies(requests: Sequence[ServedRequest], t_start_s: float, t_end_s: float,
                     energies_between: Callable[[list[tuple[float, float]]], list[float]]) -> list[float]:
    """Joules per request (in the order given) over [t_start, t_end]: see the module docstring.
    Requests that did no work (failed before scheduling) get 0."""
    return [e.energy_j for e in request_energy_split(requests, t_start_s, t_end_s, energies_between)]


def request_energy_split(requests: Sequence[ServedRequest], t_start_s: float, t_end_s: float,
                         energies_between: Callable[[list[tuple[float, float]]], list[float]]) -> list[RequestEnergy]:
    """``request_energies`` with each request's prefill part beside its whole (the idle
    slices' shares count in the whole only: they are no request's prefill)."""
    work = [segments(r) for r in requests]
    cuts = {t_start_s, t_end_s}
    for bounds, _ in work:
        cuts.update(float(t) for t in bounds if t_start_s <= t <= t_end_s)
    edges = np.array(sorted(cuts))
    if edges.size < 2:
        return [RequestEnergy(0.0, 0.0)] * len(requests)
    slice_energy = np.array(energies_between(list(zip(edges[:-1].tolist(), edges[1:].tolist(), strict=True))))
    mids = (edges[:-1] + edges[1:]) / 2.0
    lengths = np.diff(edges)
    # tokens[r] over the slices its span covers: (first slice, token counts per slice)
    shares: list[tuple[int, np.ndarray, np.ndarray]] = []  # first slice, tokens per slice, prefill's slices
    per_slice = np.zeros(mids.size)
    for bounds, weights in work:
        if bounds.size == 0:
            shares.append((0, np.zeros(0), np.zeros(0, dtype=bool)))
            continue
        lo = int(np.searchsorted(mids, bounds[0]))
        hi = int(np.searchsorted(mids, bounds[-1]))
        seg = np.searchsorted(bounds, mids[lo:hi], side="right") - 1
        density = weights / np.diff(bounds)  # tokens per second within each segment
        tokens = density[seg] * lengths[lo:hi]
        per_slice[lo:hi] += tokens
        shares.append((lo, tokens, seg == 0))
    idle = per_slice <= 0
    totals = np.array([tokens.sum() for _, tokens, _ in shares])
    idle_energy = float(slice_energy[idle].sum())
    grand = totals.sum()
    out = []
    for (lo, tokens, prefill), total in zip(shares, totals, strict=True):
        busy = slice_energy[lo:lo + tokens.size]
        denominators = per_slice[lo:lo + tokens.size]
        own = np.divide(busy * tokens, denominators, out=np.zeros_like(tokens), where=denominators > 0)
        idle_share = idle_energy * total / grand if grand > 0 else 0.0
        out.append(RequestEnergy(float(own.sum()) + idle_share, float(own[prefill].sum())))
    return out
