"""The bundled sweeps' trial ids are pinned: a refactor that changes one silently
re-runs (and orphans) every stored result of that sweep.

If the measurement method changes on purpose (``METHOD_VERSION``), regenerate
``tests/data/pinned_trial_ids.json`` in the same commit and say why.
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import ROOT

PINNED = json.loads((ROOT / "tests" / "data" / "pinned_trial_ids.json").read_text())


@pytest.mark.parametrize("sweep_file", sorted(PINNED))
def test_bundled_sweep_trial_ids_are_unchanged(sweep_file):
    from sweeper.plan.expand import expand
    from sweeper.plan.spec import load_sweep

    trials, _ = expand(load_sweep(ROOT / sweep_file), sweep_path=str(ROOT / sweep_file), check_hub=False)
    assert {t.label(): t.trial_id for t in trials} == PINNED[sweep_file]
