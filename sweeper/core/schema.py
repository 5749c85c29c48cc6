"""The result tables' schemas: one place, units in every name, documented.

Shards are cast to these schemas when written, so every shard of a kind has the
same columns and types, and ``docs/SCHEMA.md`` is generated from here.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pyarrow as pa

from sweeper.core.capacity import Capacity
from sweeper.core.configuration import Configuration
from sweeper.core.results import Part, RowError, TrialResult
from sweeper.core.search import SearchPoint


@dataclass(frozen=True)
class Column:
    name: str
    type: pa.DataType
    doc: str


def _c(name: str, type_: pa.DataType, doc: str) -> Column:
    return Column(name, type_, doc)


S, I, F, B = pa.string(), pa.int64(), pa.float64(), pa.bool_()  # noqa: E741 - short type aliases keep the table readable
TS = pa.timestamp("us", tz="UTC")
FL, IL = pa.list_(F), pa.list_(I)  # per-GPU figures, one element per GPU

_IDENTITY: tuple[Column, ...] = (
    _c("trial_id", S, "content hash of the trial's configuration (stable across runs)"),
    _c("sweep", S, "sweep name"),
)

_ARROW: dict[Any, pa.DataType] = {str: S, int: I, float: F, bool: B, datetime: TS}


def _axis_columns() -> tuple[Column, ...]:
    """The columns of the grid's axes, from the axis table (each axis declares its own)."""
    from sweeper.core.axes import AXES

    return tuple(_c(name, _ARROW[kind], doc) for axis in AXES for name, kind, doc in axis.column_schema())


def _python_to_arrow(kind: Any) -> pa.DataType:
    if typing.get_origin(kind) is list:
        # An element may be null (a GPU with no sample of a slow field): the list's type is the element's.
        element = [a for a in typing.get_args(typing.get_args(kind)[0]) if a is not type(None)] \
            or [typing.get_args(kind)[0]]
        return pa.list_(_python_to_arrow(element[0]))
    return _ARROW[kind]


def _part_columns(part: type[Part]) -> tuple[Column, ...]:
    return tuple(_c(spec.name, _python_to_arrow(spec.type), spec.doc) for spec in part.specs())


# The trial's configuration beyond the axes (the driver's, from the trial), then the parts of
# the result its actor measures (sweeper.core.results: the columns are declared there).
_PARTS: tuple[type[Part], ...] = (Configuration, *TrialResult.part_types())
_RESULT: tuple[Column, ...] = tuple(c for part in _PARTS for c in _part_columns(part))

REQUESTS: tuple[Column, ...] = (
    _c("trial_id", S, "trial the request belongs to"),
    _c("iteration", I, "measured generate call (0-based); null in serving mode"),
    _c("request_index", I, "sequence index within the batch; serving: the request's number in arrival order "
                           "(conversations: numbered by conversation, then turn)"),
    _c("conversation_id", I, "conversations: the conversation the request is a turn of (0-based, in the order "
                             "the conversations arrived); null outside conversations"),
    _c("turn", I, "conversations: the request's turn in its conversation (0-based); its prompt holds every "
                  "earlier turn and reply"),
    _c("input_len", I, "prompt tokens"),
    _c("output_tokens", I, "generated tokens"),
    _c("t_start_s", F, "request start, seconds from the start of the measured window; serving: when the client "
                       "sent it (arrival_s + send_lateness_s, later still when max_concurrency held it back)"),
    _c("ttft_s", F, "time to first generated token"),
    _c("tpot_s", F, "time per output token after the first"),
    _c("e2e_s", F, "end-to-end latency"),
    # serving mode: times in seconds from the run's start
    _c("arrival_s", F, "serving: when the request arrived (its place in the arrival process)"),
    _c("send_lateness_s", F, "serving: how late the client sent it: t_start_s less when it was due (arrival_s, or "
                             "the moment a slot came free where max_concurrency held it back); the client's own "
                             "delay, never the engine's (null: never sent)"),
    _c("cached_tokens", I, "serving: of its prompt tokens, those the engine took from its prefix cache (vLLM's "
                           "num_cached_tokens; a server's usage.prompt_tokens_details.cached_tokens); null where "
                           "the engine does not say"),
    _c("scheduled_s", F, "serving: when the engine first scheduled it (null where the engine does not say)"),
    _c("first_token_s", F, "serving: when its first token reached the client"),
    _c("finish_s", F, "serving: when its last token reached the client"),
    _c("queue_s", F, "serving: scheduled_s - t_start_s, time queued inside the engine"),
    _c("itl_s", pa.list_(F), "serving: the gaps between its consecutive tokens (0 for tokens delivered together)"),
    _c("in_window", B, "serving: it finished inside the trial's steady window"),
    _c("meets_slo", B, "serving: it met every SLO bound (null without an slo)"),
    _c("energy_j", F, "its share of the GPU energy (the trial's request_energy_method): a serving run's "
                      "requests sum to its run_energy_j, an offline window's to its energy_j; null where "
                      "not attributed (random prompts of one shape offline: energy_per_request_j says it)"),
    _c("prefill_energy_j", F, "serving: of energy_j, the part spent in the request's prefill (from its scheduling, or "
                              "where the engine does not say (an HTTP server) its sending, to its first token, by token share: the prompt tokens the engine computed against the "
                              "tokens others processed beside it)"),
    _c("error", S, "serving: why the request failed or did not finish; null if it completed"),
)

