"""CPU package and DRAM energy from Linux powercap (RAPL).

Layout read: ``<root>/intel-rapl:N`` is socket N's package domain (name
``package-N``); its subdomains ``intel-rapl:N:M`` include ``dram`` on servers
that meter it. AMD processors appear through the same interface. The
``intel-rapl-mmio:*`` tree re-exposes the same package and is skipped, lest a
socket count twice. Counters are in µJ and wrap at ``max_energy_range_uj``.

Since 2020 kernels make ``energy_uj`` readable by root only; then the reader
is unavailable and says why, and energy columns stay null rather than zero.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

_DOMAIN_DIR = re.compile(r"^intel-rapl:\d+(:\d+)?$")
_UJ_PER_J = 1e6


@dataclass(frozen=True)
class RaplDomain:
    key: str  # directory name, e.g. "intel-rapl:0:2"
    name: str  # "package-0", "dram", ...
    kind: str  # "package" | "dram"
    path: Path
    max_energy_range_uj: int


@dataclass(frozen=True)
class RaplSnapshot:
    energy_uj: dict[str, int] = field(default_factory=dict)  # by domain key; unreadable domains absent


class RaplReader:
    def __init__(self, root: str | Path = "/sys/class/powercap") -> None:
        self.root = Path(root)
        self.domains: list[RaplDomain] = []
        self.reason: str | None = None
        self._discover()
        self.available = bool(self.domains)
        if not self.available:
            log.info("CPU/DRAM energy unavailable: %s", self.reason)

    def _discover(self) -> None:
        if not self.root.is_dir():
            self.reason = f"no {self.root} (no powercap on this host)"
            return
        candidates: dict[str, Path] = {}
        # Subdomains are listed at the top level by the kernel, and nested
        # inside their package; look in both, keyed by name so none counts twice.
        for top in sorted(self.root.iterdir()):
            if _DOMAIN_DIR.match(top.name):
                candidates.setdefault(top.name, top)
                if top.is_dir():
                    for sub in sorted(top.iterdir()):
                        if _DOMAIN_DIR.match(sub.name):
                            candidates.setdefault(sub.name, sub)
        if not candidates:
            self.reason = "no intel-rapl domains"
            return
        failures = []
        for key, path in sorted(candidates.items()):
            try:
                name = (path / "name").read_text().strip()
                kind = "package" if name.startswith("package") else "dram" if name == "dram" else None
                if kind is None:
                    continue  # core, uncore, psys: inside a package or overlapping it
                max_range = int((path / "max_energy_range_uj").read_text())
                int((path / "energy_uj").read_text())  # readable now, or say why not
            except PermissionError:
                failures.append(f"permission denied reading {path / 'energy_uj'}")
                continue
            except (OSError, ValueError) as exc:
                failures.append(f"cannot read {path}: {exc}")
                continue
            self.domains.append(RaplDomain(key, name, kind, path, max_range))
        if not self.domains:
            self.reason = "; ".join(failures) or "no package or dram domains among intel-rapl domains"

    def read(self) -> RaplSnapshot:
        values = {}
        for d in self.domains:
            try:
                values[d.key] = int((d.path / "energy_uj").read_text())
            except (OSError, ValueError) as exc:
                log.debug("RAPL %s unreadable: %s", d.key, exc)
        return RaplSnapshot(values)

    def delta(self, a: RaplSnapshot, b: RaplSnapshot) -> tuple[float | None, float | None]:
        """(cpu_package_energy_j, dram_energy_j) from a to b, summed over sockets.

        One wrap per domain is undone; a window longer than a full counter range
        (about 262 kJ, some 20 minutes at 200 W) cannot be told apart and is
        under-counted, so meter long runs in shorter windows.
        """
        totals: dict[str, float | None] = {"package": None, "dram": None}
        for d in self.domains:
            if d.key not in a.energy_uj or d.key not in b.energy_uj:
                continue
            step = b.energy_uj[d.key] - a.energy_uj[d.key]
            if step < 0:
                step += d.max_energy_range_uj
            totals[d.kind] = (totals[d.kind] or 0.0) + step / _UJ_PER_J
        return totals["package"], totals["dram"]
