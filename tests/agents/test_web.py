"""The worker's pages on a real ``faust.App``, served by Faust's own aiohttp web server on a loopback port:
the KEDA ``metrics-api`` request answered with the value KEDA would read, 404/400, ``/metrics``, and the
``FLOPWATCH_WEB_*`` options."""

from __future__ import annotations

import asyncio
import math
import socket
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import faust
import orjson
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from agents.decide.scale_view import Desired, ScaleView
from agents.metrics import Metrics
from agents.settings import SettingsError, load_settings
from agents.web import WebOptions, install_web
from streams.decide.engine import DecisionTally

T = TypeVar("T")
SCALED_OBJECT = Path(__file__).resolve().parents[2] / "deploy/k8s/keda-scaledobject.yaml"
# What KEDA's metrics-api scaler sends: a plain GET from Go's HTTP client, no Accept header.
KEDA_HEADERS = {"User-Agent": "Go-http-client/1.1", "Accept-Encoding": "gzip"}
CHAT = Desired("serving", "chat", "inference", current=3, desired=5, metric="qps", value=912.5,
               ts_ns=1_796_200_000_000_000_000, stale=False, decision_id="dec-0001")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_app(port: int) -> tuple[faust.App, Metrics, ScaleView]:
    app = faust.App("flopwatch-web-test", broker="kafka://127.0.0.1:1", store="memory://", value_serializer="raw",
                    key_serializer="raw", autodiscover=False,
                    **WebOptions(enabled=True, bind="127.0.0.1", port=port).app_kwargs())
    metrics, view = Metrics(), ScaleView()
    install_web(app, metrics, view)
    return app, metrics, view


@asynccontextmanager
async def serving(app: faust.App) -> AsyncIterator[str]:
    """Faust's web server for ``app`` (what the worker starts), on its configured loopback port."""
    web: Any = app.web
    web.init_server()  # as faust.Worker does: the built-in blueprints, then the server
    await web.start_server()
    try:
        yield f"http://127.0.0.1:{app.conf.web_port}"
    finally:
        await web.stop_server()


def with_server(test: Callable[[str, Metrics, ScaleView, aiohttp.ClientSession], Awaitable[T]]) -> T:
    async def main() -> T:
        app, metrics, view = make_app(free_port())
        async with serving(app) as base, aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
            return await test(base, metrics, view, http)
    return asyncio.run(main())


async def keda_get(http: aiohttp.ClientSession, url: str) -> tuple[int, str, bytes]:
    async with http.get(url, headers=KEDA_HEADERS, skip_auto_headers=("Accept",)) as r:
        return r.status, r.headers.get("Content-Type", ""), await r.read()


def gjson_value(body: bytes, location: str) -> float:
    """The number at a plain GJSON dotted path (keys and array indices), as KEDA's JSON format reads it:
    a JSON number, or a string holding a plain quantity."""
    node: Any = orjson.loads(body)
    for part in location.split("."):
        node = node[int(part)] if isinstance(node, list) else node[part]
    if isinstance(node, bool) or not isinstance(node, int | float | str):
        raise AssertionError(f"valueLocation {location!r} must point to a number, got {node!r}")
    return float(node)


def hpa_desired(value: float, target_value: float) -> int:
    """The HPA's replica count for an external metric with an AverageValue target (tolerance aside)."""
    return math.ceil(value / target_value)


def test_keda_request_gets_the_desired_replicas_at_value_location() -> None:
    async def check(base: str, metrics: Metrics, view: ScaleView, http: aiohttp.ClientSession) -> None:
        view.update(CHAT)
        status, ctype, body = await keda_get(http, f"{base}/keda/serving/chat")
        assert status == 200 and ctype.startswith("application/json")
        assert orjson.loads(body) == {
            "namespace": "serving", "workload": "chat", "class": "inference", "desired_replicas": 5,
            "current_replicas": 3, "metric": "qps", "value": 912.5, "ts_ns": CHAT.ts_ns, "stale": False,
            "decision_id": "dec-0001"}
        value = gjson_value(body, "desired_replicas")
        assert value == 5 and hpa_desired(value, 1.0) == 5  # targetValue "1": the HPA wants exactly that
        # The page reads the view when asked: a new decision shows on the next poll.
        view.update(Desired("serving", "chat", "inference", 5, 2, "steady", 0.0, CHAT.ts_ns + 10**9, True))
        status, _, body = await keda_get(http, f"{base}/keda/serving/chat")
        got = orjson.loads(body)
        assert status == 200 and gjson_value(body, "desired_replicas") == 2
        assert got["stale"] is True and got["decision_id"] is None
    with_server(check)


def test_the_shipped_scaled_object_reads_the_desired_replicas() -> None:
    # deploy/k8s's trigger, asked of this server: its path, its valueLocation, its target.
    so = yaml.safe_load(SCALED_OBJECT.read_text(encoding="utf-8"))
    trigger = so["spec"]["triggers"][0]
    meta = trigger["metadata"]
    assert trigger["type"] == "metrics-api" and trigger.get("metricType", "AverageValue") == "AverageValue"
    assert meta.get("format", "json") == "json"
    path = urllib.parse.urlsplit(meta["url"]).path
    assert path == f"/keda/{so['metadata']['namespace']}/{so['spec']['scaleTargetRef']['name']}"

    async def check(base: str, metrics: Metrics, view: ScaleView, http: aiohttp.ClientSession) -> None:
        view.update(CHAT)
        status, _, body = await keda_get(http, base + path)
        assert status == 200
        assert hpa_desired(gjson_value(body, meta["valueLocation"]), float(meta["targetValue"])) == CHAT.desired
    with_server(check)


