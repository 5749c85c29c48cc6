"""Per-layer profiling: which modules to time, the timers, the profiler that
hooks them, and the energy attribution of a profiling pass.
"""
