"""Turning a model reference into a directory that ``from_pretrained`` loads.

Synthetic presets are materialized as a checkpoint directory holding the
preset's ``config.json`` and an empty weight file: transformers then loads them
through the very same ``from_pretrained`` call as a real checkpoint, and
initializes every (missing) weight randomly from the seeded RNG. vLLM reads the
same directory with ``load_format="dummy"``.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

from sweeper.presets import PRESETS


def cache_root() -> Path:
    return Path(os.environ.get("SWEEPER_CACHE", Path.home() / ".cache" / "sweeper"))


def materialize_synthetic(preset_name: str, root: Path | None = None) -> Path:
    """Directory of a config-only checkpoint for ``preset_name`` (created once, atomically)."""
    from transformers import AutoConfig

    preset = PRESETS[preset_name]
    cfg = preset.config_dict()
    digest = hashlib.sha256(json.dumps(cfg, sort_keys=True).encode()).hexdigest()[:10]
    target = (root or cache_root()) / "synthetic" / f"{preset_name}-{digest}"
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Build in a private directory and rename: two actors on one node may race.
    tmp = Path(tempfile.mkdtemp(prefix=f".{preset_name}-", dir=target.parent))
    config = AutoConfig.for_model(**cfg)
    config.save_pretrained(tmp)
    from safetensors.torch import save_file

    save_file({}, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    try:
        os.rename(tmp, target)
    except OSError:  # another process won the race; its copy is identical
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return target
