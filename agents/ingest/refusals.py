"""Why the ingest refused a record, in words an operator can act on, and where refused records go."""

from __future__ import annotations

from collections import Counter
from typing import Any, Protocol

from agents.settings import Settings
from schemas.records import Reject
from streams.align.grid import LateSamples


class RejectSink(Protocol):
    """Where refused records go (``agents.sinks.deadletter.DeadLetter``); counts by reason."""

    counts: Counter[str]

    def send(self, reject: Reject, value: bytes | None, key: bytes | None, topic: str, partition: int, offset: int,
             headers: Any = (), indices: list[int] | None = None) -> None: ...


def late_detail(settings: Settings, late: LateSamples, per_step: bool) -> str:
    """The dead letter's detail for samples that came after their cells were written, naming the setting that
    decided it (``per_step``: their topic has the per-step cadence, ``streams.align.steps``)."""
    if late.why == "disorder":
        why = (f"they are older than their series' newest sample by more than the allowed lateness "
               f"({settings.lateness_ms} ms, FLOPWATCH_LATENESS_MS) less the series' sampling period")
    elif late.why == "cap":
        why = (f"their partition's open cells reached FLOPWATCH_MAX_OPEN_SAMPLES "
               f"({settings.max_open_samples:,} samples) and its oldest ticks were written early")
    elif per_step:  # streams.align.steps: the short bound on a live node
        why = (f"they arrived after their per-step topic or series had fallen behind and been quiet for "
               f"{settings.step_idle_s:g} s (FLOPWATCH_STEP_IDLE_S; {settings.source_idle_s:g} s, "
               f"FLOPWATCH_SOURCE_IDLE_S, in a backlog or burst) while the others moved on")
    else:
        why = (f"they arrived after their topic or series had fallen behind and been quiet for "
               f"{settings.source_idle_s:g} s (FLOPWATCH_SOURCE_IDLE_S) while the others moved on")
    return f"{len(late.indices)} of {late.total} samples fall in grid cells already written: {why}"
