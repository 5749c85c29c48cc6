"""Serving mode: requests arrive over time and the engine batches them.

Modules, each importing only those before it: ``records`` (what a request and
a run are), ``arrivals`` (when requests arrive), ``client`` (submits them at
those times to a stepped engine and collects what it returns), ``stats`` (the
steady-state window, saturation, latency percentiles, goodput), ``attribution``
(each request's share of the energy), ``measure`` (one serving trial, as
``actors.measure`` is one offline trial).
"""
