"""sweeper: what it costs, in seconds, bytes and joules, to run an LLM a given way.

The control plane (this package) never imports torch, transformers or vllm at
import time, so it runs on a CPU-only Ray head node. The data plane lives in
``actors/``.
"""

__version__ = "0.1.0"
