"""The transformers backend: eager ``generate``, the compiled static-cache decode
loop, and bitsandbytes quantized loading.
"""
