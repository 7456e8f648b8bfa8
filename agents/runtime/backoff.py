"""Backoff, both kinds: ``with_backoff`` retries an agent's outputs and rebuilds in place (an
exception leaving a Faust agent would have Faust ack the message in flight, so agents retry
instead of raising); ``Backoff`` is the delay schedule of a loop that keeps going between
tries (the Alertmanager forwarder, the act webhooks)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

log = logging.getLogger(__name__)
ATTEMPTS = 8  # ~1 min of backoff (0.5 s doubling to 30 s) before giving up
T = TypeVar("T")


async def with_backoff(what: str, call: Callable[[], Awaitable[T]], on_error: Callable[[], None],
                       attempts: int = ATTEMPTS) -> tuple[bool, T | None]:
    """``(True, result)`` once ``call`` succeeds, ``(False, None)`` after ``attempts`` failures, each
    logged with ``what`` and counted through ``on_error``."""
    delays = Backoff(min_ns=500_000_000, max_ns=30_000_000_000)  # the schedule from t = 0: the delays alone
    for attempt in range(attempts):
        try:
            return True, await call()
        except Exception as exc:
            on_error()
            log.warning("%s failed (attempt %d of %d): %s", what, attempt + 1, attempts, exc)
            await asyncio.sleep(delays.failed(now_ns=0) / 1e9)
    return False, None


@dataclass(slots=True)
class Backoff:
    """Exponential retry delays: ``failed`` says when to try next, ``succeeded`` starts over.

    >>> b = Backoff(min_ns=1, max_ns=4)
    >>> [b.failed(now_ns=0) for _ in range(4)], b.succeeded(), b.failed(now_ns=10)
    ([1, 2, 4, 4], None, 11)
    """

    min_ns: int
    max_ns: int
    failures: int = 0
    retry_at_ns: int = 0

    def failed(self, now_ns: int) -> int:
        self.retry_at_ns = now_ns + min(self.max_ns, self.min_ns << min(self.failures, 62))
        self.failures += 1
        return self.retry_at_ns

    def succeeded(self) -> None:
        self.failures, self.retry_at_ns = 0, 0
