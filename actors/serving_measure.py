"""One serving-mode trial: requests arriving at a rate, measured over the steady state.

The method's steps around the window are ``actors.method``'s; the window
(``ServingWindow``) is warm-up bursts, then the run inside one energy window:
every request sent at its arrival time, every token stamped -> the steady-state
window (actors.serving.stats), less any stretch where the client was behind its
schedule (actors.serving.lateness) -> throughput, latency, goodput and energy over
that window; each request's energy over the whole run (actors.serving.attribution);
the client's own send lateness, judged against a bound that matters for the trial.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from actors.backends.base import Backend, LoadInfo
from actors.backends.speculation import window_speculation
from actors.measure import reply_lengths
from actors.method import Figures, Measurement, Window, measure, ratio, window_energy, window_memory
from actors.quality.accuracy import conversation_replies, score, served_replies
from actors.serving import attribution, lateness
from actors.serving.arrivals import run_offsets
from actors.serving.attribution import RequestEnergy
from actors.serving.conversations import ConversationScript, conversation_figures
from actors.serving.records import ServedRequest, ServedRun, ServingRequest
from actors.serving.stats import (
    SteadyWindow,
    achieved_rate,
    in_flight,
    meets,
    prefix_cache_use,
    running,
    saturation,
    served_latency,
    steady_window,
    window_output_tokens,
)
from actors.stability import Verdict
from actors.workload import ConversationSource, PromptSource, answered, prompt_source
from sweeper.core.results import (
    Accuracy,
    ClientTimeliness,
    Energy,
    HostEnergy,
    Memory,
    Outcome,
    PerRequestEnergy,
    RequestRecord,
    RunEnergy,
    ServingRun,
    Speculation,
    SteadyState,
    Throughput,
)
from sweeper.core.settings import ServingSettings
from sweeper.core.status import Reason, Status
from sweeper.core.trial import Trial

if TYPE_CHECKING:
    from actors.telemetry import MeterReading, TelemetryBase

log = logging.getLogger(__name__)

# Warm-up bursts hold at most this many requests: enough to fill an engine's first
# batches (and, for transformers, build its paged cache), few enough to stay short.
WARMUP_REQUESTS = 8
# Without a trial time limit, a run gives up this long after its last arrival.
DEFAULT_RUN_LIMIT_S = 3600.0
# Share of the trial's time limit the run may use, leaving time to write what it measured.
RUN_SHARE_OF_TIMEOUT = 0.8


def _run_deadline(trial: Trial, last_arrival_s: float, started_s: float, now_s: float) -> float:
    timeout_s = trial.measure.timeout_s
    if timeout_s is not None:
        return started_s + RUN_SHARE_OF_TIMEOUT * timeout_s
    return now_s + last_arrival_s + DEFAULT_RUN_LIMIT_S


def serving_requests(settings: ServingSettings, *, request_rate: float, source: PromptSource, seed: int,
                     stream: int = 0) -> list[ServingRequest]:
    """The run's requests: ``source``'s prompts, arriving by the settings' process,
    ``num_prompts`` of them or as many as arrive within ``duration_s``. ``stream``
    picks another set of prompts and arrivals of the same seed (warm-up runs)."""
    offsets = run_offsets(settings, request_rate=request_rate, seed=seed, stream=stream)
    prompts = source.requests(int(offsets.size), stream)
    return [ServingRequest(i, p.ids, p.output_len, float(offsets[i]), source.stop_at_eos, p.text)
            for i, p in enumerate(prompts)]


class ServingWindow(Window):
    """Requests arriving at the trial's rate: warmed up by bursts, then the whole schedule
    played inside the window, every token stamped; the figures are the steady window's."""

    def __init__(self, backend: Backend, trial: Trial, source: PromptSource, clock: Callable[[], float]) -> None:
        if trial.serving is None or trial.request_rate is None:
            raise ValueError(f"trial {trial.trial_id} is not a serving-mode trial")
        self.backend, self.trial, self.source, self.clock = backend, trial, source, clock
        self.settings, self.rate = trial.serving, trial.request_rate
        self.started_s = clock()
        # Conversations: their first turns arrive by the process, later turns as replies end.
        self.script = source.script(run_offsets(self.settings, request_rate=self.rate, seed=trial.seed).tolist(),
                                    keep_answered=trial.scoring is not None) \
            if isinstance(source, ConversationSource) else None
        self.measured = self.script.first if self.script is not None else self._requests(stream=0)
        if trial.scoring is not None:  # the measured run's replies are kept, to be judged after it
            self.measured = [dataclasses.replace(r, keeps_reply=True) for r in self.measured]
        self.last_arrival_s = max(r.arrival_offset_s for r in self.measured)
        self.served: ServedRun | None = None
        self.t_end_s = self.started_s
        self.speculation: Speculation | None = None

    def _requests(self, stream: int, count: int | None = None) -> list:
        made = serving_requests(self.settings, request_rate=self.rate, source=self.source,
                                seed=self.trial.seed, stream=stream)
        return made[:count] if count is not None else made

    def prepare(self) -> None:
        # Nothing to compile per trial (the engine serves whatever shapes arrive); the trial's
        # memory peak starts here, as an offline trial's does after its shape is prepared.
        self.backend.reset_peak_memory()

    def warm_up(self) -> None:
        # Bursts of requests at once, until both warmup_iters bursts and warmup_s are done.
        m, clock, trial = self.trial.measure, self.clock, self.trial
        t_warm, warmed = clock(), 0
        while warmed < max(m.warmup_iters, 1) or clock() - t_warm < m.warmup_s:
            burst = [dataclasses.replace(r, arrival_offset_s=0.0)
                     for r in self._requests(stream=1 + warmed, count=WARMUP_REQUESTS)]
            self.backend.serve(burst, max_concurrency=trial.max_concurrency,
                               deadline_s=_run_deadline(trial, 0.0, self.started_s, clock()))
            warmed += 1
        self.backend.sync()

    def run(self, telemetry: TelemetryBase) -> None:
        trial, backend = self.trial, self.backend
        counted = backend.speculation_counts()
        self.served = backend.serve(
            self.measured, max_concurrency=trial.max_concurrency,
            deadline_s=_run_deadline(trial, self.last_arrival_s, self.started_s, self.clock()),
            follow=self.script.next_turn if self.script is not None else None)
        backend.sync()
        self.t_end_s = self.clock()
        # The whole run's, not the steady window's: the counters are the engine's, per step.
        self.speculation = window_speculation(counted, backend.speculation_counts())

    def figures(self, handle: MeterReading, telemetry: TelemetryBase, idle_power_w: float | None) -> Figures:
        run, trial = self.served, self.trial
        assert run is not None, "figures() before run()"
        if len(run.failed) == len(run.requests):
            if any(r.cut_by_time_limit for r in run.requests):
                # A server that held every request (hung, stalled, or still in its warm-up when
                # the limit passed): the run timed out, with each request marked as it stood,
                # not an exception. Nothing finished, so there is no figure to state.
                return Figures(parts=(), requests=_request_records(trial, run, None, None, self.script),
                               verdict=Verdict(), t_zero_s=run.t_start_s, t_end_s=self.t_end_s,
                               outcome=_outcome(run))
            raise RuntimeError(f"every request of the run failed: {run.failed[0].error}")
        # The steady window, less every stretch where the client itself was behind (actors.serving.lateness).
        ttft_p50 = lateness.ttft_p50_s(run.requests)
        bound_s = lateness.lateness_bound_s(ttft_p50)
        engine_window = steady_window(run)
        window = lateness.clear_of(engine_window, lateness.behind_spans(run.requests, bound_s))
        cut_s = (engine_window.duration_s if engine_window else 0.0) - (window.duration_s if window else 0.0)
        client = lateness.send_lateness(run.requests, window, bound_s, ttft_p50, cut_s).part(run.client_processes)
        whole = _served_run(trial, run, self.last_arrival_s)
        throughput, steady = _steady_figures(run, window, whole)
        energy, run_energy, host, memory = _energy(telemetry, handle, window, throughput.output_tokens or 0,
                                                   idle_power_w, self.backend.peak_memory_bytes())
        # Without a steady window the run's energy figures are not stated, nor its requests'.
        steady_held = window is not None and window.duration_s > 0
        request_energy, split = (_request_energy(run, telemetry, handle) if steady_held
                                 else (PerRequestEnergy(), None))
        done = [r for r in run.requests if r.ok]
        parts = (
            throughput, steady, whole, client, served_latency(run.requests), prefix_cache_use(run.requests),
            reply_lengths([r.prompt_tokens for r in done], [r.output_tokens for r in done])
            if self.source.varies() else None,
            conversation_figures(run, self.script, [e.energy_j for e in split] if split is not None else None)
            if self.script is not None else None,
            self.speculation, memory, energy, run_energy, host, request_energy,
        )
        verdict = _verdict(throughput, steady, whole, client, energy, window, trial, telemetry, handle,
                           engine_window=engine_window)
        requests, accuracy = self._scored(_request_records(trial, run, window, split, self.script), run)
        return Figures(parts=(*parts, accuracy), requests=requests,
                       verdict=verdict, t_zero_s=run.t_start_s, t_end_s=self.t_end_s, marks=_marks(run, window),
                       outcome=_outcome(run))


    def _scored(self, requests: list[RequestRecord], run: ServedRun) -> tuple[list[RequestRecord], Accuracy | None]:
        """The run's request records judged against their answers (a scored trial), and its accuracy."""
        if self.trial.scoring is None:
            return requests, None
        replies = (conversation_replies(self.script, run.requests) if self.script is not None
                   else served_replies(answered(self.source), run.requests))
        return score(requests, replies, self.trial.scoring)



