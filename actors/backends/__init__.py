"""Data-plane backends, found through the control plane's backend registry."""

from __future__ import annotations

import importlib
import importlib.util

from actors.backends.base import Backend, LoadInfo
from actors.records import Generation, RequestTiming
from sweeper.core.backends import BACKENDS


class BackendUnavailable(RuntimeError):
    """The worker lacks a module the backend needs (e.g. vllm not installed)."""


def create_backend(name: str) -> Backend:
    spec = BACKENDS[name]
    for module in spec.requires:
        if importlib.util.find_spec(module) is None:
            raise BackendUnavailable(
                f"backend {name} needs the Python module {module!r}, which is not installed on this worker"
            )
    module_name, _, cls_name = spec.impl.partition(":")
    cls = getattr(importlib.import_module(module_name), cls_name)
    return cls()


__all__ = ["Backend", "BackendUnavailable", "Generation", "LoadInfo", "RequestTiming", "create_backend"]
