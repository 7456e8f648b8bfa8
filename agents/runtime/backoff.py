"""Retrying an agent's outputs and rebuilds with backoff: an exception leaving a Faust agent would
have Faust ack the message in flight, so agents retry instead of raising."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

log = logging.getLogger(__name__)
ATTEMPTS = 8  # ~1 min of backoff (0.5 s doubling to 30 s) before giving up
T = TypeVar("T")


async def with_backoff(what: str, call: Callable[[], Awaitable[T]], on_error: Callable[[], None],
                       attempts: int = ATTEMPTS) -> tuple[bool, T | None]:
    """``(True, result)`` once ``call`` succeeds, ``(False, None)`` after ``attempts`` failures, each
    logged with ``what`` and counted through ``on_error``."""
    delay = 0.5
    for attempt in range(attempts):
        try:
            return True, await call()
        except Exception as exc:
            on_error()
            log.warning("%s failed (attempt %d of %d): %s", what, attempt + 1, attempts, exc)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 30.0)
    return False, None
