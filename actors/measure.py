"""Offline trials: static batches of generate calls, and the figures they give.

The method's steps around the window (compile, warm-up, baseline, timeline,
verdict) are ``actors.method``'s; here is the window itself (``OfflineWindow``:
generate calls until ``min_iters``, ``min_duration_s`` and enough >= 1 s blocks
for an interval, or until precise) and the per-request, latency and length
figures that serving trials share.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from actors.backends.base import Backend, LoadInfo
from actors.backends.speculation import window_speculation
from actors.convergence import ENERGY_SETTLE_S, WindowPrecision, window_precision
from actors.figures import mean, percentile, percentiles
from actors.method import Figures, Measurement, Window, measure, ratio, window_energy, window_memory
from actors.quality.accuracy import offline_replies, score
from actors.records import Generation, PromptBatch, RequestTiming
from actors.stability import Verdict
from actors.telemetry.telemetry import MIN_STABILITY_BLOCK_S
from actors.workload import PromptSource, answered, prompt_source
from sweeper.core.results import (
    Compile,
    Energy,
    HostEnergy,
    IterationNoise,
    Latency,
    Lengths,
    PerRequestEnergy,
    PhaseEnergy,
    RequestRecord,
    Roofline,
    Speculation,
    Throughput,
)
from sweeper.core.trial import Trial

if TYPE_CHECKING:
    from actors.telemetry import EnergyReport, MeterReading, TelemetryBase

__all__ = ["Measurement", "OfflineWindow", "measure_trial"]


def window_energy_parts(report: EnergyReport | None, *, idle_power_w: float | None, output_tokens: int,
                        decode_tokens: int) -> tuple[Energy, PhaseEnergy, HostEnergy]:
    """An offline window's energy from its telemetry report: the window's own (``window_energy``),
    by phase (decode's per decoded token: every token but each request's first) and the host's.
    Empty parts without a report (no GPUs, or no window)."""
    if report is None:
        return Energy(), PhaseEnergy(), HostEnergy()
    phases = report.phase_energy_j
    return (
        window_energy(report.window, idle_power_w=idle_power_w, output_tokens=output_tokens),
        PhaseEnergy(prefill_energy_j=phases.get("prefill"), decode_energy_j=phases.get("decode"),
                    decode_energy_per_token_j=ratio(phases.get("decode"), decode_tokens),
                    between_phases_energy_j=report.between_phases_energy_j),
        HostEnergy(cpu_energy_j=report.cpu_energy_j, dram_energy_j=report.dram_energy_j),
    )


def _prompt_len(timing: RequestTiming, input_len: int | None) -> int | None:
    """A sequence's prompt tokens: its own where the call had prompts of several lengths, else
    the trial's common one."""
    return timing.prompt_tokens if timing.prompt_tokens is not None else input_len


def request_record(trial_id: str, iteration: int, index: int, timing: RequestTiming, t0_s: float,
                   input_len: int | None, energy_j: float | None = None) -> RequestRecord:
    """One sequence of generate call ``iteration`` as the requests table records it, times from
    the window's start ``t0_s``; ``energy_j``: its share of the window's (None: not attributed)."""
    ttft = timing.t_first_token_s - timing.t_start_s
    e2e = timing.t_end_s - timing.t_start_s
    n = timing.output_tokens
    return RequestRecord(
        trial_id=trial_id, iteration=iteration, request_index=index, input_len=_prompt_len(timing, input_len),
        output_tokens=n, t_start_s=timing.t_start_s - t0_s, ttft_s=ttft, e2e_s=e2e,
        # vLLM's definition: the first token is prefill's, not decode's.
        tpot_s=(e2e - ttft) / (n - 1) if n > 1 else None, energy_j=energy_j)


def request_records(trial_id: str, generations: list[Generation], t0_s: float, input_len: int | None,
                    energies_j: Sequence[float] | None = None) -> list[RequestRecord]:
    """The window's requests: every sequence of every generate call, in order, each with its
    energy share where the window's energy was split (``call_request_energies``, in that order)."""
    timings = [(i, j, r) for i, g in enumerate(generations) for j, r in enumerate(g.requests)]
    energies: Sequence[float | None] = energies_j if energies_j is not None else [None] * len(timings)
    return [request_record(trial_id, i, j, r, t0_s, input_len, e)
            for (i, j, r), e in zip(timings, energies, strict=True)]