def _outcome(run: ServedRun) -> Outcome:
    """ok, or failed with what it measured where the trial's time limit cut the run (a failed
    trial is re-run by --retry-failed)."""
    cut = sum(1 for r in run.failed if r.cut_by_time_limit)
    if not cut:
        return Outcome(status=Status.OK)
    return Outcome(status=Status.FAILED, reason=Reason.TIMEOUT,
                   error=f"{cut} of {len(run.requests)} requests had not finished when the run's time limit "
                         f"({RUN_SHARE_OF_TIMEOUT:.0%} of measure.timeout_s) passed")


def measure_serving_trial(backend: Backend, trial: Trial, load: LoadInfo, telemetry: TelemetryBase,
                          clock: Callable[[], float] = time.monotonic,
                          source: PromptSource | None = None) -> Measurement:
    """One serving-mode trial through the method's skeleton (``actors.method``); ``source``:
    the group's prompt source, built once per loaded model (else built here)."""
    if source is None:
        source = prompt_source(trial, load.vocab_size, trial.model_ref.max_positions)
    return measure(trial, ServingWindow(backend, trial, source, clock), telemetry, clock,
                   owner_pid=backend.process_owner())


def _marks(run: ServedRun, window: SteadyWindow | None) -> list[tuple[str, float, float]]:
    if window is None:
        return []
    return [("ramp", run.t_start_s, window.t_start_s), ("steady", window.t_start_s, window.t_end_s),
            ("drain", window.t_end_s, run.t_end_s)]


