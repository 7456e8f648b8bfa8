"""What every service's entry point does: set up logging, load the settings, run until SIGTERM/SIGINT,
and end with a one-line JSON summary."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
import threading
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TextIO, TypeVar

import click
import orjson

from agents.runtime.logs import quiet_kafka_startup
from agents.settings import Settings, SettingsError, load_settings
from schemas.counters import Counters

T = TypeVar("T")
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def setup_logging(verbose: bool = False) -> None:
    """Log to stderr (stdout is for what a command prints), aiokafka's chatter at WARNING and its
    coordinator start-up said once."""
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, format=LOG_FORMAT, stream=sys.stderr)
    logging.getLogger("aiokafka").setLevel(logging.WARNING)
    quiet_kafka_startup()


def load_or_usage(config_file: str | None = None) -> Settings:
    """The settings, or a usage error naming what is wrong with them (exit status 2)."""
    try:
        return load_settings(config_file=config_file)
    except SettingsError as exc:
        raise click.UsageError(str(exc)) from None


def settings_of(ctx: click.Context) -> Settings:
    """The settings the ``flopwatch`` group loaded, or loaded here when a command runs on its own."""
    obj = ctx.find_root().obj
    return obj if isinstance(obj, Settings) else load_or_usage()


def run_until_signal(main: Callable[[asyncio.Event], Awaitable[T]],
                     on_signal: Callable[[asyncio.AbstractEventLoop], None] | None = None) -> T:
    """``asyncio.run(main(stop))`` with ``stop`` set by SIGTERM/SIGINT (``on_signal`` runs then too)."""

    async def run() -> T:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()

        def signalled() -> None:
            stop.set()
            if on_signal is not None:
                on_signal(loop)

        for sig in STOP_SIGNALS:
            loop.add_signal_handler(sig, signalled)
        return await main(stop)

    return asyncio.run(run())


def stop_on_signal(stop: threading.Event) -> None:
    """SIGTERM/SIGINT set ``stop``: for the threaded collectors."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, lambda *_: stop.set())


def write_summary(doc: Mapping[str, Any], stream: TextIO | None = None) -> None:
    """One JSON line on ``stream`` (stderr by default: stdout may carry a command's own output)."""
    (stream or sys.stderr).write(orjson.dumps(dict(doc)).decode() + "\n")


def stopped(stats: Counters) -> dict[str, Any]:
    """The summary of a service that ran until stopped: its stats' ``as_dict``."""
    return {"event": "stopped", **stats.as_dict()}
