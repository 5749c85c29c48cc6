"""GPU evidence for the roofline columns (MFU, MBU), in one process on one GPU.

Runs the real actor code (``TrialRunner``, no Ray) on a synthetic model and checks:

1. the GPU's NVML name is in the peak table (otherwise mfu/mbu come out null);
2. the table's peaks are not understated: a large device-to-device copy and a large
   matmul at the trial's compute format stay below them (achieved / peak < 1);
3. the analytic weight bytes agree with the loaded model's real footprint
   (``weight_memory_bytes``) once the embedding (not read per step) is accounted for;
4. each trial row's mbu and mfu lie in (0, 1), and mbu is shown against what a plain
   copy achieves (the practical ceiling).

    python3 -m bench roofline --model llama-3.1-8b --batches 1,8,32 --out $OUT/roofline.json
"""

from __future__ import annotations

import argparse
import time

from bench.benchkit import write_record


def make_trials(model: str, precision: str, batches: list[int], window_s: float, in_len: int, out_len: int):
    from sweeper.plan.expand import expand
    from sweeper.plan.spec import parse_sweep

    sweep = parse_sweep({
        "name": "roofline-bench", "models": model, "precisions": precision, "batch_sizes": batches,
        "workload": {"input_len": in_len, "output_len": out_len},
        "measure": {"warmup_iters": 1, "min_iters": 3, "min_duration_s": window_s, "idle_s": 0.0,
                    "min_window_s": window_s},
    })
    return expand(sweep)[0]


def _event_time_s(fn, iters: int) -> float:
    import torch

    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / iters


def copy_bandwidth_bytes_per_s(gib: float = 4.0, iters: int = 20) -> float:
    """Device-to-device copy: reads and writes ``gib`` each per call."""
    import torch

    n = int(gib * 2**30)
    src = torch.empty(n, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return 2 * n / _event_time_s(lambda: dst.copy_(src), iters)


def matmul_flop_per_s(dtype_name: str, n: int = 8192, iters: int = 20) -> float:
    import torch

    dtype = getattr(torch, dtype_name)
    a = torch.randn(n, n, device="cuda", dtype=dtype)
    b = torch.randn(n, n, device="cuda", dtype=dtype)
    return 2 * n**3 / _event_time_s(lambda: a @ b, iters)


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--precision", default="bf16", help="a dtype precision (synthetic weights): fp32, fp16, bf16")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--window-s", type=float, default=8.0)
    ap.add_argument("--input-len", type=int, default=512)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--out", default="roofline.json")


def run(args: argparse.Namespace) -> None:

    import torch

    from actors import environment
    from actors.actor import TrialRunner
    from sweeper.core.gpus import match_gpu
    from sweeper.core.precisions import PRECISIONS
    from sweeper.core.roofline import Architecture, weight_bytes_per_step

    precision = PRECISIONS[args.precision]
    device = torch.cuda.get_device_name()
    gpu = match_gpu(device)
    report: dict = {
        "model": args.model, "precision": args.precision, "device": device,
        "table_entry": gpu.name if gpu else None, "date": time.strftime("%Y-%m-%d"),
        "environment": dict(environment.capture().items()), "args": vars(args),
    }
    print(f"{device}: table entry {report['table_entry']}", flush=True)

    # 2. probes, before the model takes the memory
    copy_bw = copy_bandwidth_bytes_per_s()
    mm = matmul_flop_per_s(precision.torch_dtype)
    torch.cuda.empty_cache()  # the probes' tensors are gone; give their memory back for the model
    peak_bw = gpu.bandwidth_bytes_per_s if gpu else None
    peak_flop = gpu.flop_per_s[precision.peak_format] if gpu else None
    report["probes"] = {
        "copy_bytes_per_s": copy_bw, "peak_bandwidth_bytes_per_s": peak_bw,
        "copy_over_peak": copy_bw / peak_bw if peak_bw else None,
        "matmul_flop_per_s": mm, "peak_flop_per_s": peak_flop, "peak_format": precision.peak_format,
        "matmul_over_peak": mm / peak_flop if peak_flop else None,
    }
    print(f"copy {copy_bw / 1e9:.0f} GB/s = {report['probes']['copy_over_peak']} of peak; "
          f"{precision.torch_dtype} matmul {mm / 1e12:.0f} TFLOP/s = {report['probes']['matmul_over_peak']} of peak",
          flush=True)

    trials = make_trials(args.model, args.precision, [int(b) for b in args.batches.split(",")],
                         args.window_s, args.input_len, args.output_len)
    runner = TrialRunner()
    load = runner.load(trials[0])
    assert load.ok, load.error
    report["load_s"] = load.load_s
    info = runner.load_info
    assert info is not None and info.weight_memory_bytes is not None
    arch_config = info.architecture
    assert arch_config is not None, "the backend passed no architecture: roofline columns are off"
    arch = Architecture.from_config(arch_config)
    # 3. footprint: the per-step weights (B=1, less the one embedding row) + the stored embedding
    # when untied; buffers (rotary inv_freq) are the small remainder.
    analytic_stored = (weight_bytes_per_step(arch, precision, 1) - arch.hidden_size * precision.compute_bytes
                       + (0 if arch.tied_embeddings else arch.embedding_params * precision.compute_bytes))
    footprint = info.weight_memory_bytes
    report["footprint"] = {"weight_memory_bytes": footprint, "analytic_stored_bytes": analytic_stored,
                           "relative_difference": (footprint - analytic_stored) / footprint}
    print(f"footprint {footprint} B, analytic {analytic_stored:.0f} B "
          f"({report['footprint']['relative_difference']:+.2e})", flush=True)

    keep = ["batch_size", "input_len", "output_len", "status", "error", "gpu_names", "device_name",
            "duration_s", "throughput_tok_s", "ttft_s", "tpot_s", "flops_per_token", "weight_bytes_per_token",
            "kv_bytes_per_token", "mfu", "mbu", "gpu_peak_flop_per_s", "gpu_peak_bandwidth_bytes_per_s"]
    report["trials"] = []
    for trial in trials:
        row = runner.run(trial).row
        entry = {k: row.get(k) for k in keep}
        ceiling = report["probes"]["copy_over_peak"]
        entry["checks"] = {
            # a read-mostly stream can beat a copy's read+write mix a little: 1 is the hard bound
            "mbu_in_range": entry["mbu"] is not None and 0 < entry["mbu"] < 1,
            "mfu_in_range": entry["mfu"] is not None and 0 < entry["mfu"] < 1,
        }
        entry["mbu_over_copy_ceiling"] = entry["mbu"] / ceiling if entry["mbu"] and ceiling else None
        report["trials"].append(entry)
        print(f"bs={trial.batch_size}: {entry['status']} {entry['error'] or ''} tpot {entry['tpot_s']} s, "
              f"mbu {entry['mbu']}, mfu {entry['mfu']}, checks {entry['checks']}", flush=True)
    runner.close()
    report["ok"] = bool(gpu) and all(all(t["checks"].values()) for t in report["trials"]) and \
        abs(report["footprint"]["relative_difference"]) < 1e-3 and \
        (report["probes"]["copy_over_peak"] or 2) < 1 and (report["probes"]["matmul_over_peak"] or 2) < 1
    print(f"ok={report['ok']}")
    write_record(args.out, "roofline", report)
