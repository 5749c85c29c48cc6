"""The ``server`` backend: a serving run sent to an OpenAI-compatible server over HTTP.

Loading launches the server on the actor's GPUs (its ``CUDA_VISIBLE_DEVICES`` are the
actor's, so the telemetry over them meters exactly the server's work) and waits until it
answers, or connects to one already running. Serving sends the run's requests through
``fanout.run_http``; the serving method around it (warm-up, settled idle baseline with
the server loaded, steady window, per-request energy) is the same as for in-process engines.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import logging
import os
import secrets
import shlex
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from actors.backends.base import Backend, LoadInfo, ModelSpec
from actors.backends.server.client import Endpoint
from actors.backends.server.fanout import processes_for, run_http
from actors.backends.server.process import ServerError, ServerProcess, get_json, get_text
from actors.backends.speculation import SpeculationCounts
from actors.backends.vllm import start as vllm_start
from actors.records import Generation
from actors.serving.client import Follow
from actors.serving.records import ServedRun, ServingRequest
from sweeper.core.results import ServerSetup
from sweeper.core.secrets import header_unsafe
from sweeper.core.servers import (
    RequestDialect,
    ServerEngine,
    ServerOptions,
    Verbatim,
    dtype_of,
    engine_args,
)

log = logging.getLogger(__name__)

# Without a load time limit, a launched server gets this long to answer.
DEFAULT_READY_TIMEOUT_S = 1800.0
# Share of measure.load_timeout_s the readiness wait may use: the actor, not the driver's
# watchdog, then reports why the server never answered (its log's last lines).
READY_SHARE_OF_LOAD_TIMEOUT = 0.95
# How long a read of the server's /metrics page (speculation counters) may take.
METRICS_TIMEOUT_S = 5.0


def server_log_dir(spec: ModelSpec) -> Path:
    """Where the load's server writes its log: the results directory's ``servers/`` (the driver
    says where, with the load), else the node's sweeper cache."""
    from actors.models import cache_root

    return Path(spec.log_dir) if spec.log_dir else cache_root() / "servers"


def _prepare_engine(engine: ServerEngine, spec: ModelSpec, env: dict[str, str]) -> Path | None:
    """What a registered engine needs before its launch (its registry entry says which): its
    caches under sweeper's node cache, the Hub cache directory it lists, the logging
    configuration its start's phases are read through. Returns that timing file, if any."""
    from actors.models import cache_root

    for variable, directory in engine.cache_dirs.items():
        env.setdefault(variable, str(cache_root() / directory))
    if engine.model_list_is_hub_cache:
        from huggingface_hub.constants import HF_HUB_CACHE

        Path(HF_HUB_CACHE).mkdir(parents=True, exist_ok=True)
    return vllm_start.install(server_log_dir(spec), spec.name, env) if engine.logs_start_phases else None


def _visible_gpus() -> list[Any]:
    """The GPUs this process was given (none where NVML is missing)."""
    try:
        from actors.telemetry.nvml import resolve_gpus

        return list(resolve_gpus())
    except Exception:  # noqa: BLE001 - no NVML, no driver: no GPUs
        return []


