"""Reading a simulator scenario file (``deploy/scenarios/*.toml``); parsing it is ``streams.sim.scenario``'s."""

from __future__ import annotations

from pathlib import Path

from streams.sim.scenario import Scenario, ScenarioError, parse_scenario


def load_scenario(path: str | Path) -> Scenario:
    """Read and parse a scenario file; errors name ``path``."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ScenarioError(str(p), f"cannot read: {exc}") from None
    return parse_scenario(text, str(p))
