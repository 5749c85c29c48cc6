"""Before any trial starts: every external server a sweep names (``base_url``) answers,
and serves the model the sweep asks it for.

A ``base_url`` that refuses connections, answers with an error, or does not serve
``model`` would fail every trial of its group after a cluster start; it is one line
naming the sweep field instead, within seconds (each server gets ``TIMEOUT_S``).
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request

from sweeper.core.errors import SweepFileError
from sweeper.core.secrets import header_unsafe
from sweeper.core.servers import ServerOptions
from sweeper.plan.spec import Sweep

TIMEOUT_S = 5.0


class KeyRefused(ValueError):
    """The server answered 401 or 403: it wants a key, or not the one it was sent."""


def served_models(base_url: str, timeout_s: float = TIMEOUT_S, api_key: str | None = None) -> list[str]:
    """The model ids ``GET {base_url}/models`` lists (sent with ``api_key`` as a bearer token
    where given); raises ``ValueError`` saying what went wrong (``KeyRefused`` for 401/403)."""
    url = base_url.rstrip("/") + "/models"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        request = urllib.request.Request(url, headers=headers)
        with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310 - the sweep's http(s) URL
            answer = json.loads(response.read().decode())
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403):
            raise KeyRefused(f"GET {url} answered HTTP {exc.code} {exc.reason}") from None
        raise ValueError(f"GET {url} answered HTTP {exc.code} {exc.reason}") from None
    except urllib.error.URLError as exc:
        raise ValueError(f"GET {url} failed: {exc.reason}") from None
    except (OSError, TimeoutError) as exc:
        raise ValueError(f"GET {url} failed: {exc}") from None
    except ValueError:
        raise ValueError(f"GET {url} did not answer JSON: not an OpenAI-compatible server") from None
    data = answer.get("data") if isinstance(answer, dict) else None
    if not isinstance(data, list):
        raise ValueError(f"GET {url} answered without a model list: not an OpenAI-compatible server")
    return [str(m.get("id")) for m in data if isinstance(m, dict)]


def _server_variants(sweep: Sweep) -> list[tuple[str, ServerOptions]]:
    """Each ``server`` option variant the sweep validated, with the sweep-file field it came from."""
    if "server" not in sweep.backends:
        return []
    variants = sweep.options_for("server")
    return [("backend_options.server" + (f"[{i}]" if len(variants) > 1 else ""), options)
            for i, options in enumerate(variants) if isinstance(options, ServerOptions)]


def check_energy_sites(sweep: Sweep, node_ips: frozenset[str], sweep_path: str = "<sweep>") -> None:
    """Raise ``SweepFileError`` for an energy site on a node the cluster does not have: its
    trial's actor could never be placed, and would wait for the node forever."""
    for where, options in _server_variants(sweep):
        if options.energy is not None and options.energy.node not in node_ips:
            raise SweepFileError(sweep_path, f"{where}.energy.node",
                                 f"no node of the cluster has the address {options.energy.node} (its nodes: "
                                 f"{', '.join(sorted(node_ips)) or 'none'}); give the IP address Ray knows "
                                 "the server's node by")


def check_servers(sweep: Sweep, sweep_path: str = "<sweep>") -> None:
    """Raise ``SweepFileError`` naming the field of the first external server that is not usable."""
    for where, options in _server_variants(sweep):
        if options.base_url is None:
            continue
        key = None
        if options.api_key_env is not None:
            key = os.environ.get(options.api_key_env)
            if not key:
                raise SweepFileError(sweep_path, f"{where}.api_key_env",
                                     f"{options.api_key_env} is not set in this environment (the server's key is "
                                     "read from it here and passed on to the trial's actor)")
            if (why := header_unsafe(key)) is not None:
                raise SweepFileError(sweep_path, f"{where}.api_key_env", f"the key in {options.api_key_env}: {why}")
        try:
            models = served_models(options.base_url, api_key=key)
        except KeyRefused as exc:
            field, why = ((f"{where}.api_key_env", f"the server refused the key in {options.api_key_env}")
                          if key else (f"{where}.base_url", "the server demands a key: name the environment "
                                                            "variable holding it in api_key_env"))
            raise SweepFileError(sweep_path, field, f"{exc}: {why}") from None
        except ValueError as exc:
            raise SweepFileError(sweep_path, f"{where}.base_url", str(exc)) from None
        if options.model not in models:
            raise SweepFileError(sweep_path, f"{where}.model",
                                 f"{options.base_url} does not serve {options.model!r}; it serves: "
                                 + (", ".join(repr(m) for m in models) or "no model"))