def offline_latency(requests: Sequence[RequestRecord]) -> Latency:
    """Mean and percentiles of TTFT, TPOT and E2E over the offline window's requests
    (``request_records``: every request of every generate call). A serving run's requests have
    their own, ``actors.serving.stats.served_latency`` (completed ones only, ITL, queue)."""
    tpot = [r.tpot_s for r in requests if r.tpot_s is not None]
    return Latency(**percentiles("ttft", [r.ttft_s for r in requests if r.ttft_s is not None]),
                   **percentiles("tpot", tpot),
                   **percentiles("e2e", [r.e2e_s for r in requests if r.e2e_s is not None]))


# A CV from fewer iterations says little about the next ones.
MIN_CV_ITERATIONS = 3


def iteration_throughput_cv(generations: list[Generation]) -> float | None:
    """The coefficient of variation of output tokens per second across the window's
    generate calls (each timed between device synchronizations); None with fewer than
    ``MIN_CV_ITERATIONS``. Host-bound loops (eager decode at small batch, any CPU run)
    vary here first, and it needs no GPU to measure."""
    rates = [g.output_tokens / (g.t_end_s - g.t_start_s) for g in generations if g.t_end_s > g.t_start_s]
    if len(rates) < MIN_CV_ITERATIONS:
        return None
    mean_rate = float(np.mean(rates))
    return float(np.std(rates, ddof=1) / mean_rate) if mean_rate > 0 else None


def offline_verdict(throughput: Throughput, noise: IterationNoise, *, trial: Trial, handle: MeterReading,
                    telemetry: TelemetryBase, precision: WindowPrecision, judge_noise: bool) -> Verdict:
    """An offline window's verdict (``actors.stability``): its precision against
    ``max_rel_ci`` (or the target it measured towards), its length and its energy window;
    per-iteration noise only as ``noisy_host``. The skeleton adds the baseline's."""
    m = trial.measure
    verdict = Verdict()
    duration_s = throughput.duration_s or 0.0
    if m.target_rel_ci is None:
        # With a precision target the achieved interval judges the window, not its length.
        verdict.window_length(duration_s, m.window_floor_s)
    if telemetry.active and handle.window is None:
        verdict.no_energy_window(handle.error)
    bound, bound_name = ((m.target_rel_ci, "target_rel_ci") if m.target_rel_ci is not None
                         else (m.max_rel_ci, "max_rel_ci"))
    verdict.precision(precision, bound, bound_name=bound_name, duration_s=duration_s,
                      energy_expected=telemetry.active and handle.window is not None)
    if judge_noise:
        verdict.process_noise(m.max_iteration_cv, throughput_cv=noise.iteration_throughput_cv,
                              iterations=throughput.n_iterations or 0, energy_cv=noise.iteration_energy_cv)
    return verdict


def reply_lengths(input_lens: Sequence[int], output_lens: Sequence[int], *, prompt_pad_share: float | None = None,
                  decode_idle_slot_share: float | None = None) -> Lengths:
    """Prompt and reply lengths of a trial's requests (offline and serving rows alike), and
    what a static batch wasted on them where the window ran one."""
    return Lengths(input_len_mean=mean(input_lens), output_len_mean=mean(output_lens),
                   output_len_p50=percentile(output_lens, 50), output_len_p90=percentile(output_lens, 90),
                   prompt_pad_share=prompt_pad_share, decode_idle_slot_share=decode_idle_slot_share)


def lengths(generations: list[Generation], requests: Sequence[RequestRecord]) -> Lengths:
    """How long prompts and replies were, and what a static batch of mixed lengths wasted:
    ``prompt_pad_share``, the padding share of the batches' prompt slots (every prompt is
    padded to its batch's longest), and ``decode_idle_slot_share``, the share of decode
    slots (sequences x steps, every call running until its longest reply is done) held by
    sequences whose reply had already ended."""
    outputs = [r.output_tokens for r in requests]
    inputs = [r.input_len for r in requests if r.input_len is not None]
    prompt_slots = pad = decode_slots = idle = 0
    # An engine that batches continuously inside a call (vLLM) pads nothing and lets early
    # finishers leave: its calls have no such waste to report.
    for g in (g for g in generations if g.static_batch):
        lens = [r.prompt_tokens for r in g.requests if r.prompt_tokens is not None]
        if lens:
            prompt_slots += len(lens) * max(lens)
            pad += len(lens) * max(lens) - sum(lens)
        outs = [r.output_tokens for r in g.requests]
        decode_slots += len(outs) * max(outs)
        idle += len(outs) * max(outs) - sum(outs)
    return reply_lengths(inputs, outputs, prompt_pad_share=pad / prompt_slots if prompt_slots else None,
                         decode_idle_slot_share=idle / decode_slots if decode_slots else None)


