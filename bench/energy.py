"""GPU evidence for the energy method, in one process on one GPU.

Runs the real actor code (``TrialRunner``, no Ray) on a synthetic model and checks:

1. counter energy vs the integral of the sampled power over the same windows;
2. repeatability: coefficient of variation of ``energy_per_token_j`` over repeats;
3. an independent cross-check of each window with Zeus's ``ZeusMonitor``;
4. sampler overhead: throughput with the sampler thread off / on / sparse counter reads /
   reads from another process, in rotating blocks, and the cost of each NVML read;
5. prefill + decode energy against the window total and its uncertainty.

    python3 -m bench energy --model llama-3.1-8b --batches 1,32 --repeats 5 --out $OUT/energy.json

``--compile`` runs the transformers backend's compiled path (the GPU sets the pace);
``--energy-every 1,10`` runs each repeat once per counter-read spacing
(``SamplingPolicy.energy_every``), back to back. The JSON is rewritten after every batch, so
a run cut at a device call's limit keeps what it finished. tests/test_bench_energy.py
runs this bench on the CPU against the NVML double.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time

import numpy as np

from actors.telemetry import SamplingPolicy, Telemetry
from bench.benchkit import write_record
from sweeper.core.status import Status


def make_trials(model: str, batch: int, repeats: int, window_s: float, warmup_s: float, in_len: int,
                out_len: int, compile: bool = False, idle_s: float = 2.0):
    from sweeper.plan.expand import expand
    from sweeper.plan.spec import parse_sweep

    sweep = parse_sweep({
        "name": "energy-bench", "models": model, "precisions": "bf16", "batch_sizes": batch,
        "backends": "transformers", "backend_options": {"transformers": {"compile": compile}},
        "workload": {"input_len": in_len, "output_len": out_len}, "repeats": repeats,
        "measure": {"warmup_iters": 1, "warmup_s": warmup_s, "min_iters": 3, "min_duration_s": window_s, "idle_s": idle_s},
    })
    return expand(sweep)[0]


def power_integral_j(timeline, duration_s: float) -> float:
    """Trapezoid of total sampled power over [0, duration_s] (t_s is relative to the window start)."""
    rows = timeline.to_pylist()
    by_gpu: dict[str, list[tuple[float, float]]] = {}
    for r in rows:
        if r["power_w"] is not None:
            by_gpu.setdefault(r["gpu_uuid"], []).append((r["t_s"], r["power_w"]))
    total = 0.0
    for series in by_gpu.values():
        t, p = (np.array(x) for x in zip(*sorted(series), strict=True))
        grid = np.linspace(0.0, duration_s, 20001)
        total += float(np.trapezoid(np.interp(grid, t, p), grid))
    return total


def nvml_call_costs_s(tel, calls: int = 200) -> dict[str, object]:
    """Mean wall time of each NVML read the sampler makes, on the first held GPU."""
    import pynvml as nv

    reader = tel.sampler.readers[0]
    reads = {field: getattr(reader, field) for field in (
        "energy_mj", "power_w", "util_gpu_pct", "memory_used_bytes", "sm_clock_mhz", "temperature_c")}
    # The same counter through the field-values API: another driver path, maybe a cheaper one.
    field = [nv.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION]
    reads["energy_field_value"] = lambda: nv.nvmlDeviceGetFieldValues(reader.handle, field)
    both = [nv.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION, nv.NVML_FI_DEV_POWER_INSTANT]
    reads["energy_and_power_one_field_call"] = lambda: nv.nvmlDeviceGetFieldValues(reader.handle, both)
    out: dict[str, object] = {}
    for name, read in reads.items():
        t0 = time.perf_counter()
        for _ in range(calls):
            read()
        out[name] = (time.perf_counter() - t0) / calls
    # Is it the same counter? Back-to-back reads through both paths, in mJ.
    gaps = []
    for _ in range(20):
        a = nv.nvmlDeviceGetTotalEnergyConsumption(reader.handle)
        v = nv.nvmlDeviceGetFieldValues(reader.handle, field)[0]
        b = nv.nvmlDeviceGetTotalEnergyConsumption(reader.handle)
        gaps.append(None if v.nvmlReturn != 0 else [a, v.value.ullVal, b])
        time.sleep(0.013)
    out["field_value_vs_counter_mj"] = gaps
    return out


def _poll_in_process(uuids: list[str], interval_s: float, stop) -> None:
    """The sampler's energy-counter and instantaneous-power reads, made from another
    process: what sampling costs the trial without sharing its interpreter's GIL."""
    import pynvml as nv

    nv.nvmlInit()
    handles = [nv.nvmlDeviceGetHandleByUUID(u) for u in uuids]
    field = [nv.NVML_FI_DEV_POWER_INSTANT]
    next_t = time.monotonic()
    while not stop.is_set():
        for h in handles:
            nv.nvmlDeviceGetTotalEnergyConsumption(h)
            nv.nvmlDeviceGetFieldValues(h, field)
        next_t += interval_s
        stop.wait(max(0.0, next_t - time.monotonic()))


