"""Which modules of a transformers causal LM to time, at each granularity.

The decoder blocks are found, not named: the homogeneous ``ModuleList`` whose
length is the config's layer count (``model.model.layers`` for llama, qwen2 and
mistral; ``transformer.h`` for GPT-2). Every module on the path from the root
to that list is a container; their other children (embeddings, rotary
embedding, final norm, lm_head) are *top-level units*. Then

- ``block``: the top-level units and each decoder block;
- ``submodule``: the top-level units and each block's children, by role
  (attention, mlp, norm);
- ``leaf``: every leaf module, labelled with the role of the unit it sits in.

The units of a granularity are disjoint subtrees (checked: no unit is an
ancestor of another), so no GPU time is counted twice. Code that runs in a
container but outside its units (a block's residual adds at ``submodule``,
the model's mask and position set-up, the attention kernel between leaves)
is timed too, as the container's ``<role>_rest`` row (``rest_units``), so a
phase's rows add up to its whole forward.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from torch import nn

from actors.layers import LayerProfileError
from sweeper.core.trial import LAYER_GRANULARITIES


@dataclass(frozen=True)
class Unit:
    """One profiled module."""

    name: str  # qualified name in the model, "" for the root
    module_type: str  # role: decoder_block, attention, mlp, norm, embedding, ...
    layer_index: int | None  # decoder block index, None outside the blocks
    module: nn.Module = field(repr=False, compare=False)


def _is_norm(attr: str, module: nn.Module) -> bool:
    a, cls = attr.lower(), type(module).__name__.lower()
    return "norm" in a or a.startswith("ln") or cls.endswith("norm")


def block_child_role(attr: str, module: nn.Module) -> str:
    """A block child's role from its attribute and class name (norm first: "post_attention_layernorm")."""
    a = attr.lower()
    if _is_norm(attr, module):
        return "norm"
    if "attn" in a or "attention" in a:
        return "attention"
    if any(k in a for k in ("mlp", "feed_forward", "ffn", "moe", "experts")):
        return "mlp"
    return "other"


def _top_role(attr: str, module: nn.Module, lm_head: nn.Module | None) -> str:
    a, cls = attr.lower(), type(module).__name__.lower()
    if lm_head is not None and module is lm_head:
        return "lm_head"
    if "rotary" in a or "rotary" in cls:
        return "rotary_embedding"
    if isinstance(module, nn.Embedding) or "embed" in a or a in ("wte", "wpe"):
        return "embedding"
    if _is_norm(attr, module):
        return "final_norm"
    return "other"


def _join(prefix: str, attr: str) -> str:
    return f"{prefix}.{attr}" if prefix and attr else prefix or attr


def _n_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def find_decoder_layers(model: nn.Module) -> tuple[str, nn.ModuleList]:
    """The qualified name and ``ModuleList`` of the model's decoder blocks.

    Candidates are non-empty ``ModuleList``s of one class; one as long as the
    config's layer count wins, the largest by parameters among equals (so an
    MoE block's list of experts never beats the list of blocks holding it).
    """
    config = getattr(model, "config", None)
    n_layers = getattr(config, "num_hidden_layers", None) if config is not None else None
    candidates = [
        (name, mod) for name, mod in model.named_modules()
        if isinstance(mod, nn.ModuleList) and len(mod) > 0 and len({type(c) for c in mod}) == 1
    ]
    if not candidates:
        raise LayerProfileError(f"{type(model).__name__}: no list of decoder blocks (no ModuleList) found")
    matching = [c for c in candidates if n_layers is not None and len(c[1]) == n_layers]
    name, layers = max(matching or candidates, key=lambda c: _n_params(c[1]))
    return name, layers


def _top_level_units(model: nn.Module, layers_name: str) -> list[Unit]:
    """The children of every container on the path root -> block list, except that path."""
    # transformers' models have it; a plain module may not, or may not implement it.
    get_output_embeddings: Callable[[], nn.Module | None] | None = getattr(model, "get_output_embeddings", None)
    try:
        lm_head = get_output_embeddings() if get_output_embeddings is not None else None
    except (AttributeError, NotImplementedError):
        lm_head = None
    units: list[Unit] = []
    parts = layers_name.split(".")
    container, prefix = model, ""
    for step in parts:
        for attr, child in container.named_children():
            if attr != step:
                units.append(Unit(_join(prefix, attr), _top_role(attr, child, lm_head), None, child))
        container, prefix = getattr(container, step), _join(prefix, step)
    return units