def call_request_energies(generations: list[Generation], input_len: int | None, energy_j: float,
                     call_energies_j: list[float]) -> list[float]:
    """Each request's share of the window's energy (token_share, as in serving mode), in the
    order of ``request_records``: a call's energy split over its sequences by the tokens each
    processed (prompt + output); the window's energy outside the calls (the host's time
    between them) split over every sequence the same way. They add up to ``energy_j``.
    ``input_len``: the prompt length of a sequence that does not state its own."""
    tokens = np.array([(_prompt_len(r, input_len) or 0) + r.output_tokens for g in generations for r in g.requests],
                      dtype=float)
    out = np.zeros(len(tokens))
    start = 0
    for g, e in zip(generations, call_energies_j, strict=True):
        n = len(g.requests)
        share = tokens[start:start + n]
        out[start:start + n] = e * share / share.sum() if share.sum() > 0 else e / n
        start += n
    rest = energy_j - float(sum(call_energies_j))
    out += rest * tokens / tokens.sum() if tokens.sum() > 0 else rest / max(len(out), 1)
    return out.tolist()


def offline_batch_size(trial: Trial) -> int:
    """An offline trial's batch size (serving-mode trials have none: the engine batches)."""
    if trial.batch_size is None:
        raise ValueError(f"trial {trial.trial_id} has no batch size: serving-mode trials run through "
                         "actors.serving_measure")
    return trial.batch_size


