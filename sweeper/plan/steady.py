"""Plan-time warnings about serving runs too short for a steady window worth measuring.

At ``request_rate: inf`` every request arrives at once. The engine fills to its
concurrency cap C at once and stays full until its last request is admitted, which
is when ``num_prompts - C`` requests have completed; then it drains. The steady
window (``actors.serving.stats``) opens at the first completion and closes at the
last first token, so it holds about ``num_prompts - C`` completions and lasts about
``(num_prompts - C) / C`` request lives, a life being T, one request's time in the
full engine (its output tokens at the step time of a batch of C). Around it the
first batch's decode and the drain each last about T. Hence:

- ``num_prompts <= C``: every request in one batch, no steady window at all;
- ``num_prompts < 2 C``: the engine is full for less of the run than it drains,
  and the steady level (the time-weighted median of requests running) can fall
  below the cap: the window then measures a part-drained engine;
- a window of k lives needs ``(k + 1) C`` prompts, one of W seconds ``C (1 + W / T)``.

``INF_MIN_BATCHES`` x C (a window of three lives, three times the ramp or the drain)
is what the warning asks for. On an H100, 300 prompts against max_num_seqs 256 left a
steady window of 1.7-2.0 s (about 44 completions); 1,000 against a cap of 128 read
J/token 3.3 % from the offline batch of 128 (docs/BENCHMARKS.md §11).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from sweeper.core.trial import Trial

# Recommended num_prompts at request_rate inf, in multiples of the engine's concurrency cap.
INF_MIN_BATCHES = 4

# Each backend's option that caps the requests its engine runs at once (None: its own default,
# unknown at plan time).
ENGINE_CAP_OPTIONS = {"vllm": "max_num_seqs", "transformers": "max_batch_requests", "noop": "max_batch"}


def engine_cap(trial: Trial) -> tuple[int, str] | None:
    """The most requests the trial's engine runs at once, and what sets it: the smaller of the
    client's ``max_concurrency`` and the backend's own cap; None where neither is known."""
    caps: list[tuple[int, str]] = []
    if trial.max_concurrency is not None:
        caps.append((trial.max_concurrency, "max_concurrency"))
    option = ENGINE_CAP_OPTIONS.get(trial.backend)
    value = getattr(trial.backend_options, option, None) if option else None
    if isinstance(value, int):
        caps.append((value, f"backend_options.{trial.backend}.{option}"))
    return min(caps, key=lambda c: c[0]) if caps else None


def inf_rate_warning(num_prompts: int, cap: int, cap_name: str) -> str | None:
    """What a ``request_rate: inf`` run of ``num_prompts`` against an engine cap of ``cap``
    leaves of a steady window, when it is under ``INF_MIN_BATCHES`` x the cap (module docstring)."""
    wanted = INF_MIN_BATCHES * cap
    if num_prompts >= wanted:
        return None
    head = f"request_rate inf with num_prompts {num_prompts} against {cap_name} {cap}: "
    if num_prompts <= cap:
        body = "every request fits in one batch, so the run has no steady window (none completes while others enter)"
    else:
        lives = (num_prompts - cap) / cap
        body = (f"the engine stays full only until the last {cap} requests are admitted, so the steady window "
                f"holds about {num_prompts - cap} requests' completions, {lives:.2g} of a request's life in the "
                f"full engine")
        if num_prompts < 2 * cap:
            body += (f"; under {2 * cap} prompts it is full for less of the run than it drains, and the steady "
                     f"level can fall below the cap")
    return (f"{head}{body}. A steady window of k request lives needs about (k + 1) x {cap} prompts, one of W s "
            f"about {cap} x (1 + W / T), T being a request's time in the full engine; use num_prompts >= {wanted} "
            f"({INF_MIN_BATCHES} x {cap}) for k = {INF_MIN_BATCHES - 1}")


def steady_window_warnings(trials: Iterable[Trial]) -> list[str]:
    """One warning per distinct too-short ``request_rate: inf`` run among ``trials``."""
    warnings: dict[str, None] = {}
    for trial in trials:
        rate, settings = trial.request_rate, trial.serving
        if rate is None or not math.isinf(rate) or settings is None or settings.num_prompts is None:
            continue
        cap = engine_cap(trial)
        if cap is not None:
            warning = inf_rate_warning(settings.num_prompts, *cap)
            if warning is not None:
                warnings.setdefault(warning)
    return list(warnings)
