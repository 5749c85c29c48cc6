"""Prompts for a trial: random token ids of an exact length, reproducible by seed."""

from __future__ import annotations

import numpy as np


class RandomPrompts:
    """Random-token prompts, a fresh batch per iteration.

    Each call gets different tokens (so no prefix or KV reuse can flatter a
    backend) while the whole sequence of batches is fixed by the seed.
    """

    def __init__(self, vocab_size: int, input_len: int, batch_size: int, seed: int,
                 reserved_low: int = 8):
        # The lowest ids are usually special tokens (pad/bos/eos); avoid them.
        low = min(reserved_low, max(vocab_size - 1, 0))
        self.low, self.high = low, vocab_size
        self.input_len, self.batch_size, self.seed = input_len, batch_size, seed

    def batch(self, iteration: int) -> np.ndarray:
        # Warmup batches use negative iterations, so they never equal a measured one.
        rng = np.random.default_rng([self.seed, iteration + 2**20])
        return rng.integers(self.low, self.high, size=(self.batch_size, self.input_len), dtype=np.int64)
