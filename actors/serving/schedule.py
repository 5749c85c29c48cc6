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
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from actors.serving.records import InFlight
from actors.serving.slots import SlotTimes

F = TypeVar("F", bound=InFlight)


async def play(flights: Sequence[F], send: Callable[[F], Awaitable[None]], *, max_concurrency: int | None,
               deadline_s: float, clock: Callable[[], float]) -> None:
    """Start ``send(flight)`` for each of ``flights`` (in arrival order) at its ``arrival_s``, at
    most ``max_concurrency`` sending at once (later ones wait in order; each records in
    ``due_s`` when its slot came free), until all are done or ``deadline_s`` has passed: then
    every send still going is cancelled. ``send`` stamps ``submit_s`` as it hands its request
    over, and records its own failures on its flight; an exception it raises ends the run."""
    slots = asyncio.Semaphore(max_concurrency) if max_concurrency is not None else None
    freed = SlotTimes(max_concurrency)
    tasks: list[asyncio.Task[None]] = []
    # Sends still going, and the moment the last one ends once all are started: an O(1) wait at
    # the end of the schedule (gathering every task there stalls the loop for tens of ms while
    # the last replies stream).
    running, dispatched = 0, False
    all_done = asyncio.Event()

    async def one(flight: F) -> None:
        nonlocal running
        try:
            if slots is None:
                await send(flight)
                return
            async with slots:
                flight.due_s = freed.due_s(flight.arrival_s)
                try:
                    await send(flight)
                finally:
                    freed.give_back(clock())
        finally:
            running -= 1
            if running == 0 and dispatched:
                all_done.set()

    def settle(task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            dispatcher.cancel()  # a send's own exception ends the run (raised below)

    async def dispatch() -> None:
        nonlocal running, dispatched
        for flight in flights:
            delay_s = flight.arrival_s - clock()
            if delay_s > 0:
                await asyncio.sleep(delay_s)
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
