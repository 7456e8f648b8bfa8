"""Cyclic-GC settings for a long-running worker process.

The worker allocates millions of short-lived, acyclic objects per second (decoded
messages, sample lists, frame dicts) that reference counting frees at once. With
CPython's default thresholds (700, 10, 10) they still trigger a young collection every
700 allocations, and the ones that live a little longer (open grid cells, spike
buckets) get scanned again in older generations: measured on the efficiency benchmark,
0.2 s of event-loop CPU per million samples, about a third of what derive and the spike
engine add. Rarer young collections keep cycles collectable (memory stays bounded)
while scanning far less. ``freeze`` moves what start-up allocated (modules, settings,
the price book) out of every later collection.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable
from typing import Any, Final

log = logging.getLogger(__name__)

WORKER_THRESHOLDS: Final = (50_000, 20, 100)
SLOW_PAUSE_S: Final = 0.2  # a collection this long stalls every consumer, heartbeat and alert of the process


class PauseWatch:
    """Times every collection (``gc.callbacks``) and says when one stopped the process for long.

    >>> w = PauseWatch(slow_s=0.0)
    >>> w("start", {"generation": 2}); w("stop", {"generation": 2, "collected": 0})
    >>> w.collections, w.slow, w.longest_s >= 0.0
    (1, 1, True)
    """

    def __init__(self, slow_s: float = SLOW_PAUSE_S) -> None:
        self.slow_s = slow_s
        self.collections = 0
        self.slow = 0
        self.longest_s = 0.0
        self._t0 = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
            return
        took = time.perf_counter() - self._t0
        self.collections += 1
        self.longest_s = max(self.longest_s, took)
        if took >= self.slow_s:
            self.slow += 1
            log.warning("garbage collection (generation %d) stopped the process for %.3f s (%d objects freed)",
                        info["generation"], took, info["collected"])


PAUSES = PauseWatch()


def tune_for_throughput() -> Callable[[], None]:
    """Call once, after start-up and before the consumer loop; returns what puts the process's own
    settings back (a command run inside another process, such as a test's, must not leave them behind).

    >>> before = gc.get_threshold()
    >>> undo = tune_for_throughput()
    >>> gc.get_threshold() == WORKER_THRESHOLDS and PAUSES in gc.callbacks
    True
    >>> undo(); gc.get_threshold() == before and PAUSES not in gc.callbacks
    True
    """
    before = gc.get_threshold()
    installed = PAUSES not in gc.callbacks
    gc.collect()
    gc.freeze()
    gc.set_threshold(*WORKER_THRESHOLDS)
    if installed:
        gc.callbacks.append(PAUSES)

    def undo() -> None:
        gc.set_threshold(*before)
        gc.unfreeze()
        if installed and PAUSES in gc.callbacks:
            gc.callbacks.remove(PAUSES)

    return undo
