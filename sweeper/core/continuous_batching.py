"""The KV cache sweeper gives transformers' continuous batching on a CPU.

transformers sizes that cache from the free memory: on a CPU, 60 % of the host's, allocated
and zeroed when the manager starts (13.7 GB seen for a 135M-parameter model on a 24 GB
machine). On a CPU node the host memory is every Ray worker's, and Ray's memory monitor kills
workers at 95 % of it, so two such engines on one node fail each other's trials. The in-process
engine and a launched ``transformers serve`` on a CPU both get this bounded cache instead
(the same one, so the two stay comparable); on a GPU transformers' own sizing stands, as
vLLM's ``gpu_memory_utilization`` does. A launched server's ``args`` override it
(``cb-num-blocks``, ``cb-max-batch-tokens``).
"""

from __future__ import annotations

# Pages of transformers' default page size (256 tokens): 16,384 tokens of KV cache.
CPU_KV_CACHE_PAGES = 64
# Tokens one engine step may run (transformers' default: 8,192). Its attention masks scale
# with this times the cache's size: 0.9 GB at 8,192 against 0.15 GB at 256 for a small Llama.
CPU_MAX_BATCH_TOKENS = 2048

# transformers serve's flags for the same bounds.
CPU_SERVER_FLAGS: dict[str, str] = {
    "--cb-num-blocks": str(CPU_KV_CACHE_PAGES),
    "--cb-max-batch-tokens": str(CPU_MAX_BATCH_TOKENS),
}
