"""The trial actor: one per group of trials that share a loaded model.

The control plane wraps ``TrialRunner`` with ``ray.remote`` and the resources
the group needs; nothing here depends on Ray, so the same object runs in a
plain process (benchmarks, tests of the method).
"""

from __future__ import annotations

import logging
import os
import time
import traceback
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from actors import environment
from actors.backends import create_backend
from actors.backends.base import Backend, LoadInfo, ModelSpec
from actors.layers.profile_pass import failed_pass, profile_layers
from actors.measure import Measurement
from actors.stages import StageClock, stage
from actors.windows import measure_for
from actors.workload import PromptSources, answered
from sweeper.core.backends import BACKENDS
from sweeper.core.outcome import LoadResult, Placement, TrialOutcome
from sweeper.core.results import (
    ChoiceLikelihood,
    Environment,
    Fidelity,
    LayerPass,
    Outcome,
    Perplexity,
    ServerSetup,
    Setup,
    TrialResult,
)
from sweeper.core.schema import RowError, check_rows, records_table
from sweeper.core.secrets import redact
from sweeper.core.status import Reason, failed_outcome
from sweeper.core.trial import GroupLoad, Trial

if TYPE_CHECKING:
    import pyarrow as pa

    from actors.telemetry import IdleBaseline, TelemetryBase

log = logging.getLogger(__name__)


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _slug(text: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "-" for ch in text)[:60]


# The most of an error's text a trial's row keeps.
ERROR_CHARS = 4000


def _error_text(exc: BaseException) -> str:
    """The exception as a row's error says it (uncut, unredacted: ``TrialRunner._redacted``)."""
    text = f"{type(exc).__name__}: {exc}".strip()
    # Keep where it happened: the last frame is usually the telling one.
    frames = traceback.extract_tb(exc.__traceback__)
    if frames:
        f = frames[-1]
        text += f" (at {f.filename.rsplit('/', 1)[-1]}:{f.lineno} in {f.name})"
    return text


@dataclass(frozen=True)
class _LoadParts:
    """The parts of a trial's result that its group's load decides, made once per trial."""

    setup: Setup
    server: ServerSetup
    environment: Environment


