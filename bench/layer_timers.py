"""Layer timers that only the layer bench uses: CUDA event pairs, to compare with kernel time.

Production times a module by the kernels it launched (``actors.layers.timers``).
An event pair around a module measures the GPU timeline between its entry and
exit instead, idle gaps included: where the GPU waits for the host to launch the
next kernel (launch-bound decode), that wait, and any host work inside the pair,
counts. ``bench/layers.py`` times the same passes both ways to show the
difference; the profiler takes this timer as an object, like any other.
"""

from __future__ import annotations

import torch
from torch import nn

from actors.layers import LayerProfileError
from actors.layers.timers import IntervalTimer, device_of


class CudaEventTimer(IntervalTimer[torch.cuda.Event]):
    """Marks are CUDA events recorded on the current stream; read after one synchronize.

    Events come from a pool filled outside the timed work: creating one costs
    host time (measured on an H200: creating events inside the hooks inflated
    submodule times by 13-21 %).
    """

    kind = "cuda_event_interval"

    def __init__(self) -> None:
        super().__init__()
        self._free: list[torch.cuda.Event] = []
        self._used: list[torch.cuda.Event] = []

    def reserve(self, n: int) -> None:
        missing = n - len(self._free)
        if missing > 0:
            self._free.extend(torch.cuda.Event(enable_timing=True) for _ in range(missing))

    def mark(self) -> torch.cuda.Event:
        event = self._free.pop() if self._free else torch.cuda.Event(enable_timing=True)
        event.record()
        self._used.append(event)
        return event

    def finish(self) -> None:
        torch.cuda.synchronize()

    def elapsed_s(self, start: torch.cuda.Event, end: torch.cuda.Event) -> float:
        return start.elapsed_time(end) / 1000.0  # elapsed_time is in ms

    def recycle(self) -> None:
        self._free.extend(self._used)
        self._used.clear()


def event_timer_for(model: nn.Module) -> CudaEventTimer:
    """A CUDA-event timer for ``model``; its events time nothing on a CPU model, so that is refused."""
    if device_of(model) != "cuda":
        raise LayerProfileError("event_interval timing needs a CUDA model")
    return CudaEventTimer()