class OfflineWindow(Window):
    """Static batches of generate calls: the trial's shape compiled, warmed up, then called
    inside the window until ``min_iters`` and ``min_duration_s`` are reached and, with
    ``target_rel_ci``, until the headline intervals (at least ``MIN_CI_BLOCKS`` blocks of
    >= 1 s) are within it or ``max_duration_s`` has passed. A fixed window is as long as
    the sweep asked; one too short for an interval is flagged, not lengthened."""

    def __init__(self, backend: Backend, trial: Trial, load: LoadInfo, source: PromptSource,
                 clock: Callable[[], float]) -> None:
        self.backend, self.trial, self.load, self.source, self.clock = backend, trial, load, source, clock
        self.batch_size = offline_batch_size(trial)
        self.generations: list[Generation] = []
        self.t0_s = self.t1_s = 0.0
        self.prepared: Compile | None = None
        self.speculation: Speculation | None = None

    def prepare(self) -> None:
        # Compilation and graph capture for the shape, timed apart: never in the window.
        self.prepared = self.backend.prepare(self.batch_size, self.trial.input_len or 0, self.trial.output_len)
        self.backend.reset_peak_memory()

    def warm_up(self) -> None:
        m, clock = self.trial.measure, self.clock
        t_warm, warmed = clock(), 0
        while warmed < m.warmup_iters or clock() - t_warm < m.warmup_s:
            self.backend.generate_batch(self.source.batch(-1 - warmed, self.batch_size))
            warmed += 1
        self.backend.sync()

    def run(self, telemetry: TelemetryBase) -> None:
        m, clock, backend, generations = self.trial.measure, self.clock, self.backend, self.generations
        cap_s = m.window_cap_s
        backend.sync()
        counted = backend.speculation_counts()  # read outside the window: host work
        t0 = self.t0_s = clock()
        checked_s = t0
        while True:
            generations.append(backend.generate_batch(self._batch(len(generations))))
            now = clock()
            if len(generations) < m.min_iters or now - t0 < m.min_duration_s:
                continue
            if m.target_rel_ci is None or cap_s is None or now - t0 >= cap_s:
                break
            # At most once per block's length: the check is host work inside the window.
            if now - checked_s >= MIN_STABILITY_BLOCK_S:
                checked_s = now
                precision = window_precision(generations, telemetry, energy_before_s=now - ENERGY_SETTLE_S)
                if precision.meets(m.target_rel_ci, energy_expected=telemetry.active):
                    break
        backend.sync()
        self.t1_s = clock()
        self.speculation = window_speculation(counted, backend.speculation_counts())

    def _batch(self, iteration: int) -> PromptBatch:
        batch = self.source.batch(iteration, self.batch_size)
        # A scored trial's measured calls return their replies (read after the window).
        return dataclasses.replace(batch, keep_replies=True) if self.trial.scoring is not None else batch

    def figures(self, handle: MeterReading, telemetry: TelemetryBase, idle_power_w: float | None) -> Figures:
        trial, generations, varies = self.trial, self.generations, self.source.varies()
        t0, duration_s = self.t0_s, self.t1_s - self.t0_s
        n_requests = sum(len(g.requests) for g in generations)
        output_tokens = sum(g.output_tokens for g in generations)
        marks = [mark for g in generations for mark in g.marks]
        decode_tokens = sum(max(r.output_tokens - 1, 0) for g in generations for r in g.requests)
        report = telemetry.report(handle, marks=marks, iteration_bounds=[(g.t_start_s, g.t_end_s) for g in generations])
        energy, phases, host = window_energy_parts(report, idle_power_w=idle_power_w, output_tokens=output_tokens,
                                                   decode_tokens=decode_tokens)
        request_energy, shares = self._request_energy(energy, n_requests, telemetry)
        # Each request's record whole, its energy share in it, once the window's energy is split.
        requests = request_records(trial.trial_id, generations, t0, trial.input_len, shares)
        accuracy = None
        if trial.scoring is not None:
            replies = offline_replies(answered(self.source), generations, self.batch_size)
            requests, accuracy = score(requests, replies, trial.scoring)
        throughput = Throughput(
            n_iterations=len(generations), n_requests=n_requests, duration_s=duration_s,
            output_tokens=output_tokens, throughput_tok_s=output_tokens / duration_s,
            requests_per_s=n_requests / duration_s)
        latency = offline_latency(requests)
        noise = IterationNoise(iteration_energy_cv=report.iteration_energy_cv if report is not None else None,
                               iteration_throughput_cv=iteration_throughput_cv(generations))
        precision = window_precision(generations, telemetry)
        # Iterations of varied prompts or replies differ in work by design: their CVs are recorded
        # but say nothing of the host (repeats of the trial are how to judge noise there).
        verdict = offline_verdict(throughput, noise, trial=trial, handle=handle, telemetry=telemetry,
                                  precision=precision, judge_noise=not varies)
        parts = (
            self.prepared, throughput, lengths(generations, requests) if varies else None, latency,
            self.speculation, window_memory(report.window if report is not None else None,
                                            self.backend.peak_memory_bytes()),
            energy, phases, host, request_energy,
            precision.part(trial.measure.target_rel_ci, energy_expected=telemetry.active), noise,
            self._roofline(throughput, latency, telemetry), accuracy,
        )
        return Figures(parts=parts, requests=requests, verdict=verdict, t_zero_s=t0, t_end_s=self.t1_s,
                       marks=marks)

    def _request_energy(self, energy: Energy, n_requests: int,
                        telemetry: TelemetryBase) -> tuple[PerRequestEnergy, list[float] | None]:
        """The window's energy per request; with varied prompts or replies, also each request's
        own share (for its record, in the order of ``request_records``) and their spread."""
        mean_j = ratio(energy.energy_j, n_requests)
        if energy.energy_j is None or not self.source.varies():
            return PerRequestEnergy(energy_per_request_j=mean_j), None
        generations = self.generations
        calls = telemetry.energies_between([(g.t_start_s, g.t_end_s) for g in generations])
        shares = call_request_energies(generations, self.trial.input_len, energy.energy_j, calls)
        return PerRequestEnergy(energy_per_request_j=mean_j, energy_per_request_p50_j=percentile(shares, 50),
                                energy_per_request_p90_j=percentile(shares, 90),
                                request_energy_method="token_share"), shares

    def _roofline(self, throughput: Throughput, latency: Latency, telemetry: TelemetryBase) -> Roofline | None:
        # The roofline's formulas take one prompt and one reply length: a dataset's or natural
        # lengths vary per sequence (and pad), so they would misstate the work done.
        trial, load = self.trial, self.load
        if load.architecture is None or self.source.varies() or trial.input_len is None \
                or throughput.throughput_tok_s is None:
            return None
        from sweeper.core.gpus import held_gpu_names
        from sweeper.core.precisions import PRECISIONS
        from sweeper.core.roofline import roofline

        return roofline(
            load.architecture, PRECISIONS[trial.precision], batch_size=self.batch_size,
            input_len=trial.input_len, output_len=trial.output_len,
            gpu_names=held_gpu_names(telemetry.environment().gpu_names, load.device_name,
                                     trial.tensor_parallel),
            throughput_tok_s=throughput.throughput_tok_s, tpot_s=latency.tpot_s,
        )


def measure_trial(backend: Backend, trial: Trial, load: LoadInfo, telemetry: TelemetryBase,
                  clock: Callable[[], float] = time.monotonic, source: PromptSource | None = None) -> Measurement:
    """One offline trial through the method's skeleton (``actors.method``); ``source``: the
    group's prompt source, built once per loaded model (else built here)."""
    if source is None:
        source = prompt_source(trial, load.vocab_size, trial.model_ref.max_positions)
    return measure(trial, OfflineWindow(backend, trial, load, source, clock), telemetry, clock,
                   owner_pid=backend.process_owner())