def _served_run(trial: Trial, run: ServedRun, last_arrival_s: float) -> ServingRun:
    """The run as a whole: the load offered, what failed, the SLOs met."""
    settings = trial.serving
    assert settings is not None
    rate = trial.request_rate or math.inf
    # The requests offered per second: every request over the span of their sends. A conversation's
    # next turn is sent after the reply before it, past the arrival schedule's last first turn, so
    # the span runs to the last send, not the schedule's end (which would count all the turns as
    # offered within the first turns' span, and read a keeping-up engine as short).
    sent_s = max((r.arrival_s for r in run.requests), default=run.t_start_s) - run.t_start_s
    span_s = max(last_arrival_s, sent_s)
    run_s = run.t_end_s - run.t_start_s
    bounds = settings.slo.bounds_s() if settings.slo is not None else {}
    good = sum(meets(r, bounds) for r in run.requests) if bounds else None
    return ServingRun(
        n_failed_requests=len(run.failed),
        offered_rate_req_s=rate if math.isinf(rate) or span_s <= 0 else len(run.requests) / span_s,
        run_duration_s=run_s,
        max_concurrency_reached=int(in_flight(run.requests, run.t_end_s).values.max(initial=0)),
        goodput_req_s=ratio(good, run_s) if good is not None else None,
        slo_attainment=good / len(run.requests) if good is not None and run.requests else None,
    )


