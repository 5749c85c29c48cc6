"""Whose processes used a trial's GPUs while it was measured: ``energy_exclusive``.

NVML's counters meter a whole GPU, so a window's energy is the trial's alone only if
nothing else ran there. The processes NVML lists on the metered GPUs are read just
before and just after the window; each is the trial's own when it descends from the
trial's owner process (the actor: a tensor-parallel engine's workers, an engine core,
a launched server and its children are all started by it, whichever process group
they chose). Parents are read from ``/proc`` when the process is seen, since a worker
may be gone by the time the row is written.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sweeper.core.results import Occupancy

# How far up a parent chain to walk before giving up: deeper trees are not ours to judge.
_MAX_DEPTH = 64


def parent_pid(pid: int) -> int | None:
    """The parent of ``pid`` from ``/proc/<pid>/stat``; None where it cannot be read
    (gone, or in another PID namespace)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: the fields after it start
    # after its last ')'; the parent is the second of them.
    fields = stat[stat.rfind(")") + 2:].split()
    return int(fields[1]) if len(fields) > 1 else None


def descends_from(pid: int, owner_pid: int) -> bool | None:
    """Whether ``pid`` is ``owner_pid`` or one of its descendants; None where the chain
    breaks before an answer (a parent that cannot be read)."""
    current: int | None = pid
    for _ in range(_MAX_DEPTH):
        if current == owner_pid:
            return True
        if current is None:
            return None
        if current <= 1:
            return False
        current = parent_pid(current)
    return None


@dataclass
class GpuOccupancy:
    """The processes seen on a trial's GPUs, and whether each was the trial's own.

    ``owner_pid`` None: whose processes they are cannot be told here (an external
    server's GPUs), so exclusivity stays unknown whatever is seen."""

    owner_pid: int | None
    seen: dict[int, tuple[str, bool | None]] = field(default_factory=dict)
    metered: bool = False  # some look-up answered: the GPUs' processes are known

    def observe(self, processes: list[tuple[int, str]] | None) -> None:
        """Record one look-up (None: not possible, e.g. no GPU or NVML refused)."""
        if processes is None:
            return
        self.metered = True
        for pid, name in processes:
            if pid not in self.seen:
                ours = None if self.owner_pid is None else descends_from(pid, self.owner_pid)
                self.seen[pid] = (name, ours)

    def part(self) -> Occupancy:
        """``gpu_processes`` (pid name, ...) and ``energy_exclusive`` (sweeper.core.results)."""
        if not self.metered:
            return Occupancy()
        text = ", ".join(f"{pid} {name}" for pid, (name, _) in sorted(self.seen.items()))
        verdicts = [ours for _, ours in self.seen.values()]
        if self.owner_pid is None:
            exclusive = None
        elif False in verdicts:
            exclusive = False
        elif None in verdicts:
            exclusive = None
        else:
            exclusive = True
        return Occupancy(gpu_processes=text, energy_exclusive=exclusive)