def test_unknown_workload_is_404_with_a_json_error() -> None:
    async def check(base: str, metrics: Metrics, view: ScaleView, http: aiohttp.ClientSession) -> None:
        view.update(CHAT)
        for path in ("/keda/serving/embed", "/keda/other/chat"):
            status, ctype, body = await keda_get(http, base + path)
            assert status == 404 and ctype.startswith("application/json")  # KEDA: an error, then its fallback
            assert "error" in orjson.loads(body)
    with_server(check)


@pytest.mark.parametrize("namespace,workload", [
    ("Serving", "chat"), ("serving", "Chat"), ("-serving", "chat"), ("serving", "chat-"), ("serving", "chat_1"),
    ("serv.ing", "chat"), ("n" * 64, "chat"), ("serving", "w" * 254), ("serving", "a..b"), ("serving", "chat%20x"),
])
def test_a_path_part_that_is_no_kubernetes_name_is_400(namespace: str, workload: str) -> None:
    async def check(base: str, metrics: Metrics, view: ScaleView, http: aiohttp.ClientSession) -> None:
        status, ctype, body = await keda_get(http, f"{base}/keda/{namespace}/{workload}")
        assert status == 400 and ctype.startswith("application/json")
        assert "Kubernetes" in orjson.loads(body)["error"]
    with_server(check)


def test_longest_and_dotted_names_are_accepted() -> None:
    async def check(base: str, metrics: Metrics, view: ScaleView, http: aiohttp.ClientSession) -> None:
        ns, wl = "n" * 63, "a" * 61 + "." + "b" * 191  # 63-character label, 253-character subdomain
        view.update(Desired(ns, wl, "batch", 1, 1, "steady", 0.0, 1, False))
        status, _, body = await keda_get(http, f"{base}/keda/{ns}/{wl}")
        assert status == 200 and orjson.loads(body)["workload"] == wl
    with_server(check)


def test_keda_lists_every_workload_and_nan_is_null() -> None:
    async def check(base: str, metrics: Metrics, view: ScaleView, http: aiohttp.ClientSession) -> None:
        status, _, body = await keda_get(http, f"{base}/keda")
        assert status == 200 and orjson.loads(body) == {"workloads": []}
        view.update(Desired("training", "llm", "training", 8, 8, "steady", math.nan, 2, False))
        view.update(CHAT)
        status, _, body = await keda_get(http, f"{base}/keda")
        rows = orjson.loads(body)["workloads"]
        assert [(r["namespace"], r["workload"]) for r in rows] == [("serving", "chat"), ("training", "llm")]
        assert rows[1]["value"] is None  # JSON has no NaN
    with_server(check)


def test_metrics_page_is_the_prometheus_text_exposition() -> None:
    async def check(base: str, metrics: Metrics, view: ScaleView, http: aiohttp.ClientSession) -> None:
        decisions = DecisionTally()
        decisions.add("scale_down", "withheld", "sla")
        metrics.observe_decisions(decisions)
        async with http.get(f"{base}/metrics") as r:
            assert r.status == 200
            assert r.headers["Content-Type"] == metrics.render()[1]
            text = await r.text()
        samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
                   for fam in text_string_to_metric_families(text) for s in fam.samples}
        key = ("flopwatch_decisions_total", (("action", "scale_down"), ("gate", "sla"), ("outcome", "withheld")))
        assert samples[key] == 1
    with_server(check)


def test_faust_table_and_router_pages_are_off() -> None:
    async def check(base: str, metrics: Metrics, view: ScaleView, http: aiohttp.ClientSession) -> None:
        for path in ("/table/", "/router/"):
            async with http.get(base + path) as r:
                assert r.status == 404
    with_server(check)


# -- options -------------------------------------------------------------------------------------------------------

def test_web_options_from_settings() -> None:
    assert WebOptions.from_settings(load_settings({})) == WebOptions(enabled=True, bind="127.0.0.1", port=6066)
    env = {"FLOPWATCH_WEB_ENABLED": "off", "FLOPWATCH_WEB_BIND": "0.0.0.0", "FLOPWATCH_WEB_PORT": " 8080 "}
    assert WebOptions.from_settings(load_settings(env)) == WebOptions(enabled=False, bind="0.0.0.0", port=8080)
    assert WebOptions.from_settings(load_settings({"FLOPWATCH_WEB_BIND": "::"})).bind == "::"


@pytest.mark.parametrize("env,match", [
    ({"FLOPWATCH_WEB_ENABLED": "maybe"}, "web_enabled"),
    ({"FLOPWATCH_WEB_PORT": "http"}, "web_port"),
    ({"FLOPWATCH_WEB_PORT": "0"}, "PORT"),
    ({"FLOPWATCH_WEB_PORT": "70000"}, "PORT"),
    ({"FLOPWATCH_WEB_BIND": ""}, "BIND"),
    ({"FLOPWATCH_WEB_BIND": "host name"}, "BIND"),
])
def test_bad_web_options_name_the_variable(env: dict[str, str], match: str) -> None:
    with pytest.raises(SettingsError, match=match):
        WebOptions.from_settings(load_settings(env))


def test_app_kwargs_reach_faust() -> None:
    app = faust.App("flopwatch-web-kwargs", broker="kafka://127.0.0.1:1", store="memory://", autodiscover=False,
                    **WebOptions(enabled=True, bind="127.0.0.2", port=7001).app_kwargs())
    assert (app.conf.web_enabled, app.conf.web_bind, app.conf.web_port) == (True, "127.0.0.2", 7001)
    assert app.conf.web_in_thread is False  # the pages share the agents' event loop and their state
