"""The live page's state and its pages on a real ``faust.App`` web server: what ``/live/api`` reports after
frames, alerts and decisions; the heatmap read from a real chDB with a simulator run in it, against the frames
aggregated here; the static files, offline (nothing fetched from elsewhere)."""

from __future__ import annotations

import asyncio
import dataclasses
import math
import re
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import faust
import orjson
import pytest

from agents.ingest.simulated import ingest_simulation
from agents.livepage import state as live_state
from agents.livepage.routes import HEATMAP_MARGIN_MS, HEATMAP_WINDOW_MS, install_page
from agents.livepage.state import LiveDecisions, LiveState
from agents.sinks.clickhouse import Backend, ChdbBackend
from agents.sinks.schema import ensure_schema
from agents.web import WebOptions
from schemas.alerts import Cause, make_alert
from schemas.frame_messages import FrameMessage, GpuFrame
from schemas.triggers import make_trigger
from streams.decide.rules import Decision
from streams.sim.simulate import SimParams
from tests.agents.test_web import free_port, serving

S = 1_000_000_000
T0 = 1_796_200_000 * S


def frame(node: str, tick_ns: int, gpus: dict[str, float], cost: float = 0.001) -> FrameMessage:
    """One node's frame: each GPU's FLOPS/W as given (NaN allowed), and a host row the page must ignore."""
    out = [GpuFrame(g, {"workload": "chat", "namespace": "serving", "gpu_model": "H200", "region": "us-east"},
                    {"power": 500.0}, {"flops_per_watt": fpw, "cost_per_tflops": 0.04, "cost_usd": cost,
                                       "tflops": 400.0, "idle": 0.0}, "")
           for g, fpw in gpus.items()]
    out.append(GpuFrame("host", {}, {"cpu_util": 10.0}, {}, ""))
    return FrameMessage(node, tick_ns, S, tuple(out))


def test_frames_become_series_on_one_time_axis() -> None:
    s = LiveState(points=3)
    s.on_frame(frame("n1", T0, {"0": 1e12, "1": 2e12}))
    s.on_frame(frame("n2", T0 + S, {"0": 3e12}))
    s.on_frame(frame("n1", T0 + 2 * S, {"0": 1.5e12, "1": math.nan}))
    ser = s.series()
    assert ser["keys"] == ["n1/0", "n1/1", "n2/0"]
    assert ser["tick_ns"] == [T0, T0 + S, T0 + 2 * S]
    assert ser["flops_per_watt"] == [[1e12, None, 1.5e12], [2e12, None, None], [None, 3e12, None]]
    gpus = {f"{g['node']}/{g['gpu']}": g for g in s.gpus()}
    assert set(gpus) == {"n1/0", "n1/1", "n2/0"}  # no host row
    assert gpus["n1/1"]["flops_per_watt"] is None and gpus["n1/1"]["tick_ns"] == T0 + 2 * S
    assert gpus["n1/0"]["cost_usd_per_h"] == pytest.approx(3.6)  # 0.001 USD a second


def test_points_are_bounded_replays_replace_and_older_frames_are_ignored() -> None:
    s = LiveState(points=3)
    for i in range(5):
        s.on_frame(frame("n1", T0 + i * S, {"0": float(i)}))
    s.on_frame(frame("n1", T0 + 4 * S, {"0": 44.0}))  # the same tick again: its latest values
    s.on_frame(frame("n1", T0 + S, {"0": 11.0}))  # older: ignored
    assert s.series()["flops_per_watt"] == [[2.0, 3.0, 44.0]]
    assert s.gpus()[0]["flops_per_watt"] == 44.0


def test_gpus_beyond_the_bound_forget_the_least_recent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(live_state, "MAX_GPUS", 3)
    s = LiveState(chart_gpus=2)
    for node in ("a", "b", "c"):
        s.on_frame(frame(node, T0, {"0": 1.0}))
    s.on_frame(frame("a", T0 + S, {"0": 2.0}))  # a is recent again
    s.on_frame(frame("d", T0 + S, {"0": 1.0}))
    assert [g["node"] for g in s.gpus()] == ["a", "c", "d"]
    assert s.series()["keys"] == ["a/0", "c/0"]