TIMELINE: tuple[Column, ...] = (
    _c("trial_id", S, "trial the sample belongs to"),
    _c("t_s", F, "seconds from the start of the measured window (negative: idle baseline)"),
    _c("gpu_index", I, "NVML (physical) index of the GPU"),
    _c("gpu_uuid", S, "GPU UUID"),
    _c("power_w", F, "instantaneous power"),
    _c("energy_mj", F, "NVML total-energy counter (raw, mJ since driver load)"),
    _c("util_gpu_pct", F, "GPU utilisation"),
    _c("memory_used_bytes", I, "device memory used (whole GPU)"),
    _c("sm_clock_mhz", F, "SM clock"),
    _c("temperature_c", F, "GPU temperature"),
    _c("phase", S, "offline: prefill | decode when the sample falls in a generate call's phase, else null; "
                   "serving: ramp | steady | drain (the run's steady-state window and either side)"),
)

LAYERS: tuple[Column, ...] = (
    _c("trial_id", S, "trial the profiling pass belongs to"),
    _c("module", S, "qualified module name in the model (e.g. model.layers.3.self_attn; the root model: '')"),
    _c("module_type", S, "role: decoder_block | attention | mlp | norm | embedding | rotary_embedding | "
                         "final_norm | lm_head | other (leaf modules: the role of the unit they sit in); "
                         "<role>_rest (decoder_block_rest, model_rest, ...): what a module holding profiled "
                         "modules runs outside them (residual adds, mask set-up), so a phase's rows cover "
                         "the whole forward"),
    _c("layer_index", I, "decoder block index, null for modules outside the blocks"),
    _c("phase", S, "prefill (forwards over the prompt) | decode (one-token forwards)"),
    _c("calls", I, "forward calls of the module in this phase over the whole pass"),
    _c("gpu_time_s", F, "the module's time over the whole pass, as gpu_time_method says; on CUDA the summed "
                        "duration of the GPU kernels (and memcpy/memset) launched inside its forward, "
                        "idle gaps between them excluded"),
    _c("gpu_time_method", S, "cuda_kernel_time (torch.profiler/CUPTI kernel durations, the CUDA default) | "
                             "host_clock (CPU runs: synchronous there) | cpu_op_time (the profiler's CPU op "
                             "durations, a kernel-time pass run on a CPU)"),
    _c("time_share", F, "gpu_time_s / the phase's summed gpu_time_s over all its rows (rests included)"),
    _c("energy_j", F, "energy attributed to the module in this phase (null on CPU-only runs)"),
    _c("method", S, "energy attribution method: gpu_time_share_of_phase_energy | gpu_time_share_of_window_energy"),
)


STAGES: tuple[Column, ...] = (
    _c("trial_id", S, "trial the span is recorded with (a group's stages: with the first trial recorded after "
                      "its load)"),
    _c("stage", S, "actor_start | close | pre_load_idle | reference | materialize | load | engine_start | weights | "
                   "engine_compile | kv_cache | cuda_graphs | engine_warmup (scope group; the last six: a vLLM "
                   "engine's start, from its log) | compile | warmup | idle_baseline | measure | fidelity | layer_pass | harness "
                   "(scope trial); sweeper/core/stages.py says what each holds"),
    _c("scope", S, "group (once per loaded model) | trial"),
    _c("started_at", TS, "when the span began (the actor's clock, UTC)"),
    _c("duration_s", F, "the span's length; stages are timed exclusively (a stage nested in another pauses it), "
                        "so one slot's spans never overlap"),
    _c("node", S, "the node it ran on (host:ray-node-id prefix)"),
    _c("gpu_ids", S, "node-local GPU ids the actor held, comma-separated; null: a CPU-only node"),
)


def trials_columns() -> tuple[Column, ...]:
    """The trials table: identity, one column set per axis of the axis table, then results."""
    return _IDENTITY + _axis_columns() + _RESULT


TRIALS = trials_columns()  # as built in; ``columns("trials")`` also sees axes added since

