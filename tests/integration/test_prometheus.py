"""A real Prometheus (deploy/prometheus.sh, Debian's 2.42) scrapes the worker's ``/metrics`` page.

The page is served by Faust's own web server on a free loopback port, with ``install_web`` on a
real ``faust.App`` (no broker needed: only the web server runs). The test writes that endpoint into
Prometheus' file_sd target file, waits until the target is up, and reads the figures back through
``/api/v1/query``: they must equal what the ``Metrics`` object holds, first as set before the
first scrape and again after they moved.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import faust
import pytest

from agents.decide.scale_view import ScaleView
from agents.detect.agent import DetectStats
from agents.ingest.stats import IngestStats
from agents.metrics import Metrics
from agents.web import WebOptions, install_web
from streams.decide.engine import DecisionTally
from streams.detect.detectors import AlertTally
from tests.agents.test_web import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

WAIT_S = 45.0  # scrapes run every second; target discovery takes up to the file_sd re-read (5 s)
T = TypeVar("T")


def prometheus(service_env: dict[str, str]) -> tuple[str, Path]:
    url = service_env.get("FLOPWATCH_PROMETHEUS_URL", "")
    targets = service_env.get("FLOPWATCH_PROMETHEUS_TARGETS", "")
    assert url and targets, ("FLOPWATCH_PROMETHEUS_URL / _TARGETS are not set: start the services with "
                             "deploy/services.sh start")
    return url, Path(targets)


def write_targets(path: Path, groups: list[dict[str, Any]]) -> None:
    # Whole file, then a rename: Prometheus must never read half of it.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(groups), encoding="utf-8")
    os.replace(tmp, path)



async def wait_for(probe: Callable[[], Awaitable[T | None]], what: str, timeout_s: float = WAIT_S) -> T:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = await probe()
        if got is not None:
            return got
        await asyncio.sleep(0.25)
    raise AssertionError(f"no {what} within {timeout_s:.0f} s")


class PromAPI:
    def __init__(self, http: aiohttp.ClientSession, url: str, run: str) -> None:
        self.http, self.url, self.run = http, url, run

    async def _get(self, path: str, **params: str) -> Any:
        async with self.http.get(self.url + path, params=params) as r:
            assert r.status == 200, f"{path}: HTTP {r.status}: {(await r.text())[:500]}"
            body = await r.json()
        assert body["status"] == "success", body
        return body["data"]

    async def target(self) -> dict[str, Any] | None:
        """This run's target once Prometheus has scraped it successfully."""
        data = await self._get("/api/v1/targets", state="active")
        for t in data["activeTargets"]:
            if t["labels"].get("flopwatch_test") == self.run and t["health"] == "up":
                return dict(t)
        return None

    async def value(self, name: str, **labels: str) -> float | None:
        """The newest scraped value of one series of this run, or None while there is none."""
        matchers = ",".join(f'{k}="{v}"' for k, v in {**labels, "flopwatch_test": self.run}.items())
        result = (await self._get("/api/v1/query", query=f"{name}{{{matchers}}}"))["result"]
        assert len(result) <= 1, result
        return float(result[0]["value"][1]) if result else None


def held(metrics: Metrics, name: str, **labels: str) -> float:
    v = metrics.registry.get_sample_value(name, labels)
    assert v is not None, (name, labels)
    return v


SERIES: list[tuple[str, dict[str, str]]] = [
    ("flopwatch_decisions_total", {"action": "scale_up", "outcome": "taken", "gate": "none"}),
    ("flopwatch_decisions_total", {"action": "scale_down", "outcome": "withheld", "gate": "l1_spike"}),
    ("flopwatch_samples_total", {}),
    ("flopwatch_frames_written_total", {}),
    ("flopwatch_rejects_total", {"reason": "late"}),
    ("flopwatch_consumer_lag", {}),
    ("flopwatch_alerts_firing", {}),
    ("flopwatch_alerts_sent_total", {"rule": "efficiency_drift"}),
    ("flopwatch_detector_delay_seconds_count", {"kind": "alert"}),
    ("flopwatch_detector_delay_seconds_sum", {"kind": "alert"}),
]


async def all_scraped(api: PromAPI, metrics: Metrics) -> dict[str, float] | None:
    """Prometheus' values of every series in SERIES (by name and first label value) once they all equal
    what ``metrics`` holds."""
    out = {}
    for name, labels in SERIES:
        got, want = await api.value(name, **labels), held(metrics, name, **labels)
        if got != want:
            return None
        out[":".join([name, *labels.values()][:2])] = got
    return out


def test_prometheus_scrapes_the_worker_metrics_page(service_env: dict[str, str]) -> None:
    url, targets = prometheus(service_env)
    port, run = free_port(), uuid.uuid4().hex[:12]
    app = faust.App(f"flopwatch-prom-{run}", broker="kafka://127.0.0.1:1", store="memory://", autodiscover=False,
                    **WebOptions(enabled=True, bind="127.0.0.1", port=port).app_kwargs())
    metrics = Metrics()
    install_web(app, metrics, ScaleView())

    decisions = DecisionTally()
    for _ in range(3):
        decisions.add("scale_up", "taken", None)
    for _ in range(2):
        decisions.add("scale_down", "withheld", "l1_spike")
    metrics.observe_decisions(decisions)
    ingest = IngestStats(samples=4321, frames_written=17, rejects=Counter({"late": 3}), lag=5)
    detect = DetectStats(frames=40, firing=2, alerts=AlertTally({"efficiency_drift": 1}))
    metrics.observe_ingest(ingest)
    metrics.observe_detect(detect)
    metrics.observe_delay("alert", 3.25)

    async def main() -> None:
        web: Any = app.web
        web.init_server()
        await web.start_server()
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
                api = PromAPI(http, url, run)
                write_targets(targets, [{"targets": [f"127.0.0.1:{port}"], "labels": {"flopwatch_test": run}}])
                target = await wait_for(api.target, f"healthy scrape of 127.0.0.1:{port}")
                assert target["scrapeUrl"] == f"http://127.0.0.1:{port}/metrics"
                assert await api.value("up") == 1
                first = await wait_for(lambda: all_scraped(api, metrics), "scraped values equal to the registry")
                assert first["flopwatch_decisions_total:scale_up"] == 3

                # The figures move; the next scrapes must follow (counters up, gauges either way).
                decisions.add("scale_up", "taken", None)
                metrics.observe_decisions(decisions)
                ingest.samples, ingest.lag = 9000, 0
                ingest.rejects["late"] += 2
                detect.firing, detect.alerts.by_rule["efficiency_drift"] = 0, 2
                metrics.observe_ingest(ingest)
                metrics.observe_detect(detect)
                metrics.observe_delay("alert", 0.5)
                moved = await wait_for(lambda: all_scraped(api, metrics), "scraped values after they moved")
                assert moved["flopwatch_samples_total"] == 9000
                assert moved["flopwatch_consumer_lag"] == 0
                assert moved["flopwatch_rejects_total:late"] == 5
                assert moved["flopwatch_decisions_total:scale_up"] == 4
        finally:
            write_targets(targets, [])  # nothing left for Prometheus to find down after the test
            await web.stop_server()

    asyncio.run(main())
