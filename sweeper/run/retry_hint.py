"""What a finished run tells its user about the sweep's failed trials: how many stand failed in
the results (this run's, or kept from an earlier one: a plain run does not retry them), the
command that runs them again, and how many failed for want of a package this environment now has."""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING

from sweeper.core.backends import BACKENDS
from sweeper.core.status import Status
from sweeper.run.missing_packages import missing_package_failure
from sweeper.run.shards import TRIALS

if TYPE_CHECKING:
    from sweeper.run.session import RunResult, RunSetup


def retry_hint(setup: RunSetup, result: RunResult, output: str | None) -> list[str]:
    """The run's last lines about its failed trials (none where no trial of the sweep stands failed)."""
    ids = {t.trial_id for t in setup.expanded[0]}
    failed = [tid for tid, st in result.store.stored_trials().items() if tid in ids and st.status == Status.FAILED]
    if not failed:
        return []
    command = shlex.join(["sweeper", "run", str(setup.sweep_path), *(["-o", output] if output else []),
                          "--retry-failed"])
    lines = [f"{len(failed)} trial(s) of this sweep stand failed in {result.store.uri}; once their cause is fixed, "
             f"run them again with: {command}"]
    if line := _installed_since(setup, result, failed):
        lines.append(line)
    return lines


def _installed_since(setup: RunSetup, result: RunResult, failed: list[str]) -> str | None:
    """A line for the failures whose missing package imports here now, or None."""
    trials = {t.trial_id: t for t in setup.expanded[0]}
    table = result.store.read_shards(TRIALS, trial_ids=failed, columns=["trial_id", "error"])
    found = [missing_package_failure(tid, error, BACKENDS[trials[tid].backend].required_modules(
                 trials[tid].backend_options))
             for tid, error in zip(table.column("trial_id").to_pylist(), table.column("error").to_pylist(),
                                   strict=True)]
    now = [f for f in found if f is not None and f.installed_now]
    if not now:
        return None
    modules = ", ".join(dict.fromkeys(m for f in now for m in f.modules))
    return (f"{len(now)} of them failed for want of a Python package that this environment now has "
            f"({modules}): --retry-failed runs them again")
