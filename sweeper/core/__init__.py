"""Shared core types and registries: trials and their axes, precisions, backends,
presets, the results schema, outcomes, statuses and errors.

Imports nothing heavy and nothing else of sweeper's: both planes build on it (the
data plane in ``actors/`` imports this layer and no other).
"""
