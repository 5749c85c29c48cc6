"""From a validated sweep to a plan: grid expansion, exclusions, compatibility, groups."""

from __future__ import annotations

import itertools
import math
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sweeper.core.axes import AXES, AxisPoint, ModelRef
from sweeper.core.backends import BACKENDS
from sweeper.core.datasets import (
    BYTES_PER_TOKEN_FALLBACK,
    ConversationRecord,
    DatasetError,
    PromptRecord,
    dataset_path,
    fallback_tokens,
    file_format,
    read_conversations,
    read_records,
    sha256_of,
)
from sweeper.core.errors import ModelResolutionError, SweepFileError
from sweeper.core.precisions import PRECISIONS
from sweeper.core.settings import DatasetFormat, DatasetSettings, Device
from sweeper.core.tasks import records_sha256, task_json, task_records
from sweeper.core.trial import GroupLoad, Trial
from sweeper.plan.capabilities import Capabilities
from sweeper.plan.engine_versions import version_lines
from sweeper.plan.models import resolve_model
from sweeper.plan.spec import Sweep
from sweeper.plan.steady import steady_window_warnings
from sweeper.plan.strict import MAX_TOKENS


@dataclass(frozen=True)
class PlannedTrial:
    trial: Trial
    skip_reason: str | None = None

    @property
    def runnable(self) -> bool:
        return self.skip_reason is None


@dataclass(frozen=True)
class TrialGroup:
    """Trials that share a load key: one actor, one model load, run back to back."""

    load_key: tuple
    trials: tuple[Trial, ...]
    # One trial of each other group whose fidelity reference this group's model is: the
    # group computes their references right after its own load, so they start no load of
    # their own for it (``actors.quality.reference``).
    serves_reference: tuple[Trial, ...] = ()

    @property
    def num_gpus(self) -> int:
        return max(t.num_gpus for t in self.trials)

    @property
    def backend(self) -> str:
        return self.trials[0].backend

    @property
    def label(self) -> str:
        t = self.trials[0]
        return f"{t.model} {t.backend}/{t.precision}"

    @property
    def load_request(self) -> GroupLoad:
        """What the group's load is told beyond its first trial."""
        return GroupLoad(serves_reference=self.serves_reference, step_tokens=self.step_tokens)

    @property
    def step_tokens(self) -> tuple[int, ...] | None:
        steps: set[int] = set()
        for t in self.trials:
            if t.serving is not None or t.prompts is not None or t.stops_at_eos or t.batch_size is None \
                    or t.input_len is None:
                return None
            steps |= {t.batch_size, t.batch_size * t.input_len}
        return tuple(sorted(steps))

    def may_follow(self, previous: TrialGroup) -> bool:
        """Whether an actor that ran ``previous`` may load this group next: both let an actor go
        on, and ``previous`` left no CUDA context in the actor's process that this group's
        engine processes would find on their GPU."""
        if not (self.reuses_actor and previous.reuses_actor):
            return False
        return not (BACKENDS[self.backend].engine_in_processes and BACKENDS[previous.backend].context_in_actor)

    @property
    def reuses_actor(self) -> bool:
        """Whether every backend the group loads (a fidelity reference's included) lets an actor
        go on to another group after closing it."""
        t = self.trials[0]
        reference = t.fidelity.reference_backend if t.fidelity else None
        return (BACKENDS[t.backend].reuses_actor_with(t.backend_options)
                and (reference is None or BACKENDS[reference].reuses_actor_with(None)))


