"""Energy and power: the window's, the idle baseline, by phase, per request, the serving run's,
the host's, and whose processes were on the GPUs."""

from __future__ import annotations

from dataclasses import dataclass

from sweeper.core.results.part import Part, column


@dataclass(frozen=True)
class Energy(Part):
    """Energy and power over the measured window (null on CPU-only runs); per-GPU figures are lists in the order of gpu_uuids."""

    energy_j: float | None = column("GPU energy over the measured window, all GPUs the trial holds")
    energy_per_token_j: float | None = column("energy_j / output_tokens")
    avg_power_w: float | None = column("energy_j / duration_s")
    peak_power_w: float | None = column(
        "highest per-sample power (summed over the trial's GPUs) in the window; each sample is NVML's "
        "instantaneous power field where the driver has one (the mean of its ~100 ms update period), else "
        "nvmlDeviceGetPowerUsage (a 1 s trailing mean): one reading can set it, and a sub-second "
        "transient may exceed the power limit")
    p99_power_w: float | None = column(
        "99th percentile of the same per-sample power: what a few readings cannot dominate")
    gpu_energy_j: list[float] | None = column(
        "per GPU of gpu_uuids: its own counter's energy over the window's boundaries; they sum to "
        "energy_j")
    gpu_avg_power_w: list[float] | None = column("per GPU: gpu_energy_j / duration_s")
    gpu_peak_power_w: list[float | None] | None = column(
        "per GPU: its highest sampled power reading in the window (as peak_power_w, one GPU)")
    active_energy_j: float | None = column("energy_j - idle_power_w x duration_s")
    energy_method: str | None = column("nvml_counter_interpolated | nvml_counter | power_integral")
    energy_uncertainty_j: float | None = column("bound on the window-boundary error of energy_j")
    energy_per_token_uncertainty_j: float | None = column("energy_uncertainty_j / output_tokens")


@dataclass(frozen=True)
class Baseline(Part):
    """The idle baseline the trial's energy is judged against: the loaded GPUs' settled idle power, and whether it was taken for this trial or re-checked."""

    idle_power_w: float | None = column(
        "mean power over the idle-baseline window, summed over the trial's GPUs: taken after the warm-up, "
        "with the model loaded and the power settled (idle_settle_s); what active_energy_j subtracts")
    gpu_idle_power_w: list[float] | None = column(
        "per GPU: its mean power over the idle-baseline window; they sum to idle_power_w")
    idle_settle_s: float | None = column(
        "seconds the power took to stop falling after the warm-up, before the baseline window began (at "
        "most 10; longer is flagged unstable); null: no baseline, or a row from a version that did not "
        "settle")
    idle_baseline_reused: bool | None = column(
        "idle_power_w is the group's baseline, taken for an earlier trial and re-checked for this one "
        "(idle_recheck_power_w within idle_reuse_tolerance_w of it); false: taken for this trial; null: "
        "no baseline")
    idle_baseline_age_s: float | None = column(
        "seconds from the baseline's start to this trial's (0 when taken for this trial)")
    idle_recheck_power_w: float | None = column(
        "the settled power a 0.5 s re-check read before deciding whether the group's baseline stands "
        "(sampled power, summed over GPUs); null: the trial had no baseline to re-check")


@dataclass(frozen=True)
class PhaseEnergy(Part):
    """The window's energy by phase, on the telemetry timeline over the engine's phase marks."""

    prefill_energy_j: float | None = column("energy attributed to prefill (timeline over phase marks)")
    decode_energy_j: float | None = column("energy attributed to decode")
    decode_energy_per_token_j: float | None = column("decode_energy_j / decode tokens")
    between_phases_energy_j: float | None = column(
        "energy in the window outside every prefill and decode mark (the host's time between generate "
        "calls), on the same curve: prefill + decode + this equals energy_j within energy_uncertainty_j")


@dataclass(frozen=True)
class PerRequestEnergy(Part):
    """The window's (serving: the run's) energy split over its requests."""

    energy_per_request_j: float | None = column(
        "offline: energy_j / n_requests; serving: mean of the completed requests' attributed energies "
        "(requests.parquet energy_j, request_energy_method)")
    energy_per_request_p50_j: float | None = column(
        "median attributed energy of a completed request (energy per response; serving, and offline with "
        "varied prompts or replies)")
    energy_per_request_p90_j: float | None = column("90th percentile attributed energy of a completed request")
    request_energy_method: str | None = column(
        "how the energy was split over requests (token_share: serving, each instant's energy over the "
        "requests then in flight; offline, each generate call's energy over its sequences; by the tokens "
        "each processes; docs/METHOD.md)")
    attributed_energy_j: float | None = column(
        "serving: sum of the requests' attributed energies (= run_energy_j, up to rounding)")
    request_prefill_share: float | None = column(
        "serving: of the completed requests' energy (requests.parquet energy_j), the share spent in their "
        "prefills (prefill_energy_j): what prompts cost against replies, by the token-share split; null "
        "where unmetered")
    request_prefill_from: str | None = column(
        "serving: where the completed requests' prefill segments began: scheduled (the engine's own stamp: "
        "vLLM in-process, transformers, noop), sent (no stamp: an HTTP server; the segment also holds the "
        "server's ingest and queueing, so request_prefill_share is an upper bound), or mixed")


@dataclass(frozen=True)
class RunEnergy(Part):
    """A serving run's whole energy, ramp-up and drain included (null offline)."""

    run_energy_j: float | None = column("serving: GPU energy over the whole run (ramp-up and drain included)")
    run_energy_uncertainty_j: float | None = column("serving: bound on the boundary error of run_energy_j")


@dataclass(frozen=True)
class HostEnergy(Part):
    """The host's energy over the window, from RAPL where readable."""

    cpu_energy_j: float | None = column("CPU package energy (RAPL) over the window, null when unreadable")
    dram_energy_j: float | None = column("DRAM energy (RAPL) over the window, null when unreadable")


@dataclass(frozen=True)
class Occupancy(Part):
    """Whose processes were on the metered GPUs around the window: whether the energy is the trial's alone."""

    gpu_processes: str | None = column(
        "the compute processes NVML saw on the metered GPUs at the measured window's start and end (pid "
        "name, ...)")
    energy_exclusive: bool | None = column(
        "every process on the metered GPUs at the window's start and end was the trial's own (the actor's "
        "process or one it started: engine workers, a launched server), so the energy is the trial's "
        "alone; false: another process used its GPUs; null: not known (an external server, whose "
        "processes sweeper cannot tell, no GPU, or a process whose parent could not be read)")
