"""Serving mode: requests arrive over time and the engine batches them.

Modules, each importing only those before it: ``records`` (what a request and
a run are), ``arrivals`` (when requests arrive), ``slots`` (when a request held
back by ``max_concurrency`` became due), ``client`` (submits them at those times
to a stepped engine and collects what it returns), ``schedule`` (the same on an
asyncio loop: one dispatcher starts each request as it comes due), ``stats`` (the
steady-state window, saturation, latency percentiles, goodput), ``lateness``
(how late the client sent each request, its bound, the stretches it was behind),
``attribution`` (each request's share of the energy), ``measure`` (one serving
trial, as ``actors.measure`` is one offline trial).
"""