@dataclass
class Plan:
    sweep: Sweep
    device: Device
    trials: list[PlannedTrial]
    excluded: int = 0
    notes: list[str] = field(default_factory=list)
    # What the user should know before running (printed as warnings; the plan runs as it is).
    warnings: list[str] = field(default_factory=list)

    @property
    def runnable(self) -> list[Trial]:
        return [p.trial for p in self.trials if p.runnable]

    @property
    def skipped(self) -> list[PlannedTrial]:
        return [p for p in self.trials if not p.runnable]

    def load_count(self, trials: list[Trial] | None = None) -> int:
        """How many groups (model loads) ``groups`` would make, without ordering them."""
        return len({t.load_key for t in (self.runnable if trials is None else trials)})

    def groups(self, trials: list[Trial] | None = None) -> list[TrialGroup]:
        by_key: OrderedDict[tuple, list[Trial]] = OrderedDict()
        for t in self.runnable if trials is None else trials:
            by_key.setdefault(t.load_key, []).append(t)
        # Which groups another group's fidelity reference runs as (same model, reference
        # precision and backend): those compute it, and start first, so that the others
        # read it instead of loading the reference precision themselves.
        serves: dict[tuple, list[Trial]] = {}
        for key, members in by_key.items():
            ref = members[0].reference_load_key
            if ref is not None and ref != key and ref in by_key:
                serves.setdefault(ref, []).append(members[0])
        # Small batches (and light loads) first: if a batch runs out of memory, larger
        # ones of the same group can be predicted to as well.
        groups = [
            TrialGroup(k, tuple(sorted(v, key=lambda t: (t.batch_size or 0, t.request_rate or 0.0,
                                                          t.max_concurrency or 0, t.shape, t.repeat))),
                       serves_reference=tuple(serves.get(k, ())))
            for k, v in by_key.items()
        ]
        return sorted(groups, key=_start_order)  # stable: otherwise in table order


def _start_order(group: TrialGroup) -> tuple[bool, int, bool]:
    """Which groups start first: those whose fidelity reference the others read; then the
    widest (a tensor-parallel group needs several GPUs free at once, which narrower groups
    started before it would keep taking); then those whose load starts an engine or a
    server, the longest, so that quick groups fill the GPUs around them."""
    backend = BACKENDS[group.trials[0].backend]
    return not group.serves_reference, -group.num_gpus, not backend.slow_start


def resolve_models(sweep: Sweep, *, sweep_path: str = "<sweep>", check_hub: bool = True) -> list[ModelRef]:
    base = Path(sweep_path).parent if sweep_path != "<sweep>" else None
    refs, problems = [], []
    for i, entry in enumerate(sweep.models):
        try:
            refs.append(resolve_model(entry, base_dir=base, check_hub=check_hub))
        except ModelResolutionError as exc:
            problems.append((f"models[{i}]", str(exc)))
    if problems:  # every entry that names nothing, at once
        raise SweepFileError(sweep_path, *problems[0], more=tuple(problems[1:]))
    return refs


# Past this many trials a grid is refused at plan time, before it costs memory or minutes.
MAX_TRIALS = 1_000_000


@dataclass(frozen=True)
class Grid:
    """What the axis table reads its values from (``sweeper.core.axes.GridSource``)."""

    sweep: Sweep
    models: list[ModelRef]


def expand(sweep: Sweep, *, sweep_path: str = "<sweep>", check_hub: bool = True) -> tuple[list[Trial], int]:
    """The full grid as trials, less those matching an ``exclude`` rule.

    One trial per point of the product of every axis's values (``AXES``, in
    table order). Returns the trials and the number excluded.
    """
    grid = Grid(sweep, resolve_models(sweep, sweep_path=sweep_path, check_hub=check_hub))
    values = [list(axis.values(grid)) for axis in AXES]
    size = math.prod(len(v) for v in values)
    if size > MAX_TRIALS:
        raise SweepFileError(sweep_path, None, f"the grid has {size:,} trials, more than the {MAX_TRIALS:,} one "
                             "sweep may plan; split it into several sweeps or add exclude rules")
    prompts = dataset_settings(sweep, sweep_path, grid.models)
    names = AXES.names
    layer_profile = sweep.profile.layers if sweep.profile is not None else None
    serving = sweep.workload.serving()
    load_search = sweep.workload.load_search if serving is not None else None
    trials: list[Trial] = []
    excluded = 0
    rules = _compiled_rules(sweep.exclude)
    # The plain value (what rules see) of each axis value, worked out once per value, not per trial.
    keys = [[AXES[name].key(v) for v in vals] for name, vals in zip(names, values, strict=True)]
    for index in itertools.product(*(range(len(v)) for v in values)):
        if rules and any(rule(index, keys) for rule in rules):
            excluded += 1
            continue
        point = AxisPoint(tuple((name, values[a][i]) for a, (name, i) in enumerate(zip(names, index, strict=True))))
        trials.append(Trial(
            sweep=sweep.name, point=point,
            dataset=sweep.workload.dataset_name, seed=sweep.workload.seed, measure=sweep.measure,
            layer_profile=layer_profile, fidelity=sweep.fidelity, serving=serving, prompts=prompts,
            output_lengths=sweep.workload.output_lengths, shared_prefix=sweep.workload.shared_prefix,
            scoring=sweep.scoring, load_search=load_search, probe_step=0 if load_search is not None else None,
        ))
    return trials, excluded