TABLES: dict[str, tuple[Column, ...]] = {
    "trials": TRIALS,
    "requests": REQUESTS,
    "timeline": TIMELINE,
    "layers": LAYERS,
    "stages": STAGES,
}


# Tables a run derives from its trials rather than measures, each row a shard of its own, keyed
# by what it answers for: one row per capacity search (sweeper.core.capacity), written when the
# search ends; one per point of a configuration search (sweeper.core.search), written at the run's end.
DERIVED: dict[str, tuple[Column, ...]] = {
    "capacity": _part_columns(Capacity),
    "search": _part_columns(SearchPoint),
}


def columns(kind: str) -> tuple[Column, ...]:
    if kind == "trials":
        return trials_columns()
    return TABLES[kind] if kind in TABLES else DERIVED[kind]


def arrow_schema(kind: str) -> pa.Schema:
    return pa.schema([pa.field(c.name, c.type) for c in columns(kind)])


def to_table(kind: str, rows: list[dict[str, Any]] | pa.Table) -> pa.Table:
    """Rows (or a table) as a table of exactly ``kind``'s schema.

    Missing columns become nulls; an unknown column is a programming error and
    raises, so the schema cannot drift silently.
    """
    schema = arrow_schema(kind)
    names = set(schema.names)
    if isinstance(rows, pa.Table):
        unknown = set(rows.column_names) - names
        if unknown:
            raise KeyError(f"{kind}: unknown columns {sorted(unknown)}")
        cols = [rows.column(f.name).cast(f.type) if f.name in rows.column_names
                else pa.nulls(rows.num_rows, f.type) for f in schema]
        return pa.Table.from_arrays(cols, schema=schema)
    for row in rows:
        unknown = set(row) - names
        if unknown:
            raise KeyError(f"{kind}: unknown columns {sorted(unknown)}")
    return pa.Table.from_pylist(rows, schema=schema)


def check_rows(kind: str, rows: list[dict[str, Any]]) -> None:
    """Raise ``RowError`` naming the first column of ``rows`` that ``kind``'s schema does not
    know, or whose values its type cannot hold. Actors check their rows with this before
    they leave the process, so a misspelled column (or a driver and worker of different
    versions) fails one trial, with the reason, instead of the driver's writer."""
    schema = arrow_schema(kind)
    names = {k for row in rows for k in row}
    unknown = sorted(names - set(schema.names))
    if unknown:
        raise RowError(f"{kind}: column(s) the schema does not know: {', '.join(unknown)}")
    for name in sorted(names):
        field = schema.field(name)
        try:
            pa.array([row.get(name) for row in rows], type=field.type)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exc:
            raise RowError(f"{kind}.{name}: not a {field.type} ({exc})") from None


def schema_markdown() -> str:
    lines = []
    for kind, cols in {**TABLES, **DERIVED}.items():
        lines += [f"### `{kind}.parquet`", "", "| column | type | meaning |", "| --- | --- | --- |"]
        lines += [f"| `{c.name}` | {c.type} | {c.doc.replace('|', chr(92) + '|')} |" for c in cols]
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":  # python -m sweeper.core.schema > docs/SCHEMA.md
    print("# Result tables\n")
    print("Generated from `sweeper/core/schema.py` and, for the trials table's results, the typed parts "
          "in `sweeper/core/results/` that actors send (`python -m sweeper.core.schema > docs/SCHEMA.md`); "
          "a test keeps the two in step. Units are in the column names: `_s` seconds, `_j` joules, "
          "`_w` watts, `_bytes` bytes, `_mj` millijoules, `_mhz` MHz, `_c` degrees Celsius, `_pct` per cent.\n")
    print("Per-GPU figures (`gpu_energy_j`, `gpu_avg_power_w`, `gpu_peak_power_w`, `gpu_peak_memory_bytes`, "
          "`gpu_idle_power_w`) are list columns of the trials table, one element per GPU in the order of "
          "`gpu_uuids`, not a child table: a trial holds the GPUs of one node (a handful), so its row stays "
          "whole and needs no join. In DuckDB, `list_sum(gpu_energy_j)` gives back `energy_j` and "
          "`unnest(gpu_energy_j)` one row per GPU; in pandas each cell is a list.\n")
    print(schema_markdown())
    from sweeper.core.budget import BUDGET_COLUMNS

    print("### Derived by the analysis (not stored)\n")
    print("`sweeper report`, `load_results` (the notebooks) and `sweeper query`'s `trials` view add these to "
          "the trials from the sweep file's `report` block (recorded in `plan.json`) or `sweeper report`'s flags.\n")
    print("| column | type | meaning |\n| --- | --- | --- |")
    for column in BUDGET_COLUMNS:
        print(f"| `{column.name}` | double | {column.doc} |")
