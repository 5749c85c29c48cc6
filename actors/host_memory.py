"""The process's resident-memory peak, reset per trial (CPU runs' ``peak_memory_bytes``).

``getrusage``'s ``ru_maxrss`` is the peak over the process's life, so an actor
that has loaded an earlier group (or the warm-up's larger buffers) would
report that group's peak. Linux resets the peak (``VmHWM``) when "5" is
written to ``/proc/self/clear_refs`` (since 4.0); where it cannot, there is no
per-trial peak to report.
"""

from __future__ import annotations

CLEAR_REFS = "/proc/self/clear_refs"
STATUS = "/proc/self/status"


def reset_host_peak() -> bool:
    """Reset this process's resident peak to its current size; False where the kernel cannot."""
    try:
        with open(CLEAR_REFS, "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def host_peak_bytes() -> int | None:
    """This process's resident peak since the last reset (``VmHWM``), or None where unknown."""
    try:
        with open(STATUS) as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024  # reported in kB
    except (OSError, ValueError, IndexError):
        return None
    return None