def test_alerts_fire_until_resolved_and_decisions_are_kept() -> None:
    s = LiveState(recent=3)
    drift = make_alert("efficiency_drift", "warning", "n1", "0", value=0.7, threshold=0.85, onset_ts_ns=T0,
                       ts_ns=T0 + 3 * S, evidence={"cost_usd_per_h": 1.25})
    spike = make_alert("util_spike", "info", "n1", "1", value=0.9, threshold=0.5, onset_ts_ns=T0, ts_ns=T0 + S)
    asyncio.run(s.send([drift, spike]))
    assert [a["rule"] for a in s.snapshot(T0)["firing"]] == ["efficiency_drift", "util_spike"]
    asyncio.run(s.send([spike.resolved(T0 + 2 * S)]))
    snap = s.snapshot(T0)
    assert [a["id"] for a in snap["firing"]] == [drift.id]
    assert snap["firing"][0]["usd_per_h"] == 1.25
    assert [a["state"] for a in snap["alerts"]] == ["resolved", "firing", "firing"]  # newest first
    t = make_trigger("scale_up", "serving", "chat", "inference", ts_ns=T0, current=2, desired=3,
                     reasons=("queue",), evidence={})
    asyncio.run(LiveDecisions(s).send([Decision(t, "taken")]))
    assert snap["decisions"] == [] and s.snapshot(T0)["decisions"][0]["id"] == t.id


def test_the_attributed_firing_replaces_the_plain_one() -> None:
    s = LiveState()
    spike = make_alert("util_spike", "info", "n1", "1", value=0.9, threshold=0.5, onset_ts_ns=T0, ts_ns=T0 + S)
    attributed = dataclasses.replace(spike, causes=(Cause("sm_active", 0.8, {}),))
    asyncio.run(s.send([spike, attributed]))
    snap = s.snapshot(T0)
    assert [a["cause"] for a in snap["alerts"]] == ["sm_active"]
    assert [a["cause"] for a in snap["firing"]] == ["sm_active"]


def test_rate_is_over_the_recent_flushes() -> None:
    s = LiveState()
    assert s.ingest()["samples_per_s"] is None
    for i in range(30):  # 1,000 samples a second for 30 s, then 4,000
        s.on_flush(i * 1000 if i < 25 else 25_000 + (i - 25) * 4000, 0, 0, 0, float(i))
    assert s.ingest()["samples_per_s"] == pytest.approx((41_000 - 19_000) / 10)


# -- the pages ------------------------------------------------------------------------------------------
SIM = SimParams(nodes=2, gpus=2, seed=3, start_ns=T0)
SECONDS = 300


@pytest.fixture(scope="module")
def chdb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChdbBackend]:
    b = ChdbBackend(tmp_path_factory.mktemp("livepage") / "db", "fwlive")
    ensure_schema(b)
    ingest_simulation(b, SIM, seconds=SECONDS)
    yield b
    b.close()


def get(paths: str, state: LiveState, backend: Backend | None) -> list[tuple[int, str, bytes]]:
    """Each of the space-separated ``paths`` from the pages served on a real Faust web server; ``backend``
    stands for the worker's ClickHouse thread."""
    async def on_clickhouse(fn: Any) -> Any:
        return fn(backend)

    async def main() -> list[tuple[int, str, bytes]]:
        app = faust.App("flopwatch-live-test", broker="kafka://127.0.0.1:1", store="memory://",
                        autodiscover=False, **WebOptions(port=free_port()).app_kwargs())
        install_page(app, state, on_clickhouse if backend is not None else None, 1000)
        out = []
        async with serving(app) as url, aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
            for p in paths.split():
                async with http.get(url + p) as r:
                    out.append((r.status, r.headers.get("Content-Type", ""), await r.read()))
        return out

    return asyncio.run(main())