def _compiled_rules(rules: list[dict[str, Any]]) -> list[Callable[[tuple[int, ...], list[list[Any]]], bool]]:
    """Each ``exclude`` rule as a test of a grid point given as value indices: the rule's
    allowed values, per axis it names, looked up in a set (rules x trials stays cheap)."""
    position = {name: i for i, name in enumerate(AXES.names)}
    compiled: list[Callable[[tuple[int, ...], list[list[Any]]], bool]] = []
    for rule in rules:
        wanted = [(position[key], _as_list(value)) for key, value in rule.items()]

        def test(index: tuple[int, ...], keys: list[list[Any]], wanted: list = wanted) -> bool:
            return all(keys[a][index[a]] in options for a, options in wanted)

        compiled.append(test)
    return compiled


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def dataset_settings(sweep: Sweep, sweep_path: str = "<sweep>",
                     models: list[ModelRef] | None = None) -> DatasetSettings | None:
    """The workload's prompt file, read and checked now (None: random prompts).

    Reading it here finds a missing, malformed or empty file, or a record without a
    prompt, before any trial runs; its content hash makes an edited file a new workload.
    """
    w = sweep.workload
    if w.random_tokens:
        return None
    if w.task is not None:
        return _task_settings(sweep, sweep_path)
    base = Path(sweep_path).parent if sweep_path != "<sweep>" else None
    path = dataset_path(w.dataset_name, base)
    fmt, conversations, records = _read_prompt_file(sweep, sweep_path, path)
    if conversations is None:
        _check_answers(sweep, sweep_path, str(path), records)
    else:
        _check_turn_answers(sweep, sweep_path, str(path), conversations)
    if conversations is not None and w.history == "reference":
        _check_reference_history(sweep_path, path, conversations)
    if w.output_lengths == "reference":
        _check_reference_lengths(sweep_path, path, records, conversations)
    if any(ref.source == "synthetic" for ref in models or []):
        # Synthetic models have no tokenizer: their prompt lengths are known here, so a filter that
        # keeps nothing is found now (real models' tokenizers run on the actor, which says so there).
        _check_synthetic_lengths(sweep, sweep_path, path, records)
    return DatasetSettings(name=w.dataset_name, path=str(path), format=fmt, sha256=sha256_of(path),
                           records=len(records), num_prompts=w.num_prompts, min_input_len=w.min_input_len,
                           max_input_len=w.max_input_len, chat=bool(w.chat),
                           conversations=w.conversation_settings())


def _read_prompt_file(sweep: Sweep, sweep_path: str,
                      path: Path) -> tuple[DatasetFormat, list[ConversationRecord] | None, list[PromptRecord]]:
    """The prompt file's format, its conversations (None: one prompt per record) and its
    records (of conversations: each one's first user turn); a file that does not read is the
    sweep file's error at ``workload.dataset``."""
    try:
        fmt = file_format(path)
        conversations = read_conversations(path, fmt) if sweep.workload.conversations else None
        records = read_records(path, fmt) if conversations is None else [
            PromptRecord(c.turns[0].user, None, c.turns[0].reference) for c in conversations]
    except DatasetError as exc:
        raise SweepFileError(sweep_path, "workload.dataset", str(exc)) from None
    return fmt, conversations, records


def _check_reference_history(sweep_path: str, path: Path, conversations: list[ConversationRecord]) -> None:
    """``history: reference`` has a reply of the file's for every user turn but the last."""
    unanswered = next((i for i, c in enumerate(conversations, 1)
                       if any(t.reference is None for t in c.turns[:-1])), None)
    if unanswered is not None:
        raise SweepFileError(sweep_path, "workload.history", str(DatasetError(
            str(path), "history: reference sends the file's replies, but a user turn before the last has "
            "none (use history: model)", unanswered, "conversations")))


