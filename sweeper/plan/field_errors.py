"""Pydantic's validation errors as the sweep file's problems: one ``(field, message)`` each.

A field is named as the file writes it (``backend_options.server[1].client_processes``):
pydantic's own names for the members of a union (``constrained-int``, ``literal['auto']``,
``LaunchCommand``, ``list[...]``) and for validator functions are no key of the file, so they
are left out of it. A value that fits no member of a union gets one error per member from
pydantic; they are one problem here, naming every form the value may take ("a valid integer,
or 'auto'"), so a user is told of each choice and not only of the first member's complaint.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Sequence
from typing import Any

from pydantic import ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError

# Names pydantic gives a union's members and validator functions in an error's location.
# Anything with brackets (``literal[...]``, ``list[...]``, ``function-after[...]``, the sweep's
# own ``Tag``s such as ``dataset[named]``) is always one: no key of the file has them.
_TAGGED = re.compile(r"\[|^function-")
# A scalar type (``int``, ``constrained-int``) or a model class (CamelCase) may be one, or a key
# of the file (a search range's ``int``): it is a member's name only where another error of the
# same value names another member at the same place (a union refuses a value once per member).
_MEMBER_LIKE = re.compile(r"^(constrained-)?(int|float|str|bool|bytes|decimal|none|any)$|^[A-Z][A-Za-z0-9]*$")

# How pydantic opens a type error; a union's members' messages are joined after the first's.
_SHOULD_BE = "Input should be "


def _named_like_a_member(part: object) -> bool:
    return isinstance(part, str) and bool(_TAGGED.search(part) or _MEMBER_LIKE.search(part))


def _member_positions(locs: Sequence[tuple[Any, ...]]) -> list[set[int]]:
    """For each location, the places in it that name a union's member, not a key of the file."""
    named: dict[tuple[Any, ...], set[str]] = {}  # location so far -> the member-like names after it
    for loc in locs:
        for i, part in enumerate(loc):
            if _named_like_a_member(part):
                named.setdefault(loc[:i], set()).add(part)
    return [{i for i, part in enumerate(loc)
             if isinstance(part, str) and (_TAGGED.search(part)
                                           or (_MEMBER_LIKE.search(part) and len(named[loc[:i]]) > 1))}
            for loc in locs]


_UNKNOWN = object()  # the written value at a location, where it is not known


def field_path(loc: Sequence[Any], members: Collection[int] = (), document: Any = _UNKNOWN) -> str:
    """The location as the sweep file names it: ``a.b[2].c``, without the places ``members``
    (union members' names) or pydantic's bracketed names. With the ``document`` as written, an
    index into a value the file wrote as a scalar (an axis takes ``8`` for ``[8]``) is left out
    too: ``output_len: nat`` is wrong at ``output_len``, not at ``output_len[0]``."""
    out, written = "", document
    for i, part in enumerate(loc):
        if isinstance(part, int):
            if written is _UNKNOWN or isinstance(written, list):
                out += f"[{part}]"
                written = written[part] if isinstance(written, list) and part < len(written) else _UNKNOWN
        elif i not in members and not _TAGGED.search(str(part)):
            out += f".{part}" if out else str(part)
            written = written.get(part, _UNKNOWN) if isinstance(written, dict) else _UNKNOWN
    return out


def message(err: Any) -> str:
    """An error's message in the file's words ("unknown key", not pydantic's "Extra inputs ...")."""
    kind, msg = err["type"], str(err["msg"]).removeprefix("Value error, ")
    return {"extra_forbidden": "unknown key", "missing": "required field is missing",
            "too_short": "must not be empty (give at least one value)",
            "finite_number": "must be a finite number"}.get(kind, msg)


def _either(first: str, other: str) -> str:
    if other in first:
        return first
    if first.startswith(_SHOULD_BE) and other.startswith(_SHOULD_BE):
        return f"{first}, or {other.removeprefix(_SHOULD_BE)}"
    return f"{first}; or {other}"


def problems(errors: Iterable[Any], prefix: Sequence[Any] = (),
             document: Any = _UNKNOWN) -> list[tuple[str | None, str]]:
    """Every error as ``(field, message)`` (``prefix``: where the validated value sits in the
    file, ``document``: the file's data as written, when known); the errors of one union's members for one value as one problem, at the union's field
    (a member's complaint about a part of the value names that part: ``launch: Input should be
    'vllm', ...; or command: required field is missing``)."""
    errors = list(errors)
    locs = [(*prefix, *err["loc"]) for err in errors]
    out: list[tuple[str | None, str]] = []
    last_union: tuple[Any, ...] | None = None
    for err, loc, members in zip(errors, locs, _member_positions(locs), strict=True):
        field, msg = field_path(loc, members, document) or None, message(err)
        union = loc[:min(members)] if members else None  # where the union is that the error comes from
        # pydantic reports a union's members one after another: the same union again is the same
        # value refused by another member.
        if union is not None and union == last_union and out:
            at = field_path(union, document=document) or None
            out[-1] = (at, _either(_within(at, *out[-1]), _within(at, field, msg)))
        else:
            out.append((field, msg))
        last_union = union
    return out


def _within(at: str | None, field: str | None, msg: str) -> str:
    """``msg`` as said of the field ``at``: prefixed by the part of ``field`` below it, if any."""
    if not field or field == at:
        return msg
    below = field[len(at):].lstrip(".") if at and field.startswith(at) else field
    return f"{below}: {msg}" if below else msg


def as_validation_error(title: str, found: Sequence[tuple[Sequence[Any], str]]) -> ValidationError:
    """Problems found by a validator, each ``(location, message)``, as one ``ValidationError``:
    raised inside a pydantic validator, its errors join the model's own, each at its location
    (a ``ValueError`` would be one error, at the validator's)."""
    details: list[InitErrorDetails] = [
        {"type": PydanticCustomError("value_error", "{message}", {"message": text}), "loc": tuple(loc), "input": None}
        for loc, text in found]
    return ValidationError.from_exception_data(title, details)