def test_the_page_and_every_file_it_loads_are_served_from_the_package() -> None:
    (status, typ, html), = get("/live", LiveState(), None)
    assert status == 200 and typ.startswith("text/html")
    refs = re.findall(rb'(?:src|href)="(/live/static/[^"]+)"', html)
    assert len(refs) == 4 and not re.search(rb'(?:src|href)="(?:https?:)?//', html)  # offline: nothing external
    answers = get(" ".join(r.decode() for r in refs) + " /live/static/index.html "
                  "/live/static/..%2Fstate.py", LiveState(), None)
    for (status, typ, body), ref in zip(answers, [*refs, b"", b""], strict=True):
        if ref:
            assert status == 200 and len(body) > 1000 and typ.split(";")[0] in ("text/javascript", "text/css"), ref
        else:
            assert status == 404
    assert b"uPlot" in answers[2][2] or b"uPlot" in answers[3][2]


def test_api_reports_what_the_worker_saw() -> None:
    s = LiveState()
    s.on_frame(frame("n1", T0, {"0": 1e12}))
    s.on_flush(100, 5, 2, 1, 1.0)
    (status, typ, body), = get("/live/api", s, None)
    snap = orjson.loads(body)
    assert status == 200 and typ.startswith("application/json")
    assert snap["gpus"][0]["flops_per_watt"] == 1e12 and snap["grid_ms"] == 1000
    assert snap["ingest"] == {"samples": 100, "lag": 5, "frames_written": 2, "rejects": 1, "samples_per_s": None}


def test_heatmap_is_the_frames_of_its_window_by_model_and_region(chdb: ChdbBackend) -> None:
    s = LiveState()
    end = SIM.start_ns + SECONDS * S
    s.on_frame(frame("node-00", end, {"0": 1.0}))  # the newest tick the page has seen
    (status, _, body), = get("/live/api/heatmap", s, chdb)
    h = orjson.loads(body)
    assert status == 200, h
    assert h["to_ms"] == end // 1_000_000 - HEATMAP_MARGIN_MS and h["from_ms"] == h["to_ms"] - HEATMAP_WINDOW_MS
    _, rows = chdb.rows("SELECT gpu_model, region, toUnixTimestamp64Milli(ts), cost_usd, tflops, flops_per_watt "
                        "FROM fwlive.gpu_frames WHERE gpu != 'host'")
    acc: dict[tuple[str, str], list[Any]] = defaultdict(lambda: [0, 0.0, 0.0, []])
    for model, region, ts, cost, tflops, fpw in rows:
        if h["from_ms"] <= ts <= h["to_ms"]:
            a = acc[(model, region)]
            a[0] += 1
            a[1] += cost or 0.0
            a[2] += tflops or 0.0
            if fpw is not None:
                a[3].append(fpw)
    assert [(r["gpu_model"], r["region"]) for r in h["rows"]] == sorted(acc) == [("H200", "us-east")]
    r, (n, usd, tflops, fpw) = h["rows"][0], acc[("H200", "us-east")]
    assert r["frames"] == n > 4 * (SECONDS - 30)  # the 4 GPUs' ticks of the window
    assert r["usd"] == pytest.approx(usd, rel=1e-9)
    assert r["usd_per_tflops_h"] == pytest.approx(usd / (tflops / 3600), rel=1e-9)
    assert r["flops_per_watt"] == pytest.approx(sum(fpw) / len(fpw), rel=1e-9)


def test_heatmap_says_when_clickhouse_cannot_answer() -> None:
    (status, _, body), = get("/live/api/heatmap", LiveState(), None)
    assert status == 503 and "no ClickHouse" in orjson.loads(body)["error"]

    class Gone:  # a server that stopped answering
        database, layout = "fwlive", "current"

        def rows(self, sql: str, params: dict[str, Any] | None = None) -> tuple[list[str], list[tuple[Any, ...]]]:
            raise RuntimeError("server went away")

    (status, _, body), = get("/live/api/heatmap", LiveState(), Gone())  # type: ignore[arg-type]
    assert status == 503 and "server went away" in orjson.loads(body)["error"]


def test_static_files_exist_in_the_source_tree() -> None:
    root = Path(__file__).resolve().parents[2] / "agents/livepage/static"
    assert (root / "vendor/uPlot.LICENSE").read_text().startswith("The MIT License")