def _steady_figures(run: ServedRun, window: SteadyWindow | None,
                    whole: ServingRun) -> tuple[Throughput, SteadyState]:
    """What the steady window did (its tokens and rate), and the state the engine held there."""
    if window is None or window.duration_s <= 0:
        return Throughput(n_requests=len(run.requests), duration_s=0.0, output_tokens=0), SteadyState()
    w0, w1 = window.t_start_s, window.t_end_s
    in_window = window_output_tokens(run, window)
    ok = run.completed
    prompt_tokens = sum(r.prompt_tokens for r in ok if r.first_token_s is not None and w0 < r.first_token_s <= w1)
    achieved = achieved_rate(run, window)
    sat = saturation(run, window, whole.offered_rate_req_s or math.inf, achieved)
    throughput = Throughput(n_requests=len(run.requests), duration_s=window.duration_s, output_tokens=in_window,
                            throughput_tok_s=in_window / window.duration_s, requests_per_s=achieved)
    steady = SteadyState(
        achieved_rate_req_s=achieved, total_throughput_tok_s=(in_window + prompt_tokens) / window.duration_s,
        window_start_s=w0 - run.t_start_s, window_end_s=w1 - run.t_start_s,
        mean_running_batch=running(ok).mean(w0, w1), steady_batch=window.level,
        saturated=sat.saturated, saturation_reason=sat.reason, queue_growth=sat.queue_growth)
    return throughput, steady


def _request_energy(run: ServedRun, telemetry: TelemetryBase, handle: MeterReading
                    ) -> tuple[PerRequestEnergy, list[RequestEnergy] | None]:
    """Each request's share of the run's energy, and the trial's figures over them."""
    if handle.window is None:
        return PerRequestEnergy(), None
    # Over the run's energy window itself (its boundaries a moment outside the first
    # arrival and the last token), so that the requests' energies sum to run_energy_j.
    split = attribution.request_energy_split(run.requests, handle.window.t_start_s,
                                             handle.window.t_end_s, telemetry.energies_between)
    done = [e for e, r in zip(split, run.requests, strict=True) if r.ok]
    energies = [e.energy_j for e in done]
    whole = sum(energies)
    return PerRequestEnergy(
        request_energy_method=attribution.METHOD,
        energy_per_request_j=float(np.mean(energies)) if done else None,
        energy_per_request_p50_j=float(np.percentile(energies, 50)) if done else None,
        energy_per_request_p90_j=float(np.percentile(energies, 90)) if done else None,
        attributed_energy_j=float(sum(e.energy_j for e in split)),
        request_prefill_share=sum(e.prefill_energy_j for e in done) / whole if whole > 0 else None,
        request_prefill_from=attribution.prefill_from([r for r in run.requests if r.ok]),
    ), split


def _energy(telemetry: TelemetryBase, handle: MeterReading, window: SteadyWindow | None, output_tokens: int,
            idle_power_w: float | None, peak_memory_bytes: int | None
            ) -> tuple[Energy, RunEnergy, HostEnergy, Memory]:
    """The steady window's energy (the headline), the whole run's beside it, the host's, and
    the memory held (the backend's peak over the trial, each GPU's over the steady window)."""
    from actors.telemetry import TelemetryError

    memory = window_memory(None, peak_memory_bytes)
    if window is None or window.duration_s <= 0:
        return Energy(), RunEnergy(), HostEnergy(), memory
    host = HostEnergy(cpu_energy_j=handle.cpu_energy_j, dram_energy_j=handle.dram_energy_j)
    if handle.window is None:
        return Energy(), RunEnergy(), host, memory
    try:
        steady = telemetry.interval("steady", window.t_start_s, window.t_end_s)
    except TelemetryError as exc:
        log.warning("no energy for the steady window: %s", exc)
        return Energy(), RunEnergy(), host, memory
    return (window_energy(steady, idle_power_w=idle_power_w, output_tokens=output_tokens),
            RunEnergy(run_energy_j=handle.window.energy_j, run_energy_uncertainty_j=handle.window.uncertainty_j),
            host, window_memory(steady, peak_memory_bytes))