class ServerBackend(Backend):
    def __init__(self) -> None:
        self.process: ServerProcess | None = None
        self.base_url = ""
        self.served_model = ""
        self.dialect: RequestDialect | None = None
        self.tokenizer: Any = None
        self.eos_token_id: int | None = None
        self.chat = False
        self.stop_timeout_s = 30.0
        self.options: ServerOptions | None = None
        self.metered_uuids: list[str] = []
        # Sent with every request: the key a launched server was started with, or the external
        # server's (from the environment). Never written anywhere.
        self.headers: dict[str, str] = {}
        # The secrets it holds (a launched server's secret flags' values and fresh key, an external
        # server's key): the actor redacts them from every error it reports (secret_values).
        self.held_secrets: list[str] = []

    # -- load ------------------------------------------------------------------------------
    def load(self, spec: ModelSpec) -> LoadInfo:
        try:
            return self._load(spec)
        except BaseException:
            # A launched server must not outlive a failed load: the actor may be killed next,
            # and only this process knows to stop it now.
            self.close()
            raise

    def _load(self, spec: ModelSpec) -> LoadInfo:
        options = spec.options_as(ServerOptions)
        self.options, self.dialect = options, options.request_dialect
        self.chat, self.stop_timeout_s = spec.chat, options.stop_timeout_s
        gpus = _visible_gpus() if options.holds_gpus else _site_gpus(options)
        device = "cuda" if gpus else "cpu"
        self.metered_uuids = [g.uuid for g in gpus]
        model_path = self._launch(spec, options, device) if options.launch is not None else self._connect(spec, options)
        self._check_served(options)
        config = _config(model_path)
        vocab = self._prepare_prompts(model_path, config)
        name = gpus[0].name if gpus else ("cpu" if options.launch is not None else "remote server")
        return LoadInfo(device=device, device_name=name, weight_memory_bytes=None, vocab_size=vocab,
                        architecture=config or None, server=self._server_setup(options),
                        unmetered_reason=_unmetered_reason(options),
                        metered_gpus=",".join(self.metered_uuids) if options.energy is not None else None)

    def _connect(self, spec: ModelSpec, options: ServerOptions) -> str:
        """An external server: where it is and what it serves; the model's own directory
        (for its config and tokenizer) is the sweep's model."""
        assert options.base_url is not None and options.model is not None  # the options' own check
        self.base_url, self.served_model = options.base_url.rstrip("/"), options.model
        if options.api_key_env is not None:
            # From the driver's environment, with the load call; this node's own when run without one.
            key = spec.secrets.get(options.api_key_env) or os.environ.get(options.api_key_env)
            if not key:
                raise ServerError(f"backend_options.server.api_key_env: {options.api_key_env} is set neither in "
                                  "the driver's environment nor where the requests are sent (this actor's node)")
            self.held_secrets = [key]  # redacted from every error, as a launched server's are
            if (why := header_unsafe(key)) is not None:
                raise ServerError(f"backend_options.server.api_key_env: the key in {options.api_key_env}: {why}")
            self.headers = {"Authorization": f"Bearer {key}"}
        return _model_dir(spec)

    def _check_served(self, options: ServerOptions) -> None:
        if options.engine is not None and options.engine.model_list_is_hub_cache:
            return  # its list names the Hub cache's models, not the one it was started with
        served = _served_models(self.base_url, self.headers)
        if not self.served_model and len(served) == 1:  # a command's server: whatever it serves
            self.served_model = served[0]
        if self.served_model not in served:
            raise ServerError(f"{self.base_url} serves {', '.join(served) or 'no model'}, not {self.served_model!r}")

    def _prepare_prompts(self, model_path: str, config: dict[str, Any]) -> int:
        """What turning prompts into requests needs (the EOS id; a tokenizer where prompts go as
        text); returns the vocabulary size random prompts draw from."""
        self.eos_token_id = _first_int(config.get("eos_token_id"))
        if self.chat or not self._dialect.token_prompts:
            from transformers import AutoTokenizer

            self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        return int(config.get("vocab_size") or (len(self.tokenizer) if self.tokenizer is not None else 0))

    def _server_setup(self, options: ServerOptions) -> ServerSetup:
        engine, process = options.engine, self.process
        return ServerSetup(
            server_engine=options.label(), server_url=self.base_url,
            server_version=_server_version(self.base_url, engine.version_module if engine else None, self.headers),
            server_command=shlex.join(process.argv) if process else None,
            server_log=str(process.log_path) if process else None,
            server_ready_s=process.ready_s if process else None,
        )

    def _launch(self, spec: ModelSpec, options: ServerOptions, device: str) -> str:
        engine = options.engine
        if engine is not None and importlib.util.find_spec(engine.module) is None:
            from actors.backends import BackendUnavailable

            raise BackendUnavailable(f"launch: {engine.name} needs the Python module {engine.module!r}, "
                                     "which is not installed on this worker")
        model_path = _model_dir(spec)
        # The model is served under the sweep's name for it (a path would leak the cache's layout);
        # an engine that names it by its path serves the path; a command, whatever it serves.
        served = spec.location if engine is not None and engine.served_name_flag else model_path
        if engine is not None:
            argv = engine.command(model=model_path, served_model=served, precision=spec.precision,
                                  tensor_parallel=spec.tensor_parallel, seed=spec.seed,
                                  synthetic=spec.source == "synthetic", args=options.args, device=device)
            argv += engine_args(options.secret_args)
            secret_values = list(options.secret_args.values())
        else:
            assert options.launch is not None and not isinstance(options.launch, str)
            argv = options.launch.argv()
            secret_values = list(options.launch.secret_values.values())
        self.held_secrets = secret_values  # the key below joins it
        fields = {"model": model_path, "served_model": served, "dtype": dtype_of(spec.precision),
                  "tensor_parallel": str(spec.tensor_parallel), "seed": str(spec.seed), "device": device}
        env = dict(os.environ)
        timing = _prepare_engine(engine, spec, env) if engine is not None else None
        # A fresh key that only this actor knows: no other process of the node can send the
        # server requests while its energy is measured (it listens on loopback only, too).
        passing = options.api_key_passing
        if passing is not None:
            key = secrets.token_urlsafe(32)
            secret_values.append(key)
            if passing.env is not None:
                env[passing.env] = key
            else:
                argv += [str(passing.flag), Verbatim(key)]
            self.headers = {"Authorization": f"Bearer {key}"}
        started_s = time.time()
        self.process = ServerProcess.launch(argv, log_path=server_log_dir(spec) / f"{spec.name}.log",
                                            stop_timeout_s=options.stop_timeout_s, fields=fields, env=env,
                                            secrets=secret_values, headers=self.headers)
        limit_s = (READY_SHARE_OF_LOAD_TIMEOUT * spec.load_timeout_s if spec.load_timeout_s is not None
                   else DEFAULT_READY_TIMEOUT_S)
        self.process.wait_ready(limit_s)
        vllm_start.carve_phases(vllm_start.read_phases(timing, 0, started_s, time.time()))
        self.base_url = self.process.base_url
        self.served_model = served if engine is not None else ""
        return model_path

    # -- serve -----------------------------------------------------------------------------
    def serve(self, requests: Sequence[ServingRequest], *, max_concurrency: int | None,
              deadline_s: float, follow: Follow | None = None) -> ServedRun:
        if self.options is None:
            raise RuntimeError("serve() before load()")
        processes = self.options.client_processes
        if processes == "auto":
            processes = processes_for(requests, max_concurrency)
        return run_http(self.endpoint(), requests, max_concurrency=max_concurrency, deadline_s=deadline_s,
                        processes=processes, follow=follow)

    def endpoint(self) -> Endpoint:
        """Where the requests go and how each is built; its connections are opened ahead of a
        run through the server's model list, which every OpenAI-compatible server answers."""
        return Endpoint(url=f"{self.base_url}/{'chat/completions' if self.chat else 'completions'}",
                        body=self._body, continuous_usage=self._dialect.continuous_usage, headers=self.headers,
                        warm_url=f"{self.base_url}/models")

    def speculation_counts(self) -> SpeculationCounts | None:
        """From the server's ``/metrics`` (vLLM's counters; None where it has none, or no such page)."""
        if not self.base_url:
            return None
        try:
            text = get_text(self.base_url.removesuffix("/v1") + "/metrics", timeout_s=METRICS_TIMEOUT_S,
                            headers=self.headers)
            return SpeculationCounts.from_prometheus_text(text)
        except (OSError, ValueError) as exc:
            log.debug("no speculation counters from %s/metrics: %s", self.base_url, exc)
            return None

    def secret_values(self) -> tuple[str, ...]:
        return tuple(self.held_secrets)

    def process_owner(self) -> int | None:
        # A launched server is this actor's child (in a session of its own); an external
        # server's processes cannot be told from others on its GPUs.
        return os.getpid() if self.process is not None else None

    @property
    def _dialect(self) -> RequestDialect:
        if self.dialect is None:
            raise RuntimeError("serve() before load()")
        return self.dialect

    def _body(self, request: ServingRequest) -> dict[str, Any]:
        dialect = self._dialect
        body: dict[str, Any] = {"model": self.served_model, "stream": True, "stream_options": dialect.stream_options(),
                                **dialect.length_fields(request.output_len, exact=not request.stop_at_eos,
                                                        eos_token_id=self.eos_token_id)}
        if self.chat:
            messages = request.messages or (("user", request.text or self._text(request.prompt_ids)),)
            body["messages"] = [{"role": role, "content": content} for role, content in messages]
        elif dialect.token_prompts:
            body["prompt"] = [int(t) for t in request.prompt_ids]
        else:
            # A conversation's turn is its whole history (its ids); any other prompt, its own text.
            plain = request.text is not None and request.messages is None
            body["prompt"] = request.text if plain else self._text(request.prompt_ids)
        return body

    def _text(self, ids: np.ndarray) -> str:
        assert self.tokenizer is not None  # loaded wherever prompts go as text
        return str(self.tokenizer.decode([int(t) for t in ids]))

    # -- the rest of the interface ---------------------------------------------------------
    def generate(self, prompt_ids: np.ndarray, output_len: int) -> Generation:
        raise NotImplementedError("the server backend runs serving mode only (the plan refuses offline sweeps)")

    def sync(self) -> None:
        """Nothing to wait for: every request's reply has arrived when ``serve`` returns."""

    def close(self) -> None:
        if self.process is not None:
            code = self.process.stop(self.stop_timeout_s)
            log.info("server stopped (exit code %s)", code)
            self.process = None


