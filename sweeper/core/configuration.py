"""The trial's configuration as trials-table columns: what the sweep file set for a trial
beyond its axes. The driver builds it from the trial (``Trial.configuration``); the actor never
sends it. Declared as a part, like the result's (``sweeper.core.results``), so that the schema
is generated from one kind of declaration."""

from __future__ import annotations

from dataclasses import dataclass

from sweeper.core.results import Part, column


@dataclass(frozen=True)
class Configuration(Part):
    """The trial's configuration beyond the grid's axes: what the sweep file set for it (built from the trial on the driver)."""

    dataset: str | None = column(
        "prompt source: random (token ids of input_len), prefix_repetition (random token ids after shared "
        "prefixes), bundled (sweeper's prompt set), a generated task (arithmetic, choices) or a prompt file as written in "
        "the sweep file")
    prefix_len: int | None = column(
        "prefix_repetition: tokens of each shared prefix, the first of input_len (null: no shared "
        "prefixes)")
    num_prefixes: int | None = column("prefix_repetition: distinct prefixes the prompts share, dealt evenly")
    dataset_sha256: str | None = column(
        "the prompt file's content hash, or a generated task's records' (null: random prompts)")
    min_input_len: int | None = column("dataset prompts shorter than this (tokens) were left out")
    max_input_len: int | None = column("dataset prompts longer than this (tokens) were left out")
    chat: bool | None = column("dataset prompts were wrapped in the model's chat template")
    conversations: bool | None = column(
        "serving: the prompt file's records were replayed as multi-turn conversations (num_prompts and "
        "request_rate count conversations; null: one prompt per record)")
    turn_gap_s: float | None = column("conversations: seconds between a reply's end and the next turn's send")
    history: str | None = column(
        "conversations: earlier replies in each turn's prompt: model (what the model replied) | reference "
        "(the file's replies)")
    output_lengths: str | None = column(
        "fixed (exactly output_len, EOS ignored) | natural (until EOS, at most output_len) | reference "
        "(the dataset's reply length, EOS ignored, at most output_len)")
    seed: int | None = column("prompt seed")
    warmup_iters: int | None = column("unrecorded generate calls before measuring")
    warmup_s: float | None = column("warm-up lasted at least this long (seconds)")
    min_iters: int | None = column("measured generate calls, at least")
    min_duration_s: float | None = column("measured window length, at least")
    idle_s: float | None = column("idle-baseline window before the measured phase")
    sample_interval_s: float | None = column("telemetry sampling interval")
    target_rel_ci: float | None = column(
        "the window measured until the 95 % interval of throughput (and, on GPUs, J/token) was within "
        "this share of the mean; null: a fixed window of min_duration_s")
    max_duration_s: float | None = column(
        "with target_rel_ci, where the window ended regardless (null: 60 s, or no target)")
    idle_reuse_tolerance_w: float | None = column(
        "a later trial of a group kept the group's idle baseline when a 0.5 s re-check of the settled "
        "power read within this many W per GPU of it (null: a fresh baseline every trial)")
    idle_reuse_max_age_s: float | None = column("idle baselines older than this were taken afresh")
    min_window_s: float | None = column(
        "windows (serving: steady windows) shorter than this are flagged unstable (min_duration_s unless "
        "the sweep set it)")
    max_rel_ci: float | None = column(
        "a headline figure whose 95 % interval was wider than this share of its mean flagged the trial "
        "unstable (target_rel_ci, when set, was the bound instead)")
    max_iteration_cv: float | None = column("per-iteration throughput or energy CV above this raised noisy_host")
    layer_profile: str | None = column(
        "layer-profiling granularity (block | submodule | leaf); null: no profiling pass")
    fidelity: str | None = column(
        "fidelity-pass settings (reference precision, prompts), canonical JSON; null: no fidelity pass")
    scoring: str | None = column(
        "how each measured reply was judged against its prompt's answer (method, pattern, tolerance), "
        "canonical JSON; null: not scored (docs/GUIDE.md, Accuracy beside energy)")
    mode: str | None = column(
        "offline (static batches of generate calls) | serving (requests arriving at request_rate, batched "
        "by the engine); null: a row from before serving mode (offline)")
    arrival: str | None = column("serving: arrival process of the requests (poisson | gamma | constant)")
    burstiness: float | None = column("serving: the gamma arrival process's shape (1 = Poisson)")
    num_prompts: int | None = column(
        "serving: requests per run (null: as many as arrive within arrivals_duration_s); offline with a "
        "dataset: the prompts sampled from it (null: all)")
    arrivals_duration_s: float | None = column("serving: requests arrive for at most this long")
    slo_ttft_s: float | None = column(
        "serving: SLO bound on time to first token (goodput counts requests meeting every bound)")
    slo_tpot_s: float | None = column("serving: SLO bound on time per output token")
    slo_e2e_s: float | None = column("serving: SLO bound on end-to-end latency")
    capacity_id: str | None = column(
        "capacity search: the configuration this probe measures (capacity.parquet's capacity_id); null: a "
        "trial of the grid")
    probe_step: int | None = column(
        "capacity search: the probe's step in its search (0: the range's low; a result reused from an "
        "earlier run keeps the step it was measured at)")
    slo_attainment_target: float | None = column(
        "capacity search: the share of the probe's requests that had to meet every SLO bound (null: no "
        "SLO, or no search)")
    search_id: str | None = column(
        "configuration search (the sweep's search block): the search this point belongs to; null: a grid")
    search_step: int | None = column(
        "configuration search: the point's step in its search (the order it was suggested in, 0-based)")
    search_params: str | None = column(
        "configuration search: the point's parameters as the searcher chose them (axis values and "
        "backend_options.<backend>.<option> values), canonical JSON; what a resumed search tells it again")