def _verdict(throughput: Throughput, steady: SteadyState, whole: ServingRun, client: ClientTimeliness,
             energy: Energy, window: SteadyWindow | None, trial: Trial, telemetry: TelemetryBase,
             handle: MeterReading, *, engine_window: SteadyWindow | None) -> Verdict:
    """A serving trial's verdict (``actors.stability``): a client that kept its schedule, a
    steady window long enough to judge, its energy where GPUs are metered, no saturation
    below ``inf``, no failed request (the skeleton adds the baseline's). ``engine_window``:
    the steady window before the stretches where the client was behind were cut from it."""
    verdict = Verdict()
    if client.client_behind:
        verdict.flag(f"client behind: {client.client_behind_reason}")
    if window is None and engine_window is not None:
        verdict.flag("no steady state where the client kept its schedule (every part of the steady window "
                     "holds a request sent later than send_lateness_bound_s)")
    elif window is None:
        verdict.flag("no steady state: no request completed while others were still being admitted at the "
                     "steady level (the run is shorter than one request's life there; raise num_prompts)")
    else:
        verdict.window_length(window.duration_s, trial.measure.window_floor_s, what="steady window")
    # Without GPUs energy is not measured, which is no flaw of the trial.
    if telemetry.active and handle.window is None:
        verdict.no_energy_window(handle.error)
    elif telemetry.active and window is not None and window.duration_s > 0 and energy.energy_j is None:
        verdict.flag("no energy for the steady window (see the actor's log)")
    rate = trial.request_rate
    if steady.saturated and rate is not None and not math.isinf(rate):
        verdict.flag(f"saturated: {steady.saturation_reason}")
    if whole.n_failed_requests:
        verdict.flag(f"{whole.n_failed_requests} of {throughput.n_requests} requests failed")
    return verdict


def _request_records(trial: Trial, run: ServedRun, window: SteadyWindow | None,
                     energies: list[RequestEnergy] | None, script: ConversationScript | None = None
                     ) -> list[RequestRecord]:
    """The run's requests, one record each in the run's order, with its share of the run's
    energy where it was split (``energies``, in the same order; None: not attributed)."""
    settings = trial.serving
    bounds = settings.slo.bounds_s() if settings is not None and settings.slo is not None else {}
    split: list[RequestEnergy | None] = list(energies) if energies is not None else [None] * len(run.requests)
    return [_request_record(trial.trial_id, r, run.t_start_s, window, bounds, e,
                            script.turn_of(r.index) if script is not None else None)
            for r, e in zip(run.requests, split, strict=True)]


def _request_record(trial_id: str, r: ServedRequest, t0_s: float, window: SteadyWindow | None,
                    bounds_s: dict[str, float], energy: RequestEnergy | None,
                    turn_of: tuple[int, int] | None) -> RequestRecord:
    """One served request as the requests table records it: times from the run's start
    ``t0_s``; ``turn_of``: its conversation and turn (None outside conversations)."""

    def rel(t: float | None) -> float | None:
        return None if t is None else t - t0_s

    conversation, turn = turn_of if turn_of is not None else (None, None)
    return RequestRecord(
        trial_id=trial_id, request_index=r.index, conversation_id=conversation, turn=turn,
        input_len=r.prompt_tokens, output_tokens=r.output_tokens, t_start_s=rel(r.submit_s),
        ttft_s=r.ttft_s, tpot_s=r.tpot_s, e2e_s=r.e2e_s, arrival_s=rel(r.arrival_s),
        send_lateness_s=r.send_lateness_s, cached_tokens=r.cached_tokens, scheduled_s=rel(r.scheduled_s),
        first_token_s=rel(r.first_token_s), finish_s=rel(r.finish_s), queue_s=r.queue_s,
        itl_s=r.itl_s if r.ok else None,
        in_window=(window is not None and r.finish_s is not None
                   and window.t_start_s < r.finish_s <= window.t_end_s),
        meets_slo=meets(r, bounds_s) if bounds_s else None,
        energy_j=energy.energy_j if energy is not None else None,
        prefill_energy_j=energy.prefill_energy_j if energy is not None else None,
        error=r.error,
    )