def _leaves(unit: Unit) -> list[Unit]:
    """Leaf modules under ``unit`` (itself if it is a leaf), labelled with its role and layer."""
    out: list[Unit] = []
    for name, mod in unit.module.named_modules():
        if next(mod.children(), None) is None:
            out.append(Unit(_join(unit.name, name), unit.module_type, unit.layer_index, mod))
    return out


def select_units(model: nn.Module, granularity: str) -> list[Unit]:
    """The modules to time at ``granularity``, in model order, disjoint (checked)."""
    if granularity not in LAYER_GRANULARITIES:
        raise LayerProfileError(f"unknown granularity {granularity!r}; known: {', '.join(LAYER_GRANULARITIES)}")
    layers_name, layers = find_decoder_layers(model)
    top = _top_level_units(model, layers_name)
    blocks = [Unit(_join(layers_name, str(i)), "decoder_block", i, b) for i, b in enumerate(layers)]
    if granularity == "block":
        inner = blocks
    else:
        inner = []
        for b in blocks:
            children = [Unit(_join(b.name, attr), block_child_role(attr, child), b.layer_index, child)
                        for attr, child in b.module.named_children()]
            inner += children or [b]  # a block without children is its own unit
    # Embeddings before the blocks, lm_head and final norm after them: model order.
    before = [u for u in top if u.module_type in ("embedding", "rotary_embedding")]
    after = [u for u in top if u not in before]
    units = before + inner + after
    if granularity == "leaf":
        # A leaf reused by several units (a shared activation, say) is hooked once.
        leaves: dict[int, Unit] = {}
        for u in units:
            for leaf in _leaves(u):
                leaves.setdefault(id(leaf.module), leaf)
        units = list(leaves.values())
    assert_disjoint(units)
    return units


def assert_disjoint(units: list[Unit]) -> None:
    """Raise if a unit is another's ancestor, or listed twice: its time would count twice.

    Two units may share a descendant (a module reused by two blocks): each call
    of it happens inside one unit's interval, so nothing is counted twice.
    """
    ids = [id(u.module) for u in units]
    if len(set(ids)) != len(ids):
        raise LayerProfileError("a module is selected twice: its time would count twice")
    selected = {id(u.module): u.name for u in units}
    for u in units:
        for mod in u.module.modules():
            if mod is not u.module and id(mod) in selected:
                raise LayerProfileError(
                    f"modules {u.name!r} and {selected[id(mod)]!r} overlap: time would count twice")


def _labels(model: nn.Module) -> dict[int, tuple[str, int | None]]:
    """Role and block index of every module below a block or top-level unit (inherited from it)."""
    labels: dict[int, tuple[str, int | None]] = {}
    try:
        _, layers = find_decoder_layers(model)
        units = select_units(model, "submodule")
    except LayerProfileError:
        return labels
    for u in units:
        for mod in u.module.modules():
            labels.setdefault(id(mod), (u.module_type, u.layer_index))
    for i, block in enumerate(layers):
        labels[id(block)] = ("decoder_block", i)
    return labels


def rest_units(model: nn.Module, units: list[Unit]) -> list[Unit]:
    """The root and every called module that holds a unit: the profiler times them too.

    What a container runs outside its profiled children (a block's residual
    adds at ``submodule``, the model's mask and position set-up, the attention
    kernel itself at ``leaf``) would otherwise belong to no row; each gets a
    ``<role>_rest`` row, so the rows of a phase add up to its whole forward.
    The root's range is the forward itself: the reference for coverage.
    """
    names = {id(m): n for n, m in model.named_modules()}
    unit_ids = {id(u.module) for u in units}
    by_name = dict(model.named_modules())
    wanted: dict[str, nn.Module] = {"": model}
    for u in units:
        name = names.get(id(u.module), u.name)
        parts = name.split(".") if name else []
        for k in range(1, len(parts)):
            prefix = ".".join(parts[:k])
            mod = by_name.get(prefix)
            # ModuleList/ModuleDict are never called: no forward of their own to time.
            if mod is not None and not isinstance(mod, (nn.ModuleList, nn.ModuleDict)):
                wanted[prefix] = mod
    labels = _labels(model)
    out: list[Unit] = []
    for name, mod in sorted(wanted.items(), key=lambda kv: (kv[0].count("."), kv[0]) if kv[0] else (-1, "")):
        if id(mod) in unit_ids:
            continue
        role, layer_index = labels.get(id(mod), ("model", None))
        out.append(Unit(name, f"{role}_rest", layer_index, mod))
    return out
