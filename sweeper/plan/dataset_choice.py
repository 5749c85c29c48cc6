"""The sweep file's ``workload.dataset``: a prompt file or set by name, a dataset sweeper
generates (shared prefixes), or a task it generates with answers. Which one a value is follows
from its shape, so that an error names only the kind the file meant."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Discriminator, Field, Tag, ValidationError, model_validator

from sweeper.core.tasks import TASKS
from sweeper.plan.field_errors import message
from sweeper.plan.strict import Strict as _Strict
from sweeper.plan.strict import Tokens


class PrefixRepetition(_Strict):
    """Shared-prefix prompts of exact lengths (vLLM bench's ``prefix_repetition``)."""

    prefix_len: Tokens
    suffix_len: Tokens
    num_prefixes: int = Field(gt=0, le=1_000_000, strict=True)


class GeneratedDataset(_Strict):
    """A dataset sweeper generates rather than reads: ``{prefix_repetition: {...}}``."""

    prefix_repetition: PrefixRepetition


PREFIX_REPETITION = "prefix_repetition"


class TaskDataset(_Strict):
    """A task sweeper generates as text, with answers (``sweeper.core.tasks``): its name alone
    (``arithmetic``: its default settings) or ``{arithmetic: {size: ..., difficulty: ...}}``."""

    task: str
    settings: Any  # the task's own settings model, validated

    @model_validator(mode="before")
    @classmethod
    def _from_the_file(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = {value: {}}
        if not isinstance(value, dict) or "task" in value:
            return value
        ((name, given),) = value.items()  # _dataset_kind chose this branch for one task's key
        try:
            settings = TASKS[name].settings.model_validate({} if given is None else given)
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(k) for k in err["loc"])
            raise ValueError(f"{name}{'.' + where if where else ''}: {message(err)}") from None
        return {"task": name, "settings": settings}


def _dataset_kind(value: Any) -> str:
    # The branch is chosen by the value's shape, so that an error names only the branch meant
    # (a bad prefix_len, not also "should be a valid string"); the tags' brackets keep them
    # out of the field path an error names (sweeper.plan.field_errors).
    if isinstance(value, TaskDataset) or (isinstance(value, str) and value in TASKS) or (
            isinstance(value, dict) and len(value) == 1 and next(iter(value)) in TASKS):
        return "dataset[task]"
    return "dataset[generated]" if isinstance(value, (dict, GeneratedDataset)) else "dataset[named]"


DatasetChoice = Annotated[
    Annotated[Annotated[str, Field(min_length=1)], Tag("dataset[named]")]
    | Annotated[GeneratedDataset, Tag("dataset[generated]")]
    | Annotated[TaskDataset, Tag("dataset[task]")],
    Discriminator(_dataset_kind),
]
