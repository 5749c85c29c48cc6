"""The interface every backend implements, and the records it returns."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class RequestTiming:
    """One sequence of a generate call, on the actor's monotonic clock."""

    t_start_s: float
    t_first_token_s: float
    t_end_s: float
    output_tokens: int


@dataclass(frozen=True)
class Generation:
    """One generate call: its span, its requests and its phase marks."""

    t_start_s: float
    t_end_s: float
    requests: tuple[RequestTiming, ...]
    # (phase, t0, t1) intervals: "prefill" and "decode" for energy attribution
    marks: tuple[tuple[str, float, float], ...] = ()

    @property
    def output_tokens(self) -> int:
        return sum(r.output_tokens for r in self.requests)


@dataclass(frozen=True)
class LoadInfo:
    device: str  # "cuda" | "cpu"
    device_name: str
    weight_memory_bytes: int | None
    vocab_size: int
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ModelSpec:
    """What a backend needs to load: resolved by the control plane, opaque here."""

    source: str  # synthetic | path | hub
    location: str  # preset name | directory | hub id
    precision: str
    options_json: str
    seed: int = 0


class Backend(ABC):
    """A loaded model that generates exactly ``output_len`` tokens per sequence."""

    @abstractmethod
    def load(self, spec: ModelSpec) -> LoadInfo: ...

    @abstractmethod
    def generate(self, prompt_ids: np.ndarray, output_len: int) -> Generation:
        """Generate for a (batch, input_len) array of token ids; device-synchronized at both ends."""

    @abstractmethod
    def sync(self) -> None:
        """Wait until all device work issued so far has finished."""

    def reset_peak_memory(self) -> None:  # noqa: B027 - optional hook
        pass

    def peak_memory_bytes(self) -> int | None:
        return None

    def recover(self) -> None:  # noqa: B027 - optional hook
        """Free what a failed call left behind (e.g. after out-of-memory)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        pass

    @staticmethod
    def is_out_of_memory(exc: BaseException) -> bool:
        return False
