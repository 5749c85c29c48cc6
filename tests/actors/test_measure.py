"""The measurement loop's warm-up: iterations and a minimum duration, both honoured."""

from __future__ import annotations

import pytest

from actors.backends.base import ModelSpec
from actors.backends.noop import NoopBackend
from actors.measure import measure_trial
from actors.telemetry import NullTelemetry
from sweeper.plan.expand import expand
from sweeper.plan.spec import parse_sweep


class FakeClock:
    """Time that moves only when the backend sleeps: the loop's arithmetic, exactly."""

    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s

    def sleep(self, seconds: float) -> None:
        self.now_s += seconds


def run(measure: dict) -> tuple[int, dict]:
    sweep = parse_sweep({
        "name": "warm", "models": "tiny-llama", "backends": "noop", "precisions": "bf16", "batch_sizes": 1,
        "workload": {"input_len": 8, "output_len": 4}, "backend_options": {"noop": {"step_s": 0.1}},
        "measure": {"min_iters": 2, "min_duration_s": 0, "idle_s": 0, **measure},
    })
    trial = expand(sweep)[0][0]
    backend, clock = NoopBackend(), FakeClock()
    backend.clock, backend.sleep = clock, clock.sleep
    load = backend.load(ModelSpec("synthetic", "tiny-llama", "bf16", trial.backend_options))
    calls = []
    generate = backend.generate_batch
    backend.generate_batch = lambda *a: calls.append(clock()) or generate(*a)  # type: ignore[method-assign]
    row = measure_trial(backend, trial, load, NullTelemetry(reason="test"), clock=clock).row
    return len(calls) - row["n_iterations"], row


def test_warmup_runs_its_iterations_when_no_duration_is_asked():
    warm_calls, row = run({"warmup_iters": 2})
    assert warm_calls == 2


def test_warmup_lasts_at_least_warmup_s():
    # Each call takes 0.4 s (4 tokens of 0.1 s): 1.0 s of warm-up needs three calls, not one.
    warm_calls, row = run({"warmup_iters": 1, "warmup_s": 1.0})
    assert warm_calls == 3
    assert row["n_iterations"] == 2


def test_warmup_s_at_its_default_leaves_the_trial_id_alone():
    base = {"name": "s", "models": "tiny-llama", "precisions": "bf16", "batch_sizes": 1,
            "workload": {"input_len": 8, "output_len": 4}}
    plain = expand(parse_sweep(base))[0][0]
    spelled = expand(parse_sweep({**base, "measure": {"warmup_s": 0}}))[0][0]
    longer = expand(parse_sweep({**base, "measure": {"warmup_s": 5}}))[0][0]
    assert plain.trial_id == spelled.trial_id != longer.trial_id


class ContendedClock(FakeClock):
    """A host that other work slows down: each generate call's sleeps are stretched by the
    next factor of a cycle (1 = a quiet host). Deterministic, unlike real contention."""

    def __init__(self, factors: list[float]) -> None:
        super().__init__()
        self.factors, self.calls, self.factor = factors, 0, 1.0

    def next_call(self) -> None:
        self.factor = self.factors[self.calls % len(self.factors)]
        self.calls += 1

    def sleep(self, seconds: float) -> None:
        self.now_s += seconds * self.factor


def measured(clock: ContendedClock, measure: dict, noop: dict | None = None) -> dict:
    sweep = parse_sweep({
        "name": "noise", "models": "tiny-llama", "backends": "noop", "precisions": "bf16", "batch_sizes": 1,
        "workload": {"input_len": 8, "output_len": 4}, "backend_options": {"noop": {"step_s": 0.1, **(noop or {})}},
        "measure": {"warmup_iters": 0, "min_iters": 8, "min_duration_s": 0, "idle_s": 0, "min_window_s": 0,
                    **measure},
    })
    trial = expand(sweep)[0][0]
    backend = NoopBackend()
    backend.clock, backend.sleep = clock, clock.sleep
    load = backend.load(ModelSpec("synthetic", "tiny-llama", "bf16", trial.backend_options))
    generate = backend.generate_batch
    backend.generate_batch = lambda *a: clock.next_call() or generate(*a)  # type: ignore[method-assign]
    return measure_trial(backend, trial, load, NullTelemetry(reason="test"), clock=clock).row


def test_a_steady_cpu_trial_records_its_cv_and_is_not_flagged():
    # 12 calls of 0.4 s: four blocks of >= 1 s, all alike, so the interval is zero.
    row = measured(ContendedClock([1.0]), {"min_iters": 12})
    assert row["iteration_throughput_cv"] == pytest.approx(0.0, abs=1e-9)
    assert row["ci_blocks"] == 4 and row["throughput_rel_ci95"] == pytest.approx(0.0, abs=1e-9)
    assert row["unstable"] is False and row["unstable_reason"] is None
    assert row["noisy_host"] is False and row["noisy_host_reason"] is None
    assert row["iteration_energy_cv"] is None and row["energy_j"] is None  # no GPU: no energy, never zero