# The in-process sampler variants of the overhead blocks ("off" and "proc" run no thread).
SAMPLER_MODES = {
    "full": SamplingPolicy(),
    "sparse": SamplingPolicy(energy_every=10),
    "field": SamplingPolicy(energy_read="field"),
}


def sampler_overhead(runner, tel, batch: int, args) -> dict:
    """Throughput with the sampler thread off, on (every field every tick), sparse
    (the 3.8 ms energy-counter read every 10th tick, power every tick), ``field``
    (every tick, the counter read through the field-values API instead) and the
    full energy + power reads made from a separate process (``proc``: the driver's
    share of the cost without the GIL's), in rotating order so that drift in clocks
    or temperature cancels to first order."""
    import multiprocessing

    from actors.workload import RandomPrompts

    backend = runner.backend
    prompts = RandomPrompts(runner.load_info.vocab_size, args.input_len, batch, seed=7)
    backend.generate(prompts.batch(0), args.output_len)

    def block() -> float:
        backend.sync()
        t0, tokens, i = time.monotonic(), 0, 0
        while time.monotonic() - t0 < args.overhead_block_s:
            tokens += backend.generate(prompts.batch(i), args.output_len).output_tokens
            i += 1
        backend.sync()
        return tokens / (time.monotonic() - t0)

    modes = tuple(args.overhead_modes.split(","))
    if modes[0] != "off" or not set(modes) <= {"off", "proc", *SAMPLER_MODES}:
        raise SystemExit(f"--overhead-modes: 'off' first, then any of {','.join(SAMPLER_MODES)},proc; got {modes}")
    costs = {m: [0, 0.0] for m in SAMPLER_MODES}  # samples, summed cost
    ratios: dict[str, list[float]] = {m: [] for m in modes if m != "off"}
    spawn = multiprocessing.get_context("spawn")
    uuids = [g.uuid for g in tel.sampler.gpus]
    for i in range(args.overhead_pairs):
        order = modes[i % len(modes):] + modes[:i % len(modes)]
        rate = {}
        for mode in order:
            tel.sampler.stop()
            if mode == "proc":
                stop = spawn.Event()
                poller = spawn.Process(target=_poll_in_process, args=(uuids, tel.sampler.interval_s, stop))
                poller.start()
                time.sleep(1.0)  # past the child's interpreter start and nvmlInit
                rate[mode] = block()
                if not poller.is_alive():  # a dead poller would read as free sampling
                    raise RuntimeError(f"the NVML poller process exited early ({poller.exitcode})")
                stop.set()
                poller.join(timeout=10)
                continue
            if mode != "off":
                tel.policy = SAMPLER_MODES[mode]
                before = tel.sampler.stats()
                tel.sampler.start()
            rate[mode] = block()
            if mode != "off":
                tel.sampler.stop()
                after = tel.sampler.stats()
                n = after.samples - before.samples
                costs[mode][0] += n
                costs[mode][1] += after.mean_sample_cost_s * after.samples - before.mean_sample_cost_s * before.samples
        tel.policy = SamplingPolicy(energy_every=args.energy_every_default)
        tel.sampler.start()
        for m in ratios:
            ratios[m].append(rate[m] / rate["off"])
        print(f"  overhead round {i}: " + " ".join(f"{m} {rate[m]:.1f}" for m in modes) + " tok/s", flush=True)
    out = {"sampler_interval_s": tel.sampler.interval_s, "overhead_block_s": args.overhead_block_s,
           "nvml_call_cost_s": nvml_call_costs_s(tel)}
    for m, values in ratios.items():
        r = np.array(values)
        half_ci = 1.96 * r.std(ddof=1) / np.sqrt(len(r)) if len(r) > 1 else float("nan")
        key = "sampler_on_over_off" if m == "full" else f"sampler_{m}_over_off"
        out[f"{key}_rounds"] = values
        out[key] = float(np.exp(np.mean(np.log(r))))  # geometric mean of paired ratios
        out[f"{key}_median"] = float(np.median(r))
        out[f"{key}_ci95"] = [float(r.mean() - half_ci), float(r.mean() + half_ci)]
        if m in costs:
            n, total = costs[m]
            out[f"sampler_{m}_mean_sample_cost_s"] = total / n if n else None
    return out