def _check_reference_lengths(sweep_path: str, path: Path, records: list[PromptRecord],
                             conversations: list[ConversationRecord] | None) -> None:
    """``output_len: reference`` has a reference length for every record (every user turn)."""
    missing = _without_reference(records) if conversations is None else _turn_without_reference(conversations)
    if missing is not None:
        raise SweepFileError(sweep_path, "workload.dataset", str(DatasetError(
            str(path), "has no reference length for output_len: reference (give \"output_len\" or "
            "\"completion\"; in a conversation, an assistant turn after every user turn)", missing, "output_len")))


def _check_synthetic_lengths(sweep: Sweep, sweep_path: str, path: Path, records: list[PromptRecord]) -> None:
    """Some prompt is within the workload's input-length filter, by a synthetic model's count
    (UTF-8 bytes per token)."""
    w = sweep.workload
    lengths = [fallback_tokens(r.prompt) for r in records]
    low, high = w.min_input_len or 0, w.max_input_len or MAX_TOKENS
    if not any(low <= n <= high for n in lengths):
        raise SweepFileError(sweep_path, "workload.min_input_len" if w.min_input_len else "workload.max_input_len",
                             f"no prompt of {path.name} is within [{low}, {high}] tokens for a synthetic model "
                             f"(its prompts are {min(lengths)}-{max(lengths)} tokens: UTF-8 bytes / "
                             f"{BYTES_PER_TOKEN_FALLBACK}, having no tokenizer)")


def _task_settings(sweep: Sweep, sweep_path: str) -> DatasetSettings:
    """A generated task's prompts (``sweeper.core.tasks``), made now to check and hash them."""
    w = sweep.workload
    assert w.task is not None
    spec = task_json(w.task.task, w.task.settings)
    records = task_records(spec)
    _check_answers(sweep, sweep_path, w.task.task, records)
    return DatasetSettings(name=w.task.task, path="", format="jsonl", sha256=records_sha256(records),
                           records=len(records), num_prompts=w.num_prompts, min_input_len=w.min_input_len,
                           max_input_len=w.max_input_len, chat=bool(w.chat), task=spec)


def _check_answers(sweep: Sweep, sweep_path: str, where: str, records: list[PromptRecord]) -> None:
    """A scored sweep's prompts each have a reference answer (the first without one is named)."""
    if sweep.scoring is None:
        return
    missing = next((i for i, r in enumerate(records, 1) if r.answer is None), None)
    if missing is not None:
        raise SweepFileError(sweep_path, "workload.dataset", str(DatasetError(
            where, f"has no reference answer, which scoring: {sweep.scoring.method} judges replies against (give "
            "each record an \"answer\")", missing, "answer")))
    unchosen = next((i for i, r in enumerate(records, 1) if not r.choices), None) if sweep.scoring.likelihood else None
    if unchosen is not None:
        raise SweepFileError(sweep_path, "workload.dataset", str(DatasetError(
            where, "has no choices, which scoring.likelihood scores by (give each record \"choices\")",
            unchosen, "choices")))


def _check_turn_answers(sweep: Sweep, sweep_path: str, where: str, conversations: list[ConversationRecord]) -> None:
    """A scored sweep's conversations each have a turn with an answer (the turns without one are
    sent, and not judged); the first conversation without any is named."""
    if sweep.scoring is None:
        return
    missing = next((i for i, c in enumerate(conversations, 1) if all(t.answer is None for t in c.turns)), None)
    if missing is not None:
        raise SweepFileError(sweep_path, "workload.dataset", str(DatasetError(
            where, f"has no turn with an answer, which scoring: {sweep.scoring.method} judges replies against "
            "(give a user turn an \"answer\")", missing, "conversations.answer")))


def _without_reference(records: list[PromptRecord]) -> int | None:
    """The first record (1-based) without a reference length, or None."""
    return next((i for i, r in enumerate(records, 1) if r.output_len is None and r.reference is None), None)


def _turn_without_reference(conversations: list[ConversationRecord]) -> int | None:
    """The first conversation (1-based) with a user turn the file does not answer, or None."""
    return next((i for i, c in enumerate(conversations, 1) if any(t.reference is None for t in c.turns)), None)


