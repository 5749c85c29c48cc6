"""sweeper's data plane: the GPU actor, backends, workloads and telemetry.

Heavy frameworks (torch, transformers, vllm, pynvml) are imported inside the
functions that need them, so importing this package stays cheap.
"""