class TrialRunner:
    def __init__(self) -> None:
        self.stages = StageClock()
        started_at, t0 = _now(), time.monotonic()
        self.backend: Backend | None = None
        self.load_info: LoadInfo | None = None
        self.load_s: float | None = None
        self.telemetry: TelemetryBase | None = None
        self.pre_load_idle: IdleBaseline | None = None
        self.env = environment.capture()
        self._quality_parts: tuple[Fidelity, Perplexity] | None = None  # the group's, once per load
        self._likelihoods: dict[tuple[Any, ...], ChoiceLikelihood] = {}  # by prompt source, once per load
        self._reference: Any = None  # the reference step's outputs, or why there are none
        self._sources: PromptSources | None = None  # the loaded model's prompt sources, built once each
        self.loads = 0  # models this process has loaded (more than one: handed on between groups)
        self.stages.add("actor_start", started_at, time.monotonic() - t0)

    # -- lifecycle -------------------------------------------------------------
    def load(self, trial: Trial, group: GroupLoad | None = None) -> LoadResult:
        """Load the group's model once; every later ``run`` reuses it. The references of the
        groups it serves (``group.serves_reference``) are computed right after the load, so
        those groups start no reference load of their own."""
        from actors.quality.reference import ReferenceDuty

        group = group or GroupLoad()
        duty = ReferenceDuty(group.serves_reference)
        with self.stages.current():
            try:
                duty.claim()  # before the load: the groups it serves wait for its files
                result = self._load(trial, group)
                if result.ok and duty.claimed:
                    backend, load_info = self._loaded()
                    with stage("reference"):
                        duty.fulfil(backend, load_info.vocab_size)
            finally:
                duty.release()
        result.stages = self.stages.take()
        return result

    def _load(self, trial: Trial, group: GroupLoad) -> LoadResult:
        # An actor handed on to another group closes the previous one's model first.
        if self.backend is not None:
            import gc

            with stage("close"):
                self.close()
                self.backend, self.load_info, self.telemetry = None, None, None
                gc.collect()  # cycles holding tensors go now, not at some later allocation
        self._quality_parts = self._reference = None
        self._likelihoods = {}
        self._sources = None
        self.loads += 1
        try:
            if self.loads == 1:  # untouched only before this process's first load
                with stage("pre_load_idle"):
                    self.pre_load_idle = self._pre_load_idle(trial)
            if trial.fidelity is not None:
                # Its own step, before the group's model loads: the two never share the GPU.
                from actors.quality.fidelity import prepare_reference
                from actors.quality.reference import is_reference

                # The reference itself has none: no span, rather than one that shows or not as
                # its microseconds fall either side of the stage clock's floor.
                if not is_reference(trial):
                    with stage("reference"):
                        self._reference = prepare_reference(trial, create_backend)
            self.backend = create_backend(trial.backend)
            t0 = time.monotonic()
            with stage("load"):
                self.load_info = self.backend.load(ModelSpec(
                    source=trial.model_source, location=trial.model_location,
                    precision=trial.precision, options=trial.backend_options, seed=trial.seed,
                    tensor_parallel=trial.tensor_parallel,
                    # A fidelity pass compares precisions: they must hold the same weights.
                    weights_on_disk=trial.fidelity is not None,
                    serving=trial.serving is not None,
                    name=f"{_slug(trial.model)}-{trial.precision}-{trial.trial_id[:8]}",
                    load_timeout_s=trial.measure.load_timeout_s,
                    chat=bool(trial.prompts is not None and trial.prompts.chat),
                    step_tokens=group.step_tokens, log_dir=group.server_log_dir, secrets=group.secrets,
                ))
                self.load_s = time.monotonic() - t0
                self.telemetry = self._open_telemetry(trial)
        except Exception as exc:  # reported as the group's failure, never raised
            self._log_failure("load failed", trial, exc)
            return LoadResult(ok=False, error=self._redacted(trial, _error_text(exc)),
                              reason=Reason.OOM if self._is_oom(exc) else Reason.LOAD_FAILED)
        return LoadResult(ok=True, load_s=self.load_s)

    @staticmethod
    def _pre_load_idle(trial: Trial) -> IdleBaseline | None:
        """The held GPUs' settled idle power before this group's model loads (no context of
        ours on them): what the GPU draws untouched, beside the trial's own baseline, which
        is taken with the model loaded. None without GPUs or with ``idle_s: 0``."""
        from actors.telemetry import Telemetry

        if trial.measure.idle_s <= 0:
            return None
        telemetry = Telemetry.open(interval_s=trial.measure.sample_interval_s, sync=lambda: None)
        if not telemetry.active:
            return None
        telemetry.start()
        try:
            return telemetry.idle_baseline(trial.measure.idle_s)
        finally:
            telemetry.close()

    def _open_telemetry(self, trial: Trial) -> TelemetryBase:
        from actors.telemetry import NullTelemetry, Telemetry

        backend, load_info = self._loaded()
        if load_info.device != "cuda":
            return NullTelemetry(reason=load_info.unmetered_reason or "CPU-only trial: no GPU energy to measure")
        telemetry = Telemetry.open(interval_s=trial.measure.sample_interval_s, sync=backend.sync,
                                   cuda_visible_devices=load_info.metered_gpus)
        telemetry.start()
        return telemetry

    def _loaded(self) -> tuple[Backend, LoadInfo]:
        if self.backend is None or self.load_info is None:
            raise RuntimeError("run() before a successful load()")
        return self.backend, self.load_info

    def _secrets(self, trial: Trial) -> tuple[str, ...]:
        """What no text of this actor's may show: the trial's secret flags' values (a launched
        server's ``--hf-token``) and what its backend holds (the server's fresh key)."""
        held = self.backend.secret_values() if self.backend is not None else ()
        return (*BACKENDS[trial.backend].secret_values(trial.backend_options), *held)

    def _redacted(self, trial: Trial, text: str) -> str:
        """``text`` as a row's error keeps it: every secret replaced, whatever raised it (an
        exception may quote a server's command line), then cut (after: a cut secret would no
        longer match)."""
        return redact(text, self._secrets(trial))[:ERROR_CHARS]

    def _log_failure(self, what: str, trial: Trial, exc: BaseException) -> None:
        """What ``log.exception`` writes, its secrets replaced: the traceback ends in the
        exception's message, and the worker's log outlives the run."""
        trace = "".join(traceback.format_exception(exc)).rstrip()
        log.error("%s\n%s", what, redact(trace, self._secrets(trial)))

    def _is_oom(self, exc: BaseException) -> bool:
        return self.backend is not None and self.backend.is_out_of_memory(exc)

    def close(self) -> None:
        if self.telemetry is not None:
            self.telemetry.close()
        if self.backend is not None:
            self.backend.close()

    def ping(self) -> Placement:
        return Placement(self.env.hostname or "", self.env.ray_node_id or "", self.env.ray_gpu_ids, os.getpid())

    # -- one trial ---------------------------------------------------------------
    def run(self, trial: Trial) -> TrialOutcome:
        with self.stages.current(), stage("harness"):
            outcome = self._run(trial)
        outcome.stages = self.stages.take()
        return outcome

    def _run(self, trial: Trial) -> TrialOutcome:
        started = _now()
        load = self._load_parts()
        try:
            backend, load_info = self._loaded()
            if self.telemetry is None:
                raise RuntimeError("run() before a successful load()")
            if self._sources is None:
                self._sources = PromptSources(load_info.vocab_size, trial.model_ref.max_positions)
            measured = measure_for(trial)(backend, trial, load_info, self.telemetry, source=self._sources.for_trial(trial))
            # Made here, in the process that recorded them: a record the schema cannot hold
            # fails its own trial (below), with the reason, and the sweep goes on.
            tables: dict[str, Any] = {"requests": records_table("requests", measured.requests)}
        except RowError as exc:  # parts that do not make one result (one given twice), or a bad record
            log.error("trial %s: %s", trial.trial_id, self._redacted(trial, str(exc)))
            return self._failed(trial, Reason.INVALID_ROW, str(exc), started, load)
        except Exception as exc:
            oom = self._is_oom(exc)
            if self.backend is not None:
                self.backend.recover()
            return self._failed(trial, Reason.OOM if oom else Reason.EXCEPTION, _error_text(exc), started,
                                load)
        if measured.timeline is not None:
            tables["timeline"] = measured.timeline
        # A serving run cut by its time limit says so itself (status failed, with what it measured).
        outcome = measured.result.outcome
        layer_pass = LayerPass()
        if trial.layer_profile is not None:
            # After the headline window has closed: hooks never touch the headline numbers.
            with stage("layer_pass"):
                layer_pass, layers, failure = self._profile_layers(trial, measured)
            if layers is not None:
                tables["layers"] = layers
            outcome = failure or outcome
        fidelity, perplexity = Fidelity(), Perplexity()
        if trial.fidelity is not None:
            with stage("fidelity"):
                fidelity, perplexity = self._quality(trial)
        likelihood = ChoiceLikelihood()
        if trial.scoring is not None and trial.scoring.likelihood:
            with stage("likelihood"):
                likelihood = self._likelihood(trial)
        # The trial's result, made here once: the window's parts and the actor's own.
        result = measured.result.replace(
            outcome=replace(outcome, started_at=started, finished_at=_now()), setup=load.setup, server=load.server,
            environment=load.environment, layer_pass=layer_pass, fidelity=fidelity, perplexity=perplexity,
            likelihood=likelihood)
        try:
            # Checked here, in the process that built them: a row the schema cannot hold
            # fails its own trial, with the reason, and the sweep goes on.
            check_rows("trials", [result.row()])
        except RowError as exc:
            log.error("trial %s: %s", trial.trial_id, self._redacted(trial, str(exc)))
            return self._failed(trial, Reason.INVALID_ROW, str(exc), started, load)
        return TrialOutcome(trial.trial_id, result, tables)

    def _failed(self, trial: Trial, reason: Reason, text: str, started: datetime, load: _LoadParts) -> TrialOutcome:
        outcome = failed_outcome(reason, self._redacted(trial, text), started_at=started)
        return TrialOutcome(trial.trial_id, TrialResult(outcome, setup=load.setup, server=load.server,
                                                        environment=load.environment))

    def _load_parts(self) -> _LoadParts:
        """What this group's load gave each of its trials, failed ones too."""
        info = self.load_info
        setup = Setup(load_s=self.load_s, weight_memory_bytes=info.weight_memory_bytes if info else None,
                      pre_load_idle_power_w=self.pre_load_idle.power_w if self.pre_load_idle else None)
        server = info.server if info is not None and info.server is not None else ServerSetup()
        return _LoadParts(setup, server, self._environment())

    def _environment(self) -> Environment:
        """Where the trials of this load run: the process's node and software, the device the
        load landed on and the GPUs the telemetry meters (or why it meters none)."""
        info, telemetry = self.load_info, self.telemetry
        env = telemetry.environment().applied_to(self.env) if telemetry is not None else self.env
        return replace(
            env, device=info.device if info else None, device_name=info.device_name if info else None,
            energy_unmetered_reason=None if telemetry is None or telemetry.active else getattr(telemetry, "reason", None))

    def _quality(self, trial: Trial) -> tuple[Fidelity, Perplexity]:
        """The group's fidelity and perplexity, computed after its first measured trial against
        the reference its load step prepared.

        Outputs do not depend on the batch size, so one pass per loaded model
        serves every trial of the group. It never fails the trial (see
        actors.quality.fidelity); its status column says what happened.
        """
        if self._quality_parts is None:
            from actors.quality.fidelity import fidelity_columns

            backend, load_info = self._loaded()
            fidelity = fidelity_columns(trial, backend, self._reference)
            self._reference = None  # host memory: the group's pass is done
            perplexity = Perplexity()
            if trial.fidelity is not None and trial.fidelity.perplexity:
                from actors.quality.perplexity import perplexity_columns

                perplexity = perplexity_columns(trial, backend, load_info)
            self._quality_parts = fidelity, perplexity
        return self._quality_parts

    def _likelihood(self, trial: Trial) -> ChoiceLikelihood:
        """The trial's questions scored by each choice's likelihood: once per prompt set of the
        loaded model (a group's trials differ in batch size or rate, not in what is right)."""
        from actors.quality.likelihood import likelihood_columns

        backend, _ = self._loaded()
        assert self._sources is not None  # the trial was measured: its prompts were built
        key = self._sources.key(trial)  # the trials of one prompt source score the same questions
        if key not in self._likelihoods:
            chat = trial.prompts is not None and bool(trial.prompts.chat)
            self._likelihoods[key] = likelihood_columns(backend, answered(self._sources.for_trial(trial)),
                                                        self._sources.tokenizer(trial), chat=chat)
        return self._likelihoods[key]

    def _profile_layers(self, trial: Trial,
                        measured: Measurement) -> tuple[LayerPass, pa.Table | None, Outcome | None]:
        """The layer-profiling pass's trials columns, its ``layers`` table (None: no rows), and
        the trial's outcome if the pass broke.

        A pass that breaks fails the trial: what the sweep asked for was not
        produced, and ``--retry-failed`` re-runs it. The headline numbers stay
        in the row all the same, since they were measured before, without hooks.
        """
        timing = measured.result.throughput
        backend, load_info = self._loaded()
        telemetry = self.telemetry
        if telemetry is None:  # run() measured with it: it is there
            raise RuntimeError("layer profiling before a successful load()")
        headline_s_per_iter = (timing.duration_s / timing.n_iterations
                               if timing.duration_s is not None and timing.n_iterations else None)
        try:
            profile = profile_layers(backend, trial, load_info, telemetry, headline_s_per_iter=headline_s_per_iter)
            layers = records_table("layers", profile.rows) if profile.rows else None
        except Exception as exc:
            self._log_failure("layer profiling pass failed", trial, exc)
            oom = self._is_oom(exc)
            backend.recover()
            text = self._redacted(trial, _error_text(exc))
            return failed_pass(text), None, failed_outcome(Reason.OOM if oom else Reason.LAYER_PROFILE_FAILED,
                                                           f"layer profiling pass: {text}")
        return profile.columns, layers, None
