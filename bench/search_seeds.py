"""Which configurations a search asks for first, seed by seed (GUIDE, "Searching").

A search's first points are TPE's random start-up draws (``n_startup_trials``: 2 for budgets
up to 8), which depend on the seed and on nothing measured: so which configurations a small
budget reaches can be counted on a CPU, over many seeds, through sweeper's own SearchRun. The
sweep given must plan runnable here (a noop stand-in of the GPU sweep's shape, such as
bench/search_cpu.yaml: 3 option variants x 2 precisions); ``--names`` maps its variants and
precisions, in order, to the names of the sweep it stands in for.

    python3 bench/search_seeds.py bench/search_cpu.yaml --seeds 200 --points 2 \\
        --names "max_num_seqs=16,max_num_seqs=32,max_num_seqs=64" --precisions "bf16,fp8" --out picks.json
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
from typing import Any

import yaml

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def picks(sweep_file: str, seeds: int, points: int, names: list[str] | None,
          precisions: list[str] | None) -> dict[int, list[str]]:
    from sweeper.core.capacity import Capacity
    from sweeper.plan.expand import make_plan
    from sweeper.plan.spec import parse_sweep
    from sweeper.run.search import SearchRun

    with open(sweep_file) as f:
        base = yaml.safe_load(f)
    backend = base["backends"] if isinstance(base["backends"], str) else base["backends"][0]
    own_precisions = base["precisions"] if isinstance(base["precisions"], list) else [base["precisions"]]
    out: dict[int, list[str]] = {}
    for seed in range(seeds):
        d = {**base, "search": {**base["search"], "seed": seed}}
        sweep = parse_sweep(d, sweep_file)
        assert sweep.search is not None, "the sweep has no search block"
        run = SearchRun(make_plan(sweep, "cpu"), sweep.search, "cpu", parallel=1)
        got = []
        for _ in range(points):
            p = run.ask()
            if p is None:
                break
            variant = str(p.params.get("backend", backend))
            index = int(variant.split("#")[1]) if "#" in variant else 0
            precision = str(p.params.get("precision", own_precisions[0]))
            label_v = names[index] if names else variant
            label_p = precisions[own_precisions.index(precision)] if precisions else precision
            got.append(f"{label_v} {label_p}")
            # Told at once, with a value start-up draws do not read.
            run.tell_capacity(p.trial, Capacity(capacity_load=1.0, capacity_req_s=1.0))
        out[seed] = got
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("sweep", help="a sweep file with a search block that plans runnable on this machine")
    parser.add_argument("--seeds", type=int, default=200)
    parser.add_argument("--points", type=int, default=2, help="points per search (start-up draws: at most 2 "
                        "for a budget up to 8; later points would depend on the values told)")
    parser.add_argument("--names", help="comma list: what the sweep's option variants stand for, in order")
    parser.add_argument("--precisions", help="comma list: what its precisions stand for, in order")
    parser.add_argument("--out", help="write the picks and their counts here (JSON)")
    args = parser.parse_args(argv)
    got = picks(args.sweep, args.seeds, args.points, args.names.split(",") if args.names else None,
                args.precisions.split(",") if args.precisions else None)
    firsts = collections.Counter(p[0] for p in got.values() if p)
    sets = collections.Counter(" + ".join(sorted(p)) for p in got.values())
    result: dict[str, Any] = {"sweep": args.sweep, "seeds": args.seeds, "points": args.points,
                              "first_point": dict(sorted(firsts.items())), "point_sets": dict(sets.most_common()),
                              "picks": got}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    print(json.dumps({k: v for k, v in result.items() if k != "picks"}, indent=1))
    print("seed 0:", got.get(0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
