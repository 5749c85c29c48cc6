"""Search, not grid: one space run both ways, compared.

Reads a grid's results directory (every configuration x a ladder of request rates:
bench/search_grid_gpu.yaml) and a search's (a capacity search per configuration, over the
configurations Optuna asked for: bench/search_gpu.yaml), and prints (and with --out writes) a
JSON comparison: each configuration's capacity both ways, the best configuration each way,
its objective (capacity_req_s: the highest request rate that held the SLO), and the GPU-seconds
each way spent.

The grid's capacity of a configuration is its highest ladder rate whose trial is ok, meets
every SLO bound for at least the attainment target of its requests (0.99 unless the trials
say otherwise) and is not saturated: the rule a capacity probe is judged by
(sweeper.core.capacity.judge). A configuration whose passes are not contiguous (a fail
below a pass) is said so (``monotone: false``), with the capacity read both ways.

GPU-seconds, two ways, both x the GPUs a trial holds:
  trials+loads  the trials' own time (finished_at - started_at) plus one model load (load_s)
                per engine group: what the issue asks for;
  stages        every stage span the actors recorded (stages.parquet: pre-load idle, load,
                close, warm-up, idle baseline, measure, harness): the GPU held by the sweep.
Trials rows and stage spans are read from the results' shards, so a directory filled by
several runs (a grid split by precision over device calls) counts every trial once.

    python3 -m bench search-compare --grid DIR --search DIR [--out FILE.json] [--tolerance 0.05]
"""

from __future__ import annotations

import argparse
import datetime
import glob
import json
import math
import os
import subprocess
import sys
from collections import defaultdict
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

# What makes a configuration: a trial's identity less its load.
CONFIG_COLUMNS = ("model", "backend", "backend_options", "precision", "tensor_parallel", "input_len", "output_len")
DEFAULT_ATTAINMENT = 0.99


def read_table(directory: str, kind: str) -> list[dict[str, Any]]:
    """Every shard of ``kind`` in a results directory (the merged file where there are no shards)."""
    files = sorted(glob.glob(os.path.join(directory, "shards", kind, "*.parquet")))
    if not files:
        merged = os.path.join(directory, f"{kind}.parquet")
        return pq.read_table(merged).to_pylist() if os.path.exists(merged) else []
    tables = [pq.read_table(f) for f in files]
    rows = pa.concat_tables(tables, promote_options="default").to_pylist()
    if kind == "trials":  # a trial re-run (retry, resume) keeps its last row
        last: dict[str, dict[str, Any]] = {}
        for row in sorted(rows, key=lambda r: (r.get("finished_at") is not None, r.get("finished_at") or 0)):
            last[row["trial_id"]] = row
        rows = list(last.values())
    return rows


def config_key(row: dict[str, Any]) -> str:
    return json.dumps({k: row.get(k) for k in CONFIG_COLUMNS}, sort_keys=True, default=str)


def labels(keys: list[str]) -> dict[str, str]:
    """Short names: the precision and the backend options that differ between configurations."""
    parsed = {k: json.loads(k) for k in keys}
    options = {k: json.loads(p["backend_options"] or "{}") for k, p in parsed.items()}
    varying = sorted({o for opts in options.values() for o in opts
                      if len({json.dumps(v.get(o)) for v in options.values()}) > 1})
    out = {}
    for k, p in parsed.items():
        parts = [f"{o}={options[k].get(o)}" for o in varying]
        rest = [f"{c}={p[c]}" for c in ("model", "backend", "tensor_parallel", "input_len", "output_len")
                if len({parsed[x][c] for x in keys}) > 1]
        out[k] = " ".join([*rest, *parts, str(p["precision"])])
    return out


def seconds(row: dict[str, Any]) -> float:
    start, end = row.get("started_at"), row.get("finished_at")
    if start is None or end is None:
        return 0.0
    return max((end - start).total_seconds(), 0.0)


def gpus(row: dict[str, Any]) -> int:
    return max(int(row.get("tensor_parallel") or 1), 1)


def gpu_seconds(trials: list[dict[str, Any]], stages: list[dict[str, Any]]) -> dict[str, Any]:
    """The two GPU-seconds figures, and their parts."""
    ran = [r for r in trials if r.get("status") in ("ok", "failed")]
    trial_s = sum(seconds(r) * gpus(r) for r in ran)
    loads: dict[tuple, float] = {}
    for r in ran:
        # One engine per group: rows of a group share its load_s (and its start).
        if r.get("load_s") is not None:
            loads[(config_key(r), round(float(r["load_s"]), 6))] = float(r["load_s"]) * gpus(r)
    width = {r["trial_id"]: gpus(r) for r in trials}
    by_stage: dict[str, float] = defaultdict(float)
    for s in stages:
        by_stage[s["stage"]] += float(s.get("duration_s") or 0.0) * width.get(s.get("trial_id"), 1)
    return {"trials_s": round(trial_s, 2), "loads_s": round(sum(loads.values()), 2), "engine_loads": len(loads),
            "load_each_s": sorted(round(v, 1) for v in loads.values()),
            "trials_plus_loads_s": round(trial_s + sum(loads.values()), 2),
            "stages_s": round(sum(by_stage.values()), 2),
            "stages_by_name_s": {k: round(v, 2) for k, v in sorted(by_stage.items())},
            "trials_run": len(ran)}


