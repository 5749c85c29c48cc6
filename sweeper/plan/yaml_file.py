"""Reading a sweep file's YAML strictly, before its schema sees it.

A key given twice is an error (the last would silently win), and a document nested more than
``MAX_YAML_DEPTH`` levels, or expanding past ``MAX_YAML_NODES`` values once its aliases are
expanded (a "billion laughs" file), is refused before it is built; every problem is one
``SweepFileError`` naming the file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from sweeper.core.errors import SweepFileError

MAX_YAML_DEPTH = 32
# Nodes a sweep file may hold once its aliases are expanded: the bundled sweeps hold under a
# hundred. An alias repeats its anchor's whole subtree, so a few lines of nested aliases (a
# "billion laughs" file) would expand past any memory; such a file is refused before it is built.
MAX_YAML_NODES = 100_000


class _StrictLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a mapping with a key given twice (the last would win silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, (str, int, float, bool)) and key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (given twice; the last would silently win)",
                    key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _StrictLoader.construct_mapping)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [child for pair in node.value for child in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _lone_surrogate(text: str) -> str | None:
    """The first lone surrogate of ``text`` as its escape (``\\ud800``), or None."""
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"\\u{ord(text[exc.start]):04x}"
    return None


def _check_unicode(data: Any, path: str) -> None:
    """Refuse a lone surrogate (``"\\ud800"``, which a double-quoted YAML string may write), in a
    value or a key: half of a UTF-16 pair, no character, which nothing downstream can encode (a
    trial id's hash, JSON, a request) and would fail on with a ``UnicodeEncodeError``, far from
    the file. Walks the loaded data (at most ``MAX_YAML_NODES`` values, aliases expanded); every
    such value is one problem, in the file's order."""
    found: list[tuple[str | None, str]] = []
    stack: list[tuple[str, Any]] = [("", data)]
    while stack:
        where, value = stack.pop()
        children: list[tuple[str, Any]] = []
        if isinstance(value, dict):
            for key, item in value.items():
                if isinstance(key, str) and (bad := _lone_surrogate(key)):
                    # Not descended into: its fields' names would hold the surrogate too.
                    found.append((where or None, f"a key holds a lone surrogate {bad} (half of a UTF-16 pair, "
                                                 "no character): not text"))
                else:
                    children.append((f"{where}.{key}" if where else str(key), item))
        elif isinstance(value, list):
            children = [(f"{where}[{i}]", item) for i, item in enumerate(value)]
        elif isinstance(value, str) and (bad := _lone_surrogate(value)):
            found.append((where or None, f"holds a lone surrogate {bad} (half of a UTF-16 pair, no character): "
                                         "not text"))
        stack.extend(reversed(children))
    if found:
        raise SweepFileError(path, *found[0], more=tuple(found[1:]))


def _check_shape(node: yaml.Node, path: str) -> None:
    """Refuse a document nested too deep, expanding past ``MAX_YAML_NODES`` nodes once its
    aliases are expanded, or holding itself through an alias.

    Walks the composed node graph, where an aliased subtree is one shared node: each node
    once (iteratively, memoized), so a hostile file costs its own size, not its expansion's.
    """
    measured: dict[int, tuple[int, int]] = {}  # id(node): (nodes expanded, depth)
    open_nodes: set[int] = set()  # on the current path: met again below itself is a cycle
    stack: list[tuple[yaml.Node, bool]] = [(node, False)]
    while stack:
        n, children_done = stack.pop()
        if id(n) in measured:
            continue
        kids = _children(n)
        if not children_done:
            if id(n) in open_nodes:
                raise SweepFileError(path, None, "malformed YAML: an alias refers to the node that holds it "
                                                 "(a document that contains itself)")
            open_nodes.add(id(n))
            stack.append((n, True))
            stack.extend((k, False) for k in kids if id(k) not in measured)
            continue
        size = 1 + sum(measured[id(k)][0] for k in kids)
        depth = 1 + max((measured[id(k)][1] for k in kids), default=0)
        if depth > MAX_YAML_DEPTH:
            raise SweepFileError(path, None, f"YAML nested more than {MAX_YAML_DEPTH} levels deep")
        if size > MAX_YAML_NODES:
            raise SweepFileError(path, None, f"YAML expands to more than {MAX_YAML_NODES:,} values once its "
                                             "aliases (*name) are expanded: not a sweep file")
        measured[id(n)] = (size, depth)
        open_nodes.discard(id(n))


def read_yaml(path: str | Path) -> Any:
    """A sweep file's data, read strictly: a key given twice, a document nested too deep or
    expanding too far, malformed YAML or a file that is not text is a ``SweepFileError``."""
    p = Path(path)
    if not p.is_file():
        raise SweepFileError(str(path), None, "no such file")
    try:
        text = p.read_text()
        node = yaml.compose(text, Loader=_StrictLoader)
        if node is not None:
            _check_shape(node, str(path))
        data = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except RecursionError:
        raise SweepFileError(str(path), None, f"YAML nested more than {MAX_YAML_DEPTH} levels deep") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SweepFileError(str(path), None, f"malformed YAML: {where}{problem}") from None
    except UnicodeDecodeError:
        raise SweepFileError(str(path), None, "not a text file") from None
    _check_unicode(data, str(path))
    return data