def _unmetered_reason(options: ServerOptions) -> str | None:
    if options.launch is not None or options.energy is not None:
        return None
    return ("an external server (base_url) whose GPUs the sweep does not locate "
            "(backend_options.server.energy: {node, gpu_uuids})")


def _site_gpus(options: ServerOptions) -> list[Any]:
    """An external server's GPUs, as its energy site names them; they must be on this node."""
    if options.energy is None:
        return []
    from actors.telemetry.nvml import resolve_gpus

    try:
        return list(resolve_gpus(",".join(options.energy.gpu_uuids)))
    except Exception as exc:  # noqa: BLE001 - any failure: the site is wrong, say so
        raise ServerError(f"backend_options.server.energy: GPUs {', '.join(options.energy.gpu_uuids)} "
                          f"are not metered on node {options.energy.node}: {exc}") from None


def _model_dir(spec: ModelSpec) -> str:
    """What the server is given as its model: a servable directory for a synthetic preset
    (a config naming its architecture, a tokenizer of its vocabulary), else the checkpoint."""
    from actors.models import materialize_servable, model_dir

    if spec.source == "synthetic":
        return str(materialize_servable(spec.location))
    return model_dir(spec.source, spec.location, spec.seed)


def _config(model_path: str) -> dict[str, Any]:
    path = Path(model_path) / "config.json"
    if path.is_file():
        return dict(json.loads(path.read_text()))
    try:
        from transformers import AutoConfig

        return dict(AutoConfig.from_pretrained(model_path).to_dict())
    except Exception:  # noqa: BLE001 - an external server's model need not be readable here
        return {}


def _first_int(value: Any) -> int | None:
    if isinstance(value, list):
        value = value[0] if value else None
    return value if isinstance(value, int) else None


def _served_models(base_url: str, headers: dict[str, str]) -> list[str]:
    try:
        answer = get_json(base_url + "/models", headers=headers)
    except (OSError, ValueError) as exc:
        raise ServerError(f"{base_url}/models did not answer: {exc}") from None
    data = answer.get("data", []) if isinstance(answer, dict) else []
    return [str(m.get("id")) for m in data if isinstance(m, dict)]


def _server_version(base_url: str, module: str | None, headers: dict[str, str]) -> str | None:
    """The version the server reports (vLLM: ``GET /version``), else the engine's installed one."""
    root = base_url.removesuffix("/v1")
    try:
        answer = get_json(root + "/version", timeout_s=2.0, headers=headers)
        if isinstance(answer, dict) and answer.get("version"):
            return str(answer["version"])
    except (OSError, ValueError):
        pass
    if module is None:
        return None
    try:
        return importlib.metadata.version(module)
    except importlib.metadata.PackageNotFoundError:
        return None
