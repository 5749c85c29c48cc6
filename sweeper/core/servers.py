"""The ``server`` backend's options, and the serving engines sweeper knows how to launch.

A ``server`` trial measures an OpenAI-compatible HTTP server, reached one of two ways:

- ``launch``: the trial group's actor starts the server on its own GPUs (``vllm
  serve``, SGLang, ``transformers serve``, or any command), waits until it answers,
  measures through it and stops it with the group;
- ``base_url``: a server that is already running; sweeper only sends it requests.

Each engine entry below says how to start it (its command line, how each precision of
the registry maps to its flags) and how to talk to it (whether it takes token-id
prompts, which request fields ask for an exact number of tokens). Nothing outside this
module branches on an engine's name.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

from sweeper.core.continuous_batching import CPU_SERVER_FLAGS
from sweeper.core.secrets import REDACTED, is_secret_flag, secret_positions

EngineName = Literal["vllm", "sglang", "transformers"]
Dialect = Literal["vllm", "sglang", "transformers", "openai"]

# vLLM's cache directory (its compiled graphs) under sweeper's node cache: one per node, shared
# by every vLLM start there, in-process (actors/backends/vllm/backend.py) and launched `vllm serve`
# (ENGINES below), so that each finds what another compiled.
VLLM_CACHE_DIR = "vllm"
# Triton's compiled kernels (vLLM's and Inductor's), beside vLLM's cache under sweeper's.
TRITON_CACHE_DIR = "triton"

# Placeholders a launch command may hold; each is replaced by the trial's value.
COMMAND_FIELDS = ("port", "host", "model", "served_model", "dtype", "tensor_parallel", "seed", "device")
# A placeholder is a name alone in braces (``{port}``, ``--port={port}``). Any other brace is the
# command's own (a JSON flag value, a secret) and is passed as written: read as a format string,
# ``{"method": "ngram"}`` failed as an unknown field, and a secret's braces put the secret in
# the error.
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


class Verbatim(str):
    """A word of a server's command line that is a value (an ``args`` value, a secret flag's
    value, the model's path): passed to the server as it is, never searched for placeholders,
    which are the command's own words' (``fill_placeholders``)."""

    __slots__ = ()


def placeholders(word: str) -> list[str]:
    """The names of the placeholders ``word`` holds."""
    return _PLACEHOLDER.findall(word)


def fill_placeholders(argv: Sequence[str], values: Mapping[str, str]) -> list[str]:
    """``argv`` with each placeholder of ``COMMAND_FIELDS`` replaced by its value; a ``Verbatim``
    word, and every brace that is no such placeholder, as given. Raises ``ValueError`` naming a
    placeholder that has no value."""

    def value(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in COMMAND_FIELDS:
            return match.group(0)
        if name not in values:
            raise ValueError(f"the command holds {{{name}}}, which has no value here")
        return values[name]

    return [str(word) if isinstance(word, Verbatim) else _PLACEHOLDER.sub(value, word) for word in argv]


@dataclass(frozen=True)
class RequestDialect:
    """How a server is asked for a reply: which prompt forms it takes, and which body
    fields make it generate exactly ``n`` tokens (EOS ignored) or up to ``n`` (EOS honoured)."""

    name: str
    # Whether ``/v1/completions`` takes a list of token ids as its prompt (exact lengths,
    # no re-tokenization); otherwise the prompt is sent as text, decoded by the model's tokenizer.
    token_prompts: bool
    # Whether every streamed chunk can carry the running usage (vLLM's and SGLang's
    # ``continuous_usage_stats``): then each chunk's token count is known exactly.
    continuous_usage: bool
    exact: str  # "ignore_eos" | "generation_config" | "none"

    def length_fields(self, n: int, *, exact: bool, eos_token_id: int | None) -> dict[str, Any]:
        """The body fields that bound the reply to ``n`` tokens (exactly ``n`` with ``exact``)."""
        body: dict[str, Any] = {"max_tokens": n, "temperature": 0.0}
        if self.exact == "ignore_eos":
            if exact:
                body.update(ignore_eos=True, min_tokens=n)
        elif self.exact == "generation_config":
            # transformers serve replaces the model's generation config with this one whole,
            # so the EOS id it should stop at (natural lengths) must be in it.
            config: dict[str, Any] = {"max_new_tokens": n, "do_sample": False}
            if exact:
                config["min_new_tokens"] = n
            elif eos_token_id is not None:
                config["eos_token_id"] = eos_token_id
            body["generation_config"] = json.dumps(config)
        return body

    def stream_options(self) -> dict[str, Any]:
        options: dict[str, Any] = {"include_usage": True}
        if self.continuous_usage:
            options["continuous_usage_stats"] = True
        return options


DIALECTS: dict[str, RequestDialect] = {
    d.name: d for d in [
        RequestDialect("vllm", token_prompts=True, continuous_usage=True, exact="ignore_eos"),
        RequestDialect("sglang", token_prompts=True, continuous_usage=True, exact="ignore_eos"),
        RequestDialect("transformers", token_prompts=False, continuous_usage=False, exact="generation_config"),
        # Any other OpenAI-compatible server: only the standard fields; a reply may end
        # early at EOS (the recorded output tokens are the server's usage all the same).
        RequestDialect("openai", token_prompts=False, continuous_usage=False, exact="none"),
    ]
}


class ApiKeyPassing(BaseModel):
    """How a launched server is given the fresh key it must demand of every request: as a
    command-line flag, or (kept off the process table, which any local user can read) in an
    environment variable it reads."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    flag: str | None = Field(None, pattern=r"^--?[A-Za-z0-9][A-Za-z0-9_-]*$")
    env: str | None = Field(None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")

    @model_validator(mode="after")
    def _one_way(self) -> ApiKeyPassing:
        if (self.flag is None) == (self.env is None):
            raise ValueError("give exactly one of flag (--api-key) and env (a variable the server reads)")
        return self


@dataclass(frozen=True)
class ServerEngine:
    """One serving engine sweeper launches: its command line and what it runs."""

    name: str
    module: str  # the Python module the worker needs (the server runs in the actor's environment)
    # The line that installs it and everything its server imports (the plan's skip reason quotes it).
    install: str
    # argv before the model; "python" is the actor's interpreter, so the server runs in the
    # actor's environment (where the engine's console script may not be on PATH)
    program: tuple[str, ...]
    devices: frozenset[str]
    # precision -> its flags; a precision not here is one the engine cannot run
    precision_flags: Mapping[str, tuple[str, ...]]
    served_name_flag: str | None  # None: the server names the model by the path it was given
    tensor_parallel_flag: str | None  # None: one device only
    seed_flag: str | None
    # Flags for a synthetic (random-weight) model: the engine initializes the weights itself.
    synthetic_flags: tuple[str, ...] = ()
    extra_flags: tuple[str, ...] = ()  # always given; may hold {placeholders}
    # device -> flags (each with its value) given on that device unless the sweep's ``args``
    # set the same flag
    device_flags: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    precision_notes: Mapping[str, str] = field(default_factory=dict)
    version_module: str | None = None
    # The engine logs its start's phases as vLLM does (actors/backends/vllm/start.py): the
    # load is broken down into them in the stages table.
    logs_start_phases: bool = False
    # The server's model list is the Hugging Face Hub cache's, not the model it was started
    # with (transformers serve 5.17): it answers the list with an error where that directory
    # does not exist (a machine that never downloaded a model), so the launcher creates it,
    # and a model served from a path is not in the list, so the list is not checked for it.
    model_list_is_hub_cache: bool = False
    # Environment variables naming the engine's caches, each pointed (unless the user set it) at
    # a directory under sweeper's node cache: a launched server then finds what an earlier
    # start compiled, the in-process engine's starts included, and wiping sweeper's cache
    # wipes them too.
    cache_dirs: Mapping[str, str] = field(default_factory=dict)
    # How the server takes the key it demands of every request (None: it has no such option
    # and answers anyone who reaches its loopback port).
    api_key: ApiKeyPassing | None = None
    # Modules its server imports beyond ``module`` (an optional extra's): checked at plan time
    # on the nodes, so a missing one is a skip with the install line, not a failed load.
    server_modules: tuple[str, ...] = ()

    @property
    def modules(self) -> tuple[str, ...]:
        return (self.module, *self.server_modules)

    def unsupported(self, precision: str, device: str, tensor_parallel: int) -> str | None:
        if device not in self.devices:
            return f"launch: {self.name} runs on {' or '.join(sorted(self.devices))}, not {device}"
        if precision not in self.precision_flags:
            why = self.precision_notes.get(precision)
            return f"launch: {self.name} does not run precision {precision}" + (f": {why}" if why else "")
        if tensor_parallel > 1 and self.tensor_parallel_flag is None:
            return f"launch: {self.name} serves from one device; tensor_parallel {tensor_parallel} is not possible"
        return None

    def command(self, *, model: str, served_model: str, precision: str, tensor_parallel: int, seed: int,
                synthetic: bool, args: Mapping[str, Any], device: str) -> list[str]:
        """The command line, with ``{port}``, ``{host}`` and ``{device}`` left to fill at launch;
        the model, its name and ``args`` are values (``Verbatim``), whatever braces they hold."""
        argv: list[str] = [*self.program, Verbatim(model), "--host", "{host}", "--port", "{port}"]
        if self.served_name_flag:
            argv += [self.served_name_flag, Verbatim(served_model)]
        argv += list(self.precision_flags[precision])
        if self.tensor_parallel_flag and tensor_parallel > 1:
            argv += [self.tensor_parallel_flag, str(tensor_parallel)]
        if self.seed_flag:
            argv += [self.seed_flag, str(seed)]
        if synthetic:
            argv += list(self.synthetic_flags)
        argv += list(self.extra_flags)
        given = engine_args(args)
        for flag, value in self.device_flags.get(device, {}).items():
            if flag not in given and "--no-" + flag[2:] not in given:
                argv += [flag, value]
        return argv + given


def engine_args(args: Mapping[str, Any]) -> list[str]:
    """``{max-num-seqs: 64, enforce-eager: true}`` as ``--max-num-seqs 64 --enforce-eager``; a
    mapping or list value as JSON, which is how vLLM and SGLang take structured flags
    (``speculative-config: {method: ngram, num_speculative_tokens: 4}``). Every word is the
    sweep's value (``Verbatim``): a JSON value's braces are no placeholders."""
    out: list[str] = []
    for key, value in args.items():
        flag = Verbatim("--" + key.replace("_", "-"))
        if value is True:
            out.append(flag)
        elif value is False:
            out.append(Verbatim("--no-" + key.replace("_", "-")))
        elif isinstance(value, Mapping | list):
            out += [flag, Verbatim(json.dumps(value, separators=(",", ":")))]
        else:
            out += [flag, Verbatim(str(value))]
    return out


_DTYPE = {"fp32": ("--dtype", "float32"), "fp16": ("--dtype", "float16"), "bf16": ("--dtype", "bfloat16")}
_NO_BNB = ("its server quantizes bitsandbytes formats only from real or pre-quantized weight files, "
           "not a synthetic model; compare them in-process (backend transformers)")

ENGINES: dict[str, ServerEngine] = {
    e.name: e for e in [
        ServerEngine(
            name="vllm", module="vllm", install="pip install vllm", program=("python", "-m", "vllm.entrypoints.cli.main", "serve"), devices=frozenset({"cuda"}),
            precision_flags={"fp16": _DTYPE["fp16"], "bf16": _DTYPE["bf16"],
                             "fp8": (*_DTYPE["bf16"], "--quantization", "fp8")},
            served_name_flag="--served-model-name", tensor_parallel_flag="--tensor-parallel-size",
            seed_flag="--seed", synthetic_flags=("--load-format", "dummy"), logs_start_phases=True,
            cache_dirs={"VLLM_CACHE_ROOT": VLLM_CACHE_DIR, "TRITON_CACHE_DIR": TRITON_CACHE_DIR}, api_key=ApiKeyPassing(env="VLLM_API_KEY"),
            # As the in-process backend: random prompts share no prefix, but the cache's
            # bookkeeping is work the numbers should not carry unless asked (args can turn it on).
            # Each reply's usage says how many prompt tokens the cache held (cached_tokens).
            extra_flags=("--no-enable-prefix-caching", "--enable-prompt-tokens-details"),
            precision_notes={"fp32": "its fast attention kernels have no fp32 path",
                             "int8": _NO_BNB, "nf4": _NO_BNB, "fp4": _NO_BNB},
            version_module="vllm",
        ),
        ServerEngine(
            name="sglang", module="sglang", install="pip install sglang", program=("python", "-m", "sglang.launch_server", "--model-path"),
            devices=frozenset({"cuda"}),
            precision_flags={"fp16": _DTYPE["fp16"], "bf16": _DTYPE["bf16"],
                             "fp8": (*_DTYPE["bf16"], "--quantization", "fp8")},
            served_name_flag="--served-model-name", tensor_parallel_flag="--tp-size",
            seed_flag="--random-seed", synthetic_flags=("--load-format", "dummy"),
            api_key=ApiKeyPassing(flag="--api-key"),
            # Each reply's usage says how many prompt tokens the radix cache held (cached_tokens).
            # The radix cache itself stays SGLang's default (on): it has no flag to turn it back
            # on, so `disable-radix-cache: true` in args is how a sweep compares without it.
            extra_flags=("--enable-cache-report",),
            precision_notes={"int8": _NO_BNB, "nf4": _NO_BNB, "fp4": _NO_BNB},
            version_module="sglang",
        ),
        ServerEngine(
            name="transformers", module="transformers", install="pip install 'transformers[serving]'",
            # transformers serve's own extra (the project's [serve] extra installs it).
            server_modules=("fastapi", "uvicorn", "openai"), program=("python", "-m", "transformers.cli.transformers", "serve"),
            devices=frozenset({"cuda", "cpu"}),
            precision_flags={**_DTYPE, "int8": (*_DTYPE["bf16"], "--quantization", "bnb-8bit"),
                             "nf4": (*_DTYPE["bf16"], "--quantization", "bnb-4bit")},
            served_name_flag=None, tensor_parallel_flag=None, seed_flag="--default-seed",
            # Continuous batching: a server batches the requests in flight, as the others do.
            extra_flags=("--continuous-batching", "--device", "{device}", "--log-level", "warning"),
            # A bounded KV cache on a CPU (sweeper.core.continuous_batching says why).
            device_flags={"cpu": CPU_SERVER_FLAGS},
            model_list_is_hub_cache=True,
            precision_notes={"fp8": "transformers serve has no fp8 flag",
                             "fp4": "transformers serve quantizes to bnb-4bit (nf4) or bnb-8bit only"},
            version_module="transformers",
        ),
    ]
}


class LaunchCommand(BaseModel):
    """Any server, started by sweeper from a command line with placeholders."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    command: list[str] = Field(min_length=1)
    # How to talk to it (what it accepts beyond standard OpenAI requests).
    dialect: Dialect = "openai"
    # How it takes a key to demand of every request, if it can: sweeper then starts it with a
    # fresh one that only the trial's actor knows.
    api_key: ApiKeyPassing | None = None
    # The values of secret flags in ``command`` (by position), which ``command`` itself holds
    # as REDACTED: never serialized, so never stored, hashed into a trial id or printed.
    secret_values: dict[int, str] = Field(default_factory=dict, exclude=True, repr=False)

    @model_validator(mode="before")
    @classmethod
    def _set_secrets_apart(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("command"), list) and not data.get("secret_values"):
            command = [str(w) for w in data["command"]]
            secrets: dict[int, str] = {}
            for i in secret_positions(command):
                name, eq, value = command[i].partition("=")
                if eq and command[i].startswith("-"):
                    secrets[i], command[i] = value, f"{name}={REDACTED}"
                else:
                    secrets[i], command[i] = command[i], REDACTED
            data = {**data, "command": command, "secret_values": secrets}
        return data

    @model_serializer(mode="wrap")
    def _key_only_when_set(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # A command's options are in its trials' ids whole: one that gives no key way keeps
        # the id it had before servers could be given keys.
        data = handler(self)
        if self.api_key is None:
            data.pop("api_key", None)
        return data

    def argv(self) -> list[str]:
        """The command line to start, its secret values restored (as ``Verbatim``: a secret's
        braces are no placeholders)."""
        out = list(self.command)
        for i, value in self.secret_values.items():
            name, eq, _ = out[i].partition("=")
            out[i] = Verbatim(f"{name}={value}" if eq and out[i].startswith("-") else value)
        return out

    @model_validator(mode="after")
    def _placeholders_known(self) -> LaunchCommand:
        # The launch's own reading (fill_placeholders): other braces (JSON) are the command's.
        for part in self.command:
            for name in placeholders(part):
                if name not in COMMAND_FIELDS:
                    raise ValueError(f"command: unknown placeholder {{{name}}}; known: "
                                     + ", ".join("{" + f + "}" for f in COMMAND_FIELDS))
        if not any("port" in placeholders(part) for part in self.command):
            raise ValueError("command: must contain {port} (the free port sweeper picks for the server)")
        return self


class EnergySite(BaseModel):
    """Where an external server's GPUs are, so that its energy can be metered."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    node: str = Field(min_length=1)  # a Ray node's IP address
    gpu_uuids: list[str] = Field(min_length=1)


# Engine flags that turn speculative decoding on (vLLM: --speculative-config; SGLang:
# --speculative-algorithm), by name without the dashes.
SPECULATION_FLAGS = frozenset({"speculative-config", "speculative-algorithm"})


class ServerOptions(BaseModel):
    """Options of the ``server`` backend (``backend_options.server``): which server, and how to reach it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    launch: EngineName | LaunchCommand | None = None
    # Extra engine flags, by name without the dashes: {max-num-seqs: 64, enforce-eager: true}; a
    # mapping or list is passed as JSON ({speculative-config: {method: ngram, ...}}).
    args: dict[str, str | int | float | bool | dict[str, Any] | list[Any]] = {}
    base_url: str | None = Field(None, pattern=r"^https?://[^\s/]+(/\S*)?$")
    # The name the external server serves the model under (base_url only).
    model: str | None = None
    # What an external server is, for the request fields it accepts (base_url only).
    dialect: Dialect = "openai"
    energy: EnergySite | None = None
    # The environment variable holding the external server's key (base_url only): read where
    # the requests are sent, sent as "Authorization: Bearer <key>"; only its name is stored.
    api_key_env: str | None = Field(None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    # A launched server gets this long to stop after SIGTERM before its process group is killed.
    stop_timeout_s: float = Field(30.0, gt=0, le=600)
    # Processes the HTTP client sends a run's requests from (each with its own event loop: one
    # streams about 14,500 chunks a second per core); auto: as many as the run's expected chunk
    # rate needs, at most half the node's cores (actors.backends.server.fanout).
    client_processes: Annotated[int, Field(ge=1, le=64, strict=True)] | Literal["auto"] = "auto"
    # Options a conversation replay does not use (its turns go from one process, each built
    # from the reply before it): refused there, since they would set its trials apart for nothing.
    unused_by_conversations: ClassVar[tuple[str, ...]] = ("client_processes",)
    # ``args`` whose flag names a secret (--hf-token, ...), set apart: never serialized, so never
    # stored, hashed into a trial id or printed; the launch passes them on.
    secret_args: dict[str, str] = Field(default_factory=dict, exclude=True, repr=False)

    @model_validator(mode="before")
    @classmethod
    def _set_secret_args_apart(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("args"), dict) and not data.get("secret_args"):
            args = dict(data["args"])
            secrets = {k: str(args.pop(k)) for k in list(args) if is_secret_flag(str(k))}
            if secrets:
                data = {**data, "args": args, "secret_args": secrets}
        return data

    @field_validator("base_url")
    @classmethod
    def _no_userinfo(cls, url: str | None) -> str | None:
        # A password in the URL would be shown wherever the server is named (its label, the
        # server_url column, a failed request's error); the message does not quote the URL.
        if url is not None and "@" in urlsplit(url).netloc:
            raise ValueError("holds a user name or password (user:password@host), which sweeper would print "
                             "wherever it names the server; give the URL without it, and the server's key "
                             "in api_key_env (the name of an environment variable holding it)")
        return url

    @model_validator(mode="after")
    def _one_way_in(self) -> ServerOptions:
        if (self.launch is None) == (self.base_url is None):
            raise ValueError("give exactly one of launch (sweeper starts the server) and base_url (it is running)")
        if self.launch is not None:
            for key in ("model", "energy"):
                if getattr(self, key) is not None:
                    raise ValueError(f"{key}: applies to a base_url server; a launched server serves the sweep's "
                                     "model on its actor's GPUs")
            if self.api_key_env is not None:
                raise ValueError("api_key_env: applies to a base_url server; a launched server is given a fresh "
                                 "key of its own, which only its actor knows")
            if isinstance(self.launch, LaunchCommand) and self.args:
                raise ValueError("args: a launch command carries its own flags; put them in the command")
        else:
            if self.args:
                raise ValueError("args: flags of a server sweeper launches; a base_url server is already running")
            if self.model is None:
                raise ValueError("model: required with base_url (the name the server serves the model under)")
        return self

    def __hash__(self) -> int:
        # Options are grid points (hashed and compared); args, command and GPU lists are mutable types.
        return hash(self.model_dump_json())

    # -- what the backend registry asks its options -------------------------------------------
    @property
    def engine(self) -> ServerEngine | None:
        return ENGINES[self.launch] if isinstance(self.launch, str) else None

    @property
    def request_dialect(self) -> RequestDialect:
        if isinstance(self.launch, str):
            return DIALECTS[self.launch]
        if isinstance(self.launch, LaunchCommand):
            return DIALECTS[self.launch.dialect]
        return DIALECTS[self.dialect]

    @property
    def api_key_passing(self) -> ApiKeyPassing | None:
        """How a launched server takes the key sweeper generates for it (None: it has no key)."""
        if isinstance(self.launch, LaunchCommand):
            return self.launch.api_key
        engine = self.engine
        return engine.api_key if engine is not None else None

    def secret_flag_values(self) -> tuple[str, ...]:
        """The values of its secret flags (``args``' and a launch command's): no text that
        sweeper writes may hold them, an error's included."""
        command = self.launch.secret_values.values() if isinstance(self.launch, LaunchCommand) else ()
        return (*self.secret_args.values(), *command)

    def actor_env(self) -> tuple[str, ...]:
        """Environment variables the trial's actor needs from the driver's environment: the
        external server's key, which reaches the actor's node as an argument of its load call."""
        return (self.api_key_env,) if self.api_key_env is not None else ()

    def speculates(self) -> bool:
        """Whether the launched engine is asked to speculate (vLLM's and SGLang's flags)."""
        return any(k.replace("_", "-") in SPECULATION_FLAGS for k in self.args)

    @property
    def holds_gpus(self) -> bool:
        """Whether the trial's actor holds GPUs: a launched server runs on them; an external
        server's client needs none (its energy site names the GPUs it meters instead)."""
        return self.launch is not None

    def ray_resources(self) -> dict[str, float]:
        """Extra Ray resources of the trial's actor: an external server's energy site places
        it on the server's node (Ray's ``node:<ip>`` resource), where it meters those GPUs."""
        return {f"node:{self.energy.node}": 0.001} if self.energy is not None else {}

    def required_modules(self) -> tuple[str, ...]:
        engine = self.engine
        return engine.modules if engine is not None else ()

    def install_hint(self) -> str | None:
        """How to install what ``required_modules`` names (the engine's install line)."""
        engine = self.engine
        return f"install it with: {engine.install}" if engine is not None else None

    def unsupported_precision(self, precision: str, device: str, tensor_parallel: int) -> str | None:
        engine = self.engine
        if engine is not None:
            return engine.unsupported(precision, device, tensor_parallel)
        if isinstance(self.launch, LaunchCommand) and precision not in _DTYPE:
            return (f"a launch command is given the precision as {{dtype}}; {precision} is a quantization "
                    "scheme, not a dtype (put its flags in the command and sweep bf16 or fp16)")
        return None

    @staticmethod
    def describe(values: dict[str, Any]) -> dict[str, Any]:
        """Non-default option values (JSON, as rows hold them) in a few words each, for
        labels and tables: a command by its program, flags and the energy site compactly."""
        out = dict(values)
        launch = out.get("launch")
        if isinstance(launch, dict) and launch.get("command"):
            words = [str(w).rsplit("/", 1)[-1] for w in launch["command"][:2]]
            out["launch"] = " ".join(words)
        if isinstance(out.get("args"), dict):
            out["args"] = ",".join(f"{k}:{v}" for k, v in out["args"].items())
        if isinstance(out.get("energy"), dict):
            out["energy"] = f"{out['energy'].get('node')}"
        return out

    def label(self) -> str:
        if isinstance(self.launch, str):
            return self.launch
        if isinstance(self.launch, LaunchCommand):
            return self.launch.command[0].rsplit("/", 1)[-1]
        return self.base_url or "server"


def dtype_of(precision: str) -> str:
    """The ``{dtype}`` placeholder's value for a dtype precision."""
    return _DTYPE[precision][1] if precision in _DTYPE else "bfloat16"