def cv(values: list[float]) -> float:
    return statistics.stdev(values) / statistics.fmean(values) if len(values) > 1 else float("nan")


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--batches", default="1,32")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--window-s", type=float, default=15.0)
    ap.add_argument("--warmup-s", type=float, default=6.0, help="measure.warmup_s of every trial")
    ap.add_argument("--overhead-block-s", type=float, default=4.0)
    ap.add_argument("--overhead-pairs", type=int, default=8)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--energy-every", default="1",
                    help="comma-separated SamplingPolicy.energy_every values; each repeat runs once per value")
    ap.add_argument("--energy-every-default", type=int, default=1,
                    help="the sampler's spacing outside the measured trials")
    ap.add_argument("--idle-s", type=float, default=2.0, help="measure.idle_s: the idle baseline before each window")
    ap.add_argument("--compile", action="store_true", help="the transformers backend's compiled path")
    ap.add_argument("--overhead", action=argparse.BooleanOptionalAction, default=True,
                    help="the sampler on/off blocks after each batch's trials")
    ap.add_argument("--overhead-modes", default="off,full,sparse,field,proc")
    ap.add_argument("--out", default="energy.json")
    ap.add_argument("--dump", default=None, help="write the meter's raw view of each window here (JSON)")


def run(args: argparse.Namespace) -> None:
    energy_everies = [int(e) for e in args.energy_every.split(",")]

    import torch

    from actors.actor import TrialRunner

    try:
        from zeus.monitor import ZeusMonitor

        zeus = ZeusMonitor(gpu_indices=[torch.cuda.current_device()], approx_instant_energy=False)
    except Exception as exc:  # the cross-check is optional; say so in the output
        print(f"zeus unavailable: {exc}")
        zeus = None

    report: dict = {"args": vars(args), "model": args.model, "device": torch.cuda.get_device_name(),
                    "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"), "batches": {}}
    runner = None
    for batch in (int(b) for b in args.batches.split(",")):
        trials = make_trials(args.model, batch, args.repeats, args.window_s, args.warmup_s, args.input_len,
                             args.output_len, compile=args.compile, idle_s=args.idle_s)
        if runner is None:
            runner = TrialRunner()
            load = runner.load(trials[0])
            assert load.ok, load.error
            report["load_s"] = load.load_s
            print(f"loaded {args.model} in {load.load_s:.1f} s on {report['device']}", flush=True)
        tel = runner.telemetry
        assert isinstance(tel, Telemetry), "the energy bench measures GPU telemetry"
        zeus_by_trial: dict[str, tuple[float, float]] = {}
        orig_measure = tel.measure

        # Zeus's window sits inside ours on even repeats only: its own synchronize and
        # counter read add idle time at our window's edges, which the phase-sum check
        # must not see (that check uses the odd repeats).
        zeus_ids = {t.trial_id for t in trials if t.repeat % 2 == 0}

        @contextlib.contextmanager
        def measure_with_zeus(name, _orig=orig_measure, _z=zeus_by_trial, _ids=zeus_ids):
            with _orig(name) as handle:
                use = zeus is not None and name in _ids
                if use:
                    zeus.begin_window(name)
                yield handle
                if use:
                    m = zeus.end_window(name)
                    _z[name] = (m.total_energy, m.time)

        tel.measure = measure_with_zeus  # type: ignore[method-assign]
        dumps: list[dict] = []
        if args.dump:
            # Diagnostics: everything the meter saw around each window, to replay it offline.
            orig_report = tel.report

            def report_and_dump(handle, *, marks, iteration_bounds, _orig=orig_report, _tel=tel, _dumps=dumps):
                report = _orig(handle, marks=marks, iteration_bounds=iteration_bounds)
                w = handle.window
                lo, hi = w.t_start_s - 2.0, w.t_end_s + 2.0
                _dumps.append({
                    "window": [w.t_start_s, w.t_end_s, w.energy_j, w.uncertainty_j],
                    "marks": marks, "iteration_bounds": iteration_bounds,
                    "sampler_rows": [list(r[:5]) for r in _tel.sampler.raw_rows(lo, hi)],
                    **_tel.meter.diagnostics(lo, hi),  # meter_reads, anchors
                    "phases": {"prefill_energy_j": report.phase_energy_j.get("prefill") if report else None,
                               "decode_energy_j": report.phase_energy_j.get("decode") if report else None,
                               "energy_j": w.energy_j},
                })
                return report

            tel.report = report_and_dump  # type: ignore[method-assign]
        rows = []
        # Each repeat runs once per counter-read spacing, back to back, so that
        # drift between repeats touches every spacing alike.
        for trial in trials:
            for every in energy_everies:
                tel.policy = SamplingPolicy(energy_every=every)
                outcome = runner.run(trial)
                row = outcome.row
                assert row["status"] == Status.OK, row.get("error")
                integral = power_integral_j(outcome.tables["timeline"], row["duration_s"])
                z = zeus_by_trial.pop(trial.trial_id, None)
                # The window is prefill, decode and the host's time between generate calls (its
                # own column): the three sum to energy_j within its uncertainty (METHOD.md). The
                # gaps between calls grow on a loaded host; leaving them out made the check luck.
                phase_sum = row["prefill_energy_j"] + row["decode_energy_j"] + (row["between_phases_energy_j"] or 0.0)
                rows.append({
                    "repeat": trial.repeat, "energy_every": every, "duration_s": row["duration_s"],
                    "energy_j": row["energy_j"],
                    "energy_method": row["energy_method"], "uncertainty_j": row["energy_uncertainty_j"],
                    "energy_per_token_j": row["energy_per_token_j"], "throughput_tok_s": row["throughput_tok_s"],
                    "avg_power_w": row["avg_power_w"], "idle_power_w": row["idle_power_w"],
                    "power_integral_j": integral, "counter_vs_integral": row["energy_j"] / integral,
                    "zeus_energy_j": z[0] if z else None, "zeus_time_s": z[1] if z else None,
                    "ours_vs_zeus_power": (row["avg_power_w"] / (z[0] / z[1])) if z else None,
                    "ours_vs_zeus_energy": (row["energy_j"] / z[0]) if z else None,
                    "prefill_energy_j": row["prefill_energy_j"], "decode_energy_j": row["decode_energy_j"],
                    "phase_sum_minus_total_j": phase_sum - row["energy_j"], "zeus_inside": z is not None,
                    "unstable": row["unstable"], "unstable_reason": row["unstable_reason"],
                    "cpu_energy_j": row["cpu_energy_j"],
                })
                print(json.dumps({"batch": batch, **rows[-1]}), flush=True)
        tel.policy = SamplingPolicy(energy_every=args.energy_every_default)
        tel.measure = orig_measure  # type: ignore[method-assign]
        if args.dump:
            tel.report = orig_report  # type: ignore[method-assign]
            write_record(args.dump, "energy", dumps, quiet=True)

        # Sampler on vs off on the same loaded model, in ABBA blocks (drift in clocks
        # or temperature cancels to first order), nothing else differing: the same
        # generate calls, no idle window, no meter reads; only the thread runs or not.
        overhead = sampler_overhead(runner, tel, batch, args) if args.overhead else {}
        checks = {}
        for every in energy_everies:
            mine = [r for r in rows if r["energy_every"] == every]
            checks[f"energy_every_{every}"] = {
                "energy_per_token_cv": cv([r["energy_per_token_j"] for r in mine]),
                "throughput_cv": cv([r["throughput_tok_s"] for r in mine]),
                "counter_vs_integral_max_dev": max(abs(r["counter_vs_integral"] - 1) for r in mine),
                "zeus_max_dev_power": (max((abs(r["ours_vs_zeus_power"] - 1) for r in mine if r["zeus_inside"]),
                                           default=None) if zeus else None),
                "zeus_max_dev_energy": (max((abs(r["ours_vs_zeus_energy"] - 1) for r in mine if r["zeus_inside"]),
                                            default=None) if zeus else None),
                "phase_gap_within_uncertainty": all(abs(r["phase_sum_minus_total_j"]) <= r["uncertainty_j"]
                                                    for r in mine if not r["zeus_inside"]),
                "prefill_energy_j_mean": statistics.fmean(r["prefill_energy_j"] for r in mine),
            }
        report["batches"][batch] = {"trials": rows, "checks": checks, **overhead}
        summary = {k: v for k, v in report["batches"][batch].items() if k != "trials"}
        print(json.dumps({"batch": batch, **summary}), flush=True)
        # After every batch: a run cut at the call's time limit keeps what it finished.
        write_record(args.out, "energy", report, quiet=True)
    if runner is not None:
        runner.close()
