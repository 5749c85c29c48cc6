"""Playing a run's arrival schedule on an asyncio event loop: each request's task is started
by one dispatcher when the request is due, at most ``max_concurrency`` of them sending at once.

Why a dispatcher and not a task per request created up front: a task created at the start
that sleeps until its arrival still runs its first step in the loop's first iterations, so
with thousands of requests the loop spends its first tenths of a second stepping every
task once while the first arrivals come due. At 470 requests/s on a 2-core machine the
requests due in the first 0.16 s so left up to 164 ms late (and the loop, behind, stamped
their first chunks late: TTFT p99 45 ms against the server's 11 ms). The dispatcher sleeps
to each arrival and starts that request's task then: the loop holds only the requests in
flight, whatever the run's length.

The caller starts the schedule's clock only once everything a send needs is ready (its
connections, its encoded bodies): ``InFlight.arrival_s`` are absolute times on ``clock``.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from actors.serving.records import InFlight
from actors.serving.slots import SlotTimes

F = TypeVar("F", bound=InFlight)


async def play(flights: Sequence[F], send: Callable[[F], Awaitable[None]], *, max_concurrency: int | None,
               deadline_s: float, clock: Callable[[], float], follow: Callable[[F], F | None] | None = None) -> None:
    """Start ``send(flight)`` for each of ``flights`` (in arrival order) at its ``arrival_s``, at
    most ``max_concurrency`` sending at once (later ones wait in order; each records in
    ``due_s`` when its slot came free), until all are done or ``deadline_s`` has passed: then
    every send still going is cancelled. ``send`` stamps ``submit_s`` as it hands its request
    over, and records its own failures on its flight; an exception it raises ends the run.
    ``follow``: asked as each send ends, the flight that follows it (a conversation's next
    turn), played like the others from its own ``arrival_s``; None: nothing follows."""
    slots = asyncio.Semaphore(max_concurrency) if max_concurrency is not None else None
    freed = SlotTimes(max_concurrency)
    tasks: list[asyncio.Task[None]] = []
    # Sends still going, and the moment the last one ends once all are started: an O(1) wait at
    # the end of the schedule (gathering every task there stalls the loop for tens of ms while
    # the last replies stream).
    running, dispatched = 0, False
    all_done = asyncio.Event()

    # Flights not yet started, by arrival; follow-ups join as sends end and wake the dispatcher.
    queue = [(f.arrival_s, k, f) for k, f in enumerate(flights)]
    heapq.heapify(queue)
    count = itertools.count(len(queue))
    arrived = asyncio.Event()

    def enqueue_follow_up(flight: F) -> None:
        following = follow(flight) if follow is not None else None
        if following is not None:
            heapq.heappush(queue, (following.arrival_s, next(count), following))
            arrived.set()

    async def one(flight: F) -> None:
        nonlocal running
        try:
            await _send_in_slot(flight, send, slots, freed, clock)
        finally:
            enqueue_follow_up(flight)
            running -= 1
            if running == 0:
                arrived.set()  # nothing in flight: the dispatcher may be waiting for a follow-up
                if dispatched:
                    all_done.set()

    def settle(task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            dispatcher.cancel()  # a send's own exception ends the run (raised below)

    async def dispatch() -> None:
        nonlocal running, dispatched
        while queue or (follow is not None and running):
            # None: the queue is empty, and only a follow-up of a send still going can come.
            delay_s = queue[0][0] - clock() if queue else None
            if delay_s is None or delay_s > 0:
                # With follow-ups, one may come due sooner than the queue's head: woken by it.
                await (asyncio.sleep(delay_s or 0.0) if follow is None else _until(arrived, delay_s))
                continue
            flight = heapq.heappop(queue)[2]
            running += 1
            task = asyncio.create_task(one(flight))
            task.add_done_callback(settle)
            tasks.append(task)
        dispatched = True
        if running:
            await all_done.wait()

    dispatcher = asyncio.create_task(dispatch())
    try:
        await asyncio.wait([dispatcher], timeout=max(deadline_s - clock(), 0.0))
    finally:
        # Past the deadline (or on the way out, cancelled): stop dispatching, cancel every send.
        dispatcher.cancel()
        for task in tasks:
            task.cancel()
        await asyncio.gather(dispatcher, *tasks, return_exceptions=True)
    for task in tasks:
        error = None if task.cancelled() else task.exception()
        if error is not None:
            raise error  # a send's own exception: the run ends with it


async def _until(event: asyncio.Event, delay_s: float | None) -> None:
    """Wait until ``event`` is set anew or ``delay_s`` has passed (None: no time bound)."""
    event.clear()
    if delay_s is None:
        await event.wait()
        return
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), delay_s)


async def _send_in_slot(flight: F, send: Callable[[F], Awaitable[None]], slots: asyncio.Semaphore | None,
                        freed: SlotTimes, clock: Callable[[], float]) -> None:
    """``send(flight)`` once a concurrency slot is free (at once without a cap), recording when
    the slot came free (``due_s``) and handing it back as the send ends."""
    if slots is None:
        await send(flight)
        return
    async with slots:
        flight.due_s = freed.due_s(flight.arrival_s)
        try:
            await send(flight)
        finally:
            freed.give_back(clock())