def speculation_warnings(trials: Iterable[Trial]) -> list[str]:
    """One warning per synthetic model run with speculative decoding: a drafter's proposals are
    accepted as often as the model would have produced them, and a random-weight model's
    choices have nothing to do with the text, so its acceptance (and what speculation saves)
    says nothing of a real model's. The trials still run: the cost of the drafts is real."""
    warnings: dict[str, None] = {}
    for t in trials:
        speculates = getattr(t.backend_options, "speculates", None)
        if t.model_source == "synthetic" and speculates is not None and speculates():
            warnings.setdefault(f"{t.model} {t.backend}: speculative decoding on a synthetic (random-weight) model: "
                                "its acceptance rate says nothing of real text; measure it on a real model "
                                "(e.g. the bundled smollm2-135m)")
    return list(warnings)


def repeated_conversation_warnings(trials: Iterable[Trial]) -> list[str]:
    """One warning where a conversation replay draws more conversations than its file holds: the
    sample cycles them, and a repeated conversation resends its twin's history (with greedy
    replies, word for word), which a prefix cache then serves across conversations, not only
    within one: the hit rate and what caching saves read higher than distinct sessions'."""
    warnings: dict[str, None] = {}
    for t in trials:
        p, s = t.prompts, t.serving
        if p is None or p.conversations is None or s is None:
            continue
        if s.num_prompts is not None and s.num_prompts > p.records:
            warnings.setdefault(f"workload.num_prompts: {s.num_prompts} conversations from {p.records} in "
                                f"{p.name}: the sample repeats them, and a prefix cache finds the repeats' "
                                "histories (make more, e.g. python3 -m bench conversations)")
    return list(warnings)


def compatibility(trial: Trial, device: Device, capabilities: Capabilities | None = None) -> str | None:
    """Why this trial cannot run on ``device``, or None.

    Decided from the registries and, given ``capabilities``, from what the nodes
    the trial could be placed on have installed: the backend's modules and the
    precision's library must be on one of them, at a version the precision
    accepts there. Without ``capabilities`` only the driver's library version is known.
    """
    precision = PRECISIONS[trial.precision]
    reason = _registry_reason(trial, device)
    if reason or capabilities is None:
        return reason or precision.unsupported_reason(device, precision.library_version())
    return _installed_reason(trial, device, capabilities)


def _registry_reason(trial: Trial, device: Device) -> str | None:
    """What the backend registry says against the trial: precision and device, shape, workload, serving."""
    backend, options = BACKENDS[trial.backend], trial.backend_options
    return (_too_long(trial) or backend.unsupported_reason(trial.precision, device, trial.tensor_parallel, options)
            or backend.unsupported_shape(options, trial.input_len or 0, trial.output_len)
            or backend.unsupported_workload(options, varied_prompts=trial.prompts is not None,
                                            varied_outputs=trial.output_lengths != "fixed",
                                            stops_at_eos=trial.stops_at_eos,
                                            synthetic_model=trial.model_source == "synthetic")
            or (backend.unsupported_serving(options) if trial.serving is not None else None)
            or (f"scoring: backend {backend.name} runs no model, so its replies hold no answer to judge"
                if trial.scoring is not None and not backend.runs_model else None))


def _installed_reason(trial: Trial, device: Device, capabilities: Capabilities) -> str | None:
    """What the nodes' installed libraries say: the backend's modules and the precision's library
    on a node the trial fits, at a version the precision accepts there."""
    backend, precision = BACKENDS[trial.backend], PRECISIONS[trial.precision]
    hint = backend.install_hint(trial.backend_options)
    needs = [(m, f"backend {backend.name}", hint) for m in backend.required_modules(trial.backend_options)]
    if precision.library:
        needs.append((precision.library, f"precision {precision.name}", None))
    for library, who, how in needs:
        where = capabilities.where_missing(library, device, trial.num_gpus)
        if where:
            return f"{who} needs {library}, {where}" + (f"; {how}" if how else "")
    versions = capabilities.versions(precision.library, device, trial.num_gpus) if precision.library else []
    candidates: list[str | None] = list(versions) or [None]
    reasons = [precision.unsupported_reason(device, v) for v in candidates]
    # Runnable if any node's version accepts it: the trial can be placed there.
    return None if any(r is None for r in reasons) else reasons[0]


