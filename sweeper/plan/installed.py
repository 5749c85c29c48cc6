"""What one Python environment has installed, asked without importing it.

Kept apart from ``capabilities`` (which imports the registries) because it is what a node's
Ray worker runs when the cluster is probed: a worker started for the probe alone then loads
the standard library only, not pydantic and the registries.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import socket


def library_versions(names: tuple[str, ...]) -> dict[str, str | None]:
    """Installed version of each name in this interpreter ("unknown" if importable but
    unversioned), None where it is missing. Nothing is imported."""
    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "unknown" if importlib.util.find_spec(name) is not None else None
    return out


def host_libraries(names: tuple[str, ...]) -> tuple[str, dict[str, str | None]]:
    """This host's name and ``library_versions(names)``: a node's answer to the probe."""
    return socket.gethostname(), library_versions(names)
