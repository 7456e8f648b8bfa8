"""The live page on the worker's web server (Faust's, beside ``/metrics``).

Pages
-----
``GET /live``
    The page: per GPU FLOPS/W and cost per TFLOP/s-hour (uPlot charts, served from the package: the page
    works offline), the cost heatmap by GPU model and region, firing alerts, recent decisions, the ingest's
    throughput and lag. It polls the two JSON pages below, once a second and every five seconds.
``GET /live/api``
    ``LiveState.snapshot``: what the worker saw last (frames from ``flopwatch.frames``, alerts and decisions as
    the agents send them, the ingest's figures at its last flush).
``GET /live/api/heatmap``
    ``{"from_ms", "to_ms", "rows": [...]}``: ``heatmap_sql`` over the last ten minutes of closed ticks, run on
    the worker's ClickHouse thread; cached for five seconds, so many open pages cost one query. 503 with
    ``{"error": ...}`` while ClickHouse cannot answer.
``GET /live/static/<name>``
    The page's script, style and the vendored uPlot (MIT, ``static/vendor/uPlot.LICENSE``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from importlib import resources
from typing import Any, Final

import faust
import orjson
from faust.web import Request, Response, View

from agents.livepage.heatmap import heatmap_sql
from agents.livepage.state import LiveState
from agents.sinks.clickhouse import Backend

__all__ = ["PAGE_PATH", "HeatmapCache", "install_page", "page_url"]

log = logging.getLogger(__name__)
PAGE_PATH: Final = "/live"
HEATMAP_WINDOW_MS: Final = 600_000
# Behind the newest tick the page has seen: every node has closed and written it by then.
HEATMAP_MARGIN_MS: Final = 5_000
HEATMAP_TTL_S: Final = 5.0
_TYPES: Final = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8",
                 ".html": "text/html; charset=utf-8", ".LICENSE": "text/plain; charset=utf-8"}
STATIC: Final = ("page.js", "page.css", "vendor/uPlot.iife.min.js", "vendor/uPlot.min.css", "vendor/uPlot.LICENSE")
OnClickHouse = Callable[[Callable[[Backend], Any]], Awaitable[Any]]


def _static() -> dict[str, tuple[bytes, str]]:
    """The page's files, read once from the package; only these names are served."""
    root = resources.files("agents.livepage") / "static"
    out = {}
    for name in (*STATIC, "index.html"):
        suffix = next(s for s in _TYPES if name.endswith(s))
        out[name.rsplit("/", 1)[-1]] = ((root / name).read_bytes(), _TYPES[suffix])
    return out


@dataclass(slots=True)
class HeatmapCache:
    """The heatmap's last answer and when it was computed (monotonic seconds)."""

    at_s: float = -1e18
    body: bytes = b""
    status: int = 200


def heatmap_window(state: LiveState, now_ms: int) -> tuple[int, int]:
    """The last ``HEATMAP_WINDOW_MS`` of ticks ending ``HEATMAP_MARGIN_MS`` before the newest frame seen
    (before now when no frame is seen: a worker without the detection agent)."""
    newest = state.newest_tick_ns()
    to_ms = (now_ms if newest is None else newest // 1_000_000) - HEATMAP_MARGIN_MS
    return to_ms - HEATMAP_WINDOW_MS, to_ms


def install_page(app: faust.App, state: LiveState, on_clickhouse: OnClickHouse | None, grid_ms: int) -> None:
    """Register ``/live`` and its JSON and static pages on ``app``'s web server, before the worker starts.
    ``on_clickhouse`` runs a function on the worker's ClickHouse thread (``Ingestor.on_clickhouse``)."""
    files = _static()
    cache = HeatmapCache()

    def _bytes(web: View, body: bytes, content_type: str, status: int = 200, cache_s: int = 0) -> Response:
        headers = {"Content-Type": content_type,
                   "Cache-Control": f"max-age={cache_s}" if cache_s else "no-store"}
        return web.bytes(body, status=status, headers=headers)

    @app.page(PAGE_PATH, name="flopwatch-live")
    async def page(web: View, request: Request) -> Response:
        body, typ = files["index.html"]
        return _bytes(web, body, typ)

    @app.page(f"{PAGE_PATH}/static/{{name}}", name="flopwatch-live-static")
    async def static(web: View, request: Request, name: str) -> Response:
        if name not in files or name == "index.html":
            return _bytes(web, b"not found", "text/plain; charset=utf-8", status=404)
        body, typ = files[name]
        return _bytes(web, body, typ, cache_s=300)

    @app.page(f"{PAGE_PATH}/api", name="flopwatch-live-api")
    async def api(web: View, request: Request) -> Response:
        snap = state.snapshot(time.time_ns())
        snap["grid_ms"] = grid_ms
        return _bytes(web, orjson.dumps(snap), "application/json; charset=utf-8")

    @app.page(f"{PAGE_PATH}/api/heatmap", name="flopwatch-live-heatmap")
    async def heatmap(web: View, request: Request) -> Response:
        now = time.monotonic()
        if now - cache.at_s >= HEATMAP_TTL_S:
            cache.body, cache.status = await _heatmap(state, on_clickhouse, grid_ms)
            cache.at_s = now
        return _bytes(web, cache.body, "application/json; charset=utf-8", status=cache.status)


async def _heatmap(state: LiveState, on_clickhouse: OnClickHouse | None, grid_ms: int) -> tuple[bytes, int]:
    from_ms, to_ms = heatmap_window(state, time.time_ns() // 1_000_000)
    if on_clickhouse is None:
        return orjson.dumps({"from_ms": from_ms, "to_ms": to_ms, "error": "no ClickHouse in this process"}), 503

    def query(b: Backend) -> tuple[list[str], list[tuple[Any, ...]]]:
        return b.rows(heatmap_sql(b.database, b.layout, grid_ms, from_ms, to_ms))

    try:
        names, rows = await on_clickhouse(query)
    except Exception as exc:  # the page says so and asks again; the worker's own writes report their errors
        log.debug("live page: heatmap query failed: %s", exc)
        return orjson.dumps({"from_ms": from_ms, "to_ms": to_ms, "error": f"ClickHouse: {exc}"}), 503
    return orjson.dumps({"from_ms": from_ms, "to_ms": to_ms,
                         "rows": [dict(zip(names, r, strict=True)) for r in rows]}), 200


def page_url(bind: str, port: int) -> str:
    """Where a browser on this machine finds the page (a wildcard bind is reached on loopback).

    >>> page_url("0.0.0.0", 6066)
    'http://127.0.0.1:6066/live'
    >>> page_url("::1", 8080)
    'http://[::1]:8080/live'
    """
    host = "127.0.0.1" if bind in ("0.0.0.0", "::", "") else bind
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}{PAGE_PATH}"
