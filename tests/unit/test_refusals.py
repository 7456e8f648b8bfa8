"""A late dead letter names the setting that made its samples late, so an operator changes the right one."""

from __future__ import annotations

import pytest

from agents.ingest.refusals import late_detail
from agents.settings import Settings
from streams.align.grid import LateSamples


@pytest.mark.parametrize(("why", "per_step", "names", "not_named"), [
    ("disorder", False, "allowed lateness (250 ms, FLOPWATCH_LATENESS_MS)", "IDLE_S"),
    ("cap", False, "FLOPWATCH_MAX_OPEN_SAMPLES (1,000 samples)", "IDLE_S"),
    ("idle", False, "FLOPWATCH_SOURCE_IDLE_S", "FLOPWATCH_STEP_IDLE_S"),
    ("idle", True, "FLOPWATCH_STEP_IDLE_S", "MAX_OPEN"),
])
def test_each_reason_names_its_setting(why: str, per_step: bool, names: str, not_named: str) -> None:
    settings = Settings().replace(lateness_ms=250, max_open_samples=1000)
    detail = late_detail(settings, LateSamples("s", 7, [0, 2], 5, why), per_step)
    assert detail.startswith("2 of 5 samples fall in grid cells already written: ")
    assert names in detail and not_named not in detail, detail
