"""The entry-point helper: a signal stops the service's loop, the summary is one JSON line, settings errors are
usage errors."""

from __future__ import annotations

import asyncio
import io
import os
import signal
import threading

import click
import orjson
import pytest

from agents.act.consumer import ActStats
from agents.runtime.entry import load_or_usage, run_until_signal, settings_of, stop_on_signal, stopped, write_summary
from agents.settings import Settings


def test_sigterm_sets_stop_and_the_hook_sees_the_loop() -> None:
    seen: list[asyncio.AbstractEventLoop] = []

    async def main(stop: asyncio.Event) -> str:
        asyncio.get_running_loop().call_soon(os.kill, os.getpid(), signal.SIGTERM)
        await asyncio.wait_for(stop.wait(), 5)
        return "stopped"

    assert run_until_signal(main, seen.append) == "stopped" and len(seen) == 1


def test_a_threaded_collector_stops_on_sigint() -> None:
    stop = threading.Event()
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        stop_on_signal(stop)
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.wait(5)
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def test_the_summary_is_one_json_line() -> None:
    out = io.StringIO()
    write_summary(stopped(ActStats(messages=2, bad_reasons={"x": 1})), out)
    line = out.getvalue()
    assert line.endswith("\n") and line.count("\n") == 1
    doc = orjson.loads(line)
    assert doc["event"] == "stopped" and doc["messages"] == 2 and doc["bad_reasons"] == {"x": 1}
    assert next(iter(doc)) == "event"


def test_settings_come_from_the_root_command_or_are_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    given = Settings()
    with click.Context(click.Command("root"), obj=given) as ctx:
        assert settings_of(ctx) is given
    monkeypatch.setenv("FLOPWATCH_PARTITIONS", "not a number")
    with pytest.raises(click.UsageError):
        load_or_usage()
