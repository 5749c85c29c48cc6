"""The ``vllm`` backend: vLLM's offline engine, or its async engine for serving runs.

``backend`` is the ``Backend`` (one ``vllm.LLM`` per trial group), ``serving`` runs a
serving trial's requests through ``AsyncLLM`` on the actor's event loop, ``start`` reads
an engine start's phases from vLLM's own log lines (for in-process engines and launched
``vllm serve`` alike), and ``worker`` holds the methods called by name inside vLLM's workers.

This package imports nothing (of vLLM or of its own modules): vLLM's workers import
``worker`` by its dotted path, and ``import vllm`` in its modules is an absolute import
of the vLLM library, never of this package.
"""
