"""When a request held back by ``max_concurrency`` became due: the moment its slot came free.

A request that arrives while ``max_concurrency`` requests are in flight waits, in arrival
order, for one of them to finish. Its send lateness is then measured from the moment that
slot came free, not from its arrival: the wait is the cap's, asked for by the sweep, not
the client's. Slots are handed out first come, first served, so the k-th request to take a
slot takes the one the (k - cap)-th release gave back; that pairing is all this needs, in
a loop of any kind (the stepped engines' synchronous one, an asyncio one).
"""

from __future__ import annotations

import math
from collections import deque


class SlotTimes:
    """The release times of a concurrency cap's slots, in the order they are taken again."""

    def __init__(self, cap: int | None) -> None:
        # A slot free from the start came free at -inf: its taker is due at its arrival.
        self._free: deque[float] | None = deque([-math.inf] * cap) if cap is not None else None

    def take(self) -> float:
        """When the slot a request is about to take came free (-inf: free since the start or no cap)."""
        if self._free is None or not self._free:
            return -math.inf
        return self._free.popleft()

    def give_back(self, now_s: float) -> None:
        """A request left its slot at ``now_s`` (the client's clock as it saw the request end)."""
        if self._free is not None:
            self._free.append(now_s)

    def due_s(self, arrival_s: float) -> float | None:
        """Take a slot for a request that arrived at ``arrival_s``: when it became due to be sent,
        or None where that is its arrival (``ServedRequest.due_s``'s convention)."""
        freed_s = self.take()
        return freed_s if freed_s > arrival_s else None