def test_a_noisy_host_with_a_tight_estimate_is_noted_not_flagged():
    # Every other call twice as slow (a loaded host): tokens/s 10 and 5 in turn; sample CV
    # sqrt(12/11) x 2.5 / 7.5 = 0.348. Yet every 1.2 s block holds one call of each, so the
    # mean throughput is known exactly: the figures stand, the host is noted as noisy.
    row = measured(ContendedClock([1.0, 2.0]), {"min_iters": 12})
    assert row["iteration_throughput_cv"] == pytest.approx((12 / 11) ** 0.5 * 2.5 / 7.5)
    assert row["unstable"] is False
    assert row["noisy_host"] is True
    assert row["noisy_host_reason"] == ("per-iteration throughput CV 0.348 (over 12 iterations) "
                                        "> max_iteration_cv 0.05")
    # The threshold is the sweep's: a looser one notes nothing.
    assert measured(ContendedClock([1.0, 2.0]), {"min_iters": 12, "max_iteration_cv": 0.5})["noisy_host"] is False


def test_a_genuinely_imprecise_trial_is_flagged_by_its_interval():
    # Calls whose time varies by up to +-60 % (noop step_jitter, seeded): over a 5 s window the
    # blocks' throughputs differ so much that the mean is known only to about +-10 %.
    row = measured(ContendedClock([1.0]), {"min_iters": 12}, {"step_jitter": 0.6})
    assert row["throughput_rel_ci95"] > 0.05
    assert row["unstable"] is True
    assert row["unstable_reason"] == (f"95 % interval throughput ±{row['throughput_rel_ci95']:.1%} over "
                                      f"{row['ci_blocks']} blocks > max_rel_ci 5.0%")
    # The bound is the sweep's: one wider than the achieved interval accepts the same trial.
    loose = measured(ContendedClock([1.0]), {"min_iters": 12, "max_rel_ci": 0.9}, {"step_jitter": 0.6})
    assert loose["throughput_rel_ci95"] == pytest.approx(row["throughput_rel_ci95"])
    assert loose["unstable"] is False


def test_a_fixed_window_too_short_for_an_interval_is_flagged_not_lengthened():
    # Two calls of 0.4 s were asked for: one block of >= 1 s, no interval of the mean at all.
    row = measured(ContendedClock([1.0]), {"min_iters": 2})
    assert row["n_iterations"] == 2 and row["ci_blocks"] == 1 and row["throughput_rel_ci95"] is None
    assert row["unstable"] is True
    assert row["unstable_reason"] == ("window 0.80 s holds 1 block(s) of >= 1 s, too few (< 3) for a 95 % "
                                      "interval of its mean: lengthen the window (min_duration_s, or "
                                      "max_duration_s with a target)")


def test_a_window_cut_before_it_can_judge_its_precision_is_flagged():
    # A precision target whose cap (1.5 s) comes before three blocks of 1 s: flagged, saying why.
    row = measured(ContendedClock([1.0]), {"min_iters": 2, "target_rel_ci": 0.05, "max_duration_s": 1.5})
    assert row["throughput_rel_ci95"] is None and row["ci_blocks"] == 1
    assert row["unstable"] is True
    assert row["unstable_reason"].startswith("window 1.60 s holds 1 block(s) of >= 1 s, too few (< 3)")


class Speculating(NoopBackend):
    """The simulated engine with speculation counters that every generate call advances, as
    vLLM's do per draft step: 3 drafts of 4 proposed tokens, 6 of them accepted, per call."""

    calls = 0

    def generate_batch(self, batch):  # type: ignore[no-untyped-def]
        self.calls += 1
        return super().generate_batch(batch)

    def speculation_counts(self):  # type: ignore[no-untyped-def]
        from actors.backends.speculation import SpeculationCounts

        return SpeculationCounts(drafts=3.0 * self.calls, draft_tokens=12.0 * self.calls,
                                 accepted_tokens=6.0 * self.calls)


def test_a_window_counts_the_speculation_of_its_own_calls_only():
    sweep = parse_sweep({
        "name": "spec", "models": "tiny-llama", "backends": "noop", "precisions": "bf16", "batch_sizes": 1,
        "workload": {"input_len": 8, "output_len": 4}, "backend_options": {"noop": {"step_s": 0.1}},
        "measure": {"warmup_iters": 3, "min_iters": 2, "min_duration_s": 0, "idle_s": 0},
    })
    trial = expand(sweep)[0][0]
    backend, clock = Speculating(), FakeClock()
    backend.clock, backend.sleep = clock, clock.sleep
    load = backend.load(ModelSpec("synthetic", "tiny-llama", "bf16", trial.backend_options))
    row = measure_trial(backend, trial, load, NullTelemetry(reason="test"), clock=clock).row
    calls = row["n_iterations"]
    assert backend.calls == calls + 3  # the warm-up's three are not the window's
    assert row["spec_drafts"] == 3.0 * calls and row["spec_accepted_tokens"] == 6.0 * calls
    assert row["spec_acceptance_rate"] == 0.5 and row["spec_tokens_per_step"] == 3.0
    plain = run({"warmup_iters": 1})[1]
    assert plain["spec_drafts"] is None  # no speculation: null columns
