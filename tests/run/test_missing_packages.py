"""Which stored failures a missing package caused, and whether it imports now."""

from __future__ import annotations

import sys

from sweeper.run.missing_packages import missing_package_failure


def test_a_named_module_is_what_the_failure_needed(tmp_path, monkeypatch):
    error = "load_failed: ModuleNotFoundError: No module named 'sweeper_probe_named'"
    failure = missing_package_failure("t1", error, required=("transformers",))
    assert failure is not None and failure.modules == ("sweeper_probe_named",)
    assert not failure.installed_now
    (tmp_path / "sweeper_probe_named.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert failure.installed_now
    sys.modules.pop("sweeper_probe_named", None)


def test_an_unnamed_import_failure_needed_the_backends_modules():
    error = "server exited with code 1 before it was ready: ImportError: Missing dependencies for serving. " \
            "Install with pip install transformers[serving]"
    failure = missing_package_failure("t2", error, required=("json", "sweeper_probe_absent"))
    assert failure is not None and failure.modules == ("json", "sweeper_probe_absent")
    assert not failure.installed_now  # one of them is still missing
    assert missing_package_failure("t2", error, required=("json",)).installed_now


def test_other_failures_are_not_missing_packages():
    assert missing_package_failure("t3", "CUDA out of memory", required=("torch",)) is None
    assert missing_package_failure("t3", None, required=("torch",)) is None
    # An import failure of a backend that requires nothing the plan could check: no verdict.
    assert missing_package_failure("t3", "ImportError: pip install something", required=()) is None
    # A dotted module whose parent package is missing is not importable, and says so quietly.
    failure = missing_package_failure("t4", "No module named 'sweeper_probe_absent.sub'", required=())
    assert failure is not None and not failure.installed_now