def _too_long(trial: Trial) -> str | None:
    limit = trial.model_ref.max_positions
    if trial.input_len is None:  # a dataset's prompts: longer ones are left out on the actor
        return None
    length = trial.input_len + trial.output_len
    if limit is not None and length > limit:
        return (f"input_len + output_len = {length} exceeds the model's {limit} positions "
                f"(max_position_embeddings in its config)")
    return None


_NOT_IN_VERDICT = frozenset({"batch_size", "request_rate", "max_concurrency", "repeat"})


def _check_width(planned: list[PlannedTrial], device: Device, capabilities: Capabilities, sweep_path: str) -> None:
    """A runnable trial wider than every node can never start: the sweep asks for the
    impossible, so it is the sweep file's error, not a trial's skip."""
    widest = max((p.trial for p in planned if p.runnable), key=lambda t: t.num_gpus, default=None)
    if widest is not None and (reason := capabilities.too_wide(device, widest.num_gpus)):
        raise SweepFileError(sweep_path, "tensor_parallel", reason)


def _check_fidelity_reference(planned: list[PlannedTrial], device: Device, sweep_path: str) -> None:
    """A fidelity reference whose backend cannot run its precision leaves every trial that needs
    it without fidelity: the sweep asks for the impossible, which the file should say now, not
    each trial's row after the run."""
    for p in planned:
        t = p.trial
        if not p.runnable or t.fidelity is None:
            continue
        name = t.fidelity.reference_backend or t.backend
        options = t.backend_options if name == t.backend else None
        reason = BACKENDS[name].unsupported_reason(t.fidelity.reference, device, t.tensor_parallel, options)
        if reason:
            raise SweepFileError(
                sweep_path, "fidelity.reference",
                f"the {t.backend} trials' reference cannot run: {reason}. Name a backend that runs it, e.g. "
                f"reference: {{backend: transformers, precision: {t.fidelity.reference}}}, or exclude those trials")


def make_plan(sweep: Sweep, device: Device, *, sweep_path: str = "<sweep>", check_hub: bool = True,
              capabilities: Capabilities | None = None, expanded: tuple[list[Trial], int] | None = None) -> Plan:
    """The sweep's trials for ``device``, each runnable or skipped with the reason.
    ``expanded``: the sweep's ``expand`` result, where the caller has it already."""
    trials, excluded = expanded if expanded is not None else expand(sweep, sweep_path=sweep_path, check_hub=check_hub)
    # Whether a trial can run does not depend on its batch size, offered load or repeat
    # (memory is found out by running): one verdict per rest of the point.
    verdicts: dict[tuple, str | None] = {}
    planned = []
    for t in trials:
        key = tuple(item for item in t.point.items_ if item[0] not in _NOT_IN_VERDICT)
        if key not in verdicts:
            verdicts[key] = compatibility(t, device, capabilities)
        planned.append(PlannedTrial(t, verdicts[key]))
    if capabilities is not None:
        _check_width(planned, device, capabilities, sweep_path)
    _check_fidelity_reference(planned, device, sweep_path)
    plan = Plan(sweep=sweep, device=device, trials=planned, excluded=excluded,
                warnings=steady_window_warnings(p.trial for p in planned if p.runnable)
                + speculation_warnings(p.trial for p in planned)
                + repeated_conversation_warnings(p.trial for p in planned))
    if sweep.scoring is not None:
        # Every backend decodes greedily (temperature 0, no sampling): a scored reply is the
        # model's most likely one, and the same on every repeat.
        plan.notes.append(f"scoring: every measured reply judged by {sweep.scoring.describe()} against its "
                          "prompt's answer; replies decoded greedily (temperature 0)")
    if capabilities is not None:
        notes, warnings = version_lines((p.trial for p in planned if p.runnable), device, capabilities)
        plan.notes += notes
        plan.warnings += warnings
        plan.notes.append(f"installed libraries checked in: {capabilities.source}")
        plan.notes += capabilities.node_types.notes()
    return plan
