"""Output quality beside the joules: fidelity against a reference precision,
perplexity on a bundled public-domain text.
"""