def passes(row: dict[str, Any], attainment: float) -> bool:
    if row.get("status") != "ok":
        return False
    got = row.get("slo_attainment")
    if got is None or got < attainment:
        return False
    return not row.get("saturated")


def verdict(row: dict[str, Any], attainment: float) -> str:
    if row.get("status") != "ok":
        return str(row.get("status"))
    if row.get("slo_attainment") is None or row["slo_attainment"] < attainment:
        return "slo"
    return "saturation" if row.get("saturated") else "pass"


def _finite(value: Any) -> float | None:
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def grid_capacities(trials: list[dict[str, Any]], attainment: float) -> dict[str, dict[str, Any]]:
    by_config: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in trials:
        if r.get("status") == "skipped" or _finite(r.get("request_rate")) is None:
            continue
        by_config[config_key(r)].append(r)
    out = {}
    for key, rows in by_config.items():
        rows.sort(key=lambda r: r["request_rate"])
        ladder = [{"rate": r["request_rate"], "verdict": verdict(r, attainment),
                   "slo_attainment": _finite(r.get("slo_attainment")), "saturated": r.get("saturated"),
                   "unstable": r.get("unstable"), "achieved_rate_req_s": _finite(r.get("achieved_rate_req_s")),
                   "ttft_p99_ms": None if _finite(r.get("ttft_p99_s")) is None else round(r["ttft_p99_s"] * 1e3, 1),
                   "tpot_p99_ms": None if _finite(r.get("tpot_p99_s")) is None else round(r["tpot_p99_s"] * 1e3, 2),
                   "energy_per_request_j": _finite(r.get("energy_per_request_j")),
                   "n_requests": r.get("n_requests"), "trial_s": round(seconds(r), 1), "trial_id": r["trial_id"]}
                  for r in rows]
        passed = [step for step in ladder if step["verdict"] == "pass"]
        highest = max(passed, key=lambda s: s["rate"]) if passed else None
        # Contiguous from the bottom: the highest pass below the first fail.
        contiguous = None
        for step in ladder:
            if step["verdict"] != "pass":
                break
            contiguous = step
        first_fail = next((s for s in ladder if s["verdict"] != "pass"), None)
        out[key] = {"capacity_req_s": highest["rate"] if highest else None,
                    "capacity_contiguous_req_s": contiguous["rate"] if contiguous else None,
                    "monotone": (highest is None and contiguous is None) or (highest is contiguous),
                    "first_fail_req_s": first_fail["rate"] if first_fail else None,
                    "first_fail_verdict": first_fail["verdict"] if first_fail else None,
                    "energy_per_request_j_at_capacity": highest["energy_per_request_j"] if highest else None,
                    "ladder": ladder}
    return out


