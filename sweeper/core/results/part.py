"""What a result part is: a frozen dataclass of columns, each with its meaning (``column``)."""

from __future__ import annotations

import types
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from functools import cache
from typing import Any, TypeVar


class RowError(ValueError):
    """A row its table's schema cannot hold: the column, and why."""


def column(doc: str, *, required: bool = False) -> Any:
    """A column of a part: null unless the producer sets it; ``doc`` is its meaning.
    ``required``: one every row has, which the producer must give (no default; its field is
    declared without None, in a ``kw_only`` dataclass so it may follow the optional ones)."""
    if required:
        return field(metadata={"doc": doc})
    return field(default=None, metadata={"doc": doc})


@dataclass(frozen=True)
class ColumnSpec:
    """A column as a part declares it: its name, its Python type (None stripped), its meaning."""

    name: str
    type: Any
    doc: str


@dataclass(frozen=True)
class Part:
    """A set of columns that one producer computes together (a trial's part; or a whole row of
    its own table, as ``RequestRecord`` is)."""

    @classmethod
    @cache
    def specs(cls) -> tuple[ColumnSpec, ...]:
        hints = typing.get_type_hints(cls)
        return tuple(ColumnSpec(f.name, _not_none(hints[f.name]), f.metadata["doc"]) for f in fields(cls))

    @classmethod
    @cache
    def names(cls) -> frozenset[str]:
        return frozenset(f.name for f in fields(cls))

    @classmethod
    def of(cls: type[P], values: Mapping[str, Any]) -> P:
        """The part from columns by name (from a producer that still builds them by name);
        a name the part does not have is a ``RowError`` naming it."""
        unknown = sorted(set(values) - cls.names())
        if unknown:
            raise RowError(f"{cls.__name__}: column(s) it does not have: {', '.join(unknown)}")
        return cls(**values)

    def items(self) -> Iterator[tuple[str, Any]]:
        for f in fields(self):
            yield f.name, getattr(self, f.name)


P = TypeVar("P", bound="Part")


def _not_none(hint: Any) -> Any:
    if typing.get_origin(hint) not in (typing.Union, types.UnionType):
        return hint  # a required column: its type as declared
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if len(args) != 1:
        raise TypeError(f"a column's type is one type or None, not {hint}")
    return args[0]