def search_capacities(capacity: list[dict[str, Any]], trials: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    steps: dict[str, Any] = {}
    for r in trials:
        if r.get("capacity_id") is not None and r.get("search_step") is not None:
            steps.setdefault(r["capacity_id"], r["search_step"])
    probes: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in trials:
        if r.get("capacity_id") is not None:
            probes[r["capacity_id"]].append(r)
    out = {}
    for c in capacity:
        rows = sorted(probes.get(c["capacity_id"], []), key=lambda r: (r.get("probe_step") is None, r.get("probe_step")))
        target = c.get("attainment_target") or DEFAULT_ATTAINMENT
        out[config_key(c)] = {
            "capacity_req_s": _finite(c.get("capacity_req_s")), "fail_load": _finite(c.get("fail_load")),
            "bounded_by": c.get("bounded_by"), "precise": c.get("precise"), "imprecise_reason": c.get("imprecise_reason"),
            "n_probes": c.get("n_probes"), "probes_gpu_s": round(float(c.get("gpu_s") or 0.0), 2),
            "energy_per_request_j": _finite(c.get("energy_per_request_j")), "search_step": steps.get(c["capacity_id"]),
            "probes": [{"rate": r["request_rate"], "verdict": verdict(r, target),
                        "slo_attainment": _finite(r.get("slo_attainment")), "saturated": r.get("saturated"),
                        "unstable": r.get("unstable"), "trial_s": round(seconds(r), 1)} for r in rows]}
    return out


def by_budget(search: dict[str, dict[str, Any]], trials: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The search after its first k points (k = 1 .. all): its best and the GPU-seconds spent so far.
    A search's point k is the same whatever its budget (its sampler is seeded per step), so the
    first k points of a larger search are the search a budget of k would have run."""
    per_point: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in trials:
        if r.get("capacity_id") is not None:
            per_point[config_key(r)].append(r)
    steps = sorted((v["search_step"], k) for k, v in search.items() if v.get("search_step") is not None)
    out: list[dict[str, Any]] = []
    seen: dict[str, Any] = {}
    for step, key in steps:
        seen[key] = search[key]
        gpu = gpu_seconds(per_point.get(key, []), [])
        if out:
            gpu_so_far = out[-1]["trials_plus_loads_s"] + gpu["trials_plus_loads_s"]
        else:
            gpu_so_far = gpu["trials_plus_loads_s"]
        keys, value = best(seen)
        out.append({"points": len(seen), "step": step, "asked": key, "best": keys, "best_capacity_req_s": value,
                    "point_trials_plus_loads_s": gpu["trials_plus_loads_s"],
                    "trials_plus_loads_s": round(gpu_so_far, 2)})
    return out


def best(capacities: dict[str, dict[str, Any]], column: str = "capacity_req_s") -> tuple[list[str], float | None]:
    """The configurations with the highest capacity (every one tied at it), and that capacity."""
    values = {k: v[column] for k, v in capacities.items() if v.get(column) is not None}
    if not values:
        return [], None
    top = max(values.values())
    return sorted(k for k, v in values.items() if v == top), top


def _commit() -> str | None:
    """SWEEPER_COMMIT where set (the lent GPU machines get the tree without .git), else git's HEAD."""
    if os.environ.get("SWEEPER_COMMIT"):
        return os.environ["SWEEPER_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10,
                              cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def compare(grid_dir: str, search_dir: str, tolerance: float) -> dict[str, Any]:
    grid_trials, search_trials = read_table(grid_dir, "trials"), read_table(search_dir, "trials")
    capacity_rows = read_table(search_dir, "capacity")
    attainment = next((c["attainment_target"] for c in capacity_rows if c.get("attainment_target")), DEFAULT_ATTAINMENT)
    grid = grid_capacities(grid_trials, attainment)
    search = search_capacities(capacity_rows, search_trials)
    names = labels(sorted(set(grid) | set(search)))
    grid_best, grid_value = best(grid)
    search_best, search_value = best(search)
    grid_gpu = gpu_seconds(grid_trials, read_table(grid_dir, "stages"))
    search_gpu = gpu_seconds(search_trials, read_table(search_dir, "stages"))
    # The search's pick, scored on the grid's own ladder: the like-for-like check.
    pick_on_grid = max((grid.get(k, {}).get("capacity_req_s") or 0.0 for k in search_best), default=None)
    same = bool(set(search_best) & set(grid_best))
    within = (pick_on_grid is not None and grid_value is not None and grid_value > 0
              and pick_on_grid >= (1 - tolerance) * grid_value)
    ratio = {m: (round(search_gpu[m] / grid_gpu[m], 3) if grid_gpu[m] else None)
             for m in ("trials_plus_loads_s", "stages_s")}
    budgets = []
    for b in by_budget(search, search_trials):
        pick = max((grid.get(k, {}).get("capacity_req_s") or 0.0 for k in b["best"]), default=None)
        budgets.append({**{k: v for k, v in b.items() if k not in ("asked", "best")},
                        "asked": names[b["asked"]], "best": [names[k] for k in b["best"]],
                        "same_best_as_grid": bool(set(b["best"]) & set(grid_best)),
                        "pick_on_grid_req_s": pick,
                        "pick_within_tolerance_on_grid": bool(pick is not None and grid_value
                                                              and pick >= (1 - tolerance) * grid_value),
                        "gpu_s_ratio": (round(b["trials_plus_loads_s"] / grid_gpu["trials_plus_loads_s"], 3)
                                        if grid_gpu["trials_plus_loads_s"] else None)})
    table = []
    for k in sorted(names, key=lambda k: names[k]):
        g, s = grid.get(k, {}), search.get(k)
        table.append({"configuration": names[k], "grid_capacity_req_s": g.get("capacity_req_s"),
                      "grid_first_fail_req_s": g.get("first_fail_req_s"), "grid_first_fail": g.get("first_fail_verdict"),
                      "grid_monotone": g.get("monotone"),
                      "grid_energy_per_request_j": g.get("energy_per_request_j_at_capacity"),
                      "searched": s is not None, "search_step": s and s["search_step"],
                      "search_capacity_req_s": s and s["capacity_req_s"], "search_fail_req_s": s and s["fail_load"],
                      "search_bounded_by": s and s["bounded_by"], "search_precise": s and s["precise"],
                      "search_probes": s and s["n_probes"], "search_energy_per_request_j": s and s["energy_per_request_j"]})
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": _commit(),
        "objective": "maximize capacity_req_s (the highest request rate whose trial met the SLO for "
                     f">= {attainment:g} of its requests without saturating)",
        "tolerance": tolerance,
        "grid": {"dir": grid_dir, "configurations": len(grid), "best": [names[k] for k in grid_best],
                 "best_capacity_req_s": grid_value, "gpu": grid_gpu},
        "search": {"dir": search_dir, "configurations": len(search), "best": [names[k] for k in search_best],
                   "best_capacity_req_s": search_value, "gpu": search_gpu,
                   "search_ids": sorted({r["search_id"] for r in search_trials if r.get("search_id")})},
        "claim": {"same_best": same, "search_pick_on_grid_req_s": pick_on_grid,
                  "search_pick_within_tolerance_on_grid": within,
                  "search_best_over_grid_best": (round(search_value / grid_value, 4)
                                                 if search_value and grid_value else None),
                  "gpu_s_ratio": ratio,
                  "at_most_a_third": {m: (r is not None and r <= 1 / 3) for m, r in ratio.items()},
                  "holds": bool((same or within) and ratio["trials_plus_loads_s"] is not None
                                and ratio["trials_plus_loads_s"] <= 1 / 3)},
        "by_budget": budgets,
        "configurations": table,
        "grid_ladders": {names[k]: v["ladder"] for k, v in grid.items()},
        "search_probes": {names[k]: v["probes"] for k, v in search.items()},
    }


def render(result: dict[str, Any]) -> str:
    lines = ["| configuration | grid capacity req/s (first fail) | search capacity req/s (next failed, bound) | probes |",
             "|---|---|---|---|"]
    for row in result["configurations"]:
        grid = f"{row['grid_capacity_req_s']} ({row['grid_first_fail_req_s']}: {row['grid_first_fail']})"
        if row["searched"]:
            search = (f"{row['search_capacity_req_s']} ({row['search_fail_req_s']}, {row['search_bounded_by']}"
                      f"{'' if row['search_precise'] else ', imprecise'}) step {row['search_step']}")
        else:
            search = "not asked"
        lines.append(f"| {row['configuration']} | {grid} | {search} | {row['search_probes'] or ''} |")
    g, s, c = result["grid"], result["search"], result["claim"]
    lines += ["",
              f"grid best:   {', '.join(g['best'])} at {g['best_capacity_req_s']} req/s; "
              f"GPU-s {g['gpu']['trials_plus_loads_s']} (trials {g['gpu']['trials_s']} + {g['gpu']['engine_loads']} "
              f"loads {g['gpu']['loads_s']}), stages {g['gpu']['stages_s']}",
              f"search best: {', '.join(s['best'])} at {s['best_capacity_req_s']} req/s; "
              f"GPU-s {s['gpu']['trials_plus_loads_s']} (trials {s['gpu']['trials_s']} + {s['gpu']['engine_loads']} "
              f"loads {s['gpu']['loads_s']}), stages {s['gpu']['stages_s']}",
              f"same best: {c['same_best']}; the search's pick on the grid's ladder: {c['search_pick_on_grid_req_s']} "
              f"req/s (within {result['tolerance']:.0%} of the grid's best: {c['search_pick_within_tolerance_on_grid']}); "
              f"GPU-s ratio search/grid: {c['gpu_s_ratio']}; claim holds: {c['holds']}", ""]
    for b in result["by_budget"]:
        lines.append(f"after {b['points']} point(s) (step {b['step']} asked {b['asked']}): best {', '.join(b['best'])} "
                     f"at {b['best_capacity_req_s']} req/s; same as the grid's: {b['same_best_as_grid']} (on the grid's "
                     f"ladder {b['pick_on_grid_req_s']}); GPU-s {b['trials_plus_loads_s']} = {b['gpu_s_ratio']} of the grid's")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--grid", required=True, help="the grid's results directory")
    parser.add_argument("--search", required=True, help="the search's results directory")
    parser.add_argument("--out", help="write the JSON comparison here")
    parser.add_argument("--tolerance", type=float, default=0.05, help="how close counts as found (share, 0.05)")


def run(args: argparse.Namespace) -> int:
    result = compare(args.grid, args.search, args.tolerance)
    if args.out:
        with open(args.out, "w") as f:
            f.write(json.dumps(result, indent=1, default=str) + "\n")
    print(render(result))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="search_compare", description=(__doc__ or "").split("\n\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
